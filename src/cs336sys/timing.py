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
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from cs336sys.annotate import annotate

STEP = "step"  # the name under which the whole step's wall time is reported


@dataclass
class Stats:
    mean_ms: float
    std_ms: float
    median_ms: float
    min_ms: float
    max_ms: float
    n: int
    samples_ms: list[float] = field(repr=False)

    def as_row(self) -> dict[str, object]:
        return {
            "mean_ms": self.mean_ms,
            "std_ms": self.std_ms,
            "median_ms": self.median_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "n": self.n,
            "samples_ms": ";".join(f"{s:.4f}" for s in self.samples_ms),
        }


def summarize(samples_ms: list[float]) -> Stats:
    """Mean, sample std (0 for one sample), median, min, max and n of a list of milliseconds."""
    if not samples_ms:
        raise ValueError("no samples to summarize")
    std = statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0
    return Stats(
        mean_ms=statistics.fmean(samples_ms),
        std_ms=std,
        median_ms=statistics.median(samples_ms),
        min_ms=min(samples_ms),
        max_ms=max(samples_ms),
        n=len(samples_ms),
        samples_ms=list(samples_ms),
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
    warmup_s: float  # wall time of the untimed warm-up steps (compilation and autotuning land here)


def time_steps(
    step: Callable[[StepClock], None],
    *,
    warmup: int,
    steps: int,
    device: torch.device,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[torch.device], None] = synchronize,
) -> Timing:
    """Run ``warmup`` untimed steps, then time ``steps`` steps; statistics per phase and per step."""
    if steps < 1:
        raise ValueError("steps must be at least 1")
    t0 = clock()
    for _ in range(warmup):
        step(StepClock(device, clock))
    sync(device)
    warmup_s = clock() - t0

    samples: dict[str, list[float]] = defaultdict(list)
    for _ in range(steps):
        step_clock = StepClock(device, clock)
        sync(device)
        start = clock()
        step(step_clock)
        sync(device)
        samples[STEP].append((clock() - start) * 1e3)
        for name, ms in step_clock.phase_ms().items():
            samples[name].append(ms)
    return Timing(phases={name: summarize(v) for name, v in samples.items()}, warmup_s=warmup_s)


def bench_median_ms(fn: Callable[[], object], device: torch.device, *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn`` in ms, by ``triton.testing.do_bench`` on CUDA (L2 flushed between calls).

    On CPU (tests, demo) a plain loop of the same duration stands in.
    """
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()  # warm-up
    times = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while not times or (time.perf_counter() < deadline and len(times) < 100):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
