"""Figures and findings of study ``flash``: TFLOP/s per implementation, median ms tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.plots import draw_lines, failed_cells, ok_cells, plt, save, title
from cs336sys.analysis.roofline import has_points, roofline_plot, roofline_summary
from cs336sys.analysis.tables import ok_rows

PHASES = ["forward", "backward", "forward_backward"]
INDEX = ["num_heads", "seq_len", "head_dim", "precision", "phase"]


def plot_flash(df: pd.DataFrame, path: Path, run: str, precision: str, heads: int) -> Path:
    data = df[(df["precision"] == precision) & (df["num_heads"] == heads)]
    dims = sorted(data["head_dim"].unique())
    # at least ~6 in wide, or a single column's title cannot fit
    fig, axes = plt.subplots(len(PHASES), len(dims), figsize=(max(4 * len(dims), 6), 3.2 * len(PHASES)), squeeze=False)
    for i, phase in enumerate(PHASES):
        for j, d in enumerate(dims):
            part = data[data["head_dim"] == d]
            draw_lines(
                axes[i][j], ok_cells(part, phase=phase), "seq_len", "tflops", ["impl"], failed=failed_cells(part, mode="train"), logx=True
            )
            axes[i][j].set_title(f"{phase}, d={d}")
    title(fig, run, data, f"fused attention TFLOP/s, {precision}, heads={heads}, causal")
    return save(fig, path)


def figures(df: pd.DataFrame, run: str) -> list:
    pairs = sorted(df[["precision", "num_heads"]].drop_duplicates().itertuples(index=False, name=None))  # the pairs with rows:
    jobs = [(f"flash_{pr}_heads-{h}", lambda p, pr=pr, h=h: plot_flash(df, p, run, pr, h))  # the leaderboard's 16 heads run bf16 only
            for pr, h in pairs]  # fmt: skip
    return jobs + ([("roofline", lambda p: roofline_plot(df, p, run, "fused attention kernels"))] if has_points(df) else [])


def findings(df: pd.DataFrame) -> str:
    ok = ok_rows(df)
    if ok.empty:
        return "_(no successful cells)_"
    ms = ok.pivot_table(index=INDEX, columns="impl", values="median_ms").reset_index()
    tf = ok.pivot_table(index=INDEX, columns="impl", values="tflops").reset_index()
    return "\n\n".join(["**Median ms per implementation** (do_bench; lower is better):", md_table(ms, ".4g"),
                        "**TFLOP/s** (causal counted at half):", md_table(tf, ".4g"), roofline_summary(df)]).strip()  # fmt: skip
