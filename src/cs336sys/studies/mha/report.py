"""Figures, findings and facts of study ``mha``: the benchmark pages' grid of panels, slopes and OOM frontier."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cs336sys.analysis.findings import oom_frontier, scaling_slopes
from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.plots import draw_lines, empty_panel, failed_cells, in_mib, ok_cells, plt, save, title

METRICS = {
    "forward_ms": ("inference", "forward", "median_ms"),
    "backward_ms": ("train", "backward", "median_ms"),
    "peak_mem": ("train", "step", "peak_mem_bytes"),
}
GROUPS = ["variant", "kernel", "num_features", "embed_dim", "num_heads"]
FRONTIER_EMPTY = {"largest_ok": "none", "first_oom": "none"}  # no length ran / none ran out of memory


def plot_grid(df: pd.DataFrame, path: Path, run: str, embed: int, kernel: str, metric: str) -> Path:
    mode, phase, column = METRICS[metric]
    data = df[(df["embed_dim"] == embed) & (df["kernel"] == kernel)]
    heads = sorted(data["num_heads"].unique())
    ms = sorted(m for m in data["num_features"].unique() if m > 0) or [0]
    # at least ~6.5 in wide, or a single panel's title is cut off
    fig, axes = plt.subplots(len(heads), len(ms), figsize=(max(3.6 * len(ms), 6.5), 3.2 * len(heads)), squeeze=False)
    for i, h in enumerate(heads):
        for j, m in enumerate(ms):
            ax = axes[i][j]
            panel = data[(data["num_heads"] == h) & ((data["num_features"] == m) | (data["variant"] != "performer"))]
            ok, shown = in_mib(ok_cells(panel, mode=mode, phase=phase), column)
            if shown in ok and ok[column].notna().any():
                draw_lines(
                    ax,
                    ok.dropna(subset=[shown]),
                    "seq_len",
                    shown,
                    ["variant"],
                    failed=failed_cells(panel, mode=mode),
                    logx=True,
                    logy=True,
                )
            else:
                empty_panel(ax, f"{shown}: not measured here")
            ax.set_title(f"heads={h}, m={m}")
    title(fig, run, data, f"mha {metric}: embed={embed}, kernel={kernel}, exact vs performer")
    return save(fig, path)


def figures(df: pd.DataFrame, run: str) -> list:
    return [
        (f"mha_embed-{e}_{k}_{m}", lambda p, e=e, k=k, m=m: plot_grid(df, p, run, e, k, m))
        for e in sorted(df["embed_dim"].unique())
        for k in sorted(df["kernel"].unique())
        for m in METRICS
    ]


def findings(df: pd.DataFrame) -> str:
    return "\n\n".join(
        [
            "**Log–log slope in sequence length** (≈2 exact, ≈1 performer):",
            md_table(facts(df).slopes, ".3g"),
            "**Out-of-memory frontier** (`none`: no length ran, or none ran out of memory):",
            md_table(oom_frontier(df, GROUPS), empty=FRONTIER_EMPTY),
        ]
    )


@dataclass(frozen=True)
class MHAFacts:
    """What the handout's answers quote of an mha run."""

    slopes: pd.DataFrame  # log–log slope in seq_len per layer (GROUPS) of the forward, backward and peak memory
    frontier: pd.DataFrame  # per layer: the largest seq_len that ran and the first that ran out of memory


def facts(df: pd.DataFrame) -> MHAFacts:
    return MHAFacts(scaling_slopes(df, GROUPS, list(METRICS.values())), oom_frontier(df, GROUPS))
