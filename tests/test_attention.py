"""Attention cores, the registry, Performer and the mha layer, against float64 references written here."""

import math

import pytest
import torch

from cs336sys.models import attention as attn
from cs336sys.models.attention import get_attention, relu_attention, sdpa_attention, softmax_attention
from cs336sys.models.mha import VARIANTS, MultiHeadAttention
from cs336sys.models.performer import KERNELS, RELU_EPS, feature_map, orthogonal_features, performer_attention
from cs336sys.models.variants import IMPLS, is_valid

# ---------------------------------------------------------------- float64 references (no library code)


def ref_scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def causal_hidden(L):
    """True where key j > query i (hidden)."""
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return j > i


def ref_softmax_attention(q, k, v, causal):
    s = ref_scores(q, k)
    if causal:
        s = s.masked_fill(causal_hidden(q.shape[-2]), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def ref_relu_attention(q, k, v, causal):
    L = k.shape[-2]
    p = torch.relu(ref_scores(q, k)) / L
    if causal:
        p = p.masked_fill(causal_hidden(q.shape[-2]), 0.0)
    return p @ v


def ref_phi(x, w, kernel):
    m, d = w.shape
    if kernel == "relu":
        return torch.relu(x @ w.T / math.sqrt(m)) + 1e-5
    x = x / d**0.25
    return torch.exp(x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(m)


def ref_performer(q, k, v, w, kernel):
    qp, kp = ref_phi(q, w, kernel), ref_phi(k, w, kernel)
    num = qp @ (kp.transpose(-2, -1) @ v)
    den = qp @ kp.sum(-2, keepdim=True).transpose(-2, -1)
    return num / den


def qkv(shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g, dtype=torch.float64) * scale) for _ in range(3)]


def check_forward_and_grads(lib_fn, ref_fn, shape, seed, *, rtol=1e-4, atol=1e-5, scale=1.0):
    q64, k64, v64 = qkv(shape, seed, scale)
    grad_out = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1000), dtype=torch.float64)

    q, k, v = (t.float().requires_grad_() for t in (q64, k64, v64))
    out = lib_fn(q, k, v)
    assert out.shape == shape and out.dtype == torch.float32
    out.backward(grad_out.float())

    rq, rk, rv = (t.clone().requires_grad_() for t in (q64, k64, v64))
    ref = ref_fn(rq, rk, rv)
    ref.backward(grad_out)

    torch.testing.assert_close(out.detach().double(), ref.detach(), rtol=rtol, atol=atol)
    for name, got, want in (("dq", q.grad, rq.grad), ("dk", k.grad, rk.grad), ("dv", v.grad, rv.grad)):
        assert got is not None, name
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


# ---------------------------------------------------------------- exact cores

SHAPE = (2, 3, 12, 8)  # batch, heads, L, d


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "impl,activation,ref,seed",
    [
        ("eager", "softmax", ref_softmax_attention, 1),
        ("eager", "relu", ref_relu_attention, 2),
        ("sdpa", "softmax", ref_softmax_attention, 3),
    ],
    ids=["eager-softmax", "eager-relu", "sdpa-softmax"],
)
def test_exact_cores_match_float64_reference(impl, activation, ref, seed, causal):
    fn = get_attention(impl, activation)
    check_forward_and_grads(
        lambda q, k, v: fn(q, k, v, is_causal=causal),
        lambda q, k, v: ref(q, k, v, causal),
        SHAPE,
        seed=seed + 10 * causal,
    )


def test_cores_accept_3d_batch_first_inputs_as_the_attention_study_feeds_them():
    # study `attention` passes (batch, L, d) with no head dimension
    for fn, ref in (
        (softmax_attention, ref_softmax_attention),
        (relu_attention, ref_relu_attention),
        (sdpa_attention, ref_softmax_attention),
    ):
        check_forward_and_grads(lambda q, k, v: fn(q, k, v, is_causal=True), lambda q, k, v: ref(q, k, v, True), (4, 10, 16), seed=5)


