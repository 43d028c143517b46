"""Attention-core measurements: study ``attention`` (handout §1.2.1) and study ``flash``.

``attention``: batch × one head, Q, K, V of shape (batch, L, d); each step
times a forward and a backward (CUDA events, same step) and records the memory
in use between them. ``flash``: the course's flash_benchmarking grid, each of
forward, backward and forward+backward timed by ``triton.testing.do_bench``
(median), with SDPA's backends forced one at a time.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Any, Callable, Iterator

import torch

from cs336sys import memory
from cs336sys.attention import get_attention, needs_cuda
from cs336sys.cells import Skip
from cs336sys.dtypes import set_matmul_precision, tensor_dtype
from cs336sys.flops import BACKWARD_FACTOR, attention_core_flops
from cs336sys.timing import STEP, StepClock, bench_median_ms, time_steps

FLASH_IMPLS = ("triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "eager", "compiled")


def _core(impl: str, activation: str, device: torch.device) -> Callable:
    if needs_cuda(impl) and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise Skip(f"implementation {impl!r} needs CUDA (TRITON_INTERPRET=1 runs it on CPU, slowly)")
    fn = get_attention(impl, activation)
    if fn is None:
        raise ValueError(f"{impl} × {activation} is not a valid combination")
    return fn


def _qkv(shape: tuple[int, ...], precision: str, device: torch.device, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype = tensor_dtype(precision)
    return [torch.randn(shape, generator=gen).to(device=device, dtype=dtype).requires_grad_() for _ in range(3)]


def measure_attention(
    device: torch.device,
    context: dict,
    *,
    d_model: int,
    seq_len: int,
    activation: str,
    impl: str,
    causal: bool,
    precision: str,
    batch_size: int = 8,
    warmup_steps: int = 5,
    measure_steps: int = 100,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    fn = _core(impl, activation, device)
    set_matmul_precision(precision)
    # (batch, 1 head, L, d): 4-D so that SDPA can pick a fused backend (3-D inputs fall back to math)
    q, k, v = _qkv((batch_size, 1, seq_len, d_model), precision, device, seed)
    grad_out = torch.randn_like(q)
    mem: dict[str, int | None] = {}

    def step(clock: StepClock) -> None:
        q.grad = k.grad = v.grad = None
        mem["before_forward"] = memory.allocated_bytes(device)
        with clock.phase("forward"):
            out = fn(q, k, v, is_causal=causal)
        mem["before_backward"] = memory.allocated_bytes(device)
        with clock.phase("backward"):
            out.backward(grad_out)

    context["mode"] = "train"
    memory.reset_peak(device)
    timing = time_steps(step, warmup=warmup_steps, steps=measure_steps, device=device)
    fwd = attention_core_flops(batch_size, 1, seq_len, d_model, causal)
    flops = {"forward": fwd, "backward": BACKWARD_FACTOR * fwd, STEP: (1 + BACKWARD_FACTOR) * fwd}
    elem = q.element_size()
    extra = {
        "mode": "train",
        "batch_size": batch_size,
        "peak_mem_bytes": memory.peak_allocated_bytes(device),
        "mem_before_fwd_bytes": mem.get("before_forward"),
        "mem_before_bwd_bytes": mem.get("before_backward"),
        # bytes of one (batch, L, L) matrix in the compute dtype: the unit in which eager keeps P for backward
        "score_matrix_bytes": batch_size * seq_len * seq_len * elem,
        "output_bytes": batch_size * seq_len * d_model * elem,
        "memory_note": "" if device.type == "cuda" else memory.NO_CUDA_REASON,
    }
    for phase, stats in timing.phases.items():
        yield {"phase": phase, **stats.as_row(), "flops": flops.get(phase), "warmup_s": timing.warmup_s, **extra}


def _flash_fn(impl: str, device: torch.device) -> tuple[Callable, Callable[[], Any]]:
    """(attention fn, context factory) for a flash-study implementation name."""
    if impl.startswith("sdpa-"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {
            "sdpa-flash": SDPBackend.FLASH_ATTENTION,
            "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
        }[impl]
        return get_attention("sdpa", "softmax"), lambda: sdpa_kernel(backend)
    if impl not in FLASH_IMPLS:
        raise ValueError(f"unknown flash implementation {impl!r}; known: {', '.join(FLASH_IMPLS)}")
    return _core(impl, "softmax", device), nullcontext


def measure_flash(
    device: torch.device,
    context: dict,
    *,
    seq_len: int,
    head_dim: int,
    precision: str,
    impl: str,
    batch_size: int = 1,
    num_heads: int = 1,
    causal: bool = True,
    rep_ms: float = 100,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    fn, kernel_ctx = _flash_fn(impl, device)
    set_matmul_precision(precision)
    q, k, v = _qkv((batch_size, num_heads, seq_len, head_dim), precision, device, seed)
    grad_out = torch.randn_like(q)
    context["mode"] = "train"
    with kernel_ctx():
        try:
            out = fn(q, k, v, is_causal=causal)
        except RuntimeError as exc:  # e.g. SDPA "No available kernel" for this backend × dtype × d
            if isinstance(exc, torch.OutOfMemoryError):
                raise
            raise Skip(f"unsupported: {str(exc).splitlines()[0][:300]}") from exc

        def fwd_bwd() -> None:
            fn(q, k, v, is_causal=causal).backward(grad_out)

        memory.reset_peak(device)
        forward_ms = bench_median_ms(lambda: fn(q, k, v, is_causal=causal), device, rep_ms=rep_ms)
        backward_ms = bench_median_ms(lambda: out.backward(grad_out, retain_graph=True), device, rep_ms=rep_ms)
        fwd_bwd_ms = bench_median_ms(fwd_bwd, device, rep_ms=rep_ms)
        peak = memory.peak_allocated_bytes(device)
    fwd = attention_core_flops(batch_size, num_heads, seq_len, head_dim, causal)
    for phase, ms, flops in (
        ("forward", forward_ms, fwd),
        ("backward", backward_ms, BACKWARD_FACTOR * fwd),
        ("forward_backward", fwd_bwd_ms, (1 + BACKWARD_FACTOR) * fwd),
    ):
        yield {
            "mode": "train", "phase": phase, "median_ms": ms, "n": 1, "flops": flops,
            "batch_size": batch_size, "num_heads": num_heads, "peak_mem_bytes": peak,
            "memory_note": "" if device.type == "cuda" else memory.NO_CUDA_REASON,
        }  # fmt: skip
