"""Paired comparisons and GPU time per phase (issue: answers that say something on a noisy host).

The paired ratio must recover a known ratio through host drift that makes two
independently timed cells indistinguishable; sampling must stop at its target or
its budget and say which; an e2e cell on a CPU must record why it has no GPU time;
on a GPU the per-phase graphs must add up to the whole-step graph.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys.analysis.passes import combine_passes
from cs336sys.catalog import BUILT_IN
from cs336sys.measure.interleave import MIN_PAIRS, time_arms
from cs336sys.measure.session import Policy, Session
from cs336sys.measure.stats import log_t_interval, paired_ratio, ratio_interval, summarize_trials
from cs336sys.measure.timing import STEP, time_steps
from cs336sys.pipeline import plan

CPU = torch.device("cpu")


class DriftingHost:
    """A fake clock and two fake steps whose cost is ``base × drift(t)``: a host that slows down and speeds up."""

    def __init__(self, costs: dict[str, float], swing: float = 0.4, period_s: float = 3.0, seed: int = 0):
        self.now, self.costs, self.swing, self.period = 0.0, costs, swing, period_s
        self.rng = np.random.default_rng(seed)

    def clock(self) -> float:
        return self.now

    def drift(self) -> float:
        return 1.0 + self.swing * math.sin(2 * math.pi * self.now / self.period)

    def step(self, name: str):
        def run(clock) -> None:
            self.now += self.costs[name] * self.drift() * (1 + 0.01 * self.rng.standard_normal())

        return run


def test_paired_ratio_recovers_a_known_ratio_through_drift_that_hides_it_from_two_cells():
    host = DriftingHost({"a": 0.010, "b": 0.008})  # a is 1.25x b; the host swings ±40% every 3 s
    arms = {"a": host.step("a"), "b": host.step("b")}
    result = time_arms(arms, Session(), warmup=1, block_steps=2, device=CPU, min_pairs=12, clock=host.clock, sync=lambda d: None)
    r = result.ratio("a", "b")
    assert r.n == 12 and r.low < 1.25 < r.high
    assert r.half_width_rel < 0.03  # drift cancels in the pairs
    # the same blocks compared as two independent cells: intervals that overlap, no finding
    a = summarize_trials([b[STEP] for b in result.arms["a"].blocks])
    b = summarize_trials([b[STEP] for b in result.arms["b"].blocks])
    naive = ratio_interval(a, b)
    assert not naive.bounded or math.log(naive.high / naive.low) > 4 * math.log(r.high / r.low)


def test_interleaving_alternates_the_order_so_each_arm_leads_as_often():
    order: list[str] = []
    now = [0.0]

    def step(name):
        def run(clock):
            order.append(name)
            now[0] += 0.001

        return run

    arms = {"a": step("a"), "b": step("b"), "c": step("c")}
    time_arms(arms, Session(), warmup=0, block_steps=1, device=CPU, min_pairs=4, clock=lambda: now[0], sync=lambda d: None)
    assert order == list("abccbaabccba")


def test_pairs_stop_at_the_target_or_at_the_budget_and_say_which():
    steady = DriftingHost({"a": 0.010, "b": 0.005}, swing=0.0)
    arms, session = {"a": steady.step("a"), "b": steady.step("b")}, Session(Policy(target_rel=0.05, max_measure_s=100))
    done = time_arms(arms, session, warmup=0, block_steps=2, device=CPU, min_pairs=8, clock=steady.clock, sync=lambda d: None)
    assert done.stop_reason == "target" and done.pairs == 8
    wild = DriftingHost({"a": 0.010, "b": 0.005}, swing=0.0)
    wild.rng = np.random.default_rng(1)
    noisy = {"a": lambda c: setattr(wild, "now", wild.now + 0.010 * np.exp(wild.rng.normal(0, 1.0))), "b": wild.step("b")}
    policy = Policy(target_rel=0.01, max_measure_s=0.5)
    spent = time_arms(
        noisy, Session(), warmup=0, block_steps=1, device=CPU, min_pairs=8, policy=policy, clock=wild.clock, sync=lambda d: None
    )
    assert spent.stop_reason == "budget" and spent.pairs >= 8
    assert sum(t.timed_s for t in spent.arms.values()) >= 0.5


def test_each_pass_takes_its_share_of_the_pairs_and_of_the_budget():
    def run(passes: int, target_rel: float):
        wild = DriftingHost({"a": 0.010, "b": 0.005}, swing=0.0)
        wild.rng = np.random.default_rng(1)
        noisy = {"a": lambda c: setattr(wild, "now", wild.now + 0.010 * np.exp(wild.rng.normal(0, 1.0))), "b": wild.step("b")}
        policy = Policy(target_rel=target_rel, max_measure_s=1.0, passes=passes)
        return time_arms(noisy, Session(policy), warmup=0, block_steps=1, device=CPU, clock=wild.clock, sync=lambda d: None)

    one, two = run(1, 0.01), run(2, 0.01)  # never at the target: each spends its budget
    assert one.stop_reason == two.stop_reason == "budget"
    assert sum(t.timed_s for t in one.arms.values()) >= 1.0 > sum(t.timed_s for t in two.arms.values()) >= 0.5


def test_a_steady_pair_stops_after_its_passes_share_of_the_pairs():
    def pairs(passes: int) -> int:
        steady = DriftingHost({"a": 0.010, "b": 0.005}, swing=0.0)
        session = Session(Policy(target_rel=0.05, max_measure_s=100, passes=passes))
        arms = {"a": steady.step("a"), "b": steady.step("b")}
        return time_arms(arms, session, warmup=0, block_steps=2, device=CPU, clock=steady.clock, sync=lambda d: None).pairs

    assert [pairs(n) for n in (1, 2, 3)] == [MIN_PAIRS, MIN_PAIRS // 2, 3]  # the passes together hold MIN_PAIRS


def test_a_noisy_single_cell_gets_more_trials_until_its_target_or_budget():
    host = DriftingHost({"a": 0.010}, swing=0.3, period_s=0.5)
    session = Session(Policy(target_rel=0.02, max_measure_s=1.0))
    t = time_steps(host.step("a"), session, warmup=0, steps=3, device=CPU, clock=host.clock, sync=lambda d: None)
    assert t.phases[STEP].n > 3 and len(t.phases[STEP].trial_medians_ms) > 1
    assert t.stop_reason in ("target", "budget")
    fixed = time_steps(host.step("a"), session, warmup=0, steps=3, device=CPU, policy=Policy(), clock=host.clock, sync=lambda d: None)
    assert fixed.stop_reason == "fixed" and fixed.phases[STEP].n == 3


def test_log_t_interval_stays_positive_where_a_linear_one_reaches_zero():
    centre, low, high = log_t_interval([50.0, 90.0])
    assert 0 < low < centre < high
    assert centre == pytest.approx(math.sqrt(50 * 90))
    assert paired_ratio([2.0, 4.0, 8.0], [1.0, 2.0, 4.0]).median == pytest.approx(2.0)
    assert paired_ratio([2.0, 4.0, 8.0], [1.0, 2.0, 4.0]).half_width_rel == pytest.approx(0.0, abs=1e-12)


def test_partners_come_from_the_study_pairs_and_the_grid():
    section = {
        "grid": {
            "size": ["small"],
            "context_length": [128],
            "precision": ["fp32", "bf16"],
            "impl": ["eager"],
            "compile": [False],
            "cuda_graphs": [False],
        }
    }
    fp32 = {"size": "small", "context_length": 128, "precision": "fp32", "impl": "eager", "compile": 0, "cuda_graphs": 0}
    assert plan.partners("e2e", fp32, section, BUILT_IN) == [{"cuda_graphs": True}, {"precision": "bf16"}]
    assert plan.partners("e2e", {**fp32, "precision": "bf16"}, section, BUILT_IN) == [{"cuda_graphs": True}]
    assert plan.partners("e2e", {**fp32, "cuda_graphs": 1}, section, BUILT_IN) == []  # a graph cell is its own GPU time
    assert plan.partners("warmup", {**fp32, "warmup_steps": 0}, section, BUILT_IN) == []  # no pairs declared


def test_an_e2e_cell_on_a_cpu_times_its_partners_and_says_why_it_has_no_gpu_time():
    from cs336sys.studies.e2e.measure import NO_GRAPH_ON_CPU, measure

    tiny = {"tiny": {"d_model": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2}}
    kwargs = cell_kwargs(
        "e2e",
        size="tiny",
        context_length=16,
        precision="fp32",
        impl="eager",
        warmup_steps=1,
        measure_steps=2,
        batch_size=1,
        vocab_size=100,
        partners=[{"cuda_graphs": True}, {"precision": "bf16"}],
        extra_sizes=tiny,
    )
    rows = list(measure(CPU, {}, Session(Policy(target_rel=0.2, max_measure_s=0.5)), **kwargs))
    df = pd.DataFrame(rows)
    timed = df[df["kind"].isna()]
    assert set(timed["gpu_note"]) == {NO_GRAPH_ON_CPU} and "gpu_median_ms" not in df
    pairs = df[df["kind"] == "pair"]
    assert set(pairs["pair_with"]) == {"precision=bf16"}
    assert set(pairs["phase"]) == {"step", "forward", "backward", "optimizer_step"}
    assert (pairs["ratio_ci_low"] < pairs["ratio"]).all() and (pairs["ratio"] < pairs["ratio_ci_high"]).all()
    assert (pairs["pairs"] >= 8).all()


def _pair_row(k: int, own, other, *, phase: str, pair_with: str) -> dict:
    """One pass's ``kind=pair`` row of cell ``c`` (train mode), as a cell job writes it."""
    return {
        "study": "e2e",
        "cell_id": "c",
        "status": "ok",
        "error": "",
        "kind": "pair",
        "mode": "train",
        "phase": phase,
        "pair_with": pair_with,
        "own_blocks_ms": ";".join(map(str, own)),
        "partner_blocks_ms": ";".join(map(str, other)),
        "stop_reason": "target",
        "pass_index": k,
    }


