"""Folding a cell's passes over the grid into one row (analysis.passes), with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cs336sys.analysis.metrics import add_derived
from cs336sys.analysis.passes import combine_passes, widen
from cs336sys.measure.stats import log_t_interval, median_ci_order, trial_ci


def _row(pass_index, samples, cell="c1", mode="train", phase="step", **extra):
    samples = list(samples)
    median, low, high = float(np.median(samples)), min(samples), max(samples)
    head = {"study": "e2e", "cell_id": cell, "status": "ok", "error": "", "mode": mode, "phase": phase}
    spread = {"mean_ms": float(np.mean(samples)), "std_ms": float(np.std(samples, ddof=1)), "min_ms": low, "max_ms": high}
    steps = {"n": len(samples), "trials": 1, "trial_medians_ms": f"{median:.4f}", "samples_ms": ";".join(f"{s:.4f}" for s in samples)}
    return {**head, "median_ms": median, "ci_low_ms": low, "ci_high_ms": high, **spread, **steps, "pass_index": pass_index, **extra}


def test_three_passes_pool_their_steps_and_take_the_widest_interval():
    rng = np.random.default_rng(0)
    passes = [list(10.0 * shift + rng.normal(0, 0.01, 20)) for shift in (1.0, 1.3, 0.9)]
    df = pd.DataFrame([_row(k, s) for k, s in enumerate(passes)])
    out = combine_passes(df, floor_rel=0.0)
    assert len(out) == 1
    row = out.iloc[0]
    pooled = np.round(np.concatenate(passes), 4)
    assert row["median_ms"] == pytest.approx(np.median(pooled), rel=1e-9)
    assert row["n"] == 60 and row["passes"] == 3 and row["trials"] == 3
    pass_medians = [float(m) for m in row["pass_medians_ms"].split(";")]
    assert pass_medians == pytest.approx([np.median(s) for s in passes], abs=1e-4)
    # the t-interval of the three log pass medians is the widest part here: host drift between passes
    _, t_low, t_high = log_t_interval(pass_medians)
    o_low, o_high = median_ci_order(pooled)
    assert row["ci_low_ms"] == pytest.approx(max(min(t_low, o_low), 0.0), rel=1e-5)
    assert row["ci_high_ms"] == pytest.approx(max(t_high, o_high), rel=1e-5)  # medians stored to 4 decimals
    assert row["ci_high_ms"] - row["ci_low_ms"] > 0.3 * 10  # wider than any one pass's spread (±0.03)
    assert row["min_ms"] == pytest.approx(pooled.min()) and row["max_ms"] == pytest.approx(pooled.max())


def test_the_floor_widens_a_narrow_interval_and_only_a_narrow_one():
    steps = [10.0 + 0.0001 * i for i in range(30)]
    one = pd.DataFrame([_row(0, steps)])
    out = combine_passes(one, floor_rel=0.01).iloc[0]
    assert out["ci_low_ms"] == pytest.approx(out["median_ms"] * 0.99)
    assert out["ci_high_ms"] == pytest.approx(out["median_ms"] * 1.01)
    untouched = combine_passes(one, floor_rel=0.0).iloc[0]
    assert untouched["ci_high_ms"] - untouched["ci_low_ms"] < 0.01
    assert widen(10.0, 5.0, 20.0, 0.01) == (5.0, 20.0)  # already wider: unchanged
    low, high = widen(math.nan, 1.0, 2.0, 0.01)
    assert (low, high) == (1.0, 2.0)


def test_the_profile_studys_timing_rows_get_the_floor_and_its_kernel_rows_pass_through():
    # the profile study marks its timed rows kind=timing beside kind=kernel rows; on the H100 they
    # repeated within ±0.1% inside a run and moved 0.2-0.9% between runs (5 of 6 outside, no floor)
    steps = [18.5 + 0.0001 * i for i in range(30)]
    kernel = {"study": "profile", "cell_id": "c1", "status": "ok", "error": "", "mode": "train", "phase": "forward"}
    kernel |= {"kind": "kernel", "name": "gemm", "pass_index": 0}
    df = pd.DataFrame([{**_row(0, steps, phase="forward"), "study": "profile", "kind": "timing"}, kernel])
    out = combine_passes(df, floor_rel=0.01)
    timing = out[out["kind"] == "timing"].iloc[0]
    assert timing["ci_low_ms"] == pytest.approx(timing["median_ms"] * 0.99)
    assert timing["ci_high_ms"] == pytest.approx(timing["median_ms"] * 1.01)
    assert (out["kind"] == "kernel").sum() == 1


def test_a_throttled_or_slow_clocked_pass_flags_the_merged_row():
    base = {"start_throttle_reasons": "none", "max_sm_clock_mhz": 1980, "start_sm_clock_mhz": 1980}
    rows = [
        _row(0, [10.0] * 10, end_throttle_reasons="none", end_sm_clock_mhz=1980, gpu_busy_frac=0.95, **base),
        _row(1, [10.1] * 10, end_throttle_reasons="sw_thermal_slowdown", end_sm_clock_mhz=1500, gpu_busy_frac=0.85, **base),
        _row(2, [10.0] * 10, end_throttle_reasons="none", end_sm_clock_mhz=1980, gpu_busy_frac=0.96, **base),
    ]
    out = add_derived(combine_passes(pd.DataFrame(rows), floor_rel=0.01)).iloc[0]
    assert bool(out["throttled"]) and bool(out["below_clocks"]) and bool(out["host_bound"])
    assert out["gpu_busy_frac"] == pytest.approx(0.85)


def test_phases_modes_and_cells_stay_apart_and_keep_their_order():
    cells = [(c, m, p) for c in ("b", "a") for m in ("inference", "train") for p in ("step", "forward")]
    rows = [_row(k, [1.0 + k, 1.1 + k], cell=c, mode=m, phase=p) for k in range(2) for c, m, p in cells]
    out = combine_passes(pd.DataFrame(rows))
    assert len(out) == 8
    assert list(dict.fromkeys(out["cell_id"])) == ["b", "a"]
    assert set(out["passes"]) == {2}


def test_failures_are_kept_once_and_records_come_from_the_first_pass():
    oom = {"study": "e2e", "cell_id": "c1", "status": "oom", "error": "CUDA out of memory", "mode": "train", "pass_index": 0}
    record = {"study": "e2e", "cell_id": "c1", "status": "ok", "error": "", "kind": "memory", "peak": 1.0}
    timed = [_row(0, [5.0, 5.1], mode="inference"), _row(1, [5.2, 5.3], mode="inference")]
    rows = [*timed, oom, {**oom, "pass_index": 1}, {**record, "pass_index": 0}, {**record, "pass_index": 1, "peak": 2.0}]
    out = combine_passes(pd.DataFrame(rows))
    assert (out["status"] == "oom").sum() == 1
    records = out[out["kind"] == "memory"]
    assert len(records) == 1 and records["peak"].iloc[0] == 1.0
    timed = out[(out["status"] == "ok") & out["median_ms"].notna()]
    assert len(timed) == 1 and timed["passes"].iloc[0] == 2


def test_passes_without_stored_steps_use_their_medians_and_the_hull_of_their_intervals():
    a = {**_row(0, [1.0, 1.1]), "samples_ms": "", "median_ms": 1.00, "ci_low_ms": 0.99, "ci_high_ms": 1.01, "n": 5000}
    b = {**_row(1, [1.0, 1.1]), "samples_ms": "", "median_ms": 1.04, "ci_low_ms": 1.03, "ci_high_ms": 1.05, "n": 5000}
    out = combine_passes(pd.DataFrame([a, b]), floor_rel=0.0).iloc[0]
    assert out["median_ms"] == pytest.approx(1.02)
    assert out["n"] == 10000
    _, t_low, t_high = log_t_interval([1.00, 1.04])
    assert out["ci_low_ms"] == pytest.approx(max(min(0.99, t_low), 0.0))
    assert out["ci_high_ms"] == pytest.approx(max(1.05, t_high))


def test_gpu_bound_cells_pool_their_drift_and_a_lone_host_bound_cell_keeps_its_own():
    from cs336sys.measure.stats import t_quantile_975

    rows = []
    for i in range(10):  # ten GPU-bound cells whose two passes differ by 0.2%
        rows += [_row(k, [10.0 * (1 + 0.002 * k)] * 20, cell=f"g{i}", gpu_busy_frac=0.97) for k in range(2)]
    rows += [_row(k, [50.0 * (1 + 0.4 * k)] * 20, cell="host", gpu_busy_frac=0.1) for k in range(2)]
    out = combine_passes(pd.DataFrame(rows), floor_rel=0.0, min_gpu_busy=0.9).set_index("cell_id")
    d = np.log(1.002) / 2  # each cell's two log medians sit ±d from their mean
    s, df = math.sqrt(10 * 2 * d**2 / 10), 10
    g = out.loc["g0"]
    half = t_quantile_975(df) * s / math.sqrt(2)
    assert g["ci_high_ms"] == pytest.approx(g["median_ms"] * math.exp(half), rel=1e-6)
    own_low, own_high = trial_ci([10.0, 10.02])
    assert g["ci_high_ms"] - g["ci_low_ms"] < (own_high - own_low) / 3  # t(10) with the pool, not t(1)
    h = out.loc["host"]  # alone in its class: its own two passes, t(1) on the log scale (wide, but above zero)
    assert (h["ci_low_ms"], h["ci_high_ms"]) == pytest.approx(log_t_interval([50.0, 70.0])[1:])
    assert h["ci_low_ms"] > 0


def test_host_bound_cells_pool_their_drift_among_themselves():
    from cs336sys.measure.stats import t_quantile_975

    rows = []
    for i in range(6):  # six launch-bound cells whose passes differ by 10%, one by 40%
        r = 1.4 if i == 0 else 1.1
        rows += [_row(k, [50.0 * r**k] * 20, cell=f"h{i}", gpu_busy_frac=0.1) for k in range(2)]
    out = combine_passes(pd.DataFrame(rows), floor_rel=0.0, min_gpu_busy=0.9).set_index("cell_id")
    ss = 5 * 2 * (np.log(1.1) / 2) ** 2 + 2 * (np.log(1.4) / 2) ** 2
    s_pool = math.sqrt(ss / 6)
    h1 = out.loc["h1"]
    half = t_quantile_975(6) * max(s_pool, math.sqrt(2 * (np.log(1.1) / 2) ** 2)) / math.sqrt(2)
    assert h1["ci_high_ms"] == pytest.approx(h1["median_ms"] * math.exp(half), rel=1e-6)
    assert h1["ci_high_ms"] < log_t_interval([50.0, 55.0])[2]  # t(6) with the pool, not t(1)
    h0 = out.loc["h0"]  # the wild one keeps its own, wider spread
    half0 = t_quantile_975(6) * (np.log(1.4) / 2) * math.sqrt(2) / math.sqrt(2)
    assert h0["ci_high_ms"] == pytest.approx(h0["median_ms"] * math.exp(half0), rel=1e-6)


def test_a_pass_that_shared_the_host_flags_the_merged_row_as_shared():
    rows = [
        _row(0, [10.0] * 10, concurrent_jobs=0, gpu_lock="held", concurrent_runs=""),
        _row(1, [10.1] * 10, concurrent_jobs=2, gpu_lock="held", concurrent_runs="/home/b/other"),
    ]
    out = add_derived(combine_passes(pd.DataFrame(rows), floor_rel=0.01)).iloc[0]
    assert out["concurrent_jobs"] == 2 and bool(out["shared"])
    alone = add_derived(combine_passes(pd.DataFrame([_row(0, [10.0] * 10, concurrent_jobs=0, gpu_lock="held")]))).iloc[0]
    assert not bool(alone["shared"])
    unlocked = add_derived(combine_passes(pd.DataFrame([_row(0, [10.0] * 10, concurrent_jobs=0, gpu_lock="none: MIG device")]))).iloc[0]
    assert bool(unlocked["shared"])


def test_a_comparison_pools_with_the_more_host_bound_of_its_two_sides():
    """fp32 (GPU-bound) paired with its launch-bound bf16 partner drifts as the bf16 side does: on a cold H100
    its pass ratios were 2.00 and 1.01, and pooled with GPU-bound comparisons its interval was [0.019, 108]."""
    from cs336sys.analysis.drift import pair_busy, partner_cell

    base = "size=large_context_length=256_precision=fp32_impl=sdpa_compile=0"
    assert partner_cell(base, "precision=bf16") == "size=large_context_length=256_precision=bf16_impl=sdpa_compile=0"
    assert partner_cell(base, "cuda_graphs=1") == base  # a partner that is no cell of the grid: the cell itself
    busy = pd.Series({(base, "inference"): 0.93, (partner_cell(base, "precision=bf16"), "inference"): 0.23})
    assert pair_busy(base, "inference", "precision=bf16", busy) == 0.23
    assert pair_busy(base, "inference", "cuda_graphs=1", busy) == 0.93
