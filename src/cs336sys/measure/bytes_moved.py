"""Analytic bytes moved to and from GPU memory (HBM): the roofline's other axis. Torch-free.

Each count models what an implementation's kernels read and write in DRAM, the way
:mod:`cs336sys.measure.flops` counts FLOPs: from the shape, the precision and the
implementation, never measured. With B·H (batch × heads) slices of L tokens and head
size d, at ``e`` bytes an element (4 for fp32/tf32, 2 for bf16):

- ``x`` = B·H·L·d·e: one of Q, K, V, O, dO, dQ, dK, dV;
- ``s`` = B·H·L·L·e: one L×L matrix (scores S, probabilities P, dP, dS), per batch × head;
- ``m`` = B·H·L·L bytes: the boolean causal mask, read by each op that applies it once per
  batch × head (it is broadcast; at L 16384 its 268 MB do not stay in L2);
- ``r`` = B·H·L·4: the fp32 log-sum-exp per query row a fused softmax kernel keeps.

How an implementation moves bytes is its catalog line's ``traffic`` (:class:`cs336sys.catalog.Impl`):
``eager``, ``compiled`` or ``fused``, counted as below. A line without one (a user's plug-in, unless
it says) gets no count, with the reason.

``eager`` (:mod:`cs336sys.models.attention`): every PyTorch op reads its inputs and writes
its output once, nothing reused across ops: right once the B·H L×L matrices outgrow L2 (50 MB
on an H100: B·H 8, fp32, from L 2048); below that some traffic stays in L2, and the count is high.
Forward 4x + 6s: QKᵀ writes S, the scale reads and writes it, the activation reads S and
writes P, PV reads P. Backward: dP = dO·Vᵀ writes dP, dV = Pᵀ·dO reads P, the activation's
backward reads P and dP and writes dS (softmax's runs as two kernels: 6s, ReLU's 3s), the
scale's reads and writes dS, dQ and dK read it: softmax 8x + 12s, ReLU 8x + 9s. Causal
adds masked_fill and its backward: + 2s + m each way. Nsight Compute's DRAM counters (H200,
torch 2.11, B 8, H 1, d 64) against these counts: fp32 softmax at L 4096, forward 3.17 GB
(3.25 counted), causal 4.36 (4.46), backward 6.41 (6.51), causal 7.59 (7.72); bf16 causal
2.16 (2.30) and 3.76 (3.93); bf16 ReLU at L 8192, forward 6.40 (6.48), backward 9.65 (9.73),
causal 12.17 (12.42): each within 7%.

``compiled`` (``torch.compile`` of eager): Inductor fuses scale, mask and activation into
one kernel between the cuBLAS matmuls, so S and P are each written once and read once:
forward 4x + 4s, backward 8x + 7s; ReLU saves a boolean mask (m) for its backward instead
of reading P there: 4x + 4s + m and 8x + 6s + m; causal + m each way (the fused kernels read
the mask per batch × head). Counters (fp32, L 4096, causal): softmax 2.25 GB (2.32) and 3.91
(3.96), ReLU 2.38 (2.45) and 3.49 (3.56). A non-causal *softmax* core is not counted:
Inductor's attention pattern matcher may rewrite it into SDPA (on the H200 it did for bf16,
not for fp32), a fused path with other traffic.

Fused kernels (ours, Triton's tutorial, SDPA's backends): the minimum traffic. Forward
reads Q, K, V and writes O and the log-sum-exp (4x + r); backward reads Q, K, V, O, dO and
the log-sum-exp and writes dQ, dK, dV (8x + r). ReLU attention keeps no O or statistics:
4x and 7x. A lower bound: K and V are re-read per query tile (mostly from L2), and some
backends accumulate dQ in fp32 (cuDNN's backward read 1.7× the bound at L 16384).

Causal attention moves no fewer bytes than full attention (eager materialises the whole
matrix, then masks it; a fused kernel still reads every row), while its FLOPs count half.

AdamW's step, fp32 parameters and state: PyTorch's fused one reads param, grad, m and v and
writes param, m and v (28 bytes a parameter, the minimum); the course's (:mod:`cs336sys.models.optim`)
runs eight in-place ops and moves 80 bytes a parameter (12 reads and 8 writes of 4 bytes).
Counters (H200, 268M parameters): 16.0 and 48.0 bytes read a parameter, exactly as counted.
"""

from __future__ import annotations

from collections.abc import Mapping