def test_a_paired_ratio_gets_the_interval_floor_of_timed_rows():
    # H100, large fp32 train, optimizer step over its graph replay: 1.1486 [1.1459, 1.1513] in one run, 1.1427 in the next
    def pair(k, own, other):
        ratio = float(np.median(np.array(own) / np.array(other)))
        row = _pair_row(k, own, other, phase="optimizer_step", pair_with="cuda_graphs=1")
        return {**row, "ratio": ratio, "ratio_ci_low": 1.1485, "ratio_ci_high": 1.1487}

    own, other = [23.0 + 0.001 * i for i in range(8)], [20.0 + 0.001 * i for i in range(8)]
    for passes in ([pair(0, own, other)], [pair(0, own, other), pair(1, own, other)]):
        row = combine_passes(pd.DataFrame(passes), floor_rel=0.01).iloc[0]
        assert row["ratio_ci_low"] == pytest.approx(row["ratio"] * 0.99) and row["ratio_ci_high"] == pytest.approx(row["ratio"] * 1.01)
        assert combine_passes(pd.DataFrame(passes), floor_rel=0.0).iloc[0]["ratio_ci_high"] < row["ratio"] * 1.002


def test_passes_pool_the_pairs_of_a_cell():
    def pair(k, own, other):
        return _pair_row(k, own, other, phase="step", pair_with="precision=bf16")

    rng = np.random.default_rng(0)
    drift = np.exp(rng.normal(0, 0.3, 16))
    own, other = list(20 * drift), list(10 * drift * np.exp(rng.normal(0, 0.01, 16)))
    out = combine_passes(pd.DataFrame([pair(0, own[:8], other[:8]), pair(1, own[8:], other[8:])]))
    row = out.iloc[0]
    assert len(out) == 1 and row["pairs"] == 16 and row["passes"] == 2
    assert row["ratio_ci_low"] < 2.0 < row["ratio_ci_high"] and row["ratio_ci_high"] / row["ratio_ci_low"] < 1.1
    # a ratio that moved between the passes (a slower host makes eager / graph larger) widens the interval
    moved = combine_passes(pd.DataFrame([pair(0, own[:8], other[:8]), pair(1, [1.2 * x for x in own[8:]], other[8:])])).iloc[0]
    paired_only = paired_ratio(
        [float(x) for x in moved["own_blocks_ms"].split(";")], [float(x) for x in moved["partner_blocks_ms"].split(";")]
    )
    assert moved["ratio_ci_high"] - moved["ratio_ci_low"] > 2 * (paired_only.high - paired_only.low)
    assert moved["ratio_ci_low"] < 2.0 and moved["ratio_ci_high"] > 2.4


