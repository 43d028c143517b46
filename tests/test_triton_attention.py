"""Triton fused attention (softmax FlashAttention-2 and ReLU) against float64 and bf16 references.

Without CUDA the kernels run in Triton's interpreter, which triton.jit chooses when it decorates a
function, triton.language's own helpers included: TRITON_INTERPRET=1 must be set before triton is
first imported. This module sets it before importing the kernels; if triton was already imported
without it (torch._dynamo imports triton, so another test module may have), the CPU tests rerun
in a fresh interpreter instead (test_cpu_suite_in_subprocess). With CUDA the same small-shape tests
run compiled on the GPU, and the @pytest.mark.gpu tests add realistic shapes in bf16.
"""

import math
import os
import subprocess
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import cs336sys.models.triton_attention as ta  # noqa: E402

INTERPRETING = ta._INTERPRET and isinstance(triton.language.standard.sum, InterpretedFunction)
runs_here = pytest.mark.skipif(
    not (ON_GPU or INTERPRETING), reason="triton was imported without TRITON_INTERPRET=1: see test_cpu_suite_in_subprocess"
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS = {"softmax": ta.flash_attention, "relu": ta.relu_attention_fused}
# (batch, heads, seq, d): seq not a multiple of any tile; d = 80 pads the d block to 128;
# seq 5 is shorter than every tile
SMALL_SHAPES = [(2, 3, 37, 16), (1, 2, 50, 80), (2, 1, 5, 32)]
# fp32: unit roundoff 6e-8; sums of ≤ 80 products and the online-softmax rescaling stay below
# 1e-6 of the largest entry, so 2e-5 leaves a wide margin while a masking bug shows as O(1)
FP32_TOL = 2e-5


def _reference(q, k, v, is_causal: bool, activation: str):
    """The project's eager semantics in the inputs' dtype: (out, logsumexp or None)."""
    n = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    above = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)  # j > i
    if activation == "softmax":
        if is_causal:
            s = s.masked_fill(above, float("-inf"))
        return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)
    p = torch.relu(s)
    if is_causal:
        p = p.masked_fill(above, 0.0)
    return (p / n) @ v, None


def _inputs(shape, dtype=torch.float32, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return [torch.randn(shape, generator=gen, device=DEVICE, dtype=dtype) for _ in range(4)]


def _forward_backward(fn, q, k, v, do, is_causal):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v, is_causal)
    out.backward(do)
    return out.detach(), q.grad, k.grad, v.grad


def _assert_close(actual, expected, tol, what):
    # error measured against the tensor's largest entry: gradients differ in scale by orders
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol * scale, msg=lambda m: f"{what}: {m}")


# ----------------------------------------------------------------------------- small shapes


@runs_here
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", SMALL_SHAPES)
@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_matches_float64_reference(activation, shape, is_causal):
    q, k, v, do = _inputs(shape)
    got = _forward_backward(KERNELS[activation], q, k, v, do, is_causal)
    ref = _forward_backward(lambda *a: _reference(*a, activation)[0], q.double(), k.double(), v.double(), do.double(), is_causal)
    assert got[0].dtype == torch.float32 and got[0].shape == shape
    for name, a, e in zip(["out", "dq", "dk", "dv"], got, ref):
        _assert_close(a, e, FP32_TOL, f"{activation} {name}")


@runs_here
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", SMALL_SHAPES)
def test_flash_logsumexp(shape, is_causal):
    q, k, v, _ = _inputs(shape)
    out, lse = ta.flash_attention_with_lse(q, k, v, is_causal)
    ref_out, ref_lse = _reference(q.double(), k.double(), v.double(), is_causal, "softmax")
    assert lse.dtype == torch.float32 and lse.shape == shape[:-1]
    _assert_close(out, ref_out, FP32_TOL, "out")
    # L ≈ log(seq) + O(1): an absolute tolerance at fp32 resolution of such values
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-5)


@runs_here
@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_three_dim_and_strided_inputs(activation):
    fn = KERNELS[activation]
    q, k, v, do = _inputs((2, 41, 3, 32))  # (batch, seq, heads, d): transposes are strided
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, do))
    got = _forward_backward(fn, qt, kt, vt, dot, True)
    ref = _forward_backward(lambda *a: _reference(*a, activation)[0], qt.double(), kt.double(), vt.double(), dot.double(), True)
    for name, a, e in zip(["out", "dq", "dk", "dv"], got, ref):
        assert a.shape == e.shape
        _assert_close(a, e, FP32_TOL, f"strided {name}")
    # (batch, seq, d) is one head
    q3, k3, v3, do3 = (x[:, :, 0] for x in (q, k, v, do))
    got = _forward_backward(fn, q3, k3, v3, do3, False)
    ref = _forward_backward(lambda *a: _reference(*a, activation)[0], q3.double(), k3.double(), v3.double(), do3.double(), False)
    for name, a, e in zip(["out", "dq", "dk", "dv"], got, ref):
        assert a.shape == e.shape
        _assert_close(a, e, FP32_TOL, f"3-d {name}")


