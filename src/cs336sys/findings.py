"""Findings computed from the merged results (never typed in): ratios, slopes, OOM frontiers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336sys.results import OK, ok_rows

MIB = 2**20


def backward_forward_ratio(e2e: pd.DataFrame) -> pd.DataFrame:
    """Median backward / median forward of the training step, per cell."""
    keys = ["size", "ctx", "precision", "attn", "compile"]
    fwd = ok_rows(e2e, mode="train", phase="forward").set_index(keys)["median_ms"]
    bwd = ok_rows(e2e, mode="train", phase="backward").set_index(keys)["median_ms"]
    out = (bwd / fwd).rename("backward_over_forward").dropna().reset_index()
    return out


def bf16_speedup(e2e: pd.DataFrame) -> pd.DataFrame:
    """fp32 median time / bf16 median time of whole steps, per size × context × attention × mode."""
    steps = ok_rows(e2e, phase="step")
    piv = steps.pivot_table(index=["size", "ctx", "attn", "compile", "mode"], columns="precision", values="median_ms")
    if not {"fp32", "bf16"} <= set(piv.columns):
        return pd.DataFrame()
    out = pd.DataFrame({"fp32_ms": piv["fp32"], "bf16_ms": piv["bf16"], "speedup": piv["fp32"] / piv["bf16"]})
    if "tf32" in piv.columns:
        out["tf32_ms"] = piv["tf32"]
        out["speedup_vs_tf32"] = piv["tf32"] / piv["bf16"]
    return out.dropna(subset=["speedup"]).reset_index()


def loglog_slope(x: pd.Series, y: pd.Series, last: int = 3) -> float:
    """Slope of log y vs log x over the ``last`` largest x (the asymptotic regime); NaN if < 2 points."""
    pts = pd.DataFrame({"x": x.to_numpy(dtype=float), "y": y.to_numpy(dtype=float)}).dropna()
    pts = pts[(pts["x"] > 0) & (pts["y"] > 0)].sort_values("x").tail(last)
    if pts["x"].nunique() < 2:
        return float("nan")
    return float(np.polyfit(np.log(pts["x"]), np.log(pts["y"]), 1)[0])


def scaling_slopes(df: pd.DataFrame, groups: list[str], panels: list[tuple[str, str, str]]) -> pd.DataFrame:
    """Per group, the log–log slope in seq of each (mode, phase, column) panel."""
    rows = []
    ok = ok_rows(df)
    for key, part in ok.groupby(groups):
        row = dict(zip(groups, key if isinstance(key, tuple) else (key,)))
        for mode, phase, column in panels:
            sel = part[(part["mode"] == mode) & (part["phase"] == phase)]
            row[f"slope_{phase}_{'mem' if 'mem' in column else 'time'}"] = loglog_slope(sel["seq"], sel[column]) if column in sel else float("nan")
        row["points"] = part["seq"].nunique()
        rows.append(row)
    return pd.DataFrame(rows)


def oom_frontier(df: pd.DataFrame, groups: list[str], x: str = "seq") -> pd.DataFrame:
    """Per group: the largest x that ran and the smallest x that ran out of memory."""
    rows = []
    for key, part in df.groupby(groups):
        row = dict(zip(groups, key if isinstance(key, tuple) else (key,)))
        cells = part.groupby(x)["status"].agg(lambda s: "ok" if (s == OK).all() else ",".join(sorted(set(s) - {OK})))
        row["largest_ok"] = max((v for v, s in cells.items() if s == "ok"), default=None)
        row["first_oom"] = min((v for v, s in cells.items() if "oom" in s), default=None)
        rows.append(row)
    return pd.DataFrame(rows)


def attention_memory_check(att: pd.DataFrame) -> pd.DataFrame:
    """Memory kept for backward vs the analytic size of one (batch, L, L) matrix.

    kept = allocated before backward − allocated before forward − the output;
    eager softmax keeps P = softmax(scores) and eager ReLU keeps relu(scores)
    (one L×L matrix each; see attention.py), SDPA and fused kernels keep O(L).
    """
    rows = ok_rows(att, mode="train", phase="step")
    need = {"mem_before_bwd_bytes", "mem_before_fwd_bytes", "output_bytes", "score_matrix_bytes"}
    if rows.empty or not need <= set(rows.columns) or rows["mem_before_bwd_bytes"].isna().all():
        return pd.DataFrame()
    out = rows[["d", "seq", "act", "impl", "causal", "precision"]].copy()
    kept = rows["mem_before_bwd_bytes"] - rows["mem_before_fwd_bytes"] - rows["output_bytes"]
    out["kept_for_backward_mib"] = kept / MIB
    out["one_LxL_matrix_mib"] = rows["score_matrix_bytes"] / MIB
    out["kept_in_LxL_matrices"] = kept / rows["score_matrix_bytes"]
    return out.reset_index(drop=True)
