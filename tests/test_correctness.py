"""The correctness check (measure.correctness) sees every tile, more than one call, the output's dtype and shape, and
an output of the timed loop (the verdicts it keeps: tests/test_checkcache.py).

The wrong kernels are the fixture course repository's plug-ins (tests/fixtures/course_repo): each study's
``measure()`` runs in this process, as the measuring child would run it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys import catalog, plugins
from cs336sys.measure import correctness
from cs336sys.measure.correctness import check_attention
from cs336sys.measure.session import Session
from cs336sys.models.attention import resolve, softmax_attention
from cs336sys.rows import Wrong

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests/fixtures/course_repo"
CPU = torch.device("cpu")
NO_RESCALE = "cs336_systems.flash_no_rescale:attention"
BAD = "cs336_systems.bad_kernels"


@pytest.fixture(autouse=True)
def _no_user_lines():
    yield
    plugins.activate({})


def plug(function: str, name: str = "mine", path: Path = FIXTURE) -> str:
    cell_kwargs("attention"), cell_kwargs("flash")  # their default config, validated once, registers no plug-in later
    plugins.activate({"path": str(path), "attention": {name: {"function": function, "form": "callable"}}})
    return name


def attention_cell(impl: str, **values) -> list[dict]:
    values = {
        "d_model": 16,
        "seq_len": 256,
        "activation": "softmax",
        "causal": True,
        "precision": "fp32",
        "batch_size": 2,
        "warmup_steps": 1,
        "measure_steps": 2,
        **values,
    }
    from cs336sys.studies.attention import measure as attention

    return list(attention.measure(CPU, {}, Session(), **cell_kwargs("attention", impl=impl, **values)))


def flash_cell(impl: str, **values) -> list[dict]:
    values = {"seq_len": 256, "head_dim": 16, "precision": "fp32", "num_heads": 2, "batch_size": 1, "causal": True, "rep_ms": 1.0, **values}
    from cs336sys.studies.flash import measure as flash

    return list(flash.measure(CPU, {}, Session(), **cell_kwargs("flash", impl=impl, **values)))


# --- every tile ---------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_a_kernel_that_forgets_to_rescale_between_tiles_is_wrong_in_the_attention_study(causal):
    with pytest.raises(Wrong, match=r"wrong (output|dq|dk|dv) against a float64 reference .* L, d\) = \(2, 1, 300, 16\).* max abs error"):
        attention_cell(plug(NO_RESCALE), causal=causal)


def test_a_kernel_that_forgets_to_rescale_between_tiles_is_wrong_in_the_flash_study():
    with pytest.raises(Wrong, match=r"wrong (output|dq|dk|dv) against a float64 reference .* output 0\.\d"):
        flash_cell(plug(NO_RESCALE))


def test_the_check_spans_three_tiles_of_every_common_width_with_a_ragged_last_one():
    length = correctness.check_shape(1, 64)[2]
    for width in (16, 32, 64, 128):
        assert -(-length // width) >= 3 and length % width, width
    assert correctness.check_shape(16, 64) == (2, 2, correctness.CHECK_SEQ, 64)
    assert correctness.check_shape(4, 64, supports=lambda n: n % 128 == 0)[2] == 384  # the tutorial kernel: multiples of 128


def test_a_kernel_with_tiles_of_32_or_more_is_checked_at_a_ragged_multiple_of_16():
    # a multiple of 16 shares Triton's specialisation (and so the compiled kernels) with the timed lengths
    length = correctness.check_shape(1, 64, tile=32)[2]
    assert length % 16 == 0 and length >= correctness.CHECK_SEQ
    for width in (32, 64, 128):
        assert -(-length // width) >= 3 and length % width, width
    assert correctness.check_shape(1, 64, supports=lambda n: n % 128 == 0, tile=32)[2] == 384  # none ragged: whole tiles


def test_right_kernels_pass_across_tiles():
    course = resolve("eager", kind=catalog.FUSED)[0]
    for fn in (course, _adapter()):
        for causal in (True, False):
            errors = check_attention(fn, (2, 2, correctness.CHECK_SEQ, 16), "fp32", causal, CPU)
            assert max(errors.values()) < 1e-5
    relu = resolve("eager", "relu", kind=catalog.CORE)[0]
    assert check_attention(relu, (2, 1, correctness.CHECK_SEQ, 16), "fp32", True, CPU, activation="relu")["output"] < 1e-5


def _adapter():
    plugins.activate(
        {"path": str(FIXTURE), "attention": {"course": {"function": "tests.adapters:get_flashattention_autograd_function_pytorch"}}}
    )
    return resolve("course", kind=catalog.FUSED)[0]


# --- more than one call, the dtype and the shape -----------------------------------------------------
def test_a_kernel_that_caches_its_first_answer_is_wrong():
    with pytest.raises(Wrong, match=r"wrong output .* call 2 of 2"):
        attention_cell(plug(f"{BAD}:caching"))


def test_a_float64_computation_timed_as_fp32_is_wrong_and_says_so():
    with pytest.raises(Wrong, match=r"the output is float64 for float32 inputs \(precision fp32\): the implementation computes"):
        attention_cell(plug(f"{BAD}:in_float64"))
    with pytest.raises(Wrong, match=r"float64 for float32 inputs"):
        flash_cell(plug(f"{BAD}:in_float64"))


def test_an_output_of_another_shape_is_wrong_and_says_so():
    with pytest.raises(Wrong, match=r"output of shape \(2, 1, 300, 16, 1\) for inputs of shape \(2, 1, 300, 16\)"):
        attention_cell(plug(f"{BAD}:extra_dim"))

    def unsqueezed(q, k, v, is_causal=False):  # broadcasts against the reference: values alone would pass it
        return softmax_attention(q, k, v, is_causal)[None]

    with pytest.raises(Wrong, match=r"output of shape \(1, 2, 1, 300, 16\)"):
        check_attention(unsqueezed, correctness.check_shape(1, 16), "fp32", True, CPU)
    with pytest.raises(Wrong, match=r"returned a tuple, not a tensor"):
        check_attention(lambda q, k, v, is_causal: (q,), correctness.check_shape(1, 16), "fp32", True, CPU)


@pytest.mark.parametrize(
    "answer, says",
    [
        (lambda o: o.to("meta"), "the output is on meta for inputs on cpu"),
        (lambda o: o.to(torch.float16), "the output is float16 for float32 inputs"),
        (lambda o: o * float("nan"), "wrong output against a float64 reference .* relative to the reference's largest value nan"),
        (lambda o: o.transpose(-2, -1).reshape(o.shape), "wrong (output|dq|dk|dv) .* output 1"),  # the same shape, scrambled
        (lambda o: o.flip(-2), "wrong (output|dq|dk|dv) .* output 1"),  # rows in the wrong order
    ],
)
def test_other_wrong_answers_are_wrong(answer, says):
    with pytest.raises(Wrong, match=says):
        check_attention(lambda q, k, v, is_causal: answer(softmax_attention(q, k, v, is_causal)), (2, 1, 300, 16), "fp32", True, CPU)


def test_an_implementation_that_refuses_ragged_lengths_is_checked_at_whole_tiles():
    from cs336sys.measure.correctness import check_implementation

    lengths = []

    def whole_tiles_only(q, k, v, is_causal=False):
        lengths.append(q.shape[-2])
        if q.shape[-2] % 128:
            raise RuntimeError("No available kernel: sequence length must be a multiple of 128")
        return softmax_attention(q, k, v, is_causal)

    check_implementation("eager", whole_tiles_only, correctness.check_shape(1, 16), "fp32", True, CPU)
    assert lengths == [300, 384, 384]
    with pytest.raises(Wrong, match=r"L, d\) = \(2, 1, 384, 16\)"):  # and judged there
        check_implementation("eager", lambda *a, **k: 2 * whole_tiles_only(*a, **k), correctness.check_shape(1, 16), "fp32", True, CPU)
    with pytest.raises(IndexError, match="out of bounds"):  # one that fails at every length says so
        check_implementation("eager", lambda q, k, v, is_causal: q[:, :, 10**6], correctness.check_shape(1, 16), "fp32", True, CPU)


# --- an output of the timed loop -----------------------------------------------------------------
def test_a_kernel_wrong_only_at_the_cells_own_length_is_wrong():
    # right on the first 512 keys, so the check's 300 positions pass it; the cell's 600 do not
    with pytest.raises(Wrong, match=r"sampled query rows of the timed loop's output, \(batch, heads, L, d\) = \(1, 1, 600, 16\)"):
        attention_cell(plug(f"{BAD}:first_512_keys"), seq_len=600, batch_size=1)
    with pytest.raises(Wrong, match=r"timed loop's output"):
        flash_cell(plug(f"{BAD}:first_512_keys"), seq_len=600, num_heads=1)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("activation", ["softmax", "relu"])
def test_the_timed_output_check_passes_the_reference_and_finds_one_wrong_row(causal, activation):
    fn = resolve("eager", activation, kind=catalog.CORE)[0]
    q, k, v = (torch.randn(2, 3, 700, 16) for _ in range(3))
    out = fn(q, k, v, is_causal=causal)
    assert correctness.check_timed_output(out, q, k, v, "fp32", causal, activation=activation) < 1e-6
    out[:, :, -1] += out.abs().max()  # the last row is always among those compared
    with pytest.raises(Wrong, match="timed loop's output"):
        correctness.check_timed_output(out, q, k, v, "fp32", causal, activation=activation)


def test_right_plugins_and_ours_still_time_in_both_studies():
    assert {"forward", "backward"} <= {r["phase"] for r in attention_cell("eager")}
    assert {"forward", "backward"} <= {r["phase"] for r in attention_cell("eager", activation="relu", causal=False)}
    assert {r["phase"] for r in flash_cell("eager", precision="bf16")} == {"forward", "backward", "forward_backward"}
    plugins.activate(
        {"path": str(FIXTURE), "attention": {"course": {"function": "tests.adapters:get_flashattention_autograd_function_pytorch"}}}
    )
    assert len(flash_cell("course", seq_len=300)) == 3


# --- the CPU interpreter runs our Triton kernels through the new check: tests/test_triton_attention.py ------------


# --- a wrong row through the cell runner --------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("study", ["attention", "flash"])
def test_the_tile_bug_is_a_wrong_row_without_a_time(study):
    from cs336sys.pipeline import plan
    from cs336sys.pipeline.cells import run_cell
    from cs336sys.pipeline.config import validate_config

    section = {"path": str(FIXTURE), "attention": {"no-rescale": {"function": NO_RESCALE, "form": "callable"}}}
    grid = {
        "attention": {"d_model": [16], "seq_len": [256], "activation": ["softmax"], "impl": ["no-rescale"]},
        "flash": {"seq_len": [256], "head_dim": [16], "precision": ["fp32"], "impl": ["no-rescale"], "num_heads": [1]},
    }[study]
    config, offered = validate_config({"run": "t", "device": "cpu", "studies": [study], "plugins": section, study: {"grid": grid}})
    (axes,) = plan.grid(study, config, offered).values()
    (row,) = run_cell(plan.plan_cell(study, axes, config, offered))  # the child registers the name from the cell's settings alone
    assert row["status"] == "wrong", row
    assert "against a float64 reference (batch, heads, L, d) = (2, 1, 300, 16)" in row["error"] and "median_ms" not in row