def test_relu_attention_masking_and_division_by_number_of_keys():
    L = d = 4
    c = 0.75
    q = torch.full((L, d), c)
    k = torch.full((L, d), c)
    v = torch.eye(L)  # out[i, j] = weight of key j for query i
    s = c * c * d / math.sqrt(d)  # every score
    causal = relu_attention(q, k, v, is_causal=True)
    expected = torch.tril(torch.full((L, L), s / L))  # divided by L = 4 keys in every row, not by i + 1
    torch.testing.assert_close(causal, expected, rtol=1e-6, atol=0)
    assert torch.equal(causal[torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)], torch.zeros(L * (L - 1) // 2))
    full = relu_attention(q, k, v, is_causal=False)
    torch.testing.assert_close(full, torch.full((L, L), s / L), rtol=1e-6, atol=0)
    # negative scores contribute nothing
    assert torch.equal(relu_attention(q, -k, v, is_causal=False), torch.zeros(L, L))


def test_causal_first_query_sees_only_the_first_key():
    q, k, v = (t.float() for t in qkv((1, 6, 4), 3))
    for fn in (softmax_attention, sdpa_attention):
        out = fn(q, k, v, is_causal=True)
        torch.testing.assert_close(out[:, 0], v[:, 0])


def test_registry_answers_none_for_sdpa_relu_and_callables_for_real_pairs():
    assert get_attention("sdpa", "relu") is None
    assert get_attention("eager", "softmax") is softmax_attention
    assert get_attention("eager", "relu") is relu_attention
    assert get_attention("sdpa", "softmax") is sdpa_attention
    assert get_attention("eager") is softmax_attention  # softmax is the default activation


def test_registry_rejects_unknown_names_listing_the_valid_ones():
    with pytest.raises(ValueError) as err:
        get_attention("flashy", "softmax")
    assert "flashy" in str(err.value)
    for impl in IMPLS:
        assert impl in str(err.value)
    with pytest.raises(ValueError) as err:
        get_attention("eager", "gelu")
    assert "gelu" in str(err.value) and "softmax" in str(err.value) and "relu" in str(err.value)


def test_is_valid_agrees_with_the_registry():
    for impl in ("eager", "sdpa"):  # "compiled" would import torch.compile (seconds); left out for speed
        for act in attn.ACTIVATIONS:
            assert is_valid(impl, act) == (get_attention(impl, act) is not None)
    assert not is_valid("nope", "softmax") and not is_valid("eager", "nope")
    assert is_valid("triton", "relu")  # without importing the optional backend


# ---------------------------------------------------------------- Performer


@pytest.mark.parametrize("kernel", KERNELS)
def test_performer_matches_float64_reference_forward_and_grads(kernel):
    d, m = 8, 24
    w = orthogonal_features(m, d, seed=3)
    check_forward_and_grads(
        lambda q, k, v: performer_attention(q, k, v, w, kernel),
        lambda q, k, v: ref_performer(q, k, v, w.double(), kernel),
        (2, 2, 10, d),
        seed=11,
        scale=0.7,
    )


def test_performer_relu_feature_map_is_relu_plus_eps():
    w = orthogonal_features(6, 4, seed=0)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    phi = feature_map(x, w, "relu", is_query=True)
    torch.testing.assert_close(phi, torch.relu(x @ w.T / math.sqrt(6)) + RELU_EPS)
    assert (phi >= RELU_EPS).all()


def test_performer_softmax_features_are_positive_and_stabiliser_cancels():
    w = orthogonal_features(32, 8, seed=1)
    q, k, v = qkv((1, 16, 8), 7)
    out = performer_attention(q, k, v, w.double(), "softmax")
    # shifting all keys' features by a constant factor (what the stabiliser does) leaves the output unchanged
    torch.testing.assert_close(out, ref_performer(q, k, v, w.double(), "softmax"), rtol=1e-10, atol=1e-12)
    assert (feature_map(q, w.double(), "softmax", True) > 0).all()


def test_unknown_performer_kernel_is_rejected():
    with pytest.raises(ValueError, match="relu"):
        feature_map(torch.zeros(2, 4), orthogonal_features(4, 4), "cosine", True)


def test_orthogonal_features_are_seeded_and_orthogonal_within_blocks():
    d, m = 8, 20
    w = orthogonal_features(m, d, seed=5)
    assert w.shape == (m, d)
    assert torch.equal(w, orthogonal_features(m, d, seed=5))
    assert not torch.equal(w, orthogonal_features(m, d, seed=6))
    for start in range(0, m, d):
        block = w[start : start + d]
        gram = block @ block.T
        off = gram - torch.diag(torch.diag(gram))
        assert off.abs().max() < 1e-4 * gram.diag().max()
    # rows have Gaussian-like norms (≈ √d), not unit norms
    assert w.norm(dim=1).mean().item() == pytest.approx(math.sqrt(d), rel=0.35)


def test_performer_error_to_exact_softmax_attention_shrinks_with_more_features():
    d, L, seeds = 16, 64, range(5)

    def mean_error(m):
        errs = []
        for seed in seeds:
            q, k, v = qkv((2, L, d), 100 + seed, scale=0.5)
            out = performer_attention(q, k, v, orthogonal_features(m, d, seed=seed).double(), "softmax")
            exact = ref_softmax_attention(q, k, v, causal=False)
            errs.append(((out - exact).norm() / exact.norm()).item())
        return sum(errs) / len(errs)

    e16, e256 = mean_error(16), mean_error(256)
    # Monte-Carlo error ~ 1/√m: a 16× larger m should cut it by several times (observed ≈ 2.8×)
    assert e256 < 0.6 * e16, (e16, e256)
    assert e256 < 0.3


# ---------------------------------------------------------------- mha layer


@pytest.mark.parametrize(
    "variant,kernel,m",
    [
        ("exact-eager", "softmax", None),
        ("exact-eager", "relu", None),
        ("exact-sdpa", "softmax", None),
        ("performer", "relu", 16),
        ("performer", "softmax", 16),
    ],
)
def test_mha_variants_run_forward_and_backward(variant, kernel, m):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, variant, kernel, num_features=m)
    x = torch.randn(2, 10, 16, requires_grad=True)
    out = layer(x)
    assert out.shape == (2, 10, 16)
    assert torch.isfinite(out).all()
    out.pow(2).mean().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert layer.in_proj.weight.grad.abs().sum() > 0


