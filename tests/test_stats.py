"""Known-answer tests for cs336sys.measure.stats (no timing, no device)."""

import math

import numpy as np
import pytest

from cs336sys.measure.stats import (
    T_975,
    Interval,
    fmt_interval,
    gpu_busy_fraction,
    median_ci_order,
    order_ci_coverage,
    ratio_interval,
    significant,
    summarize_trials,
    t_quantile_975,
    trial_ci,
    verdict,
)

NAN = math.nan


def iv(median, low, high, n=30, trials=3):
    return Interval(median, low, high, n, trials)


# --- Student-t table -----------------------------------------------------------------


def _t_cdf_upper_half(t, df, points=200_001):
    """P(0 < T < t) by Simpson's rule on the t density (independent of the table)."""
    x = np.linspace(0.0, t, points)
    logc = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    f = np.exp(logc - (df + 1) / 2 * np.log1p(x * x / df))
    h = x[1] - x[0]
    return h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())


@pytest.mark.parametrize("df", range(1, 31))
def test_t_table_values_are_0975_quantiles(df):
    # rounding to 4 decimals moves the CDF by at most density * 5e-5 < 2e-5
    assert _t_cdf_upper_half(T_975[df], df) == pytest.approx(0.475, abs=3e-5)


def test_t_quantile_lookup_and_large_df():
    assert sorted(T_975) == list(range(1, 31))
    assert t_quantile_975(2) == pytest.approx(4.303, abs=5e-4)
    assert t_quantile_975(30) == T_975[30]
    # exact values (mpmath): df 31 -> 2.039513, 60 -> 2.000298, 120 -> 1.979930
    assert t_quantile_975(31) == pytest.approx(2.039513, abs=1e-5)
    assert t_quantile_975(60) == pytest.approx(2.000298, abs=1e-5)
    assert t_quantile_975(120) == pytest.approx(1.979930, abs=1e-5)
    assert t_quantile_975(10**6) == pytest.approx(1.959966, abs=1e-5)
    with pytest.raises(ValueError):
        t_quantile_975(0)


# --- order-statistic interval ----------------------------------------------------------


def test_order_coverage_n10_j2():
    assert order_ci_coverage(10, 2) == pytest.approx(1 - 2 * (1 + 10) / 1024)
    assert order_ci_coverage(10, 2) == pytest.approx(0.978515625)
    assert order_ci_coverage(10, 3) == pytest.approx(1 - 2 * (1 + 10 + 45) / 1024)
    assert order_ci_coverage(5, 1) == pytest.approx(0.9375)
    assert order_ci_coverage(6, 1) == pytest.approx(0.96875)
    with pytest.raises(ValueError):
        order_ci_coverage(10, 6)


def _expected_rank(n, conf=0.95):
    # independent of the module: cumulative binomial(n, 1/2) by Pascal's rule, in floats
    row = [1.0]
    for _ in range(n):
        row = [a + b for a, b in zip([0.0] + row, row + [0.0])]
    pmf = [c / 2**n for c in row]
    j = 1
    while j + 1 <= (n + 1) // 2 and 1 - 2 * sum(pmf[: j + 1]) >= conf:
        j += 1
    return j


@pytest.mark.parametrize("n, j", [(6, 1), (10, 2), (20, 6), (30, 10)])
def test_order_ci_ranks_for_1_to_n(n, j):
    assert _expected_rank(n) == j
    assert median_ci_order(list(range(1, n + 1))) == (j, n + 1 - j)
    # the chosen ranks reach 95%, the next ones inward do not
    assert order_ci_coverage(n, j) >= 0.95 > order_ci_coverage(n, j + 1)


def test_order_ci_small_n_falls_back_to_min_max():
    assert median_ci_order([3, 1, 5, 2, 4]) == (1, 5)
    assert order_ci_coverage(5, 1) < 0.95  # documented: actual coverage is lower
    assert median_ci_order([2.0, 1.0]) == (1.0, 2.0)


def test_order_ci_nan_empty_single_unsorted():
    lo, hi = median_ci_order([])
    assert math.isnan(lo) and math.isnan(hi)
    lo, hi = median_ci_order([7.0, NAN])
    assert math.isnan(lo) and math.isnan(hi)  # one step: no spread
    rng = np.random.default_rng(1)
    x = rng.permutation(np.arange(1.0, 11.0))
    assert median_ci_order(list(x) + [NAN, NAN]) == (2.0, 9.0)


def test_order_ci_coverage_simulation():
    rng = np.random.default_rng(12345)
    draws = rng.normal(5.0, 1.0, size=(2000, 30))
    covered = sum(lo <= 5.0 <= hi for lo, hi in map(median_ci_order, draws))
    # exact coverage of ranks (10, 21) at n = 30 is 0.9572
    assert 0.94 <= covered / 2000 <= 0.985


# --- trial interval ----------------------------------------------------------------------


