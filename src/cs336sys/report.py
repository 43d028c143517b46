"""report/<run>/report.md: environment, grid, per-study tables, findings, figures, failures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import yaml

from cs336sys import findings as F
from cs336sys.flops import BACKWARD_FACTOR
from cs336sys.results import failures, load_study, ok_rows
from cs336sys.studies import study as get_study

MIB = 2**20
ENV_FIELDS = ["device_name", "driver_version", "torch_version", "cuda_version", "python_version", "git_commit", "host"]

DEFINITIONS = f"""\
**Conventions.** Times are milliseconds; tables show the median and mean ± sample std over the
measured steps (n given), after untimed warm-up steps. Training-step phases are timed with CUDA
events inside the same step; whole steps by the wall clock between two synchronisations.
Memory is `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (live tensors,
not the allocator's reserve); "before backward" is `memory_allocated` between forward and backward.
FLOPs are analytic matmul FLOPs (2·m·n·k each); causal attention is counted at half; a backward
is {BACKWARD_FACTOR:g}× its forward (no recomputation credited). TFLOP/s uses the median time; MFU
divides by the dense peak of the GPU at that precision (`cs336sys.metrics.PEAK_TFLOPS`, overridable
by the config's `peak_tflops`), and is empty when the device is not in the table.
Precisions: `fp32` = strict fp32 (TF32 off), `tf32` = fp32 with TF32 matmuls, `bf16` = bf16
autocast of forward and loss with fp32 parameters (attention studies cast inputs to bf16).

**Definitions.** ReLU attention (study `attention`, `mha` exact) is Wortsman et al. 2023:
`relu(QKᵀ/√d)/L` with L the sequence length and causal positions set to 0. Performer attention
(`mha`) is FAVOR+ linear attention φ(q)ᵀ(Σφ(k)vᵀ)/φ(q)ᵀΣφ(k), with the ReLU feature map
`relu(Wx/√m)+1e-5` or the positive softmax feature map `exp(Wx' − ‖x'‖²/2)/√m` (x' = x·d^-1/4),
W a fixed orthogonal random (m × d) matrix.
"""


def _md(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    if df is None or df.empty:
        return "_(no rows)_"
    return df.to_markdown(index=False, floatfmt=floatfmt)


def _ms(row: pd.Series) -> str:
    if pd.isna(row.get("std_ms")):
        return f"{row['median_ms']:.4g}"
    return f"{row['median_ms']:.4g} ({row['mean_ms']:.4g} ± {row['std_ms']:.2g})"


def cell_table(df: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """One row per cell: ``median (mean ± std)`` ms for each mode/phase, peak MiB, status."""
    if df.empty:
        return df
    ok = ok_rows(df)
    if "kind" in ok:
        ok = ok[ok["kind"] == "timing"]
    ok = ok.dropna(subset=["median_ms"]) if "median_ms" in ok else ok.iloc[0:0]
    table = pd.DataFrame()
    if not ok.empty:
        ok = ok.assign(col=ok["mode"].astype(str) + " " + ok["phase"].astype(str) + " ms", val=ok.apply(_ms, axis=1))
        table = ok.pivot_table(index=list(axes), columns="col", values="val", aggfunc="first")
        if "peak_mem_bytes" in ok and ok["peak_mem_bytes"].notna().any():
            peaks = ok.groupby(list(axes))["peak_mem_bytes"].max() / MIB
            table["peak MiB"] = peaks.round(1)
        if "n" in ok:
            table["n"] = ok.groupby(list(axes))["n"].max()
    status = df.groupby(list(axes))["status"].agg(lambda s: ",".join(sorted(set(s))))
    table = table.reindex(status.index) if not table.empty else pd.DataFrame(index=status.index)
    table["status"] = status
    return table.reset_index()


def _environment(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    all_rows = pd.concat([f for f in frames.values() if not f.empty], ignore_index=True, sort=False) if frames else pd.DataFrame()
    rows = []
    for field in ENV_FIELDS:
        values = sorted({str(v) for v in all_rows.get(field, pd.Series(dtype=str)).dropna() if str(v) != ""})
        rows.append({"field": field, "value": ", ".join(values) or "—"})
    if "started_at" in all_rows:
        started = all_rows["started_at"].dropna().astype(str)
        rows.append({"field": "measured between", "value": f"{started.min()} and {started.max()}" if len(started) else "—"})
    return pd.DataFrame(rows)


def _status_counts(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    rows = []
    for name, df in frames.items():
        per_cell = df.groupby("cell_id")["status"].agg(lambda s: "ok" if (s == "ok").all() else sorted(set(s) - {"ok"})[0]) if not df.empty else pd.Series(dtype=str)
        rows.append({"study": name, "cells": len(per_cell), **per_cell.value_counts().to_dict()})
    return pd.DataFrame(rows).fillna(0)


def _figures(fig_dir: Path, report_dir: Path) -> str:
    pngs = sorted(fig_dir.glob("*.png")) if fig_dir.exists() else []
    return "\n\n".join(f"![{p.stem}]({os.path.relpath(p, report_dir)})" for p in pngs) or "_(no figures)_"


def _e2e_findings(df: pd.DataFrame) -> str:
    parts = ["**Backward / forward ratio** (training step, medians):", _md(F.backward_forward_ratio(df), ".3g")]
    parts += ["**bf16 speedup** (fp32 median / bf16 median, whole steps):", _md(F.bf16_speedup(df), ".3g")]
    steps = ok_rows(df, mode="train", phase="step")
    if "mfu_pct" in steps and steps["mfu_pct"].notna().any():
        cols = ["size", "ctx", "precision", "attn", "compile", "tflops", "mfu_pct"]
        parts += ["**Training-step TFLOP/s and MFU:**", _md(steps[cols], ".3g")]
    elif not steps.empty:
        notes = sorted(set(steps.get("mfu_note", pd.Series(dtype=str)).dropna()))
        parts.append(f"MFU: empty — {'; '.join(notes) or 'no peak known'}.")
    return "\n\n".join(parts)


def _attention_findings(df: pd.DataFrame) -> str:
    panels = [("train", "forward", "median_ms"), ("train", "backward", "median_ms"), ("train", "step", "peak_mem_bytes")]
    groups = ["impl", "act", "d", "causal", "precision"]
    parts = ["**Log–log slope in sequence length** (fit over the three largest lengths that ran; ≈2 means quadratic):",
             _md(F.scaling_slopes(df, groups, panels), ".3g"),
             "**Out-of-memory frontier** (largest length that ran, first length that ran out of memory):",
             _md(F.oom_frontier(df, groups))]  # fmt: skip
    check = F.attention_memory_check(df)
    if check.empty:
        parts.append("Analytic vs measured attention memory: not available (memory statistics need CUDA).")
    else:
        parts += ["**Memory kept for backward vs one (batch, L, L) matrix** — eager softmax keeps P = softmax(scores), "
                  "eager ReLU keeps relu(scores) (the 1/L factor is folded into the scale), each one L×L matrix per batch "
                  "element in the compute dtype; SDPA and fused kernels keep only O(L) statistics:", _md(check, ".3g")]  # fmt: skip
    return "\n\n".join(parts)


def _mha_findings(df: pd.DataFrame) -> str:
    panels = [("inference", "forward", "median_ms"), ("train", "backward", "median_ms"), ("train", "step", "peak_mem_bytes")]
    groups = ["variant", "kernel", "m", "embed", "heads"]
    return "\n\n".join(["**Log–log slope in sequence length** (≈2 exact, ≈1 performer):", _md(F.scaling_slopes(df, groups, panels), ".3g"),
                        "**Out-of-memory frontier:**", _md(F.oom_frontier(df, groups))])  # fmt: skip


def _flash_findings(df: pd.DataFrame) -> str:
    ok = ok_rows(df)
    if ok.empty:
        return "_(no successful cells)_"
    piv = ok.pivot_table(index=["heads", "seq", "d", "precision", "phase"], columns="impl", values="median_ms").reset_index()
    parts = ["**Median ms per implementation** (do_bench; lower is better):", _md(piv, ".4g")]
    tf = ok.pivot_table(index=["heads", "seq", "d", "precision", "phase"], columns="impl", values="tflops").reset_index()
    parts += ["**TFLOP/s** (causal counted at half):", _md(tf, ".4g")]
    return "\n\n".join(parts)


def _profile_findings(df: pd.DataFrame) -> str:
    answers = F.profile_answers(df)
    cpu = answers["profiler"].str.startswith("cpu").any() if "profiler" in answers else False
    parts = []
    if cpu:
        parts.append("_This run profiled CPU activities only (no CUDA): \"kernels\" are CPU operators with their self time._")
    parts += [
        "**Answers per cell** — forward time from the profiler (kernel time in the `forward` range per step) beside the "
        "harness's median for the same cell; the kernel with the most forward time and how often it runs per forward; "
        "whether the same kernel leads forward+backward; the matmul share of device time for an inference forward vs a "
        "whole training step; softmax vs matmul time inside attention (their FLOP ratio is about 5/(4·d_head): ~5 "
        "elementwise FLOPs per score for softmax against 4·d_head for QKᵀ and PV):",
        _md(answers.map(lambda v: f"{v:.4g}" if isinstance(v, float) else v).T.reset_index().rename(columns={"index": "answer"})),
        "**Non-matmul kernels above 1% of a training phase:**",
        _md(F.non_matmul_kernels(df), ".3g"),
    ]
    return "\n\n".join(parts)


def _memory_findings(df: pd.DataFrame) -> str:
    summary = F.memory_summary(df)
    if summary.empty:
        return "No memory cell ran here (the study needs CUDA; see the failed-cells list)."
    return "\n\n".join(["**Peak allocated / reserved, memory before backward, and one fp32 residual-stream activation "
                         "(batch × context × d_model × 4 bytes), MiB:**", _md(summary, ".1f"),
                         "**Largest allocations and where they come from:**", _md(F.largest_allocations(df), ".1f")])  # fmt: skip


def _precision_findings(df: pd.DataFrame) -> str:
    parts = []
    for kind in ("accumulation", "autocast-bf16", "autocast-fp16"):
        rows = ok_rows(df, kind=kind)
        if not rows.empty:
            keep = [c for c in rows.columns if c not in ("study", "cell_id", "status", "error", "part", "mode", "kind") and rows[c].notna().any()
                    and c not in ("device_name", "driver_version", "torch_version", "cuda_version", "python_version", "git_commit", "host", "started_at")]  # fmt: skip
            parts += [f"**{kind}:**", _md(rows[keep], ".10g")]
    return "\n\n".join(parts)


FINDINGS = {"e2e": _e2e_findings, "attention": _attention_findings, "mha": _mha_findings, "flash": _flash_findings,
            "profile": _profile_findings, "memory": _memory_findings, "precision": _precision_findings}  # fmt: skip
NO_CELL_TABLE = {"memory", "precision"}  # their tables are the findings


def write_report(out: Path, run: str, studies: Sequence[str], csvs: Sequence[Path], figure_dirs: Sequence[Path], config: Mapping[str, Any]) -> Path:
    frames = {name: load_study(path) for name, path in zip(studies, csvs)}
    report_dir = out.parent
    lines = [f"# cs336sys benchmark report — run `{run}`", "", DEFINITIONS, "## Environment", "", _md(_environment(frames)), ""]
    lines += ["## Cells per study and status", "", _md(_status_counts(frames)), ""]
    fails = pd.concat([failures(df) for df in frames.values() if not df.empty], ignore_index=True) if frames else pd.DataFrame()
    lines += ["## Failed cells (out of memory, timeout, error, skipped)", ""]
    lines += [_md(fails) if not fails.empty else "None: every cell ran.", ""]
    for name, fig_dir in zip(studies, figure_dirs):
        df = frames[name]
        axes = list(get_study(name).axes)
        lines += [f"## Study `{name}`", "", "Grid:", "", "```yaml", yaml.safe_dump({name: config.get(name)}, sort_keys=False).strip(), "```", ""]
        if name not in NO_CELL_TABLE:
            lines += ["Per cell (median (mean ± std) ms per mode and phase):", "", _md(cell_table(df, axes)), ""]
        if name in FINDINGS and not df.empty and (df["status"] == "ok").any():
            lines += ["### Findings", "", FINDINGS[name](df), ""]
        lines += ["### Figures", "", _figures(fig_dir, report_dir), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, out)
    return out
