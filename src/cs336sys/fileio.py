"""Atomic file writes: every output is written under a temporary name beside it, then renamed.

A killed job (Snakemake, the OOM killer, SLURM) then leaves either the old file
or the new one, never a half-written CSV that looks complete to the next run.
Used by every layer, so it depends on nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

_TEMP = re.compile(r"^\.tmp-(\d+)-(.+)$")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; rename it over ``path`` on success.

    The temporary name keeps ``path``'s suffixes (torch picks gzip from ``.gz``)
    and starts with a dot, so globs such as ``*.csv`` never see it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")  # remove_stale_temps reads this name
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: kill(0) is all there is
    return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")


def remove_stale_temps(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete the ``.tmp-<pid>-<name>`` files in ``folder`` that a killed writer left; return them.

    A writer killed between creating its temporary and renaming it (SIGKILL, the OOM killer,
    a node failure) leaves the temporary behind. One whose pid no longer runs on this host is
    stale. A pid is only meaningful on its own host: on a folder shared between hosts (a
    cluster's results/) pass ``name``, the output whose writer you are, so that only its
    temporaries are touched and another host's write in progress never is.
    """
    removed = []
    for path in Path(folder).glob(".tmp-*"):
        m = _TEMP.match(path.name)
        if not m or (name is not None and m.group(2) != name):
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or pid_alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed
