"""The timing harness (fake clock), statistics, FLOP counts, derived metrics and the measurement generators."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from cell_kwargs import cell_kwargs
from cs336sys.analysis.metrics import add_derived
from cs336sys.analysis.peaks import PEAK_TFLOPS, peak_tflops
from cs336sys.measure import memory
from cs336sys.measure.flops import (
    ATTENTION_BACKWARD_FACTOR,
    BACKWARD_FACTOR,
    attention_core_flops,
    lm_forward_flops,
    mha_forward_flops,
    phase_flops,
)
from cs336sys.measure.session import Policy, Session
from cs336sys.measure.timing import STEP, StepClock, summarize, time_steps
from cs336sys.models.mha import MultiHeadAttention
from cs336sys.models.model import TransformerLM
from cs336sys.models.sizes import ModelSize, parameter_count
from cs336sys.rows import Skip
from cs336sys.studies.attention.measure import measure as measure_attention
from cs336sys.studies.e2e.measure import measure as measure_e2e
from cs336sys.studies.mha.measure import measure as measure_mha

CPU = torch.device("cpu")

# Times are multiples of 1/1024 s, so every difference and every ×1e3 is exact in binary.
TICK_S = 1 / 1024
TICK_MS = 1000 / 1024


class FakeClock:
    """A clock whose time moves only when the test says so: a deterministic sequence of readings."""

    def __init__(self):
        self.ticks = 0
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.ticks * TICK_S

    def advance(self, ticks):
        self.ticks += ticks


# ---------------------------------------------------------------- time_steps with a fake clock

WARMUP_PLAN = [(500, 0, 500), (300, 0, 300)]  # (forward, gap between phases, backward) in ticks
MEASURED_PLAN = [(3, 1, 2), (5, 1, 4), (2, 2, 1), (7, 1, 3)]
SYNC_TICKS = 1  # each synchronisation "waits for the GPU" one tick


def run_fake(warmup=2, steps=4):
    fake = FakeClock()
    plan = iter(WARMUP_PLAN[:warmup] + MEASURED_PLAN[:steps])
    synced = []

    def sync(device):
        synced.append(device)
        fake.advance(SYNC_TICKS)

    def step(clock: StepClock):
        fwd, gap, bwd = next(plan)
        with clock.phase("forward"):
            fake.advance(fwd)
        fake.advance(gap)  # work outside every phase still counts for the step
        with clock.phase("backward"):
            fake.advance(bwd)

    timing = time_steps(step, Session(), warmup=warmup, steps=steps, device=CPU, clock=fake, sync=sync)
    assert next(plan, None) is None  # exactly warmup + steps steps ran
    return timing, synced


def test_time_steps_statistics_are_exact():
    timing, synced = run_fake()
    assert set(timing.phases) == {"forward", "backward", STEP}

    fwd = timing.phases["forward"]
    assert fwd.samples_ms == [3 * TICK_MS, 5 * TICK_MS, 2 * TICK_MS, 7 * TICK_MS]
    assert fwd.n == 4
    assert fwd.mean_ms == 4.25 * TICK_MS
    assert fwd.median_ms == 4 * TICK_MS
    assert fwd.min_ms == 2 * TICK_MS and fwd.max_ms == 7 * TICK_MS
    assert fwd.std_ms == pytest.approx(math.sqrt((1.25**2 + 0.75**2 + 2.25**2 + 2.75**2) / 3) * TICK_MS, rel=1e-12)

    bwd = timing.phases["backward"]
    assert bwd.samples_ms == [2 * TICK_MS, 4 * TICK_MS, 1 * TICK_MS, 3 * TICK_MS]
    assert bwd.median_ms == 2.5 * TICK_MS and bwd.mean_ms == 2.5 * TICK_MS

    # a step = its phases + the gap + the closing synchronisation (the opening one is outside the timed region)
    step = timing.phases[STEP]
    assert step.samples_ms == [7 * TICK_MS, 11 * TICK_MS, 6 * TICK_MS, 12 * TICK_MS]
    assert (step.mean_ms, step.median_ms, step.min_ms, step.max_ms, step.n) == (9 * TICK_MS, 9 * TICK_MS, 6 * TICK_MS, 12 * TICK_MS, 4)
    assert step.std_ms == pytest.approx(math.sqrt(26 / 3) * TICK_MS, rel=1e-12)
    assert synced and all(d == CPU for d in synced)


def test_warmup_steps_are_not_timed_but_their_wall_time_is_reported():
    timing, _ = run_fake(warmup=2, steps=4)
    for stats in timing.phases.values():
        assert stats.n == 4
        assert stats.max_ms < 100 * TICK_MS  # the 300–500-tick warm-up phases are nowhere
    warm_ticks = sum(f + g + b for f, g, b in WARMUP_PLAN)
    assert warm_ticks * TICK_S <= timing.warmup_s <= (warm_ticks + 2 * len(WARMUP_PLAN) + 1) * TICK_S


def test_zero_warmup_and_single_step():
    timing, _ = run_fake(warmup=0, steps=1)
    assert timing.phases[STEP].samples_ms == [7 * TICK_MS]
    assert timing.phases[STEP].std_ms == 0.0
    assert timing.warmup_s <= SYNC_TICKS * TICK_S


def test_time_steps_needs_at_least_one_step():
    with pytest.raises(ValueError):
        time_steps(lambda clock: None, Session(), warmup=0, steps=0, device=CPU)


def test_phase_entered_twice_in_a_step_is_summed():
    fake = FakeClock()

    def step(clock):
        with clock.phase("forward"):
            fake.advance(2)
        with clock.phase("forward"):
            fake.advance(3)

    timing = time_steps(step, Session(), warmup=0, steps=2, device=CPU, clock=fake, sync=lambda d: None)
    assert timing.phases["forward"].samples_ms == [5 * TICK_MS, 5 * TICK_MS]


def test_time_steps_with_real_clock_nests_phases_inside_steps():
    def step(clock):
        with clock.phase("forward"):
            sum(range(20000))
        with clock.phase("backward"):
            sum(range(20000))

    timing = time_steps(step, Session(), warmup=1, steps=5, device=CPU)
    for s, f, b in zip(timing.phases[STEP].samples_ms, timing.phases["forward"].samples_ms, timing.phases["backward"].samples_ms):
        assert 0 < f and 0 < b and f + b <= s


# ---------------------------------------------------------------- summarize


def test_summarize_known_samples():
    s = summarize([4.0, 1.0, 10.0, 3.0, 2.0])
    assert (s.mean_ms, s.median_ms, s.min_ms, s.max_ms, s.n) == (4.0, 3.0, 1.0, 10.0, 5)
    assert s.std_ms == pytest.approx(math.sqrt(12.5), rel=1e-12)  # sample std (n − 1)
    assert s.samples_ms == [4.0, 1.0, 10.0, 3.0, 2.0]  # in measured order
    even = summarize([1.0, 2.0, 4.0, 8.0])
    assert even.median_ms == 3.0
    one = summarize([2.5])
    assert (one.mean_ms, one.std_ms, one.median_ms, one.n) == (2.5, 0.0, 2.5, 1)
    with pytest.raises(ValueError):
        summarize([])


def test_stats_row_carries_every_statistic_and_the_samples():
    row = summarize([1.0, 2.5]).as_row()
    assert row["mean_ms"] == 1.75 and row["median_ms"] == 1.75 and row["n"] == 2
    assert row["min_ms"] == 1.0 and row["max_ms"] == 2.5
    assert row["std_ms"] == pytest.approx(math.sqrt(1.125))
    assert [float(x) for x in row["samples_ms"].split(";")] == [1.0, 2.5]


# ---------------------------------------------------------------- FLOPs


def test_lm_forward_flops_hand_count():
    B, T, d, h, f, layers, V = 2, 8, 16, 2, 32, 3, 50
    qkvo = 4 * 2 * B * T * d * d  # 32 768
    attention = 2 * 2 * B * T * T * d / 2  # QKᵀ and PV, causal at half: 4 096
    swiglu = 3 * 2 * B * T * d * f  # 49 152
    lm_head = 2 * B * T * d * V  # 25 600
    hand = layers * (qkvo + attention + swiglu) + lm_head
    assert hand == 283_648
    assert lm_forward_flops(ModelSize(d, f, layers, h), B, T, V) == hand


def test_lm_forward_flops_agrees_with_torch_flop_counter():
    size, B, T, V = ModelSize(16, 32, 3, 2), 2, 8, 50
    torch.manual_seed(0)
    model = TransformerLM.from_size(size, V, T, attention="eager")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(V, (B, T)))
    # the counter sees eager attention's full L×L matmuls; our convention credits causal at half
    masked_half = attention_core_flops(B, size.num_heads, T, size.d_model // size.num_heads, causal=False) / 2
    assert counter.get_total_flops() == lm_forward_flops(size, B, T, V) + size.num_layers * masked_half


def test_attention_core_flops():
    assert attention_core_flops(8, 1, 256, 64, causal=False) == 2 * 2 * 8 * 256 * 256 * 64
    assert attention_core_flops(8, 1, 256, 64, causal=True) == 2 * 8 * 256 * 256 * 64


@pytest.mark.parametrize(
    "variant,kernel,m",
    [("exact-eager", "softmax", None), ("exact-sdpa", "softmax", None), ("performer", "softmax", 8), ("performer", "relu", 8)],
)
def test_mha_forward_flops_hand_count_and_flop_counter(variant, kernel, m):
    B, L, E, h = 2, 10, 16, 4
    projections = 4 * 2 * B * L * E * E
    if variant.startswith("exact"):
        hand = projections + 2 * 2 * B * L * L * E
    else:
        hand = projections + 2 * (2 * B * L * E * m) + 2 * (2 * B * L * m * E) + 2 * B * h * L * m
    assert mha_forward_flops(B, L, E, h, variant, m) == hand
    if variant != "exact-sdpa":  # the counter does not see inside SDPA on CPU
        torch.manual_seed(0)
        layer = MultiHeadAttention(E, h, variant, kernel, num_features=m)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            layer(torch.randn(B, L, E))
        assert counter.get_total_flops() == hand


def test_phase_flops_credit_each_timed_phase_from_one_forward():
    assert phase_flops(10.0, "inference") == {"forward": 10.0, STEP: 10.0}
    train = phase_flops(10.0, "train")
    assert train["forward"] == 10.0 and train["backward"] == BACKWARD_FACTOR * 10.0
    assert train[STEP] == train["forward_backward"] == (1 + BACKWARD_FACTOR) * 10.0
    assert train["optimizer_step"] is None  # no matmul FLOPs: no TFLOP/s for the optimizer


def test_mha_flops_unknown_variant():
    with pytest.raises(ValueError):
        mha_forward_flops(1, 4, 8, 2, "linformer", None)


# ---------------------------------------------------------------- derived metrics


def _frame(**cols):
    return pd.DataFrame(cols)


def test_tflops_and_tokens_per_second_use_the_median():
    df = _frame(
        median_ms=[2.0, 4.0],
        mean_ms=[100.0, 100.0],
        flops=[1e12, 3e12],
        tokens=[1000, 1000],
        device_name=["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"],
        precision=["bf16", "fp32"],
    )
    out = add_derived(df)
    np.testing.assert_allclose(out["tflops"], [500.0, 750.0])
    np.testing.assert_allclose(out["tokens_per_s"], [500_000.0, 250_000.0])
    np.testing.assert_allclose(out["mfu_pct"], [100 * 500 / 989.4, 100 * 750 / 66.9])
    assert list(out["mfu_note"]) == ["", ""]
    assert "tflops" not in df  # the input is not modified


def test_mfu_uses_the_most_specific_h100_entry():
    df = _frame(
        median_ms=[1.0] * 3, flops=[1e12] * 3, precision=["bf16"] * 3, device_name=["NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200"]
    )
    out = add_derived(df)
    np.testing.assert_allclose(out["mfu_pct"], [100 * 1000 / 756.0, 100 * 1000 / 835.0, 100 * 1000 / 989.4])
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0


def test_unknown_device_gets_empty_mfu_with_a_note():
    df = _frame(median_ms=[1.0], flops=[1e9], precision=["fp32"], device_name=["cpu (x86_64)"])
    out = add_derived(df)
    assert out["tflops"].iloc[0] == pytest.approx(1.0)  # 1e9 FLOP in 1 ms
    assert math.isnan(out["mfu_pct"].iloc[0])
    note = out["mfu_note"].iloc[0]
    assert "cpu (x86_64)" in note and "fp32" in note
    # a known device but an unknown precision is empty too, never a guess
    out = add_derived(_frame(median_ms=[1.0], flops=[1e9], precision=["fp8"], device_name=["NVIDIA H100 80GB HBM3"]))
    assert math.isnan(out["mfu_pct"].iloc[0]) and out["mfu_note"].iloc[0]


def test_config_overrides_extend_and_replace_the_peak_table():
    df = _frame(median_ms=[1.0, 1.0], flops=[2e12, 2e12], precision=["fp32", "bf16"], device_name=["cpu (x86_64)", "NVIDIA H100 80GB HBM3"])
    overrides = {"cpu": {"fp32": 4.0}, "H100": {"bf16": 500.0}}
    out = add_derived(df, overrides)
    np.testing.assert_allclose(out["mfu_pct"], [100 * 2000 / 4.0, 100 * 2000 / 500.0])
    assert list(out["mfu_note"]) == ["", ""]
    assert PEAK_TFLOPS["H100"]["bf16"] == 989.4  # the built-in table is not edited


def test_failure_rows_without_measurements_get_empty_metrics():
    df = pd.DataFrame(
        [
            {"status": "ok", "median_ms": 2.0, "flops": 4e12, "tokens": 10, "precision": "bf16", "device_name": "NVIDIA H100 80GB HBM3"},
            {
                "status": "oom",
                "median_ms": None,
                "flops": None,
                "tokens": None,
                "precision": "bf16",
                "device_name": "NVIDIA H100 80GB HBM3",
            },
        ]
    )
    out = add_derived(df)
    assert out["tflops"].iloc[0] == pytest.approx(2000.0)
    assert math.isnan(out["tflops"].iloc[1]) and math.isnan(out["mfu_pct"].iloc[1]) and math.isnan(out["tokens_per_s"].iloc[1])
    assert add_derived(pd.DataFrame()).empty


# ---------------------------------------------------------------- the measurement generators, in-process on CPU


def test_measure_attention_rows():
    ctx = {}
    rows = list(
        measure_attention(
            CPU,
            ctx,
            Session(),
            **cell_kwargs(
                "attention",
                d_model=8,
                seq_len=16,
                activation="relu",
                impl="eager",
                causal=True,
                precision="fp32",
                batch_size=2,
                warmup_steps=1,
                measure_steps=3,
            ),
        )
    )
    assert ctx["mode"] == "train"
    by_phase = {r["phase"]: r for r in rows}
    assert set(by_phase) == {"forward", "backward", STEP}
    fwd = attention_core_flops(2, 1, 16, 8, causal=True)
    assert by_phase["forward"]["flops"] == fwd
    assert by_phase["backward"]["flops"] == ATTENTION_BACKWARD_FACTOR * fwd  # an attention core: the literature's 2.5×
    assert by_phase[STEP]["flops"] == (1 + ATTENTION_BACKWARD_FACTOR) * fwd
    for r in rows:
        assert r["n"] == 3 and r["median_ms"] > 0
        assert r["peak_mem_bytes"] is None and r["memory_note"] == memory.NO_CUDA_REASON
        assert r["score_matrix_bytes"] == 2 * 16 * 16 * 4


def test_measure_attention_rejects_invalid_and_skips_cuda_only_impls(monkeypatch):
    with pytest.raises(ValueError):
        next(
            measure_attention(
                CPU,
                {},
                Session(),
                **cell_kwargs("attention", d_model=8, seq_len=8, activation="relu", impl="sdpa", causal=False, precision="fp32"),
            )
        )
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(Skip):
        next(
            measure_attention(
                CPU,
                {},
                Session(),
                **cell_kwargs("attention", d_model=8, seq_len=8, activation="softmax", impl="triton", causal=False, precision="fp32"),
            )
        )


def test_measure_mha_rows():
    ctx = {}
    rows = list(
        measure_mha(
            CPU,
            ctx,
            Session(),
            **cell_kwargs(
                "mha",
                embed_dim=16,
                num_heads=4,
                seq_len=12,
                variant="performer",
                kernel="relu",
                num_features=8,
                warmup_steps=1,
                measure_steps=2,
            ),
        )
    )
    assert {(r["mode"], r["phase"]) for r in rows} == {
        ("inference", "forward"),
        ("inference", STEP),
        ("train", "forward"),
        ("train", "backward"),
        ("train", STEP),
    }
    fwd = mha_forward_flops(1, 12, 16, 4, "performer", 8)
    for r in rows:
        assert r["n"] == 2
        expected = {
            "forward": fwd,
            "backward": BACKWARD_FACTOR * fwd,
            STEP: fwd if r["mode"] == "inference" else (1 + BACKWARD_FACTOR) * fwd,
        }
        assert r["flops"] == expected[r["phase"]]
    assert ctx["mode"] == "train"


TINY_EXTRA = {"tiny": {"d_model": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2}}


def test_measure_e2e_rows():
    ctx = {}
    rows = list(
        measure_e2e(
            CPU,
            ctx,
            Session(),
            **cell_kwargs(
                "e2e",
                size="tiny",
                context_length=8,
                precision="fp32",
                batch_size=2,
                vocab_size=100,
                warmup_steps=1,
                measure_steps=2,
                extra_sizes=TINY_EXTRA,
            ),
        )
    )
    phases = [(r["mode"], r["phase"]) for r in rows]
    assert len(phases) == len(set(phases)) == 6
    optimizer = [p for m, p in phases if m == "train" and p not in ("forward", "backward", STEP)]
    assert len(optimizer) == 1 and optimizer[0].startswith("optimizer")  # the optimizer step's phase
    optimizer = optimizer[0]
    assert set(phases) == {
        ("inference", "forward"),
        ("inference", STEP),
        ("train", "forward"),
        ("train", "backward"),
        ("train", optimizer),
        ("train", STEP),
    }
    spec = ModelSize(32, 64, 1, 2)
    fwd = lm_forward_flops(spec, 2, 8, 100)
    for r in rows:
        assert r["params"] == parameter_count(spec, 100)
        assert r["tokens"] == 16 and r["batch_size"] == 2 and r["n"] == 2
        assert r["peak_mem_bytes"] is None and r["memory_note"] == memory.NO_CUDA_REASON
    flops = {(r["mode"], r["phase"]): r["flops"] for r in rows}
    assert flops[("inference", "forward")] == fwd and flops[("train", "backward")] == BACKWARD_FACTOR * fwd
    assert flops[("train", optimizer)] is None and flops[("train", STEP)] == (1 + BACKWARD_FACTOR) * fwd
    assert ctx["mode"] == "train"


def test_measure_e2e_bf16_forward_only_and_bad_arguments():
    rows = list(
        measure_e2e(
            CPU,
            {},
            Session(),
            **cell_kwargs(
                "e2e",
                size="tiny",
                context_length=8,
                precision="bf16",
                batch_size=1,
                vocab_size=100,
                warmup_steps=0,
                measure_steps=1,
                modes=("inference",),
                extra_sizes=TINY_EXTRA,
            ),
        )
    )
    assert {r["mode"] for r in rows} == {"inference"}
    with pytest.raises(ValueError, match="tiny"):  # not a known size without extra_sizes
        next(measure_e2e(CPU, {}, Session(), **cell_kwargs("e2e", size="tiny", context_length=8, precision="fp32")))
    with pytest.raises(ValueError, match="inference"):
        next(
            measure_e2e(
                CPU,
                {},
                Session(),
                **cell_kwargs("e2e", size="tiny", context_length=8, precision="fp32", modes=("bogus",), extra_sizes=TINY_EXTRA),
            )
        )
    with pytest.raises(Skip):
        next(
            measure_e2e(
                CPU,
                {},
                Session(),
                **cell_kwargs("e2e", size="tiny", context_length=8, precision="fp32", impl="triton", extra_sizes=TINY_EXTRA),
            )
        )


def test_git_commit_can_be_named_where_the_tree_has_no_git(monkeypatch):
    from cs336sys.measure import env

    env.git_commit.cache_clear()
    monkeypatch.setenv("CS336SYS_GIT_COMMIT", "abc123def456")
    try:
        assert env.environment(torch.device("cpu"))["git_commit"] == "abc123def456"
    finally:
        env.git_commit.cache_clear()


def test_time_based_warmup_only_for_a_gpu_that_was_idle(monkeypatch):
    # min_warmup_s brings an idle GPU to its clocks; the next mode of a cell follows at once and
    # runs its warm-up steps only, unless WARM_GAP_S passed since this process's last GPU work
    from cs336sys.measure import session as sessions

    now = [1000.0]
    monkeypatch.setattr(sessions.time, "monotonic", lambda: now[0])
    session = Session(Policy(min_warmup_s=50 * TICK_S))
    fake = FakeClock()
    ran = []

    def step(clock):
        ran.append(1)
        fake.advance(10)

    def count():
        ran.clear()
        t = time_steps(step, session, warmup=1, steps=1, device=CPU, clock=fake, sync=lambda d: None)
        return len(ran), t

    first, t = count()
    assert first == 5 + 1 and t.warmup_steps_run == 5  # 5 steps of 10 ticks reach 50 ticks
    assert t.timed_s == pytest.approx(10 * TICK_S)
    assert count()[0] == 1 + 1  # right after: the warm-up steps only
    now[0] += sessions.WARM_GAP_S + 0.1
    assert count()[0] == 5 + 1  # idle for longer: time-based again


def test_a_warm_up_stops_waiting_once_the_gpu_is_at_its_clocks():
    # the time-based warm-up waits for clocks; read at their maximum after the warm-up steps, it waits no more
    readings = iter([False, False, True])
    session = Session(Policy(min_warmup_s=50 * TICK_S), clocks_up=lambda: next(readings))
    fake = FakeClock()
    ran = []

    def step(clock):
        ran.append(1)
        fake.advance(10)

    t = time_steps(step, session, warmup=1, steps=1, device=CPU, clock=fake, sync=lambda d: None)
    assert t.warmup_steps_run == 3  # the warm-up step, then two more while the clocks read low
    assert len(ran) == 3 + 1
    assert Session(Policy(min_warmup_s=50 * TICK_S)).at_clocks() is False  # unknown clocks (a CPU): the time in full


def test_trials_are_timed_blocks_back_to_back_after_one_warm_up():
    ran: list[int] = []
    fake = FakeClock()

    def step(clock):
        ran.append(1)
        fake.advance(10)

    t = time_steps(step, Session(Policy(trials=3)), warmup=4, steps=2, device=CPU, clock=fake, sync=lambda d: None)
    assert t.warmup_steps_run == 4 and len(t.blocks) == 3
    assert len(ran) == 4 + 3 * 2  # a warm-up before every block would have run 8 more steps
