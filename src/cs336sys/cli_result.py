"""What ``cs336sys <study>`` prints: one cell's rows as tables, their paired ratios, and what their flags mean."""

from __future__ import annotations

from typing import Any

from cs336sys import studies as S
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import load_schema

SHOW_COLUMNS = [
    "status",
    "mode",
    "phase",
    "median_ms",
    "95% interval",
    "flags",
    "GPU ms [95%]",
    "n",
    "trials",
    "stop_reason",
    "tflops",
    "mfu_pct",
    "tokens_per_s",
    "peak_mem_bytes",
    "mem_before_bwd_bytes",
    "error",
]
PAIR_COLUMNS = ["mode", "phase", "comparison", "ratio [95% interval]", "pairs", "stop_reason"]


def _interval(low: Any, high: Any) -> str:
    """``[low, high]`` with 4 significant digits, "" where the row has no interval."""
    try:
        low, high = float(low), float(high)
    except (TypeError, ValueError):
        return ""
    return f"[{low:.4g}, {high:.4g}]" if low == low and high == high else ""  # x == x: not NaN


def result_tables(frame, study: str) -> str:
    """The printed result: one row per timed phase with its interval, its trust flags and its GPU time,
    then the paired ratios (``kind=pair`` rows), then what the flags mean where a row carries one.

    Flags are printed where the eye falls: a CPU cell run three times can give three medians
    whose intervals exclude each other (the host drifted); each run then says ``noisy``.
    """
    from cs336sys.analysis.findings import describe_ratio, stopped_on_budget
    from cs336sys.analysis.metrics import FLAG_DEFAULTS
    from cs336sys.columns import PAIR_KIND
    from cs336sys.measure.stats import Interval

    kind = frame["kind"].astype(str) if "kind" in frame else None
    rows = frame[kind != PAIR_KIND] if kind is not None else frame
    pairs = frame[kind == PAIR_KIND] if kind is not None else frame.iloc[0:0]
    shown = rows.copy()
    if {"ci_low_ms", "ci_high_ms"} <= set(shown.columns):
        shown["95% interval"] = [_interval(lo, hi) for lo, hi in zip(shown["ci_low_ms"], shown["ci_high_ms"])]
    flag_cols = [c for c in ("noisy", "host_bound") if c in shown]
    trials = shown["trials"] if "trials" in shown else [None] * len(shown)
    shown["flags"] = [
        ", ".join(
            [c.replace("_", "-") for c in flag_cols if r[c] is True or r[c] == 1.0]
            + (["one trial"] if t == 1 and r.get("median_ms") == r.get("median_ms") else [])
        )
        for (_, r), t in zip(shown.iterrows(), trials)
    ]
    if "gpu_median_ms" in shown and shown["gpu_median_ms"].notna().any():
        none = shown["gpu_median_ms"] * float("nan")
        shown["GPU ms [95%]"] = [
            f"{m:.4g} {_interval(lo, hi)}" if m == m else ""
            for m, lo, hi in zip(shown["gpu_median_ms"], shown.get("gpu_ci_low_ms", none), shown.get("gpu_ci_high_ms", none))
        ]
    out = [shown[[c for c in SHOW_COLUMNS if c in shown.columns]].to_markdown(index=False, floatfmt=".4g")]
    if not pairs.empty:
        labels = {p.partner: p.label for p in S.study(study).pairs}

        def words(r) -> str:  # the ratio as the answers say it, or why the partner was not timed
            ratio = Interval(*(float(r.get(c, "nan")) for c in ("ratio", "ratio_ci_low", "ratio_ci_high")), 0, 1)
            if ratio.median != ratio.median:  # NaN: no ratio
                return f"not paired: {r.get('pair_note')}"
            return describe_ratio(ratio, budget=stopped_on_budget(r.get("stop_reason")))

        table = pairs.assign(
            comparison=[labels.get(str(w), str(w)) for w in pairs["pair_with"]],
            **{"ratio [95% interval]": [words(r) for _, r in pairs.iterrows()]},
        )
        out += [
            "",
            "Paired ratios (this cell's time / the partner's, interleaved blocks in one process; above 1: the partner is faster):",
            "",
            table[[c for c in PAIR_COLUMNS if c in table.columns]].to_markdown(index=False, floatfmt=".4g"),
        ]
    flagged = {f.strip() for f in ", ".join(shown["flags"]).split(",") if f.strip()}
    if flagged:
        out += [""] + [f"{name}: {text}." for name, text in _flag_meanings(study, FLAG_DEFAULTS["noisy_rel"]).items() if name in flagged]
    return "\n".join(out)


def _flag_meanings(study: str, noisy_rel: float) -> dict[str, str]:
    """What each flag of the printed table means, and the flags of ``cs336sys <study>`` that would tighten it."""
    section = load_schema()["properties"][study]["properties"]
    takes = [key for key in ("trials", "max_measure_s") if key in section and key not in plan.JOB_KEYS + S.study(study).cell_keys]
    more = " or a larger ".join(f"more --{k}" if k == "trials" else "--" + k.replace("_", "-") for k in takes)
    rerun = f"rerun with {more}" if more else "rerun it"
    trials = "use --trials 3 or more" if "trials" in takes else "read it as one sample, not as a bound"
    host = "the GPU idled for part of the step: the time measures Python and the CPU as much as the GPU"
    return {
        "noisy": f"the 95% interval is wider than ±{noisy_rel:.0%} of the median: {rerun}, and compare runs by their intervals, not their medians",
        "host-bound": f"{host} (the GPU ms column, where shown, is the same work replayed as CUDA graphs)",
        "one trial": "the interval sees the steps of one timed block only, not the host's drift between blocks, so "
        f"a rerun minutes later can land outside it: {trials}",
    }
