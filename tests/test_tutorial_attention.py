"""Triton's fused-attention tutorial kernel (flash impl ``tutorial``) against a float64 reference, and
the flash study's handling of the shapes it does not support.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before triton is first
imported; see tests/test_triton_attention.py for why a late import falls back to a subprocess). The
interpreter has no GPU driver, so the kernel takes the tutorial's path for GPUs without host tensor
descriptors; the host-descriptor path (what Hopper runs for causal attention) is forced as well,
since the interpreter accepts host descriptors too. The interpreter's tl.dot cannot multiply bf16,
so under it the bf16 tests upcast its operands to fp32 first (conftest.bf16_dot_in_the_interpreter),
which is what a GPU's bf16 MMA computes too. With CUDA the
same tests run compiled, and the @pytest.mark.gpu tests add realistic shapes, the leaderboard's
among them, and every forward config the autotuner may pick.
"""

import math
import os
import subprocess
import sys

import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN, tutorial_unsupported
from cs336sys.measure.session import Session
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import ConfigError, validate_config
from cs336sys.rows import Skip

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import cs336sys.models.triton_tutorial_attention as tt  # noqa: E402

INTERPRETING = tt._INTERPRET and isinstance(triton.language.standard.sum, InterpretedFunction)
runs_here = pytest.mark.skipif(
    not (ON_GPU or INTERPRETING), reason="triton was imported without TRITON_INTERPRET=1: see test_cpu_suite_in_subprocess"
)
DEVICE = "cuda" if ON_GPU else "cpu"

# Each output passes through two or three roundings to the input dtype (P or dS before a dot, K
# pre-scaled by sm_scale/ln 2 for the backward, the output itself), each within half an ulp, plus
# fp32 sums: 4 ulps of the tensor's largest entry leaves room (the interpreter's worst is ~1.3 ulps
# at the small shapes), while a masking or scaling bug shows as an O(1) error. At long sequences
# the rule of flash-attention's tests, at most twice the error of eager PyTorch in the same dtype,
# can be the larger budget.
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
ULPS = 4


@pytest.fixture(autouse=True)
def _bf16_dots(bf16_dot_in_the_interpreter):  # tests/conftest.py
    pass


def _reference(q, k, v, is_causal: bool):
    """softmax(q kᵀ/√d) v in the inputs' dtype, softmax in at least fp32 (as SDPA's math path)."""
    n = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float() if s.dtype != torch.float64 else s, dim=-1).to(q.dtype) @ v


def _forward_backward(fn, q, k, v, do, is_causal):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v, is_causal)
    out.backward(do)
    return [out.detach(), q.grad, k.grad, v.grad]


def _per_head(q, k, v, do, is_causal, dtype):
    """The reference's (out, dq, dk, dv) one (batch, head) at a time: at 16384 tokens a float64
    score matrix of all sixteen heads would not fit."""
    heads = [(b, h) for b in range(q.shape[0]) for h in range(q.shape[1])]
    parts = [_forward_backward(_reference, *(x[b, h].to(dtype) for x in (q, k, v, do)), is_causal) for b, h in heads]
    return [torch.stack([p[i] for p in parts]).view(q.shape) for i in range(4)]


def _inputs(shape, dtype, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(device=DEVICE, dtype=dtype) for _ in range(4)]


def _check_against_float64(shape, dtype, is_causal, fn=tt.tutorial_attention):
    q, k, v, do = _inputs(shape, dtype)
    got = _forward_backward(lambda *a: fn(*a[:3], is_causal=a[3]), q, k, v, do, is_causal)
    ref = _per_head(q, k, v, do, is_causal, torch.float64)
    eager = _per_head(q, k, v, do, is_causal, dtype)
    for name, g, r, e in zip(["out", "dq", "dk", "dv"], got, ref, eager):
        assert g.dtype == dtype and g.shape == shape, name
        scale = r.abs().max().item()
        err = (g.double() - r).abs().max().item()
        err_eager = (e.double() - r).abs().max().item()
        budget = max(ULPS * EPS[dtype] * scale, 2 * err_eager)
        assert err <= budget, f"{name}: max error {err:.3g} > {budget:.3g} (largest entry {scale:.3g}, eager {dtype} {err_eager:.3g})"


# ----------------------------------------------------------------------------- small shapes