@runs_here
def test_rejects_mismatched_inputs():
    q, k, v, _ = _inputs((1, 1, 8, 16))
    with pytest.raises(ValueError):
        ta.flash_attention(q, k[..., :4, :], v)
    with pytest.raises(TypeError):
        ta.relu_attention_fused(q, k.double(), v)


@runs_here
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", SMALL_SHAPES)
def test_atomic_dq_backward_matches_float64_reference(shape, is_causal):
    # one backward kernel: every key tile adds its share of dQ atomically (pointer atomics here;
    # Hopper's bulk reductions in the GPU tests)
    q, k, v, do = _inputs(shape)
    got = _forward_backward(lambda *a: ta.flash_attention(*a[:3], a[3], atomic_dq=True), q, k, v, do, is_causal)
    ref = _forward_backward(lambda *a: _reference(*a, "softmax")[0], q.double(), k.double(), v.double(), do.double(), is_causal)
    for name, a, e in zip(["out", "dq", "dk", "dv"], got, ref):
        _assert_close(a, e, FP32_TOL, f"atomic {name}")


@runs_here
def test_atomic_dq_gives_way_to_deterministic_algorithms(monkeypatch):
    q, k, v, do = _inputs((1, 2, 37, 16))
    two_kernels = _forward_backward(lambda *a: ta.flash_attention(*a[:3], a[3]), q, k, v, do, True)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    asked_atomic = _forward_backward(lambda *a: ta.flash_attention(*a[:3], a[3], atomic_dq=True), q, k, v, do, True)
    for name, a, b in zip(["out", "dq", "dk", "dv"], two_kernels, asked_atomic):
        assert torch.equal(a, b), name  # bit for bit: the same kernels ran


# (batch, heads, seq, d) for 16-bit inputs: ragged sequences, d 64 (the leaderboard's) and 32
HALF_SHAPES = [(1, 2, 37, 64), pytest.param((2, 1, 70, 32), marks=pytest.mark.slow)]  # the fast lane: the first
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
ULPS = 4  # P or dS is rounded to the input dtype before its dot, then the output: a few ulps


def _half_error_within_budget(fn, activation, shape, dtype, is_causal):
    """The kernel's error against float64 is at most max(ULPS ulps of the largest entry, 2× the error
    of eager PyTorch run in ``dtype``), for the output and each gradient (flash-attention's rule,
    with a floor for tiny shapes where eager happens to round luckily)."""
    q, k, v, do = _inputs(shape, dtype=dtype)
    eager = lambda *a: _reference(*a, activation)[0]  # noqa: E731
    ref = _forward_backward(eager, *(x.double() for x in (q, k, v, do)), is_causal)
    eager_half = _forward_backward(eager, q, k, v, do, is_causal)
    got = _forward_backward(fn, q, k, v, do, is_causal)
    for name, r, e, g in zip(["out", "dq", "dk", "dv"], ref, eager_half, got):
        assert g.dtype == dtype and g.shape == r.shape, name
        scale = r.abs().max().item()
        err, err_eager = (g.double() - r).abs().max().item(), (e.double() - r).abs().max().item()
        budget = max(ULPS * EPS[dtype] * scale, 2 * err_eager)
        assert err <= budget, f"{activation} {name}: error {err:.3g} > {budget:.3g} (largest {scale:.3g}, eager {err_eager:.3g})"


@runs_here
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", HALF_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("activation", ["softmax", "relu", "softmax-atomic"])
def test_half_precision_matches_float64_reference(bf16_dot_in_the_interpreter, activation, dtype, shape, is_causal):
    fn = (lambda *a: ta.flash_attention(*a[:3], a[3], atomic_dq=True)) if activation == "softmax-atomic" else KERNELS[activation]
    _half_error_within_budget(fn, activation.split("-")[0], shape, dtype, is_causal)


