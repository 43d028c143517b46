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
# tutorial: Triton's fused-attention tutorial kernel (models.triton_tutorial_attention), a reference point;
# triton-atomic: ours with the one-kernel backward that adds dQ atomically (flash_attention(atomic_dq=True))
FLASH_IMPLS = ("triton", "triton-atomic", "tutorial", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "eager", "compiled")
MHA_VARIANTS = ("exact-eager", "exact-sdpa", "performer")
PERFORMER_KERNELS = ("relu", "softmax")
OPTIMIZERS = ("course", "fused")
MODES = ("inference", "train")


def is_valid(impl: str, activation: str) -> bool:
    """Whether the attention core (impl, activation) exists: SDPA has no ReLU."""
    return impl in IMPLS and activation in ACTIVATIONS and not (impl == "sdpa" and activation == "relu")


def needs_cuda(impl: str) -> bool:
    """Triton kernels (ours, and the tutorial's in the flash study) run on CUDA (on CPU only under TRITON_INTERPRET=1, for tests)."""
    return impl in ("triton", "triton-atomic", "tutorial")


# What Triton's fused-attention tutorial kernel handles (flash impl ``tutorial``,
# models.triton_tutorial_attention), asked by the flash study's valid cells, its measurement and the
# kernel's entry point. Its forward asserts head_dim in {16, 32, 64, 128, 256} but also static_asserts
# BLOCK_N <= head_dim with BLOCK_N >= 32, so 16 never compiles (and tl.arange needs a power of two).
# No tile is masked: the backward asserts seq % 128 == 0, and in the forward the row-statistics
# stores and the tensor descriptors (over all heads' rows at once) would run into the next head. The
# kernels are written for 16-bit inputs (fp16; bf16 by our adaptation). 256 is left out: upstream
# tests and benchmarks only 64 and 128, and the backward's one fixed config (BLOCK_N1 128, 5 stages)
# would need about twice the registers a thread has for its fp32 dK and dV tiles at d 256.
TUTORIAL_HEAD_DIMS = (32, 64, 128)
TUTORIAL_SEQ_MULTIPLE = 128
TUTORIAL_PRECISIONS = ("bf16",)  # of PRECISIONS: fp32 would run its dots as TF32, not strict fp32


def tutorial_unsupported(seq_len: int, head_dim: int, precision: str = "bf16") -> str:
    """Why the tutorial kernel cannot run (seq_len, head_dim, precision); '' where it can."""
    why = []
    if precision not in TUTORIAL_PRECISIONS:
        why.append(f"precision {precision} (the tutorial kernel takes 16-bit inputs: {', '.join(TUTORIAL_PRECISIONS)} here)")
    if head_dim not in TUTORIAL_HEAD_DIMS:
        why.append(f"head_dim {head_dim} (it handles {', '.join(map(str, TUTORIAL_HEAD_DIMS))})")
    if seq_len <= 0 or seq_len % TUTORIAL_SEQ_MULTIPLE:
        why.append(f"seq_len {seq_len} (it needs a multiple of {TUTORIAL_SEQ_MULTIPLE}: its tiles are not masked)")
    return "; ".join(why)


def mha_is_valid(variant: str, kernel: str) -> bool:
    """Whether the mha layer (variant, kernel) exists: exact-sdpa is softmax only."""
    return variant in MHA_VARIANTS and kernel in PERFORMER_KERNELS and not (variant == "exact-sdpa" and kernel == "relu")
