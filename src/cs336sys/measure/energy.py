"""The GPU's energy over each timed block, from NVML: joules per step over the steps' own time, average watts.

NVML's ``nvmlDeviceGetTotalEnergyConsumption`` counts millijoules since the driver loaded (Volta and
newer). On an H100 and an H200 (driver 580) it moved every 100 ms (:data:`PERIOD_S`; the counter
polled over a second of bf16 matmuls), and over 6 s of matmuls on the H200 its average, 695.8 W, was
within 1% of ``nvidia-smi``'s ``power.draw`` (691.6 W, 50 samples). One read costs milliseconds on the
lent VM hosts, and a read after every step put that read, and the idle GPU during it, inside the
metered block (J/step 2-23% high). So nothing in the timing thread reads the counter while a block
runs: a :class:`Sampler` thread reads it from the block's start to its end, back to back from an
update until the next one is found, asleep for most of the period between (an NVML call releases the
GIL; the thread's own Python is two clock reads and an append per read). Each row records what one
read costs on its host (``energy_read_ms``: the median of :data:`READ_PROBES` reads when the meter
opened, before any timed block).

The estimate (:func:`counter_watts`). An update lies between the two reads that saw the old and the
new value; it is placed at the middle of their starts. The energy between the first and the last
update inside the block (exact: both are counter values) over the time between them is the block's
power; the block's joules are that power times the steps' own time (the sum of their wall times,
without the loop between steps), so J/step and ``avg_power_w`` cover the steps alone. The ends: the
counter may report an update's energy up to a period late (after 2000 matmuls it still rose at full
power for ~100 ms), so the first update used lies at least :data:`SETTLE_S` after the block's start
(the work before the block, warm-up or the state sample, cannot leak in), and the last one's read
ended before the block's end (nor can the idle GPU after it). No update outside the block is needed,
so a block never runs longer to wait for one. Its error is at most the two placements (a read's
length each, milliseconds) over the time between the updates (0.2 s or more: a block of
:data:`MIN_BLOCK_S` always holds two usable updates; a shorter one may not, and is empty with the
reason). The interval over blocks carries their spread.

Where the counter is missing (an older GPU, a driver that refuses it) the sampler reads
``nvmlDeviceGetPowerUsage`` every :data:`SAMPLE_S` and integrates it (trapezoids), and says so
(``energy_source``: ``sampled power``).

Never raises: a missing library, driver, GPU or counter, or a read that fails in the middle of a
cell, leaves the energy empty with the reason in ``energy_note``; energy must never cost a
measurement. No torch import: NVML needs no CUDA context.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cs336sys.measure.stats import summarize_trials

COUNTER, SAMPLED = "counter", "sampled power"  # energy_source
ENERGY_COLUMNS = (
    "energy_j",
    "energy_ci_low_j",
    "energy_ci_high_j",
    "avg_power_w",
    "energy_samples_j",
    "energy_source",
    "energy_note",
    "energy_read_ms",
)
PERIOD_S = 0.1  # how often the counter moves (H100 and H200, driver 580; module doc)
SETTLE_S = PERIOD_S  # the first update used lies this long after a block's start: the counter's lag (module doc)
GUARD_S = 0.015  # the sampler wakes this long before the next update is due
MAX_BRACKET_S = 0.02  # an update seen by two reads further apart than this is not placed (the sampler slept between)
MIN_BLOCK_S = 0.5  # SETTLE_S, then up to a period to the first update, one more to the second, margin: always two
SAMPLE_S = 0.01  # the fallback's power sampling period
HALT_S = 1.0  # the longest a block's end waits for the sampler's read in flight
READ_PROBES = 10  # reads timed when a meter opens: energy_read_ms (a read costs ~3 ms on the lent VM hosts)
NO_CUDA = "not measured: energy comes from NVML for a CUDA device, and this ran on a CPU"
STEP_ONLY = "on the step row: a block's energy covers every phase of its steps"
DO_BENCH = "not measured: do_bench calls last microseconds to milliseconds, and NVML's energy counter moves every ~100 ms"
NOT_METERED = "not metered: interleaved blocks share the counter's 100 ms periods with the other arms"
TOO_SHORT = "not measured: fewer than two energy-counter updates {settle:g} s or more into the block of {seconds:.2g} s (the counter moves every ~100 ms)"


@dataclass(frozen=True)
class Reading:
    """One timed block's energy: ``joules`` over its steps' own ``seconds`` (None: not measured, ``note`` says why)."""

    joules: float | None
    seconds: float  # the sum of the steps' wall times
    steps: int
    source: str = ""
    note: str = ""
    read_ms: float | None = None  # what one read of the meter's source costs (energy_read_ms)


class Sampler(threading.Thread):
    """Reads ``read()`` until :meth:`halt`: ``reads`` holds (clock before, clock after, value) per read.

    With ``period_s`` (the counter) it reads back to back until the value changes, then sleeps until
    :data:`GUARD_S` before the next change is due; a change that came while it slept (woken late, or a
    period shorter than assumed) halves the period it assumes and sends it back to back until the next
    change. Without (power), every :data:`SAMPLE_S`. ``error`` holds the exception that stopped it, if one did.
    """

    def __init__(self, read: Callable[[], float], clock: Callable[[], float], period_s: float | None):
        super().__init__(name="energy-sampler", daemon=True)
        self.reads: list[tuple[float, float, float]] = []
        self.error: Exception | None = None
        self._read, self._clock, self._period_s = read, clock, period_s
        self._halt = threading.Event()

    def run(self) -> None:
        reads, read, clock, halt, period = self.reads, self._read, self._clock, self._halt, self._period_s
        due, slept = 0.0, False
        try:
            while not halt.is_set():
                t0 = clock()
                value = read()
                t1 = clock()
                if period is None:
                    due = t1 + SAMPLE_S
                elif reads and value != reads[-1][2]:
                    period, due = (period / 2, 0.0) if slept else (period, (reads[-1][0] + t0) / 2 + period - GUARD_S)
                reads.append((t0, t1, value))
                slept = due > t1
                if slept and halt.wait(due - t1):
                    break
        except Exception as err:  # noqa: BLE001 - NVMLError, GPU lost: the block's energy is empty with the reason
            self.error = err

    def halt(self) -> None:
        """Stop reading; wait for the read in flight (at most HALT_S: a read that hangs is the sampler's own)."""
        self._halt.set()
        self.join(HALT_S)


def counter_watts(reads: Sequence[tuple[float, float, float]], begin: float, end: float, settle_s: float = SETTLE_S) -> float | None:
    """Watts over [``begin``, ``end``] from a sampler's (clock before, clock after, counter mJ) reads (module doc).

    An update lies between the reads that saw the old and the new value, placed at the middle of their
    starts, and is used where both reads are at most :data:`MAX_BRACKET_S` apart, the first started
    ``settle_s`` or more after ``begin`` and the second ended by ``end``. The energy between the first and
    the last such update over the time between them; None with fewer than two."""
    placed = [
        ((a[0] + b[0]) / 2, b[2])
        for a, b in zip(reads, reads[1:])
        if b[2] != a[2] and a[0] >= begin + settle_s and b[1] <= end and b[0] - a[0] <= MAX_BRACKET_S
    ]
    if len(placed) < 2 or placed[-1][0] <= placed[0][0]:
        return None
    (t_first, e_first), (t_last, e_last) = placed[0], placed[-1]
    return (e_last - e_first) / 1e3 / (t_last - t_first)


def power_watts(reads: Sequence[tuple[float, float, float]], end: float) -> float | None:
    """Mean watts of (clock before, clock after, W) power samples ended by ``end``: trapezoids over their span."""
    samples = [(t0, w) for t0, t1, w in reads if t1 <= end]
    span = samples[-1][0] - samples[0][0] if len(samples) >= 2 else 0.0
    return trapezoid(samples) / span if span > 0 else None


def trapezoid(samples: Sequence[tuple[float, float]]) -> float:
    """∫ power dt (joules) over (seconds, watts) samples, linear between them."""
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(samples, samples[1:]))


