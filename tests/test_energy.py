"""Energy per timed block (measure.energy): a fake NVML with known answers, the per-block J/step and its
interval, the pass fold, tokens per joule, and the rows that stay empty with a reason."""

from __future__ import annotations

import math
import sys
import time
import types

import numpy as np
import pandas as pd
import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys import studies as S
from cs336sys.analysis.energy import add_energy
from cs336sys.analysis.metrics import add_derived
from cs336sys.analysis.passes import combine_passes, widen
from cs336sys.catalog import LM
from cs336sys.columns import TIMING_COLUMNS
from cs336sys.measure import energy
from cs336sys.measure.energy import COUNTER, MIN_BLOCK_S, SAMPLED, NvmlMeter, Reading, counter_joules, energy_stats, trapezoid
from cs336sys.measure.stats import summarize_trials
from cs336sys.measure.timing import STEP, StepClock, bench_stats, time_steps, timing_rows
from cs336sys.pipeline.merge import derive
from workflow_helpers import DEMO_RUN

CPU = torch.device("cpu")


class FakeNVMLError(Exception):
    pass


class FakeTime:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_nvml(now: FakeTime, watts=lambda t: 250.0, counter=True, power=True, fail_after: int | None = None, period=None):
    """A stand-in pynvml: one GPU whose power is ``watts(t)`` and whose counter holds its integral (mJ).

    ``fail_after``: the counter raises from its (fail_after+1)-th read on, as a driver that stops answering.
    ``period`` (phase, seconds): the counter moves only at phase + k·seconds, to the integral up to then.
    """
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = FakeNVMLError
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    reads = []

    def total_energy(handle):
        reads.append(now())
        if not counter:
            raise FakeNVMLError("Not Supported")
        if fail_after is not None and len(reads) > fail_after:
            raise FakeNVMLError("GPU is lost")
        t, steps = now(), 1000  # the integral of watts by the midpoint rule, fine enough for a smooth curve
        if period is not None:
            t = period[0] + math.floor((t - period[0]) / period[1]) * period[1]
        return int(round(1e3 * sum(watts((i + 0.5) * t / steps) * t / steps for i in range(steps))))

    def power_usage(handle):
        if not power:
            raise FakeNVMLError("Not Supported")
        return int(round(watts(now()) * 1e3))  # mW

    nvml.nvmlDeviceGetTotalEnergyConsumption = total_energy
    nvml.nvmlDeviceGetPowerUsage = power_usage
    nvml.reads = reads
    return nvml


# ---------------------------------------------------------------- the meter


def test_counter_path_reads_the_difference_in_joules():
    now = FakeTime()
    meter = NvmlMeter(index=0, nvml=fake_nvml(now, watts=lambda t: 300.0))
    assert meter.source == COUNTER and meter.note == ""
    now.now = 5.0
    meter.begin()
    now.now = 7.5  # 2.5 s at 300 W
    joules, note = meter.end()
    assert joules == pytest.approx(750.0, abs=1e-3) and note == ""


def test_the_index_comes_from_the_environment_as_for_the_gpu_state(monkeypatch):
    now = FakeTime()
    nvml = fake_nvml(now)
    handles = []
    nvml.nvmlDeviceGetHandleByIndex = lambda i: handles.append(i) or ("handle", i)
    monkeypatch.setenv("CS336SYS_GPU_INDEX", "3")
    NvmlMeter(nvml=nvml)
    monkeypatch.delenv("CS336SYS_GPU_INDEX")
    NvmlMeter(nvml=nvml)
    assert handles == [3, 0]


def test_without_a_counter_power_is_sampled_and_integrated_and_said_so():
    # power rises linearly, 100 W + 1000 W/s · t: the trapezoids are exact, ∫₀ᵀ = 100 T + 500 T²
    now = FakeTime()
    nvml = fake_nvml(now, watts=lambda t: 100.0 + 1000.0 * t, counter=False)

    def clock():  # every read of the meter's clock moves time on by 1 ms: the thread's samples are 1 ms apart
        now.now += 0.001
        return now.now

    meter = NvmlMeter(index=0, nvml=nvml, sample_s=0.001, clock=clock)
    assert meter.source == SAMPLED and "no energy counter" in meter.note and "Not Supported" in meter.note
    meter.begin()
    start = meter._samples[0][0]
    time.sleep(0.05)  # the sampling thread runs
    joules, note = meter.end()
    end = meter._samples[-1][0]
    assert len(meter._samples) > 3  # the thread sampled, not only begin and end
    expected = 100 * (end - start) + 500 * (end**2 - start**2)
    assert joules == pytest.approx(expected, rel=1e-6)
    assert "sampled every 1 ms" in note


