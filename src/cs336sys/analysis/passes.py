"""One row per measured (cell, mode, phase) from the sweep's passes over the grid.

A timed study can measure its grid in ``passes`` passes (config key ``passes``):
pass k of every cell runs before pass k+1 of any, so the passes of one cell lie
minutes apart and see the host as it drifts over the sweep. On the H100 host,
launch-bound cells moved 10-40% between blocks seconds apart and between runs
minutes apart (report/h100-repeatability): trials inside one job cannot see
that, passes can. This module folds the passes of a cell into one row:

- centre: the median of every step of every pass (the median of the per-pass
  medians where a pass did not keep its steps, e.g. do_bench's thousands);
- interval: the envelope of the order-statistic interval of the pooled steps
  (or the hull of the per-pass intervals), the Student-t interval of all
  trial medians and the Student-t interval of the pass medians — each blind
  to one kind of noise, as in :func:`cs336sys.measure.stats.summarize_trials`;
- then widened to at least ``floor_rel`` of the centre on each side: on the
  H100, cells that kept the GPU busy repeated within 0.65% between runs while
  their own intervals were ±0.05%; an interval narrower than what a rerun
  shows would make every rerun a finding.

The energy of a step (``energy_j``, measure.energy) folds like its time: the per-block J/step of
every pass pooled, their median and the interval over blocks, widened to the same floor (a rerun
moves energy at least as much as time: power follows the clocks and the temperature).

The state columns keep the worst case: the lowest end-of-timing SM clock and
every throttle reason seen, so ``throttled`` and ``below_clocks`` flag a cell
if any pass ran so; ``gpu_busy_frac`` is the lowest of the passes.
Failure rows are kept from every pass (once per distinct failure).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from cs336sys.analysis.drift import POOLED, drift_class, pair_busy, pass_interval, pooled_drift
from cs336sys.columns import FOLDS, GPU_TIME_PREFIX, GPU_TIME_STATS, PAIR_KIND, fold_of, sample_stats, stat_columns, timed_kind, undeclared
from cs336sys.measure.stats import median_ci_order, paired_ratio, summarize_trials, trial_ci

PASS = "pass_index"
KEY = ["cell_id", "mode", "phase"]


def _floats(value: object) -> list[float]:
    """A ``;``-joined list column's values; a one-value list comes back from CSV as a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)] if math.isfinite(value) else []
    if not isinstance(value, str) or not value:
        return []
    return [float(v) for v in value.split(";") if v]


def widen(median: float, low: float, high: float, floor_rel: float) -> tuple[float, float]:
    """(low, high) widened to at least ``floor_rel`` × ``median`` on each side; nan bounds stay nan."""
    if not (math.isfinite(median) and floor_rel > 0):
        return low, high
    return (min(low, median * (1 - floor_rel)), max(high, median * (1 + floor_rel)))


