"""Figures, findings and facts of study ``profile``: the handout's nsys_profile answers from kernel tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cs336sys.analysis.long_labels import draw_name_legend, name_legend_lines, short_labels, shorten_middle
from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.plots import group_key, plt, save, title
from cs336sys.analysis.tables import OK, of_kind
from cs336sys.measure.profiling import MATMUL_PATTERN
from cs336sys.studies import study

PANELS = [("inference", "forward"), ("train", "forward"), ("train", "backward"), ("train", "optimizer_step")]
LABEL_CHARS = 60  # kernel labels on the bars; longer names are shortened in the middle, full names below


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
    out["kernel"] = out["kernel"].map(lambda k: shorten_middle(k, 90))  # the end tells template instances apart
    out["cell"] = out["cell_id"].map(cell_rank(prof))
    return out.sort_values(["cell", "phase", "share_of_phase"], ascending=[True, True, False]).drop(columns="cell")


def _cells(prof: pd.DataFrame) -> pd.DataFrame:
    """One row of axes per profile cell, indexed by cell id."""
    axes = [a for a in study("profile").axes if a in prof]
    return prof.drop_duplicates("cell_id").set_index("cell_id")[axes]


def cell_rank(prof: pd.DataFrame) -> dict[str, int]:
    """Cell id → its place in axis order, model sizes in the size table's order (small before 2.7B)."""
    cells = _cells(prof)
    order = sorted(cells.index, key=lambda c: group_key(tuple(cells.loc[c]), list(cells.columns)))
    return {cell: i for i, cell in enumerate(order)}


def cell_names(prof: pd.DataFrame) -> dict[str, str]:
    """Cell id → its axes that differ between the run's profile cells (``size=xl``), all of them if none differ."""
    cells = _cells(prof)
    varying = [a for a in cells.columns if cells[a].nunique() > 1] or list(cells.columns)
    return {cell: ", ".join(f"{a}={row[a]}" for a in varying) or cell for cell, row in cells.iterrows()}


def answers_by_cell(answers: pd.DataFrame, prof: pd.DataFrame) -> pd.DataFrame:
    """The answers with one row per answer and one column per cell (in axis order), headed by the cell's axes."""
    if answers.empty:
        return answers
    answers = answers.sort_values("cell_id", key=lambda ids: ids.map(cell_rank(prof)))
    return answers.set_index("cell_id").rename(index=cell_names(prof)).T.rename_axis("answer").reset_index()


def plot_kernel_shares(df: pd.DataFrame, path: Path, run: str, cell: str, top: int = 12) -> Path:
    """Top kernels by share of each phase's device time, for one profile cell.

    One bar per kernel (bars are placed by position, never merged by label); a name too
    long for its label is shortened in the middle and tagged, its full name listed below.
    """
    data = df[(df["cell_id"] == cell) & (df["kind"] == "kernel")]
    tops = {(m, p): data[(data["mode"] == m) & (data["phase"] == p)].nlargest(top, "total_us") for m, p in PANELS}
    tops = {key: part for key, part in tops.items() if not part.empty}
    names = [k for part in tops.values() for k in part["kernel"]]
    labels, legend = short_labels(names, LABEL_CHARS)
    label_of = dict(zip(names, labels))
    width_in = 10.0
    lines = name_legend_lines(legend, width_in - 0.4)
    fig, axes = plt.subplots(max(len(tops), 1), 1, figsize=(width_in, 2.8 * max(len(tops), 1)), squeeze=False)
    for ax, ((mode, phase), part) in zip(axes[:, 0], tops.items()):
        part = part[::-1]  # the largest on top
        ax.barh(range(len(part)), 100 * part["share_of_phase"])
        ax.set_yticks(range(len(part)), [label_of[k] for k in part["kernel"]], fontsize=7)
        ax.set_xlabel("% of phase time")
        ax.set_title(f"{mode} {phase}: top {len(part)} kernels")
    bottom = draw_name_legend(fig, lines)
    where = cell_names(df[df["cell_id"] == cell]).get(cell, cell)
    profiler = data["device_kind"].iloc[0] if len(data) else ""
    title(fig, run, data, f"profile, {where}; profiler: {profiler}")
    return save(fig, path, bottom=bottom)


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
        md_table(answers_by_cell(answers, df)),
        "**Non-matmul kernels above 1% of a training phase:**",
        md_table(non_matmul_kernels(df), ".3g"),
    ]
    return "\n\n".join(parts)


@dataclass(frozen=True)
class ProfileFacts:
    """What the handout's answers quote of a profile run."""

    answers: pd.DataFrame  # :func:`profile_answers`: per cell, profiler against harness, the top kernel, matmul shares
    non_matmul: pd.DataFrame  # :func:`non_matmul_kernels`: kernels other than matmuls above 1% of a training phase


def facts(df: pd.DataFrame) -> ProfileFacts:
    return ProfileFacts(profile_answers(df), non_matmul_kernels(df))
