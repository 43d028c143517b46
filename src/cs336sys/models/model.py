"""Pre-norm decoder-only Transformer LM, equivalent to CS336's ``BasicsTransformerLM``.

token embedding → num_layers × [x + attn(ln1(x)); h + ffn(ln2(h))] → RMSNorm → untied LM head.
No biases, no dropout. The attention core is chosen by name from
:mod:`cs336sys.models.attention`, so one model serves every implementation and the
profiler ranges live in the attention functions, not in a copy of the model.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from einops import rearrange

from cs336sys.models.attention import get_attention
from cs336sys.models.sizes import ModelSize


class Linear(nn.Module):
    """y = x Wᵀ with W trunc-normal, std √(2/(d_in+d_out)), cut at ±3σ (the course's init)."""

    def __init__(self, d_in: int, d_out: int, device=None, dtype=None):
        super().__init__()
        std = math.sqrt(2.0 / (d_in + d_out))
        self.weight = nn.Parameter(torch.empty(d_out, d_in, device=device, dtype=dtype))
        if self.weight.device.type != "meta":
            nn.init.trunc_normal_(self.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model, device=device, dtype=dtype))
        if self.weight.device.type != "meta":
            nn.init.trunc_normal_(self.weight, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """RMSNorm with eps 1e-5, computed in fp32 and cast back to the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x * rms * self.weight).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """RoPE on interleaved pairs (x0,x1), (x2,x3), …; one cos/sin cache shared by all layers."""

    def __init__(self, context_length: int, head_dim: int, theta: float = 10000.0, device=None):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(context_length, device=device, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)  # (T, hd/2)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[positions], self.sin[positions]  # (T, hd/2)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device, dtype)
        self.w2 = Linear(d_ff, d_model, device, dtype)
        self.w3 = Linear(d_model, d_ff, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class CausalMultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, rope: RotaryEmbedding, attention: str = "eager", device=None, dtype=None):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = Linear(d_model, d_model, device, dtype)
        self.k_proj = Linear(d_model, d_model, device, dtype)
        self.v_proj = Linear(d_model, d_model, device, dtype)
        self.output_proj = Linear(d_model, d_model, device, dtype)
        self.rope = rope
        core = get_attention(attention, "softmax")
        if core is None:  # pragma: no cover - every impl has a softmax core
            raise ValueError(f"attention {attention!r} has no softmax core")
        self.core = core

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq_len = x.shape[-2]
        q, k, v = (rearrange(p(x), "b t (h d) -> b h t d", h=self.num_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        positions = torch.arange(seq_len, device=x.device)
        q, k = self.rope(q, positions), self.rope(k, positions)
        out = self.core(q, k, v, is_causal=True)  # (b, h, t, d)
        return self.output_proj(rearrange(out, "b h t d -> b t (h d)"))


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, rope: RotaryEmbedding, attention: str, device=None, dtype=None):
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = CausalMultiHeadSelfAttention(d_model, num_heads, rope, attention, device, dtype)
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.ln1(x))
        return h + self.ffn(self.ln2(h))


class TransformerLM(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        d_ff: int,
        rope_theta: float = 10000.0,
        attention: str = "eager",
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.context_length = context_length
        self.token_embeddings = Embedding(vocab_size, d_model, device, dtype)
        rope = RotaryEmbedding(context_length, d_model // num_heads, rope_theta, device)
        self.layers = nn.ModuleList(TransformerBlock(d_model, num_heads, d_ff, rope, attention, device, dtype) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device, dtype)

    @classmethod
    def from_size(cls, size: ModelSize, vocab_size: int, context_length: int, **kwargs) -> TransformerLM:
        return cls(vocab_size, context_length, size.d_model, size.num_layers, size.num_heads, size.d_ff, **kwargs)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embeddings(token_ids)  # (b, t, d_model)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))  # (b, t, vocab)

    def num_parameters(self) -> int:
        # The RoPE cache is a buffer, not a parameter, and each block shares it.
        return sum(p.numel() for p in self.parameters())
