"""Figures, findings and facts of study ``attention``: log–log scaling, OOM frontier, memory kept for backward."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from cs336sys.analysis.findings import MIB, oom_frontier, scaling_slopes
from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.plots import plot_scaling
from cs336sys.analysis.roofline import has_points, roofline_plot, roofline_summary, with_roofline
from cs336sys.analysis.tables import ok_rows
from cs336sys.studies.attention import STUDY

PANELS = [("train", "forward", "median_ms"), ("train", "backward", "median_ms"), ("train", "step", "peak_mem_bytes")]
GROUPS = ["impl", "activation", "d_model", "causal", "precision"]


def memory_check(df: pd.DataFrame) -> pd.DataFrame:
    """Memory kept for backward vs the analytic size of one (batch, L, L) matrix.

    kept = allocated before backward − allocated before forward − the output;
    eager softmax keeps P = softmax(scores) and eager ReLU keeps relu(scores)
    (one L×L matrix each; see models/attention.py), SDPA and fused kernels keep O(L).
    """
    rows = ok_rows(df, mode="train", phase="step")
    need = {"mem_before_bwd_bytes", "mem_before_fwd_bytes", "output_bytes", "score_matrix_bytes"}
    if rows.empty or not need <= set(rows.columns) or rows["mem_before_bwd_bytes"].isna().all():
        return pd.DataFrame()
    out = rows[["d_model", "seq_len", "activation", "impl", "causal", "precision"]].copy()
    kept = rows["mem_before_bwd_bytes"] - rows["mem_before_fwd_bytes"] - rows["output_bytes"]
    out["kept_for_backward_mib"] = kept / MIB
    out["one_LxL_matrix_mib"] = rows["score_matrix_bytes"] / MIB
    out["kept_in_LxL_matrices"] = kept / rows["score_matrix_bytes"]
    return out.reset_index(drop=True)


def figures(df: pd.DataFrame, run: str) -> list:
    jobs = []
    for causal in sorted(df["causal"].unique()):
        for prec in sorted(df["precision"].unique()):
            part = df[(df["causal"] == causal) & (df["precision"] == prec)]
            what = f"attention scaling, causal={causal}, {prec}"
            draw = lambda p, part=part, what=what: plot_scaling(part, p, run, ["d_model", "impl", "activation"], PANELS, what)
            jobs.append((f"scaling_causal-{causal}_{prec}", draw))
    if has_points(df, STUDY.attention_shape):
        jobs.append(("roofline", lambda p: roofline_plot(df, p, run, "attention cores", STUDY.attention_shape)))
    return jobs


def findings(df: pd.DataFrame) -> str:
    parts = [
        "**Log–log slope in sequence length** (fit over the three largest lengths that ran; ≈2 means quadratic):",
        md_table(scaling_slopes(df, GROUPS, PANELS), ".3g"),
        "**Out-of-memory frontier** (largest length that ran, first length that ran out of memory; `none`: no "
        "length ran, or none ran out of memory):",
        md_table(oom_frontier(df, GROUPS), empty={"largest_ok": "none", "first_oom": "none"}),
    ]
    check = memory_check(df)
    if check.empty:
        parts.append("Analytic vs measured attention memory: not available (memory statistics need CUDA).")
    else:
        parts += [
            "**Memory kept for backward vs one (batch, L, L) matrix** — eager softmax keeps P = softmax(scores), "
            "eager ReLU keeps relu(scores) (the 1/L factor is folded into the scale), each one L×L matrix per batch "
            "element in the compute dtype; SDPA and fused kernels keep only O(L) statistics:",
            md_table(check, ".3g"),
        ]
    parts += [p for p in [roofline_summary(df, STUDY.attention_shape)] if p]
    return "\n\n".join(parts)


@dataclass(frozen=True)
class AttentionFacts:
    """What the handout's answers quote of an attention run."""

    slopes: pd.DataFrame  # log–log slope in seq_len per configuration (GROUPS) of the forward, backward and peak memory
    frontier: pd.DataFrame  # per configuration: the largest seq_len that ran and the first that ran out of memory
    memory: pd.DataFrame  # :func:`memory_check`: memory kept for the backward against one (batch, L, L) matrix
    roofline: pd.DataFrame  # the rows with their bytes moved, bandwidth and roofline columns (analysis.roofline)


def facts(df: pd.DataFrame) -> AttentionFacts:
    return AttentionFacts(
        scaling_slopes(df, GROUPS, PANELS), oom_frontier(df, GROUPS), memory_check(df), with_roofline(df, STUDY.attention_shape)
    )
