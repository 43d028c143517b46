"""Study ``e2e``'s rows beyond its timings: the GPU time of each phase and the paired comparisons (pandas, no torch).

Two kinds of rows come from an eager cell on a GPU (``measure.py``): timed rows, whose
``gpu_*`` columns hold the same phase replayed as CUDA graphs (the GPU-bound time), and
``kind=pair`` rows, the ratio of the cell's time to a partner configuration's, timed as
interleaved blocks in one process (the study's ``pairs``, declared in ``__init__.py``).
A comparison comes from the pair rows where the cell has them, else from the two cells'
own intervals (runs before pairs, or a partner that did not fit beside the cell: ``pair_note``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from cs336sys.analysis.findings import GRAPH_CELL, PAIRED, REPLAY, TWO_CELLS, describe_ratio, paired_ratios, stopped_on_budget
from cs336sys.analysis.markdown import is_empty, size_key, value_key
from cs336sys.analysis.tables import ok_rows, timed
from cs336sys.columns import GPU_TIME_PREFIX, GPU_TIME_STATS, PAIR_KIND
from cs336sys.measure.stats import Interval
from cs336sys.studies import Pair, format_value, study

LM_KEYS = ["size", "context_length", "precision", "impl", "compile", "cuda_graphs"]
PAIR = PAIR_KIND
# the replay's columns under a timed row's names (samples in step order: the phases of one step pair up)
GPU_COLUMNS = {GPU_TIME_PREFIX + stat: stat for stat in GPU_TIME_STATS}


def pair_spec(axis: str) -> Pair | None:
    """The study's comparison along ``axis`` (``STUDY.pairs``), if it declares one."""
    return next((p for p in study("e2e").pairs if p.axis == axis), None)


def pair_labels() -> dict[str, str]:
    """``pair_with`` value → how the report names that comparison (the study's ``Pair.label``)."""
    return {p.partner: p.label for p in study("e2e").pairs}


def pair_rows(df: pd.DataFrame, pair_with: str | None = None, **where) -> pd.DataFrame:
    """The ok ``kind=pair`` rows (own time / partner time over interleaved blocks), of one partner if named."""
    if df.empty or "kind" not in df or "pair_with" not in df:
        return df.iloc[0:0]
    rows = ok_rows(df, **where)
    rows = rows[rows["kind"].astype(str) == PAIR]
    return rows[rows["pair_with"] == pair_with] if pair_with is not None else rows


