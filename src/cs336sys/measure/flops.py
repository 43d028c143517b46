"""Analytic FLOP counts: matmul FLOPs only, 2·m·n·k per matmul.

Convention (also stated in the report): elementwise ops, softmax and norms are
not counted; causal attention's QKᵀ and PV are counted at half (the masked half
is not useful work); a backward pass costs ``BACKWARD_FACTOR`` = 2× its forward
(grad w.r.t. inputs and w.r.t. weights, no recomputation), so a training step
is 3× a forward. Kernels that recompute in backward (FlashAttention) therefore
do more work than they are credited for — the usual "model FLOPs" convention.
"""

from __future__ import annotations

from cs336sys.models.sizes import ModelSize

BACKWARD_FACTOR = 2.0


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


def phase_flops(forward: float, mode: str) -> dict[str, float | None]:
    """FLOPs credited to each timed phase of a mode, from one forward's FLOPs.

    ``inference``: the forward is the whole step. ``train``: forward, backward
    (``BACKWARD_FACTOR`` × forward), the optimizer step (no matmul FLOPs: empty,
    so no TFLOP/s is derived for it) and the whole step; ``forward_backward``
    is the flash study's fused pass. Phase names match ``measure.timing``.
    """
    if mode == "inference":
        return {"forward": forward, "step": forward}
    both = (1 + BACKWARD_FACTOR) * forward
    return {"forward": forward, "backward": BACKWARD_FACTOR * forward, "optimizer_step": None, "step": both, "forward_backward": both}
