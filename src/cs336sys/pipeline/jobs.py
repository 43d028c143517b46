"""Plumbing for the workflow's per-job scripts."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def log_to(path: str | os.PathLike) -> Iterator[None]:
    """Send this process's stdout and stderr — and those of any child it forks — to ``path``.

    File descriptors 1 and 2 are redirected (not just ``sys.stdout``), so the
    measuring child's tracebacks and compiler messages land in the job's log.
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        except BaseException:
            traceback.print_exc()  # into the job's log, before the descriptors are restored
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def cell_threads(cores: object, gpus: object, local: bool = True) -> int:
    """Cores a cell job holds: on one machine, its GPU's share of them (``cores // gpus``).

    With one GPU a cell holds every core Snakemake was given, so no merge or figure job runs
    beside a measurement and disturbs it; those run side by side once no cell is left (cells
    outrank them). With N GPUs, N cells at once. A cluster job, or limits not set, holds one.
    """
    if not local or not isinstance(cores, int) or not isinstance(gpus, int) or gpus < 1:
        return 1
    return max(1, cores // gpus)