def combine_timed(group: pd.DataFrame, floor_rel: float, pooled: tuple[float, int] | None = None, axes: Sequence[str] = ()) -> dict:
    """One row from the ok rows of the same (cell, mode, phase) in one or more passes; each column by its fold."""
    group = group.sort_values(PASS) if PASS in group else group
    row = group.iloc[0].to_dict()
    per_pass = [_floats(s) for s in group.get("samples_ms", pd.Series([""] * len(group)))]
    pass_medians = [float(m) for m in group["median_ms"]]
    trial_medians = [m for s in group.get("trial_medians_ms", []) for m in _floats(s)] or pass_medians
    have_steps = all(per_pass) and len(per_pass) == len(group)
    pooled_steps = np.concatenate([np.asarray(s) for s in per_pass]) if have_steps else np.empty(0)
    if have_steps:
        median = float(np.median(pooled_steps))
        parts = [median_ci_order(pooled_steps)]
    else:
        median = float(np.median(pass_medians))
        bounds = [pd.to_numeric(group.get(c, pd.Series(dtype=float)), errors="coerce") for c in ("ci_low_ms", "ci_high_ms")]
        parts = [(float(bounds[0].min()), float(bounds[1].max()))] if all(b.notna().all() and len(b) for b in bounds) else []
    if len(trial_medians) > len(pass_medians):  # several trials per pass: their drift within a pass
        parts.append(trial_ci(trial_medians))
    between = pass_interval(median, pass_medians, pooled)
    if between is not None:
        parts.append(between)
    parts = [p for p in parts if all(math.isfinite(x) for x in p)]
    low = min([median, *(p[0] for p in parts)])
    high = max([median, *(p[1] for p in parts)])
    low, high = widen(median, low, high, floor_rel)
    row.update(median_ms=median, ci_low_ms=max(low, 0.0), ci_high_ms=high, passes=len(group))
    row["pass_medians_ms"] = ";".join(f"{m:.4f}" for m in pass_medians)
    row.update(host_speed(group), **combine_energy(group, floor_rel))
    if len(group) == 1:
        return row
    n = pd.to_numeric(group.get("n", pd.Series([1] * len(group))), errors="coerce").fillna(1)
    row.update(n=int(n.sum()), trials=len(trial_medians), trial_medians_ms=";".join(f"{m:.4f}" for m in trial_medians))
    if have_steps:
        x = pooled_steps
        row.update(
            mean_ms=float(x.mean()),
            std_ms=float(x.std(ddof=1)) if x.size > 1 else 0.0,
            min_ms=float(x.min()),
            max_ms=float(x.max()),
            samples_ms=";".join(f"{s:.4f}" for s in x) if x.size <= 500 else "",
        )
    else:
        row.update(
            mean_ms=float(np.average(group["mean_ms"], weights=n)),
            min_ms=float(group["min_ms"].min()),
            max_ms=float(group["max_ms"].max()),
            std_ms=float(group["std_ms"].max()),
            samples_ms="",
        )
    if have_steps:
        row.update(sample_stats(pooled_steps))
    else:  # no steps to pool (do_bench's passes): each statistic as the centre above, the median of the passes'
        row.update(pass_stats(group))
    last = group.iloc[-1]
    for col in group.columns:  # every other column by its fold (cs336sys.columns); pooled and derived ones are set above
        fold = fold_of(col, axes)
        if fold in ("sum", "min", "max"):
            row[col] = getattr(pd.to_numeric(group[col], errors="coerce"), fold)()
        elif fold == "last":
            row[col] = last[col]
        elif fold == "join":
            row[col] = ";".join(dict.fromkeys(r for v in group[col].dropna() for r in str(v).split(";") if r))
    # each pass's own span and GPU, for the sweep-efficiency table (with several GPUs, passes of a cell may differ)
    for col in ("started_at", "finished_at", "gpu_index", "gpu_uuid"):
        if col in group:
            row[f"pass_{col}"] = ";".join("" if pd.isna(v) else str(v) for v in group[col])
    return row


def pass_stats(group: pd.DataFrame) -> dict[str, float]:
    """The statistics declared with a ``stat`` (cs336sys.columns) where the passes kept no step times:
    the median of the passes' own values, as ``median_ms`` is then the median of the pass medians."""
    out = {}
    for name in stat_columns():
        if name in group:
            values = pd.to_numeric(group[name], errors="coerce").dropna()
            out[name] = float(values.median()) if len(values) else math.nan
    return out


def combine_energy(group: pd.DataFrame, floor_rel: float) -> dict:
    """The energy columns of one (cell, mode, phase) from its passes (module doc); {} where none were recorded.

    Where a pass kept no per-block samples (blocks under 0.5 s: a total without interval), the
    median of the passes' J/step, without an interval. ``avg_power_w``: the passes' mean."""
    if "energy_j" not in group:
        return {}
    text = {c: ";".join(dict.fromkeys(str(v) for v in group[c].dropna() if str(v))) for c in ("energy_source", "energy_note") if c in group}
    have = group[pd.to_numeric(group["energy_j"], errors="coerce").notna()]
    if have.empty:
        return text
    per_pass = [_floats(v) for v in have.get("energy_samples_j", pd.Series([""] * len(have)))]
    out = {"avg_power_w": float(pd.to_numeric(have.get("avg_power_w", pd.Series(dtype=float)), errors="coerce").mean()), **text}
    if not all(per_pass):
        median = float(pd.to_numeric(have["energy_j"]).median())
        return out | {"energy_j": median, "energy_ci_low_j": math.nan, "energy_ci_high_j": math.nan, "energy_samples_j": ""}
    pooled = [x for s in per_pass for x in s]
    iv = summarize_trials([[x] for x in pooled])  # each block one draw, as within a pass
    low, high = widen(iv.median, iv.low, iv.high, floor_rel)
    return out | {
        "energy_j": iv.median,
        "energy_ci_low_j": max(low, 0.0) if math.isfinite(low) else math.nan,
        "energy_ci_high_j": high,
        "energy_samples_j": ";".join(f"{x:.6g}" for x in pooled),
    }


HOST_PROBE = "host_launch_us"


