"""Performer / FAVOR+ linear attention (Choromanski et al. 2021), non-causal.

    out = φ(q)ᵀ (Σ_j φ(k_j) v_jᵀ) / φ(q)ᵀ Σ_j φ(k_j)

with W an (m × d) fixed orthogonal random projection (seeded). Feature maps:
- ``relu``:    φ(x) = relu(W x / √m) + 1e-5
- ``softmax``: φ(x) = exp(W x' − ‖x'‖²/2) / √m with x' = x·d^(−1/4), the positive
  random features whose inner product estimates exp(qᵀk/√d) without bias.
Cost and memory are linear in the sequence length L: nothing L×L is formed.
"""

from __future__ import annotations

import math

import torch

from cs336sys.models.variants import PERFORMER_KERNELS

KERNELS = PERFORMER_KERNELS
RELU_EPS = 1e-5


def orthogonal_features(num_features: int, dim: int, seed: int = 0) -> torch.Tensor:
    """(m, d) matrix of stacked orthogonal blocks with rows rescaled to Gaussian norms (FAVOR+)."""
    gen = torch.Generator().manual_seed(seed)
    blocks, remaining = [], num_features
    while remaining > 0:
        q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen))
        blocks.append(q.T[: min(dim, remaining)])
        remaining -= dim
    w = torch.cat(blocks)  # orthonormal rows within each block
    norms = torch.randn(num_features, dim, generator=gen).norm(dim=1, keepdim=True)
    return w * norms  # rows ~ marginally Gaussian, orthogonal within a block


def feature_map(x: torch.Tensor, w: torch.Tensor, kernel: str, is_query: bool) -> torch.Tensor:
    """φ(x) for x of shape (..., L, d) → (..., L, m)."""
    m = w.shape[0]
    if kernel == "relu":
        return torch.relu(x @ w.T / math.sqrt(m)) + RELU_EPS
    if kernel == "softmax":
        x = x * x.shape[-1] ** -0.25
        proj = x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True)  # (..., L, m)
        # Stabiliser: a per-row max for queries cancels in the ratio; keys need one shared max.
        stab = proj.amax(-1, keepdim=True) if is_query else proj.amax(dim=(-2, -1), keepdim=True)
        return torch.exp(proj - stab.detach()) / math.sqrt(m)
    raise ValueError(f"unknown performer kernel {kernel!r}; known: {', '.join(KERNELS)}")


def performer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, kernel: str = "relu") -> torch.Tensor:
    """FAVOR+ attention for q, k, v of shape (..., L, d); ``w`` from :func:`orthogonal_features`."""
    w = w.to(device=q.device, dtype=q.dtype)
    q_prime, k_prime = feature_map(q, w, kernel, True), feature_map(k, w, kernel, False)  # (..., L, m)
    kv = k_prime.transpose(-2, -1) @ v  # (..., m, d)
    normaliser = q_prime @ k_prime.sum(dim=-2).unsqueeze(-1)  # (..., L, 1)
    return (q_prime @ kv) / normaliser