from cs336sys import catalog

ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2}  # attention inputs: bf16 casts them (studies attention, flash)
LSE_BYTES = 4  # fp32 log-sum-exp per query row
MASK_BYTES = 1  # torch.bool
ADAMW_BYTES_PER_PARAM = {"fused": 28, "course": 80}  # fp32: see the module doc
PHASES = ("forward", "backward", "forward_backward", "step")


def attention_phase_bytes(
    batch: int, heads: int, seq: int, head_dim: int, causal: bool, precision: str, impl: str, activation: str = "softmax"
) -> dict[str, float]:
    """Bytes each timed phase of an attention core moves (module doc); ValueError where it cannot say."""
    if precision not in ELEMENT_BYTES:
        raise ValueError(f"precision {precision!r}: no element size known (known: {', '.join(ELEMENT_BYTES)})")
    e, rows = ELEMENT_BYTES[precision], batch * heads * seq
    x, s, m, r = float(rows * head_dim * e), float(rows * seq * e), float(rows * seq * MASK_BYTES), float(rows * LSE_BYTES)
    softmax = activation == "softmax"
    traffic = _traffic(impl)
    if traffic == "eager":
        fwd, bwd = 4 * x + 6 * s, 8 * x + (12 * s if softmax else 9 * s)
        if causal:  # masked_fill and its backward: one more read and write of S (dS) each way, and the mask
            fwd, bwd = fwd + 2 * s + m, bwd + 2 * s + m
    elif traffic == "compiled":
        if softmax and not causal:
            raise ValueError("compiled non-causal softmax: Inductor may rewrite it into SDPA (a fused kernel), so its path is unknown")
        fwd, bwd = (4 * x + 4 * s, 8 * x + 7 * s) if softmax else (4 * x + 4 * s + m, 8 * x + 6 * s + m)
        if causal:  # the fused kernels read the mask
            fwd, bwd = fwd + m, bwd + m
    else:  # fused
        fwd, bwd = (4 * x + r, 8 * x + r) if softmax else (4 * x, 7 * x)
    return {"forward": fwd, "backward": bwd, "forward_backward": fwd + bwd, "step": fwd + bwd}


def _traffic(impl: str) -> str:
    """How ``impl`` moves bytes, from its catalog line; ValueError naming why it has no count."""
    counted = ", ".join(i.name for i in catalog.impls() if i.traffic)
    try:
        line = catalog.lookup(impl)
    except ValueError:
        raise ValueError(f"implementation {impl!r}: no byte count (not in the catalog; counted: {counted})") from None
    if line.traffic not in catalog.TRAFFIC:
        raise ValueError(
            f"implementation {impl!r}: no byte count (its catalog line says nothing of how it moves bytes: "
            f"Impl.traffic, one of {', '.join(catalog.TRAFFIC)}; counted: {counted})"
        )
    return line.traffic


def attention_row_bytes(row: Mapping[str, object], shape: tuple[object, ...]) -> tuple[float | None, str]:
    """(bytes, why empty) of one attention-core result row with its (batch, heads, seq, head_dim, causal) ``shape``."""
    phase = row.get("phase")
    if not isinstance(phase, str) or phase not in PHASES:
        return None, f"phase {phase!r}: no byte count (counted: {', '.join(PHASES)})"
    if any(_missing(v) for v in shape):
        return None, "the row lacks its shape (batch, heads, seq_len, head size or causal)"
    impl, precision = row.get("impl"), row.get("precision")
    activation = row.get("activation") if isinstance(row.get("activation"), str) else "softmax"  # flash: softmax only
    batch, heads, seq, head_dim, causal = shape
    try:
        counted = attention_phase_bytes(
            int(batch), int(heads), int(seq), int(head_dim), bool(int(causal)), str(precision), str(impl), activation
        )
    except ValueError as exc:
        return None, str(exc)
    return counted[phase], ""


def optimizer_row_bytes(row: Mapping[str, object]) -> tuple[float | None, str]:
    """(bytes, why empty) of an ``optimizer_step`` row: AdamW's bytes a parameter × the row's ``params``."""
    name = row.get("optimizer")
    base = str(name).removesuffix("-captured").removesuffix("-capturable") if isinstance(name, str) else ""
    if base not in ADAMW_BYTES_PER_PARAM:
        return None, f"optimizer {name!r}: no byte count (counted: {', '.join(ADAMW_BYTES_PER_PARAM)})"
    params = row.get("params")
    if _missing(params):
        return None, "the row has no parameter count (params)"
    return float(params) * ADAMW_BYTES_PER_PARAM[base], ""


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and value != value) or value == ""
