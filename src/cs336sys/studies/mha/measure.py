"""One mha cell: an inference forward (no grad) and a forward + backward step of the same layer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from cs336sys.measure import SEED, memory
from cs336sys.measure.busy import busy_note, gpu_busy_share
from cs336sys.measure.flops import mha_forward_flops, phase_flops
from cs336sys.measure.session import Session
from cs336sys.measure.timing import StepClock, time_steps, timing_rows
from cs336sys.models.dtypes import autocast, set_matmul_precision
from cs336sys.models.mha import MultiHeadAttention


def measure(
    device: torch.device,
    context: dict,
    session: Session,
    *,
    embed_dim: int,
    num_heads: int,
    seq_len: int,
    variant: str,
    kernel: str,
    num_features: int,
    batch_size: int,
    precision: str,
    warmup_steps: int,
    measure_steps: int,
) -> Iterator[dict[str, Any]]:
    torch.manual_seed(SEED)
    set_matmul_precision(precision)
    m = num_features or None  # 0: an exact variant, no random features
    layer = MultiHeadAttention(embed_dim, num_heads, variant, kernel, m, SEED).to(device)
    x = torch.randn(batch_size, seq_len, embed_dim, device=device, requires_grad=True)
    fwd = mha_forward_flops(batch_size, seq_len, embed_dim, num_heads, variant, m)
    common = {"batch_size": batch_size, "precision": precision, "memory_note": "" if device.type == "cuda" else memory.NO_CUDA_REASON}

    def inference(clock: StepClock) -> None:
        with torch.no_grad(), clock.phase("forward"), autocast(precision, device):
            layer(x)

    def train(clock: StepClock) -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        with clock.phase("forward"), autocast(precision, device):
            out = layer(x)
        with clock.phase("backward"):
            out.float().pow(2).mean().backward()

    steps = {"inference": inference, "train": train}
    timed = {}

    def rows(mode: str, busy: float | None, note: str) -> Iterator[dict[str, Any]]:
        timing, peak = timed[mode]
        extra = {"mode": mode, **common, "peak_mem_bytes": peak, "gpu_busy_frac": busy, "gpu_busy_note": note}
        return timing_rows(timing, phase_flops(fwd, mode), extra)

    for mode, step in steps.items():
        context["mode"] = mode
        memory.reset_peak(device)
        try:
            timing = time_steps(step, session, warmup=warmup_steps, steps=measure_steps, device=device)
        except torch.OutOfMemoryError:
            memory.release(device)
            for done in timed:  # measured before this mode ran out: its rows stay; the runner records the OOM
                yield from rows(done, None, f"not measured: {mode} ran out of memory after it")
            context["mode"] = mode
            raise
        timed[mode] = (timing, memory.peak_allocated_bytes(device))
    # the busy share once nothing more is timed: the profiler slows every later launch (measure.busy)
    for mode, step in steps.items():
        context["mode"] = mode
        busy = gpu_busy_share(step, device, session)
        yield from rows(mode, busy, busy_note(busy, device, session))
    memory.release(device)
