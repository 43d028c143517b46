"""Kernel attribution: a hand-built trace with exact answers, then one real CPU profile."""

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cs336sys.fileio import OutputPathError
from cs336sys.measure.profiling import (
    MATMUL_PATTERN,
    PHASES,
    Kernel,
    Range,
    attention_subrange_table,
    attribute_kernels,
    events_from_profiler,
    export_trace,
    profile_steps,
)
from cs336sys.measure.session import Session
from cs336sys.studies.profile.report import non_matmul_kernels, profile_answers

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


def _profile_rows(table, steps, mode="train", subranges=None):
    """Rows of one profile cell as the study writes them (kind = kernel / subrange), from a kernel table."""
    common = dict(study="profile", cell_id="c", status="ok", profiled_steps=steps, device_kind="cuda", mode=mode)
    rows = [dict(kind="kernel", **rec, **common) for rec in table.to_dict("records")]
    if subranges is not None:
        rows += [dict(kind="subrange", phase=rec.pop("range"), **rec, **common) for rec in subranges.to_dict("records")]
    return pd.DataFrame(rows)


def test_summary():
    """The nsys_profile answers (report: profile_answers, non_matmul_kernels) from the hand-built trace."""
    table = attribute_kernels(RANGES, KERNELS)
    totals = table.groupby("phase")["total_us"].sum()
    assert totals.to_dict() == {"forward": 40.0, "backward": 90.0, "optimizer_step": 10.0, "other": 10.0}
    assert totals["backward"] / 2 == 45.0  # per step
    is_mm = table["kernel"].str.contains(MATMUL_PATTERN)
    matmul_share = table[is_mm].groupby("phase")["share_of_phase"].sum()
    assert matmul_share["forward"] == 0.75
    assert matmul_share["backward"] == pytest.approx(50 / 90)

    prof = _profile_rows(table, steps=2, subranges=attention_subrange_table(RANGES, KERNELS))
    answers = profile_answers(prof).iloc[0]
    assert answers["train_forward_profiler_ms"] == pytest.approx(40.0 / 2 / 1e3)  # 40 µs over 2 steps
    assert answers["forward_top_kernel"] == "ampere_sgemm_128x64_nn"
    assert answers["its_calls_per_forward"] == 1.5
    assert answers["its_share_of_forward"] == 0.75
    assert answers["fwd+bwd_top_kernel"] == "cutlass_80_tensorop_gemm_bwd"  # 50 µs against the sgemm's 30
    assert not bool(answers["same_top_kernel"])
    assert answers["train_matmul_share"] == pytest.approx(80 / 150)  # (30 + 50) µs of all 150 µs of train kernels
    assert answers["attn_softmax_over_matmul_time"] == pytest.approx(10 / 20)
    assert np.isnan(answers["inference_matmul_share"])  # no inference kernels in this table

    non_mm = non_matmul_kernels(prof)
    by_phase = {p: list(zip(g["kernel"], g["share_of_phase"])) for p, g in non_mm.groupby("phase")}
    assert by_phase["forward"] == [("softmax_warp_forward", 0.25)]
    assert by_phase["backward"] == [("elementwise_straddler", pytest.approx(40 / 90))]
    assert by_phase["optimizer_step"] == [("multi_tensor_apply_add", 1.0)]
    assert not non_mm["kernel"].str.contains(MATMUL_PATTERN).any()
    assert non_matmul_kernels(prof, min_share=0.3)["kernel"].tolist().count("softmax_warp_forward") == 0


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
    prof = profile_steps(step, Session(), steps=3, device="cpu", trace_path=str(trace))
    ranges, kernels = events_from_profiler(prof)

    assert [r.name for r in ranges if r.name in PHASES] == list(PHASES) * 3
    assert kernels and all(k.device_kind == "cpu" and k.duration_us > 0 for k in kernels)
    assert not any(k.name in PHASES for k in kernels)

    table = attribute_kernels(ranges, kernels)
    assert set(PHASES) <= set(table["phase"])
    np.testing.assert_allclose(table.groupby("phase")["share_of_phase"].sum(), 1.0)
    assert "aten::addmm" in set(table.loc[table["phase"] == "forward", "kernel"])
    assert "aten::add_" in set(table.loc[table["phase"] == "optimizer_step", "kernel"])
    answers = profile_answers(_profile_rows(table, steps=3)).iloc[0]
    assert answers["train_matmul_share"] > 0  # aten::addmm matches the pattern
    assert table.loc[(table["phase"] == "forward") & table["kernel"].str.contains(MATMUL_PATTERN), "share_of_phase"].sum() > 0

    with gzip.open(trace) as f:  # a .json.gz trace is gzipped, a .json one is not
        assert "traceEvents" in json.load(f)
    assert not list(tmp_path.glob(".tmp-*"))  # neither the plain JSON nor the gzip's temp is left


def test_export_trace_plain_and_gzipped(tmp_path):
    class Prof:  # a kineto trace can be exported once per profile: a stand-in exports it twice
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text('{"traceEvents": [1, 2]}\n' * 3)

    export_trace(Prof(), str(tmp_path / "t.json"))
    export_trace(Prof(), str(tmp_path / "t.json.gz"))
    assert (tmp_path / "t.json").read_text() == gzip.decompress((tmp_path / "t.json.gz").read_bytes()).decode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.json.gz"]


def test_export_trace_never_writes_through_a_link_at_its_plain_temp_name(tmp_path):
    class Prof:
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text('{"traceEvents": []}')

    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    (tmp_path / f".tmp-{os.getpid()}-t.json").symlink_to(target)  # the plain JSON's temp name, taken first
    with pytest.raises(OutputPathError, match="neither followed nor replaced"):
        export_trace(Prof(), str(tmp_path / "t.json.gz"))
    assert target.read_text() == "keep" and not (tmp_path / "t.json.gz").exists()
