"""Where the GPU time and the memory go: studies ``profile`` (§1.1.4) and ``memory`` (§1.1.6).

Both reuse the e2e study's model, batch and step functions (bench_lm), so what
is profiled is exactly what e2e times. Rows are tidy and typed by ``kind``:

- profile: ``timing`` (the harness's numbers for the same cell), ``kernel``
  (one row per phase × kernel: calls, total/mean GPU µs, share of the phase),
  ``subrange`` (attention's scores / softmax / final matmul ranges).
- memory: ``summary`` (peaks, memory before backward, one residual-stream
  activation), ``timeline`` (allocated bytes over time, downsampled),
  ``phase`` (phase spans on the same clock), ``allocation`` (largest allocations
  with the frames they come from). The raw snapshot pickle stays beside the
  per-cell CSV (path in ``snapshot_path``), out of git.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pandas as pd
import torch

from cs336sys import memory
from cs336sys.bench_lm import inference_step_fn, setup_lm, train_step_fn
from cs336sys.cells import Skip
from cs336sys.optim import make_optimizer
from cs336sys.timing import StepClock, time_steps

TIMELINE_POINTS = 600  # per cell; enough for a figure, small enough for a merged CSV in git


def _steps(model, inputs, targets, precision, device, optimizer, log):
    """(mode, step function) for an inference forward and a training step."""
    opt = make_optimizer(optimizer, model.parameters())
    return {
        "inference": inference_step_fn(model, inputs, precision, device),
        "train": train_step_fn(model, model, opt, inputs, targets, precision, device, log),
    }


def measure_profile(
    device: torch.device,
    context: dict,
    *,
    size: str,
    context_length: int,
    precision: str,
    attention: str = "eager",
    warmup_steps: int = 5,
    measure_steps: int = 10,
    profile_steps: int = 3,
    batch_size: int = 4,
    vocab_size: int = 10_000,
    optimizer: str = "course",
    trace_dir: str | None = None,
    cell_id: str = "cell",
    extra_sizes: Mapping[str, Mapping[str, int]] | None = None,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    from cs336sys import profiling

    _, model, inputs, targets = setup_lm(device, size, context_length, precision, attention, batch_size, vocab_size, extra_sizes, seed)
    device_kind = "cuda" if device.type == "cuda" else "cpu (CPU activities only: no GPU timeline)"
    for mode, step in _steps(model, inputs, targets, precision, device, optimizer, {}).items():
        context["mode"] = mode
        timing = time_steps(step, warmup=warmup_steps, steps=measure_steps, device=device)
        for phase, stats in timing.phases.items():
            yield {"kind": "timing", "mode": mode, "phase": phase, **stats.as_row(), "profiled_steps": profile_steps, "device_kind": device_kind}
        trace = str(Path(trace_dir) / f"{cell_id}_{mode}.json.gz") if trace_dir else None
        prof = profiling.profile_steps(lambda: step(StepClock(device)), steps=profile_steps, device=device.type, trace_path=trace)
        ranges, kernels = profiling.events_from_profiler(prof)
        table = profiling.attribute_kernels(ranges, kernels)
        for rec in table.to_dict("records"):
            yield {"kind": "kernel", "mode": mode, **rec, "profiled_steps": profile_steps, "trace_path": trace or "", "device_kind": device_kind}
        for rec in profiling.attention_subrange_table(ranges, kernels).to_dict("records"):
            yield {"kind": "subrange", "mode": mode, "phase": rec.pop("range"), **rec, "profiled_steps": profile_steps, "device_kind": device_kind}
        del prof
        memory.release(device)


def _downsample(timeline: pd.DataFrame, points: int) -> pd.DataFrame:
    """Keep at most ``points`` rows, taking each bin's maximum so peaks survive."""
    if len(timeline) <= points:
        return timeline
    bins = np.arange(len(timeline)) * points // len(timeline)
    idx = timeline.groupby(bins)["allocated_bytes"].idxmax()
    return timeline.loc[idx.sort_values()]


def measure_memory(
    device: torch.device,
    context: dict,
    *,
    size: str,
    context_length: int,
    precision: str,
    mode: str,
    attention: str = "eager",
    warmup_steps: int = 2,
    measure_steps: int = 2,
    batch_size: int = 4,
    vocab_size: int = 10_000,
    optimizer: str = "course",
    top_n: int = 10,
    snapshot_dir: str | None = None,
    cell_id: str = "cell",
    extra_sizes: Mapping[str, Mapping[str, int]] | None = None,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    if device.type != "cuda":
        raise Skip("the memory study records CUDA allocator history; this machine has no CUDA")
    from cs336sys import memory_snapshot as snap

    context["mode"] = mode
    spec, model, inputs, targets = setup_lm(device, size, context_length, precision, attention, batch_size, vocab_size, extra_sizes, seed)
    log: dict[str, int | None] = {}
    step = _steps(model, inputs, targets, precision, device, optimizer, log)[mode]
    for _ in range(warmup_steps):
        step(StepClock(device))
    memory.reset_peak(device)
    phases: list[tuple[str, float, float]] = []
    path = str(Path(snapshot_dir or ".") / f"{cell_id}.pickle")
    with snap.record_history():
        for i in range(measure_steps):
            torch.cuda.synchronize(device)
            start = snap.clock_us()
            step(StepClock(device))
            torch.cuda.synchronize(device)
            phases.append((f"step {i + 1}", start, snap.clock_us()))
        snap.dump_snapshot(path)
    snapshot = snap.load_snapshot(path)
    common = {"mode": mode, "snapshot_path": path}
    yield {
        "kind": "summary", **common,
        "peak_mem_bytes": memory.peak_allocated_bytes(device),
        "peak_reserved_bytes": memory.peak_reserved_bytes(device),
        "mem_before_bwd_bytes": log.get("before_backward"),
        # one fp32 residual-stream activation: batch × context × d_model × 4 bytes
        "residual_activation_bytes": batch_size * context_length * spec.d_model * 4,
        "params": model.num_parameters(),
    }  # fmt: skip
    timeline = _downsample(snap.active_timeline(snapshot), TIMELINE_POINTS)
    for rec in timeline.to_dict("records"):
        yield {"kind": "timeline", **common, **rec}
    for label, start, end in phases:
        yield {"kind": "phase", **common, "phase": label, "start_us": start, "end_us": end}
    for rank, rec in enumerate(snap.largest_allocations(snapshot, top_n=top_n).to_dict("records"), 1):
        yield {"kind": "allocation", **common, "rank": rank, **rec}