@runs_here
@pytest.mark.parametrize("descriptors", ["host", "device"])
@pytest.mark.parametrize("is_causal", [True, False])
# the fast lane (-m "not slow") checks the first shape; the full suite every one
@pytest.mark.parametrize(
    "shape", [(1, 2, 128, 32), *(pytest.param(s, marks=pytest.mark.slow) for s in [(2, 1, 256, 64), (1, 1, 128, 128)])]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_matches_float64_reference(monkeypatch, dtype, shape, is_causal, descriptors):
    if descriptors == "host" and ON_GPU and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("host tensor descriptors need Hopper or newer")
    # the forward takes host descriptors where supports_host_descriptor() says so (and warp
    # specialization is off), else it builds them in the kernel
    monkeypatch.setattr(tt, "supports_host_descriptor", lambda: descriptors == "host")
    if ON_GPU:
        monkeypatch.setattr(tt, "use_warp_specialize", lambda causal: False)  # the path named, not Blackwell's in-kernel one
    _check_against_float64(shape, dtype, is_causal)


@runs_here
def test_strided_inputs_and_gradient():
    # (batch, seq, heads, d) transposed to (batch, heads, seq, d), and the expanded gradient of a
    # sum: the tutorial assumes contiguous tensors, our entry point and backward copy them
    q, k, v, _ = _inputs((1, 128, 2, 32), torch.float16)
    qt, kt, vt = (x.transpose(1, 2).requires_grad_() for x in (q, k, v))
    tt.tutorial_attention(qt, kt, vt, is_causal=True).float().sum().backward()
    ref = _forward_backward(
        _reference, *(x.detach().double() for x in (qt, kt, vt)), torch.ones(1, 2, 128, 32, dtype=torch.float64, device=DEVICE), True
    )
    for name, g, r in zip(["dq", "dk", "dv"], [qt.grad, kt.grad, vt.grad], ref[1:]):
        assert g.shape == r.shape
        torch.testing.assert_close(g.double(), r, rtol=0, atol=ULPS * EPS[torch.float16] * r.abs().max().item(), msg=name)


@pytest.mark.parametrize(
    "shape, dtype, reason",
    [
        ((1, 1, 128, 16), torch.bfloat16, "head_dim 16"),
        ((1, 1, 128, 48), torch.bfloat16, "head_dim 48"),
        ((1, 1, 100, 64), torch.bfloat16, "seq_len 100"),
        ((1, 1, 128, 64), torch.float32, "dtype torch.float32"),
        ((128, 64), torch.bfloat16, "(batch, heads, seq, head_dim)"),
    ],
)
def test_entry_point_refuses_what_the_tutorial_does_not_handle(shape, dtype, reason):
    q = torch.zeros(shape, dtype=dtype)
    with pytest.raises(ValueError, match=f"tutorial kernel cannot run this: .*{reason}".replace("(", r"\(").replace(")", r"\)")):
        tt.tutorial_attention(q, q, q, is_causal=True)


def test_warp_specialization_on_blackwell_only(monkeypatch):
    # the tutorial's benchmark also specializes Hopper's non-causal forward: NaN there (Triton 3.6)
    for hopper, blackwell, causal, expected in [
        (True, False, True, False),
        (True, False, False, False),
        (False, True, True, True),
        (False, False, False, False),
    ]:
        monkeypatch.setattr(tt, "is_hopper", lambda h=hopper: h)
        monkeypatch.setattr(tt, "is_blackwell", lambda b=blackwell: b)
        assert tt.use_warp_specialize(causal) is expected, (hopper, blackwell, causal)


def test_config_filter_drops_blocks_the_forward_cannot_run():
    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}) for bm in (64, 128) for bn in (32, 64, 128)]

    def kept(n_ctx, stage, head_dim):
        return {
            (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"])
            for c in tt.prune_invalid_configs(configs, {}, N_CTX=n_ctx, STAGE=stage, HEAD_DIM=head_dim)
        }

    assert kept(1024, 1, 128) == {(bm, bn) for bm in (64, 128) for bn in (32, 64, 128)}
    assert (64, 128) not in kept(1024, 3, 128)  # causal: BLOCK_M < BLOCK_N gave wrong rows (PR #8853)
    assert kept(1024, 1, 32) == {(64, 32), (128, 32)}  # _attn_fwd static_asserts BLOCK_N <= HEAD_DIM
    assert kept(64, 1, 64) == {(64, 32), (64, 64)}  # BLOCK_M <= N_CTX


# ----------------------------------------------------------------------------- the flash study


def _flash_section(**grid) -> dict:
    return validate_config({"run": "t", "device": "cpu", "studies": ["flash"], "flash": {"grid": grid, "leaderboard": None}})[0]["flash"]


def test_flash_cells_leave_out_what_the_tutorial_does_not_handle():
    section = _flash_section(
        seq_len=[100, 128, 16384], head_dim=[16, 64], precision=["fp32", "bf16"], impl=["tutorial", "eager"], num_heads=[1]
    )
    tutorial = {(c["seq_len"], c["head_dim"], c["precision"]) for c in plan.cells("flash", section, BUILT_IN) if c["impl"] == "tutorial"}
    eager = [c for c in plan.cells("flash", section, BUILT_IN) if c["impl"] == "eager"]
    assert tutorial == {(128, 64, "bf16"), (16384, 64, "bf16")}
    assert len(eager) == 3 * 2 * 2  # other implementations keep every combination
    board = {"seq_len": 16384, "head_dim": 64, "num_heads": 16, "precision": "bf16"}
    assert {"impl": "tutorial", **board} in plan.cells("flash", {**section, "leaderboard": board}, BUILT_IN)


def test_a_grid_of_unsupported_tutorial_cells_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="no valid cell: impl tutorial .*bf16.*multiple of 128"):
        _flash_section(seq_len=[100], head_dim=[64], precision=["bf16"], impl=["tutorial"], num_heads=[1])


