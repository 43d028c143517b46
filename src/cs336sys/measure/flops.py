"""Analytic FLOP counts: matmul FLOPs only, 2·m·n·k per matmul.

Convention (also stated in the report): elementwise ops, softmax and norms are
not counted; causal attention's QKᵀ and PV are counted at half (the masked half
is not useful work).

A model (the LM studies, the ``mha`` layer): a backward costs ``BACKWARD_FACTOR``
= 2× its forward (grad w.r.t. inputs and w.r.t. weights, no recomputation), so a
training step is 3× a forward (6ND) -- the usual "model FLOPs" convention.

An attention core alone (studies ``attention`` and ``flash``): a backward costs
``ATTENTION_BACKWARD_FACTOR`` = 2.5× its forward and forward+backward 3.5×, as the
FlashAttention-2 paper's benchmarks (Dao 2023, ``benchmarks/benchmark_flash_attention.py``)
and Triton's fused-attention tutorial (06-fused-attention.py, ``total_flops *= 2.5  # 2.0(bwd) +
0.5(recompute)``) count it: dQ, dK, dV take four L×L×d matmuls (2×) and a fused
backward recomputes QKᵀ (0.5×). Every implementation gets the same count, eager ones
too, so TFLOP/s compare with the published figures and across implementations.
"""

from __future__ import annotations

import math

from cs336sys.models.sizes import ModelSize

BACKWARD_FACTOR = 2.0
ATTENTION_BACKWARD_FACTOR = 2.5  # 2.0 (dQ, dK, dV) + 0.5 (QKᵀ recomputed): FlashAttention-2, Triton tutorial 06


def attention_core_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> float:
    """QKᵀ and PV: 2 matmuls of 2·L·L·d each per (batch, head); causal at half."""
    flops = 2 * (2.0 * batch * heads * seq * seq * head_dim)
    return flops * 0.5 if causal else flops


def lm_forward_flops(size: ModelSize, batch: int, context_length: int, vocab_size: int) -> float:
    """One forward of TransformerLM on (batch, context_length) tokens."""
    d, f, tokens = size.d_model, size.d_ff, batch * context_length
    projections = 4 * 2.0 * tokens * d * d  # q, k, v, output
    ffn = 3 * 2.0 * tokens * d * f  # SwiGLU w1, w3, w2
    attn = attention_core_flops(batch, size.num_heads, context_length, d // size.num_heads, causal=True)
    lm_head = 2.0 * tokens * d * vocab_size
    return size.num_layers * (projections + ffn + attn) + lm_head


def mha_forward_flops(batch: int, seq: int, embed_dim: int, num_heads: int, variant: str, num_features: int | None) -> float:
    """One forward of the ``mha`` study's layer (non-causal self-attention)."""
    head_dim = embed_dim // num_heads
    projections = 4 * 2.0 * batch * seq * embed_dim * embed_dim
    if variant.startswith("exact"):
        return projections + attention_core_flops(batch, num_heads, seq, head_dim, causal=False)
    if variant == "performer":
        m = int(num_features or 0)
        features = 2 * (2.0 * batch * num_heads * seq * head_dim * m)  # φ(q), φ(k): x·Wᵀ
        kv = 2.0 * batch * num_heads * seq * m * head_dim  # Σ φ(k) vᵀ
        out = 2.0 * batch * num_heads * seq * m * head_dim  # φ(q)ᵀ (Σ φ(k) vᵀ)
        norm = 2.0 * batch * num_heads * seq * m  # φ(q)ᵀ Σ φ(k)
        return projections + features + kv + out + norm
    raise ValueError(f"unknown mha variant {variant!r}")


def phase_flops(forward: float, mode: str, backward_factor: float = BACKWARD_FACTOR) -> dict[str, float | None]:
    """FLOPs credited to each timed phase of a mode, from one forward's FLOPs.

    ``inference``: the forward is the whole step. ``train``: forward, backward
    (``backward_factor`` × forward), the optimizer step (no matmul FLOPs: empty,
    so no TFLOP/s is derived for it) and the whole step; ``forward_backward``
    is the flash study's fused pass. Phase names match ``measure.timing``.
    """
    if mode == "inference":
        return {"forward": forward, "step": forward}
    both = (1 + backward_factor) * forward
    return {"forward": forward, "backward": backward_factor * forward, "optimizer_step": None, "step": both, "forward_backward": both}


def attention_phase_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool) -> dict[str, float | None]:
    """FLOPs of each timed phase of an attention core's training pass, the literature's way (module doc)."""
    return phase_flops(attention_core_flops(batch, heads, seq, head_dim, causal), "train", ATTENTION_BACKWARD_FACTOR)


def attention_row_flops(phase: object, shape: tuple[object, ...]) -> float | None:
    """:func:`attention_phase_flops` of a result row's ``phase`` and (batch, heads, seq, head_dim, causal) shape.

    None where the row cannot say (a failure row, a column a run from before it existed lacks):
    the merge then keeps the row's stored FLOPs.
    """
    if not isinstance(phase, str) or any(_missing(v) for v in shape):
        return None
    batch, heads, seq, head_dim, causal = shape
    return attention_phase_flops(int(batch), int(heads), int(seq), int(head_dim), bool(int(causal))).get(phase)


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""
