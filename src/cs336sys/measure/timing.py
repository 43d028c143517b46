"""The one timing harness used by every study.

A *step* is a callable that receives a :class:`StepClock` and wraps its phases
(forward, backward, optimizer…) in ``clock.phase(name)``. :func:`time_steps`
runs warm-up steps untimed, then times each measured step by the wall clock
with a CUDA synchronisation on both sides, and each phase inside it with CUDA
events (on CPU, with the same wall clock). Events are read only after the
step's closing synchronisation, so nothing inside a timed region waits on the
GPU except what the measurement needs.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from cs336sys.columns import sample_stats
from cs336sys.measure import energy
from cs336sys.measure.session import Policy, Session
from cs336sys.measure.stats import summarize_trials
from cs336sys.models.annotate import annotate

STEP = "step"  # the name under which the whole step's wall time is reported
MAX_STORED_SAMPLES, MAX_TRIALS = 500, 200


@dataclass
class Stats:
    """One phase's step times over every trial, with the 95% interval of their median (measure.stats)."""

    mean_ms: float
    std_ms: float
    median_ms: float
    min_ms: float
    max_ms: float
    n: int
    ci_low_ms: float
    ci_high_ms: float
    trial_medians_ms: list[float]
    samples_ms: list[float] = field(repr=False)
    energy: dict[str, object] = field(default_factory=dict, repr=False)  # energy columns, where the row's source sets them

    def as_row(self) -> dict[str, object]:
        return {
            "median_ms": self.median_ms,
            "ci_low_ms": self.ci_low_ms,
            "ci_high_ms": self.ci_high_ms,
            "mean_ms": self.mean_ms,
            "std_ms": self.std_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "n": self.n,
            "trials": len(self.trial_medians_ms),
            "trial_medians_ms": ";".join(f"{m:.4f}" for m in self.trial_medians_ms),
            # do_bench gives thousands of calls: keep the samples where a CSV in git can hold them
            "samples_ms": ";".join(f"{s:.4f}" for s in self.samples_ms) if self.n <= MAX_STORED_SAMPLES else "",
            **sample_stats(self.samples_ms),  # the statistics cs336sys.columns declares with a `stat`
            **self.energy,
        }


