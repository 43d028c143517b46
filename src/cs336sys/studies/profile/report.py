"""Figures and findings of study ``profile``: the handout's nsys_profile answers from kernel tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.plots import plt, save, title
from cs336sys.analysis.tables import OK, of_kind
from cs336sys.measure.profiling import MATMUL_PATTERN


def profile_answers(prof: pd.DataFrame) -> pd.DataFrame:
    """Per profile cell, the handout's nsys_profile answers, from the kernel table."""
    rows = []
    ok = prof[prof["status"] == OK] if "kind" in prof else prof.iloc[0:0]
    for cell, part in ok.groupby("cell_id"):
        kernels = part[part["kind"] == "kernel"]
        timing = part[part["kind"] == "timing"]
        steps = float(kernels["profiled_steps"].max()) if not kernels.empty else float("nan")
        row = {"cell_id": cell, "profiler": str(part["device_kind"].dropna().iloc[0]) if part["device_kind"].notna().any() else ""}
        for mode in ("inference", "train"):
            k = kernels[kernels["mode"] == mode]
            t = timing[(timing["mode"] == mode) & (timing["phase"] == "forward")]
            fwd = k[k["phase"] == "forward"]
            row[f"{mode}_forward_profiler_ms"] = fwd["total_us"].sum() / steps / 1e3 if not fwd.empty else float("nan")
            row[f"{mode}_forward_harness_ms"] = float(t["median_ms"].iloc[0]) if not t.empty else float("nan")
            is_mm = k["kernel"].str.contains(MATMUL_PATTERN)
            row[f"{mode}_matmul_share"] = k.loc[is_mm, "total_us"].sum() / k["total_us"].sum() if not k.empty else float("nan")
        fwd = kernels[(kernels["mode"] == "train") & (kernels["phase"] == "forward")]
        fb = kernels[(kernels["mode"] == "train") & kernels["phase"].isin(["forward", "backward"])]
        if not fwd.empty:
            top = fwd.loc[fwd["total_us"].idxmax()]
            top_fb = fb.groupby("kernel")["total_us"].sum().idxmax()
            row["forward_top_kernel"] = top["kernel"][:90]  # shortened for the table only
            row["its_calls_per_forward"] = top["calls"] / steps
            row["its_share_of_forward"] = top["share_of_phase"]
            row["fwd+bwd_top_kernel"] = top_fb[:90]
            # compared on full names: kernel names often share a long template prefix
            row["same_top_kernel"] = top_fb == top["kernel"]
        sub = part[part["kind"] == "subrange"]
        sub = sub[sub["mode"] == "train"].set_index("phase")
        if {"computing softmax", "computing attention scores", "final matmul"} <= set(sub.index):
            matmul_us = sub.loc["computing attention scores", "kernel_us"] + sub.loc["final matmul", "kernel_us"]
            row["attn_softmax_over_matmul_time"] = sub.loc["computing softmax", "kernel_us"] / matmul_us if matmul_us else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def non_matmul_kernels(prof: pd.DataFrame, min_share: float = 0.01) -> pd.DataFrame:
    """Kernels other than matmuls taking more than ``min_share`` of a training phase."""
    k = of_kind(prof, "kernel")
    k = k[k["mode"] == "train"]
    k = k[~k["kernel"].str.contains(MATMUL_PATTERN) & (k["share_of_phase"] > min_share)]
    out = k[["cell_id", "phase", "kernel", "calls", "total_us", "share_of_phase"]].copy()
    out["kernel"] = out["kernel"].str.slice(0, 90)
    return out.sort_values(["cell_id", "phase", "share_of_phase"], ascending=[True, True, False])


def plot_kernel_shares(df: pd.DataFrame, path: Path, run: str, cell: str, top: int = 12) -> Path:
    """Top kernels by share of each phase's device time, for one profile cell."""
    data = df[(df["cell_id"] == cell) & (df["kind"] == "kernel")]
    panels = [(m, p) for m, p in [("inference", "forward"), ("train", "forward"), ("train", "backward"), ("train", "optimizer_step")]
              if not data[(data["mode"] == m) & (data["phase"] == p)].empty]  # fmt: skip
    fig, axes = plt.subplots(len(panels) or 1, 1, figsize=(9, 2.6 * max(len(panels), 1)), squeeze=False)
    for ax, (mode, phase) in zip(axes[:, 0], panels):
        part = data[(data["mode"] == mode) & (data["phase"] == phase)].nlargest(top, "total_us")[::-1]
        ax.barh([k[:70] for k in part["kernel"]], 100 * part["share_of_phase"])
        ax.set_xlabel("% of phase time")
        ax.set_title(f"{mode} {phase}: top {len(part)} kernels")
    title(fig, run, data, f"profile {cell} ({data['device_kind'].iloc[0] if len(data) else ''})")
    return save(fig, path)


def figures(df: pd.DataFrame, run: str) -> list:
    cells = sorted(df.loc[df["status"] == OK, "cell_id"].unique()) if "kind" in df else []
    return [(f"kernels_{c}", lambda p, c=c: plot_kernel_shares(df, p, run, c)) for c in cells]


def findings(df: pd.DataFrame) -> str:
    answers = profile_answers(df)
    cpu = answers["profiler"].str.startswith("cpu").any() if "profiler" in answers else False
    parts = []
    if cpu:
        parts.append('_This run profiled CPU activities only (no CUDA): "kernels" are CPU operators with their self time._')
    parts += [
        "**Answers per cell** — forward time from the profiler (kernel time in the `forward` range per step) beside the "
        "harness's median for the same cell; the kernel with the most forward time and how often it runs per forward; "
        "whether the same kernel leads forward+backward; the matmul share of device time for an inference forward vs a "
        "whole training step; softmax vs matmul time inside attention (their FLOP ratio is about 5/(4·d_head): ~5 "
        "elementwise FLOPs per score for softmax against 4·d_head for QKᵀ and PV):",
        md_table(answers.map(lambda v: f"{v:.4g}" if isinstance(v, float) else v).T.reset_index().rename(columns={"index": "answer"})),
        "**Non-matmul kernels above 1% of a training phase:**",
        md_table(non_matmul_kernels(df), ".3g"),
    ]
    return "\n\n".join(parts)