def gpu_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The GPU time of each timed row, under a timed row's names (``median_ms``, ``ci_low_ms``…).

    From the eager cells' CUDA-graph replay of the same step (``gpu_*`` columns), else
    from a CUDA-graph cell of the same configuration (runs before the replay), whose row
    then stands for the eager cell it replays (``cuda_graphs`` 0). ``gpu_source`` says which.
    The trust flags of the eager row do not describe its replay and are dropped.
    """
    rows = timed(df)
    keys = [k for k in LM_KEYS + ["mode", "phase"] if k in rows]
    parts = []
    if "gpu_median_ms" in rows:
        have = rows[pd.to_numeric(rows["gpu_median_ms"], errors="coerce").notna()]
        eager_only = [*GPU_COLUMNS.values(), "ci_rel", "noisy", "host_bound", "gpu_busy_frac", "stop_reason"]
        have = have.drop(columns=eager_only, errors="ignore")
        parts.append(have.rename(columns=GPU_COLUMNS).assign(gpu_source=REPLAY))
    if "cuda_graphs" in rows:
        graphs = rows[pd.to_numeric(rows["cuda_graphs"], errors="coerce") == 1]
        graphs = graphs.drop(columns=[c for c in rows if c.startswith("gpu_")], errors="ignore")
        parts.append(graphs.assign(cuda_graphs=0, gpu_source=GRAPH_CELL))
    parts = [p for p in parts if not p.empty]
    if not parts:
        return rows.iloc[0:0]
    out = pd.concat(parts, ignore_index=True, sort=False)
    return out.drop_duplicates(keys, keep="first")  # the replay first: same process, same optimizer


def comparison(df: pd.DataFrame, axis: str, phases: tuple[str, ...] = ("step",)) -> pd.DataFrame:
    """The study's comparison along ``axis`` (base / other, its :class:`Pair`) per base cell, mode and phase.

    The paired ratio where the base cell timed its partner (``source`` "paired": ``pairs``,
    ``stop_reason``); else the two cells' intervals by interval arithmetic (``source``
    "two cells"), with the ``pair_note`` saying why they were not paired where one was tried.
    Columns: the base cell's axes, ``mode``, ``phase``, ``ratio``, ``ratio_low``, ``ratio_high``,
    ``source``, ``pairs``, ``stop_reason``, ``pair_note``.
    """
    pair = pair_spec(axis)
    if pair is None or df.empty:
        return pd.DataFrame()
    rows = timed(df)
    rows = rows[rows["phase"].isin(phases)] if "phase" in rows else rows
    keys = [k for k in LM_KEYS if k != axis and k in df] + ["mode", "phase"]
    cells = paired_ratios(rows, keys, axis, format_value(pair.base), format_value(pair.other)) if axis in rows else pd.DataFrame()
    cells = cells.assign(source=TWO_CELLS, **{axis: format_value(pair.base)}) if not cells.empty else cells
    paired = pair_rows(df, pair.partner)
    paired = paired[paired["phase"].isin(phases)]
    out: dict[tuple, dict] = {}
    for _, r in cells.iterrows():
        out[tuple(r[k] for k in keys)] = r.to_dict()
    for _, r in paired.iterrows():
        key = tuple(r.get(k) for k in keys)
        note = r.get("pair_note")
        note = "" if is_empty(note) else str(note)
        base = {k: r.get(k) for k in [*keys, axis]} | {"pair_note": note}
        if math.isfinite(float(r.get("ratio", math.nan))):
            out[key] = base | {
                "ratio": r["ratio"],
                "ratio_low": r["ratio_ci_low"],
                "ratio_high": r["ratio_ci_high"],
                "source": PAIRED,
                "pairs": r.get("pairs"),
                "stop_reason": r.get("stop_reason"),
                "pass_ratios": r.get("pass_ratios"),
            }
        elif key in out:
            out[key]["pair_note"] = note  # no ratio: the two cells' intervals stand, with the reason
        else:
            out[key] = base | {"ratio": math.nan, "ratio_low": math.nan, "ratio_high": math.nan, "source": PAIRED}
    if not out:
        return pd.DataFrame()
    table = pd.DataFrame(list(out.values()))
    for col in ("pairs", "stop_reason", "pair_note"):
        if col not in table:
            table[col] = np.nan if col == "pairs" else ""
    order = sorted(table.index, key=lambda i: tuple((size_key(v) if k == "size" else value_key(v)) for k, v in table.loc[i, keys].items()))
    return table.loc[order].reset_index(drop=True)


def pair_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every paired ratio of the run, for the report: comparison, the base cell, mode, phase, ratio in words, pairs, stop reason."""
    rows = pair_rows(df)
    if rows.empty:
        return pd.DataFrame()
    labels = pair_labels()
    out = []
    for _, r in rows.iterrows():
        iv = Interval(
            float(r.get("ratio", math.nan)), float(r.get("ratio_ci_low", math.nan)), float(r.get("ratio_ci_high", math.nan)), 0, 1
        )
        note = "" if is_empty(r.get("pair_note")) else str(r.get("pair_note"))
        out.append(
            {
                "comparison": labels.get(r["pair_with"], r["pair_with"]),
                **{k: r.get(k) for k in LM_KEYS if k in rows and k != "cuda_graphs"},
                "mode": r["mode"],
                "phase": r["phase"],
                "ratio [95% interval]": describe_ratio(iv, budget=stopped_on_budget(r.get("stop_reason")))
                if not note
                else f"not paired: {note}",
                "pairs": r.get("pairs"),
                "stop_reason": r.get("stop_reason"),
            }
        )
    return pd.DataFrame(out)


def _ms(median: float, low: float, high: float) -> str:
    if not math.isfinite(median):
        return "—"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{median:.4g}"
    return f"{median:.4g} [{low:.4g}, {high:.4g}]"


def gpu_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per eager timed row with a GPU time: eager ms [interval], GPU ms [interval], host overhead (eager − GPU) ms, GPU busy."""
    rows = timed(df)
    gpu = gpu_frame(df)
    if gpu.empty:
        return pd.DataFrame()
    keys = [k for k in LM_KEYS + ["mode", "phase"] if k in rows and k in gpu]
    eager = rows[pd.to_numeric(rows.get("cuda_graphs", pd.Series(0, index=rows.index)), errors="coerce").fillna(0) == 0]
    both = eager.merge(gpu[keys + ["median_ms", "ci_low_ms", "ci_high_ms", "trials", "gpu_source"]], on=keys, suffixes=("", "_gpu"))
    out = []
    for _, r in both.iterrows():
        f = lambda c: float(pd.to_numeric(r.get(c), errors="coerce"))  # noqa: E731
        out.append(
            {
                **{k: r[k] for k in keys if k not in ("cuda_graphs",)},
                "eager ms [95%]": _ms(f("median_ms"), f("ci_low_ms"), f("ci_high_ms")),
                "GPU ms [95%]": _ms(f("median_ms_gpu"), f("ci_low_ms_gpu"), f("ci_high_ms_gpu")),
                "host overhead ms": f("median_ms") - f("median_ms_gpu"),
                "GPU busy %": 100 * f("gpu_busy_frac") if "gpu_busy_frac" in r else math.nan,
                "trials (eager / GPU)": f"{r.get('trials', math.nan):.0f} / {r.get('trials_gpu', math.nan):.0f}",
                "stop_reason": r.get("stop_reason", ""),
                "GPU time from": r["gpu_source"],
            }
        )
    return pd.DataFrame(out)


def gpu_notes(df: pd.DataFrame) -> list[str]:
    """Why rows have no GPU time (``gpu_note``: no CUDA device, capture failed, out of memory), distinct."""
    rows = timed(df)
    if "gpu_note" not in rows:
        return []
    return sorted({str(v) for v in rows["gpu_note"] if not is_empty(v) and str(v).strip()})
