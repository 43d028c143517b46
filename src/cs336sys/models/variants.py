"""The names of every model variant and which combinations exist, importable without torch.

The workflow builds its grids at parse time and the CLI checks its flags before
anything runs: neither may pay for ``import torch`` (seconds on a GPU host) just
to learn that SDPA has no ReLU. The modules that implement these variants take
their names from here, so a name is defined once.
"""

from __future__ import annotations

PRECISIONS = ("fp32", "tf32", "bf16")
ACTIVATIONS = ("softmax", "relu")
IMPLS = ("eager", "compiled", "sdpa", "triton")  # attention cores (models.attention)
LM_IMPLS = ("eager", "sdpa", "triton")  # attention inside TransformerLM
FLASH_IMPLS = ("triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "eager", "compiled")
MHA_VARIANTS = ("exact-eager", "exact-sdpa", "performer")
PERFORMER_KERNELS = ("relu", "softmax")
OPTIMIZERS = ("course", "fused")
MODES = ("inference", "train")


def is_valid(impl: str, activation: str) -> bool:
    """Whether the attention core (impl, activation) exists: SDPA has no ReLU."""
    return impl in IMPLS and activation in ACTIVATIONS and not (impl == "sdpa" and activation == "relu")


def needs_cuda(impl: str) -> bool:
    """Our Triton kernels run on CUDA (on CPU only under TRITON_INTERPRET=1, for tests)."""
    return impl == "triton"


def mha_is_valid(variant: str, kernel: str) -> bool:
    """Whether the mha layer (variant, kernel) exists: exact-sdpa is softmax only."""
    return variant in MHA_VARIANTS and kernel in PERFORMER_KERNELS and not (variant == "exact-sdpa" and kernel == "relu")
