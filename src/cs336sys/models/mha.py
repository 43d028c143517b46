"""The ``mha`` study's multi-head self-attention layer (the ReLU/SoftMax attention benchmark pages).

Variants:
- ``exact-eager``: scores materialised as (batch, heads, L, L), the path of
  ``nn.MultiheadAttention(need_weights=True)``; kernel softmax or relu (Wortsman).
- ``exact-sdpa``: ``scaled_dot_product_attention``; softmax only.
- ``performer``: FAVOR+ with the relu or softmax feature map and m random features.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from einops import rearrange

from cs336sys.models.variants import MHA_CORES, MHA_VARIANTS, PERFORMER_KERNELS, mha_is_valid

VARIANTS = MHA_VARIANTS
is_valid = mha_is_valid


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        variant: str = "exact-eager",
        kernel: str = "softmax",
        num_features: int | None = None,
        seed: int = 0,
    ):
        super().__init__()
        if not is_valid(variant, kernel):
            raise ValueError(
                f"invalid mha variant × kernel {variant} × {kernel}; variants {VARIANTS}, kernels {PERFORMER_KERNELS} (sdpa is softmax only)"
            )
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.variant, self.kernel = num_heads, variant, kernel
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)  # q, k, v as nn.MultiheadAttention packs them
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        if variant == "performer":
            from cs336sys.models.performer import orthogonal_features  # only Performer cells hash it (studies.mha)

            if not num_features:
                raise ValueError("performer needs num_features (m)")
            self.register_buffer("features", orthogonal_features(num_features, embed_dim // num_heads, seed))
        self._core = self._make_core()

    def _make_core(self):
        if self.variant == "performer":
            from cs336sys.models.performer import performer_attention

            return lambda q, k, v: performer_attention(q, k, v, self.features, self.kernel)
        from cs336sys.models.attention import get_attention

        core = get_attention(MHA_CORES[self.variant], self.kernel)
        return lambda q, k, v: core(q, k, v, is_causal=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = rearrange(self.in_proj(x), "b l (three h d) -> three b h l d", three=3, h=self.num_heads)
        out = self._core(q, k, v)  # (b, h, l, d)
        return self.out_proj(rearrange(out, "b h l d -> b l (h d)"))