def summarize(trial_samples_ms: Sequence[Sequence[float]] | Sequence[float]) -> Stats:
    """Statistics of step times given per trial (a list of lists) or as one trial (a flat list)."""
    trials = (
        [list(t) for t in trial_samples_ms]
        if trial_samples_ms and isinstance(trial_samples_ms[0], (list, tuple))
        else [list(trial_samples_ms)]
    )
    trials = [t for t in trials if t]
    if not trials:
        raise ValueError("no samples to summarize")
    pooled = [s for t in trials for s in t]
    interval = summarize_trials(trials)
    return Stats(
        mean_ms=statistics.fmean(pooled),
        std_ms=statistics.stdev(pooled) if len(pooled) > 1 else 0.0,
        median_ms=interval.median,
        min_ms=min(pooled),
        max_ms=max(pooled),
        n=len(pooled),
        ci_low_ms=max(interval.low, 0.0),  # a time is not negative: a very noisy cell's t-interval can reach below 0
        ci_high_ms=interval.high,
        trial_medians_ms=[statistics.median(t) for t in trials],
        samples_ms=pooled,
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """Marks named phases inside one step: CUDA events on a GPU, the wall clock on CPU."""

    def __init__(self, device: torch.device, clock: Callable[[], float] = time.perf_counter):
        self._cuda = device.type == "cuda"
        self._clock = clock
        self._events: list[tuple[str, object, object]] = []
        self._cpu_ms: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with annotate(name):  # the profile study's phase ranges; free otherwise
            yield from self._timed(name)

    def _timed(self, name: str) -> Iterator[None]:
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = self._clock()
            yield
            self._cpu_ms[name] += (self._clock() - t0) * 1e3

    def phase_ms(self) -> dict[str, float]:
        """Milliseconds per phase of this step (call after the step's synchronisation)."""
        out = dict(self._cpu_ms)
        for name, start, end in self._events:
            out[name] = out.get(name, 0.0) + start.elapsed_time(end)
        return out


@dataclass
class Timing:
    phases: dict[str, Stats]  # includes STEP, the wall time of whole steps
    warmup_s: float  # wall time of all warm-up (compilation and autotuning land in the first trial's)
    timed_s: float = 0.0  # wall time of the timed blocks
    warmup_steps_run: int = 0  # warm-up steps actually run, time-based ones included
    first_step_s: float | None = None  # the first warm-up step: compilation, autotuning, allocator growth
    state: dict[str, object] = field(default_factory=dict)  # GPU/host state at the start and end of timing
    stop_reason: str = "fixed"  # fixed (the configured trials), target (interval met target_rel), budget (max_measure_s spent)
    blocks: list[dict[str, list[float]]] = field(default_factory=list, repr=False)  # each timed block's step times per phase


def merge_timings(first: Timing, later: Timing) -> Timing:
    """One Timing from two runs of timed blocks of the same step in one process (e.g. alone, then interleaved)."""
    blocks = first.blocks + later.blocks
    phases = {p: summarize([b[p] for b in blocks if p in b]) for p in first.phases if all(p in b for b in blocks)}
    return Timing(
        phases=phases,
        warmup_s=first.warmup_s + later.warmup_s,
        timed_s=first.timed_s + later.timed_s,
        warmup_steps_run=first.warmup_steps_run + later.warmup_steps_run,
        first_step_s=first.first_step_s,
        state={**first.state, **{k: v for k, v in later.state.items() if k.startswith("end_")}},
        stop_reason=later.stop_reason,
        blocks=blocks,
    )


class Block(defaultdict):
    """One timed block's step times per phase (ms), and the GPU's energy over its steps (None: not metered)."""

    energy: energy.Reading | None = None


def timed_block(
    step: Callable[[StepClock], None],
    steps: int,
    min_measure_s: float,
    device: torch.device,
    clock: Callable[[], float],
    sync: Callable[[torch.device], None],
    meter: energy.Meter | None = None,
) -> Block:
    """One timed block: ``steps`` steps (and more until ``min_measure_s``), each between two synchronisations;
    ``meter`` samples its energy from a thread of its own, never from this loop (none: interleaved blocks)."""
    block, meter = Block(list), meter or energy.Meter(energy.NOT_METERED)
    started = clock()
    meter.begin()
    while len(block[STEP]) < steps or clock() - started < min_measure_s:
        step_clock = StepClock(device, clock)
        sync(device)
        start = clock()
        step(step_clock)
        sync(device)
        block[STEP].append((clock() - start) * 1e3)
        for name, ms in step_clock.phase_ms().items():
            block[name].append(ms)
    block.energy = meter.end(block[STEP])  # the block's power over its steps' own time (measure.energy)
    return block


def warm_up(step, warmup: int, min_warmup_s: float, device, clock, sync, ready=None) -> tuple[int, float | None]:
    """Run ``warmup`` steps, then more until ``min_warmup_s`` passed or ``ready()`` (the GPU at its clocks);
    (steps run, first step's seconds)."""
    t0, run, first = clock(), 0, None
    while run < warmup or (clock() - t0 < min_warmup_s and not (ready is not None and ready())):
        step(StepClock(device, clock))
        sync(device)
        run += 1
        first = clock() - t0 if run == 1 else first
    return run, first


def time_steps(
    step: Callable[[StepClock], None],
    session: Session,
    *,
    warmup: int,
    steps: int,
    device: torch.device,
    policy: Policy | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[torch.device], None] = synchronize,
) -> Timing:
    """Time ``step`` in ``policy.trials`` trials (``policy``: the session's unless given): one warm-up, then a
    timed block per trial, back to back.

    The warm-up runs ``warmup`` steps, and more until ``min_warmup_s``
    has passed (an idle GPU needs time, not steps, to reach its clocks; not after
    GPU work of the session less than ``session.WARM_GAP_S`` ago, and no longer
    once ``session.at_clocks()``); a timed
    block runs ``steps`` steps and then more until ``min_measure_s`` has passed. A block
    follows the previous one's steps: a warm-up before each would find the GPU, the caches
    and the allocator as the last block left them, and cost its steps again (the eager attention
    cell at 32768 tokens spent 2.8 s of its 14.2 s in warm-ups on the H200).
    Each step is timed by the wall clock between two synchronisations, each
    phase inside it by CUDA events. ``session.state()`` is sampled before the first and
    after the last timed block (``start_``/``end_`` columns): clocks, temperature.
    With ``target_rel`` > 0, trials continue past ``trials`` (at least two in all)
    while the whole step's interval is wider than ±target_rel of its median, until
    this pass's share of ``max_measure_s`` is spent (``Policy.pass_budget_s``; ``Timing.stop_reason`` says
    which): a drifting host gets the samples its interval needs, a steady one stops early.
    """
    session.check_not_profiled()
    policy = policy or session.policy
    if steps < 1 or policy.trials < 1:
        raise ValueError("steps and trials must be at least 1")
    called = time.perf_counter()
    min_warmup_s, state = session.min_warmup_s(policy), session.state
    samples: list[dict[str, list[float]]] = []
    warmup_s, timed_s, warmup_run, recorded, first_step_s = 0.0, 0.0, 0, {}, None
    meter = session.meter(device.type)  # its sampler thread runs during each timed block (measure.energy)
    stop = "fixed"
    while True:
        if not samples:
            t0 = clock()
            warmup_run, first_step_s = warm_up(step, warmup, min_warmup_s, device, clock, sync, session.at_clocks)
            warmup_s = clock() - t0
            if state is not None:
                recorded.update({f"start_{k}": v for k, v in state().items()})
        started = clock()
        samples.append(timed_block(step, steps, policy.min_measure_s, device, clock, sync, meter))
        timed_s += clock() - started
        if len(samples) < policy.trials:
            continue
        if policy.target_rel <= 0:
            break
        if len(samples) >= 2:
            iv = summarize_trials([t[STEP] for t in samples])
            if iv.half_width_rel <= policy.target_rel:
                stop = "target"
                break
        if timed_s >= policy.pass_budget_s or len(samples) >= MAX_TRIALS:
            stop = "budget"
            break
    session.mark_gpu_busy()
    if state is not None:
        recorded.update({f"end_{k}": v for k, v in state().items()})
    phases = {name: summarize([trial[name] for trial in samples]) for name in samples[0]}
    timing = Timing(
        phases=phases,
        warmup_s=warmup_s,
        timed_s=timed_s,
        warmup_steps_run=warmup_run,
        first_step_s=first_step_s,
        state=recorded,
        stop_reason=stop,
        blocks=samples,
    )
    session.add_steps(timing.warmup_s, time.perf_counter() - called)
    return timing