def test_reads_after_each_step_place_the_counters_updates_inside_the_block():
    # 300 W; the counter moves at 0.005 + k·0.1 s (last at -0.095 before the block); reads every 10 ms from 0 to 0.55 s
    marks = [(i / 100, 300.0 * 1e3 * (0.005 + math.floor((i / 100 - 0.005) / 0.1) * 0.1)) for i in range(56)]
    plain = (marks[-1][1] - marks[0][1]) / 1e3
    assert plain == pytest.approx(300 * (0.505 + 0.095))  # 180 J: a period too many
    assert counter_joules(marks) == pytest.approx(300 * 0.55)  # each update placed at 0.005, 0.105, …: exact
    # one update inside (0.02 to 0.14 s: at 0.105): nothing to place the power by, the plain difference
    assert counter_joules(marks[2:15]) == pytest.approx(300 * (0.105 - 0.005))


def test_a_meter_marked_after_each_step_reads_a_block_to_within_half_a_step():
    now = FakeTime()
    meter = NvmlMeter(index=0, nvml=fake_nvml(now, watts=lambda t: 400.0, period=(0.037, 0.1)), clock=now)
    now.now = 10.0
    meter.begin()
    for _ in range(60):  # 60 steps of 10 ms
        now.now += 0.01
        meter.mark()
    joules, _ = meter.end()
    assert joules == pytest.approx(400 * 0.6, rel=0.01)  # the plain difference would be 200 or 240 J


def test_trapezoid_known_answers():
    assert trapezoid([(0.0, 100.0), (1.0, 300.0), (3.0, 300.0)]) == 200.0 + 600.0
    assert trapezoid([(0.0, 100.0)]) == 0.0


def test_no_bindings_gives_an_empty_reading_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    meter = NvmlMeter(index=0)
    assert meter.source == ""
    meter.begin()
    joules, note = meter.end()
    assert joules is None and "no NVML bindings" in note
    row = energy_stats([Reading(joules, 1.0, 10, "", note)])
    assert row["energy_j"] is None and row["energy_source"] == "" and "no NVML bindings" in row["energy_note"]


def test_a_gpu_without_counter_or_power_reading_is_empty_with_the_reason():
    meter = NvmlMeter(index=0, nvml=fake_nvml(FakeTime(), counter=False, power=False))
    assert meter.source == ""
    meter.begin()
    assert meter.end()[0] is None and "neither" in meter.note


def test_nvml_that_fails_to_start_is_a_reason_not_an_error():
    nvml = fake_nvml(FakeTime())

    def broken():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    nvml.nvmlInit = broken
    meter = NvmlMeter(index=0, nvml=nvml)
    assert meter.source == "" and "NVML unavailable" in meter.note and "libnvidia-ml" in meter.note


def test_a_counter_that_fails_mid_cell_empties_its_blocks_with_the_reason_and_timing_goes_on(monkeypatch):
    now = FakeTime()
    meter = NvmlMeter(index=0, nvml=fake_nvml(now, fail_after=2))  # the probe at start-up and one block's start succeed
    assert meter.source == COUNTER
    monkeypatch.setattr(energy, "meter_for", lambda device_type: meter)

    def step(clock: StepClock) -> None:
        with clock.phase("forward"):
            now.now += 0.01

    timing = time_steps(step, warmup=0, steps=3, device=CPU, trials=2, min_warmup_s=0.0, min_measure_s=0.0, target_rel=0.0)
    rows = {r["phase"]: r for r in timing_rows(timing, {}, {})}
    assert rows[STEP]["energy_j"] is None and "GPU is lost" in rows[STEP]["energy_note"]
    assert rows[STEP]["n"] == 6  # the times stand


def test_cpu_device_gets_no_meter_but_the_reason():
    meter = energy.meter_for("cpu")
    meter.begin()
    assert meter.end() == (None, energy.NO_CUDA)


# ---------------------------------------------------------------- per-block J/step and its interval


