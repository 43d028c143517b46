"""GPU-only behaviour of the runner and the harness: memory cap, CUDA graphs, busy share, GPU state, lock.

Run on the GPU machine with `python -m pytest -m gpu`; their CPU counterparts are in
test_cells.py, test_harness.py, test_stats.py and test_gpulock.py.
"""

import pandas as pd
import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys.measure import gpu_state
from cs336sys.measure.busy import gpu_busy_share
from cs336sys.measure.session import Policy, Session
from cs336sys.measure.timing import StepClock, bench_stats
from cs336sys.pipeline.cells import Cell, run_cell

TINY = {"tiny": {"d_model": 64, "d_ff": 256, "num_layers": 2, "num_heads": 4}}


def _attention_cell(memory_fraction):
    kwargs = cell_kwargs(
        "attention",
        d_model=64,
        seq_len=8192,
        activation="softmax",
        impl="eager",
        causal=True,
        precision="fp32",
        batch_size=8,
        warmup_steps=1,
        measure_steps=2,
    )
    return Cell(
        "attention",
        "cap",
        {"seq_len": 8192},
        "cs336sys.studies.attention.measure:measure",
        kwargs,
        device="cuda",
        timeout_s=300,
        memory_fraction=memory_fraction,
    )


@pytest.mark.gpu
def test_memory_cap_turns_a_cell_that_fits_into_oom():
    # eager softmax at L=8192, batch 8, fp32 keeps 2 GiB score matrices: ok uncapped, oom under 1% of the card
    uncapped = pd.DataFrame(run_cell(_attention_cell(None)))
    assert set(uncapped["status"]) == {"ok"}, uncapped["error"].tolist()
    peak = uncapped["peak_mem_bytes"].max()
    fraction = 0.5 * peak / torch.cuda.get_device_properties(0).total_memory
    capped = pd.DataFrame(run_cell(_attention_cell(fraction)))
    assert set(capped["status"]) == {"oom"}, capped[["status", "error"]].to_dict("records")


@pytest.mark.gpu
def test_cuda_graph_cell_replays_one_graph_per_phase():
    kwargs = cell_kwargs(
        "e2e",
        size="tiny",
        context_length=128,
        precision="bf16",
        impl="sdpa",
        compile=False,
        cuda_graphs=True,
        warmup_steps=2,
        measure_steps=5,
        batch_size=4,
        vocab_size=1000,
        extra_sizes=TINY,
    )
    cell = Cell("e2e", "graphs", {}, "cs336sys.studies.e2e.measure:measure", kwargs, device="cuda", timeout_s=300, policy=Policy(trials=2))
    rows = pd.DataFrame(run_cell(cell))
    assert set(rows["status"]) == {"ok"}, rows["error"].tolist()
    phases = rows.groupby("mode")["phase"].agg(set).to_dict()
    assert phases == {"inference": {"step", "forward"}, "train": {"step", "forward", "backward", "optimizer_step"}}
    train = rows[rows["mode"] == "train"].set_index("phase")["median_ms"]
    # one graph per phase, replayed back to back: the phases add up to the step (its two syncs aside)
    assert train[["forward", "backward", "optimizer_step"]].sum() == pytest.approx(train["step"], rel=0.25)
    assert set(rows["optimizer"].dropna()) == {"course-captured"}
    assert (rows["ci_low_ms"] <= rows["median_ms"]).all() and (rows["median_ms"] <= rows["ci_high_ms"]).all()
    assert rows["gpu_busy_frac"].between(0, 1).all()
    assert rows["gpu_uuid"].str.startswith("GPU-").all()  # the leased GPU, from the lock


@pytest.mark.gpu
def test_busy_share_separates_a_gpu_bound_step_from_a_launch_bound_one():
    device = torch.device("cuda")
    big = torch.randn(4096, 4096, device=device)
    small = torch.randn(8, 8, device=device)

    def gpu_bound(clock: StepClock) -> None:
        for _ in range(4):
            big @ big

    def launch_bound(clock: StepClock) -> None:
        for _ in range(200):
            small.add_(1)

    session = Session()
    assert gpu_busy_share(gpu_bound, device, session) > 0.9
    assert gpu_busy_share(launch_bound, device, session) < gpu_busy_share(gpu_bound, device, session)


@pytest.mark.gpu
def test_gpu_state_reads_clocks_and_bench_stats_keeps_every_call():
    state = gpu_state.gpu_state(0)
    assert state["gpu_uuid"].startswith("GPU-") and int(state["sm_clock_mhz"]) > 0, state
    x = torch.randn(2048, 2048, device="cuda")
    stats = bench_stats(lambda: x @ x, torch.device("cuda"), Session(Policy(trials=2)), rep_ms=20)
    assert stats.n > 10 and len(stats.trial_medians_ms) == 2
    assert stats.ci_low_ms <= stats.median_ms <= stats.ci_high_ms