def host_speed(group: pd.DataFrame) -> dict:
    """``host_launch_us``: the median of the host probe's samples around every pass's timed blocks
    (measure.host_probe), empty where none was recorded (runs before the probe, a failed probe)."""
    samples = [x for c in (f"start_{HOST_PROBE}", f"end_{HOST_PROBE}") if c in group for x in pd.to_numeric(group[c], errors="coerce")]
    samples = [x for x in samples if math.isfinite(x)]
    return {HOST_PROBE: float(np.median(samples))} if samples else {}


def _unprefixed(group: pd.DataFrame) -> pd.DataFrame:
    """The passes' GPU-time columns of one (cell, mode, phase), under the names combine_timed reads."""
    cols = [c for c in GPU_TIME_STATS if GPU_TIME_PREFIX + c in group]
    sub = (
        group[[PASS] + [GPU_TIME_PREFIX + c for c in cols]].rename(columns={GPU_TIME_PREFIX + c: c for c in cols})
        if PASS in group
        else group[[GPU_TIME_PREFIX + c for c in cols]]
    )
    return sub[pd.to_numeric(sub["median_ms"], errors="coerce").notna()] if "median_ms" in sub else sub.iloc[0:0]


def _prefixed(row: dict) -> dict:
    return {GPU_TIME_PREFIX + c: row[c] for c in (*GPU_TIME_STATS, "passes", "pass_medians_ms") if c in row}


def _pass_ratios(group: pd.DataFrame) -> list[float]:
    """Each pass's own paired ratio (the geometric mean of its block ratios)."""
    out = []
    for own, other in zip(group.get("own_blocks_ms", []), group.get("partner_blocks_ms", [])):
        r = paired_ratio(_floats(own), _floats(other))
        if math.isfinite(r.median):
            out.append(r.median)
    return out


def combine_pairs(group: pd.DataFrame, pooled: tuple[float, int] | None = None, floor_rel: float = 0.0) -> dict:
    """One paired-ratio row from the passes of one (cell, mode, phase, partner).

    Within a pass, interleaving cancels the host's drift, and all passes' pairs together
    give the paired interval (:func:`cs336sys.measure.stats.paired_ratio`). But the ratio
    itself moves with the host between passes (an eager step over its graph replay is
    larger on a slower host): on an H200, runs minutes apart put only 47% of the ratios
    inside each other's paired intervals. So, as for timed rows, the interval is the
    envelope of the paired one and the between-pass one
    (:func:`cs336sys.analysis.drift.pass_interval`, drift pooled over the study's
    comparisons of the same kind, ``pooled``). A pass that could not pair adds nothing.
    The interval floor applies as to timed rows: on an H100, a GPU-bound ratio paired within ±0.2%
    moved 0.5% between runs.
    """
    group = group.sort_values(PASS) if PASS in group else group
    row = group.iloc[0].to_dict()
    own = [x for v in group.get("own_blocks_ms", []) for x in _floats(v)]
    other = [x for v in group.get("partner_blocks_ms", []) for x in _floats(v)]
    row.update(host_speed(group))
    if not own:
        return row
    if len(group) == 1:
        row["ratio_ci_low"], row["ratio_ci_high"] = widen(row["ratio"], row["ratio_ci_low"], row["ratio_ci_high"], floor_rel)
        return row
    ratio = paired_ratio(own, other)
    low, high = ratio.low, ratio.high
    between = pass_interval(ratio.median, _pass_ratios(group), pooled)
    if between is not None and all(math.isfinite(x) for x in between):
        low, high = min(low, between[0]), max(high, between[1])
    low, high = widen(ratio.median, low, high, floor_rel)
    row.update(
        ratio=ratio.median,
        ratio_ci_low=low,
        ratio_ci_high=high,
        pairs=ratio.n,
        passes=len(group),
        pass_ratios=";".join(f"{r:.4f}" for r in _pass_ratios(group)),
        own_ms=float(np.median(own)),
        partner_ms=float(np.median(other)),
        own_blocks_ms=";".join(f"{x:.4f}" for x in own),
        partner_blocks_ms=";".join(f"{x:.4f}" for x in other),
        stop_reason=";".join(dict.fromkeys(str(v) for v in group["stop_reason"].dropna())),
    )
    return row


class UndeclaredColumnError(ValueError):
    """A timed row carries a column that no line of ``cs336sys.columns`` says how to fold."""


def check_declared(timed: pd.DataFrame, axes: Sequence[str]) -> None:
    """Refuse a timed row's column without a fold rule: its passes would silently keep pass 0's value."""
    names = [c for c in timed.columns if c != "_order" and timed[c].notna().any()]
    if missing := undeclared(names, axes):
        raise UndeclaredColumnError(
            f"column(s) {', '.join(missing)} of the timed rows have no fold rule: add a Column(name, unit, fold) line "
            f"to cs336sys.columns.COLUMNS (fold one of {', '.join(FOLDS)}) so the merge knows how to combine passes"
        )


