"""Fused attention in Triton: FlashAttention-2 softmax attention and fused ReLU attention.

Softmax attention follows the FlashAttention-2 forward of CS336 assignment 2 (Algorithm 1): a
program owns one tile of queries and streams tiles of K and V through an online softmax (running
row max m and row sum l, fp32), then saves O and the row logsumexp L. The backward recomputes
P = exp(S - L) tile by tile: D = rowsum(O ∘ dO), one program per K/V tile for dK and dV, and one
program per Q tile for dQ (no atomics, so results are deterministic). flash_attention(atomic_dq=True)
runs one backward kernel instead, whose key-tile programs also add their share of dQ atomically.

ReLU attention (Wortsman et al. 2023) is O = relu(Q Kᵀ / √d) V / L_k with L_k the full key length;
causal entries j > i are zero. It shares the kernels through the SOFTMAX constexpr and needs no
row statistics, so neither direction stores anything of size L×L.

Inputs are (batch, heads, seq, d) or (batch, seq, d), self-attention (Lq == Lk), causal mask
aligned top-left. Tensors are made contiguous, so HEAD_DIM is the row stride of every tensor.
The d block is padded to a power of two (≥ 16, tl.dot's minimum) and sequence tails are masked.
fp32 inputs use TF32x3 dots (about fp32 accuracy on tensor cores) unless
torch.backends.cuda.matmul.allow_tf32 is set, the switch torch.matmul obeys, which gives TF32.
On Hopper and newer GPUs, configs with TMA = 1 stream the K/V (or Q/dO) tiles through tensor
descriptors built per program (Hopper's TMA unit); the descriptor's bounds zero-fill the sequence
tail. Under TRITON_INTERPRET=1 (the CPU tests) each kernel has one small config.

The kernel layout and the exp2 trick follow Triton's tutorial 06-fused-attention.py.
"""

import functools
import inspect
import math
import os

import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


# ----------------------------------------------------------------------------- tuning


# (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA) → (the head sizes it is tried for, whether it is
# for fp32), per kernel. TMA = 1 streams tiles through tensor descriptors (Hopper's TMA unit) where
# the GPU and the tensors allow it, and runs as its TMA = 0 twin elsewhere. bf16 entries are the
# fastest of sweeps of BLOCK_M × BLOCK_N × warps × stages × TMA on an H100 (docs/design-notes.md,
# "Kernel configurations"): at d 64 for the leaderboard shape, at d 128 for one head of 16384
# and of 65536 tokens. Wider heads spill registers; fp32 tiles take twice the shared memory, and
# TF32x3 three times the registers, of bf16 ones.
_TABLE: dict[str, dict[tuple[int, int, int, int, int], tuple[tuple[int, int], bool]]] = {
    "fwd": {
        (128, 64, 8, 3, 1): ((1, 64), False),
        (64, 64, 4, 3, 1): ((1, 256), False),
        (64, 64, 4, 4, 1): ((65, 128), False),
        (128, 128, 8, 3, 1): ((65, 128), False),
        (32, 32, 4, 2, 0): ((1, 256), True),
    },
    "dkdv": {
        (128, 128, 8, 3, 0): ((1, 64), False),
        (64, 64, 4, 3, 1): ((1, 256), False),
        (64, 128, 8, 2, 1): ((65, 256), False),
        (32, 32, 4, 2, 0): ((1, 256), True),
    },
    "dkdvq": {  # the one-kernel backward (atomic dQ): its own sweep, dQ by bulk reduction
        (64, 64, 4, 3, 1): ((1, 256), False),
        (128, 128, 8, 3, 1): ((1, 64), False),
        (128, 128, 8, 3, 0): ((1, 64), False),
        (64, 128, 4, 3, 1): ((1, 64), False),
        (32, 64, 4, 3, 1): ((65, 128), False),
        (32, 32, 4, 2, 0): ((1, 256), True),
    },
    "dq": {
        (128, 64, 4, 3, 1): ((1, 64), False),
        (64, 64, 4, 3, 1): ((1, 256), False),
        (64, 32, 4, 3, 1): ((65, 256), False),
        (32, 32, 4, 2, 0): ((1, 256), True),
    },
}


def _configs(kind: str, interpret: bool = _INTERPRET) -> list[triton.Config]:
    """Candidates: BLOCK_M tiles queries, BLOCK_N keys, TMA picks descriptor loads (:data:`_TABLE`).

    A config carries nothing but Triton's own fields: the autotuner's disk cache
    (``cache_results``) rebuilds each config with ``triton.Config(**config.__dict__)``,
    so an attribute of ours would break every cell after the first of a shape.
    """
    if interpret:  # one config: the interpreter runs each program serially on the CPU
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "TMA": 0}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "TMA": tma}, num_warps=w, num_stages=s) for bm, bn, w, s, tma in _TABLE[kind]]