def test_long_blocks_give_the_median_of_their_j_per_step_and_the_interval_over_blocks():
    blocks = [Reading(120.0, 1.0, 10, COUNTER), Reading(130.0, 1.0, 10, COUNTER), Reading(100.0, 0.8, 10, COUNTER)]
    row = energy_stats(blocks)
    per_step = [12.0, 13.0, 10.0]
    iv = summarize_trials([[x] for x in per_step])
    assert row["energy_j"] == pytest.approx(12.0)
    assert (row["energy_ci_low_j"], row["energy_ci_high_j"]) == pytest.approx((max(iv.low, 0.0), iv.high))
    assert row["energy_ci_low_j"] < 10.0 and row["energy_ci_high_j"] > 13.0  # the t-interval over three blocks is the wider
    assert row["avg_power_w"] == pytest.approx(350.0 / 2.8)
    assert row["energy_samples_j"] == "12;13;10" and row["energy_source"] == COUNTER and row["energy_note"] == ""


def test_short_blocks_are_left_out_of_the_samples_and_said_so():
    blocks = [Reading(60.0, 0.6, 4, COUNTER), Reading(5.0, 0.04, 2, COUNTER), None, Reading(66.0, 0.6, 4, COUNTER)]
    row = energy_stats(blocks)
    assert row["energy_samples_j"] == "15;16.5" and row["energy_j"] == pytest.approx(15.75)
    assert row["avg_power_w"] == pytest.approx(126.0 / 1.2)
    assert "from 2 of 4 timed blocks" in row["energy_note"]


def test_blocks_all_shorter_than_the_minimum_give_their_total_without_an_interval():
    blocks = [Reading(20.0, 0.2, 2, COUNTER)] * 2 + [Reading(12.0, 0.2, 2, COUNTER)]  # 0.6 s in all
    assert 0.2 < MIN_BLOCK_S <= 0.6
    row = energy_stats(blocks)
    assert row["energy_j"] == pytest.approx(52.0 / 6)
    assert row["energy_ci_low_j"] is None and row["energy_ci_high_j"] is None and row["energy_samples_j"] == ""
    assert "no interval" in row["energy_note"] and row["avg_power_w"] == pytest.approx(52.0 / 0.6)


def test_blocks_too_short_even_together_are_empty_with_the_reason():
    row = energy_stats([Reading(4.0, 0.04, 2, COUNTER), Reading(4.0, 0.04, 2, COUNTER)])
    assert row["energy_j"] is None and row["avg_power_w"] is None and "under the 0.5 s" in row["energy_note"]


def test_blocks_not_metered_say_so():
    row = energy_stats([None, None])
    assert row["energy_j"] is None and row["energy_note"] == energy.NOT_METERED


def test_time_steps_meters_each_block_and_puts_the_energy_on_the_step_row_only(monkeypatch):
    now = FakeTime()
    meter = NvmlMeter(index=0, nvml=fake_nvml(now, watts=lambda t: 200.0), clock=now)
    monkeypatch.setattr(energy, "meter_for", lambda device_type: meter)
    durations = iter([0.05] + [0.25] * 3 + [0.05] + [0.2] * 3)  # each trial: one warm-up step, a block of three

    def step(clock: StepClock) -> None:
        with clock.phase("forward"):
            now.now += next(durations)

    timing = time_steps(step, warmup=1, steps=3, device=CPU, trials=2, min_warmup_s=0.0, min_measure_s=0.0, target_rel=0.0,
                        clock=now, sync=lambda d: None)  # fmt: skip
    assert next(durations, None) is None
    assert [b.energy.seconds for b in timing.blocks] == pytest.approx([0.75, 0.6])
    rows = {r["phase"]: r for r in timing_rows(timing, {}, {})}
    step_row = rows[STEP]
    assert step_row["energy_samples_j"] == "50;40"  # 200 W × 0.25 s and × 0.2 s per step
    assert step_row["energy_j"] == pytest.approx(45.0) and step_row["avg_power_w"] == pytest.approx(200.0)
    assert step_row["energy_source"] == COUNTER
    assert rows["forward"]["energy_j"] is None and rows["forward"]["energy_note"] == energy.STEP_ONLY
    assert set(energy.ENERGY_COLUMNS) <= set(step_row) and set(energy.ENERGY_COLUMNS) <= set(rows["forward"])


