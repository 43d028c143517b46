"""Correctness before speed: an attention implementation is checked against float64 before it is timed, and after.

Before timing, :func:`check_attention` runs the implementation on a small shape of the cell's
class (:func:`check_shape`: the same head_dim, causal flag and precision, batch 2, one or two
heads) at CHECK_SEQ positions: several tiles of every common tile width with a ragged last one,
so a kernel that forgets a step between tiles (the running-max rescaling of an online softmax)
fails. It calls the implementation CHECK_CALLS times on fresh random inputs, so one that caches
an answer fails too. Each call's output must have the inputs' dtype and shape; its values and,
where the cell times a backward, dQ, dK and dV are compared with our eager core
(``models.attention``) in float64 on the CPU, fed the very inputs the implementation got
(rounded to the cell's dtype), by their largest error relative to the reference's largest
magnitude. The verdict is kept per code and shape class (``measure.checkcache``).

After timing, :func:`check_timed_output` compares one output the implementation produced on the
cell's own inputs with float64 for a sample of its query rows (random ones and the last), each
against the full K and V: rows × L × d of work, cheap at any length.

A failure raises :class:`cs336sys.rows.Wrong`: the cell becomes a ``wrong`` row with that error
and no time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

from cs336sys.measure import checkcache
from cs336sys.models.attention import relu_attention, softmax_attention
from cs336sys.models.dtypes import tensor_dtype
from cs336sys.rows import Wrong

# 300 positions: ≥ 3 tiles of 16-, 32-, 64- and 128-wide kernels, the last one ragged (300 = 2·128 + 44)
CHECK_SEQ = 300
CHECK_BATCH = 2
CHECK_CALLS = 2  # fresh inputs each: a second answer equal to the first is caught
SAMPLE_ROWS = 16  # query rows of the timed output compared with float64, the last one among them
ALIGNED = 128  # where an implementation raises at CHECK_SEQ, the check runs again at the next multiple of this (384)
MAX_CHECK_SEQ = 4096  # the longest length tried for an implementation that refuses CHECK_SEQ (the tutorial: multiples of 128)
# Largest |got - reference| / largest |reference|, per precision. fp32 (TF32 off; Triton's tf32x3): a
# correct kernel lands near 1e-6 at these shapes (tests/test_attention.py asserts rtol 1e-4 against
# float64). tf32 rounds inputs to a 10-bit mantissa (2^-11 ≈ 5e-4 per operand) and bf16 to 7 bits
# (2^-8 ≈ 4e-3); the backward chains three such products, so gradients carry a few times that. A
# kernel that forgets the 1/sqrt(d) scale, the causal mask or the rescaling between tiles is off by
# 10-100 % of the scale: far above.
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 5e-2}
_REFERENCE = {"softmax": softmax_attention, "relu": relu_attention}


def check_shape(heads: int, head_dim: int, supports: Callable[[int], bool] | None = None, tile: int = 16) -> tuple[int, int, int, int]:
    """The check's (batch, heads, L, d): the cell's head_dim, at most 2 heads, CHECK_SEQ positions or, where
    ``supports(L)`` (the catalog line's shapes) refuses that, the shortest longer length it takes.

    ``tile``: the implementation's narrowest tile (its catalog line's). Above 16, L is the first length
    from CHECK_SEQ that is a multiple of 16 and ragged for that tile (304 for 32): Triton specialises an
    integer argument on divisibility by 16, so a length that is not would compile every kernel once more
    for the check alone (the check took 29 s of a cold default sweep on the H200 at 7dafc59, nearly all
    of it compiling), where a multiple of 16 shares the timed shapes' kernels and still ends every tile of
    32 or more ragged."""
    ragged = (lambda n: True) if tile <= 16 else (lambda n: n % 16 == 0 and n % tile != 0)
    lengths = range(CHECK_SEQ, MAX_CHECK_SEQ + 1)
    length = next((n for n in lengths if ragged(n) and (supports is None or supports(n))), None)
    if length is None:  # nothing ragged that it takes (the tutorial kernel: multiples of 128)
        length = next((n for n in lengths if supports is None or supports(n)), CHECK_SEQ)
    return CHECK_BATCH, min(heads, 2), length, head_dim


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.abs().max().item()
    return (got.double() - want).abs().max().item() / (scale if scale > 0 else 1.0)


def check_form(out: object, q: torch.Tensor, v: torch.Tensor, precision: str, where: str) -> None:
    """Raise Wrong unless ``out`` is a tensor on the inputs' device, of their dtype and of shape (..., L, d_v)."""
    if not isinstance(out, torch.Tensor):
        raise Wrong(f"{where}: the implementation returned a {type(out).__name__}, not a tensor")
    if out.device != q.device:
        raise Wrong(f"{where}: the output is on {out.device} for inputs on {q.device}")
    if out.dtype != q.dtype:
        raise Wrong(
            f"{where}: the output is {str(out.dtype).removeprefix('torch.')} for {str(q.dtype).removeprefix('torch.')} inputs "
            f"(precision {precision}): the implementation computes or returns another precision than the cell times"
        )
    want = (*q.shape[:-1], v.shape[-1])
    if tuple(out.shape) != want:
        raise Wrong(f"{where}: output of shape {tuple(out.shape)} for inputs of shape {tuple(q.shape)} (expected {want})")