def tma_loads_possible(*tensors: torch.Tensor) -> bool:
    """Whether tiles of these (…, N, d) tensors can stream through TMA descriptors: a Hopper or newer
    GPU (or the interpreter), rows and base addresses 16-byte aligned."""
    t = tensors[0]
    if not _INTERPRET and not (t.is_cuda and torch.cuda.get_device_capability(t.device) >= (9, 0)):
        return False
    return all((x.shape[-1] * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0 for x in tensors)


def _prune(kind: str, configs, named_args, **kwargs):
    args = {**named_args, **kwargs}
    fp32 = args["Q"].dtype == torch.float32
    d = args["HEAD_DIM"]
    limit = max(64, triton.next_power_of_2(args["N_CTX"]))  # longer tiles only add masked work
    tma = tma_loads_possible(args["Q"], args["K"], args["V"], *([args["DO"]] if "DO" in args else []))

    def tags(c) -> tuple[tuple[int, int], bool]:
        key = (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c.kwargs["TMA"])
        return _TABLE[kind].get(key, ((1, 256), fp32))  # a config not in the table (a test's) fits all

    fits = [c for c in configs if tags(c)[1] == fp32]
    kept = [c for c in fits if tags(c)[0][0] <= d <= tags(c)[0][1] and max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) <= limit]
    if not kept:  # nothing tagged for this head or length: the smallest tile
        kept = [min(fits, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]
    if tma:
        return kept
    twins = {}  # TMA configs run with pointer loads where descriptors cannot be used
    for c in kept:
        plain = triton.Config({**c.kwargs, "TMA": 0}, num_warps=c.num_warps, num_stages=c.num_stages)
        twins.setdefault((plain.kwargs["BLOCK_M"], plain.kwargs["BLOCK_N"], c.num_warps, c.num_stages), plain)
    return list(twins.values())


# Arguments that only key the autotuner (the kernels never read them). Triton specialises an integer
# argument on being 1 or a multiple of 16, so left to it, one head (BH_BUCKET 1) and sixteen (16) or the
# check's shape (measure.correctness) and a timed one would each compile every config once more.
_KEY_ONLY = ["N_BUCKET", "BH_BUCKET"]


def _autotune(kind: str, reset_to_zero: list[str] | None = None):
    # the autotuner adds each tensor argument's dtype to the key by itself; cache_results keeps the
    # winner on disk beside the compiled kernels (TRITON_CACHE_DIR), so the next cell of the same
    # shape does not autotune again (15-28 s per cold cell measured on an H100)
    cache = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    return triton.autotune(
        configs=_configs(kind),
        # BH_BUCKET: one head and sixteen heads of one length fill the GPU differently and tune
        # to different tiles; the autotuner adds each tensor's dtype to the key by itself
        key=["N_BUCKET", "BH_BUCKET", "HEAD_DIM", "IS_CAUSAL", "SOFTMAX", *(["ATOMIC_DQ"] if kind.startswith("dkdv") else [])],
        prune_configs_by={"early_config_prune": functools.partial(_prune, kind)},
        # an accumulating output must start from zero in every timed run of every config
        reset_to_zero=reset_to_zero,
        **cache,
    )


# ----------------------------------------------------------------------------- launching
# A launch through ``kernel[grid](...)`` runs the autotuner's dispatch (argument dictionaries to find
# the key) and the JIT's (binding and specializing every argument, launch-hook metadata) before the
# C launcher: 35-90 µs a kernel on the H100 machine's host, against 9-11 µs for the launcher alone,
# where one head of 1024 tokens runs its forward in 12 µs on the GPU and the backward launches three
# kernels. A _Launch does that work once per kernel and shape, then calls the compiled kernel's
# launcher with the same arguments.

# Triton 3.6-3.9 launch a compiled kernel with this call (JITFunction.run's last line); elsewhere
# every launch takes the JIT's path
_DIRECT = not _INTERPRET and (3, 6) <= tuple(int(x) for x in triton.__version__.split(".")[:2]) <= (3, 9)


def _launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``, minus the autotuner's dispatch once it has chosen: the compiled kernel.

    The choice for a key stays in the autotuner's own ``cache``; a launch looks it up there and calls
    the JIT function with it, which is what ``Autotuner.run`` ends with (same config, same kernel,
    same bits). A key not yet in the cache (a shape's first call) or a config with a pre-hook goes
    through the autotuner, which tunes or reads its disk cache and fills the cache.
    """
    if not isinstance(kernel, Autotuner):
        return kernel.run(*args, grid=grid, warmup=False, **kwargs)
    configs = kernel.configs
    if len(configs) == 1:  # the autotuner neither keys nor caches a single config
        config = configs[0]
    else:
        # the autotuner's key (Triton 3.6-3.9 alike): the key arguments' values in the order of
        # ``key``, then the dtype of every argument that has one, in argument order
        key = (*[kwargs[name] for name in kernel.keys], *[str(a.dtype) for a in (*args, *kwargs.values()) if hasattr(a, "dtype")])
        config = kernel.cache.get(key)
        if config is None or config.pre_hook is not None:
            return kernel[grid](*args, **kwargs)
    kernel.best_config = config  # as the autotuner's own launch leaves it
    return kernel.fn.run(*args, grid=grid, warmup=False, **kwargs, **config.all_kwargs())


def _aligned(*tensors: torch.Tensor) -> bool:
    """Whether every base address is 16-byte aligned, as the compiled kernels assume (Triton specializes on it)."""
    bits = 0
    for t in tensors:
        bits |= t.data_ptr()
    return not bits & 15


def _reusable(*inputs: torch.Tensor) -> bool:
    """Whether a call with these inputs may reuse compiled kernels (see _Launch); the tensors a call
    allocates itself come from PyTorch's caching allocator, whose blocks are 512-byte aligned."""
    if not _DIRECT or not _aligned(*inputs):
        return False
    # a launch hook (a profiler's) needs the JIT's launch metadata: such launches take the JIT's path
    hooks = (triton.knobs.runtime.launch_enter_hook, triton.knobs.runtime.launch_exit_hook)
    return all(h is None or not getattr(h, "calls", True) for h in hooks)


class _Launch:
    """One kernel at one shape: every non-tensor argument, then from its first launch on, the compiled
    kernel that the autotuner's choice and the JIT's specialization led to, with its grid.

    Called with ``reuse`` (:func:`_reusable` of the caller's inputs) and the tensor arguments, the
    kernel's leading parameters. A reused kernel was compiled for aligned tensors of this shape and
    dtype; any other call takes the JIT's path, which specializes anew, as does a call after the
    autotuner's configs or cache were replaced (tests do) or on another device.
    """

    def __init__(self, kernel, grid, **scalars):
        self.kernel, self.grid, self.scalars = kernel, grid, scalars
        self.compiled = None

    def __call__(self, reuse: bool, *tensors: torch.Tensor) -> None:
        compiled = self.compiled
        if reuse and compiled is not None:
            tuner = self.tuner
            if tuner is None or (tuner.configs is self.configs and tuner.cache is self.cache):
                device = self.current_device()
                if device == self.device:
                    if tuner is not None:
                        tuner.best_config = self.config  # as the autotuner's own launch leaves it
                    g0, g1, g2 = self.grid3
                    stream = self.current_stream(device)
                    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *tensors, *self.tail)
                    return
        compiled = _launch(self.kernel, self.grid, *tensors, **self.scalars)
        if reuse and _aligned(*tensors) and hasattr(compiled, "packed_metadata"):
            self._keep(compiled, len(tensors))

    def _keep(self, compiled, n_tensors: int) -> None:
        kernel = self.kernel
        tuner = kernel if isinstance(kernel, Autotuner) else None
        config = tuner.best_config if tuner is not None else None
        if config is not None and config.pre_hook is not None:
            return
        values = {**self.scalars, **(config.all_kwargs() if config is not None else {})}
        jit = kernel.fn if tuner is not None else kernel
        self.tail = tuple(values[name] for name in jit.arg_names[n_tensors:])  # the launcher skips constexprs itself
        grid = self.grid(values) if callable(self.grid) else self.grid
        self.grid3 = (*grid, 1, 1)[:3]
        driver = triton.runtime.driver.active
        self.current_device, self.current_stream = driver.get_current_device, driver.get_current_stream
        self.tuner, self.config = tuner, config
        self.configs, self.cache = (tuner.configs, tuner.cache) if tuner is not None else (None, None)
        self.device, self.compiled = self.current_device(), compiled


# the _Launch objects of one direction's call, per (direction, shape, dtype, flags)
_PLANS: dict[tuple, tuple[_Launch, ...]] = {}


# ----------------------------------------------------------------------------- helpers


@triton.jit
def _load_tile(PTR, rows, offs_d, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASK_ROWS: tl.constexpr):
    """(len(rows), BLOCK_D) tile of a row-major (N_CTX, HEAD_DIM) matrix; padding reads 0."""
    ptrs = PTR + rows[:, None] * HEAD_DIM + offs_d[None, :]
    if MASK_ROWS:
        x = tl.load(ptrs, mask=(rows[:, None] < N_CTX) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    elif BLOCK_D != HEAD_DIM:
        x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _rows_source(PTR, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TMA: tl.constexpr):
    """What :func:`_load_rows` reads from: the pointer, or a TMA descriptor of the (N_CTX, HEAD_DIM) matrix."""
    if TMA:
        return tl.make_tensor_descriptor(PTR, shape=[N_CTX, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_ROWS, BLOCK_D])
    else:
        return PTR


@triton.jit
def _load_rows(SRC, start, rows, offs_d, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASK_ROWS: tl.constexpr, TMA: tl.constexpr):
    """Rows [start, start + len(rows)) as a (len(rows), BLOCK_D) tile; past N_CTX or HEAD_DIM it reads 0."""
    if TMA:  # the descriptor's bounds zero-fill, so there is no mask to compute
        x = SRC.load([start, 0])
    else:
        x = _load_tile(SRC, rows, offs_d, N_CTX, HEAD_DIM, BLOCK_D, MASK_ROWS)
    return x


@triton.jit
def _store_tile(PTR, x, rows, offs_d, N_CTX, HEAD_DIM: tl.constexpr):
    ptrs = PTR + rows[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(ptrs, x.to(PTR.dtype.element_ty), mask=(rows[:, None] < N_CTX) & (offs_d[None, :] < HEAD_DIM))


# ----------------------------------------------------------------------------- forward


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    K,
    V,
    offs_m,
    offs_d,
    lo,
    hi,
    qk_scale,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    MASKED: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    """Accumulate key tiles [lo, hi); MASKED tiles may cross the diagonal or the sequence end."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = _load_rows(K, start_n, cols, offs_d, N_CTX, HEAD_DIM, BLOCK_D, MASKED, TMA)
        v = _load_rows(V, start_n, cols, offs_d, N_CTX, HEAD_DIM, BLOCK_D, MASKED, TMA)
        # -- S = Q Kᵀ, unscaled, fp32 --
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        if MASKED:
            keep = cols[None, :] < N_CTX
            if IS_CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
        if SOFTMAX:
            # -- online softmax in base 2 (qk_scale holds log2(e)) --
            # Every row meets an unmasked key in its first tile, so m_ij is finite: no inf - inf.
            if MASKED:
                s = tl.where(keep, s * qk_scale, float("-inf"))
                m_ij = tl.maximum(m_i, tl.max(s, 1))
                s = s - m_ij[:, None]
            else:
                m_ij = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
                s = s * qk_scale - m_ij[:, None]
            p = tl.math.exp2(s)
            alpha = tl.math.exp2(m_i - m_ij)  # rescales what was summed under the old max
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            m_i = m_ij
        else:
            p = tl.maximum(s * qk_scale, 0.0)  # qk_scale is 1/√d here
            if MASKED:
                p = tl.where(keep, p, 0.0)
        # -- O += P V: P rounded to the input dtype, accumulated in fp32 --
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
    return acc, l_i, m_i


@_autotune("fwd")
@triton.jit(do_not_specialize=_KEY_ONLY)
def _attn_fwd(
    Q,
    K,
    V,
    O,
    LSE,
    qk_scale,
    N_CTX,
    N_BUCKET,
    BH_BUCKET,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)  # the diagonal stage starts on a key-tile boundary
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    if IS_CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m  # longest rows first: less idle tail
    offset = off_bh.to(tl.int64) * N_CTX * HEAD_DIM
    Q += offset
    K += offset
    V += offset
    O += offset
    K = _rows_source(K, N_CTX, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    V = _rows_source(V, N_CTX, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_tile(Q, offs_m, offs_d, N_CTX, HEAD_DIM, BLOCK_D, True)  # stays on chip throughout
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if IS_CAUSAL:
        # stage 1: key tiles left of the diagonal, unmasked; stage 2: the diagonal, masked.
        # Key tiles right of the diagonal are fully masked and never visited.
        diag = start_m * BLOCK_M
        acc, l_i, m_i = _attn_fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            K,
            V,
            offs_m,
            offs_d,
            0,
            diag,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            IS_CAUSAL,
            SOFTMAX,
            False,
            INPUT_PRECISION,
            TMA,
        )
        acc, l_i, m_i = _attn_fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            K,
            V,
            offs_m,
            offs_d,
            diag,
            tl.minimum(diag + BLOCK_M, N_CTX),
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            IS_CAUSAL,
            SOFTMAX,
            True,
            INPUT_PRECISION,
            TMA,
        )
    else:
        # full key tiles unmasked, then the ragged last tile (if any) masked
        n_full = N_CTX - N_CTX % BLOCK_N
        acc, l_i, m_i = _attn_fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            K,
            V,
            offs_m,
            offs_d,
            0,
            n_full,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            IS_CAUSAL,
            SOFTMAX,
            False,
            INPUT_PRECISION,
            TMA,
        )
        acc, l_i, m_i = _attn_fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            K,
            V,
            offs_m,
            offs_d,
            n_full,
            N_CTX,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            IS_CAUSAL,
            SOFTMAX,
            True,
            INPUT_PRECISION,
            TMA,
        )
    # -- epilogue --
    if SOFTMAX:
        acc = acc / l_i[:, None]
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # back to natural log: ×ln(2)
        tl.store(LSE + off_bh.to(tl.int64) * N_CTX + offs_m, lse, mask=offs_m < N_CTX)
    else:
        acc = acc * (1.0 / N_CTX)  # divide by L_k, the full key length, masked keys included
    _store_tile(O, acc, offs_m, offs_d, N_CTX, HEAD_DIM)


# ----------------------------------------------------------------------------- backward


@triton.jit
def _attn_bwd_preprocess(O, DO, DELTA, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    # D_i = rowsum(O ∘ dO)_i = Σ_j P_ij dP_ij, the softmax-Jacobian term of dS
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    off_bh = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    offset = off_bh.to(tl.int64) * N_CTX * HEAD_DIM
    o = _load_tile(O + offset, offs_m, offs_d, N_CTX, HEAD_DIM, BLOCK_D, True).to(tl.float32)
    do = _load_tile(DO + offset, offs_m, offs_d, N_CTX, HEAD_DIM, BLOCK_D, True).to(tl.float32)
    tl.store(DELTA + off_bh.to(tl.int64) * N_CTX + offs_m, tl.sum(o * do, 1), mask=offs_m < N_CTX)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk,
    dv,
    k,
    v,
    Q,
    DO,
    LSE,
    DELTA,
    DQ,
    offs_n,
    offs_d,
    lo,
    hi,
    qk_scale,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    MASKED: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
):
    """Accumulate dK, dV of one key tile over query tiles [lo, hi), working on transposes; with
    ATOMIC_DQ, also add this key tile's share of each query tile's dQ (unscaled, fp32) into DQ."""
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        rows = start_m + tl.arange(0, BLOCK_M)
        q = _load_rows(Q, start_m, rows, offs_d, N_CTX, HEAD_DIM, BLOCK_D, MASKED, TMA)
        do = _load_rows(DO, start_m, rows, offs_d, N_CTX, HEAD_DIM, BLOCK_D, MASKED, TMA)
        # -- recompute Sᵀ (keys × queries) and dPᵀ = V dOᵀ --
        sT = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
        if MASKED:
            keep = rows[None, :] < N_CTX
            if IS_CAUSAL:
                keep = keep & (rows[None, :] >= offs_n[:, None])
        if SOFTMAX:
            if MASKED:
                lse = tl.load(LSE + rows, mask=rows < N_CTX, other=0.0)
                delta = tl.load(DELTA + rows, mask=rows < N_CTX, other=0.0)
            else:
                lse = tl.load(LSE + rows)
                delta = tl.load(DELTA + rows)
            # Pᵀ = exp(S·scale − L), in base 2: exp(x) = exp2(x / ln 2)
            pT = tl.math.exp2(sT * qk_scale - lse[None, :] * 1.4426950408889634)  # 1/ln(2)
            if MASKED:
                pT = tl.where(keep, pT, 0.0)
            dsT = pT * (dpT - delta[None, :])  # dS = P ∘ (dP − D)
        else:
            # relu: P = relu(S)·scale/L_k; the factor scale/L_k is applied once, at the end
            pos = sT > 0.0
            if MASKED:
                pos = pos & keep
            pT = tl.where(pos, sT, 0.0)
            dsT = tl.where(pos, dpT, 0.0)
        # -- dV += Pᵀ dO; dK += dSᵀ Q --
        dv = tl.dot(pT.to(q.dtype), do, dv, input_precision=INPUT_PRECISION)
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=INPUT_PRECISION)
        if ATOMIC_DQ:  # dQ += dS K: the fifth matmul, instead of recomputing S and dP per query tile
            dq = tl.dot(tl.trans(dsT.to(q.dtype)), k, input_precision=INPUT_PRECISION)
            if ATOMIC_DQ == 2:  # one bulk reduction per tile (cp.reduce.async.bulk); bounds drop the tail
                DQ.atomic_add([start_m, 0], dq)
            else:
                dq_ptrs = DQ + rows[:, None] * HEAD_DIM + offs_d[None, :]
                tl.atomic_add(dq_ptrs, dq, mask=(rows[:, None] < N_CTX) & (offs_d[None, :] < HEAD_DIM), sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=_KEY_ONLY)
def _attn_bwd_kv(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    DQ,
    sm_scale,
    N_CTX,
    N_BUCKET,
    BH_BUCKET,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
):
    tl.static_assert(BLOCK_N % BLOCK_M == 0)  # query tiles start on the key tile's diagonal
    start_n = tl.program_id(0) * BLOCK_N  # first key tiles see the most queries: launched first
    off_bh = tl.program_id(1)
    offset = off_bh.to(tl.int64) * N_CTX * HEAD_DIM
    Q += offset
    K += offset
    V += offset
    DO += offset
    DK += offset
    DV += offset
    if ATOMIC_DQ:  # fp32 (B, H, N, d), zeroed by the caller
        DQ += offset
        if ATOMIC_DQ == 2:
            DQ = _rows_source(DQ, N_CTX, HEAD_DIM, BLOCK_M, BLOCK_D, 1)
    Q = _rows_source(Q, N_CTX, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
    DO = _rows_source(DO, N_CTX, HEAD_DIM, BLOCK_M, BLOCK_D, TMA)
    LSE += off_bh.to(tl.int64) * N_CTX
    DELTA += off_bh.to(tl.int64) * N_CTX
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = _load_tile(K, offs_n, offs_d, N_CTX, HEAD_DIM, BLOCK_D, True)
    v = _load_tile(V, offs_n, offs_d, N_CTX, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln(2)
    m_full = N_CTX - N_CTX % BLOCK_M
    if IS_CAUSAL:
        # query tiles above the diagonal see none of these keys: start at it, masked; then the
        # query tiles below it, unmasked; then the ragged last query tile, masked
        mid = start_n + BLOCK_N
        dk, dv = _attn_bwd_dkdv_inner(
            dk,
            dv,
            k,
            v,
            Q,
            DO,
            LSE,
            DELTA,
            DQ,
            offs_n,
            offs_d,
            start_n,
            tl.minimum(mid, N_CTX),
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_M,
            IS_CAUSAL,
            SOFTMAX,
            True,
            INPUT_PRECISION,
            TMA,
            ATOMIC_DQ,
        )
        dk, dv = _attn_bwd_dkdv_inner(
            dk,
            dv,
            k,
            v,
            Q,
            DO,
            LSE,
            DELTA,
            DQ,
            offs_n,
            offs_d,
            mid,
            m_full,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_M,
            IS_CAUSAL,
            SOFTMAX,
            False,
            INPUT_PRECISION,
            TMA,
            ATOMIC_DQ,
        )
        dk, dv = _attn_bwd_dkdv_inner(
            dk,
            dv,
            k,
            v,
            Q,
            DO,
            LSE,
            DELTA,
            DQ,
            offs_n,
            offs_d,
            tl.maximum(mid, m_full),
            N_CTX,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_M,
            IS_CAUSAL,
            SOFTMAX,
            True,
            INPUT_PRECISION,
            TMA,
            ATOMIC_DQ,
        )
    else:
        dk, dv = _attn_bwd_dkdv_inner(
            dk,
            dv,
            k,
            v,
            Q,
            DO,
            LSE,
            DELTA,
            DQ,
            offs_n,
            offs_d,
            0,
            m_full,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_M,
            IS_CAUSAL,
            SOFTMAX,
            False,
            INPUT_PRECISION,
            TMA,
            ATOMIC_DQ,
        )
        dk, dv = _attn_bwd_dkdv_inner(
            dk,
            dv,
            k,
            v,
            Q,
            DO,
            LSE,
            DELTA,
            DQ,
            offs_n,
            offs_d,
            m_full,
            N_CTX,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_M,
            IS_CAUSAL,
            SOFTMAX,
            True,
            INPUT_PRECISION,
            TMA,
            ATOMIC_DQ,
        )
    if SOFTMAX:
        dk = dk * sm_scale  # S was scaled by 1/√d in the forward
    else:
        dk = dk * (sm_scale / N_CTX)
        dv = dv * (sm_scale / N_CTX)
    _store_tile(DK, dk, offs_n, offs_d, N_CTX, HEAD_DIM)
    _store_tile(DV, dv, offs_n, offs_d, N_CTX, HEAD_DIM)


# one kernel, two autotuners: dK, dV only (dQ by _attn_bwd_dq), or dK, dV and an atomic dQ
_attn_bwd_dkdv = _autotune("dkdv")(_attn_bwd_kv)
_attn_bwd_dkdvq = _autotune("dkdvq", reset_to_zero=["DQ"])(_attn_bwd_kv)


@triton.jit
def _attn_bwd_dq_inner(
    dq,
    q,
    do,
    lse2,
    delta,
    K,
    V,
    offs_m,
    offs_d,
    lo,
    hi,
    qk_scale,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    MASKED: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    """Accumulate dQ of one query tile over key tiles [lo, hi)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = _load_rows(K, start_n, cols, offs_d, N_CTX, HEAD_DIM, BLOCK_D, MASKED, TMA)
        v = _load_rows(V, start_n, cols, offs_d, N_CTX, HEAD_DIM, BLOCK_D, MASKED, TMA)
        # -- recompute S and dP = dO Vᵀ --
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        if MASKED:
            keep = cols[None, :] < N_CTX
            if IS_CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
        if SOFTMAX:
            p = tl.math.exp2(s * qk_scale - lse2[:, None])
            if MASKED:
                p = tl.where(keep, p, 0.0)
            ds = p * (dp - delta[:, None])
        else:
            pos = s > 0.0
            if MASKED:
                pos = pos & keep
            ds = tl.where(pos, dp, 0.0)
        # -- dQ += dS K --
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=INPUT_PRECISION)
    return dq


@_autotune("dq")
@triton.jit(do_not_specialize=_KEY_ONLY)
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    sm_scale,
    N_CTX,
    N_BUCKET,
    BH_BUCKET,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA: tl.constexpr,
):
    tl.static_assert(BLOCK_M % BLOCK_N == 0)  # the diagonal stage starts on a key-tile boundary
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    if IS_CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m  # longest rows first
    offset = off_bh.to(tl.int64) * N_CTX * HEAD_DIM
    Q += offset
    K += offset
    V += offset
    DO += offset
    DQ += offset
    K = _rows_source(K, N_CTX, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    V = _rows_source(V, N_CTX, HEAD_DIM, BLOCK_N, BLOCK_D, TMA)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_tile(Q, offs_m, offs_d, N_CTX, HEAD_DIM, BLOCK_D, True)
    do = _load_tile(DO, offs_m, offs_d, N_CTX, HEAD_DIM, BLOCK_D, True)
    if SOFTMAX:
        stats = off_bh.to(tl.int64) * N_CTX + offs_m
        lse2 = tl.load(LSE + stats, mask=offs_m < N_CTX, other=0.0) * 1.4426950408889634  # base 2
        delta = tl.load(DELTA + stats, mask=offs_m < N_CTX, other=0.0)
    else:
        lse2 = tl.zeros([BLOCK_M], tl.float32)  # unused by relu
        delta = lse2
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # 1/ln(2)
    if IS_CAUSAL:
        diag = start_m * BLOCK_M
        dq = _attn_bwd_dq_inner(
            dq,
            q,
            do,
            lse2,
            delta,
            K,
            V,
            offs_m,
            offs_d,
            0,
            diag,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            IS_CAUSAL,
            SOFTMAX,
            False,
            INPUT_PRECISION,
            TMA,
        )
        dq = _attn_bwd_dq_inner(
            dq,
            q,
            do,
            lse2,
            delta,
            K,
            V,
            offs_m,
            offs_d,
            diag,
            tl.minimum(diag + BLOCK_M, N_CTX),
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            IS_CAUSAL,
            SOFTMAX,
            True,
            INPUT_PRECISION,
            TMA,
        )
    else:
        n_full = N_CTX - N_CTX % BLOCK_N
        dq = _attn_bwd_dq_inner(
            dq,
            q,
            do,
            lse2,
            delta,
            K,
            V,
            offs_m,
            offs_d,
            0,
            n_full,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            IS_CAUSAL,
            SOFTMAX,
            False,
            INPUT_PRECISION,
            TMA,
        )
        dq = _attn_bwd_dq_inner(
            dq,
            q,
            do,
            lse2,
            delta,
            K,
            V,
            offs_m,
            offs_d,
            n_full,
            N_CTX,
            qk_scale,
            N_CTX,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            IS_CAUSAL,
            SOFTMAX,
            True,
            INPUT_PRECISION,
            TMA,
        )
    if SOFTMAX:
        dq = dq * sm_scale
    else:
        dq = dq * (sm_scale / N_CTX)
    _store_tile(DQ, dq, offs_m, offs_d, N_CTX, HEAD_DIM)


# ----------------------------------------------------------------------------- launchers


def _as_bhnd(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, d) contiguous; a 3-d (batch, seq, d) input gets heads = 1."""
    if x.dim() == 3:
        x = x.unsqueeze(1)
    if x.dim() != 4:
        raise ValueError(f"expected (batch, heads, seq, d) or (batch, seq, d), got {tuple(x.shape)}")
    return x.contiguous()


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must share one shape (self-attention), got {q.shape}, {k.shape}, {v.shape}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"q, k, v must share one dtype of fp32, bf16, fp16; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] > 256:
        raise ValueError(f"head dim {q.shape[-1]} > 256 is not supported")


def _tf32(q: torch.Tensor) -> bool:
    # fp32 dots follow torch.matmul's switch: plain TF32 only where the user allowed it, else
    # TF32x3 (three TF32 products, ~fp32 accuracy, still on tensor cores); ignored for bf16/fp16
    return q.dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32


def _kernel_args(q: torch.Tensor) -> dict:
    """q: (B, H, N, d). The autotuner's key buckets N and B·H to powers of two."""
    n, d = q.shape[-2], q.shape[-1]
    return dict(
        N_CTX=n,
        N_BUCKET=triton.next_power_of_2(n),
        BH_BUCKET=triton.next_power_of_2(q.shape[0] * q.shape[1]),
        HEAD_DIM=d,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        INPUT_PRECISION="tf32" if _tf32(q) else "tf32x3",
    )


def _tma_scratch(device: torch.device) -> None:
    """Global memory for the descriptors TMA configs build on the device (128 bytes a program).

    Triton keeps the allocator in a context variable, and autograd runs backward on its own
    thread: set before every forward and backward, not once.
    """
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))