def test_time_steps_reads_the_counter_after_each_step_to_place_its_updates(monkeypatch):
    now = FakeTime()
    meter = NvmlMeter(index=0, nvml=fake_nvml(now, watts=lambda t: 400.0, period=(0.037, 0.1)), clock=now)
    monkeypatch.setattr(energy, "meter_for", lambda device_type: meter)

    def step(clock: StepClock) -> None:
        now.now += 0.01

    timing = time_steps(step, warmup=3, steps=65, device=CPU, trials=1, min_warmup_s=0.0, min_measure_s=0.0, target_rel=0.0,
                        clock=now, sync=lambda d: None)  # fmt: skip
    row = next(r for r in timing_rows(timing, {}, {}) if r["phase"] == STEP)
    # 4 J per 10-ms step; the counter's 100 ms periods alone would give 0.6 or 0.7 s of energy over the 0.65 s block
    assert row["energy_j"] == pytest.approx(4.0, rel=0.01) and row["avg_power_w"] == pytest.approx(400.0, rel=0.01)


def test_energy_columns_are_reserved_timing_columns():
    assert set(energy.ENERGY_COLUMNS) <= set(TIMING_COLUMNS)


def test_do_bench_rows_are_empty_with_the_reason():
    row = bench_stats(lambda: None, CPU, rep_ms=1, trials=1).as_row()
    assert row["energy_j"] is None and row["energy_note"] == energy.DO_BENCH


# ---------------------------------------------------------------- the CPU demo's rows


TINY = {"tiny": {"d_model": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2}}


def test_cpu_rows_have_the_energy_columns_empty_with_a_reason():
    from cs336sys.studies.e2e.measure import measure

    rows = list(measure(CPU, {}, **cell_kwargs("e2e", size="tiny", context_length=8, precision="fp32", batch_size=2, vocab_size=100,
                                               warmup_steps=1, measure_steps=2, extra_sizes=TINY, partners=({"cuda_graphs": True}, {"precision": "bf16"}))))  # fmt: skip
    timed = [r for r in rows if r.get("kind") != "pair" and "median_ms" in r]
    assert timed
    for r in timed:
        assert all(r[c] is None for c in ("energy_j", "energy_ci_low_j", "energy_ci_high_j", "avg_power_w")), r["phase"]
        assert r["energy_source"] == ""
        assert r["energy_note"] == (energy.NO_CUDA if r["phase"] == STEP else energy.STEP_ONLY)


@pytest.mark.slow  # the whole CPU demo (shared with the other workflow tests)
def test_the_cpu_demos_merged_rows_carry_empty_energy_with_a_reason(finished_demo):
    df = pd.read_csv(finished_demo.root / "results" / DEMO_RUN / "e2e.csv", keep_default_na=False)
    steps = df[(df["status"] == "ok") & (df["phase"] == STEP) & (df["kind"].astype(str) != "pair")]
    assert len(steps) and (steps["energy_j"].astype(str) == "").all()
    assert (steps["energy_note"] == energy.NO_CUDA).all()


# ---------------------------------------------------------------- folding passes, tokens per joule


def _row(pass_index, samples_j, phase=STEP, **extra):
    return {"study": "e2e", "cell_id": "c1", "status": "ok", "mode": "train", "phase": phase, "median_ms": 100.0 + pass_index,
            "ci_low_ms": 99.0, "ci_high_ms": 102.0, "mean_ms": 100.0, "std_ms": 1.0, "min_ms": 99.0, "max_ms": 102.0, "samples_ms": "", "trial_medians_ms": f"{100.0 + pass_index}",
            "n": 10, "pass_index": pass_index, "energy_j": float(np.median(samples_j)) if samples_j else None,
            "energy_samples_j": ";".join(f"{x:g}" for x in samples_j), "avg_power_w": 300.0 + 10 * pass_index,
            "energy_source": COUNTER if samples_j else "", **extra}  # fmt: skip


def test_passes_pool_their_per_block_samples():
    df = pd.DataFrame([_row(0, [10.0, 11.0]), _row(1, [12.0, 13.0]), _row(2, [10.5])])
    row = combine_passes(df, floor_rel=0.01).iloc[0]
    pooled = [10.0, 11.0, 12.0, 13.0, 10.5]
    iv = summarize_trials([[x] for x in pooled])
    low, high = widen(iv.median, iv.low, iv.high, 0.01)
    assert row["energy_j"] == pytest.approx(11.0)  # the median of every block, not pass 0's 10.5
    assert (row["energy_ci_low_j"], row["energy_ci_high_j"]) == pytest.approx((low, high))
    assert row["energy_samples_j"] == "10;11;12;13;10.5"
    assert row["avg_power_w"] == pytest.approx(310.0) and row["energy_source"] == COUNTER


