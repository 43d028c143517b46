"""Findings are computed from data: check them on tables whose answers are known."""

import math

import numpy as np
import pandas as pd
import pytest

from cs336sys.analysis import findings as F
from cs336sys.studies import cell_id, study
from cs336sys.studies.attention.report import memory_check
from cs336sys.studies.e2e.report import backward_forward_ratio, bf16_speedup
from cs336sys.studies.memory.report import largest_allocations, memory_summary
from cs336sys.studies.profile.report import non_matmul_kernels, profile_answers


def test_loglog_slope_recovers_the_exponent_over_the_largest_points():
    seq = pd.Series([64, 256, 1024, 4096, 16384])
    # a constant launch overhead flattens small lengths; the fit uses the three largest
    time = 0.5 + 1e-6 * seq.astype(float) ** 2
    assert 1.85 < F.loglog_slope(seq, time) <= 2.0
    assert F.loglog_slope(seq, 3.0 * seq) == pytest.approx(1.0)
    assert math.isnan(F.loglog_slope(pd.Series([128]), pd.Series([1.0])))


def _attention_rows():
    rows = []
    for impl, keeps in (("eager", 1.0), ("triton", 0.0)):
        for seq in (1024, 4096, 16384, 32768):
            cell = dict(cell_id=f"seq_len={seq}_impl={impl}", seq_len=seq, impl=impl, activation="softmax", d_model=64, causal=1)
            if impl == "eager" and seq == 32768:
                rows.append(dict(cell, precision="fp32", mode="train", phase=None, status="oom", error="CUDA out of memory"))
                continue
            lxl, out = 8 * seq * seq * 4, 8 * seq * 64 * 4
            memory = dict(
                peak_mem_bytes=1e6 + keeps * lxl + 100 * seq, mem_before_fwd_bytes=1e6, mem_before_bwd_bytes=1e6 + out + keeps * lxl
            )
            for phase, ms in (("forward", seq**2 * 1e-7), ("backward", 2 * seq**2 * 1e-7), ("step", 3 * seq**2 * 1e-7)):
                timed = dict(precision="fp32", mode="train", phase=phase, status="ok", error="", median_ms=ms)
                rows.append(dict(cell, **timed, **memory, output_bytes=out, score_matrix_bytes=lxl))
    return pd.DataFrame(rows)


def test_oom_frontier_names_the_largest_ok_and_the_first_oom_length():
    frontier = F.oom_frontier(_attention_rows(), ["impl"]).set_index("impl")
    assert frontier.loc["eager", "largest_ok"] == 16384 and frontier.loc["eager", "first_oom"] == 32768
    assert frontier.loc["triton", "largest_ok"] == 32768 and pd.isna(frontier.loc["triton", "first_oom"])


def test_attention_memory_check_counts_the_LxL_matrices_kept_for_backward():
    check = memory_check(_attention_rows())
    kept = check.groupby("impl")["kept_in_LxL_matrices"]
    assert np.allclose(kept.get_group("eager"), 1.0)
    assert np.allclose(kept.get_group("triton"), 0.0)


def test_scaling_slopes_per_group():
    panels = [("train", "forward", "median_ms"), ("train", "step", "peak_mem_bytes")]
    slopes = F.scaling_slopes(_attention_rows(), ["impl"], panels).set_index("impl")
    assert slopes.loc["eager", "slope_forward_time"] == pytest.approx(2.0)
    assert slopes.loc["eager", "slope_step_mem"] == pytest.approx(2.0, abs=0.05)
    assert slopes.loc["triton", "slope_step_mem"] < 1.1


def test_bf16_speedup_and_backward_forward_ratio():
    rows = []
    for prec, scale in (("fp32", 3.0), ("bf16", 1.0)):
        for phase, ms in (("forward", 10), ("backward", 20), ("step", 35)):
            axes = {a: 0 for a in study("e2e").axes}  # boolean axes (compile, …) off
            axes.update(size="large", context_length=512, precision=prec, impl="eager")
            rows.append(dict(**axes, mode="train", phase=phase, status="ok", median_ms=ms * scale))
    df = pd.DataFrame(rows)
    assert bf16_speedup(df)["ratio"].tolist() == [3.0]  # fp32 / bf16 whole steps
    assert backward_forward_ratio(df)["ratio"].tolist() == [2.0, 2.0]  # per precision