def test_mha_rejects_exact_sdpa_with_relu_and_other_bad_arguments():
    with pytest.raises(ValueError) as err:
        MultiHeadAttention(16, 4, "exact-sdpa", "relu")
    assert "exact-sdpa" in str(err.value)
    for v in VARIANTS:
        assert v in str(err.value)
    with pytest.raises(ValueError):
        MultiHeadAttention(16, 4, "nope", "softmax")
    with pytest.raises(ValueError, match="num_features"):
        MultiHeadAttention(16, 4, "performer", "relu")
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(18, 4, "exact-eager", "softmax")


def test_mha_exact_eager_softmax_equals_torch_multihead_attention():
    torch.manual_seed(0)
    ours = MultiHeadAttention(16, 4, "exact-eager", "softmax")
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.in_proj.weight)
        ref.in_proj_bias.copy_(ours.in_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(3, 9, 16)
    want, _ = ref(x, x, x, need_weights=False)
    torch.testing.assert_close(ours(x), want, rtol=1e-5, atol=1e-5)


def test_mha_exact_sdpa_equals_exact_eager_with_same_weights():
    torch.manual_seed(0)
    eager = MultiHeadAttention(16, 2, "exact-eager", "softmax")
    sdpa = MultiHeadAttention(16, 2, "exact-sdpa", "softmax")
    sdpa.load_state_dict(eager.state_dict())
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(sdpa(x), eager(x), rtol=1e-5, atol=1e-5)


def test_mha_performer_features_are_seeded_per_head_dim():
    a = MultiHeadAttention(16, 4, "performer", "softmax", num_features=8, seed=3)
    assert a.features.shape == (8, 4)
    assert torch.equal(a.features, orthogonal_features(8, 4, 3))
