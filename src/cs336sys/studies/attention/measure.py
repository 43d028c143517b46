"""One attention cell: Q, K, V of shape (batch, 1 head, L, d); a forward and a backward per step.

Both are timed by CUDA events inside the same step, and the memory in use
between them is recorded: what the core keeps for backward. Before timing, the
core's output and gradients are checked against float64 on a small shape of the
cell's class, and after timing one more forward on the cell's own inputs is
checked at sampled rows (``measure.correctness``): a wrong core is a ``wrong`` row,
never a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cs336sys import catalog
from cs336sys.measure import SEED, memory
from cs336sys.measure.busy import busy_note, gpu_busy_share
from cs336sys.measure.correctness import check_implementation, check_shape, check_timed_call
from cs336sys.measure.flops import attention_phase_flops
from cs336sys.measure.session import Session
from cs336sys.measure.timing import StepClock, time_steps, timing_rows
from cs336sys.models.attention import get_attention
from cs336sys.models.dtypes import set_matmul_precision, tensor_dtype
from cs336sys.models.variants import needs_cuda
from cs336sys.rows import Skip


def require_device(impl: str, device: torch.device) -> None:
    """Skip where ``impl`` is a Triton kernel and ``device`` cannot run it."""
    if needs_cuda(impl) and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise Skip(f"implementation {impl!r} needs CUDA (TRITON_INTERPRET=1 runs it on CPU, slowly)")


def core(impl: str, activation: str, device: torch.device) -> Callable:
    """The attention core ``impl`` × ``activation``; Skip where it cannot run on ``device``."""
    require_device(impl, device)
    fn = get_attention(impl, activation)
    if fn is None:
        raise ValueError(f"{impl} × {activation} is not a valid combination")
    return fn


def qkv(shape: tuple[int, ...], precision: str, device: torch.device, seed: int) -> list[torch.Tensor]:
    """Seeded Q, K, V (drawn on the CPU, so every device gets the same numbers), requiring grad."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype = tensor_dtype(precision)
    return [torch.randn(shape, generator=gen).to(device=device, dtype=dtype).requires_grad_() for _ in range(3)]


def measure(
    device: torch.device,
    context: dict,
    session: Session,
    *,
    d_model: int,
    seq_len: int,
    activation: str,
    impl: str,
    causal: bool,
    precision: str,
    batch_size: int,
    warmup_steps: int,
    measure_steps: int,
) -> Iterator[dict[str, Any]]:
    fn = core(impl, activation, device)
    set_matmul_precision(precision)
    context["mode"] = "train"  # a wrong core's row is the train row it would have been
    with session.part("check"):
        check_implementation(
            impl, fn, check_shape(1, d_model, tile=catalog.lookup(impl).tile), precision, bool(causal), device, activation=activation
        )
    if catalog.lookup(impl).compile:
        torch._dynamo.reset()  # the check's shape must not make the timed shape's compilation dynamic
    # (batch, 1 head, L, d): 4-D so that SDPA can pick a fused backend (3-D inputs fall back to math)
    q, k, v = qkv((batch_size, 1, seq_len, d_model), precision, device, SEED)
    grad_out = torch.randn_like(q)
    mem: dict[str, int | None] = {}

    def step(clock: StepClock) -> None:
        q.grad = k.grad = v.grad = None
        mem["before_forward"] = memory.allocated_bytes(device)
        with clock.phase("forward"):
            out = fn(q, k, v, is_causal=bool(causal))
        mem["before_backward"] = memory.allocated_bytes(device)
        with clock.phase("backward"):
            out.backward(grad_out)

    context["mode"] = "train"
    memory.reset_peak(device)
    timing = time_steps(step, session, warmup=warmup_steps, steps=measure_steps, device=device)
    peak = memory.peak_allocated_bytes(device)
    busy = gpu_busy_share(step, device, session)
    with session.part("check"):
        check_timed_call(fn, q, k, v, precision, bool(causal), activation=activation)
    elem = q.element_size()
    extra = {
        "mode": "train",
        "batch_size": batch_size,
        "peak_mem_bytes": peak,
        "gpu_busy_frac": busy,
        "gpu_busy_note": busy_note(busy, device, session),
        "mem_before_fwd_bytes": mem.get("before_forward"),
        "mem_before_bwd_bytes": mem.get("before_backward"),
        # bytes of one (batch, L, L) matrix in the compute dtype: the unit in which eager keeps P for backward
        "score_matrix_bytes": batch_size * seq_len * seq_len * elem,
        "output_bytes": batch_size * seq_len * d_model * elem,
        "memory_note": "" if device.type == "cuda" else memory.NO_CUDA_REASON,
    }
    yield from timing_rows(timing, attention_phase_flops(batch_size, 1, seq_len, d_model, bool(causal)), extra)
