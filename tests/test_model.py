"""TransformerLM, its parts, the size table and the optimizers, on CPU with tiny shapes."""

import math

import pytest
import torch

from cs336sys.models.model import Embedding, Linear, RMSNorm, RotaryEmbedding, TransformerLM
from cs336sys.models.optim import DEFAULTS, AdamW, make_optimizer
from cs336sys.models.sizes import MODEL_SIZES, ModelSize, known_sizes, parameter_count, resolve_size

TINY = ModelSize(d_model=32, d_ff=64, num_layers=2, num_heads=4)
VOCAB = 101
CTX = 16

# The handout's Table 1 sizes with vocabulary 10 000, in millions, rounded to 0.1M.
EXPECTED_MILLIONS = {"small": 128.6, "medium": 423.2, "large": 969.4, "xl": 1998.2, "2.7B": 3406.8}


def tiny_lm(attention="eager", seed=0, **kwargs):
    torch.manual_seed(seed)
    return TransformerLM.from_size(TINY, VOCAB, CTX, attention=attention, **kwargs)


# ---------------------------------------------------------------- sizes and parameter counts


def test_size_table_is_exactly_the_handouts_five_sizes():
    assert list(MODEL_SIZES) == list(EXPECTED_MILLIONS)


@pytest.mark.parametrize("name", list(EXPECTED_MILLIONS))
def test_parameter_count_on_meta_device_context(name):
    size = MODEL_SIZES[name]
    with torch.device("meta"):
        model = TransformerLM.from_size(size, 10_000, 128)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert round(model.num_parameters() / 1e6, 1) == EXPECTED_MILLIONS[name]
    assert round(parameter_count(size) / 1e6, 1) == EXPECTED_MILLIONS[name]
    assert model.num_parameters() == parameter_count(size, 10_000)


@pytest.mark.parametrize("name", ["small", "2.7B"])
def test_parameter_count_with_device_argument_and_other_vocab(name):
    size = MODEL_SIZES[name]
    model = TransformerLM.from_size(size, 777, 64, device="meta")
    assert next(model.parameters()).device.type == "meta"
    assert model.num_parameters() == parameter_count(size, vocab_size=777)
    # the count is exactly the module's distinct parameters, the RoPE cache is not one
    assert model.num_parameters() == sum(p.numel() for p in set(model.parameters()))


def test_unknown_size_raises_value_error_listing_known_sizes():
    with pytest.raises(ValueError) as err:
        resolve_size("gigantic")
    msg = str(err.value)
    assert "gigantic" in msg
    for name in EXPECTED_MILLIONS:
        assert name in msg


def test_extra_sizes_are_merged_and_listed():
    extra = {"tiny": {"d_model": "32", "d_ff": 64, "num_layers": 1, "num_heads": 2}}
    assert resolve_size("tiny", extra) == ModelSize(32, 64, 1, 2)
    assert resolve_size("small", extra) == MODEL_SIZES["small"]
    assert "tiny" not in MODEL_SIZES  # the built-in table is never edited
    assert list(known_sizes(extra))[-1] == "tiny"
    with pytest.raises(ValueError, match="tiny"):
        resolve_size("nope", extra)


def test_size_whose_width_is_not_divisible_by_heads_is_rejected():
    with pytest.raises(ValueError, match="divisible"):
        resolve_size("odd", {"odd": {"d_model": 30, "d_ff": 64, "num_layers": 1, "num_heads": 4}})