def bench_stats(
    fn: Callable[[], object],
    device: torch.device,
    session: Session,
    *,
    rep_ms: float = 100,
    grad_to_none: Sequence[torch.Tensor] | None = None,
) -> Stats:
    """Times of ``fn`` over the session's ``trials`` runs of ``triton.testing.do_bench`` (L2 flushed between calls).

    Every call's time is kept (``return_mode="all"``), so n, the spread and the
    interval are real; ``grad_to_none`` clears gradients between calls so a
    backward does not time their accumulation. On CPU (tests, demo) a plain
    loop of the same duration stands in.
    """
    with session.part("timed"):
        per_trial = [_bench(fn, device, rep_ms, grad_to_none) for _ in range(session.policy.trials)]
    stats = summarize(per_trial)
    stats.energy = energy.empty(energy.DO_BENCH)
    return stats


def _bench(fn: Callable[[], object], device: torch.device, rep_ms: float, grad_to_none) -> list[float]:
    """One trial of :func:`bench_stats`: every call's milliseconds."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return [float(t) for t in do_bench(fn, warmup=25, rep=rep_ms, grad_to_none=grad_to_none, return_mode="all")]
    fn()  # warm-up
    times: list[float] = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while not times or (time.perf_counter() < deadline and len(times) < 100):
        for t in grad_to_none or ():
            t.grad = None
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def timing_rows(timing: Timing, flops: Mapping[str, float | None], extra: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """One row per timed phase: its statistics, energy (the whole step's row: it covers every phase), FLOPs, warm-up, state, ``extra``."""
    step_energy = energy.energy_stats([getattr(b, "energy", None) for b in timing.blocks])
    for phase, stats in timing.phases.items():
        joules = step_energy if phase == STEP else energy.empty(energy.STEP_ONLY)
        yield {
            "phase": phase,
            **stats.as_row(),
            **joules,
            "flops": flops.get(phase),
            "warmup_s": timing.warmup_s,
            "timed_s": timing.timed_s,
            "warmup_steps_run": timing.warmup_steps_run,
            "first_step_s": timing.first_step_s,
            "stop_reason": timing.stop_reason,
            **timing.state,
            **extra,
        }