@runs_here
@pytest.mark.parametrize("impl, activation", [("triton", "softmax"), ("triton", "relu"), ("triton-atomic", "softmax")])
def test_our_kernels_pass_the_correctness_check(impl, activation):
    # the check's length spans several of the kernels' tiles with a ragged last one; one head keeps the interpreter quick
    from cs336sys.measure.correctness import check_attention, check_shape, check_timed_output
    from cs336sys.models.attention import resolve

    fn = resolve(impl, activation)[0]
    assert (
        max(check_attention(fn, (1, *check_shape(1, 16)[1:]), "fp32", True, torch.device(DEVICE), activation=activation).values())
        < FP32_TOL
    )
    if impl == "triton":  # and an output at a length of its own, at sampled rows
        q, k, v, _ = _inputs((1, 1, 333, 16))
        assert check_timed_output(fn(q, k, v, is_causal=False), q, k, v, "fp32", False, activation=activation) < FP32_TOL


@pytest.mark.skipif(ON_GPU or INTERPRETING, reason="the kernel tests run in this process")
def test_cpu_suite_in_subprocess():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not gpu", __file__]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


# ----------------------------------------------------------------------------- GPU, realistic shapes


def _error_budget(activation, seq, d, is_causal, fn=None):
    """flash-attention's rule: the kernel's bf16 error vs an fp32 reference is at most 2× that of
    the eager implementation run in bf16, for the output and each gradient."""
    q, k, v, do = _inputs((2, 4, seq, d), dtype=torch.bfloat16)
    eager = lambda *a: _reference(*a, activation)[0]  # noqa: E731
    ref = _forward_backward(eager, q.float(), k.float(), v.float(), do.float(), is_causal)
    eager_bf16 = _forward_backward(eager, q, k, v, do, is_causal)
    got = _forward_backward(fn or KERNELS[activation], q, k, v, do, is_causal)
    assert got[0].dtype == torch.bfloat16
    for name, r, e, g in zip(["out", "dq", "dk", "dv"], ref, eager_bf16, got):
        err_eager = (e.float() - r).abs().max().item()
        err = (g.float() - r).abs().max().item()
        assert err <= 2 * err_eager + 1e-6, f"{activation} {name}: {err:.3g} > 2 × eager bf16 {err_eager:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("seq,d,is_causal", [(1024, 64, True), (1024, 80, False), (2048, 128, True), (2048, 64, False)])
def test_flash_bf16_error_within_2x_eager(seq, d, is_causal):
    _error_budget("softmax", seq, d, is_causal)


@pytest.mark.gpu
@pytest.mark.parametrize("seq,d,is_causal", [(1024, 64, True), (1000, 80, False), (2048, 128, True)])
def test_atomic_dq_bf16_error_within_2x_eager(seq, d, is_causal):
    # Hopper: dQ by bulk tensor reductions (d 80: 160-byte rows, still 16-byte aligned)
    _error_budget("softmax", seq, d, is_causal, lambda *a: ta.flash_attention(*a[:3], a[3], atomic_dq=True))


@pytest.mark.gpu
@pytest.mark.parametrize("seq,d,is_causal", [(1024, 64, True), (2048, 128, False)])
def test_relu_bf16_error_within_2x_eager(seq, d, is_causal):
    _error_budget("relu", seq, d, is_causal)


def _peak_bytes(fn, q, k, v, do):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    _forward_backward(fn, q, k, v, do, True)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


@pytest.mark.gpu
def test_relu_fused_memory_far_below_eager():
    # eager materialises several (seq × seq) tensors; the fused kernels only O(seq × d) ones
    q, k, v, do = _inputs((1, 4, 8192, 64), dtype=torch.bfloat16)
    eager = _peak_bytes(lambda *a: _reference(*a, "relu")[0], q, k, v, do)
    fused = _peak_bytes(ta.relu_attention_fused, q, k, v, do)
    assert fused < eager / 4, f"fused {fused / 2**20:.0f} MiB vs eager {eager / 2**20:.0f} MiB"


@pytest.mark.parametrize("kind", ["fwd", "dkdv", "dkdvq", "dq"])
def test_configs_survive_the_autotuners_disk_cache(kind):
    # Triton's cache_results stores [(config.__dict__, timing)] as JSON and rebuilds each
    # config with triton.Config(**d): an attribute of ours there failed every cell after the
    # first of a shape (TypeError: unexpected keyword argument 'd_max', seen on the H100)
    import json

    import triton

    for config in ta._configs(kind, interpret=False):
        rebuilt = triton.Config(**json.loads(json.dumps(config.__dict__)))
        assert (rebuilt.kwargs, rebuilt.num_warps, rebuilt.num_stages) == (config.kwargs, config.num_warps, config.num_stages)


