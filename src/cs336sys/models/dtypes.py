"""Precision settings shared by every study.

- ``fp32``: fp32 tensors, TF32 matmuls OFF (strict IEEE fp32; PyTorch's default).
- ``tf32``: fp32 tensors, TF32 tensor-core matmuls ON (what the course's reference timings use).
- ``bf16``: the course's mixed precision: fp32 parameters, forward and loss under
  ``torch.autocast(dtype=torch.bfloat16)``, backward outside it. Studies that feed
  raw tensors to an attention core (attention, flash) cast the inputs to bf16 instead.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from cs336sys.models.variants import PRECISIONS

_TENSOR_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)}")
    return precision


def tensor_dtype(precision: str) -> torch.dtype:
    return _TENSOR_DTYPE[check_precision(precision)]


def set_matmul_precision(precision: str) -> None:
    """TF32 on only for ``tf32`` (bf16 autocast runs its matmuls in bf16 either way)."""
    allow = check_precision(precision) == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def autocast(precision: str, device: torch.device, cache: bool = True) -> ContextManager:
    """The autocast context for a model's forward + loss at ``precision`` (a no-op unless bf16).

    ``cache=False`` for CUDA-graph capture: autocast's cache of bf16 weight copies
    lives outside the graph's memory pool, and a replay would read freed copies.
    """
    if check_precision(precision) == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return contextlib.nullcontext()
