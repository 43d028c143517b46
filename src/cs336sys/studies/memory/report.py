"""Figures, findings and facts of study ``memory``: active-memory timelines, peaks, largest allocations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cs336sys.analysis.findings import MIB
from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.plots import device_of, draw_lines, failed_cells, ok_cells, plt, save, title
from cs336sys.analysis.tables import OK, of_kind
from cs336sys.studies import study


def memory_summary(mem: pd.DataFrame) -> pd.DataFrame:
    rows = of_kind(mem, "summary")
    if rows.empty:
        return rows
    out = rows[list(study("memory").axes)].copy()
    for col in ("peak_mem_bytes", "peak_reserved_bytes", "mem_before_bwd_bytes", "residual_activation_bytes"):
        out[col.replace("_bytes", "_mib")] = rows[col] / MIB
    return out.reset_index(drop=True)


def largest_allocations(mem: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    if not {"rank", "size_mib", "frames"} <= set(mem):  # no allocation recorded (a run without memory snapshots)
        return pd.DataFrame(columns=["cell_id", "rank", "size_mib", "frames"])
    rows = of_kind(mem, "allocation")
    rows = rows[rows["rank"] <= top]
    return rows[["cell_id", "rank", "size_mib", "frames"]].reset_index(drop=True)


def plot_memory_timeline(df: pd.DataFrame, path: Path, run: str, cell: str) -> Path:
    from cs336sys.measure.memory_snapshot import plot_timeline

    data = df[df["cell_id"] == cell]
    timeline = data[data["kind"] == "timeline"][["time_us", "allocated_bytes"]].sort_values("time_us")
    phases = [(r.phase, r.start_us, r.end_us) for r in data[data["kind"] == "phase"].itertuples()]
    plot_timeline(timeline, str(path), title=f"active memory, {cell} — run {run}, {device_of(data)}", phases=phases)
    return path


def plot_memory_peaks(df: pd.DataFrame, path: Path, run: str) -> Path:
    data = ok_cells(df, kind="summary")
    unit = "GiB" if data["peak_mem_bytes"].max() >= 2**30 else "MiB"  # GiB once a peak reaches one
    data = data.assign(peak=data["peak_mem_bytes"] / (2**30 if unit == "GiB" else MIB))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    draw_lines(ax, data, "context_length", "peak", ["size", "precision", "mode"], failed=failed_cells(df), logx=True)
    ax.set_ylabel(f"peak allocated ({unit})")
    title(fig, run, df, "peak memory")
    return save(fig, path)


def figures(df: pd.DataFrame, run: str) -> list:
    cells = sorted(df.loc[(df["status"] == OK) & (df.get("kind") == "timeline"), "cell_id"].unique()) if "kind" in df else []
    jobs = [(f"timeline_{c}", lambda p, c=c: plot_memory_timeline(df, p, run, c)) for c in cells]
    return jobs + ([("peak_memory", lambda p: plot_memory_peaks(df, p, run))] if cells else [])


def findings(df: pd.DataFrame) -> str:
    summary = memory_summary(df)
    if summary.empty:
        return "No memory cell ran here (the study needs CUDA; see the failed-cells list)."
    return "\n\n".join(
        [
            "**Peak allocated / reserved, memory before backward, and one fp32 residual-stream activation "
            "(batch × context × d_model × 4 bytes), MiB:**",
            md_table(summary, ".1f"),
            "**Largest allocations and where they come from:**",
            md_table(largest_allocations(df), ".1f"),
        ]
    )


@dataclass(frozen=True)
class MemoryFacts:
    """What the handout's answers quote of a memory run."""

    summary: pd.DataFrame  # :func:`memory_summary`: per cell, peak allocated and reserved, before backward, one activation (MiB)
    largest: pd.DataFrame  # :func:`largest_allocations` (cell_id, rank, size_mib, frames); empty where the run recorded none


def facts(df: pd.DataFrame) -> MemoryFacts:
    return MemoryFacts(memory_summary(df), largest_allocations(df))