# ---------------------------------------------------------------- model behaviour


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_causality(attention):
    model = tiny_lm(attention).eval()
    tokens = torch.randint(VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    t = 5
    changed = tokens.clone()
    changed[:, t] = (tokens[:, t] + 7) % VOCAB
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert a.shape == (2, 12, VOCAB)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    # every position at or after t sees the change
    per_position = (a[:, t:] - b[:, t:]).abs().amax(dim=-1)  # (batch, positions)
    assert (per_position > 1e-4).all(), per_position


def test_eager_and_sdpa_give_the_same_logits():
    eager = tiny_lm("eager", seed=0).eval()
    sdpa = tiny_lm("sdpa", seed=123).eval()
    sdpa.load_state_dict(eager.state_dict())
    tokens = torch.randint(VOCAB, (3, CTX), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(sdpa(tokens), eager(tokens), rtol=1e-5, atol=1e-5)


def test_same_seed_builds_the_same_weights_and_different_seed_does_not():
    a, b, c = tiny_lm(seed=0), tiny_lm(seed=0), tiny_lm(seed=1)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_model_trains_end_to_end_gradients_reach_every_parameter():
    model = tiny_lm()
    tokens = torch.randint(VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    # an untrained LM with these inits predicts near-uniformly, but not exactly
    assert abs(loss.item() - math.log(VOCAB)) < 3.0
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_rope_cache_is_one_module_shared_by_all_layers():
    model = TransformerLM.from_size(ModelSize(32, 64, 4, 2), VOCAB, CTX)
    ropes = [layer.attn.rope for layer in model.layers]
    assert all(r is ropes[0] for r in ropes)
    assert isinstance(ropes[0], RotaryEmbedding)
    assert ropes[0].cos.shape == (CTX, 32 // 2 // 2)
    # a non-persistent buffer: not a parameter and not in the checkpoint
    assert not any("rope" in n for n, _ in model.named_parameters())
    assert not any("rope" in k for k in model.state_dict())
    # named_buffers deduplicates: one cos/sin pair for the whole model
    assert len([n for n, _ in model.named_buffers() if n.endswith(".cos")]) == 1


def _rope_reference(x, positions, theta=10000.0):
    """Rotate interleaved pairs (x0,x1), (x2,x3)… by angle pos·θ^(−2i/d), in float64."""
    x = x.double()
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(d // 2):
        freq = theta ** (-2.0 * i / d)
        ang = positions.double() * freq
        c, s = torch.cos(ang)[:, None], torch.sin(ang)[:, None]
        x1, x2 = x[..., 2 * i : 2 * i + 1], x[..., 2 * i + 1 : 2 * i + 2]
        out[..., 2 * i : 2 * i + 1] = x1 * c - x2 * s
        out[..., 2 * i + 1 : 2 * i + 2] = x1 * s + x2 * c
    return out


def test_rope_matches_reference_and_depends_on_relative_position_only():
    rope = RotaryEmbedding(context_length=32, head_dim=8)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 10, 8, generator=g)
    pos = torch.arange(10)
    got = rope(x, pos)
    assert got.dtype == x.dtype
    torch.testing.assert_close(got.double(), _rope_reference(x, pos), rtol=1e-5, atol=1e-5)
    # rotation keeps norms; <R_m q, R_n k> depends on m - n only
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)
    q, k = torch.randn(8, generator=g), torch.randn(8, generator=g)

    def dot(m, n):
        return (rope(q[None], torch.tensor([m])) * rope(k[None], torch.tensor([n]))).sum()

    torch.testing.assert_close(dot(7, 3), dot(24, 20), rtol=1e-5, atol=1e-5)
    assert abs(dot(7, 3) - dot(7, 4)) > 1e-4


def test_rmsnorm_under_bf16_autocast_follows_input_dtype_and_computes_in_fp32():
    d = 512
    g = torch.Generator().manual_seed(0)
    # widely spread magnitudes: a mean of squares accumulated in bf16 would be visibly off
    x = (torch.randn(64, d, generator=g) * torch.logspace(-2, 2, d)).to(torch.bfloat16)
    norm = RMSNorm(d)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(d, generator=g) + 0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
        y32 = norm(x.float())
    assert y.dtype == torch.bfloat16
    assert y32.dtype == torch.float32

    x64 = x.double()
    ref = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    # fp32 output: fp32 accuracy
    torch.testing.assert_close(y32.double(), ref, rtol=2e-6, atol=1e-7)
    # bf16 output: the fp32 result rounded once to bf16 — within half a bf16 ulp of the exact value,
    # and (but for rare double-rounding ties) equal to the exact value rounded to bf16
    rel = ((y.double() - ref).abs() / ref.abs()).max().item()
    assert rel <= 2**-8 * 1.0001, rel
    assert (y == ref.to(torch.bfloat16)).float().mean().item() > 0.99


def test_linear_init_std_and_truncation():
    torch.manual_seed(0)
    d_in, d_out = 384, 640
    w = Linear(d_in, d_out).weight.detach()
    assert w.shape == (d_out, d_in)
    sigma = math.sqrt(2.0 / (d_in + d_out))
    # a normal truncated at ±3σ has std 0.9866σ
    assert w.std().item() == pytest.approx(0.9866 * sigma, rel=0.02)
    assert w.abs().max().item() <= 3 * sigma + 1e-7
    assert w.abs().max().item() > 2.5 * sigma  # truncated at 3σ, not tighter
    assert abs(w.mean().item()) < 0.01 * sigma


def test_embedding_init_truncated_standard_normal():
    torch.manual_seed(0)
    w = Embedding(500, 256).weight.detach()
    assert w.std().item() == pytest.approx(0.9866, rel=0.02)
    assert w.abs().max().item() <= 3.0 + 1e-6
    assert w.abs().max().item() > 2.5


def test_linear_on_meta_is_shaped_without_initialising():
    lin = Linear(3, 5, device="meta")
    assert lin.weight.shape == (5, 3) and lin.weight.is_meta


# ---------------------------------------------------------------- optimizers


def _course_adamw_reference(theta, grads, lr, betas, eps, wd):
    """CS336 assignment 1, Algorithm 1, in float64: Adam update, then decoupled decay of the updated θ."""
    b1, b2 = betas
    theta = theta.double().clone()
    m = torch.zeros_like(theta)
    v = torch.zeros_like(theta)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        alpha_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        theta = theta - alpha_t * m / (v.sqrt() + eps)
        theta = theta - lr * wd * theta
    return theta


def _torch_adamw_reference(theta, grads, lr, betas, eps, wd):
    """PyTorch's AdamW in float64: decay θ first, then the bias-corrected Adam step."""
    b1, b2 = betas
    theta = theta.double().clone()
    m = torch.zeros_like(theta)
    v = torch.zeros_like(theta)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        theta = theta * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        denom = v.sqrt() / math.sqrt(1 - b2**t) + eps
        theta = theta - lr / (1 - b1**t) * m / denom
    return theta


def _run(opt_name, theta0, grads, **hp):
    p = torch.nn.Parameter(theta0.clone())
    frozen = torch.nn.Parameter(torch.ones(3))  # no grad: must be left alone
    opt = make_optimizer(opt_name, [p, frozen], **hp)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    assert torch.equal(frozen.detach(), torch.ones(3))
    return p.detach(), opt


HP = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.2)


def _problem():
    g = torch.Generator().manual_seed(0)
    theta0 = torch.randn(7, 5, generator=g)
    grads = [torch.randn(7, 5, generator=g) * s for s in (1.0, 0.1, 3.0, 0.5, 2.0)]
    return theta0, grads


def test_course_adamw_matches_float64_reference():
    theta0, grads = _problem()
    got, opt = _run("course", theta0, grads, **HP)
    assert isinstance(opt, AdamW)
    ref = _course_adamw_reference(theta0, grads, HP["lr"], HP["betas"], HP["eps"], HP["weight_decay"])
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)
    # and the two AdamW conventions differ measurably here, so the test tells them apart
    other = _torch_adamw_reference(theta0, grads, HP["lr"], HP["betas"], HP["eps"], HP["weight_decay"])
    assert (ref - other).abs().max() > 1e-4


def test_course_adamw_defaults_are_the_shared_defaults():
    opt = make_optimizer("course", [torch.nn.Parameter(torch.zeros(2))])
    group = opt.param_groups[0]
    assert group["lr"] == DEFAULTS["lr"]
    assert tuple(group["betas"]) == tuple(DEFAULTS["betas"])
    assert group["eps"] == DEFAULTS["eps"]
    assert group["weight_decay"] == DEFAULTS["weight_decay"]


def test_fused_adamw_works_on_cpu_and_matches_torch_adamw_reference():
    theta0, grads = _problem()
    got, opt = _run("fused", theta0, grads, **HP)
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["fused"] is True
    ref = _torch_adamw_reference(theta0, grads, HP["lr"], HP["betas"], HP["eps"], HP["weight_decay"])
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_fused_adamw_uses_the_same_default_hyper_parameters():
    opt = make_optimizer("fused", [torch.nn.Parameter(torch.zeros(2))])
    group = opt.param_groups[0]
    assert group["lr"] == DEFAULTS["lr"]
    assert tuple(group["betas"]) == tuple(DEFAULTS["betas"])
    assert group["eps"] == DEFAULTS["eps"]
    assert group["weight_decay"] == DEFAULTS["weight_decay"]


def test_unknown_optimizer_is_rejected_with_the_known_names():
    with pytest.raises(ValueError) as err:
        make_optimizer("sgd", [torch.nn.Parameter(torch.zeros(1))])
    assert "course" in str(err.value) and "fused" in str(err.value)
