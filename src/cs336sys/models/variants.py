"""The names of every model variant and which combinations exist, importable without torch.

The workflow builds its grids at parse time and the CLI checks its flags before
anything runs: neither may pay for ``import torch`` (seconds on a GPU host) just
to learn that SDPA has no ReLU. The attention implementations' names come
from ``cs336sys.catalog``; the modules that implement the other variants take
their names from here, so a name is defined once.
"""

from __future__ import annotations

from cs336sys import catalog

PRECISIONS = ("fp32", "tf32", "bf16")
IMPLS = catalog.names(catalog.CORE)  # the attention cores (models.attention), from the catalog
MHA_VARIANTS = ("exact-eager", "exact-sdpa", "performer")
MHA_CORES = {"exact-eager": "eager", "exact-sdpa": "sdpa"}  # the attention core (catalog line) an exact variant runs
PERFORMER_KERNELS = ("relu", "softmax")
OPTIMIZERS = ("course", "fused")
MODES = ("inference", "train")


def is_valid(impl: str, activation: str) -> bool:
    """Whether the attention core (impl, activation) exists: SDPA has no ReLU."""
    return impl in catalog.names(catalog.CORE) and activation in catalog.lookup(impl).activations


def needs_cuda(impl: str) -> bool:
    """Triton kernels (ours, and the tutorial's in the flash study) run on CUDA (on CPU only under TRITON_INTERPRET=1, for tests)."""
    return impl in catalog.names() and catalog.lookup(impl).needs_cuda


def mha_is_valid(variant: str, kernel: str) -> bool:
    """Whether the mha layer (variant, kernel) exists: exact-sdpa is softmax only."""
    return variant in MHA_VARIANTS and kernel in PERFORMER_KERNELS and not (variant == "exact-sdpa" and kernel == "relu")
