"""Kernel attribution: a hand-built trace with exact answers, then one real CPU profile."""

import gzip
import json

import numpy as np
import pytest
import torch

from cs336sys.profiling import (
    PHASES,
    Kernel,
    Range,
    attention_subrange_table,
    attribute_kernels,
    events_from_profiler,
    profile_steps,
    summarise_kernels,
)

# Two steps. Step 1: forward [0, 100], backward [100, 250], optimizer [250, 300],
# with attention sub-ranges inside forward; step 2's forward is [400, 500].
RANGES = [
    Range("forward", 0, 100),
    Range("computing attention scores", 10, 30),
    Range("computing softmax", 30, 50),
    Range("final matmul", 50, 70),
    Range("backward", 100, 250),
    Range("optimizer_step", 250, 300),
    Range("forward", 400, 500),
]
KERNELS = [
    Kernel("ampere_sgemm_128x64_nn", 10, 10),
    Kernel("softmax_warp_forward", 30, 10),
    Kernel("ampere_sgemm_128x64_nn", 50, 10),
    Kernel("elementwise_straddler", 90, 40),  # 10 µs in forward, 30 in backward
    Kernel("cutlass_80_tensorop_gemm_bwd", 150, 50),
    Kernel("multi_tensor_apply_add", 260, 10),
    Kernel("cudaDeviceSynchronize_tail", 320, 10),  # outside every phase
    Kernel("ampere_sgemm_128x64_nn", 410, 10),
]


def test_attribution_by_overlap():
    table = attribute_kernels(RANGES, KERNELS)
    got = {(r.phase, r.kernel): (r.calls, r.total_us) for r in table.itertuples()}
    assert got == {
        ("forward", "ampere_sgemm_128x64_nn"): (3, 30.0),
        ("forward", "softmax_warp_forward"): (1, 10.0),
        ("backward", "cutlass_80_tensorop_gemm_bwd"): (1, 50.0),
        ("backward", "elementwise_straddler"): (1, 40.0),  # the larger overlap wins, counted whole
        ("optimizer_step", "multi_tensor_apply_add"): (1, 10.0),
        ("other", "cudaDeviceSynchronize_tail"): (1, 10.0),
    }
    assert list(table["phase"].unique()) == ["forward", "backward", "optimizer_step", "other"]
    totals = table.groupby("phase")["total_us"].sum()
    assert totals.to_dict() == {"forward": 40.0, "backward": 90.0, "optimizer_step": 10.0, "other": 10.0}
    np.testing.assert_allclose(table.groupby("phase")["share_of_phase"].sum(), 1.0)
    row = table[table["kernel"] == "ampere_sgemm_128x64_nn"].iloc[0]
    assert row.mean_us == 10.0 and row.share_of_phase == 0.75
    # every kernel lands in exactly one phase
    assert table["total_us"].sum() == sum(k.duration_us for k in KERNELS)


def test_attention_subranges():
    sub = attention_subrange_table(RANGES, KERNELS).set_index("range")
    assert sub["count"].tolist() == [1, 1, 1]
    assert sub["total_us"].tolist() == [20.0, 20.0, 20.0]
    assert sub["kernel_us"].tolist() == [10.0, 10.0, 10.0]
    empty = attention_subrange_table([Range("forward", 0, 1)], KERNELS)
    assert empty["count"].tolist() == [0, 0, 0] and empty["total_us"].isna().all()


def test_summary():
    s = summarise_kernels(attribute_kernels(RANGES, KERNELS), steps=2)
    assert s["phase_total_us"] == {"forward": 40.0, "backward": 90.0, "optimizer_step": 10.0, "other": 10.0}
    assert s["phase_total_us_per_step"]["backward"] == 45.0
    assert s["forward_top_kernel"] == "ampere_sgemm_128x64_nn"
    assert s["forward_top_kernel_calls_per_step"] == 1.5
    assert s["backward_top_kernel"] == "cutlass_80_tensorop_gemm_bwd"
    assert s["same_top_kernel_fwd_bwd"] is False
    assert s["matmul_share"]["forward"] == 0.75
    assert s["matmul_share"]["backward"] == pytest.approx(50 / 90)
    assert s["non_matmul_over_1pct"]["forward"] == [{"kernel": "softmax_warp_forward", "share": 0.25}]


def test_empty_inputs():
    assert attribute_kernels(RANGES, []).empty
    assert attribute_kernels([], KERNELS[:1])["phase"].tolist() == ["other"]


def test_real_cpu_profile(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 64)

    def step() -> None:
        with torch.profiler.record_function("forward"):
            loss = torch.relu(model(x)).sum()
        with torch.profiler.record_function("backward"):
            loss.backward()
        with torch.profiler.record_function("optimizer_step"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    trace = tmp_path / "trace.json.gz"
    prof = profile_steps(step, steps=3, device="cpu", trace_path=str(trace))
    ranges, kernels = events_from_profiler(prof)

    assert [r.name for r in ranges if r.name in PHASES] == list(PHASES) * 3
    assert kernels and all(k.device_kind == "cpu" and k.duration_us > 0 for k in kernels)
    assert not any(k.name in PHASES for k in kernels)

    table = attribute_kernels(ranges, kernels)
    assert set(PHASES) <= set(table["phase"])
    np.testing.assert_allclose(table.groupby("phase")["share_of_phase"].sum(), 1.0)
    assert "aten::addmm" in set(table.loc[table["phase"] == "forward", "kernel"])
    assert "aten::add_" in set(table.loc[table["phase"] == "optimizer_step", "kernel"])
    summary = summarise_kernels(table, steps=3)
    assert summary["matmul_share"]["forward"] > 0  # aten::addmm matches the pattern

    with gzip.open(trace) as f:  # torch gzips a .json.gz trace itself
        assert "traceEvents" in json.load(f)
    assert not list(tmp_path.glob(".tmp-*"))