def test_trial_ci_known_answer():
    lo, hi = trial_ci([10.0, 11.0, 12.0])
    half = 4.303 * 1.0 / math.sqrt(3)
    assert half == pytest.approx(2.484, abs=1e-3)
    assert lo == pytest.approx(11 - half, abs=1e-3)
    assert hi == pytest.approx(11 + half, abs=1e-3)


def test_trial_ci_degenerate_and_unsupported():
    assert all(math.isnan(v) for v in trial_ci([10.0]))
    assert all(math.isnan(v) for v in trial_ci([10.0, NAN]))
    assert trial_ci([4.0, 4.0, 4.0]) == (4.0, 4.0)
    with pytest.raises(ValueError):
        trial_ci([1.0, 2.0, 3.0], confidence=0.9)


def test_trial_ci_coverage_simulation():
    # three normal trial medians per draw: a wrong t(2) (e.g. 1.96) would cover ~75%
    rng = np.random.default_rng(7)
    draws = rng.normal(20.0, 3.0, size=(4000, 3))
    covered = sum(lo <= 20.0 <= hi for lo, hi in map(trial_ci, draws))
    assert 0.935 <= covered / 4000 <= 0.965


# --- summarize_trials (envelope) ------------------------------------------------------------


def _tight(level, k=10):
    return [level + d for d in np.linspace(-0.01, 0.01, k)]


def test_envelope_follows_trial_drift():
    s = summarize_trials([_tight(10.0), _tight(20.0), _tight(30.0)])
    half = T_975[2] * 10.0 / math.sqrt(3)  # medians 10, 20, 30: s = 10
    assert (s.n, s.trials) == (30, 3)
    assert s.median == pytest.approx(20.0)
    assert s.low == pytest.approx(20.0 - half)
    assert s.high == pytest.approx(20.0 + half)
    assert s.half_width_rel > 0.05  # wide: the trials drifted
    # the order-statistic interval alone is much narrower than the envelope
    lo, hi = median_ci_order(np.concatenate([_tight(10.0), _tight(20.0), _tight(30.0)]))
    assert hi - lo < s.high - s.low


def test_envelope_equals_order_ci_when_trials_agree():
    trial = list(np.linspace(9.8, 10.2, 10))
    s = summarize_trials([trial, trial, trial])
    lo, hi = median_ci_order(trial * 3)
    assert (s.low, s.high) == (lo, hi)
    assert s.median == pytest.approx(10.0)
    assert lo < 10.0 < hi
    assert s.half_width_rel <= 0.05


def test_summarize_contains_median_and_edge_cases():
    rng = np.random.default_rng(3)
    s = summarize_trials([rng.lognormal(0, 0.5, 7) for _ in range(3)])
    assert s.contains(s.median)
    one = summarize_trials([[5.0]])
    assert (one.median, one.n, one.trials) == (5.0, 1, 1)
    assert math.isnan(one.low) and math.isnan(one.high)
    empty = summarize_trials([[], [NAN]])
    assert math.isnan(empty.median) and empty.n == 0 and empty.trials == 0
    # single trial: only the order-statistic interval
    single = summarize_trials([list(range(1, 11))])
    assert (single.low, single.high, single.trials) == (2.0, 9.0, 1)


# --- Interval --------------------------------------------------------------------------------


def test_interval_methods():
    a = iv(10.0, 9.0, 11.0)
    assert a.half_width_rel == pytest.approx(0.1)
    assert a.contains(9.0) and a.contains(11.0) and not a.contains(11.01)
    assert a.overlaps(iv(12.0, 11.0, 13.0)) and not a.overlaps(iv(12.0, 11.5, 13.0))
    assert math.isnan(iv(0.0, -1.0, 1.0).half_width_rel)
    assert math.isnan(iv(NAN, NAN, NAN).half_width_rel)
    assert not iv(10.0, NAN, NAN).overlaps(a) and not iv(10.0, NAN, NAN).contains(10.0)


# --- ratio, verdict, significant ------------------------------------------------------------------


def test_ratio_interval_arithmetic():
    r = ratio_interval(iv(20.0, 18.0, 22.0, n=30, trials=3), iv(10.0, 8.0, 11.0, n=20, trials=2))
    assert r.median == pytest.approx(2.0)
    assert r.low == pytest.approx(18.0 / 11.0)
    assert r.high == pytest.approx(22.0 / 8.0)
    assert (r.n, r.trials) == (20, 2)
    assert r.contains(r.median)


def test_ratio_interval_nan_handling():
    neg = ratio_interval(iv(20.0, 18.0, 22.0), iv(10.0, -1.0, 21.0))
    assert neg.median == pytest.approx(2.0) and math.isnan(neg.low) and math.isnan(neg.high)
    z = ratio_interval(iv(20.0, 18.0, 22.0), iv(0.0, 0.0, 0.0))
    assert math.isnan(z.median) and math.isnan(z.low)
    u = ratio_interval(iv(20.0, NAN, NAN), iv(10.0, 9.0, 11.0))
    assert u.median == pytest.approx(2.0) and verdict(u, u) == "n/a"


