"""Findings are computed from data: check them on tables whose answers are known."""

import math

import numpy as np
import pandas as pd
import pytest

from cs336sys import findings as F


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
            cell = f"seq={seq}_impl={impl}"
            if impl == "eager" and seq == 32768:
                rows.append(dict(cell_id=cell, seq=seq, impl=impl, act="softmax", d=64, causal=1, precision="fp32",
                                 mode="train", phase=None, status="oom", error="CUDA out of memory"))
                continue
            lxl = 8 * seq * seq * 4
            for phase, ms in (("forward", seq**2 * 1e-7), ("backward", 2 * seq**2 * 1e-7), ("step", 3 * seq**2 * 1e-7)):
                rows.append(dict(cell_id=cell, seq=seq, impl=impl, act="softmax", d=64, causal=1, precision="fp32",
                                 mode="train", phase=phase, status="ok", error="", median_ms=ms,
                                 peak_mem_bytes=1e6 + keeps * lxl + 100 * seq, mem_before_fwd_bytes=1e6,
                                 mem_before_bwd_bytes=1e6 + 8 * seq * 64 * 4 + keeps * lxl,
                                 output_bytes=8 * seq * 64 * 4, score_matrix_bytes=lxl))  # fmt: skip
    return pd.DataFrame(rows)


def test_oom_frontier_names_the_largest_ok_and_the_first_oom_length():
    frontier = F.oom_frontier(_attention_rows(), ["impl"]).set_index("impl")
    assert frontier.loc["eager", "largest_ok"] == 16384 and frontier.loc["eager", "first_oom"] == 32768
    assert frontier.loc["triton", "largest_ok"] == 32768 and pd.isna(frontier.loc["triton", "first_oom"])


def test_attention_memory_check_counts_the_LxL_matrices_kept_for_backward():
    check = F.attention_memory_check(_attention_rows())
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
            rows.append(dict(size="large", ctx=512, precision=prec, attn="eager", compile=0, mode="train", phase=phase,
                             status="ok", median_ms=ms * scale))
    df = pd.DataFrame(rows)
    assert F.bf16_speedup(df)["speedup"].tolist() == [3.0]
    assert F.backward_forward_ratio(df)["backward_over_forward"].tolist() == [2.0, 2.0]


def test_profile_answers_from_a_kernel_table():
    common = dict(cell_id="c", status="ok", profiled_steps=2, device_kind="cuda")
    rows = [
        dict(kind="timing", mode="train", phase="forward", median_ms=1.05, **common),
        dict(kind="kernel", mode="train", phase="forward", kernel="sm90_gemm", calls=8, total_us=1500.0, share_of_phase=0.75, **common),
        dict(kind="kernel", mode="train", phase="forward", kernel="softmax_warp_forward", calls=4, total_us=500.0, share_of_phase=0.25, **common),
        dict(kind="kernel", mode="train", phase="backward", kernel="sm90_gemm", calls=16, total_us=3000.0, share_of_phase=1.0, **common),
    ]  # fmt: skip
    answers = F.profile_answers(pd.DataFrame(rows)).iloc[0]
    assert answers["train_forward_profiler_ms"] == pytest.approx(1.0)  # 2000 µs over 2 steps
    assert answers["train_forward_harness_ms"] == pytest.approx(1.05)
    assert answers["forward_top_kernel"] == "sm90_gemm" and answers["its_calls_per_forward"] == 4
    assert bool(answers["same_top_kernel"])
    assert answers["train_matmul_share"] == pytest.approx(4500 / 5000)
    non_mm = F.non_matmul_kernels(pd.DataFrame(rows))
    assert non_mm["kernel"].tolist() == ["softmax_warp_forward"]


def test_same_top_kernel_compares_full_names_not_their_shortened_display():
    prefix = "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_" + "x" * 60
    common = dict(cell_id="c", status="ok", profiled_steps=1, device_kind="cuda", kind="kernel", mode="train")
    rows = [
        dict(phase="forward", kernel=prefix + "_nn", calls=1, total_us=10.0, share_of_phase=1.0, **common),
        dict(phase="backward", kernel=prefix + "_nt", calls=1, total_us=30.0, share_of_phase=1.0, **common),
    ]
    answers = F.profile_answers(pd.DataFrame(rows)).iloc[0]
    assert answers["forward_top_kernel"] == answers["fwd+bwd_top_kernel"]  # same 90-character display
    assert not bool(answers["same_top_kernel"])
