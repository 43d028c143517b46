"""Findings computed from the merged results (never typed in): ratios, slopes, OOM frontiers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336sys.analysis.drift import drift_class
from cs336sys.analysis.metrics import FLAG_DEFAULTS
from cs336sys.analysis.tables import OK, ok_rows
from cs336sys.measure.stats import Interval, ratio_interval, significant

MIB = 2**20
# Where a comparison's ratio came from (its ``source``): interleaved blocks in one process, or two cells' intervals
PAIRED, TWO_CELLS = "paired", "two cells"
REPLAY, GRAPH_CELL = "replay", "graph cell"  # where a row's GPU time came from (``gpu_source``): its own replay, a graph cell
# Whether the fastest of several is a finding (``separated``): only where the two 95% intervals do not overlap
SEPARATED, NOT_SEPARATED, NO_INTERVAL = "yes", "no significant difference", "no interval recorded"


def loglog_slope(x: pd.Series, y: pd.Series, last: int = 3) -> float:
    """Slope of log y vs log x over the ``last`` largest x (the asymptotic regime); NaN if < 2 points."""
    pts = pd.DataFrame({"x": x.to_numpy(dtype=float), "y": y.to_numpy(dtype=float)}).dropna()
    pts = pts[(pts["x"] > 0) & (pts["y"] > 0)].sort_values("x").tail(last)
    if pts["x"].nunique() < 2:
        return float("nan")
    return float(np.polyfit(np.log(pts["x"]), np.log(pts["y"]), 1)[0])


def scaling_slopes(df: pd.DataFrame, groups: list[str], panels: list[tuple[str, str, str]], x: str = "seq_len") -> pd.DataFrame:
    """Per group, the log–log slope in ``x`` of each (mode, phase, column) panel."""
    rows = []
    ok = ok_rows(df)
    for key, part in ok.groupby(groups):
        row = dict(zip(groups, key if isinstance(key, tuple) else (key,)))
        for mode, phase, column in panels:
            sel = part[(part["mode"] == mode) & (part["phase"] == phase)]
            name = f"slope_{phase}_{'mem' if 'mem' in column else 'time'}"
            row[name] = loglog_slope(sel[x], sel[column]) if column in sel else float("nan")
            if column == "median_ms" and "ci_low_ms" in sel:
                low, high = slope_bounds(sel[x], sel["ci_low_ms"], sel["ci_high_ms"])
                row[f"{name}_range"] = f"[{low:.2f}, {high:.2f}]" if np.isfinite(low) else "—"
        row["points"] = part[x].nunique()
        rows.append(row)
    return pd.DataFrame(rows)


def oom_frontier(df: pd.DataFrame, groups: list[str], x: str = "seq_len") -> pd.DataFrame:
    """Per group: the largest x that ran and the smallest x that ran out of memory."""
    rows = []
    for key, part in df.groupby(groups):
        row = dict(zip(groups, key if isinstance(key, tuple) else (key,)))
        cells = part.groupby(x)["status"].agg(lambda s: "ok" if (s == OK).all() else ",".join(sorted(set(s) - {OK})))
        row["largest_ok"] = max((v for v, s in cells.items() if s == "ok"), default=None)
        row["first_oom"] = min((v for v, s in cells.items() if "oom" in s), default=None)
        rows.append(row)
    return pd.DataFrame(rows)


def separation(winner: pd.Series, runner_up: pd.Series) -> str:
    """The ``separated`` text: yes where the winner's 95% interval lies wholly below the runner-up's."""
    a, b = intervals(pd.DataFrame([winner, runner_up]))
    if not (a.bounded and b.bounded):
        return NO_INTERVAL
    return SEPARATED if significant(a, b) else NOT_SEPARATED


def intervals(df: pd.DataFrame) -> list[Interval]:
    """The 95% interval of each row's median (nan bounds where an old run recorded none)."""
    low = df["ci_low_ms"] if "ci_low_ms" in df else pd.Series(np.nan, index=df.index)
    high = df["ci_high_ms"] if "ci_high_ms" in df else pd.Series(np.nan, index=df.index)
    n = df["n"] if "n" in df else pd.Series(0, index=df.index)
    trials = df["trials"] if "trials" in df else pd.Series(1, index=df.index)
    return [
        Interval(float(m), float(lo), float(hi), int(k) if pd.notna(k) else 0, int(t) if pd.notna(t) else 1)
        for m, lo, hi, k, t in zip(df["median_ms"], low, high, n, trials)
    ]


# A ratio whose interval holds 1 but lies within ±TIGHT_REL of it is an answer too: "no difference
# within ±x%". The e2e default asks each paired ratio for ±5% (target_rel); twice that still rules
# out every effect the handout asks about (bf16, CUDA graphs, compile: 1.1× and more on an H100).
TIGHT_REL = 0.10


def reach(ratio: Interval) -> float:
    """How far a ratio's interval reaches from 1 on its wider side: the x of "within ±x"."""
    return max(1 - ratio.low, ratio.high - 1)


def percent_up(share: float) -> str:
    """``share`` as a percentage with two significant digits, rounded up (a bound must not shrink): 0.0312 → "3.2%"."""
    if not (np.isfinite(share) and share > 0):
        return "0%"
    pct = 100 * share
    step = 10.0 ** (np.floor(np.log10(pct)) - 1)
    return f"{np.ceil(pct / step - 1e-9) * step:.4g}%"