def test_verdict_slowdown_outside_noise_and_change_inside_noise():
    base = iv(10.0, 9.9, 10.1)
    assert verdict(iv(11.0, 10.9, 11.1), base) == "slower"  # +10%, noise ±1%
    assert verdict(base, iv(11.0, 10.9, 11.1)) == "faster"
    assert significant(iv(11.0, 10.9, 11.1), base)
    noisy = iv(10.1, 9.6, 10.6)  # +1% change inside ±5% noise
    assert verdict(noisy, base) == "same"
    assert not significant(noisy, base)
    assert verdict(iv(10.0, NAN, NAN), base) == "n/a"
    assert not significant(iv(20.0, NAN, NAN), base)


# --- GPU busy fraction ----------------------------------------------------------------------


def test_gpu_busy_fraction_merges_and_clips():
    # two streams overlapping on [20, 30]: union [10, 40] = 30 of 100
    assert gpu_busy_fraction([(10, 30), (20, 40)], (0, 100)) == pytest.approx(0.3)
    # nested kernel counts once; disjoint kernel adds
    assert gpu_busy_fraction([(10, 50), (20, 30), (60, 70)], (0, 100)) == pytest.approx(0.5)
    # crossing both edges: [-10, 5] -> [0, 5], [95, 120] -> [95, 100]; outside ones ignored
    k = [(-10, 5), (95, 120), (-50, -20), (150, 160)]
    assert gpu_busy_fraction(k, (0, 100)) == pytest.approx(0.1)
    assert gpu_busy_fraction([(-5, 200)], (0, 100)) == pytest.approx(1.0)
    assert gpu_busy_fraction([], (0, 100)) == 0.0
    assert gpu_busy_fraction([(30, 40), (10, 20)], (10, 60)) == pytest.approx(0.4)  # unsorted
    with pytest.raises(ValueError):
        gpu_busy_fraction([(0, 1)], (5, 5))


# --- formatting ------------------------------------------------------------------------------


def test_fmt_interval():
    assert fmt_interval(iv(12.3, 12.1, 12.6)) == "12.3 [12.1, 12.6]"
    assert fmt_interval(iv(12.34567, 12.1234, 12.6789)) == "12.35 [12.12, 12.68]"
    assert fmt_interval(iv(12.34567, 12.1234, 12.6789), digits=2) == "12 [12, 13]"
    assert fmt_interval(iv(NAN, NAN, NAN)) == "—"
    assert fmt_interval(iv(5.0, NAN, NAN, n=1, trials=1)) == "5 [—]"


def test_merge_flags_rows_noisy_host_bound_and_throttled():
    import pandas as pd

    from cs336sys.analysis.metrics import add_flags

    columns = {
        "median_ms": [10.0, 10.0, 10.0],
        "ci_low_ms": [9.9, 8.0, 9.9],
        "ci_high_ms": [10.1, 12.0, 10.1],
        "gpu_busy_frac": [0.95, 0.5, None],
        "start_throttle_reasons": ["gpu_idle", "none", "sw_power_cap"],
        "end_throttle_reasons": ["none", "gpu_idle", "none"],
        "end_sm_clock_mhz": [1980, 900, 1980],
        "max_sm_clock_mhz": [1980, 1980, 1980],
    }
    out = add_flags(pd.DataFrame(columns))
    assert out["noisy"].tolist() == [False, True, False]
    assert out["host_bound"].tolist()[:2] == [False, True] and pd.isna(out["host_bound"].iloc[2])  # unmeasured: empty
    assert out["throttled"].tolist() == [False, False, True]  # idle between launches is not throttling
    assert out["below_clocks"].tolist() == [False, True, False]


def test_busy_intervals_from_raw_profiler_events_of_either_torch():
    # torch 2.11's raw events have is_user_annotation() but no activity_type() (seen on the H100):
    # both must give the window and the GPU work, never our ranges on the GPU timeline
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from cs336sys.measure.busy import WINDOW, _intervals

    def event(name, device, start, end, annotation, new_torch):
        e = NS(name=lambda: name, device_type=lambda: device, start_ns=lambda: start, end_ns=lambda: end)
        if new_torch:
            e.activity_type = lambda: ("gpu_user_annotation" if annotation else "kernel") if device == DeviceType.CUDA else "cpu_op"
        else:
            e.is_user_annotation = lambda: annotation
        return e

    for new_torch in (True, False):
        events = [
            event(WINDOW, DeviceType.CPU, 0, 100, True, new_torch),
            event(WINDOW, DeviceType.CUDA, 5, 95, True, new_torch),  # the window's GPU-side copy
            event("forward", DeviceType.CUDA, 10, 60, True, new_torch),  # a phase range
            event("sgemm", DeviceType.CUDA, 10, 30, False, new_torch),
            event("aten::mm", DeviceType.CPU, 8, 12, False, new_torch),
        ]
        prof = NS(profiler=NS(kineto_results=NS(events=lambda events=events: events)))
        assert _intervals(prof) == ([(0, 100)], [(10, 30)])
