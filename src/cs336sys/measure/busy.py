"""How much of a step the GPU was busy: the measurement behind the ``host_bound`` flag.

A step whose GPU idles between kernels measures Python and the CPU as much as
the GPU: its time moves with host jitter (14-50% between blocks of steps on the
H100 host) and its ratios to other cells say little about the GPU. This runs
a few more steps under ``torch.profiler`` (CUDA activities), each between two
synchronisations inside one range, and returns the median over steps of the
share of the range's wall time covered by at least one kernel, memcpy or
memset (overlapping streams counted once). The profiler's own per-launch cost
makes a launch-bound step look slightly more host-bound than it is; a GPU-bound
step still reads close to 1. The profiler stays attached to the process and slows every
later launch, so a cell profiles after all its timing (``Session.check_not_profiled``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from cs336sys.measure.session import Session
from cs336sys.measure.stats import gpu_busy_fraction
from cs336sys.measure.timing import StepClock, synchronize

WINDOW = "cs336sys.busy_window"
NO_CUDA = "GPU busy share needs CUDA (a CPU has no separate device timeline)"
# The cell runner profiles it in a cell's first pass only (Session.busy_share): a profiler pass costs
# seconds per mode, and whether a cell is launch-bound does not change between passes.
LATER_PASS = "measured in the cell's first pass only; the merge keeps it"


def busy_note(busy: float | None, device: torch.device, session: Session) -> str:
    """Why ``gpu_busy_frac`` is empty, or "" when it was measured."""
    if busy is not None:
        return ""
    return NO_CUDA if device.type != "cuda" else LATER_PASS if not session.busy_share else "no kernel window recorded"


def gpu_busy_share(step: Callable[[StepClock], None], device: torch.device, session: Session, steps: int = 3) -> float | None:
    """Median share of a step's wall time with GPU work in flight; None on a CPU or where the session profiles none."""
    if device.type != "cuda" or not session.busy_share:
        return None
    with session.part("profile"):
        return _busy_share(step, device, session, steps)


def _busy_share(step: Callable[[StepClock], None], device: torch.device, session: Session, steps: int) -> float | None:
    from torch.profiler import ProfilerActivity, profile, record_function

    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            synchronize(device)
            with record_function(WINDOW):
                step(StepClock(device))
                synchronize(device)
    session.mark_gpu_busy()  # the next mode's warm-up finds the clocks up
    session.mark_profiled("the busy share (torch.profiler)")  # so: profiled after every timing of the cell
    windows, kernels = _intervals(prof)
    shares = [gpu_busy_fraction(kernels, w) for w in windows if w[1] > w[0]]
    return statistics.median(shares) if shares else None


def _intervals(prof) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The profiled windows (CPU) and the GPU work (kernels, memcpy, memset), as (start, end) pairs.

    Read from the profiler's raw events: ``prof.events()`` first builds Python's event tree,
    which took most of the 15 s a large model's eager cell spent here on the H100.
    """
    from torch.autograd import DeviceType

    try:
        events = [(e.name(), e.device_type(), e.start_ns(), e.end_ns(), _annotation(e)) for e in prof.profiler.kineto_results.events()]
    except AttributeError:  # a torch without them: the tree it is
        events = [
            (
                e.name,
                e.device_type,
                e.time_range.start,
                e.time_range.end,
                bool(getattr(e, "is_user_annotation", False)) or "user_annotation" in str(getattr(e, "activity_type", "") or ""),
            )
            for e in prof.events()
        ]
    windows = [(start, end) for name, device, start, end, _ in events if name == WINDOW and device == DeviceType.CPU]
    kernels = [
        (start, end) for name, device, start, end, annotation in events if device == DeviceType.CUDA and not annotation and name != WINDOW
    ]
    return windows, kernels


def _annotation(event) -> bool:
    """A range of ours (record_function) on either timeline, not GPU work: torch 2.11 has no activity_type."""
    if hasattr(event, "activity_type"):
        return "user_annotation" in str(event.activity_type())
    return bool(event.is_user_annotation())