def test_reasons_name_every_limit():
    assert tutorial_unsupported(16384, 64, "bf16") == ""
    why = tutorial_unsupported(1000, 16, "fp32")
    assert "precision fp32" in why and "head_dim 16" in why and "seq_len 1000" in why


def test_measure_skips_unsupported_and_cpu_without_the_interpreter(monkeypatch):
    from cs336sys.studies.flash.measure import measure

    kwargs = dict(seq_len=128, head_dim=64, precision="bf16", impl="tutorial")
    with pytest.raises(Skip, match="unsupported by the Triton tutorial kernel: head_dim 16"):
        next(measure(torch.device("cpu"), {}, Session(), **cell_kwargs("flash", **{**kwargs, "head_dim": 16})))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(Skip, match="needs CUDA"):
        next(measure(torch.device("cpu"), {}, Session(), **cell_kwargs("flash", **kwargs)))


@runs_here
def test_measure_times_the_tutorial_cell():
    from cs336sys.studies.flash.measure import measure

    rows = list(
        measure(
            torch.device(DEVICE),
            {},
            Session(),
            **cell_kwargs("flash", seq_len=128, head_dim=32, precision="bf16", impl="tutorial", num_heads=2, rep_ms=1),
        )
    )
    assert [r["phase"] for r in rows] == ["forward", "backward", "forward_backward"]
    assert all(r["n"] >= 1 and r["median_ms"] > 0 for r in rows)


def test_only_tutorial_cells_hash_the_tutorial_module():
    module = "cs336sys.models.triton_tutorial_attention"
    axes = {"seq_len": 128, "head_dim": 64, "precision": "bf16", "num_heads": 1}
    assert module in plan.cell_modules("flash", {**axes, "impl": "tutorial"}, BUILT_IN)
    assert "cs336sys.models.triton_attention" not in plan.cell_modules("flash", {**axes, "impl": "tutorial"}, BUILT_IN)
    for impl in ("triton", "sdpa-flash", "eager", "compiled"):
        assert module not in plan.cell_modules("flash", {**axes, "impl": impl}, BUILT_IN), impl
    for study in S.STUDIES:
        if study != "flash":
            any_cell = {a: 0 for a in S.study(study).axes}
            assert module not in plan.cell_modules(study, any_cell, BUILT_IN), study


@pytest.mark.skipif(ON_GPU or INTERPRETING, reason="the kernel tests run in this process")
def test_cpu_suite_in_subprocess():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not gpu", __file__]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


# ----------------------------------------------------------------------------- GPU, realistic shapes


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, dtype, is_causal",
    [
        ((1, 16, 1024, 64), torch.bfloat16, True),  # the leaderboard's heads and d, shorter
        ((1, 16, 2048, 64), torch.bfloat16, False),
        ((1, 4, 1024, 128), torch.bfloat16, True),
        ((2, 2, 512, 32), torch.bfloat16, True),
        ((1, 4, 1024, 64), torch.float16, True),  # the tutorial's own dtype
    ],
)
def test_gpu_matches_float64_reference(shape, dtype, is_causal):
    _check_against_float64(shape, dtype, is_causal)


@pytest.mark.gpu
def test_gpu_leaderboard_shape_matches_float64_reference():
    _check_against_float64((1, 16, 16384, 64), torch.bfloat16, True)


@pytest.mark.gpu
@pytest.mark.parametrize("is_causal", [True, False])
def test_gpu_every_forward_config_matches(monkeypatch, is_causal):
    # the autotuner keeps the fastest config, so each one it may pick must be right (PR #8853
    # fixed causal configs that were not)
    shape, head_dim = (1, 4, 1024, 64), 64
    candidates = tt.prune_invalid_configs(
        list(filter(tt.keep, tt.configs)), {}, N_CTX=shape[2], STAGE=3 if is_causal else 1, HEAD_DIM=head_dim
    )
    assert candidates
    for config in candidates:
        monkeypatch.setattr(tt._attn_fwd, "configs", [config])
        monkeypatch.setattr(tt._attn_fwd, "cache", {})
        try:
            _check_against_float64(shape, torch.bfloat16, is_causal)
        except AssertionError as exc:
            raise AssertionError(f"config {config}: {exc}") from exc