def _pair_class(first: pd.Series, busy, min_gpu_busy: float) -> str:
    """A comparison's drift class: the axis it compares, and the drift class of its more host-bound side."""
    axis = str(first["pair_with"]).partition("=")[0]
    return f"{axis}/{drift_class(pair_busy(first['cell_id'], first['mode'], first['pair_with'], busy), min_gpu_busy)}"


def combine_passes(df: pd.DataFrame, floor_rel: float = 0.0, min_gpu_busy: float = 0.9, axes: Sequence[str] = ()) -> pd.DataFrame:
    """Fold a study's rows from several passes into one row per (cell, mode, phase); see the module doc.

    Timed ok rows (those with a ``median_ms``) are combined; other ok rows (typed
    records, memory, profiles) come from each cell's first pass that has them;
    failure rows from every pass, once per distinct failure. The interval floor
    applies to every timed row, a single pass's included.
    """
    if df.empty or "status" not in df or not ({"median_ms", "kind"} & set(df)):
        return df
    if PASS not in df:
        df = df.assign(**{PASS: 0})
    ok = df["status"] == "ok"
    timed = ok & pd.to_numeric(df.get("median_ms", pd.Series(index=df.index, dtype=float)), errors="coerce").notna()
    if "kind" in df:
        timed &= timed_kind(df["kind"])
    df = df.assign(_order=df.groupby("cell_id", sort=False).ngroup())  # keep the cells' order of appearance
    key = [c for c in KEY if c in df]
    parts: list[pd.DataFrame] = []
    if timed.any():
        check_declared(df[timed], axes)
        groups = [g for _, g in df[timed].fillna({c: "" for c in key}).groupby(key, sort=False, dropna=False)]
        classes = [
            drift_class(pd.to_numeric(g.get("gpu_busy_frac"), errors="coerce").min() if "gpu_busy_frac" in g else None, min_gpu_busy)
            for g in groups
        ]
        pools = pooled_drift([(c, [float(m) for m in g["median_ms"]]) for c, g in zip(classes, groups) if c in POOLED])
        rows = [combine_timed(g, floor_rel, pools.get(c), axes) for c, g in zip(classes, groups)]
        if GPU_TIME_PREFIX + "median_ms" in df:  # the CUDA-graph replay of the same step: GPU-bound by construction
            gpu = [_unprefixed(g) for g in groups]
            gpu_pool = pooled_drift([("gpu-bound", [float(m) for m in g["median_ms"]]) for g in gpu if len(g)]).get("gpu-bound")
            for row, g in zip(rows, gpu):
                if len(g):
                    row.update(_prefixed(combine_timed(g, floor_rel, gpu_pool)))
        parts.append(pd.DataFrame(rows))
    pairs = ok & (df["kind"].astype(str) == PAIR_KIND) if "kind" in df else ok & False
    if pairs.any():
        pair_groups = [g for _, g in df[pairs].groupby(["cell_id", "mode", "phase", "pair_with"], sort=False)]
        # a comparison's drift pools with comparisons of the same kind whose more host-bound side is as host-bound (eager / graph
        # moves with the host far more than fp32 / bf16, and a launch-bound cell's far more than a GPU-bound one's)
        busy = (
            df[timed & (df.get("phase", "") == "step")].groupby(["cell_id", "mode"])["gpu_busy_frac"].min() if "gpu_busy_frac" in df else {}
        )
        kind = [_pair_class(g.iloc[0], busy, min_gpu_busy) for g in pair_groups]
        pair_pools = pooled_drift([(k, _pass_ratios(g)) for k, g in zip(kind, pair_groups)])
        parts.append(pd.DataFrame([combine_pairs(g, pair_pools.get(k), floor_rel) for k, g in zip(kind, pair_groups)]))
    other = df[ok & ~timed & ~pairs]
    if not other.empty:
        first = other.groupby("cell_id")[PASS].transform("min")
        parts.append(other[other[PASS] == first])
    failed = df[~ok]
    if not failed.empty:
        dedup = [c for c in ("cell_id", "mode", "status", "error") if c in failed]
        parts.append(failed.sort_values(PASS).drop_duplicates(dedup))
    out = pd.concat(parts, ignore_index=True, sort=False).sort_values("_order", kind="stable")
    columns = [c for c in df.columns if c in out] + [c for c in out.columns if c not in df.columns]
    return out[columns].drop(columns="_order").reset_index(drop=True)
