"""One e2e cell: an inference forward and a training step of the same model and batch.

The training step's forward (with the loss), backward and optimizer step are
timed by CUDA events inside the same step and the whole step by the wall clock.
With ``cuda_graphs`` each mode is captured once and replayed: one wall time per
step, no phase split, the GPU-bound time of the same computation. Every mode
also records the share of its step the GPU was busy (``gpu_busy_frac``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from cs336sys.measure import memory
from cs336sys.measure.busy import busy_note, gpu_busy_share
from cs336sys.measure.flops import lm_forward_flops, phase_flops
from cs336sys.measure.lm_steps import graphed_lm_steps, lm_steps, setup_lm
from cs336sys.measure.timing import time_steps, timing_rows
from cs336sys.models.variants import MODES, needs_cuda
from cs336sys.pipeline.rows import Skip


def measure(
    device: torch.device,
    context: dict,
    *,
    size: str,
    context_length: int,
    precision: str,
    impl: str = "eager",
    compile: bool = False,
    cuda_graphs: bool = False,
    warmup_steps: int = 5,
    measure_steps: int = 10,
    batch_size: int = 4,
    vocab_size: int = 10_000,
    modes: tuple[str, ...] = MODES,
    optimizer: str = "course",
    extra_sizes: Mapping[str, Mapping[str, int]] | None = None,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    if needs_cuda(impl) and device.type != "cuda":
        raise Skip(f"attention {impl!r} needs CUDA")
    if cuda_graphs and device.type != "cuda":
        raise Skip("CUDA graphs need CUDA")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    spec, model, inputs, targets = setup_lm(device, size, context_length, precision, impl, batch_size, vocab_size, extra_sizes, seed)
    run_model = torch.compile(model) if compile else model
    fwd = lm_forward_flops(spec, batch_size, context_length, vocab_size)
    memory_log: dict[str, int | None] = {}
    if cuda_graphs:
        try:
            steps = graphed_lm_steps(model, run_model, inputs, targets, precision, device)
        except RuntimeError as exc:
            if isinstance(exc, torch.OutOfMemoryError):
                raise
            raise Skip(f"CUDA graph capture failed: {str(exc).splitlines()[0][:300]}") from exc
    else:
        steps = lm_steps(model, run_model, inputs, targets, precision, device, optimizer, memory_log)
    common = {
        "batch_size": batch_size,
        "tokens": batch_size * context_length,
        "params": model.num_parameters(),
        "memory_note": "" if device.type == "cuda" else memory.NO_CUDA_REASON,
    }
    for mode in (m for m in MODES if m in modes):
        context["mode"] = mode
        memory.reset_peak(device)
        timing = time_steps(steps[mode], warmup=warmup_steps, steps=measure_steps, device=device)
        busy = gpu_busy_share(steps[mode], device)
        extra = {"mode": mode, **common, "peak_mem_bytes": memory.peak_allocated_bytes(device),
                 "gpu_busy_frac": busy, "gpu_busy_note": busy_note(busy, device)}  # fmt: skip
        if mode == "train":
            # a graph needs a capturable optimizer: fused AdamW, the same update as the course's
            extra.update(optimizer="fused-capturable" if cuda_graphs else optimizer, mem_before_bwd_bytes=memory_log.get("before_backward"))
        yield from timing_rows(timing, phase_flops(fwd, mode), extra)
        memory.release(device)
