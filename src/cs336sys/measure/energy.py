"""The GPU's energy over each timed block, from NVML: joules per step, average watts.

NVML's ``nvmlDeviceGetTotalEnergyConsumption`` counts millijoules since the driver loaded
(Volta and newer). The meter reads it at a block's start, after each step's closing
synchronisation (one NVML call between two steps, outside both) and at the block's end; no
thread. Where the counter is missing (an older GPU, a driver that refuses it) it samples
``nvmlDeviceGetPowerUsage`` every :data:`SAMPLE_S` in a background thread during the block and
integrates (trapezoids), and says so (``energy_source``: ``sampled power``); the thread competes
with the launching thread for the GIL, so it runs only where the counter cannot.

What a reading can claim. On an H100 and an H200 (driver 580) the counter moved every 100 ms
(:data:`PERIOD_S`; the counter polled over a second of bf16 matmuls), and over 6 s of matmuls
on the H200 its average, 695.8 W, was within 1% of ``nvidia-smi``'s ``power.draw`` (691.6 W,
50 samples). A read returns the energy up to the last update, so the plain difference over a
block of T seconds is off by up to a period's energy at each end (±0.1 s/T). The reads after each step place the updates inside the
block (:func:`counter_joules`): the energy between the first and the last update over the time
between them is the block's power, off by half a step (at most half a period) at either end. We
assume the counter covers the whole board and lags the work by less than a period (after 2000
matmuls it still rose at full power for ~100 ms): each block follows warm-up steps of its own
step, so what the lag carries in is alike; interleaved blocks, which follow other work, are not
metered. A block's J/step is a sample from :data:`MIN_BLOCK_S` = 0.5 s (four or more updates, the
studies' default ``min_measure_s``), and the interval over such blocks carries their spread.
Shorter blocks give the total over all blocks without an interval where they add up to
:data:`MIN_BLOCK_S`, else nothing.

Never raises: a missing library, driver, GPU or counter, or a read that fails in the middle of
a cell, leaves the energy empty with the reason in ``energy_note``; energy must never cost a
measurement. No torch import: NVML needs no CUDA context.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cs336sys.measure.stats import summarize_trials

COUNTER, SAMPLED = "counter", "sampled power"  # energy_source
ENERGY_COLUMNS = ("energy_j", "energy_ci_low_j", "energy_ci_high_j", "avg_power_w", "energy_samples_j", "energy_source", "energy_note")
MIN_BLOCK_S = 0.5  # a block's J/step is a sample from here on (module doc: the counter's 100 ms periods)
SAMPLE_S = 0.01  # the fallback's power sampling period
PERIOD_S = 0.1  # how often the counter moves (H100 and H200, driver 580; module doc)
NO_CUDA = "not measured: energy comes from NVML for a CUDA device, and this ran on a CPU"
STEP_ONLY = "on the step row: a block's energy covers every phase of its steps"
DO_BENCH = "not measured: do_bench calls last microseconds to milliseconds, and NVML's energy counter moves every ~100 ms"
NOT_METERED = "not metered: interleaved blocks share the counter's 100 ms periods with the other arms"


@dataclass(frozen=True)
class Reading:
    """One timed block's energy: ``joules`` (None: not measured, ``note`` says why), wall seconds, steps."""

    joules: float | None
    seconds: float
    steps: int
    source: str = ""
    note: str = ""


class Meter:
    """Energy between :meth:`begin` and :meth:`end`; this one measures nothing and says why."""

    source = ""

    def __init__(self, note: str = NO_CUDA):
        self.note = note

    def begin(self) -> None:
        pass

    def mark(self) -> None:
        """A step of the block ended (after its closing synchronisation): the counter may be read."""

    def end(self) -> tuple[float | None, str]:
        """(joules since :meth:`begin` or None, why None)."""
        return None, self.note


