"""Figures, findings and facts of study ``warmup``: mean ± std and median per phase vs warm-up steps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cs336sys.analysis.findings import paired_ratios
from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.plots import draw_lines, failed_cells, ok_cells, panel_grid, save, shared_legend, title
from cs336sys.analysis.tables import ok_rows
from cs336sys.studies.e2e.report import PANELS


def plot_warmup(df: pd.DataFrame, path: Path, run: str) -> Path:
    fig, axes, legend_ax = panel_grid(len(PANELS))
    for ax, (mode, phase) in zip(axes, PANELS):
        data = ok_cells(df, mode=mode, phase=phase)
        # mean ± std: the bar below stops at zero (a first step of seconds makes the std larger than the mean)
        draw_lines(ax, data, "warmup_steps", "mean_ms", ["compile"], yerr="std_ms", failed=failed_cells(df, mode=mode), legend=False)
        if not data.empty:
            ax.plot(data["warmup_steps"], data["median_ms"], "k_", ms=10, label="median")
            ax.plot(data["warmup_steps"], data["max_ms"], "rv", ms=4, label="slowest step")
            ax.set_xticks(sorted(data["warmup_steps"].unique()))  # step counts are whole numbers
        ax.set_ylim(bottom=0)
        ax.set_title(f"{mode} {phase}: mean ± std, median, slowest")
    shared_legend(axes, legend_ax)
    title(fig, run, df, "effect of warm-up steps")
    return save(fig, path)


def figures(df: pd.DataFrame, run: str) -> list:
    return [("warmup", lambda p: plot_warmup(df, p, run))]


def warmup_effect(df: pd.DataFrame) -> pd.DataFrame:
    """Per phase: the fewest warm-up steps against the most, as ratios of the mean and of the median.

    Untimed warm-up absorbs the first steps' one-off costs (CUDA context, cuBLAS
    handles, allocator growth, compilation); without it they land in the timed
    steps: the mean and the slowest step move, the median much less.
    """
    rows = ok_rows(df).dropna(subset=["median_ms"])
    if rows.empty or rows["warmup_steps"].nunique() < 2:
        return pd.DataFrame()
    few, many = rows["warmup_steps"].min(), rows["warmup_steps"].max()
    keys = ["compile", "mode", "phase"]
    ratios = paired_ratios(rows, keys, "warmup_steps", few, many)
    means = rows.pivot_table(index=keys, columns="warmup_steps", values="mean_ms")
    ratios["mean_ratio"] = [means.loc[tuple(k), few] / means.loc[tuple(k), many] for k in ratios[keys].itertuples(index=False)]
    return ratios.rename(columns={"ratio": "median_ratio", "finding": "median_finding"})


def findings(df: pd.DataFrame) -> str:
    effect = warmup_effect(df)
    if effect.empty:
        return ""
    return "\n\n".join(
        [
            "**Warm-up effect** (fewest / most warm-up steps; the mean carries the first steps' one-off costs, "
            "the median and its interval show whether the typical step changes):",
            md_table(effect, ".3g"),
        ]
    )


@dataclass(frozen=True)
class WarmupFacts:
    """What the handout's answers quote of a warmup run."""

    effect: pd.DataFrame  # :func:`warmup_effect`: fewest / most warm-up steps per phase, of the median (interval) and the mean


def facts(df: pd.DataFrame) -> WarmupFacts:
    return WarmupFacts(effect=warmup_effect(df))
