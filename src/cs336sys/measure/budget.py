"""Where a measuring process's time goes: the named parts of a cell's work, in wall seconds.

A cell job's wall time splits into its start-up (the job's process, the warm worker's
hand-off, the wait for a GPU, the measuring child's fork and CUDA context: measured by the
cell runner, ``pipeline.cells``) and what the measurement does, which the measuring code
marks here with :func:`part` (or :func:`counted` on a function): the correctness check, the
warm-up steps, the timed blocks, the interleaved blocks of paired comparisons, CUDA-graph
capture, the blocks timed for their energy, and profiling. The rest of the measurement
(model and inputs built, rows assembled) is the job's ``other`` time.

A part opened inside another counts towards the outer one (the warm-up and timed blocks of
a paired comparison are ``pairs``), so the parts never overlap and add up, with start-up
and ``other``, to the job's wall time. One process measures one cell: the runner reads
:func:`spent` when the measurement ends. No torch here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from cs336sys.columns import TIME_PARTS

PARTS = tuple(p for p in TIME_PARTS if p not in ("startup", "other"))  # the runner measures those two
F = TypeVar("F", bound=Callable)

_spent: dict[str, float] = dict.fromkeys(PARTS, 0.0)
_open: list[str] = []  # the outermost part in progress, if any


@contextmanager
def part(name: str) -> Iterator[None]:
    """Count the wall time of the block towards ``name`` (one of :data:`PARTS`), unless a part is already open."""
    if name not in _spent:
        raise ValueError(f"unknown part {name!r}; known: {', '.join(PARTS)}")
    if _open:
        yield
        return
    _open.append(name)
    started = time.perf_counter()
    try:
        yield
    finally:
        _spent[name] += time.perf_counter() - started
        _open.clear()


def counted(name: str) -> Callable[[F], F]:
    """Decorate a function whose every call is part ``name`` (see :func:`part`)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def counted_call(*args, **kwargs):
            with part(name):
                return fn(*args, **kwargs)

        return counted_call  # type: ignore[return-value]

    return wrap


def timed_steps(fn: F) -> F:
    """Decorate the harness's ``time_steps``: its call's warm-up (the returned ``Timing.warmup_s``, the same
    seconds the rows carry) is ``warmup``, the rest of the call ``timed``; inside another part, that part's."""

    @functools.wraps(fn)
    def timed_call(*args, **kwargs):
        if _open:
            return fn(*args, **kwargs)
        started = time.perf_counter()
        timing = fn(*args, **kwargs)
        warmup = min(timing.warmup_s, time.perf_counter() - started)
        _spent["warmup"] += warmup
        _spent["timed"] += time.perf_counter() - started - warmup
        return timing

    return timed_call  # type: ignore[return-value]


def spent() -> dict[str, float]:
    """Seconds per part since :func:`reset` (or this process started)."""
    return dict(_spent)


def reset() -> None:
    """Start counting from zero (the cell runner, before a measurement)."""
    _spent.update(dict.fromkeys(PARTS, 0.0))
    _open.clear()
