"""One flash cell: forward, backward and forward+backward, each timed by ``triton.testing.do_bench``.

SDPA's backends are forced one at a time (``sdpa-flash``, ``sdpa-cudnn``,
``sdpa-efficient``); a backend that refuses the dtype or head size makes the
cell ``skipped`` with SDPA's reason. ``triton-atomic`` is ours with the one-kernel backward
(atomic dQ). ``tutorial`` is Triton's fused-attention
tutorial kernel (``models.triton_tutorial_attention``), a reference point: the
shapes it does not handle are not cells, and a direct call with one is skipped
with the reason. Before timing, output and gradients are checked against float64
on a small shape of the cell's class, and after timing one more forward on the
cell's own inputs is checked at sampled rows (``measure.correctness``): a wrong
kernel is a ``wrong`` row, never a time.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from cs336sys import catalog
from cs336sys.measure import SEED, memory
from cs336sys.measure.correctness import check_implementation, check_shape, check_timed_call
from cs336sys.measure.flops import attention_phase_flops
from cs336sys.measure.session import Session
from cs336sys.measure.timing import bench_stats
from cs336sys.models.attention import resolve
from cs336sys.models.dtypes import set_matmul_precision
from cs336sys.rows import Skip
from cs336sys.studies.attention.measure import qkv, require_device


def _flash_fn(impl: str, device: torch.device) -> tuple[Callable, Callable[[], Any]]:
    """(attention fn, context factory) for a flash-study implementation name: its catalog line."""
    catalog.lookup(impl, catalog.FUSED)  # an unknown name fails here, naming the known ones, before the device is asked
    require_device(impl, device)
    found = resolve(impl, "softmax", kind=catalog.FUSED)
    if found is None:  # the catalog refuses such a line; a guard for the type checker's sake
        raise ValueError(f"flash implementation {impl!r} has no softmax entry in the catalog")
    return found


_WHERE = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?")  # the C++ source line of each warning


def _reasons(messages: Iterable[str]) -> Iterator[str]:
    """SDPA's warnings minus their headers ("... kernel not used because:"), the backends we disabled
    on purpose ("... has been runtime disabled") and the C++ source lines: what is left says why."""
    for message in messages:
        text = _WHERE.sub("", message.strip().splitlines()[0] if message.strip() else "").strip()
        if text and not text.endswith("because:") and "runtime disabled" not in text:
            yield text


def _first_call(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The first forward; an implementation that refuses the shape or dtype makes the cell ``skipped``.

    SDPA's error says only "No available kernel"; why each backend declined it says in warnings
    (e.g. "Expected query, key and value to all be of dtype: {Half, BFloat16}"), which the reason keeps.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(q, k, v, is_causal=causal)
        except RuntimeError as exc:
            if isinstance(exc, torch.OutOfMemoryError):
                raise
            detail = "; ".join(dict.fromkeys(_reasons(str(w.message) for w in caught)))  # each once, in order
            reason = str(exc).strip().splitlines()[0] + (f" ({detail})" if detail else "")
            raise Skip(f"unsupported: {reason[:600]}") from exc


def measure(
    device: torch.device,
    context: dict,
    session: Session,
    *,
    seq_len: int,
    head_dim: int,
    precision: str,
    impl: str,
    num_heads: int,
    batch_size: int,
    causal: bool,
    rep_ms: float,
) -> Iterator[dict[str, Any]]:
    line = catalog.lookup(impl, catalog.FUSED)
    if why := line.why_unsupported(seq_len, head_dim, precision):
        raise Skip(f"unsupported by {line.about}: {why}")
    fn, kernel_ctx = _flash_fn(impl, device)
    set_matmul_precision(precision)
    q, k, v = qkv((batch_size, num_heads, seq_len, head_dim), precision, device, SEED)
    grad_out = torch.randn_like(q)
    context["mode"] = "train"
    with kernel_ctx():
        with session.part("warmup"):  # the kernel's compilation and autotuning at this shape
            out = _first_call(fn, q, k, v, causal)
        with session.part("check"):
            shape = check_shape(num_heads, head_dim, lambda n: not line.why_unsupported(n, head_dim, precision), line.tile)
            check_implementation(impl, fn, shape, precision, causal, device)
        if line.compile:  # the check's shape must not make the timed shape's compilation dynamic
            torch._dynamo.reset()
            out = fn(q, k, v, is_causal=causal)

        def fwd_bwd() -> None:
            fn(q, k, v, is_causal=causal).backward(grad_out)

        memory.reset_peak(device)
        grads = (q, k, v)  # cleared between calls: a backward must not time gradient accumulation
        times = {
            "forward": bench_stats(lambda: fn(q, k, v, is_causal=causal), device, session, rep_ms=rep_ms),
            "backward": bench_stats(lambda: out.backward(grad_out, retain_graph=True), device, session, rep_ms=rep_ms, grad_to_none=grads),
            "forward_backward": bench_stats(fwd_bwd, device, session, rep_ms=rep_ms, grad_to_none=grads),
        }
        peak = memory.peak_allocated_bytes(device)
        out = None  # the backward's graph goes: this forward runs in the memory a timed one had
        with session.part("check"):
            check_timed_call(fn, q, k, v, precision, causal)
    flops = attention_phase_flops(batch_size, num_heads, seq_len, head_dim, causal)
    for phase, stats in times.items():
        yield {
            "mode": "train",
            "phase": phase,
            **stats.as_row(),
            "flops": flops[phase],
            "batch_size": batch_size,
            "causal": int(causal),
            "peak_mem_bytes": peak,  # what the merge recounts FLOPs from
            "memory_note": "" if device.type == "cuda" else memory.NO_CUDA_REASON,
        }
