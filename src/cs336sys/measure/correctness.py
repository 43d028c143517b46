"""Correctness before speed: an attention implementation is checked against a float64 reference before it is timed.

The reference is our eager core (``models.attention``) in float64 on the CPU, fed the very
inputs the implementation got (rounded to the cell's dtype), on a small shape of the cell's
class: the same head_dim, causal flag and precision, batch 2, one or two heads and at most
128 positions. The forward output and, where the cell times a backward, dQ, dK and dV are
compared by their largest error relative to the reference's largest magnitude; a failure
raises :class:`cs336sys.rows.Wrong`, which makes the cell a ``wrong`` row with that error
and no time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

from cs336sys.models.attention import relu_attention, softmax_attention
from cs336sys.models.dtypes import tensor_dtype
from cs336sys.rows import Wrong

CHECK_SEQ = 128  # positions of the check (or the cell's own, if fewer): a float64 L×L reference is cheap
CHECK_BATCH = 2
# Largest |got - reference| / largest |reference|, per precision. fp32 (TF32 off; Triton's tf32x3): a
# correct kernel lands near 1e-6 at these shapes (tests/test_attention.py asserts rtol 1e-4 against
# float64). tf32 rounds inputs to a 10-bit mantissa (2^-11 ≈ 5e-4 per operand) and bf16 to 7 bits
# (2^-8 ≈ 4e-3); the backward chains three such products, so gradients carry a few times that. A
# kernel that forgets the 1/sqrt(d) scale or the causal mask is off by 10-100 % of the scale: far above.
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 5e-2}
_REFERENCE = {"softmax": softmax_attention, "relu": relu_attention}


def check_shape(batch_heads: tuple[int, int], seq_len: int, head_dim: int) -> tuple[int, int, int, int]:
    """The check's (batch, heads, L, d): the cell's head_dim, at most 2 heads and CHECK_SEQ positions."""
    return CHECK_BATCH, min(batch_heads[1], 2), min(seq_len, CHECK_SEQ), head_dim


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.abs().max().item()
    return (got.double() - want).abs().max().item() / (scale if scale > 0 else 1.0)


def check_attention(
    fn: Callable[..., torch.Tensor],
    shape: tuple[int, int, int, int],
    precision: str,
    causal: bool,
    device: torch.device,
    *,
    activation: str = "softmax",
    backward: bool = True,
    context: Callable[[], AbstractContextManager] = nullcontext,
    seed: int = 1234,
) -> dict[str, float]:
    """Errors of ``fn`` (output, and dq/dk/dv with ``backward``) against float64; raises Wrong past TOLERANCE[precision]."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dtype = tensor_dtype(precision)
    inputs = [torch.randn(shape, generator=gen).to(dtype) for _ in range(3)]  # rounded once: both sides see the same numbers
    grad_out = torch.randn(shape, generator=gen).to(dtype)
    q, k, v = (t.to(device).requires_grad_(backward) for t in inputs)
    with context():
        out = fn(q, k, v, is_causal=bool(causal))
        got = {"output": out.detach()}
        if backward:
            got.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), grad_out.to(device))))
    rq, rk, rv = (t.double().requires_grad_(backward) for t in inputs)
    ref_out = _REFERENCE[activation](rq, rk, rv, is_causal=bool(causal))
    want = {"output": ref_out.detach()}
    if backward:
        want.update(zip(("dq", "dk", "dv"), torch.autograd.grad(ref_out, (rq, rk, rv), grad_out.double())))
    errors = {name: relative_error(got[name].float().cpu(), want[name]) for name in want}
    tol = TOLERANCE[precision]
    bad = {name: err for name, err in errors.items() if not err <= tol}  # NaN fails too
    if bad:
        worst = max(bad, key=lambda n: bad[n] if bad[n] == bad[n] else float("inf"))
        abs_err = (got[worst].double().cpu() - want[worst]).abs().max().item()
        raise Wrong(
            f"wrong {worst} against a float64 reference (batch, heads, L, d) = {tuple(shape)}, causal {bool(causal)}, "
            f"{precision}: max abs error {abs_err:.3g}, relative to the reference's largest value {bad[worst]:.3g} "
            f"(tolerance {tol:g}); " + ", ".join(f"{n} {e:.3g}" for n, e in errors.items())
        )
    return errors