def _plan(key: tuple, make) -> tuple[_Launch, ...]:
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = make()
    return plan


def _forward_plan(q: torch.Tensor, is_causal: bool, softmax: bool) -> tuple[_Launch, ...]:
    batch, heads, n, d = q.shape
    sm_scale = 1.0 / math.sqrt(d)
    qk_scale = sm_scale * 1.4426950408889634 if softmax else sm_scale  # softmax runs in base 2

    def grid(meta):  # (batch, head) slowest: programs in flight share one head's K, V in L2
        return (triton.cdiv(n, meta["BLOCK_M"]), batch * heads)

    return (_Launch(_attn_fwd, grid, qk_scale=qk_scale, **_kernel_args(q), IS_CAUSAL=is_causal, SOFTMAX=softmax),)


def _forward(q, k, v, is_causal: bool, softmax: bool):
    """q, k, v: (B, H, N, D) contiguous -> O (B, H, N, D), L (B, H, N) fp32 (softmax only)."""
    batch, heads, n, _ = q.shape
    (fwd,) = _plan(("fwd", q.shape, q.dtype, _tf32(q), is_causal, softmax), lambda: _forward_plan(q, is_causal, softmax))
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, n if softmax else 1), device=q.device, dtype=torch.float32)
    _tma_scratch(q.device)
    fwd(_reusable(q, k, v), q, k, v, o, lse)
    return o, lse