def test_gpu_time_columns_fold_over_passes_like_the_eager_ones():
    def row(k, eager, gpu):
        return {
            "study": "e2e",
            "cell_id": "c",
            "status": "ok",
            "error": "",
            "mode": "train",
            "phase": "step",
            "median_ms": float(np.median(eager)),
            "samples_ms": ";".join(map(str, eager)),
            "n": len(eager),
            "trials": 1,
            "gpu_median_ms": float(np.median(gpu)),
            "gpu_ci_low_ms": min(gpu),
            "gpu_ci_high_ms": max(gpu),
            "gpu_samples_ms": ";".join(map(str, gpu)),
            "gpu_n": len(gpu),
            "gpu_busy_frac": 0.2,
            "pass_index": k,
        }

    out = combine_passes(pd.DataFrame([row(0, [80, 90, 85], [29.7, 29.8, 29.75]), row(1, [60, 65, 62], [29.8, 29.9, 29.85])]))
    r = out.iloc[0]
    assert r["gpu_passes"] == 2 and r["gpu_n"] == 6
    assert r["gpu_median_ms"] == pytest.approx(np.median([29.7, 29.8, 29.75, 29.8, 29.9, 29.85]))
    assert r["gpu_ci_low_ms"] <= 29.75 and r["gpu_ci_high_ms"] >= 29.85
    assert r["median_ms"] == pytest.approx(np.median([80, 90, 85, 60, 65, 62]))


