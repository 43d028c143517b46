"""Atomic file writes: every output is written under a temporary name beside it, then renamed.

A killed job (Snakemake, the OOM killer, SLURM) then leaves either the old file
or the new one, never a half-written CSV that looks complete to the next run.
The rename replaces only a regular file (or nothing): renaming over ``/dev/null``,
a FIFO or a symlink as root would destroy that node, so such a target is refused.
Used by every layer, so it depends on nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

_TEMP = re.compile(r"^\.tmp-(\d+)-(.+)$")
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
# create, never open what is there: a link planted at the temporary name is not followed
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class OutputPathError(OSError):
    """An output path names something other than a regular file; nothing was written there."""


def not_a_file(path: str | os.PathLike) -> str | None:
    """What is at ``path`` when it is not a regular file ("a FIFO (named pipe)", …); None for a regular file or nothing.

    ``lstat``: a symbolic link is reported as one, whatever it points to.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_output_path(path: str | os.PathLike) -> None:
    """Raise :class:`OutputPathError` unless ``path`` is a regular file or does not exist."""
    kind = not_a_file(path)
    if kind is not None:
        raise OutputPathError(f"{path} is {kind}: an output replaces only a regular file; remove it or write elsewhere")


def create_temp(tmp: Path, path: Path) -> None:
    """Create ``tmp`` empty and exclusively; replace only a leftover regular file of our own.

    A writer killed before its rename leaves ``.tmp-<pid>-<name>``; pids recycle, so a later
    process can meet its own name. Anything else there (a link planted by another user, a FIFO)
    is refused rather than opened.
    """
    try:
        os.close(os.open(tmp, _CREATE, 0o666))
        return
    except FileExistsError:
        pass
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(tmp)
        if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()):
            raise OutputPathError(
                f"{tmp}, the temporary name for {path.name}, is taken by {not_a_file(tmp) or 'a file'} owned by uid "
                f"{st.st_uid}; it is neither followed nor replaced: remove it and write again"
            )
        tmp.unlink()
    os.close(os.open(tmp, _CREATE, 0o666))  # FileExistsError if it was taken again meanwhile


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; rename it over ``path`` on success.

    The temporary name keeps ``path``'s suffixes (torch picks gzip from ``.gz``)
    and starts with a dot, so globs such as ``*.csv`` never see it. It exists (empty)
    when yielded, created exclusively. ``path`` must be a regular file or nothing
    (:func:`check_output_path`), checked before the write and again before the rename.
    """
    path = Path(path)
    check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")  # remove_stale_temps reads this name
    create_temp(tmp, path)
    try:
        yield tmp
        check_output_path(path)  # something else may have been put there while we wrote
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
