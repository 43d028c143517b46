"""The one table of named model sizes (CS336 assignment 2, Table 1).

Extra sizes (e.g. ``tiny`` for CPU runs) come from a config's ``extra_sizes``
and are merged with :func:`resolve_size`; the built-in table is never edited
at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

VOCAB_SIZE = 10_000  # the handout's benchmarking vocabulary
BATCH_SIZE = 4  # the handout's benchmarking batch


@dataclass(frozen=True)
class ModelSize:
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int


MODEL_SIZES: dict[str, ModelSize] = {
    "small": ModelSize(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": ModelSize(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": ModelSize(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": ModelSize(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": ModelSize(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}


def known_sizes(extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, ModelSize]:
    sizes = dict(MODEL_SIZES)
    for name, spec in (extra or {}).items():
        sizes[name] = ModelSize(**{k: int(v) for k, v in spec.items()})
    return sizes


def resolve_size(name: str, extra: Mapping[str, Mapping[str, Any]] | None = None) -> ModelSize:
    """Look a size up by name; an unknown name raises ValueError listing the known ones."""
    sizes = known_sizes(extra)
    if name not in sizes:
        raise ValueError(f"unknown model size {name!r}; known sizes: {', '.join(sizes)}")
    size = sizes[name]
    if size.d_model % size.num_heads:
        raise ValueError(f"model size {name!r}: d_model {size.d_model} is not divisible by num_heads {size.num_heads}")
    return size


def parameter_count(size: ModelSize, vocab_size: int = VOCAB_SIZE) -> int:
    """Analytic count of TransformerLM parameters (embedding + blocks + final norm + untied head)."""
    d, f = size.d_model, size.d_ff
    per_layer = 4 * d * d + 3 * d * f + 2 * d  # q,k,v,o + SwiGLU w1,w2,w3 + two RMSNorm gains
    return vocab_size * d + size.num_layers * per_layer + d + d * vocab_size
