"""Exact attention cores and the registry that names them.

Every function takes batch-first ``q, k, v`` of shape ``(..., L, d)`` (any
leading batch/head dims) and returns ``(..., L, d)``; all are autograd-capable.
The causal mask is aligned top-left: key ``j`` is hidden from query ``i`` when
``j > i``.

Registry: ``get_attention(impl, activation)`` answers a callable, or ``None``
for a combination that does not exist (sdpa has no ReLU); this is the one
place that knows which combinations are valid.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache, lru_cache

import torch
import torch.nn.functional as F

from cs336sys.models.annotate import annotate
from cs336sys.models.variants import ACTIVATIONS, IMPLS, is_valid, needs_cuda  # noqa: F401  (re-exported)

AttentionFn = Callable[..., torch.Tensor]


@lru_cache(maxsize=16)
def _causal_mask(seq_len: int, device: torch.device) -> torch.Tensor:
    # One mask per (L, device), shared by all layers and calls; True = hidden.
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """The course's eager attention: materialised scores → masked softmax → matmul.

    Saved for backward: the softmax output P (one L×L tensor per batch×head,
    in the compute dtype), shared by softmax's and the final matmul's backward.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    with annotate("computing attention scores"):
        scores = (q @ k.transpose(-2, -1)) * scale  # (..., L, L)
        if is_causal:
            scores = scores.masked_fill(_causal_mask(q.shape[-2], q.device), float("-inf"))
    with annotate("computing softmax"):
        probs = torch.softmax(scores, dim=-1)
    with annotate("final matmul"):
        return probs @ v


def relu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """ReLU attention, Wortsman et al. 2023: ``relu(QKᵀ/√d) / L`` with causal positions set to 0.

    ``L`` is the number of keys (the sequence length), also under a causal
    mask. The 1/L factor is folded into the score scale before the ReLU
    (relu(c·x) = c·relu(x) for c > 0), so the only L×L tensor kept for
    backward is the ReLU output, shared by ReLU's and the final matmul's backward.
    """
    seq_len = k.shape[-2]
    scale = 1.0 / (math.sqrt(q.shape[-1]) * seq_len)
    with annotate("computing attention scores"):
        scores = (q @ k.transpose(-2, -1)) * scale
        if is_causal:
            scores = scores.masked_fill(_causal_mask(q.shape[-2], q.device), 0.0)
    with annotate("computing softmax"):  # the activation's range keeps the handout's name
        probs = torch.relu(scores)
    with annotate("final matmul"):
        return probs @ v


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """PyTorch's fused ``scaled_dot_product_attention`` (backend chosen by PyTorch)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


_EAGER: dict[str, AttentionFn] = {"softmax": softmax_attention, "relu": relu_attention}


@cache
def _compiled(activation: str) -> AttentionFn:
    return torch.compile(_EAGER[activation])


def _triton(activation: str) -> AttentionFn:
    from cs336sys.models import triton_attention  # imported lazily: Triton is optional

    return {"softmax": triton_attention.flash_attention, "relu": triton_attention.relu_attention_fused}[activation]


def get_attention(impl: str, activation: str = "softmax") -> AttentionFn | None:
    """The attention core named ``impl`` for ``activation``; ``None`` if that pair does not exist."""
    if impl not in IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r}; known: {', '.join(IMPLS)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    if impl == "eager":
        return _EAGER[activation]
    if impl == "compiled":
        return _compiled(activation)
    if impl == "sdpa":
        return sdpa_attention if activation == "softmax" else None
    return _triton(activation)
