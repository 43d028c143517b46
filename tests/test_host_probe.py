"""The host probe (measure.host_probe), its fold over passes (analysis.passes) and the profile study's busy share; CPU only."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys.analysis.passes import HOST_PROBE, combine_passes
from cs336sys.measure import busy, host_probe, timing
from cs336sys.measure.session import Policy, Session
from cs336sys.pipeline.cells import Cell, run_cell

CPU = torch.device("cpu")


def session() -> Session:
    return Session(Policy(target_rel=0.2, max_measure_s=0.3))


# ---------------------------------------------------------------- the probe


def test_launch_us_on_a_cpu_is_a_positive_finite_float():
    us = host_probe.launch_us(CPU)
    assert isinstance(us, float) and math.isfinite(us) and us > 0
    assert us < 10_000  # a one-element add_ is microseconds, not milliseconds


def test_launch_us_is_the_median_block_per_launch(monkeypatch):
    # three blocks of 10 launches: 100 µs, 5000 µs (preempted), 200 µs -> 10, 500, 20 µs per launch
    ticks = iter([0.0, 100e-6, 1.0, 1.0 + 5000e-6, 2.0, 2.0 + 200e-6])
    monkeypatch.setattr(host_probe, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    assert host_probe.launch_us(CPU, launches=10, blocks=3) == 20.0


def test_with_probe_adds_the_host_speed_and_keeps_the_samplers_keys():
    state = {"load_avg_1m": 0.5, "sm_clock_mhz": 1980}
    sample = host_probe.with_probe(lambda: state, CPU)()
    assert sample["load_avg_1m"] == 0.5 and sample["sm_clock_mhz"] == 1980
    assert isinstance(sample[HOST_PROBE], float) and sample[HOST_PROBE] > 0
    assert HOST_PROBE not in state  # the sampler's own dict is not written to


def test_a_failing_probe_leaves_the_column_empty_and_the_sample_intact(monkeypatch):
    def broken(device, *args, **kwargs):
        raise RuntimeError("CUDA error: launch failure")

    monkeypatch.setattr(host_probe, "launch_us", broken)
    sample = host_probe.with_probe(lambda: {"load_avg_1m": 0.5}, CPU)()
    assert sample == {"load_avg_1m": 0.5, HOST_PROBE: ""}


def test_a_timed_block_records_the_probe_before_and_after():
    probed = Session(state=host_probe.with_probe(lambda: {"load_avg_1m": 0.5}, CPU))
    t = timing.time_steps(lambda clock: None, probed, warmup=1, steps=2, device=CPU)
    for side in ("start", "end"):
        assert t.state[f"{side}_load_avg_1m"] == 0.5
        assert t.state[f"{side}_{HOST_PROBE}"] > 0


def measure_timed(device, context, session, **axes):
    """A cell's measurement (run in the child by run_cell): one timed block with the sampler of the runner's session."""
    context["mode"] = "inference"
    t = timing.time_steps(lambda clock: None, session, warmup=1, steps=2, device=device, policy=Policy())
    yield {"mode": "inference", "phase": "step", **t.state}


@pytest.mark.slow
def test_every_cell_samples_the_host_probe_with_the_host_state():
    cell = Cell("unit", "study=t_x=1", {"x": 1}, f"{__name__}:measure_timed", device="cpu", timeout_s=60)
    rows = run_cell(cell)
    assert rows[0]["status"] == "ok", rows[0].get("error")
    for side in ("start", "end"):
        assert f"{side}_load_avg_1m" in rows[0]  # the CPU sampler's own column is kept
        assert float(rows[0][f"{side}_{HOST_PROBE}"]) > 0


# ---------------------------------------------------------------- the merge keeps the median of the samples


def _pass(k, median, start, end, **extra):
    samples = [median * f for f in (0.99, 1.0, 1.01)]
    low, high = min(samples), max(samples)
    head = {"study": "e2e", "cell_id": "c", "status": "ok", "error": "", "mode": "train", "phase": "step"}
    times = {"median_ms": median, "ci_low_ms": low, "ci_high_ms": high, "mean_ms": median, "std_ms": 0.1, "min_ms": low, "max_ms": high}
    steps = {"n": 3, "trials": 1, "trial_medians_ms": f"{median:.4f}", "samples_ms": ";".join(f"{s:.4f}" for s in samples)}
    return {**head, **times, **steps, "pass_index": k, f"start_{HOST_PROBE}": start, f"end_{HOST_PROBE}": end, **extra}


def test_the_merge_keeps_the_median_of_every_passes_probe_samples():
    two = combine_passes(pd.DataFrame([_pass(0, 10.0, 5.0, 7.0), _pass(1, 10.0, 6.0, 30.0)]))
    assert len(two) == 1 and two.loc[0, HOST_PROBE] == 6.5  # median of 5, 6, 7, 30: one slow sample does not move it
    one = combine_passes(pd.DataFrame([_pass(0, 10.0, 5.0, 7.0)]))
    assert one.loc[0, HOST_PROBE] == 6.0


def test_a_failed_or_missing_probe_is_left_out_of_the_median():
    # "" is what with_probe records when the probe fails; it arrives from CSV as NaN or ""
    out = combine_passes(pd.DataFrame([_pass(0, 10.0, "", 7.0), _pass(1, 10.0, np.nan, 9.0)]))
    assert out.loc[0, HOST_PROBE] == 8.0
    none = combine_passes(pd.DataFrame([_pass(0, 10.0, "", np.nan)]))
    assert HOST_PROBE not in none or pd.isna(none.loc[0, HOST_PROBE])


def test_paired_rows_keep_the_probe_median_too():
    def pair(k, start, end):
        own, other = [23.0 + 0.01 * i for i in range(8)], [20.0 + 0.01 * i for i in range(8)]
        head = {"study": "e2e", "cell_id": "c", "status": "ok", "error": "", "kind": "pair", "mode": "train", "phase": "step"}
        blocks = {"own_blocks_ms": ";".join(map(str, own)), "partner_blocks_ms": ";".join(map(str, other))}
        ratio = {"ratio": 1.15, "ratio_ci_low": 1.14, "ratio_ci_high": 1.16}
        probe = {f"start_{HOST_PROBE}": start, f"end_{HOST_PROBE}": end}
        return {**head, "pair_with": "precision=bf16", **blocks, "stop_reason": "target", "pass_index": k, **ratio, **probe}

    out = combine_passes(pd.DataFrame([pair(0, 5.0, 7.0), pair(1, 6.0, 30.0)]))
    assert out.loc[0, HOST_PROBE] == 6.5
    assert combine_passes(pd.DataFrame([pair(0, 5.0, 7.0)])).loc[0, HOST_PROBE] == 6.0


# ---------------------------------------------------------------- the profile study's busy share

TINY = {"tiny": {"d_model": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2}}
LM = dict(size="tiny", context_length=16, precision="fp32", impl="eager", batch_size=1, vocab_size=100, extra_sizes=TINY)
LM.update(warmup_steps=1, measure_steps=2, profile_steps=1)


def test_profile_timing_rows_on_a_cpu_carry_an_empty_busy_share_and_why():
    from cs336sys.studies.profile import measure as prof

    rows = pd.DataFrame(prof.measure(CPU, {}, session(), **cell_kwargs("profile", **LM)))
    timed = rows[rows["kind"] == "timing"]
    assert set(timed["mode"]) == {"inference", "train"}
    assert timed["gpu_busy_frac"].isna().all()
    assert (timed["gpu_busy_note"] == busy.NO_CUDA).all()


def test_profile_measures_the_busy_share_after_every_timing(monkeypatch):
    """A busy share measured between modes would leave the profiler attached while the next mode is timed."""
    from cs336sys.studies.profile import measure as prof

    calls = []

    def gpu_busy_share(step, device, session, steps=3):
        calls.append("busy")
        session.mark_profiled("a stand-in profiler")  # what torch.profiler does on a GPU
        return 0.42

    monkeypatch.setattr(prof, "gpu_busy_share", gpu_busy_share)
    rows = pd.DataFrame(prof.measure(CPU, {}, session(), **cell_kwargs("profile", **LM)))  # raises if any mode is timed after the stand-in
    timed = rows[rows["kind"] == "timing"]
    assert calls == ["busy", "busy"]
    assert (timed["gpu_busy_frac"] == 0.42).all() and (timed["gpu_busy_note"] == "").all()


def test_profile_out_of_memory_under_the_busy_profiler_costs_only_the_share(monkeypatch):
    from cs336sys.studies.profile import measure as prof

    def gpu_busy_share(step, device, session, steps=3):
        raise torch.OutOfMemoryError("CUDA out of memory (test)")

    monkeypatch.setattr(prof, "gpu_busy_share", gpu_busy_share)
    rows = pd.DataFrame(prof.measure(CPU, {}, session(), **cell_kwargs("profile", **LM)))
    timed = rows[rows["kind"] == "timing"]
    assert len(timed) and timed["gpu_busy_frac"].isna().all()
    assert timed["gpu_busy_note"].str.contains("out of memory under the profiler").all()
    assert (rows["kind"] == "kernel").any()  # the kernel tables were still profiled