def _backward_plan(q: torch.Tensor, is_causal: bool, softmax: bool, reduce: int) -> tuple[_Launch, ...]:
    """(preprocess, dK dV [dQ by atomics when reduce], dQ) launches; reduce: 0, or ATOMIC_DQ's mode."""
    batch, heads, n, d = q.shape
    args = _kernel_args(q)
    sm_scale = 1.0 / math.sqrt(d)
    pre_block = 64

    def grid_n(meta):
        return (triton.cdiv(n, meta["BLOCK_N"]), batch * heads)

    def grid_m(meta):
        return (triton.cdiv(n, meta["BLOCK_M"]), batch * heads)

    pre = _Launch(
        _attn_bwd_preprocess, (triton.cdiv(n, pre_block), batch * heads), N_CTX=n, HEAD_DIM=d, BLOCK_D=args["BLOCK_D"], BLOCK_M=pre_block
    )
    common = dict(sm_scale=sm_scale, **args, IS_CAUSAL=is_causal, SOFTMAX=softmax)
    if reduce:
        return pre, _Launch(_attn_bwd_dkdvq, grid_n, **common, ATOMIC_DQ=reduce)
    return pre, _Launch(_attn_bwd_dkdv, grid_n, **common, ATOMIC_DQ=0), _Launch(_attn_bwd_dq, grid_m, **common)