def test_prune_keeps_the_configs_meant_for_the_dtype_and_head():
    configs = ta._configs("fwd", interpret=False)

    def kept(dtype, head_dim, n_ctx):
        x = torch.empty(1, 1, head_dim, dtype=dtype)
        args = {"Q": x, "K": x, "V": x, "HEAD_DIM": head_dim, "N_CTX": n_ctx}
        return {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in ta._prune("fwd", configs, args)}

    assert kept(torch.float32, 64, 4096) == {(32, 32, 4, 2)}
    assert (128, 64, 8, 3) in kept(torch.bfloat16, 64, 4096)
    assert (128, 64, 8, 3) not in kept(torch.bfloat16, 128, 4096)  # tagged for heads up to 64
    assert (64, 64, 4, 4) in kept(torch.bfloat16, 128, 4096)
    assert all(max(bm, bn) <= 64 for bm, bn, _, _ in kept(torch.bfloat16, 64, 40))  # short sequence: short tiles


def test_prune_drops_tma_configs_where_rows_are_not_16_byte_aligned():
    configs = ta._configs("fwd", interpret=False)
    x = torch.empty(1, 1, 100, dtype=torch.bfloat16)  # 200-byte rows
    args = {"Q": x, "K": x, "V": x, "HEAD_DIM": 100, "N_CTX": 4096}
    kept = ta._prune("fwd", configs, args)
    assert kept and not any(c.kwargs["TMA"] for c in kept)
    # the same tiles as for aligned rows, with pointer loads
    y = torch.empty(1, 1, 96, dtype=torch.bfloat16)
    aligned = ta._prune("fwd", configs, {**args, "Q": y, "K": y, "V": y, "HEAD_DIM": 96})
    tiles = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in aligned}
    assert {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in kept} == tiles


_TMA_TILES = {"_attn_fwd": (32, 16), "_attn_bwd_dkdv": (16, 32), "_attn_bwd_dkdvq": (16, 32), "_attn_bwd_dq": (32, 16)}


@runs_here
@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability() < (9, 0), reason="TMA descriptors need Hopper or newer")
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("activation", ["softmax", "relu", "softmax-atomic"])
def test_tma_loads_match_float64_reference(monkeypatch, activation, is_causal):
    # the descriptor path (TMA = 1, what Hopper autotunes to for bf16) on a ragged sequence: rows
    # past the end must come back as zeros from the descriptor's bounds, not from a mask
    import triton

    for name, (bm, bn) in _TMA_TILES.items():
        kernel = getattr(ta, name)
        monkeypatch.setattr(kernel, "configs", [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "TMA": 1}, num_warps=4, num_stages=1)])
        monkeypatch.setattr(kernel, "cache", {})
        monkeypatch.setattr(kernel, "best_config", None, raising=False)
    atomic = activation == "softmax-atomic"
    fn = (lambda *a: ta.flash_attention(*a[:3], a[3], atomic_dq=True)) if atomic else KERNELS[activation]
    activation = activation.split("-")[0]
    q, k, v, do = _inputs((2, 2, 37, 16))
    got = _forward_backward(fn, q, k, v, do, is_causal)
    ran = ["_attn_fwd", "_attn_bwd_dkdvq"] if atomic else ["_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq"]
    for name in ran:
        assert getattr(ta, name).best_config.kwargs["TMA"] == 1, name
    ref = _forward_backward(lambda *a: _reference(*a, activation)[0], *(x.double() for x in (q, k, v, do)), is_causal)
    for what, g, r in zip(["out", "dq", "dk", "dv"], got, ref):
        _assert_close(g, r, FP32_TOL, f"{activation} {what}")


# ----------------------------------------------------------------------------- the launch path


