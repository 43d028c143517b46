"""Confidence intervals and verdicts for benchmark timings.

Each timed cell runs a warm-up, then ``trials`` timed blocks of steps (its
trials); this module turns their step times into a 95% interval for
the cell's typical step time. The centre is the median of all pooled steps,
since step times have a long right tail that drags a mean. The interval is
the envelope of two that each miss one kind of noise: the distribution-free
order-statistic interval for the median (binomial(n, 1/2), as asv uses),
valid for any step distribution but blind to drift as it assumes independent
steps; and a Student-t interval of the mean of per-trial medians, which sees
drift between trials (host jitter moves launch-bound cells 14-50% between
blocks) but not, with three trials that agree, the spread within a trial.
Two cells differ only when their intervals are disjoint, a conservative test
that trades power for few false alarms. GPU busy fraction flags cells that
time Python and the CPU as much as the GPU. Needs only numpy and the stdlib.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

# 0.975 quantiles of Student's t (two-sided 95%), df 1..30: computed with
# mpmath as the root of the regularized-incomplete-beta CDF, rounded to 4
# decimals; they match the 3 printed decimals of the NIST/SEMATECH
# e-Handbook of Statistical Methods, table 1.3.6.7.2.
T_975: dict[int, float] = {
    1: 12.7062,
    2: 4.3027,
    3: 3.1824,
    4: 2.7764,
    5: 2.5706,
    6: 2.4469,
    7: 2.3646,
    8: 2.3060,
    9: 2.2622,
    10: 2.2281,
    11: 2.2010,
    12: 2.1788,
    13: 2.1604,
    14: 2.1448,
    15: 2.1314,
    16: 2.1199,
    17: 2.1098,
    18: 2.1009,
    19: 2.0930,
    20: 2.0860,
    21: 2.0796,
    22: 2.0739,
    23: 2.0687,
    24: 2.0639,
    25: 2.0595,
    26: 2.0555,
    27: 2.0518,
    28: 2.0484,
    29: 2.0452,
    30: 2.0423,
}
_Z_975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """0.975 quantile of Student's t with ``df`` degrees of freedom.

    df 1..30 come from :data:`T_975`. Beyond 30, the Cornish-Fisher expansion
    around the normal quantile (Abramowitz & Stegun 26.7.5, three terms) is
    within 1e-5 of the exact value, where a flat 1.96 would be off by 4%.
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df in T_975:
        return T_975[df]
    z, v = _Z_975, float(df)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / v + g2 / v**2 + g3 / v**3


def _drop_nan(samples: Sequence[float]) -> np.ndarray:
    a = np.asarray(samples, dtype=float).ravel()
    return a[~np.isnan(a)]


def order_ci_coverage(n: int, j: int) -> float:
    """Probability that (x_(j), x_(n+1-j)) of n iid steps covers the true median.

    The median lies below x_(j) iff fewer than j steps fall below it, which has
    probability P(Binomial(n, 1/2) < j) for a continuous distribution; the
    upper side is symmetric. Exact, with integer binomial coefficients.
    """
    if n < 1 or not 1 <= j <= (n + 1) // 2:
        raise ValueError(f"need n >= 1 and 1 <= j <= (n+1)//2, got n={n}, j={j}")
    if n > 200:  # log-space terms: exact integers get slow at the thousands of samples do_bench gives
        log_half_n = n * math.log(2.0)
        lg = math.lgamma(n + 1)
        tail_p = sum(math.exp(lg - math.lgamma(i + 1) - math.lgamma(n - i + 1) - log_half_n) for i in range(j))
        return 1.0 - 2.0 * tail_p
    tail = sum(math.comb(n, i) for i in range(j))
    return (2**n - 2 * tail) / 2**n