class Meter:
    """A timed block's energy between :meth:`begin` and :meth:`end`; this one measures nothing and says why."""

    source = ""
    read_ms: float | None = None

    def __init__(self, note: str = NO_CUDA):
        self.note = note

    def begin(self) -> None:
        pass

    def _watts(self) -> tuple[float | None, str]:
        return None, self.note

    def end(self, step_ms: Sequence[float]) -> Reading:
        """The block's reading: its power times its steps' own time (``step_ms``, the steps' wall times)."""
        watts, note = self._watts()
        seconds = sum(step_ms) / 1e3
        joules = None if watts is None else watts * seconds
        return Reading(joules, seconds, len(step_ms), self.source if joules is not None else "", note, self.read_ms)


class NvmlMeter(Meter):
    """NVML device ``index`` (``$CS336SYS_GPU_INDEX``, else 0, as :func:`cs336sys.measure.gpu_state.gpu_state`),
    its handle kept open for the process: the counter where it works, else sampled power."""

    def __init__(self, index: int | None = None, nvml: Any = None, clock: Callable[[], float] = time.perf_counter):
        super().__init__("")
        self._nvml, self._handle, self._clock = nvml, None, clock
        self._sampler: Sampler | None = None
        self._begin, self._error = 0.0, ""
        try:
            index = int(os.environ.get("CS336SYS_GPU_INDEX") or 0) if index is None else index
            if self._nvml is None:
                import pynvml as nvml_module

                self._nvml = nvml_module
            self._nvml.nvmlInit()
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        except ImportError:
            self.note = "not measured: no NVML bindings (pip install nvidia-ml-py)"
            return
        except Exception as err:  # noqa: BLE001 - NVMLError, a bad index, OSError from a broken library
            self.note = f"not measured: NVML unavailable ({err})"
            return
        try:
            self.read_ms = self._probe(self._counter_mj)
            self.source = COUNTER
        except Exception as err:  # noqa: BLE001 - NVMLError_NotSupported before Volta
            try:
                self.read_ms = self._probe(self._power_w)
                self.source, self.note = SAMPLED, f"no energy counter ({err}): power sampled every {SAMPLE_S * 1e3:g} ms"
            except Exception as err2:  # noqa: BLE001
                self.note = f"not measured: neither NVML's energy counter ({err}) nor its power reading ({err2}) works"

    def _counter_mj(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def _power_w(self) -> float:
        return float(self._nvml.nvmlDeviceGetPowerUsage(self._handle)) / 1e3  # mW

    def _probe(self, read: Callable[[], float]) -> float:
        """The median milliseconds of :data:`READ_PROBES` reads back to back (the first raises where ``read`` cannot work)."""
        times = []
        for _ in range(READ_PROBES):
            t0 = self._clock()
            read()
            times.append((self._clock() - t0) * 1e3)
        return statistics.median(times)

    def begin(self) -> None:
        if self._sampler is not None:  # a block that raised before its end: its sampler must not run on
            self._sampler.halt()
        self._sampler, self._error = None, ""
        if not self.source:
            return
        counter = self.source == COUNTER
        sampler = Sampler(self._counter_mj if counter else self._power_w, self._clock, PERIOD_S if counter else None)
        self._begin = self._clock()
        try:
            sampler.start()
            self._sampler = sampler
        except RuntimeError as err:  # can't start a new thread
            self._error = f"not measured: the energy sampler did not start ({err})"

    def _watts(self) -> tuple[float | None, str]:
        end, sampler = self._clock(), self._sampler
        self._sampler = None
        if sampler is None:
            return None, self._error or self.note
        sampler.halt()
        if sampler.is_alive():
            return None, f"not measured: a {self.source} read did not return within {HALT_S:g} s"
        if sampler.error is not None:
            return None, f"not measured: a {self.source} read failed during the block ({sampler.error})"
        if self.source == SAMPLED:
            watts = power_watts(sampler.reads, end)
            return watts, self.note if watts is not None else f"not measured: fewer than two power samples in {end - self._begin:.2g} s"
        if any(b[2] < a[2] for a, b in zip(sampler.reads, sampler.reads[1:])):  # the driver reloaded: it restarted from 0
            return None, "not measured: the energy counter went backwards (driver reloaded?)"
        watts = counter_watts(sampler.reads, self._begin, end)
        return watts, "" if watts is not None else TOO_SHORT.format(settle=SETTLE_S, seconds=end - self._begin)


def open_meter(device_type: str) -> Meter:
    """A meter of this process's GPU (its NVML handle open while the meter lives: a session opens one,
    ``measure.session``), or one saying why there is none."""
    return NvmlMeter() if device_type == "cuda" else Meter(NO_CUDA)


def empty(note: str, read_ms: float | None = None) -> dict[str, object]:
    """The energy columns, empty, with ``note`` saying why."""
    return {**dict.fromkeys(ENERGY_COLUMNS), "energy_source": "", "energy_note": note, "energy_read_ms": read_ms}


def energy_stats(readings: Sequence[Reading | None]) -> dict[str, object]:
    """The energy columns of a whole-step row from its timed blocks' readings (None: a block not metered).

    ``energy_j``: the median of the measured blocks' J/step, with the interval of
    :func:`cs336sys.measure.stats.summarize_trials` (each block one trial: the order-statistic interval and
    the Student-t interval over blocks; one block: no interval); ``avg_power_w``: their joules over their
    steps' own seconds; ``energy_read_ms``: what one read of the meter's source cost.
    """
    metered = [r for r in readings if r is not None]
    measured = [r for r in metered if r.joules is not None and r.steps > 0]
    read_ms = next((r.read_ms for r in metered if r.read_ms is not None), None)
    if not measured:
        notes = [n for n in dict.fromkeys(r.note for r in metered if r.note) if n != NOT_METERED]
        return empty("; ".join(notes) or NOT_METERED, read_ms)  # why the metered blocks failed, where some were metered
    per_step = [(r.joules or 0.0) / r.steps for r in measured]
    iv = summarize_trials([[x] for x in per_step])
    bounded = math.isfinite(iv.low) and math.isfinite(iv.high)
    notes = list(dict.fromkeys(r.note for r in measured if r.note))  # e.g. why power was sampled
    if len(measured) < len(readings):
        others = [n for n in dict.fromkeys(r.note for r in metered if r.joules is None and r.note) if n != NOT_METERED]
        notes.append(f"from {len(measured)} of {len(readings)} timed blocks (the others: {'; '.join(others) or 'not metered'})")
    seconds = sum(r.seconds for r in measured)
    return {
        "energy_j": iv.median,
        "energy_ci_low_j": max(iv.low, 0.0) if bounded else None,
        "energy_ci_high_j": iv.high if bounded else None,
        "avg_power_w": sum(r.joules or 0.0 for r in measured) / seconds if seconds > 0 else None,
        "energy_samples_j": ";".join(f"{x:.6g}" for x in per_step),
        "energy_source": ";".join(dict.fromkeys(r.source for r in measured)),
        "energy_note": "; ".join(notes),
        "energy_read_ms": read_ms,
    }
