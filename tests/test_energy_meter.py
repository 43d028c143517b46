"""The energy meter of the timed blocks (measure.energy): a sampler thread, never the timing loop, reads
NVML's counter; a block's power comes from the counter's updates inside it, and its joules are that power
times the steps' own time. A fake NVML on the real clock stands in for the GPU: a counter that moves every
100 ms, reads that take milliseconds (they sleep, releasing the GIL as NVML's ctypes call does)."""

from __future__ import annotations

import math
import sys
import threading
import time
import types

import pytest
import torch

from cs336sys.measure import energy
from cs336sys.measure.energy import COUNTER, SAMPLED, NvmlMeter, Reading, Sampler, counter_watts, energy_stats, power_watts, trapezoid
from cs336sys.measure.session import Policy, Session
from cs336sys.measure.timing import STEP, StepClock, time_steps, timing_rows

CPU = torch.device("cpu")


class FakeNVMLError(Exception):
    pass


def fake_nvml(watts=300.0, period=0.1, read_s=0.0, counter=True, power=True, fail_after: int | None = None):
    """A stand-in pynvml on the real clock: a GPU drawing ``watts`` whose counter moves every ``period`` s.

    Every read sleeps ``read_s`` and then samples; ``reads`` holds (thread ident, time) of each counter read.
    ``fail_after``: the counter raises from its (fail_after+1)-th read on, as a driver that stops answering.
    """
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = FakeNVMLError
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    nvml.reads = []
    origin = time.perf_counter()

    def total_energy(handle):
        time.sleep(read_s)
        now = time.perf_counter()
        nvml.reads.append((threading.get_ident(), now))
        if not counter:
            raise FakeNVMLError("Not Supported")
        if fail_after is not None and len(nvml.reads) > fail_after:
            raise FakeNVMLError("GPU is lost")
        return int(watts * 1e3 * math.floor((now - origin) / period) * period)  # mJ up to the last update

    def power_usage(handle):
        if not power:
            raise FakeNVMLError("Not Supported")
        time.sleep(read_s)
        return int(watts * 1e3)  # mW

    nvml.nvmlDeviceGetTotalEnergyConsumption = total_energy
    nvml.nvmlDeviceGetPowerUsage = power_usage
    return nvml


def sleeping_step(seconds: float):
    def step(clock: StepClock) -> None:
        with clock.phase("forward"):
            time.sleep(seconds)

    return step


def timed_rows(meter, monkeypatch, step_s=0.01, min_measure_s=1.2, trials=1):
    session = Session(Policy(trials=trials, min_measure_s=min_measure_s), meter_=meter)
    timing = time_steps(sleeping_step(step_s), session, warmup=1, steps=3, device=CPU)
    return timing, {r["phase"]: r for r in timing_rows(timing, {}, {})}


# ---------------------------------------------------------------- the meter on a synthetic counter


def test_the_meter_gives_the_known_j_per_step_though_a_read_takes_milliseconds(monkeypatch):
    nvml = fake_nvml(watts=300.0, period=0.1, read_s=0.003)
    timing, rows = timed_rows(NvmlMeter(index=0, nvml=nvml), monkeypatch)
    block = timing.blocks[0]
    expected = 300.0 * sum(block[STEP]) / 1e3 / len(block[STEP])  # 300 W over each step's own time
    # Each update is placed within the two reads around it (~3 ms apart; at most MAX_BRACKET_S = 20 ms); the
    # power comes from two updates 0.8 s or more apart (1.2 s block, less the settle and up to a period at
    # each end): off by at most 20 ms / 0.8 s = 2.5%. A read after every step (3 ms on 10-ms steps) read 30% high.
    assert rows[STEP]["energy_j"] == pytest.approx(expected, rel=0.03)
    assert rows[STEP]["avg_power_w"] == pytest.approx(300.0, rel=0.03)
    assert rows[STEP]["energy_source"] == COUNTER and rows[STEP]["energy_note"] == ""


def test_the_timing_thread_reads_no_counter_inside_a_block(monkeypatch):
    nvml = fake_nvml(read_s=0.001)
    meter = NvmlMeter(index=0, nvml=nvml)
    opened = len(nvml.reads)  # the probes that time a read, when the meter opens
    timed_rows(meter, monkeypatch, min_measure_s=0.6, trials=2)
    main = threading.get_ident()
    assert [r for r in nvml.reads[opened:] if r[0] == main] == []
    assert len(nvml.reads) > opened  # the sampler thread read it