def _verdict(errors: dict[str, float], got: dict, want: dict, precision: str, where: str) -> None:
    tol = TOLERANCE[precision]
    bad = {name: err for name, err in errors.items() if not err <= tol}  # NaN fails too
    if bad:
        worst = max(bad, key=lambda n: bad[n] if bad[n] == bad[n] else float("inf"))
        abs_err = (got[worst].double().cpu() - want[worst]).abs().max().item()
        raise Wrong(
            f"wrong {worst} against a float64 reference {where}, {precision}: max abs error {abs_err:.3g}, relative to the "
            f"reference's largest value {bad[worst]:.3g} (tolerance {tol:g}); " + ", ".join(f"{n} {e:.3g}" for n, e in errors.items())
        )


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
    calls: int = CHECK_CALLS,
) -> dict[str, float]:
    """The largest errors of ``fn`` (output, and dq/dk/dv with ``backward``) against float64 over ``calls`` calls on
    fresh inputs; raises Wrong for a wrong dtype or shape, or an error past TOLERANCE[precision]."""
    dtype, worst = tensor_dtype(precision), {}
    kept = []  # every call's inputs stay alive: the next call's cannot reuse their memory (nor an address-keyed cache)
    for call in range(calls):
        gen = torch.Generator(device="cpu").manual_seed(seed + call)
        inputs = [torch.randn(shape, generator=gen).to(dtype) for _ in range(3)]  # rounded once: both sides see the same numbers
        grad_out = torch.randn(shape, generator=gen).to(dtype)
        q, k, v = (t.to(device).requires_grad_(backward) for t in inputs)
        kept.append((q, k, v))
        where = f"(batch, heads, L, d) = {tuple(shape)}, causal {bool(causal)}, call {call + 1} of {calls}"
        with context():
            out = fn(q, k, v, is_causal=bool(causal))
            check_form(out, q, v, precision, f"the check at {where}")
            got = {"output": out.detach()}
            if backward:
                got.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), grad_out.to(device))))
        rq, rk, rv = (t.double().requires_grad_(backward) for t in inputs)
        ref_out = _REFERENCE[activation](rq, rk, rv, is_causal=bool(causal))
        want = {"output": ref_out.detach()}
        if backward:
            want.update(zip(("dq", "dk", "dv"), torch.autograd.grad(ref_out, (rq, rk, rv), grad_out.double())))
        errors = {name: relative_error(got[name].float().cpu(), want[name]) for name in want}
        _verdict(errors, got, want, precision, where)
        worst = {name: max(err, worst.get(name, 0.0)) for name, err in errors.items()}
    return worst


def _rows_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, causal: bool, activation: str) -> torch.Tensor:
    """float64 attention of the query rows ``q`` (batch-heads, r, d), at positions ``rows``, against all of ``k``, ``v``."""
    seq_len = k.shape[-2]
    scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (batch-heads, r, L)
    hidden = torch.arange(seq_len, device=q.device)[None, :] > rows[:, None] if causal else None
    if activation == "softmax":
        probs = torch.softmax(scores if hidden is None else scores.masked_fill(hidden, float("-inf")), dim=-1)
    else:  # relu(QKᵀ/√d)/L, the causal positions 0 (models.attention.relu_attention)
        probs = torch.relu(scores if hidden is None else scores.masked_fill(hidden, 0.0)) / seq_len
    return probs @ v.double()