class NvmlMeter(Meter):
    """NVML device ``index`` (``$CS336SYS_GPU_INDEX``, else 0, as :func:`cs336sys.measure.gpu_state.gpu_state`),
    its handle kept open for the process: the counter where it works, else sampled power."""

    def __init__(self, index: int | None = None, nvml: Any = None, sample_s: float = SAMPLE_S, clock: Callable[[], float] = time.monotonic):
        super().__init__("")
        self._nvml, self._handle, self._sample_s, self._clock = nvml, None, sample_s, clock
        self._marks: list[tuple[float, float]] = []  # (seconds, counter mJ) at the block's start, each step's end, its end
        self._samples: list[tuple[float, float]] = []  # (seconds, watts), the fallback's
        self._stop, self._thread, self._error = threading.Event(), None, ""
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
            self._counter_mj()
            self.source = COUNTER
        except Exception as err:  # noqa: BLE001 - NVMLError_NotSupported before Volta
            try:
                self._power_w()
                self.source, self.note = SAMPLED, f"no energy counter ({err}): power sampled every {sample_s * 1e3:g} ms"
            except Exception as err2:  # noqa: BLE001
                self.note = f"not measured: neither NVML's energy counter ({err}) nor its power reading ({err2}) works"

    def _counter_mj(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def _power_w(self) -> float:
        return float(self._nvml.nvmlDeviceGetPowerUsage(self._handle)) / 1e3  # mW

    def begin(self) -> None:
        self._marks, self._error = [], ""
        try:
            if self.source == COUNTER:
                self._marks = [(self._clock(), self._counter_mj())]
            elif self.source == SAMPLED:
                self._samples = [(self._clock(), self._power_w())]
                self._stop.clear()
                self._thread = threading.Thread(target=self._sample, name="energy-sampler", daemon=True)
                self._thread.start()
        except Exception as err:  # noqa: BLE001
            self._error = f"not measured: the {self.source} read failed at the block's start ({err})"

    def mark(self) -> None:
        if self.source == COUNTER and self._marks and not self._error:  # one NVML call between two steps, outside both
            try:
                self._marks.append((self._clock(), self._counter_mj()))
            except Exception as err:  # noqa: BLE001
                self._error = f"not measured: a counter read failed during the block ({err})"

    def _sample(self) -> None:
        while not self._stop.wait(self._sample_s):
            try:
                self._samples.append((self._clock(), self._power_w()))
            except Exception as err:  # noqa: BLE001
                self._error = f"not measured: a power read failed during the block ({err})"
                return

    def end(self) -> tuple[float | None, str]:
        if self.source == SAMPLED and self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if not self.source or self._error:
            return None, self._error or self.note
        try:
            if self.source == COUNTER:
                if not self._marks:
                    return None, "not measured: no counter reading at the block's start"
                self._marks.append((self._clock(), self._counter_mj()))
                if self._marks[-1][1] < self._marks[0][1]:  # the driver reloaded mid-block: the counter restarted from 0
                    return None, "not measured: the energy counter went backwards (driver reloaded?)"
                return counter_joules(self._marks), ""
            self._samples.append((self._clock(), self._power_w()))
            return trapezoid(self._samples), self.note
        except Exception as err:  # noqa: BLE001
            return None, f"not measured: the {self.source} read failed at the block's end ({err})"


def counter_joules(marks: Sequence[tuple[float, float]], period_s: float = PERIOD_S) -> float:
    """Joules over ``marks[0]``..``marks[-1]``, (seconds, counter mJ) reads at the block's start, each step's end and its end.

    The counter moves once a period: a read returns the energy up to its last update, which happened since
    the read before it and at most one period before (it is placed at the middle of that span). Where
    two or more updates fall inside the block, the energy between the first and the last (exact: both are
    counter values) over the time between them is the block's average power, times the block's length:
    off by at most half a step or period at either end, where the plain difference is off by up to a
    period's energy at each. Otherwise the plain difference."""
    updates = [((max(t0, t1 - period_s) + t1) / 2, e1) for (t0, e0), (t1, e1) in zip(marks, marks[1:]) if e1 != e0]
    if len(updates) >= 2 and updates[-1][0] > updates[0][0]:
        watts = (updates[-1][1] - updates[0][1]) / 1e3 / (updates[-1][0] - updates[0][0])
        return watts * (marks[-1][0] - marks[0][0])
    return (marks[-1][1] - marks[0][1]) / 1e3


def trapezoid(samples: Sequence[tuple[float, float]]) -> float:
    """∫ power dt (joules) over (seconds, watts) samples, linear between them."""
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(samples, samples[1:]))