@pytest.mark.gpu
def test_per_phase_graphs_add_up_to_the_step_and_match_the_graph_cell():
    from cs336sys.measure.lm_steps import LMCell, graph_optimizer, graphed_lm_steps

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda")
    cell = LMCell(
        size="small", context_length=128, precision="bf16", impl="sdpa", batch_size=2, vocab_size=1000, optimizer="course", extra_sizes={}
    )
    model, inputs, targets = cell.setup(device)
    steps = graphed_lm_steps(model, model, inputs, targets, "bf16", device, graph_optimizer("course", model))
    t = time_steps(steps["train"], Session(Policy(min_warmup_s=0.5)), warmup=3, steps=30, device=device)
    parts = sum(t.phases[p].median_ms for p in ("forward", "backward", "optimizer_step"))
    assert parts == pytest.approx(t.phases[STEP].median_ms, rel=0.05)  # the step adds only its two synchronisations
    for p in ("forward", "backward", "optimizer_step"):
        assert t.phases[p].ci_high_ms - t.phases[p].ci_low_ms < 0.06 * t.phases[p].median_ms


@pytest.mark.gpu
def test_an_eager_cell_on_a_gpu_reports_gpu_time_and_paired_ratios():
    from cs336sys.studies.e2e.measure import measure

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    kwargs = cell_kwargs(
        "e2e",
        size="small",
        context_length=128,
        precision="fp32",
        impl="sdpa",
        batch_size=2,
        partners=[{"cuda_graphs": True}, {"precision": "bf16"}],
    )
    rows = list(measure(torch.device("cuda"), {}, Session(Policy(target_rel=0.05, max_measure_s=4)), **kwargs))
    df = pd.DataFrame(rows)
    timed = df[df["kind"].isna()]
    assert timed["gpu_median_ms"].notna().all()
    # how tight the intervals come out is the host's doing: the committed runs measure it, a test only
    # checks that each interval holds its median
    assert ((timed["gpu_ci_low_ms"] <= timed["gpu_median_ms"]) & (timed["gpu_median_ms"] <= timed["gpu_ci_high_ms"])).all()
    assert (timed["gpu_median_ms"] < timed["median_ms"]).all()  # the eager step adds launches, never removes work
    pairs = df[df["kind"] == "pair"]
    assert set(pairs["pair_with"]) == {"cuda_graphs=1", "precision=bf16"}
    assert ((pairs["ratio_ci_low"] > 0) & (pairs["ratio_ci_low"] <= pairs["ratio"]) & (pairs["ratio"] <= pairs["ratio_ci_high"])).all()
    assert np.isfinite(pairs["ratio_ci_high"]).all()


def test_backward_over_forward_pairs_the_phases_of_each_step():
    from cs336sys.studies.e2e.report import backward_forward_ratio

    rng = np.random.default_rng(0)
    drift = np.exp(rng.normal(0, 0.4, 60))  # the host: each step 0.5x to 2x as slow
    fwd, bwd = 10 * drift, 20 * drift * np.exp(rng.normal(0, 0.01, 60))
    axes = {"size": "small", "context_length": 128, "precision": "fp32", "impl": "eager", "compile": 0, "cuda_graphs": 0}

    def row(phase, samples):
        return {
            "study": "e2e",
            "cell_id": "c",
            "status": "ok",
            "error": "",
            **axes,
            "mode": "train",
            "phase": phase,
            "median_ms": float(np.median(samples)),
            "ci_low_ms": float(np.min(samples)),
            "ci_high_ms": float(np.max(samples)),
            "samples_ms": ";".join(f"{x:.4f}" for x in samples),
        }

    out = backward_forward_ratio(pd.DataFrame([row("forward", fwd), row("backward", bwd)])).iloc[0]
    assert out["ratio_low"] < 2.0 < out["ratio_high"] and out["ratio_high"] / out["ratio_low"] < 1.02
    assert bool(out["significant"])
    unpaired = backward_forward_ratio(pd.DataFrame([row("forward", fwd), row("backward", bwd)]).drop(columns="samples_ms")).iloc[0]
    assert unpaired["ratio_high"] / unpaired["ratio_low"] > 10  # interval arithmetic on the drifting rows