@cache
def _order_rank(n: int, confidence: float) -> int:
    # Coverage falls as j grows: keep the last j that still reaches the target. Start next to
    # the normal approximation (do_bench cells have thousands of samples), then settle exactly.
    z = statistics.NormalDist().inv_cdf((1 + confidence) / 2)
    j = max(1, min((n + 1) // 2, int(n / 2 - z * math.sqrt(n) / 2)))
    while j > 1 and order_ci_coverage(n, j) < confidence:
        j -= 1
    while j < (n + 1) // 2 and order_ci_coverage(n, j + 1) >= confidence:
        j += 1
    return j


def median_ci_order(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval for the median, from order statistics.

    Returns (x_(j), x_(n+1-j)) for the largest j whose coverage
    (:func:`order_ci_coverage`) is at least ``confidence``. If even (min, max)
    falls short (n < 6 at 95%: 0.9375 at n = 5) it returns (min, max), whose
    actual coverage is then below ``confidence``. NaNs are ignored; fewer than
    two samples give (nan, nan), as one step says nothing about spread.
    """
    x = np.sort(_drop_nan(samples))
    n = x.size
    if n < 2:
        return (math.nan, math.nan)
    j = _order_rank(n, float(confidence))
    return (float(x[j - 1]), float(x[n - j]))


def trial_ci(trial_medians: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean of per-trial medians: mean ± t(k-1)·s/√k.

    Each trial's median is one draw of what the cell measures on a fresh block
    of steps, so this interval carries the drift between trials. NaNs are
    ignored; with fewer than two trials drift cannot be measured: (nan, nan).
    Only 95% is supported, as the t table holds 0.975 quantiles only.
    """
    if abs(confidence - 0.95) > 1e-12:
        raise ValueError(f"only confidence=0.95 is supported, got {confidence}")
    m = _drop_nan(trial_medians)
    k = m.size
    if k < 2:
        return (math.nan, math.nan)
    mean = float(m.mean())
    half = t_quantile_975(k - 1) * float(m.std(ddof=1)) / math.sqrt(k)
    return (mean - half, mean + half)


@dataclass(frozen=True)
class Interval:
    """A cell's centre (median of pooled steps) and its confidence interval."""

    median: float
    low: float
    high: float
    n: int  # pooled steps
    trials: int

    @property
    def half_width_rel(self) -> float:
        if not math.isfinite(self.median) or self.median == 0:
            return math.nan
        return (self.high - self.low) / 2 / abs(self.median)

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def overlaps(self, other: Interval) -> bool:
        # Comparisons with nan are False, so an unbounded interval overlaps nothing.
        return self.low <= other.high and other.low <= self.high

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def summarize_trials(trial_samples: Sequence[Sequence[float]], confidence: float = 0.95) -> Interval:
    """One interval for a cell from the step times of each of its trials.

    Centre: the median of all pooled steps. Interval: the envelope (min of
    lows, max of highs) of :func:`median_ci_order` on the pooled steps and
    :func:`trial_ci` on the per-trial medians (with at least two trials),
    widened if needed to contain the centre. Neither part suffices alone. The
    order-statistic interval treats all steps as independent and narrows with
    the number of steps, so when host jitter shifts whole trials it is far too
    narrow. The t-interval of three trials that agree is near zero width and
    hides the spread of steps within a trial. The envelope is wide when either
    noise is. NaN steps and empty trials are dropped; a single step gives nan
    bounds. A very noisy cell's low bound may fall below zero; it is kept, not
    clipped, so the width stays honest.
    """
    trials = [t for t in (_drop_nan(s) for s in trial_samples) if t.size]
    pooled = np.concatenate(trials) if trials else np.empty(0)
    n = int(pooled.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, 0)
    med = float(np.median(pooled))
    if n < 2:
        return Interval(med, math.nan, math.nan, n, len(trials))
    parts = [(med, med), median_ci_order(pooled, confidence)]
    if len(trials) >= 2:
        parts.append(trial_ci([float(np.median(t)) for t in trials], confidence))
    return Interval(med, min(p[0] for p in parts), max(p[1] for p in parts), n, len(trials))


def ratio_interval(a: Interval, b: Interval) -> Interval:
    """Interval for a/b by conservative interval arithmetic: (a.low/b.high, a.high/b.low).

    It covers the ratio whenever both intervals cover their values. Positive
    quantities only: the median ratio is nan unless both medians are positive,
    the bounds nan unless all four bounds are positive and finite (a low bound
    at or below zero leaves the ratio unbounded).
    """
    n, trials = min(a.n, b.n), min(a.trials, b.trials)

    def pos(x: float) -> bool:
        return math.isfinite(x) and x > 0

    med = a.median / b.median if pos(a.median) and pos(b.median) else math.nan
    if all(pos(x) for x in (a.low, a.high, b.low, b.high)):
        return Interval(med, a.low / b.high, a.high / b.low, n, trials)
    return Interval(med, math.nan, math.nan, n, trials)


def significant(a: Interval, b: Interval) -> bool:
    """Both intervals bounded and disjoint."""
    return a.bounded and b.bounded and not a.overlaps(b)


def verdict(a: Interval, b: Interval) -> str:
    """ "faster"/"slower" if time a lies entirely below/above time b (lower is faster).

    Overlapping intervals give "same"; an unbounded one on either side "n/a".
    """
    if not (a.bounded and b.bounded):
        return "n/a"
    if a.high < b.low:
        return "faster"
    if a.low > b.high:
        return "slower"
    return "same"


def gpu_busy_fraction(kernel_intervals_us: Sequence[tuple[float, float]], window_us: tuple[float, float]) -> float:
    """Share of a wall-clock window during which at least one kernel ran.

    Kernels are clipped to the window and their union is measured, because
    kernels on several streams overlap and a plain sum would count the same
    microsecond twice. No kernels give 0.0; a window of non-positive length
    raises ValueError.
    """
    w0, w1 = float(window_us[0]), float(window_us[1])
    if not w1 > w0:
        raise ValueError(f"window must have positive length, got {window_us}")
    spans = sorted((max(s, w0), min(e, w1)) for s, e in kernel_intervals_us)
    # Sorted by start, a span adds only the part past the furthest end seen so far.
    busy, reach = 0.0, w0
    for s, e in spans:
        busy += max(0.0, e - max(s, reach))
        reach = max(reach, e)
    return busy / (w1 - w0)


def fmt_interval(iv: Interval, digits: int = 4) -> str:
    """E.g. "12.3 [12.1, 12.6]" with ``digits`` significant digits; "—" without a median."""
    if not math.isfinite(iv.median):
        return "—"
    m = f"{iv.median:.{digits}g}"
    if not iv.bounded:
        return f"{m} [—]"
    return f"{m} [{iv.low:.{digits}g}, {iv.high:.{digits}g}]"


def log_t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Geometric mean of positive ``values`` and its 95% Student-t interval on the log scale.

    For quantities that drift by factors (a host 30% slower for a while), the log scale
    keeps the interval positive and symmetric in ratio: exp(mean ± t(k-1)·s/√k) of the
    logs. Non-positive and nan values are dropped; fewer than two leave nan bounds.
    """
    x = np.asarray([v for v in values if math.isfinite(v) and v > 0], dtype=float)
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    logs = np.log(x)
    centre = float(math.exp(logs.mean()))
    if x.size < 2:
        return (centre, math.nan, math.nan)
    half = t_quantile_975(x.size - 1) * float(logs.std(ddof=1)) / math.sqrt(x.size)
    return (centre, centre * math.exp(-half), centre * math.exp(half))


def paired_ratio(a_blocks: Sequence[float], b_blocks: Sequence[float]) -> Interval:
    """Ratio a/b from interleaved blocks (a₁ b₁ a₂ b₂ …): the interval of the per-pair ratios.

    Block k of ``a`` and block k of ``b`` ran back to back, so a slow stretch of the host
    slows both and cancels in aᵢ/bᵢ; the interval is :func:`log_t_interval` of those
    ratios (k-1 degrees of freedom), as for a paired t-test on log times. ``n`` and
    ``trials`` hold the number of pairs. Pairs with a missing block are dropped.
    """
    ratios = [a / b for a, b in zip(a_blocks, b_blocks) if math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0]
    centre, low, high = log_t_interval(ratios)
    return Interval(centre, low, high, len(ratios), len(ratios))
