"""A cell profiles only after all its timing: torch.profiler leaves CUPTI attached and slows every later launch.

On the H100 the busy-share profiler, run between the modes of a cell, made the eager steps timed after
it 10-45% slower (9.9 -> 14.4 ms, a launch-bound small model), and only in the first pass (the one that
profiles): the between-pass move that widened every launch-bound interval. Here a stand-in profiler
marks the process as a real one does; any timing after it raises.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys.measure import interleave, profiling, timing
from cs336sys.measure.session import Policy, Session

CPU = torch.device("cpu")
TINY = {"tiny": {"d_model": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2}}
LM = dict(size="tiny", context_length=16, precision="fp32", impl="eager", warmup_steps=1, measure_steps=2, batch_size=1)
LM.update(vocab_size=100, extra_sizes=TINY)
MHA = dict(embed_dim=16, num_heads=2, seq_len=8, variant="exact-eager", kernel="softmax", warmup_steps=1, measure_steps=2)


def session() -> Session:
    return Session(Policy(target_rel=0.2, max_measure_s=0.3))


def _fake_busy(calls: list[str]):
    def gpu_busy_share(step, device, session, steps=3):
        step(timing.StepClock(device))
        calls.append("profiled")
        session.mark_profiled("a stand-in profiler")
        return 0.5

    return gpu_busy_share


def test_timing_after_the_profiler_is_refused_with_the_reason():
    profiled = session()
    profiled.mark_profiled("the busy share (torch.profiler)")
    step = lambda clock: None
    with pytest.raises(RuntimeError, match="after the busy share .*profile last"):
        timing.time_steps(step, profiled, warmup=1, steps=1, device=CPU)
    with pytest.raises(RuntimeError, match="after the busy share"):
        interleave.time_arms({"a": step, "b": step}, profiled, warmup=1, block_steps=1, device=CPU)
    timing.time_steps(step, session(), warmup=1, steps=1, device=CPU)  # another cell's session: not profiled


def test_an_e2e_cell_times_every_mode_and_partner_before_it_profiles(monkeypatch):
    from cs336sys.studies.e2e import measure as e2e

    calls: list[str] = []
    monkeypatch.setattr(e2e, "gpu_busy_share", _fake_busy(calls))
    rows = pd.DataFrame(e2e.measure(CPU, {}, session(), **cell_kwargs("e2e", partners=[{"precision": "bf16"}], **LM)))
    assert calls == ["profiled", "profiled"]  # one per mode, both after every timed block
    timed = rows[rows["kind"].isna()]
    assert set(timed["mode"]) == {"inference", "train"} and (timed["gpu_busy_frac"] == 0.5).all()
    assert set(rows.loc[rows["kind"] == "pair", "mode"]) == {"inference", "train"}


def test_an_mha_cell_times_both_modes_before_it_profiles(monkeypatch):
    from cs336sys.studies.mha import measure as mha

    calls: list[str] = []
    monkeypatch.setattr(mha, "gpu_busy_share", _fake_busy(calls))
    rows = pd.DataFrame(mha.measure(CPU, {}, session(), **cell_kwargs("mha", **MHA)))
    assert calls == ["profiled", "profiled"]
    assert set(rows["mode"]) == {"inference", "train"} and (rows["gpu_busy_frac"] == 0.5).all()


def test_the_profile_study_times_both_modes_before_it_profiles(monkeypatch):
    from cs336sys.studies.profile import measure as prof

    real = profiling.profile_steps

    def profile_steps(step_fn, session, *, steps, device, trace_path):
        out = real(step_fn, session, steps=steps, device=device, trace_path=trace_path)
        session.mark_profiled("a stand-in profiler")  # as on a GPU; a CPU profile does not mark
        return out

    monkeypatch.setattr(profiling, "profile_steps", profile_steps)
    lm = {k: v for k, v in LM.items() if k != "measure_steps"}
    rows = pd.DataFrame(prof.measure(CPU, {}, session(), **cell_kwargs("profile", measure_steps=2, profile_steps=1, **lm)))
    assert set(rows.loc[rows["kind"] == "timing", "mode"]) == {"inference", "train"}
    assert set(rows.loc[rows["kind"] == "kernel", "mode"]) == {"inference", "train"}


def _oom_in_train(real):
    def time_steps(step, session, **kwargs):
        if context_mode[0] == "train":
            raise torch.OutOfMemoryError("CUDA out of memory (test)")
        return real(step, session, **kwargs)

    context_mode = [""]
    return time_steps, context_mode


@pytest.mark.parametrize("study", ["e2e", "mha"])
def test_a_mode_measured_before_another_runs_out_of_memory_keeps_its_rows(monkeypatch, study):
    import importlib

    mod = importlib.import_module(f"cs336sys.studies.{study}.measure")
    fake, mode = _oom_in_train(timing.time_steps)

    class Context(dict):
        def __setitem__(self, key, value):
            if key == "mode":
                mode[0] = value
            super().__setitem__(key, value)

    monkeypatch.setattr(mod, "time_steps", fake)
    monkeypatch.setattr(mod, "gpu_busy_share", _fake_busy([]))
    context = Context()
    kwargs = LM if study == "e2e" else MHA
    rows = []
    with pytest.raises(torch.OutOfMemoryError):
        for row in mod.measure(CPU, context, session(), **cell_kwargs(study, **kwargs)):
            rows.append(row)
    assert context["mode"] == "train"  # the runner's OOM row names the mode that ran out
    assert rows and {r["mode"] for r in rows} == {"inference"}
    assert all(r["gpu_busy_frac"] is None and "train ran out of memory" in r["gpu_busy_note"] for r in rows)
