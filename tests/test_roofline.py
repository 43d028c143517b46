"""Bytes moved, the peak-bandwidth table and the roofline: counts by hand, derived columns with known answers.

Shapes are small enough to count on paper: fp32 (4 bytes), batch × heads slices of L tokens, head size d.
x = B·H·L·d·4 (one of Q, K, V, O and their gradients), s = B·H·L·L·4 (one L×L matrix), m = B·H·L·L
(the boolean causal mask), r = B·H·L·4 (the log-sum-exp).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from cs336sys.analysis import peaks, roofline
from cs336sys.analysis.peaks import peak_gbps
from cs336sys.measure import bytes_moved as BM
from cs336sys.pipeline.merge import derive
from cs336sys.studies import study
from cs336sys.studies.attention import report as attention_report
from cs336sys.studies.flash import report as flash_report
from workflow_helpers import REPO

H100 = "NVIDIA H100 80GB HBM3"

# B 2, H 3, L 128, d 64, fp32
X = 2 * 3 * 128 * 64 * 4  # 196 608
S = 2 * 3 * 128 * 128 * 4  # 393 216
M = 2 * 3 * 128 * 128  # 98 304
R = 2 * 3 * 128 * 4  # 3 072

ATTENTION_SHAPE = study("attention").attention_shape  # the core a row of the attention study timed


def test_eager_attention_moves_its_score_and_probability_matrices():
    got = BM.attention_phase_bytes(2, 3, 128, 64, False, "fp32", "eager")
    assert got["forward"] == 4 * X + 6 * S == 3_145_728  # QKᵀ writes S; scale r+w; softmax r S, w P; PV reads P
    assert got["backward"] == 8 * X + 12 * S == 6_291_456  # dP w, P r (dV), softmax bwd 6s, scale 2s, dS r twice
    assert got["forward_backward"] == got["step"] == 9_437_184
    causal = BM.attention_phase_bytes(2, 3, 128, 64, True, "fp32", "eager")
    assert causal["forward"] == 3_145_728 + 2 * S + M == 4_030_464  # masked_fill: S read and written, the mask read
    assert causal["backward"] == 6_291_456 + 2 * S + M == 7_176_192
    relu = BM.attention_phase_bytes(2, 3, 128, 64, False, "fp32", "eager", "relu")
    assert relu["backward"] == 8 * X + 9 * S == 5_111_808  # ReLU's backward: one kernel, 3s


def test_fused_attention_moves_only_its_inputs_outputs_and_statistics():
    for impl in ("triton", "triton-atomic", "tutorial", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"):
        got = BM.attention_phase_bytes(2, 3, 128, 64, True, "fp32", impl)
        assert got["forward"] == 4 * X + R == 789_504, impl  # Q, K, V read; O and the log-sum-exp written
        assert got["backward"] == 8 * X + R == 1_575_936, impl  # Q, K, V, O, dO, L read; dQ, dK, dV written
        assert got["forward_backward"] == 2_365_440, impl
    bf16 = BM.attention_phase_bytes(2, 3, 128, 64, True, "bf16", "triton")
    assert bf16["forward"] == 4 * X // 2 + R == 396_288  # 2-byte elements; the statistics stay fp32
    relu = BM.attention_phase_bytes(2, 3, 128, 64, False, "fp32", "triton", "relu")
    assert (relu["forward"], relu["backward"]) == (4 * X, 7 * X)  # no O or statistics kept


def test_compiled_attention_writes_each_matrix_once_and_a_rewritable_core_is_not_counted():
    got = BM.attention_phase_bytes(2, 3, 128, 64, True, "fp32", "compiled")
    assert (got["forward"], got["backward"]) == (4 * X + 4 * S + M, 8 * X + 7 * S + M) == (2_457_600, 4_423_680)
    relu = BM.attention_phase_bytes(2, 3, 128, 64, False, "fp32", "compiled", "relu")
    assert (relu["forward"], relu["backward"]) == (4 * X + 4 * S + M, 8 * X + 6 * S + M)
    with pytest.raises(ValueError, match="Inductor may rewrite"):
        BM.attention_phase_bytes(2, 3, 128, 64, False, "fp32", "compiled")
    with pytest.raises(ValueError, match="no byte count"):
        BM.attention_phase_bytes(2, 3, 128, 64, False, "fp32", "performer")


def test_bytes_follow_each_implementations_catalog_line():
    from cs336sys import catalog

    counted = {i.name: i.traffic for i in catalog.impls() if i.traffic}
    fused = ("triton", "triton-atomic", "tutorial", "sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
    assert counted == {"eager": "eager", "compiled": "compiled", **dict.fromkeys(fused, "fused")}
    with pytest.raises(ValueError, match="traffic 'tiled'"):
        catalog.register(catalog.Impl("odd", "ours", "m", {"softmax": "f"}, (catalog.FUSED,), "odd", traffic="tiled"))
    # a user's plug-in is counted only where its line says how it moves bytes
    mine = catalog.register(catalog.Impl("my-fused", "user", "m", {"softmax": "f"}, (catalog.FUSED,), "mine", traffic="fused"))
    plain = catalog.register(catalog.Impl("my-plain", "user", "m", {"softmax": "f"}, (catalog.FUSED,), "plain"))
    try:
        assert BM.attention_phase_bytes(2, 3, 128, 64, True, "fp32", mine.name) == BM.attention_phase_bytes(
            2, 3, 128, 64, True, "fp32", "triton"
        )
        with pytest.raises(ValueError, match="'my-plain'.*catalog line says nothing of how it moves bytes"):
            BM.attention_phase_bytes(2, 3, 128, 64, True, "fp32", plain.name)
        row = {"phase": "forward", "impl": plain.name, "precision": "fp32"}
        moved, why = BM.attention_row_bytes(row, (2, 3, 128, 64, 1))
        assert moved is None and "says nothing of how it moves bytes" in why  # empty with the reason, never a guess
    finally:
        catalog.unregister(mine.name)
        catalog.unregister(plain.name)


@pytest.mark.parametrize(
    "name, gbps",
    [
        (H100, 3350.0),
        ("NVIDIA H100 PCIe", 2000.0),
        ("NVIDIA H100 NVL", 3900.0),
        ("NVIDIA H200", 4800.0),
        ("NVIDIA A100-SXM4-80GB", 2039.0),
        ("NVIDIA A100-SXM4-40GB", 1555.0),
        ("Tesla V100-SXM2-16GB", 900.0),
        ("NVIDIA L4", 300.0),
        ("NVIDIA GeForce RTX 4090", 1008.0),
        ("NVIDIA GH200 480GB", None),  # not an H200: a whole-word match, never a guess
        ("Tesla V100S-PCIE-32GB", None),
        ("NVIDIA L40S", None),
        ("cpu", None),
    ],
)
def test_peak_bandwidth_matches_the_longest_whole_name(name, gbps):
    assert peak_gbps(name) == gbps


def test_overrides_come_first_and_extend_the_table():
    assert peak_gbps(H100, {"H100": 3000.0}) == 3000.0
    assert peak_gbps("Acme X9 accelerator", {"X9": 1234.0}) == 1234.0
    assert peak_gbps("Acme X9 accelerator") is None


def _attention_row(impl: str, phase: str, median_ms: float, device: str = H100, **extra) -> dict:
    head = {"study": "attention", "cell_id": f"c-{impl}", "status": "ok", "error": ""}
    axes = {"d_model": 64, "seq_len": 128, "activation": "softmax", "impl": impl, "causal": 0, "precision": "fp32"}
    timed = {"mode": "train", "phase": phase, "median_ms": median_ms, "flops": 0.0, "batch_size": 2, "device_name": device}
    return {**head, **axes, **timed, **extra}


def test_derived_columns_have_the_hand_computed_values():
    # B 2, H 1, L 128, d 64, fp32: x = 65 536, s = 131 072; forward FLOPs 4·B·L²·d = 8 388 608
    rows = pd.DataFrame([_attention_row("eager", "forward", 0.001), _attention_row("triton", "forward", 0.001)])
    out = derive(rows, "attention").set_index("impl")
    eager, fused = out.loc["eager"], out.loc["triton"]
    assert eager["bytes_moved"] == 4 * 65_536 + 6 * 131_072 == 1_048_576
    assert eager["achieved_gbps"] == pytest.approx(1_048_576 / 1e-6 / 1e9)  # 1048.6 GB/s in 1 µs
    assert eager["peak_gbps"] == 3350.0
    assert eager["bw_frac"] == pytest.approx(1048.576 / 3350)
    assert eager["arith_intensity"] == pytest.approx(8.0)  # 8 388 608 / 1 048 576
    assert eager["roof_tflops"] == pytest.approx(8.0 * 3.35)  # below the fp32 ridge at 66.9 / 3.35 ≈ 20
    assert eager["bound"] == "memory" and eager["roofline_note"] == "" and eager["bytes_note"] == ""
    assert fused["bytes_moved"] == 4 * 65_536 + 2 * 128 * 4 == 263_168
    assert fused["arith_intensity"] == pytest.approx(8_388_608 / 263_168)  # ≈ 31.9, past the ridge
    assert fused["roof_tflops"] == 66.9 and fused["bound"] == "compute"


def test_an_unknown_device_leaves_the_bandwidth_columns_empty_with_the_reason():
    out = derive(pd.DataFrame([_attention_row("eager", "forward", 0.001, device="Acme X9 accelerator")]), "attention")
    row = out.iloc[0]
    assert row["bytes_moved"] == 1_048_576 and row["achieved_gbps"] > 0  # counted and timed all the same
    assert math.isnan(row["bw_frac"]) and math.isnan(row["roof_tflops"]) and pd.isna(row["bound"])
    assert "no peak bandwidth known for 'Acme X9 accelerator'" in row["roofline_note"]
    extended = roofline.add_roofline(out, {"X9": {"fp32": 10.0}}, {"X9": 1000.0}, ATTENTION_SHAPE).iloc[0]
    assert extended["bw_frac"] == pytest.approx(1.048576)  # 1048.6 GB/s of 1000: the count or the override is off, shown as is
    assert extended["roof_tflops"] == pytest.approx(8.0) and extended["bound"] == "memory"  # 8 FLOP/B × 1 TB/s < 10 TFLOP/s


def test_the_optimizer_step_counts_adamw_and_other_rows_say_why_they_have_no_bytes():
    base = {"study": "e2e", "status": "ok", "precision": "bf16", "mode": "train", "median_ms": 1.0, "device_name": H100}
    rows = [
        {**base, "phase": "optimizer_step", "params": 1e6, "optimizer": "course"},
        {**base, "phase": "optimizer_step", "params": 1e6, "optimizer": "fused-captured"},
        {**base, "phase": "optimizer_step", "optimizer": "course"},
        {**base, "phase": "forward", "params": 1e6, "optimizer": "course", "flops": 1e9},
        {**base, "phase": "optimizer_step", "params": 1e6, "optimizer": "course", "kind": "pair", "median_ms": None},
    ]
    out = roofline.add_roofline(pd.DataFrame(rows))
    assert list(out["bytes_moved"][:2]) == [80e6, 28e6]  # the course's eight in-place ops; fused: 4 reads + 3 writes of fp32
    assert out["achieved_gbps"][0] == pytest.approx(80.0) and out["bw_frac"][0] == pytest.approx(80 / 3350)
    assert math.isnan(out["arith_intensity"][0]) and "no FLOPs counted" in out["roofline_note"][0]  # elementwise only
    assert math.isnan(out["bytes_moved"][2]) and "no parameter count" in out["bytes_note"][2]
    assert math.isnan(out["bytes_moved"][3]) and "bytes not counted" in out["bytes_note"][3]
    assert "paired ratio" in out["bytes_note"][4]


def test_a_failed_row_or_one_without_shape_columns_is_empty_not_an_error():
    failed = {**_attention_row("eager", "", float("nan")), "status": "oom"}
    old = {"study": "mha", "status": "ok", "median_ms": 2.0}  # a run from before these columns: no phase, device, precision
    out = roofline.add_roofline(pd.DataFrame([failed, old]), shape=ATTENTION_SHAPE)
    assert out["bytes_moved"].isna().all() and out["bound"].isna().all()
    assert all(out["roofline_note"].str.len() > 0)


def _synthetic_attention() -> pd.DataFrame:
    rows = [
        _attention_row(impl, phase, ms, cell_id=f"{impl}-{n}", seq_len=n)
        for impl, ms in (("eager", 0.5), ("triton", 0.05))
        for n in (128, 256)
        for phase in ("forward", "backward")
    ]
    return derive(pd.DataFrame(rows), "attention")


def test_the_roofline_figure_is_drawn_for_a_study_with_countable_rows(tmp_path):
    df = _synthetic_attention()
    names = [name for name, _ in attention_report.figures(df, "t")]
    assert "roofline" in names
    path = roofline.roofline_plot(df, tmp_path / "roofline.png", "t", "attention cores")
    assert path.is_file() and path.stat().st_size > 1000
    unknown = df.assign(device_name="Acme X9 accelerator")  # points, no roofs
    assert roofline.roofline_plot(roofline.add_roofline(unknown, shape=ATTENTION_SHAPE), tmp_path / "u.png", "t", "x").stat().st_size > 1000
    assert "**Roofline**" in attention_report.findings(df) and "`eager`" in roofline.roofline_summary(df)
    flash = df.assign(study="flash", head_dim=64, num_heads=1).drop(columns=["d_model", "activation"])
    assert "roofline" in [name for name, _ in flash_report.figures(derive(flash, "flash"), "t")]


def test_a_run_merged_before_the_columns_existed_still_reports_them(tmp_path):
    from cs336sys.handout.answers import write_answers
    from cs336sys.pipeline.merge import load_study
    from cs336sys.runs.figures import plot_study
    from cs336sys.runs.report import write_report

    run = REPO / "results" / "h100-d06b0e7-a"
    studies = ["attention", "flash"]
    for s in studies:
        assert "bytes_moved" not in load_study(run / f"{s}.csv", s)  # merged before bytes were counted
        plot_study(s, load_study(run / f"{s}.csv", s), tmp_path / "figures" / s, run.name)
        assert (tmp_path / "figures" / s / "roofline.png").stat().st_size > 1000
    config = yaml.safe_load((run / "config.yaml").read_text())
    csvs = [run / f"{s}.csv" for s in studies]
    report = write_report(tmp_path / "report.md", run.name, studies, csvs, [tmp_path / "figures" / s for s in studies], config).read_text()
    assert "**Roofline**" in report and "`bw_frac`" in report
    answers = write_answers(tmp_path / "answers.md", run.name, dict(zip(studies, csvs)), config).read_text()
    assert "% of the 3350 GB/s DRAM peak" in answers and "memory-bound" in answers


def test_bandwidth_table_and_peak_flops_table_name_the_same_gpus():
    # every GPU with a peak TFLOP/s has a peak bandwidth too, or its MFU would have no roofline beside it
    for name in peaks.PEAK_TFLOPS:
        assert any(name in key for key in peaks.PEAK_GBPS), name


def test_peak_tflops_matches_whole_words_longest_key_first():
    from cs336sys.analysis.peaks import peak_tflops

    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0  # not the SXM figure of the shorter key "H100"
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("NVIDIA GH200 480GB", "bf16") is None  # "H200" inside a word is not an H200
    assert peak_tflops("NVIDIA H200", "fp32", {"H200": {"fp32": 1.0}}) == 1.0