def check_timed_output(
    out: object,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    precision: str,
    causal: bool,
    *,
    activation: str = "softmax",
    rows: int = SAMPLE_ROWS,
    seed: int = 4321,
) -> float:
    """The error of an output of the timed loop (inputs ``q, k, v``, the cell's own) against float64, over a sample of
    query rows (random ones and the last) of every batch and head; raises Wrong as :func:`check_attention` does."""
    where = f"the timed loop's output, (batch, heads, L, d) = {tuple(q.shape)}, causal {bool(causal)}"
    check_form(out, q, v, precision, where)
    seq_len, dim = q.shape[-2], q.shape[-1]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    picked = sorted({*torch.randperm(seq_len, generator=gen)[: rows - 1].tolist(), seq_len - 1})
    at = torch.tensor(picked, device=q.device)
    qs, ks, vs = (t.detach().reshape(-1, seq_len, t.shape[-1]) for t in (q, k, v))
    got = out.detach().reshape(-1, seq_len, v.shape[-1])[:, at]
    chunk = max(1, 2**25 // (seq_len * max(dim, v.shape[-1])))  # batch-heads per float64 copy of K and V: ≤ 256 MiB
    parts = [
        _rows_reference(qs[i : i + chunk, at], ks[i : i + chunk], vs[i : i + chunk], at, causal, activation)
        for i in range(0, qs.shape[0], chunk)
    ]
    want = torch.cat(parts)
    errors = {"output": relative_error(got, want)}
    _verdict(errors, {"output": got}, {"output": want.cpu()}, precision, f"at {len(picked)} sampled query rows of {where}")
    return errors["output"]


def check_timed_call(
    fn: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    precision: str,
    causal: bool,
    *,
    activation: str = "softmax",
) -> float:
    """One more forward of ``fn`` on the cell's own inputs after its timed loop, checked by :func:`check_timed_output`.

    It runs as the loop's forwards did (gradients cleared, autograd on, so an implementation takes the same path),
    and its graph -- eager's L×L matrices kept for backward -- goes before the reference is built.
    """
    q.grad = k.grad = v.grad = None
    out = fn(q, k, v, is_causal=bool(causal))
    if isinstance(out, torch.Tensor):
        out = out.detach()
    return check_timed_output(out, q, k, v, precision, causal, activation=activation)


def check_implementation(
    impl: str,
    fn: Callable[..., torch.Tensor],
    shape: tuple[int, int, int, int],
    precision: str,
    causal: bool,
    device: torch.device,
    *,
    activation: str = "softmax",
    backward: bool = True,
    context: Callable[[], AbstractContextManager] = nullcontext,
) -> None:
    """:func:`check_attention` of catalog implementation ``impl``, or the verdict an earlier check of the same code
    and shape class left (``measure.checkcache``); raises Wrong for a wrong one. An implementation that raises at the
    ragged length (an SDPA backend, a kernel without masked tiles) is checked at whole 128-wide tiles instead: the
    cell's own length is checked after timing all the same."""
    where = checkcache.folder()
    key = checkcache.verdict_key(impl, shape, precision, causal, activation, backward, device) if where else {}
    found = checkcache.read(where, key) if where else None
    if found is not None:
        if found["verdict"] == "wrong":
            raise Wrong(f"{found['message']} (the verdict of an earlier check of this code and shape class, kept in {where})")
        return
    args = (precision, causal, device)
    try:
        try:
            check_attention(fn, shape, *args, activation=activation, backward=backward, context=context)
        except (Wrong, torch.OutOfMemoryError):
            raise
        except Exception:  # it refuses the ragged length (a backend or kernel that needs whole tiles): whole 128-wide ones
            aligned = (*shape[:2], -(-shape[2] // ALIGNED) * ALIGNED, shape[3])
            if aligned == shape:
                raise
            check_attention(fn, aligned, *args, activation=activation, backward=backward, context=context)
    except Wrong as exc:
        if where:
            checkcache.write(where, key, "wrong", str(exc))
        raise
    if where:
        checkcache.write(where, key, "ok")