def test_the_sampler_reads_back_to_back_only_near_an_update():
    nvml = fake_nvml(period=0.1, read_s=0.003)
    sampler = Sampler(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(None), time.perf_counter, period_s=0.1)
    sampler.start()
    time.sleep(1.2)
    sampler.halt()
    took = sorted(t1 - t0 for t0, t1, _ in sampler.reads)[len(sampler.reads) // 2]
    assert len(sampler.reads) < 0.6 * 1.2 / took  # back to back, every read would follow the last: ~400
    assert sampler.error is None


def test_each_row_records_what_one_read_costs(monkeypatch):
    meter = NvmlMeter(index=0, nvml=fake_nvml(read_s=0.004))
    assert meter.read_ms >= 4.0
    _, rows = timed_rows(meter, monkeypatch, min_measure_s=0.0)
    assert rows[STEP]["energy_read_ms"] == meter.read_ms and rows["forward"]["energy_read_ms"] is None


def test_a_short_block_is_empty_with_the_reason(monkeypatch):
    _, rows = timed_rows(NvmlMeter(index=0, nvml=fake_nvml()), monkeypatch, min_measure_s=0.0)  # 3 steps of 10 ms
    assert rows[STEP]["energy_j"] is None and "fewer than two energy-counter updates" in rows[STEP]["energy_note"]


def test_a_counter_that_fails_mid_block_empties_its_blocks_with_the_reason_and_timing_goes_on(monkeypatch):
    meter = NvmlMeter(index=0, nvml=fake_nvml(fail_after=energy.READ_PROBES + 5))  # the probes pass, then a few reads
    assert meter.source == COUNTER
    _, rows = timed_rows(meter, monkeypatch, min_measure_s=0.3, trials=2)
    assert rows[STEP]["energy_j"] is None and "GPU is lost" in rows[STEP]["energy_note"]
    assert rows[STEP]["n"] >= 6  # the times stand


def test_without_a_counter_power_is_sampled_and_integrated_and_said_so(monkeypatch):
    meter = NvmlMeter(index=0, nvml=fake_nvml(watts=250.0, counter=False, read_s=0.001))
    assert meter.source == SAMPLED and "no energy counter" in meter.note and "Not Supported" in meter.note
    timing, rows = timed_rows(meter, monkeypatch, min_measure_s=0.3)
    block = timing.blocks[0]
    assert rows[STEP]["energy_j"] == pytest.approx(250.0 * sum(block[STEP]) / 1e3 / len(block[STEP]))
    assert rows[STEP]["energy_source"] == SAMPLED and "sampled every 10 ms" in rows[STEP]["energy_note"]


def test_a_block_that_raised_before_its_end_leaves_no_sampler_running():
    meter = NvmlMeter(index=0, nvml=fake_nvml(read_s=0.001))
    meter.begin()  # a step raised: no end
    first = meter._sampler
    meter.begin()
    assert not first.is_alive() and meter._sampler.is_alive()
    meter.end([1.0])
    assert [t for t in threading.enumerate() if t.name == "energy-sampler" and t.is_alive()] == []


def test_a_read_that_hangs_costs_the_block_one_second_and_says_so():
    nvml, hang = fake_nvml(), threading.Event()
    meter = NvmlMeter(index=0, nvml=nvml)
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda handle: hang.wait(10) or 0
    meter.begin()
    started = time.perf_counter()
    reading = meter.end([1.0])
    hang.set()
    assert reading.joules is None and "did not return within 1 s" in reading.note
    assert time.perf_counter() - started < 2 * energy.HALT_S


# ---------------------------------------------------------------- the estimate, on reads written out


def board_reads(begin, end, watts, idle=50.0, lag=0.1, period=0.1, read_s=0.003, phase=0.037):
    """Reads every ``read_s`` from begin - 0.1 s to end + 0.1 s of a GPU at ``watts`` inside [begin, end] and ``idle``
    outside, whose counter moves at phase + k·period to the energy up to ``lag`` s before the update."""

    def energy_j(t):  # ∫ power from 0 to t
        inside = min(max(t, begin), end) - begin
        return idle * t + (watts - idle) * max(inside, 0.0)

    reads, t = [], begin - 0.1
    while t < end + 0.1:
        update = phase + math.floor((t + read_s - phase) / period) * period  # sampled when the read ends
        reads.append((t, t + read_s, 1e3 * energy_j(update - lag)))
        t += read_s
    return reads


def test_a_block_s_power_comes_from_the_updates_inside_it_though_the_counter_lags_a_period():
    reads = board_reads(1.0, 2.0, watts=400.0)
    assert counter_watts(reads, 1.0, 2.0) == pytest.approx(400.0, rel=0.01)  # placed within 3 ms, 0.7 s apart or more
    # without the settle, the first update's energy is the idle GPU's before the block: ~10% low
    assert counter_watts(reads, 1.0, 2.0, settle_s=0.0) < 0.95 * 400.0
    plain = (max(e for _, t1, e in reads if t1 <= 2.0) - min(e for t0, _, e in reads if t0 >= 1.0)) / 1e3
    assert plain / 1.0 < 0.95 * 400.0  # the two ends' reads alone: a period's idle energy in, one of the block's out


def test_an_update_seen_across_a_sleep_is_not_placed():
    reads = board_reads(1.0, 2.0, watts=400.0, lag=0.0)
    gap = [r for r in reads if not 1.45 < r[0] < 1.95]  # the sampler slept through the updates at 1.537, 1.637, ...
    assert counter_watts(gap, 1.0, 2.0) == pytest.approx(400.0, rel=0.01)
    late = [r for r in reads if not 1.85 < r[0] < 1.95]  # slept through 1.937: the last placed update is 1.837
    assert counter_watts(late, 1.0, 2.0) == pytest.approx(400.0, rel=0.01)


def test_fewer_than_two_updates_past_the_settle_give_no_power():
    reads = board_reads(1.0, 1.2, watts=400.0)  # past the settle (1.1 s) and before the end: the update at 1.137 alone
    assert counter_watts(reads, 1.0, 1.2) is None


def test_power_samples_integrate_by_trapezoids_over_their_span():
    samples = [(0.0, 0.001, 100.0), (1.0, 1.001, 300.0), (3.0, 3.001, 300.0), (4.0, 4.5, 999.0)]
    assert power_watts(samples, end=4.2) == pytest.approx((200.0 + 600.0) / 3.0)  # the last ended after the block
    assert power_watts(samples[:1], end=4.2) is None
    assert trapezoid([(0.0, 100.0), (1.0, 300.0), (3.0, 300.0)]) == 200.0 + 600.0


# ---------------------------------------------------------------- NVML missing, broken, elsewhere


def test_the_index_comes_from_the_environment_as_for_the_gpu_state(monkeypatch):
    nvml = fake_nvml()
    handles = []
    nvml.nvmlDeviceGetHandleByIndex = lambda i: handles.append(i) or ("handle", i)
    monkeypatch.setenv("CS336SYS_GPU_INDEX", "3")
    NvmlMeter(nvml=nvml)
    monkeypatch.delenv("CS336SYS_GPU_INDEX")
    NvmlMeter(nvml=nvml)
    assert handles == [3, 0]


def test_no_bindings_gives_an_empty_reading_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    meter = NvmlMeter(index=0)
    assert meter.source == "" and meter.read_ms is None
    meter.begin()
    reading = meter.end([10.0, 10.0])
    assert reading.joules is None and "no NVML bindings" in reading.note
    row = energy_stats([reading])
    assert row["energy_j"] is None and row["energy_source"] == "" and "no NVML bindings" in row["energy_note"]


def test_a_gpu_without_counter_or_power_reading_is_empty_with_the_reason():
    meter = NvmlMeter(index=0, nvml=fake_nvml(counter=False, power=False))
    assert meter.source == ""
    meter.begin()
    assert meter.end([1.0]).joules is None and "neither" in meter.note


def test_nvml_that_fails_to_start_is_a_reason_not_an_error():
    nvml = fake_nvml()

    def broken():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    nvml.nvmlInit = broken
    meter = NvmlMeter(index=0, nvml=nvml)
    assert meter.source == "" and "NVML unavailable" in meter.note and "libnvidia-ml" in meter.note


def test_cpu_device_gets_no_meter_but_the_reason():
    meter = Session().meter("cpu")
    meter.begin()
    assert meter.end([1.0, 2.0]) == Reading(None, 0.003, 2, "", energy.NO_CUDA, None)


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_the_counter_rises_over_a_second_of_matmuls_at_a_plausible_power():
    meter = Session().meter("cuda")
    assert meter.source == COUNTER, meter.note
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    start, step_ms = time.perf_counter(), []
    meter.begin()
    while time.perf_counter() - start < 1.0:
        t0 = time.perf_counter()
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t0) * 1e3)
    reading = meter.end(step_ms)
    assert reading.joules is not None and reading.joules > 0, reading.note
    assert 20 < energy_stats([reading])["avg_power_w"] < 1500
    assert 0 < meter.read_ms < 100


