"""Accumulation digits are deterministic IEEE arithmetic; autocast dtypes follow torch's policy."""

import pytest
import torch

from cs336sys.studies.precision.measure import accumulate, accumulation_table, autocast_dtypes


def test_accumulation_table():
    t = accumulation_table().set_index("case")
    assert list(t.columns) == ["accumulator", "summand", "result", "abs_error"]
    # fp32 + fp32: float32(0.01) is slightly above 0.01 and rounding drifts up
    assert t.loc["a", "result"] == 10.000133514404297  # 10.0001335 in float32
    assert t.loc["a", "abs_error"] == pytest.approx(1.335e-4, rel=1e-3)
    # fp16 + fp16: far off, each add rounds to fp16's coarse grid near 10
    assert t.loc["b", "result"] == 9.953125
    # fp32 accumulator with fp16 summands: the error is fp16's 0.01, implicit or explicit cast alike
    assert t.loc["c", "result"] == t.loc["d", "result"] == 10.00213623046875
    assert t.loc["d", "summand"] == "float16 cast to float32"
    # bf16 + bf16 stalls at 4: 0.01 is below half of bf16's spacing (2^-5) there
    assert t.loc["bf16", "result"] == 4.0
    assert t.loc["fp32+bf16", "result"] == 10.009765625
    assert (t["abs_error"] == (t["result"] - 10.0).abs()).all()


def test_accumulate_keeps_accumulator_dtype():
    assert accumulate(torch.float32, torch.float32, n=1) == float(torch.tensor(0.01, dtype=torch.float32))


def test_autocast_bf16_cpu():
    t = autocast_dtypes("cpu", torch.bfloat16).set_index("quantity")["dtype"].to_dict()
    assert t["parameters"] == "float32"
    assert t["fc1 output"] == "bfloat16"
    assert t["logits"] == "bfloat16"  # fc2 is a linear: autocast runs it in bf16
    # CPU autocast has no fp32 rule for layer_norm (CUDA's has): the output follows
    # its bf16 input. See the GPU test below for the CUDA answer.
    assert t["layer-norm output"] == "bfloat16"
    assert t["loss"] == "float32"  # cross_entropy is on autocast's fp32 list
    assert t["gradients"] == "float32"


def test_autocast_unsupported_dtype_is_a_row():
    t = autocast_dtypes("cpu", torch.float64)
    assert len(t) == 6 and t["dtype"].isna().all()
    assert t["note"].str.contains("unsupported on cpu").all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_cuda(dtype):
    name = str(dtype).removeprefix("torch.")
    t = autocast_dtypes("cuda", dtype).set_index("quantity")["dtype"].to_dict()
    assert t == {
        "parameters": "float32",
        "fc1 output": name,
        "layer-norm output": "float32",
        "logits": name,
        "loss": "float32",
        "gradients": "float32",
    }