def test_profile_answers_from_a_kernel_table():
    common = dict(cell_id="c", status="ok", profiled_steps=2, device_kind="cuda", mode="train")
    kernel = dict(kind="kernel", **common)
    rows = [
        dict(kind="timing", phase="forward", median_ms=1.05, **common),
        dict(phase="forward", kernel="sm90_gemm", calls=8, total_us=1500.0, share_of_phase=0.75, **kernel),
        dict(phase="forward", kernel="softmax_warp_forward", calls=4, total_us=500.0, share_of_phase=0.25, **kernel),
        dict(phase="backward", kernel="sm90_gemm", calls=16, total_us=3000.0, share_of_phase=1.0, **kernel),
    ]
    answers = profile_answers(pd.DataFrame(rows)).iloc[0]
    assert answers["train_forward_profiler_ms"] == pytest.approx(1.0)  # 2000 µs over 2 steps
    assert answers["train_forward_harness_ms"] == pytest.approx(1.05)
    assert answers["forward_top_kernel"] == "sm90_gemm" and answers["its_calls_per_forward"] == 4
    assert bool(answers["same_top_kernel"])
    assert answers["train_matmul_share"] == pytest.approx(4500 / 5000)
    non_mm = non_matmul_kernels(pd.DataFrame(rows))
    assert non_mm["kernel"].tolist() == ["softmax_warp_forward"]


def test_same_top_kernel_compares_full_names_not_their_shortened_display():
    prefix = "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_" + "x" * 60
    common = dict(cell_id="c", status="ok", profiled_steps=1, device_kind="cuda", kind="kernel", mode="train")
    rows = [
        dict(phase="forward", kernel=prefix + "_nn", calls=1, total_us=10.0, share_of_phase=1.0, **common),
        dict(phase="backward", kernel=prefix + "_nt", calls=1, total_us=30.0, share_of_phase=1.0, **common),
    ]
    answers = profile_answers(pd.DataFrame(rows)).iloc[0]
    assert answers["forward_top_kernel"] == answers["fwd+bwd_top_kernel"]  # same 90-character display
    assert not bool(answers["same_top_kernel"])


def _memory_rows():
    rows = []
    for impl, peak in (("eager", 300 * 2**20), ("sdpa", 200 * 2**20)):
        axes = dict(size="tiny", context_length=64, precision="fp32", impl=impl, mode="train")
        common = dict(study="memory", cell_id=cell_id("memory", axes), status="ok", error="", **axes)
        memory = dict(peak_mem_bytes=peak, peak_reserved_bytes=2 * peak, mem_before_bwd_bytes=peak / 2, residual_activation_bytes=2**20)
        rows.append(dict(kind="summary", **memory, **common))
        for rank, mib in enumerate((64.0, 32.0, 16.0), 1):
            rows.append(dict(kind="allocation", rank=rank, size_mib=mib, size_bytes=mib * 2**20, frames=f"model.py:{rank}", **common))
    axes = dict(size="tiny", context_length=128, precision="fp32", impl="eager", mode="train")
    rows.append(dict(study="memory", cell_id="failed", status="oom", error="CUDA out of memory", **axes))
    return pd.DataFrame(rows)


def test_memory_summary_in_mib_one_row_per_cell_with_its_axes():
    summary = memory_summary(_memory_rows())
    assert len(summary) == 2  # the oom cell has no summary row
    assert summary["peak_mem_mib"].tolist() == [300.0, 200.0]
    assert summary["peak_reserved_mib"].tolist() == [600.0, 400.0]
    assert summary["mem_before_bwd_mib"].tolist() == [150.0, 100.0] and (summary["residual_activation_mib"] == 1.0).all()
    # every axis of the study names its row: two cells that differ only by impl must not look alike
    for axis in study("memory").axes:
        assert axis in summary.columns, f"memory_summary drops the axis {axis!r}"
    assert memory_summary(_memory_rows().query("status != 'ok'")).empty


def test_largest_allocations_keeps_the_top_ranks_of_each_cell():
    top = largest_allocations(_memory_rows(), top=2)
    assert top["rank"].tolist() == [1, 2, 1, 2]
    assert top["size_mib"].tolist() == [64.0, 32.0, 64.0, 32.0]
    assert top["frames"].str.startswith("model.py").all()
    assert top["cell_id"].nunique() == 2