# ---------------------------------------------------------------- the energy check, on a CPU


def test_the_energy_check_runs_a_workload_end_to_end(monkeypatch):
    import argparse

    from cs336sys.measure import energy_check

    nvml = fake_nvml(watts=300.0, read_s=0.001)
    meter = NvmlMeter(index=0, nvml=nvml)
    monkeypatch.setitem(energy_check.LM, "extra_sizes", {"tiny": {"d_model": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2}})
    monkeypatch.setitem(energy_check.LM, "impl", "eager")
    args = argparse.Namespace(window_s=0.5, blocks=2, pairs=2, reads=20, warm_s=0.05)
    row = energy_check.check("tiny fp32 inference", "tiny", "fp32", args, nvml, None, CPU, Session(meter_=meter))
    # the window's watts do not depend on the CPU's speed: its two reads see the counter's 100 ms steps, within ±20%
    # over 0.5 s. J/step is 300 W times the metered blocks' steps, which on a shared 2-core CPU ran 1.9x the
    # unmetered blocks' median (a .ci/run): a band around it that still catches a unit slip
    assert row["window_w"] == pytest.approx(300.0, rel=0.25)
    assert 0.25 < row["pipeline_j"] / (300.0 * row["step_ms"] / 1e3) < 4
    assert row["window_steps"] > 0 and row["read_ms"] >= 1.0 and row["cost"] > 0 and row["pairs"] == 2
    assert energy_check.verdict(row) in ("ok", "FAIL") and "tiny fp32 inference" in energy_check.table([row])