def test_passes_without_samples_take_the_median_of_their_totals_and_no_interval():
    df = pd.DataFrame(
        [_row(0, [], energy_j=9.0, energy_note="total over 8 blocks"), _row(1, [], energy_j=11.0, energy_note="total over 8 blocks")]
    )
    row = combine_passes(df).iloc[0]
    assert row["energy_j"] == pytest.approx(10.0) and np.isnan(row["energy_ci_low_j"]) and np.isnan(row["energy_ci_high_j"])
    assert row["energy_note"] == "total over 8 blocks"


def test_phase_rows_keep_their_reason_through_the_fold():
    df = pd.DataFrame([_row(k, [], phase="forward", energy_note=energy.STEP_ONLY) for k in (0, 1)])
    row = combine_passes(df).iloc[0]
    assert pd.isna(row["energy_j"]) and row["energy_note"] == energy.STEP_ONLY


def test_tokens_per_joule_for_the_rows_of_lm_studies_only():
    df = pd.DataFrame(
        [
            {"study": "e2e", "batch_size": 4, "context_length": 256, "tokens": 1024, "energy_j": 2.0, "energy_ci_low_j": 1.6, "energy_ci_high_j": 2.5},
            {"study": "warmup", "batch_size": 2, "context_length": 128, "energy_j": 0.5, "energy_ci_low_j": None, "energy_ci_high_j": None},
            {"study": "attention", "batch_size": 8, "seq_len": 1024, "energy_j": 1.0, "energy_ci_low_j": 0.9, "energy_ci_high_j": 1.1},
            {"study": "e2e", "batch_size": 4, "context_length": 256, "tokens": 1024, "energy_j": None},
        ]
    )  # fmt: skip
    out = add_energy(df, lm=True)
    assert out["tokens_per_j"].iloc[0] == pytest.approx(512.0)
    assert (out["tokens_per_j_ci_low"].iloc[0], out["tokens_per_j_ci_high"].iloc[0]) == pytest.approx((1024 / 2.5, 1024 / 1.6))
    assert out["tokens_per_j"].iloc[1] == pytest.approx(256 / 0.5) and np.isnan(out["tokens_per_j_ci_low"].iloc[1])
    assert np.isnan(out["tokens_per_j"].iloc[3])
    assert add_energy(df, lm=False)["tokens_per_j"].isna().all()  # a study of another kind: no tokens per step
    # the merge asks the study's kind: every study of kind lm gets tokens per joule, a new one included
    lm = [name for name in S.STUDIES if S.study(name).kind == LM]
    assert {"e2e", "warmup", "profile", "memory"} <= set(lm)
    for name in S.STUDIES:
        derived = derive(df.iloc[:2].assign(study=name), name)["tokens_per_j"]
        assert derived.notna().all() if name in lm else derived.isna().all(), name
    new_lm = add_derived(df.iloc[:1].assign(study="a-new-lm-study"), lm=True)  # named in no list
    assert new_lm["tokens_per_j"].iloc[0] == pytest.approx(512.0)


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_the_counter_rises_over_a_second_of_matmuls_at_a_plausible_power():
    meter = energy.meter_for("cuda")
    assert meter.source == COUNTER, meter.note
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    meter.begin()
    steps = 0
    while time.perf_counter() - start < 1.0:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
        steps += 1
    joules, note = meter.end()
    seconds = time.perf_counter() - start
    assert joules is not None and joules > 0, note
    row = energy_stats([Reading(joules, seconds, steps, meter.source)])
    assert 20 < row["avg_power_w"] < 1500, row


# ---------------------------------------------------------------- the report, the answers, the comparison


def _e2e_step(size, precision, energy_j=None, low=None, high=None, **extra):
    return {"study": "e2e", "cell_id": f"size={size}_precision={precision}", "status": "ok", "kind": "", "size": size,
            "context_length": 256, "precision": precision, "impl": "sdpa", "compile": 0, "cuda_graphs": 0, "mode": "train",
            "phase": STEP, "median_ms": 100.0, "ci_low_ms": 99.0, "ci_high_ms": 101.0, "batch_size": 4, "tokens": 1024,
            "energy_j": energy_j, "energy_ci_low_j": low, "energy_ci_high_j": high, **extra}  # fmt: skip