@runs_here
def test_later_calls_launch_the_autotuners_choice_without_its_dispatch(monkeypatch):
    # a shape's first call tunes; later calls find the choice in the autotuner's cache without
    # running Autotuner.run (its argument dictionaries cost tens of µs a launch on the H100's host)
    import itertools

    import triton

    kernel = ta._attn_fwd
    first, chosen = (triton.Config({"BLOCK_M": bm, "BLOCK_N": 16, "TMA": 0}, num_warps=4, num_stages=1) for bm in (32, 16))
    monkeypatch.setattr(kernel, "configs", [first, chosen])
    monkeypatch.setattr(kernel, "cache", {})
    timings = itertools.cycle([[2.0] * 3, [1.0] * 3])  # benchmarked in config order: the second wins
    # do_bench is a cached property (the GPU's benchmarker): the instance's dict overrides it
    monkeypatch.setitem(kernel.__dict__, "do_bench", lambda call, quantiles: next(timings))
    tuned, blocks = [], []
    run, jit_run = kernel.run, kernel.fn.run
    monkeypatch.setattr(kernel, "run", lambda *a, **kw: tuned.append(1) or run(*a, **kw))
    monkeypatch.setattr(kernel.fn, "run", lambda *a, **kw: blocks.append(kw["BLOCK_M"]) or jit_run(*a, **kw))
    q, k, v, _ = _inputs((1, 2, 40, 16))
    once = ta.flash_attention_with_lse(q, k, v, True)
    again = ta.flash_attention_with_lse(q, k, v, True)
    assert tuned == [1], "the autotuner's dispatch ran again for a shape it had tuned"
    assert blocks and set(blocks) == {16} and kernel.best_config is chosen
    assert all(torch.equal(a, b) for a, b in zip(once, again))
    ta.flash_attention_with_lse(*_inputs((1, 2, 80, 16))[:3], True)  # another length bucket: tuned anew
    assert tuned == [1, 1]


@pytest.mark.gpu
@pytest.mark.parametrize("atomic", [False, True])
def test_reused_kernels_give_the_jit_paths_bits(monkeypatch, atomic):
    # after a shape's first call, launches skip the JIT (compiled kernel, its grid and arguments
    # kept): outputs and gradients must be those of launching through kernel[grid](...)
    fn = lambda *a: ta.flash_attention(*a[:3], a[3], atomic_dq=True) if atomic else ta.flash_attention(*a)  # noqa: E731
    q, k, v, do = _inputs((1, 3, 1000, 64), dtype=torch.bfloat16)
    fresh = _forward_backward(fn, q, k, v, do, True)
    jit_runs = []
    jit_run = ta._attn_fwd.fn.run
    monkeypatch.setattr(ta._attn_fwd.fn, "run", lambda *a, **kw: jit_runs.append(1) or jit_run(*a, **kw))
    reused = _forward_backward(fn, q, k, v, do, True)
    assert jit_runs == [], "the forward went through the JIT on a shape's second call"
    monkeypatch.setattr(ta, "_reusable", lambda *t: False)
    through_jit = _forward_backward(fn, q, k, v, do, True)
    assert jit_runs == [1]
    for name, a, b, c in zip(["out", "dq", "dk", "dv"], fresh, reused, through_jit):
        if atomic and name == "dq":  # atomic adds in a varying order: dQ's last bits vary run to run
            continue
        assert torch.equal(a, b) and torch.equal(b, c), name
    # an unaligned q of the same shape takes the JIT's path, which specializes for it; a kernel
    # compiled for aligned rows would fail there ("misaligned address")
    buf = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape)
    buf.copy_(q)
    assert not ta._aligned(buf)
    monkeypatch.undo()
    shifted = _forward_backward(fn, buf, k, v, do, True)
    for name, a, b in zip(["out", "dq", "dk", "dv"], shifted, fresh):
        torch.testing.assert_close(a, b, msg=lambda m: f"unaligned q, {name}: {m}")


def test_our_kernels_tiles_are_no_narrower_than_their_catalog_lines_say():
    # the correctness check's length is ragged for the line's tile (measure.correctness.check_shape)
    from cs336sys import catalog

    for name in ("triton", "triton-atomic"):
        for interpret in (False, True):
            for kind in ("fwd", "dkdv", "dkdvq", "dq"):
                narrowest = min(min(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in ta._configs(kind, interpret=interpret))
                assert narrowest >= catalog.lookup(name).tile, (name, kind, interpret)


def test_the_autotuners_key_arguments_do_not_specialise_the_kernels():
    # one head and sixteen (BH_BUCKET 1 and 16), or the check's length and a timed one, share compiled kernels
    for kernel in (ta._attn_fwd, ta._attn_bwd_dkdv, ta._attn_bwd_dkdvq, ta._attn_bwd_dq):
        fn = kernel.fn  # the interpreter keeps the JIT's options as given
        names = fn.do_not_specialize if hasattr(fn, "do_not_specialize") else fn.kwargs["do_not_specialize"]
        assert {"N_BUCKET", "BH_BUCKET"} <= set(names), kernel
