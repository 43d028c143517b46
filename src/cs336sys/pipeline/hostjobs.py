"""Which cs336sys jobs run on this host now: rows say when another run's jobs ran beside a measurement.

The GPU lock (``pipeline.gpulock``) covers the measuring process only: another run's job
start-ups (Python, imports, the warm worker's fork), its measurements on other GPUs and
its merges still share the host's CPUs and memory bandwidth with it, and two runs on one
host slowed timings up to 68x with nothing in the rows. So every cell job registers
itself for as long as it runs (``register_job``): a record ``job-<host>-<pid>-<ns>.json``
in this account's own lock directory (``pipeline.lockdirs``: 0700, each record 0600),
flock-held by its job (the kernel drops the lock when the job dies, so a record nobody
holds is a dead job's), naming its run -- the run's name and its working directory, so
two runs of one checkout are two runs -- and its state. While a cell measures,
``ConcurrencyWatch`` looks about once a second; the rows' ``concurrent_jobs`` counts the
jobs of *other* runs that were busy during the measurement, ``concurrent_runs`` names
those runs. A row with ``concurrent_jobs`` > 0 may be contaminated; an empty one means
no one could look (this account has no lock directory of its own).

Another account's records are never read: they could say anything, as often as their
writer likes. What another account does counts only where the kernel says so: a look
also finds this host's other GPUs whose shared lock is held while this account's own
lock of that GPU is free -- another account's job measuring there (``a job of another
account on GPU <n>``). Only fields of known types, checked, reach a row; a look reads at
most ``MAX_ENTRIES`` names and records of exactly ``RECORD_BYTES``. A job removes its own
record at its end, and the records its killed jobs left behind when it next registers.
Not seen: jobs that do not register (merges, plots, the warm server's own start-up), jobs
shorter than one look, and another account's jobs that hold no GPU. No torch import here.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import math
import os
import re
import socket
import stat
import time
from collections.abc import Iterator, Sequence

from cs336sys.fileio import pid_alive
from cs336sys.pipeline.gpus import GpuId
from cs336sys.pipeline.lockdirs import SAFE_FLAGS, LockRefused, open_own_dir, open_shared_dir, say

SCAN_EVERY_S = 1.0  # how often a measurement's job looks for other runs' jobs
JOB_PREFIX, JOB_SUFFIX = "job-", ".json"
RECORD_BYTES = 2048  # a record is rewritten in place, padded to this size, so it never needs truncating
MAX_ENTRIES = 256  # names read per look at most: a look must stay cheap whatever the directory holds
STATES = ("starting", "waiting", "holding", "running")
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}")  # the config's `run` (schema: $defs/name)
_UNSAFE = re.compile(r"[^A-Za-z0-9._/+~ -]")


def run_name(value: object) -> str:
    """``value`` where it is a run name (letters, digits, '.', '+', '-'), else ""."""
    return value if isinstance(value, str) and RUN_NAME.fullmatch(value) else ""


def _label(run: str, directory: str) -> str:
    """How a row names a run: its name and working directory, in letters, digits and path marks only."""
    where = _UNSAFE.sub("?", directory)[:300]
    return f"{run} ({where})" if run else where


class JobRegistration:
    """This job's record in this account's lock directory, flock-held while the job lives; ``state()`` updates it."""

    def __init__(self, dir_fd: int, fd: int, name: str, run: str) -> None:
        self._dir_fd, self._fd, self.name = dir_fd, fd, name
        self._record = {"pid": os.getpid(), "host": socket.gethostname(), "run": run, "dir": os.getcwd()[:1024]}

    def state(self, state: str) -> None:
        """starting | waiting (idle, queued for a GPU) | holding (measuring) | running (anything else)."""
        self._record.update(state=state, since=time.time())
        with contextlib.suppress(OSError):  # in place and padded: a reader never sees it half truncated
            os.pwrite(self._fd, json.dumps(self._record).encode()[:RECORD_BYTES].ljust(RECORD_BYTES), 0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if os.stat(self.name, dir_fd=self._dir_fd, follow_symlinks=False).st_ino == os.fstat(self._fd).st_ino:
                os.unlink(self.name, dir_fd=self._dir_fd)
        os.close(self._fd)
        os.close(self._dir_fd)


def _names(dir_fd: int) -> list[str]:
    """The record names among the first ``MAX_ENTRIES`` entries of the directory."""
    with os.scandir(dir_fd) as entries:
        return [e.name for e in itertools.islice(entries, MAX_ENTRIES) if e.name.startswith(JOB_PREFIX) and e.name.endswith(JOB_SUFFIX)]


def _open_record(name: str, dir_fd: int) -> int | None:
    """A record opened read-only, where it is one plain file of ours of the record size; else None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | SAFE_FLAGS, dir_fd=dir_fd)
    except OSError:  # a symlink, a socket, gone
        return None
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size == RECORD_BYTES:
        return fd
    os.close(fd)
    return None