def _backward(do, q, k, v, o, lse, is_causal: bool, softmax: bool, atomic_dq: bool = False):
    n = q.shape[-2]
    reduce = 0
    if atomic_dq and not torch.are_deterministic_algorithms_enabled():
        # Hopper's bulk tensor reduction where descriptors can be used (measured faster than
        # per-element atomics at every shape tried on an H100), per-element atomics elsewhere
        reduce = 2 if not _INTERPRET and tma_loads_possible(q, k, v, do) else 1
    key = ("bwd", q.shape, q.dtype, _tf32(q), is_causal, softmax, reduce)
    launches = _plan(key, lambda: _backward_plan(q, is_causal, softmax, reduce))
    reuse = _reusable(q, k, v, do)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if softmax:
        delta = torch.empty_like(lse)
        launches[0](reuse, o, do, delta)
    else:
        lse = delta = do  # placeholders: relu reads no row statistics
    _tma_scratch(q.device)
    if reduce:
        dq32 = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        launches[1](reuse, q, k, v, do, lse, delta, dk, dv, dq32)
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
        dq32 *= sm_scale if softmax else sm_scale / n
        return dq32.to(q.dtype), dk, dv
    dq = torch.empty_like(q)
    launches[1](reuse, q, k, v, do, lse, delta, dk, dv, dk)
    launches[2](reuse, q, k, v, do, lse, delta, dq)
    return dq, dk, dv


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal: bool, softmax: bool, atomic_dq: bool = False):
        _check(q, k, v)
        q4, k4, v4 = _as_bhnd(q), _as_bhnd(k), _as_bhnd(v)
        o, lse = _forward(q4, k4, v4, is_causal, softmax)
        # relu's backward needs neither O nor L
        ctx.save_for_backward(q4, k4, v4, o if softmax else None, lse if softmax else None)
        ctx.shape, ctx.is_causal, ctx.softmax, ctx.atomic_dq = q.shape, is_causal, softmax, atomic_dq
        return o if q.dim() == 4 else o.view(q.shape)  # views cost µs a call: only where the shape differs

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        if do.shape != q.shape:
            do = do.reshape(q.shape)
        dq, dk, dv = _backward(do.contiguous(), q, k, v, o, lse, ctx.is_causal, ctx.softmax, ctx.atomic_dq)
        if ctx.shape != q.shape:
            dq, dk, dv = dq.view(ctx.shape), dk.view(ctx.shape), dv.view(ctx.shape)
        return dq, dk, dv, None, None, None


