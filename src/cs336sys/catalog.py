"""Ground floor, torch-free: every attention implementation a study can select, declared once.

One :class:`Impl` line per implementation says where its code lives, which
callable to call for each activation, which kinds of study offer it (:data:`KINDS`:
every study of a kind offers it, so a new study of a kind gets its implementations
with no edit here), whether it needs CUDA and which shapes it cannot run. Everything else follows from the line:
the names ``models.variants`` exports, dispatch (``models.attention.resolve``
imports ``module`` only when asked, so Triton stays optional), the rerun
hashes (a cell hashes an implementation's module only when its ``impl`` axis
selects it: ``studies.cell_modules``), the roofline's bytes moved (``traffic``,
counted by ``measure.bytes_moved``) and the answers' split of ours from PyTorch's. Importing this module imports nothing heavy.

A later implementation, built in or named by a user, is one more line; a user's lines join a
:class:`Catalog` view of the built-in ones (``plugins.offered``), and only a measuring child
registers them in its own process (:func:`register`). A name can be declared once only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# reference: someone else's kernel we compare against; user: a config's plugins.attention (cs336sys.plugins)
FAMILIES = ("ours", "pytorch", "reference", "user")
# how an implementation's kernels move bytes to and from GPU memory (measure.bytes_moved counts each):
# eager: every op reads its inputs and writes its output; compiled: Inductor fuses the elementwise ops
# between the matmuls; fused: one kernel that never writes the L×L matrices. "" (the default): not counted
TRAFFIC = ("eager", "compiled", "fused")
ACTIVATIONS = ("softmax", "relu")
# The kinds of study whose `impl` axis names an implementation (a study's `Study.kind`): what its cells run.
LM = "lm"  # TransformerLM steps: attention inside the model, softmax, causal; a step is batch × context tokens
CORE = "attention-core"  # one attention core on (batch, heads, L, d) tensors, softmax or ReLU, causal or not
FUSED = "fused-attention"  # causal softmax attention against fused kernels and SDPA's backends, do_bench
KINDS = (LM, CORE, FUSED)
SOFTMAX_KINDS = (LM, FUSED)  # an implementation offered to these needs a softmax entry
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")  # a name is part of cell ids and result paths


@dataclass(frozen=True)
class Impl:
    """One attention implementation: ``(q, k, v, is_causal=…) -> o`` on ``(..., L, d)`` tensors."""

    name: str  # the `impl` axis value: config, cell id, CSV column, CLI flag
    family: str  # one of FAMILIES
    module: str  # dotted path of the module holding its code (imported at lookup; hashed into its cells)
    entry: Mapping[str, str]  # activation → attribute of `module` to call; its keys are the activations offered
    kinds: tuple[str, ...]  # the kinds of study whose `impl` axis offers it (of KINDS)
    about: str  # how a sentence names it: "unsupported by <about>: …"
    needs_cuda: bool = False  # a Triton kernel: on CPU only under TRITON_INTERPRET=1
    options: Mapping[str, Any] = field(default_factory=dict)  # keyword arguments bound to the entry
    compile: bool = False  # wrap the entry in torch.compile (once per process)
    backend: str = ""  # force this SDPA backend (a torch.nn.attention.SDPBackend member) around every call
    unsupported: Callable[..., str] | None = None  # (seq_len, head_dim, precision) → why not; "" where it runs
    traffic: str = ""  # how its kernels move bytes (one of TRAFFIC, counted by measure.bytes_moved); "": not counted
    tile: int = 16  # its kernels' narrowest tile: the correctness check's length is ragged for tiles this wide (measure.correctness)

    def __post_init__(self) -> None:
        # read-only, so that a registered line cannot change under the cells that hashed it
        object.__setattr__(self, "entry", MappingProxyType(dict(self.entry)))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "kinds", tuple(self.kinds))

    @property
    def activations(self) -> tuple[str, ...]:
        return tuple(self.entry)

    def why_unsupported(self, seq_len: int, head_dim: int, precision: str) -> str:
        """Why this implementation cannot run that shape; '' where it can."""
        return self.unsupported(seq_len=seq_len, head_dim=head_dim, precision=precision) if self.unsupported else ""


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
TUTORIAL_PRECISIONS = ("bf16",)  # of variants.PRECISIONS: fp32 would run its dots as TF32, not strict fp32


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


_CORES = "cs336sys.models.attention"
_OURS = "cs336sys.models.triton_attention"
_TUTORIAL = "cs336sys.models.triton_tutorial_attention"
_EAGER = {"softmax": "softmax_attention", "relu": "relu_attention"}
_SDPA = {"softmax": "sdpa_attention"}  # SDPA has no ReLU

# One line per implementation; the order is the order error messages list the names in. `fmt: skip` keeps
# each on one line: a diff, and a cell's rerun note (`catalog.py:<name>`), then shows one implementation.
_BUILT_IN = (
    Impl("eager", "pytorch", _CORES, _EAGER, (LM, CORE, FUSED), "eager PyTorch attention", traffic="eager"),
    Impl("compiled", "pytorch", _CORES, _EAGER, (CORE, FUSED), "torch.compile of eager attention", compile=True, traffic="compiled"),
    Impl("sdpa", "pytorch", _CORES, _SDPA, (LM, CORE), "PyTorch's scaled_dot_product_attention", traffic="fused"),
    Impl("triton", "ours", _OURS, {"softmax": "flash_attention", "relu": "relu_attention_fused"}, (LM, CORE, FUSED), "our Triton FlashAttention-2 kernel", needs_cuda=True, traffic="fused", tile=32),
    Impl("triton-atomic", "ours", _OURS, {"softmax": "flash_attention"}, (FUSED,), "our Triton kernel with the atomic-dQ backward", needs_cuda=True, options={"atomic_dq": True}, traffic="fused", tile=32),
    Impl("tutorial", "reference", _TUTORIAL, {"softmax": "tutorial_attention"}, (FUSED,), "the Triton tutorial kernel", needs_cuda=True, unsupported=tutorial_unsupported, traffic="fused"),
    Impl("sdpa-flash", "pytorch", _CORES, _SDPA, (FUSED,), "SDPA's FlashAttention backend", backend="FLASH_ATTENTION", traffic="fused"),
    Impl("sdpa-cudnn", "pytorch", _CORES, _SDPA, (FUSED,), "SDPA's cuDNN backend", backend="CUDNN_ATTENTION", traffic="fused"),
    Impl("sdpa-efficient", "pytorch", _CORES, _SDPA, (FUSED,), "SDPA's memory-efficient backend", backend="EFFICIENT_ATTENTION", traffic="fused"),
)  # fmt: skip

_IMPLS: dict[str, Impl] = {}  # this process's lines: the built-in ones, and a measuring child's plug-ins (register)


def _check(impl: Impl, declared: Mapping[str, Impl]) -> None:
    """Refuse a name declared already or a line that names unknown things."""
    if impl.name in declared:
        raise ValueError(f"attention implementation {impl.name!r} is declared already (in {declared[impl.name].module}); pick another name")
    problems = []
    if not NAME.fullmatch(impl.name):
        problems.append(f"name {impl.name!r} (allowed: lower-case letters, digits and '-', pattern {NAME.pattern})")
    if impl.family not in FAMILIES:
        problems.append(f"family {impl.family!r} (allowed: {', '.join(FAMILIES)})")
    if not impl.entry or set(impl.entry) - set(ACTIVATIONS):
        problems.append(f"entry activations {sorted(impl.entry)} (allowed: one or more of {', '.join(ACTIVATIONS)})")
    if not impl.kinds or set(impl.kinds) - set(KINDS):
        problems.append(f"kinds {list(impl.kinds)} (allowed: one or more of {', '.join(KINDS)})")
    if impl.traffic and impl.traffic not in TRAFFIC:
        problems.append(f"traffic {impl.traffic!r} (allowed: {', '.join(TRAFFIC)}, or '' where its bytes are not counted)")
    if "softmax" not in impl.entry and set(impl.kinds) & set(SOFTMAX_KINDS):
        problems.append(f"no softmax entry, but kinds {list(impl.kinds)} run softmax attention")
    if problems:
        raise ValueError(f"attention implementation {impl.name!r}: invalid " + "; ".join(problems))


class Catalog:
    """Implementation lines by name, read-only: the built-in ones (:data:`BUILT_IN`), or those plus a config's
    plug-ins (``plugins.offered``). Validation answers one with the config, and what plans cells, lists a
    study's names or builds its schema asks it; nothing registers into the process to let them see the names."""

    def __init__(self, lines: Mapping[str, Impl]) -> None:
        self._lines = lines

    def plus(self, lines: Iterable[Impl]) -> Catalog:
        """These lines and ``lines`` (each checked as :func:`register` checks it)."""
        out = dict(self._lines)
        for impl in lines:
            _check(impl, out)
            out[impl.name] = impl
        return Catalog(MappingProxyType(out))

    def impls(self, kind: str | None = None) -> tuple[Impl, ...]:
        """The implementations a study of ``kind`` offers (all of them without one), in declaration order."""
        if kind is not None and kind not in KINDS:  # a study's name where its kind belongs would offer nothing, unseen
            raise ValueError(f"unknown kind of study {kind!r}; known: {', '.join(KINDS)}")
        return tuple(i for i in self._lines.values() if kind is None or kind in i.kinds)

    def names(self, kind: str | None = None) -> tuple[str, ...]:
        return tuple(i.name for i in self.impls(kind))

    def lookup(self, name: str, kind: str | None = None) -> Impl:
        """The implementation ``name`` (one a study of ``kind`` offers, if given); the error names the allowed ones."""
        allowed = self.names(kind)
        if name not in allowed:
            raise ValueError(f"unknown {kind or 'attention'} implementation {name!r}; known: {', '.join(allowed)}")
        return self._lines[name]


def register(impl: Impl) -> Impl:
    """Add ``impl`` to this process's lines (a measuring child's plug-ins: ``plugins.activate``); refuse a name
    declared already or a line that names unknown things."""
    _check(impl, _IMPLS)
    _IMPLS[impl.name] = impl
    return impl


for _impl in _BUILT_IN:
    register(_impl)
BUILT_IN = Catalog(MappingProxyType(dict(_IMPLS)))
_PROCESS = Catalog(_IMPLS)  # this process's lines, as dispatch asks them: a live view (a child's registrations show)
impls, names, lookup = _PROCESS.impls, _PROCESS.names, _PROCESS.lookup


def unregister(name: str) -> None:
    """Remove a user's line (``cs336sys.plugins`` replaces them when a cell's plug-ins are activated again); built-ins stay."""
    if name in _IMPLS and _IMPLS[name].family != "user":
        raise ValueError(f"attention implementation {name!r} is built in ({_IMPLS[name].family}); only user lines can be removed")
    _IMPLS.pop(name, None)
