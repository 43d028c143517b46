"""What one cell's measurement knows and learns: its timing policy, and the facts of its process as it measures.

The cell runner (``pipeline.cells``) makes one :class:`Session` per cell in the measuring child and hands
it to the study's ``measure()``, which passes it to every timing function (``measure.timing``,
``measure.interleave``, ``measure.busy``, ``measure.profiling``): no module state steers a measurement,
and two sessions in one process (a test's) share nothing.

Where the time goes: the runner measures a job's start-up (its process, the hand-off, the wait for a
GPU, the child's fork and CUDA context); the measuring code marks its parts with :meth:`Session.part`
(the correctness check, warm-up, timed blocks, paired comparisons, CUDA-graph capture, energy blocks,
profiling), and the rest is ``other``. A part opened inside another counts towards the outer one (a
comparison's blocks are ``pairs``), so the parts never overlap and add up to the job's wall time. No torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from cs336sys.columns import TIME_PARTS
from cs336sys.measure import energy

PARTS = tuple(p for p in TIME_PARTS if p not in ("startup", "other"))  # the runner measures those two
# The time-based warm-up (min_warmup_s) is for a GPU that was idle. A timed block that starts within
# WARM_GAP_S of this session last keeping the GPU busy (the previous mode of the same cell, its profiled
# steps) finds the clocks up and runs its warm-up steps only; and a warm-up ends early once NVML reads
# the SM clock at its maximum (Session.clocks_up): on the H200 every timed block of a default sweep
# started at 1980 of 1980 MHz, after one second of warm-up or none (the warm-up study's cells). A GPU
# that did slow down still shows: every row carries its SM clock at the start of the timed block.
WARM_GAP_S = 2.0


@dataclass(frozen=True)
class Policy:
    """How a study times, from its config section (the schema holds the defaults a cell gets).

    Each trial is a warm-up (``min_warmup_s`` at least, on an idle GPU) and a timed block (``min_measure_s``
    at least). With ``target_rel`` > 0, trials (or pairs of interleaved blocks) continue while the interval's
    half-width exceeds ``target_rel`` of its centre, until ``max_measure_s`` of blocks are spent: by the
    cell's ``passes`` together, each pass its share (the merge pools the passes' samples, so a second pass
    that spent as much as the first doubled the cost of every comparison for a √2 narrower interval).
    """

    trials: int = 1
    min_warmup_s: float = 0.0
    min_measure_s: float = 0.0
    target_rel: float = 0.0
    max_measure_s: float = 0.0
    passes: int = 1

    @property
    def pass_budget_s(self) -> float:
        """The seconds of timed blocks one pass may spend per mode: its share of ``max_measure_s``."""
        return self.max_measure_s / self.passes


@dataclass
class Session:
    """One cell's measurement in its process: the :class:`Policy`, the GPU/host ``state`` sampler (start and
    end of each timed block), whether the busy share is profiled (``busy_share``: the cell's first pass only,
    a profiler pass costing seconds per mode), the energy meter, and what the measurement learns as it goes."""

    policy: Policy = field(default_factory=Policy)
    state: Callable[[], Mapping[str, object]] | None = None
    busy_share: bool = True
    clocks_up: Callable[[], bool] | None = None  # whether the GPU runs at its clocks now (None: unknown, wait the time)
    meter_: energy.Meter | None = None  # None: opened on first use (:meth:`meter`)
    _spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0), init=False, repr=False)
    _open: str | None = field(default=None, init=False, repr=False)
    _gpu_busy_at: float | None = field(default=None, init=False, repr=False)  # time.monotonic() when GPU work last ended
    _profiled_by: str | None = field(default=None, init=False, repr=False)

    def meter(self, device_type: str) -> energy.Meter:
        """The energy meter of this session's device, opened once (NVML stays initialised while it lives)."""
        if self.meter_ is None:
            self.meter_ = energy.open_meter(device_type)
        return self.meter_

    # --- the GPU's recent work -------------------------------------------------------------------
    def mark_gpu_busy(self) -> None:
        """Note that the GPU was working until now (see :data:`WARM_GAP_S`)."""
        self._gpu_busy_at = time.monotonic()

    def min_warmup_s(self, policy: Policy) -> float:
        """The warm-up time the next block needs: ``policy.min_warmup_s``, none after GPU work less than :data:`WARM_GAP_S` ago."""
        recent = self._gpu_busy_at is not None and time.monotonic() - self._gpu_busy_at < WARM_GAP_S
        return 0.0 if recent else policy.min_warmup_s

    def at_clocks(self) -> bool:
        """Whether the GPU runs at its clocks now: a warm-up that has run its steps may stop waiting."""
        return self.clocks_up is not None and self.clocks_up()

    # --- profiling -------------------------------------------------------------------------------
    # torch.profiler with CUDA activities leaves CUPTI attached to the process (kineto finalises it only
    # with TEARDOWN_CUPTI=1, which crashed beside CUDA graphs before CUDA 12.6): every later launch pays
    # for it. On the H100 an eager step (small model, launch-bound) ran 9.9 -> 14.4 ms after the busy
    # profiler, 9.7 ms with TEARDOWN_CUPTI=1. So a process that profiled times nothing more.
    def mark_profiled(self, by: str) -> None:
        """Note that ``by`` ran torch.profiler with CUDA: :meth:`check_not_profiled` refuses later timing."""
        self._profiled_by = by

    def check_not_profiled(self) -> None:
        """Raise where this measurement already profiled CUDA: what it timed now would carry the profiler's cost."""
        if self._profiled_by is not None:
            raise RuntimeError(
                f"timing after {self._profiled_by} profiled this process: CUPTI stays attached and slows every later launch; "
                "time everything first and profile last"
            )

    # --- where the time goes -----------------------------------------------------------------------
    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count the wall time of the block towards ``name`` (one of :data:`PARTS`), unless a part is already open."""
        if name not in self._spent:
            raise ValueError(f"unknown part {name!r}; known: {', '.join(PARTS)}")
        if self._open is not None:
            yield
            return
        self._open, started = name, time.perf_counter()
        try:
            yield
        finally:
            self._spent[name] += time.perf_counter() - started
            self._open = None

    def add_steps(self, warmup_s: float, total_s: float) -> None:
        """A call of the harness's ``time_steps`` that took ``total_s``: its warm-up (the ``warmup_s`` its rows
        carry) is ``warmup``, the rest ``timed``; inside another part, that part's (which counts the whole call)."""
        if self._open is None:
            warmup = min(warmup_s, total_s)
            self._spent["warmup"] += warmup
            self._spent["timed"] += total_s - warmup

    def spent(self) -> dict[str, float]:
        """Seconds per part so far."""
        return dict(self._spent)