# ----------------------------------------------------------------------------- public API
# torch.compile graph-breaks around these calls instead of tracing into the launchers (Dynamo cannot
# trace the Triton interpreter, and autotuner pruning is outside its user-kernel support).


@torch.compiler.disable
def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False, *, atomic_dq: bool = False) -> torch.Tensor:
    """softmax(q kᵀ/√d) v with FlashAttention-2 kernels, forward and backward in Triton.

    atomic_dq: one backward kernel, which adds each key tile's share of dQ into an fp32 buffer
    with atomic adds (5 matmuls per tile pair instead of 7), as FlashAttention-2's CUDA backward
    does; the order of those additions, and so dQ's last bits, vary from run to run. Under
    torch.use_deterministic_algorithms(True) the two-kernel backward runs instead.
    """
    return _FusedAttention.apply(q, k, v, is_causal, True, atomic_dq)


@torch.compiler.disable
def flash_attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward only: (O, L), L the natural-log logsumexp of the scaled scores, fp32, q.shape[:-1]."""
    _check(q, k, v)
    with torch.no_grad():
        o, lse = _forward(_as_bhnd(q), _as_bhnd(k), _as_bhnd(v), is_causal, softmax=True)
    return o.view(q.shape), lse.view(q.shape[:-1])


@torch.compiler.disable
def relu_attention_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """(relu(q kᵀ/√d) / L_k) v, causal entries zero, L_k the sequence length; memory linear in L."""
    return _FusedAttention.apply(q, k, v, is_causal, False)