_meters: dict[tuple[int, str], Meter] = {}


def meter_for(device_type: str) -> Meter:
    """This process's meter for its GPU (opened once: NVML stays initialised), or one saying why there is none."""
    if device_type != "cuda":
        return Meter(NO_CUDA)
    key = (os.getpid(), os.environ.get("CS336SYS_GPU_INDEX", ""))  # a forked child opens its own
    if key not in _meters:
        _meters[key] = NvmlMeter()
    return _meters[key]


def empty(note: str) -> dict[str, object]:
    """The energy columns, empty, with ``note`` saying why."""
    return {**dict.fromkeys(ENERGY_COLUMNS), "energy_source": "", "energy_note": note}


def energy_stats(readings: Sequence[Reading | None]) -> dict[str, object]:
    """The energy columns of a whole-step row from its timed blocks' readings (None: a block not metered).

    ``energy_j``: the median of the per-block J/step of the blocks of at least :data:`MIN_BLOCK_S`,
    with the interval of :func:`cs336sys.measure.stats.summarize_trials` (each block one trial: the
    order-statistic interval and the Student-t interval over blocks); ``avg_power_w``: their joules
    over their seconds. Without such a block, the total over all blocks per step, no interval.
    """
    measured = [r for r in readings if r is not None and r.joules is not None and r.steps > 0]
    if not measured:
        notes = [n for n in dict.fromkeys(r.note for r in readings if r is not None and r.note) if n != NOT_METERED]
        return empty("; ".join(notes) or NOT_METERED)  # why the metered blocks failed, where some were metered
    used = [r for r in measured if r.seconds >= MIN_BLOCK_S]
    seconds = sum(r.seconds for r in (used or measured))
    if not used and seconds < MIN_BLOCK_S:
        return empty(f"not measured: {len(measured)} timed blocks of {seconds:.2g} s in all, under the {MIN_BLOCK_S:g} s that "
                     "NVML's energy counter (100 ms periods) needs")  # fmt: skip
    joules = sum(r.joules or 0.0 for r in (used or measured))
    notes = list(dict.fromkeys(r.note for r in measured if r.note))  # e.g. why power was sampled
    row: dict[str, object] = {
        "avg_power_w": joules / seconds if seconds > 0 else None,
        "energy_source": ";".join(dict.fromkeys(r.source for r in measured)),
    }
    if used:
        per_step = [(r.joules or 0.0) / r.steps for r in used]
        iv = summarize_trials([[x] for x in per_step])
        bounded = math.isfinite(iv.low) and math.isfinite(iv.high)
        row |= {"energy_j": iv.median, "energy_ci_low_j": max(iv.low, 0.0) if bounded else None,
                "energy_ci_high_j": iv.high if bounded else None, "energy_samples_j": ";".join(f"{x:.6g}" for x in per_step)}  # fmt: skip
        if len(used) < len(readings):
            notes.append(f"from {len(used)} of {len(readings)} timed blocks (the others not metered or under {MIN_BLOCK_S:g} s)")
    else:
        row |= {
            "energy_j": joules / sum(r.steps for r in measured),
            "energy_ci_low_j": None,
            "energy_ci_high_j": None,
            "energy_samples_j": "",
        }
        notes.append(f"total over {len(measured)} blocks of under {MIN_BLOCK_S:g} s each: no interval")
    return row | {"energy_note": "; ".join(notes)}
