"""Exact attention cores and the registry that names them.

Every function takes batch-first ``q, k, v`` of shape ``(..., L, d)`` (any
leading batch/head dims) and returns ``(..., L, d)``; all are autograd-capable.
The causal mask is aligned top-left: key ``j`` is hidden from query ``i`` when
``j > i``.

Dispatch: ``resolve(impl, activation)`` looks ``impl`` up in ``cs336sys.catalog``
and answers (callable, context factory), or ``None`` for an activation the
implementation lacks (sdpa has no ReLU); ``get_attention`` answers the callable
of a core the attention and LM studies offer. An implementation's module is
imported here, by name, only when asked for: Triton stays optional.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F

from cs336sys import catalog
from cs336sys.catalog import ACTIVATIONS
from cs336sys.models.annotate import annotate

AttentionFn = Callable[..., torch.Tensor]
ContextFactory = Callable[[], AbstractContextManager]


@functools.lru_cache(maxsize=16)
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


@functools.cache  # torch.compile once per (implementation, activation) in a process, as every layer shares it
def _callable(impl: str, activation: str) -> AttentionFn:
    line = catalog.lookup(impl)
    fn = getattr(importlib.import_module(line.module), line.entry[activation])
    fn = functools.partial(fn, **line.options) if line.options else fn
    return torch.compile(fn) if line.compile else fn


def _context(backend: str) -> ContextFactory:
    if not backend:
        return nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = SDPBackend.__members__.get(backend)
    if chosen is None:
        raise ValueError(f"SDPA backend {backend!r} (a catalog line's `backend`) is not one of {', '.join(SDPBackend.__members__)}")
    return lambda: sdpa_kernel(chosen)


def resolve(impl: str, activation: str = "softmax", kind: str | None = None) -> tuple[AttentionFn, ContextFactory] | None:
    """(attention callable, factory of the context to call it in) of catalog implementation ``impl``;
    ``None`` where it has no ``activation``. ``kind``: refuse names that a study of that kind does not offer."""
    line = catalog.lookup(impl, kind)
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    if activation not in line.activations:
        return None
    return _callable(impl, activation), _context(line.backend)


def get_attention(impl: str, activation: str = "softmax") -> AttentionFn | None:
    """The attention core named ``impl`` for ``activation``; ``None`` if that pair does not exist."""
    found = resolve(impl, activation, kind=catalog.CORE)  # the LM kind offers a subset of the attention cores
    return found[0] if found else None
