"""The test hook that makes cells fail on purpose, checked before anything runs.

``CS336SYS_INJECT_FAULT=<kind>[:<cell-id substring>]`` makes matching cells fail
inside the measuring child (``pipeline.cells``), so every failure path becomes a
row in tests without a real GPU. ``sleep=<seconds>`` is not a failure: the child
sleeps that long (inside the measured interval, holding its GPU lock) and then
measures normally, so tests can make cells that last a known time. A typo in the
kind would inject nothing and the test would pass for the wrong reason, so an
unknown kind stops the run. No torch.
"""

from __future__ import annotations

import math
import os
import time

FAULT_ENV = "CS336SYS_INJECT_FAULT"
FAULT_KINDS = ("oom", "error", "abort", "hang", "sleep")
FORMAT = "<kind>[:<cell-id substring>] with kind one of oom, error, abort, hang, sleep=<seconds>"


def parse_fault_spec(spec: str) -> tuple[str, float, str]:
    """``(kind, seconds, cell-id substring)`` of a checked spec; ``("", 0, "")`` for none."""
    check_fault_spec(spec)
    head, _, where = spec.partition(":")
    kind, _, arg = head.partition("=")
    return kind, float(arg) if kind == "sleep" else 0.0, where


def check_fault_spec(spec: str) -> None:
    """Reject a ``CS336SYS_INJECT_FAULT`` value whose kind is unknown (a typo would inject nothing)."""
    if not spec:
        return
    head = spec.partition(":")[0]
    kind, eq, arg = head.partition("=")
    if kind not in FAULT_KINDS:
        raise ValueError(f"{FAULT_ENV}={spec!r}: unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)} (format: {FORMAT})")
    if kind == "sleep":
        try:
            seconds = float(arg)
        except ValueError:
            seconds = math.nan
        if not (eq and math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"{FAULT_ENV}={spec!r}: sleep needs a finite number of seconds >= 0, e.g. sleep=1.5 (format: {FORMAT})")
    elif eq:
        raise ValueError(f"{FAULT_ENV}={spec!r}: fault kind {kind!r} takes no '=' value (format: {FORMAT})")


def inject_fault(cell_id: str, spec: str, oom: type[BaseException]) -> None:
    """Fail as ``spec`` says where ``cell_id`` matches it (in the measuring child); ``oom``: the framework's out-of-memory error."""
    if not spec:
        return
    kind, seconds, where = parse_fault_spec(spec)
    if where and where not in cell_id:
        return
    if kind == "sleep":  # not a failure: the cell lasts longer, then measures normally
        time.sleep(seconds)
    if kind == "oom":
        raise oom(f"CUDA out of memory (injected by {FAULT_ENV})")
    if kind == "error":
        raise RuntimeError(f"injected error ({FAULT_ENV})")
    if kind == "abort":
        os.abort()
    if kind == "hang":
        time.sleep(3600)
