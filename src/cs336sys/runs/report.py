"""report/<run>/report.md: environment, grid, per-study tables, findings, figures, failures."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.tables import failures, ok_rows
from cs336sys.columns import timed_kind
from cs336sys.fileio import write_text_atomic
from cs336sys.measure.flops import ATTENTION_BACKWARD_FACTOR, BACKWARD_FACTOR
from cs336sys.pipeline.merge import load_study
from cs336sys.runs.efficiency import sweep_efficiency, sweep_summary, time_split
from cs336sys.runs.gpu_use import IDLE_GAP_S, per_gpu_line, per_gpu_table
from cs336sys.studies import report_module
from cs336sys.studies import study as get_study

MIB = 2**20
ENV_FIELDS = ["device_name", "driver_version", "torch_version", "cuda_version", "python_version", "git_commit", "host"]

DEFINITIONS = f"""\
**Conventions.** Times are milliseconds. Each cell is timed in `passes` passes over the grid
(pass k of every cell before pass k+1 of any), each of a warm-up and `trials` timed blocks (at
least `measure_steps` steps and `min_measure_s` seconds each, back to back); tables show
the median of all steps and its 95% interval: the widest of the order-statistic interval of the
median (distribution-free), the Student-t interval of the per-trial medians and the between-pass
interval (the host's drift over the sweep; pooled over GPU-bound cells), at least
`interval_floor_rel` of the median wide. A ratio is a finding only where the two intervals do not overlap; otherwise the report
says "no significant difference". Training-step phases are timed with CUDA events inside the same
step; whole steps by the wall clock between two synchronisations. `host_bound`: the GPU was busy
for less than the configured share of a step (torch.profiler over a few extra steps), so the time
measures Python and the CPU as much as the GPU. Energy is the GPU's, from NVML's energy counter
read by a thread beside each timed block of at least 0.5 s (the counter moves every 100 ms), on the
whole-step row: J per step with its interval as for times, average watts (joules / the steps' own
seconds) and tokens per joule (batch × context / J); `energy_note` says why a value is empty.
Memory is `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (live tensors,
not the allocator's reserve); "before backward" is `memory_allocated` between forward and backward.
FLOPs are analytic matmul FLOPs (2·m·n·k each); causal attention is counted at half. A model's
backward (`e2e`, `warmup`, `mha`) is {BACKWARD_FACTOR:g}× its forward, a training step {1 + BACKWARD_FACTOR:g}× (6ND, no
recomputation credited); an attention core's (`attention`, `flash`) is {ATTENTION_BACKWARD_FACTOR:g}× and its
forward+backward {1 + ATTENTION_BACKWARD_FACTOR:g}×, for every implementation, as the FlashAttention-2 paper and Triton's
fused-attention tutorial count (2× for dQ, dK, dV plus 0.5× for the recomputed QKᵀ), so these
TFLOP/s compare with published figures. TFLOP/s uses the median time; MFU
divides by the dense peak of the GPU at that precision (`cs336sys.analysis.peaks.PEAK_TFLOPS`, overridable
by the config's `peak_tflops`), and is empty when the device is not in the table.
Bytes moved (`bytes_moved`, `cs336sys.measure.bytes_moved`) are analytic too, for the rows whose
traffic can be counted: an attention core's phases (eager: every op reads its inputs and writes its
output once, the L×L scores and probabilities included, within 7% of Nsight Compute's DRAM counters;
compiled: S and P written and read once; fused kernels: Q, K, V, O and the log-sum-exp once, a lower
bound) and the AdamW step (80 bytes a parameter for the course's, 28 for PyTorch's fused one);
`bytes_note` says why a row has none. `achieved_gbps` = bytes / median time; `bw_frac` = achieved
/ the GPU's peak DRAM bandwidth (`peak_gbps`, from `cs336sys.analysis.peaks.PEAK_GBPS`, overridable by the config's `peak_gbps`);
`arith_intensity` = FLOPs / bytes; `roof_tflops` = min(peak TFLOP/s, intensity × peak bandwidth),
the roofline's ceiling at that intensity, and `bound` says which roof is the lower one (`memory` or
`compute`); `roofline_note` says why a value is empty.
Precisions: `fp32` = strict fp32 (TF32 off), `tf32` = fp32 with TF32 matmuls, `bf16` = bf16
autocast of forward and loss with fp32 parameters (attention studies cast inputs to bf16).

**Definitions.** ReLU attention (study `attention`, `mha` exact) is Wortsman et al. 2023:
`relu(QKᵀ/√d)/L` with L the sequence length and causal positions set to 0. Performer attention
(`mha`) is FAVOR+ linear attention φ(q)ᵀ(Σφ(k)vᵀ)/φ(q)ᵀΣφ(k), with the ReLU feature map
`relu(Wx/√m)+1e-5` or the positive softmax feature map `exp(Wx' − ‖x'‖²/2)/√m` (x' = x·d^-1/4),
W a fixed orthogonal random (m × d) matrix.
"""


CPU_NOTE = """\
> **CPU numbers only exercise the pipeline.** This run measured on a CPU, with tiny shapes (the CPU
> demo, `config/cpu-demo.yaml`): its times, ratios and findings show that every step from the cells
> to this report works, and say nothing about how these models or kernels perform on a GPU. Memory
> columns that need CUDA are empty. For real numbers, run `snakemake` on a machine with a GPU; the
> committed reference runs are listed in `docs/results.md`.
"""


def on_cpu(frames: Mapping[str, pd.DataFrame], config: Mapping[str, Any] | None) -> bool:
    """Whether the run measured on a CPU: every row says so, or (no rows) the run's settings do."""
    devices = {str(v) for f in frames.values() for v in f.get("device", pd.Series(dtype=str)).dropna() if str(v)}
    return devices == {"cpu"} if devices else (config or {}).get("device") == "cpu"


def _ms(row: pd.Series) -> str:
    """``median [95% interval]``, with ``*`` for a noisy row and ``†`` for a host-bound one."""
    marks = ("*" if row.get("noisy") is True else "") + ("†" if row.get("host_bound") is True else "")
    if pd.isna(row.get("ci_low_ms")):
        return f"{row['median_ms']:.4g}{marks}"
    return f"{row['median_ms']:.4g} [{row['ci_low_ms']:.4g}, {row['ci_high_ms']:.4g}]{marks}"


def cell_table(df: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """One row per cell: ``median [interval]`` ms for each mode/phase, peak MiB, n, status."""
    if df.empty:
        return df
    ok = ok_rows(df)
    if "kind" in ok:  # timed rows: kind "timing" (profile) or empty (e2e, beside its kind=pair rows)
        ok = ok[timed_kind(ok["kind"])]
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
        per_cell = (
            df.groupby("cell_id")["status"].agg(lambda s: "ok" if (s == "ok").all() else sorted(set(s) - {"ok"})[0])
            if not df.empty
            else pd.Series(dtype=str)
        )
        rows.append({"study": name, "cells": len(per_cell), **per_cell.value_counts().to_dict()})
    return pd.DataFrame(rows).fillna(0)


def _figures(fig_dir: Path, report_dir: Path) -> str:
    pngs = sorted(fig_dir.glob("*.png")) if fig_dir.exists() else []
    return "\n\n".join(f"![{p.stem}]({os.path.relpath(p, report_dir)})" for p in pngs) or "_(no figures)_"


def measured_grid(df: pd.DataFrame, axes: Sequence[str]) -> dict[str, list]:
    """The axis values of the cells in a run's CSV: what was measured, whatever the config says today."""
    values = {a: {v.item() if hasattr(v, "item") else v for v in df[a].dropna()} for a in axes if a in df}
    return {a: sorted(vs, key=lambda v: (isinstance(v, str), v if not isinstance(v, str) else 0, str(v))) for a, vs in values.items()}


def write_report(
    out: Path,
    run: str,
    studies: Sequence[str],
    csvs: Sequence[Path],
    figure_dirs: Sequence[Path],
    config: Mapping[str, Any] | None = None,
    benchmarks: Path | None = None,
    missing: Mapping[str, Sequence[str]] | None = None,
) -> Path:
    """``report.md`` of one run from its merged CSVs; ``config`` is the run's own recorded settings, if any.

    The grid shown is the one in the CSVs; the settings (steps, trials, batch) come from
    ``config`` — the run's ``results/<run>/config.yaml`` snapshot — and are left out where
    a run has none, never filled in from today's config.
    """
    frames = {name: load_study(path, name) for name, path in zip(studies, csvs)}
    report_dir = out.parent
    lines = [
        f"# cs336sys benchmark report — run `{run}`",
        "",
        "The handout's benchmarking questions, answered from this run's data: [answers.md](answers.md).",
        "",
        *([CPU_NOTE] if on_cpu(frames, config) else []),
        DEFINITIONS,
        "## Environment",
        "",
        md_table(_environment(frames)),
        "",
    ]
    lines += ["## Cells per study and status", "", md_table(_status_counts(frames)), ""]
    # each pass's own cell files, beside the merged CSV: the GPU of a merged row's later passes
    cells = {name: Path(path).parent / name / "cells" for name, path in zip(studies, csvs)}
    efficiency = sweep_efficiency(frames, benchmarks, cells)
    if not efficiency.empty:
        lines += [
            "## Sweep efficiency",
            "",
            "Where the wall time went (rows' start and end times; Snakemake's per-job benchmark files):",
            "",
            md_table(efficiency),
            "",
        ]
        split = time_split(frames)
        if not split.empty:
            lines += [
                "**Where the cell jobs' time went**, per study: each job's wall time from its process start to its rows "
                "(`time_job_s`), split by the cell runner into start-up (the job's process, the hand-off to the warm worker, "
                "the wait for a GPU, the measuring process and its CUDA context), the correctness check, warm-up, timed "
                "blocks, interleaved paired blocks, CUDA-graph capture, energy blocks, profiling and the rest (models and "
                "inputs built, rows assembled); shares of the study's job wall time:",
                "",
                md_table(split),
                "",
            ]
        summary = sweep_summary(frames, cells)
        per_gpu = per_gpu_table(summary)
        if not per_gpu.empty:
            lines += [
                f"**Per GPU.** {per_gpu_line(summary)}. Times are seconds after the first cell start; an idle gap "
                f"is one of more than {IDLE_GAP_S:g} s between two cells on one GPU (longer than a job's start-up).",
                "",
                md_table(per_gpu),
                "",
            ]
    fails = pd.concat([failures(df) for df in frames.values() if not df.empty], ignore_index=True) if frames else pd.DataFrame()
    lines += ["## Failed cells (out of memory, timeout, error, skipped)", ""]
    unmeasured = [{"study": name, "cell_id": cid} for name, cells in (missing or {}).items() for cid in cells]
    lines += [md_table(fails) if not fails.empty else ("None among the cells that ran." if unmeasured else "None: every cell ran."), ""]
    if unmeasured:
        lines += [
            "## Cells not measured (the sweep stopped before them)",
            "",
            f"This report is a slice: {len(unmeasured)} cell(s) of the configured grid have no CSV (or lack a pass), "
            "so they are in no table, figure or answer below.",
            "",
            md_table(pd.DataFrame(unmeasured)),
            "",
        ]
    for name, fig_dir in zip(studies, figure_dirs):
        df = frames[name]
        spec = get_study(name)
        lines += [
            f"## Study `{name}`",
            "",
            spec.question,
            "",
            "Grid as measured (the axis values in this run's CSV):",
            "",
            "```yaml",
            yaml.safe_dump(measured_grid(df, spec.axes), sort_keys=False, default_flow_style=None).strip(),
            "```",
            "",
        ]
        settings = {k: v for k, v in ((config or {}).get(name) or {}).items() if k != "grid"}
        if settings:
            lines += [
                "Settings (from the run's config snapshot):",
                "",
                "```yaml",
                yaml.safe_dump(settings, sort_keys=False, default_flow_style=None).strip(),
                "```",
                "",
            ]
        if spec.cell_table:
            lines += [
                "Per cell: median ms [95% interval] per mode and phase; `*` noisy (interval wider than the configured "
                "share of the median), `†` host-bound (the GPU idled for part of the step):",
                "",
                md_table(cell_table(df, list(spec.axes))),
                "",
            ]
        found = report_module(name).findings(df) if not df.empty and (df["status"] == "ok").any() else ""
        if found:
            lines += ["### Findings", "", found, ""]
        lines += ["### Figures", "", _figures(fig_dir, report_dir), ""]
    return write_text_atomic(out, "\n".join(lines))
