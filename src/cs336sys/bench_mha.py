"""Measurements of the ``mha`` study: forward without grad, and a forward + backward step."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from cs336sys import memory
from cs336sys.dtypes import autocast, set_matmul_precision
from cs336sys.flops import BACKWARD_FACTOR, mha_forward_flops
from cs336sys.mha import MultiHeadAttention
from cs336sys.timing import STEP, StepClock, time_steps


def measure_mha(
    device: torch.device,
    context: dict,
    *,
    embed_dim: int,
    num_heads: int,
    seq_len: int,
    variant: str,
    kernel: str,
    num_features: int | None = None,
    batch_size: int = 1,
    precision: str = "fp32",
    warmup_steps: int = 3,
    measure_steps: int = 10,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    torch.manual_seed(seed)
    set_matmul_precision(precision)
    layer = MultiHeadAttention(embed_dim, num_heads, variant, kernel, num_features, seed).to(device)
    x = torch.randn(batch_size, seq_len, embed_dim, device=device, requires_grad=True)
    fwd = mha_forward_flops(batch_size, seq_len, embed_dim, num_heads, variant, num_features)
    common = {"batch_size": batch_size, "memory_note": "" if device.type == "cuda" else memory.NO_CUDA_REASON}

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

    for mode, step, flops in (
        ("inference", inference, {"forward": fwd, STEP: fwd}),
        ("train", train, {"forward": fwd, "backward": BACKWARD_FACTOR * fwd, STEP: (1 + BACKWARD_FACTOR) * fwd}),
    ):
        context["mode"] = mode
        memory.reset_peak(device)
        timing = time_steps(step, warmup=warmup_steps, steps=measure_steps, device=device)
        peak = memory.peak_allocated_bytes(device)
        for phase, stats in timing.phases.items():
            yield {"mode": mode, "phase": phase, **stats.as_row(), "flops": flops.get(phase), "warmup_s": timing.warmup_s, **common, "peak_mem_bytes": peak}
        memory.release(device)