def describe_ratio(ratio: Interval, *, faster: str = "", slower: str = "", budget: bool = False, why: str = "") -> str:
    """A ratio in words: ``1.66× [1.60, 1.72]`` where its interval excludes 1 (a finding), else why it is none.

    With interval arithmetic the ratio's interval excludes 1 exactly when the two
    medians' intervals are disjoint; a paired ratio's interval comes from its pairs.
    A finding above 1 is followed by ``faster`` (": bf16 is faster"), below 1 by
    ``slower``. An interval holding 1 reads "no difference within ±x%" where it is
    tight (:data:`TIGHT_REL`); a wider one "unbounded" only where sampling stopped
    because its time budget ran out (``budget``), else "no significant difference";
    ``why`` says what made it wide (e.g. "launch-bound: the GPU was busy 26% of the step").
    """
    if not np.isfinite(ratio.median):
        return "—"
    if not (np.isfinite(ratio.low) and np.isfinite(ratio.high)):
        return f"{ratio.median:.3g}× (no interval)"
    text = f"{ratio.median:.3g}× [{ratio.low:.3g}, {ratio.high:.3g}]"
    if ratio.low > 1 or ratio.high < 1:
        words = faster if ratio.low > 1 else slower
        return f"{text}: {words}" if words else text
    x = reach(ratio)
    if x <= TIGHT_REL:
        return f"no difference within ±{percent_up(x)} ({text})"
    reason = f"; {why}" if why else ""
    if budget:
        return f"unbounded ({text}: ±{percent_up(x)} when the time budget ran out{reason})"
    return f"no significant difference ({text}{reason})"


def stopped_on_budget(stop_reason: object) -> bool:
    """True where sampling stopped because ``max_measure_s`` ran out (``stop_reason`` holds "budget"; passes join theirs with ";")."""
    return isinstance(stop_reason, str) and "budget" in stop_reason.split(";")


def busy_words(busy: object, min_gpu_busy: float = FLAG_DEFAULTS["min_gpu_busy"]) -> str:
    """Why a step's wall time moves with the host, in words: "launch-bound: the GPU was busy 26% of the step"."""
    cls = drift_class(busy, min_gpu_busy)
    if cls in ("unknown", "gpu-bound"):
        return ""
    return f"{cls}: the GPU was busy {100 * float(busy):.2g}% of the step"


def why_wide(row: pd.Series | dict) -> str:
    """What widened a timed row's interval, in words ("" where nothing recorded explains it).

    The host (a launch-bound step moves with Python and the CPU), passes that disagree
    (minutes apart, the host drifted), and a time budget that ran out before the target.
    """
    parts = [busy_words(row.get("gpu_busy_frac"))]
    medians = [float(x) for x in str(row.get("pass_medians_ms") or "").split(";") if x.strip() and x != "nan"]
    if len(medians) > 1 and min(medians) > 0:
        parts.append(f"its {len(medians)} passes' medians differ by {100 * (max(medians) / min(medians) - 1):.3g}%")
    if stopped_on_budget(row.get("stop_reason")):
        parts.append("the time budget ran out before the interval met its target")
    return "; ".join(p for p in parts if p)


def paired_ratios(df: pd.DataFrame, index: list[str], column: str, top: str, bottom: str) -> pd.DataFrame:
    """Per ``index`` group, time(``column``=top) / time(``column``=bottom) with its 95% interval.

    The ratio's interval is conservative interval arithmetic on the two medians'
    intervals; ``significant`` is True only where the two intervals do not overlap,
    and ``finding`` then states the ratio, otherwise "no significant difference".
    """
    # the columns the ratio reads, first: a flash grid's rows carry ~90, and copying them all per group
    # made this 44 ms a call (the answers of h100-flash-grid: 11 s in 249 calls)
    df = df[[c for c in dict.fromkeys([*index, column, "status", "median_ms", "ci_low_ms", "ci_high_ms", "n", "trials"]) if c in df]]
    rows = ok_rows(df).dropna(subset=["median_ms"]) if "median_ms" in df else df.iloc[0:0]
    a = rows[rows[column] == top].set_index(index)
    b = rows[rows[column] == bottom].set_index(index)
    common = a.index.intersection(b.index)
    out = []
    for key in common:
        (ia,), (ib,) = intervals(a.loc[[key]]), intervals(b.loc[[key]])
        ratio = ratio_interval(ia, ib)
        out.append(
            {
                **dict(zip(index, key if isinstance(key, tuple) else (key,))),
                f"{top}_ms": ia.median,
                f"{bottom}_ms": ib.median,
                "ratio": ratio.median,
                "ratio_low": ratio.low,
                "ratio_high": ratio.high,
                "significant": significant(ia, ib),
                "finding": describe_ratio(ratio),
            }
        )
    return pd.DataFrame(out)


def slope_bounds(x: pd.Series, low: pd.Series, high: pd.Series, last: int = 3) -> tuple[float, float]:
    """The range of log–log slopes the intervals allow between the first and last of the ``last`` largest x."""
    pts = pd.DataFrame({"x": x.to_numpy(dtype=float), "lo": low.to_numpy(dtype=float), "hi": high.to_numpy(dtype=float)}).dropna()
    pts = pts[(pts["x"] > 0) & (pts["lo"] > 0)].sort_values("x").tail(last)
    if pts["x"].nunique() < 2:
        return float("nan"), float("nan")
    first, end = pts.iloc[0], pts.iloc[-1]
    span = np.log(end["x"] / first["x"])
    return float(np.log(end["lo"] / first["hi"]) / span), float(np.log(end["hi"] / first["lo"]) / span)