def test_the_e2e_report_shows_j_per_step_watts_and_tokens_per_joule():
    from cs336sys.studies.e2e.report import energy_table, findings

    df = derive(pd.DataFrame([_e2e_step("small", "bf16", 2.0, 1.6, 2.5, avg_power_w=410.0, energy_source=COUNTER, energy_note="")]), "e2e")
    table = energy_table(df)
    assert table.iloc[0]["J/step [95%]"] == "2 [1.6, 2.5]" and table.iloc[0]["avg W"] == 410.0
    assert table.iloc[0]["tokens/J [95%]"] == "512 [410, 640]" and table.iloc[0]["source"] == COUNTER
    assert "**Energy per step**" in findings(df)
    empty = derive(pd.DataFrame([_e2e_step("small", "bf16", energy_note=energy.NO_CUDA)]), "e2e")
    assert energy_table(empty).empty and f"Energy per step: empty — {energy.NO_CUDA}" in findings(empty)


def test_a_power_capped_step_is_said_with_its_watts_and_joules():
    from cs336sys.handout.answers_common import Run
    from cs336sys.handout.answers_lm import _power_capped

    rows = [
        _e2e_step("small", "bf16", 2.0, 1.9, 2.1, end_throttle_reasons="none", avg_power_w=300.0),
        _e2e_step("2.7B", "bf16", 312.0, 300.0, 325.0, end_throttle_reasons="sw_power_cap", avg_power_w=683.0),
        _e2e_step("large", "fp32", end_throttle_reasons="gpu_idle;sw_power_cap", end_power_w=650.0, energy_note=energy.NOT_METERED),
    ]
    said = _power_capped(Run("r", {"e2e": pd.DataFrame(rows)}))
    assert said == (
        " The large fp32 training step (context 256, sdpa) is power-capped: 650 W; "
        "the 2.7B bf16 training step (context 256, sdpa) is power-capped: 683 W, 312 J per step [300, 325]."
    )
    assert _power_capped(Run("r", {"e2e": pd.DataFrame(rows[:1])})) == ""


def test_the_comparison_shows_both_runs_j_per_step_and_their_ratio(tmp_path):
    from cs336sys.runs import compare as cmp

    env = {"device_name": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-a"}
    a = [_e2e_step("small", "bf16", 2.0, 1.8, 2.2, **env), _e2e_step("large", "bf16", 5.0, **env)]
    b = [_e2e_step("small", "bf16", 1.5, 1.2, 1.6, **{**env, "device_name": "NVIDIA H200", "gpu_uuid": "GPU-b"}),
         _e2e_step("large", "bf16", 4.0, **{**env, "device_name": "NVIDIA H200", "gpu_uuid": "GPU-b"})]  # fmt: skip
    for name, rows in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        pd.DataFrame(rows).to_csv(tmp_path / name / "e2e.csv", index=False)
    result = cmp.write_comparison([tmp_path / "a", tmp_path / "b"], ["h100", "h200"], tmp_path / "out")
    small = result.table[result.table["cell_id"] == "size=small_precision=bf16"].iloc[0]
    assert small["energy_ratio"] == pytest.approx(0.75)
    assert (small["energy_ratio_low"], small["energy_ratio_high"]) == pytest.approx((1.2 / 2.2, 1.6 / 1.8))
    large = result.table[result.table["cell_id"] == "size=large_precision=bf16"].iloc[0]
    assert large["energy_ratio"] == pytest.approx(0.8) and np.isnan(large["energy_ratio_low"])
    report = result.report_path.read_text()
    assert "### Energy per step (b / a)" in report
    assert "2 [1.8, 2.2]" in report and "1.5 [1.2, 1.6]" in report and "0.75 [0.545, 0.889]" in report


def test_energy_check_reads_nvidia_smi_samples_inside_the_metered_window_only():
    from datetime import datetime

    from cs336sys.measure.energy_check import _smi_samples

    def stamp(s: str) -> float:
        return datetime.strptime(s, "%Y/%m/%d %H:%M:%S.%f").timestamp()

    log = "2026/11/26 07:00:00.000, 100.0\n2026/11/26 07:00:01.000, 600.5\n2026/11/26 07:00:02.000, 610.5\nnot a line\n2026/11/26 07:00:03.000, 50.0\n"
    assert _smi_samples(log, stamp("2026/11/26 07:00:00.500"), stamp("2026/11/26 07:00:02.500")) == [600.5, 610.5]
