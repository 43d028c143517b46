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


def profile_answers(prof: pd.DataFrame) -> pd.DataFrame:
    """Per profile cell, the handout's nsys_profile answers, from the kernel table."""
    from cs336sys.profiling import MATMUL_PATTERN

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
    from cs336sys.profiling import MATMUL_PATTERN

    k = _kind(prof, "kernel")
    k = k[k["mode"] == "train"]
    k = k[~k["kernel"].str.contains(MATMUL_PATTERN) & (k["share_of_phase"] > min_share)]
    out = k[["cell_id", "phase", "kernel", "calls", "total_us", "share_of_phase"]].copy()
    out["kernel"] = out["kernel"].str.slice(0, 90)
    return out.sort_values(["cell_id", "phase", "share_of_phase"], ascending=[True, True, False])


def _kind(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The ok rows of one ``kind`` (none when no cell produced that kind, e.g. all skipped)."""
    if "kind" not in df:
        return df.iloc[0:0]
    return df[(df["status"] == OK) & (df["kind"] == kind)]


def memory_summary(mem: pd.DataFrame) -> pd.DataFrame:
    rows = _kind(mem, "summary")
    if rows.empty:
        return rows
    out = rows[["size", "ctx", "precision", "mode"]].copy()
    for col in ("peak_mem_bytes", "peak_reserved_bytes", "mem_before_bwd_bytes", "residual_activation_bytes"):
        out[col.replace("_bytes", "_mib")] = rows[col] / MIB
    return out.reset_index(drop=True)


def largest_allocations(mem: pd.DataFrame, top: int = 5) -> pd.DataFrame:
    rows = _kind(mem, "allocation")
    rows = rows[rows["rank"] <= top]
    return rows[["cell_id", "rank", "size_mib", "frames"]].reset_index(drop=True)
