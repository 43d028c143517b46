"""Figures, findings and facts of study ``flash``: TFLOP/s per implementation, median ms tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cs336sys import catalog
from cs336sys.analysis.findings import paired_ratios
from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.plots import draw_lines, failed_cells, ok_cells, plt, save, title
from cs336sys.analysis.roofline import has_points, roofline_plot, roofline_summary
from cs336sys.analysis.tables import ok_rows
from cs336sys.studies.flash import STUDY

PHASES = ["forward", "backward", "forward_backward"]
INDEX = ["num_heads", "seq_len", "head_dim", "precision", "phase"]

# Published forward TFLOP/s on an H100 80GB SXM5, causal, head dim 64, 16k tokens (batch 1, 32 heads of 64:
# hidden 2048), FP16/BF16, counted as ours (4·N²·d per head, causal at half): the FlashAttention-3 paper
# (Shah et al., 2024, arXiv:2407.08608), Figure 5, "forward, with causal mask, head dim 64". The rivals
# that SDPA's backends are: a check that our timing and FLOP count read as the literature's.
PUBLISHED = {"sdpa-flash": ("FlashAttention-2", 299.0), "sdpa-cudnn": ("cuDNN", 388.0)}
PUBLISHED_SHAPE = {"seq_len": 16384, "head_dim": 64, "phase": "forward", "precision": "bf16"}
PUBLISHED_SOURCE = "FlashAttention-3 paper (arXiv:2407.08608), Fig. 5, forward with causal mask, head dim 64, 16k tokens, H100 80GB SXM5"


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
    jobs = [
        (f"flash_{pr}_heads-{h}", lambda p, pr=pr, h=h: plot_flash(df, p, run, pr, h))  # the leaderboard's 16 heads run bf16 only
        for pr, h in pairs
    ]
    shape = STUDY.attention_shape
    return jobs + ([("roofline", lambda p: roofline_plot(df, p, run, "fused attention kernels", shape))] if has_points(df, shape) else [])


def findings(df: pd.DataFrame) -> str:
    ok = ok_rows(df)
    if ok.empty:
        return "_(no successful cells)_"
    ms = ok.pivot_table(index=INDEX, columns="impl", values="median_ms").reset_index()
    tf = ok.pivot_table(index=INDEX, columns="impl", values="tflops").reset_index()
    return "\n\n".join(
        [
            "**Median ms per implementation** (do_bench; lower is better):",
            md_table(ms, ".4g"),
            "**TFLOP/s** (causal counted at half):",
            md_table(tf, ".4g"),
            published(ok),
            roofline_summary(df, STUDY.attention_shape),
        ]
    ).strip()


def published(ok: pd.DataFrame) -> str:
    """SDPA's FlashAttention-2 and cuDNN backends against their published H100 figures, where this run has the row.

    Only on an H100 (the figures' GPU) and only for causal rows at the published shape; the run's most
    heads stand in for the paper's 32 (a 16k-token causal forward fills the GPU either way).
    """
    rows = ok[ok["device_name"].astype(str).str.contains("H100", na=False)] if "device_name" in ok else ok.iloc[0:0]
    for key, value in PUBLISHED_SHAPE.items():
        rows = rows[rows[key] == value]
    if "causal" in rows:
        rows = rows[rows["causal"].fillna(1).astype(bool)]
    lines = []
    for impl, (name, tflops) in PUBLISHED.items():
        found = rows[rows["impl"] == impl]
        if found.empty:
            continue
        row = found.loc[found["num_heads"].idxmax()]
        low, high = row["flops"] / row["ci_high_ms"] / 1e9, row["flops"] / row["ci_low_ms"] / 1e9 if row["ci_low_ms"] > 0 else float("inf")
        lines.append(
            f"- `{impl}` ({row['num_heads']:.0f} heads): {row['tflops']:.0f} [{low:.0f}, {high:.0f}] TFLOP/s here, "
            f"{name} {tflops:.0f} published: {row['tflops'] / tflops:.2f}× [{low / tflops:.2f}, {high / tflops:.2f}]"
        )
    if not lines:
        return ""
    return f"**Against published figures** ({PUBLISHED_SOURCE}; 95% intervals):\n\n" + "\n".join(lines)


@dataclass(frozen=True)
class Shape:
    """One shape and phase of a flash run, and how our Triton kernel fares there against PyTorch."""

    key: dict[str, Any]  # the shape and phase (INDEX → value)
    rows: pd.DataFrame  # its ok timed rows, one per implementation
    fastest_pytorch: str | None  # the fastest of PyTorch's implementations (catalog family) where ours ran beside one
    versus_ours: pd.Series | None  # that one's time / ours: ratio, ratio_low, ratio_high (None where not both timed)


@dataclass(frozen=True)
class FlashFacts:
    """What the handout's answers quote of a flash run."""

    shapes: tuple[Shape, ...]  # every shape and phase that ran, in INDEX order


def facts(df: pd.DataFrame) -> FlashFacts:
    pytorch = [i.name for i in catalog.impls(STUDY.kind) if i.family == "pytorch"]
    shapes = []
    for key, part in ok_rows(df).dropna(subset=["median_ms"]).groupby(INDEX):
        others = part[part["impl"].isin(pytorch)]
        best = others.loc[others["median_ms"].idxmin(), "impl"] if "triton" in set(part["impl"]) and not others.empty else None
        ratio = paired_ratios(part, INDEX, "impl", best, "triton") if best is not None else pd.DataFrame()
        shapes.append(Shape(dict(zip(INDEX, key)), part, best, ratio.iloc[0] if not ratio.empty else None))
    return FlashFacts(tuple(shapes))