def _held(fd: int) -> bool:
    """Whether another open file holds a lock on ``fd``'s file (a shared lock of ours for a moment tells)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _lock_held(name: str, dir_fd: int) -> bool:
    """Whether the lock file ``name`` (one plain file, never through a link) is held now."""
    if "/" in name or name.startswith("."):
        return False
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | SAFE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and _held(fd)
    finally:
        os.close(fd)


def _remove_stale_records(dir_fd: int) -> None:
    """Our records whose jobs died without removing them (SIGKILL): nobody holds their flock."""
    for name in _names(dir_fd):
        fd = _open_record(name, dir_fd)
        if fd is None:
            continue
        with contextlib.suppress(OSError):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its job lives
                if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    os.unlink(name, dir_fd=dir_fd)
            finally:
                os.close(fd)


@contextlib.contextmanager
def register_job(run: str | None = None) -> Iterator[JobRegistration | None]:
    """Register this process as a running cs336sys job of ``run`` (a run name; its working directory too) for the block.

    The record is written and locked under a temporary name and then renamed, so a
    record under its final name is locked for exactly as long as its job lives.
    Yields None (and says why in the log) where this account has no lock directory.
    """
    token = f"{socket.gethostname().replace('/', '_')}-{os.getpid()}-{time.time_ns()}"
    tmp, name = f".{JOB_PREFIX}{token}.tmp", f"{JOB_PREFIX}{token}{JOB_SUFFIX}"
    registration = fd = None
    try:
        _, dir_fd = open_own_dir()
        try:
            _remove_stale_records(dir_fd)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | SAFE_FLAGS, 0o600, dir_fd=dir_fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
            registration = JobRegistration(dir_fd, fd, name, run_name(run))
            registration.state("starting")
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            registration = None
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                os.close(fd)
            os.close(dir_fd)
            raise
    except (LockRefused, OSError) as exc:
        say(f"this job is not registered, so its rows cannot count other runs beside them: {exc}")
        registration = None
    try:
        yield registration
    finally:
        if registration is not None:
            registration.close()


def _checked(record: object, host: str) -> tuple[str, str, str, float] | None:
    """(run, working directory, state, since) of a well-formed record of a live job of this host; else None."""
    if not isinstance(record, dict) or record.get("host") != host:
        return None
    pid, run, where, state, since = (record.get(k) for k in ("pid", "run", "dir", "state", "since"))
    if type(pid) is not int or pid <= 0 or not pid_alive(pid) or state not in STATES:
        return None
    if not isinstance(where, str) or not where.startswith("/") or not isinstance(since, (int, float)) or not math.isfinite(since):
        return None
    return run_name(run), where, state, float(since)


def _live_records(dir_fd: int) -> Iterator[tuple[str, tuple[str, str, str, float]]]:
    """The records of this account's jobs of this host that live now; a record no one holds, or no plain file, is skipped."""
    host = socket.gethostname()
    for name in _names(dir_fd):
        fd = _open_record(name, dir_fd)
        if fd is None:
            continue
        try:
            if not _held(fd):
                continue  # nobody holds it: its job is gone
            record = _checked(json.loads(os.pread(fd, RECORD_BYTES, 0)), host)
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
        if record is not None:
            yield name, record


class ConcurrencyWatch:
    """Which jobs of other runs were busy on this host while one measurement ran.

    Start it just before the measurement, ``look()`` while it runs (at most every
    ``SCAN_EVERY_S``), ``columns()`` at its end. ``run``: this job's run name; ``gpus``:
    this host's GPUs, of which ``holding`` (this job's) is left out. Another run's job counts
    when a look finds it doing anything but waiting for a GPU, or finds that it began
    waiting after the measurement started (it started up beside it). Jobs of the same run
    (name and working directory) do not count: they are the sweep's own, on other GPUs.
    Another account's job counts where it holds one of ``gpus`` (module docstring).
    """

    def __init__(self, run: str | None = None, gpus: Sequence[GpuId] = (), holding: str | None = None) -> None:
        self.run = (run_name(run), os.getcwd()[:1024])  # as JobRegistration records it
        self.since = time.time()
        self.seen: dict[str, str] = {}
        self._next = 0.0
        self._others = [gpu for gpu in gpus if gpu.uuid != holding]
        try:
            _, self._dir_fd = open_own_dir()
        except (LockRefused, OSError):
            self._dir_fd = None  # the rows say "unknown" (an empty concurrent_jobs)

    def look(self, force: bool = False) -> None:
        if self._dir_fd is None or (not force and time.monotonic() < self._next):
            return
        self._next = time.monotonic() + SCAN_EVERY_S
        with contextlib.suppress(OSError):
            for name, (run, where, state, since) in _live_records(self._dir_fd):
                if (run, where) != self.run and (state != "waiting" or since > self.since):
                    self.seen[name] = _label(run, where)
        if self._others:
            with contextlib.suppress(LockRefused, OSError):
                _, shared_fd = open_shared_dir()
                try:  # this account's jobs take their own lock of a GPU before the shared one, and free it after
                    for gpu in self._others:
                        if _lock_held(f"{gpu.uuid}.lock", shared_fd) and not _lock_held(f"{gpu.uuid}.lock", self._dir_fd):
                            self.seen[f"gpu:{gpu.uuid}"] = f"a job of another account on GPU {gpu.index}"
                finally:
                    os.close(shared_fd)

    def columns(self) -> dict[str, object]:
        """A last look, then the row columns: ``concurrent_jobs`` (None: could not look) and ``concurrent_runs``."""
        if self._dir_fd is None:
            return {"concurrent_jobs": None, "concurrent_runs": ""}
        self.look(force=True)
        os.close(self._dir_fd)
        self._dir_fd = None
        runs = sorted(set(self.seen.values()))
        more = f"; and {len(runs) - 3} more" if len(runs) > 3 else ""
        return {"concurrent_jobs": len(self.seen), "concurrent_runs": "; ".join(runs[:3]) + more}
