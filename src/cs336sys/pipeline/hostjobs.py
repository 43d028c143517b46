"""Which cs336sys jobs run on this host now: rows say when another run's jobs ran beside a measurement.

The GPU lock (``pipeline.gpulock``) covers the measuring process only: another run's job
start-ups (Python, imports, the warm worker's fork), its measurements on other GPUs and
its merges still share the host's CPUs and memory bandwidth with it, and two runs in two
directories on one host slowed timings up to 68x with nothing in the rows. So every cell
job registers itself for as long as it runs (``register_job``): a record
``job-<host>-<pid>-<ns>.json`` in the lock directory, flock-held by its job (the kernel
drops the lock when the job dies, so a record nobody holds is a dead job's), naming its
run -- its working directory, which Snakemake's jobs share -- and its state. While a cell
measures, ``ConcurrencyWatch`` looks at the records about once a second; the rows'
``concurrent_jobs`` counts the jobs of *other* runs that were busy during the
measurement, ``concurrent_runs`` names those runs. A row with ``concurrent_jobs`` > 0 may
be contaminated; an empty one means no one could look (the lock directory was refused).

Records are made as the lock files are (the same checked directory, ``O_EXCL``, never
through a symlink), each written and locked under a temporary name and then renamed, so
a record under its final name is locked for exactly as long as its job lives; a reader
opens them read-only, non-blocking and without following links, and skips anything that
is not a plain file or that nobody holds. A job removes its own record at its end, and
the records its killed jobs left behind when it next registers. Not seen: jobs that do
not register (merges, plots, the warm server's own start-up) and jobs shorter than one
look. No torch import here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Iterator

from cs336sys.pipeline.gpulock import SAFE_FLAGS, LockRefused, holder_record, open_lock_dir, say

SCAN_EVERY_S = 1.0  # how often a measurement's job looks for other runs' jobs
JOB_PREFIX, JOB_SUFFIX = "job-", ".json"
RECORD_BYTES = 8192  # a record is rewritten in place, padded to this size, so it never needs truncating
MAX_RECORDS = 1000  # read per look at most: a directory stuffed with records must not load the host while it measures


class JobRegistration:
    """This job's record in the lock directory, flock-held while the job lives; ``state()`` updates it."""

    def __init__(self, dir_fd: int, fd: int, name: str, run: str) -> None:
        self._dir_fd, self._fd, self.name = dir_fd, fd, name
        self._record = holder_record(run=run[:1024], state="starting", since=time.time())

    def state(self, state: str) -> None:
        """starting | waiting (idle, queued for a GPU) | holding (measuring) | running (anything else)."""
        self._record.update(state=state, since=time.time())
        with contextlib.suppress(OSError):  # in place and padded: a reader never sees it half truncated
            os.pwrite(self._fd, json.dumps(self._record).encode().ljust(RECORD_BYTES), 0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if os.stat(self.name, dir_fd=self._dir_fd, follow_symlinks=False).st_ino == os.fstat(self._fd).st_ino:
                os.unlink(self.name, dir_fd=self._dir_fd)
        os.close(self._fd)
        os.close(self._dir_fd)


def _remove_stale_records(dir_fd: int) -> None:
    """Our own records whose jobs died without removing them (SIGKILL): nobody holds their flock."""
    for name in os.listdir(dir_fd):
        if not name.startswith(JOB_PREFIX) or not name.endswith(JOB_SUFFIX):
            continue
        with contextlib.suppress(OSError):
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | SAFE_FLAGS, dir_fd=dir_fd)
            try:
                st = os.fstat(fd)
                if st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its job lives
                    if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino == st.st_ino:
                        os.unlink(name, dir_fd=dir_fd)
            finally:
                os.close(fd)


@contextlib.contextmanager
def register_job(run: str | None = None) -> Iterator[JobRegistration | None]:
    """Register this process as a running cs336sys job of ``run`` (default: the working directory) for the block.

    The record is written and locked under a temporary name and then renamed, so a
    record under its final name is locked for exactly as long as its job lives.
    Yields None (and says why in the log) where the lock directory is refused.
    """
    token = f"{socket.gethostname().replace('/', '_')}-{os.getpid()}-{time.time_ns()}"
    tmp, name = f".{JOB_PREFIX}{token}.tmp", f"{JOB_PREFIX}{token}{JOB_SUFFIX}"
    registration = fd = None
    try:
        _, dir_fd = open_lock_dir()
        try:
            _remove_stale_records(dir_fd)
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | SAFE_FLAGS, 0o644, dir_fd=dir_fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
            registration = JobRegistration(dir_fd, fd, name, run or os.getcwd())
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


def _pid_exists(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        pass
    return True


def _live_records(dir_fd: int) -> Iterator[tuple[str, dict]]:
    """The records of the jobs of this host that live now; a record no one holds, or no plain file, is skipped."""
    host = socket.gethostname()
    names = [n for n in os.listdir(dir_fd) if n.startswith(JOB_PREFIX) and n.endswith(JOB_SUFFIX)]
    for name in names[:MAX_RECORDS]:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | SAFE_FLAGS, dir_fd=dir_fd)
        except OSError:  # a symlink, a socket, gone
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                continue  # nobody holds it: its job is gone (closing the fd drops our shared lock)
            except BlockingIOError:
                pass
            record = json.loads(os.pread(fd, RECORD_BYTES, 0))
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
        if isinstance(record, dict) and record.get("host") == host and _pid_exists(record.get("pid")):
            yield name, record


def _clean(run: object) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(run))[:1024]


class ConcurrencyWatch:
    """Which jobs of other runs were busy on this host while one measurement ran.

    Start it just before the measurement, ``look()`` while it runs (at most every
    ``SCAN_EVERY_S``), ``columns()`` at its end. Another run's job counts when a look finds
    it doing anything but waiting for a GPU, or finds that it began waiting after the
    measurement started (it started up beside it). Jobs of the same run (working
    directory) do not count: they are the sweep's own, on other GPUs. A job that lives
    less than one look apart may go unseen; jobs that do not register (merges, plots,
    the warm server's start-up) are not seen.
    """

    def __init__(self, run: str | None = None) -> None:
        self.run = _clean(run or os.getcwd())
        self.since = time.time()
        self.seen: dict[str, str] = {}
        self._next = 0.0
        try:
            _, self._dir_fd = open_lock_dir()
        except (LockRefused, OSError):
            self._dir_fd = None  # the rows say "unknown" (an empty concurrent_jobs)

    def look(self, force: bool = False) -> None:
        if self._dir_fd is None or (not force and time.monotonic() < self._next):
            return
        self._next = time.monotonic() + SCAN_EVERY_S
        with contextlib.suppress(OSError):
            for name, record in _live_records(self._dir_fd):
                run = _clean(record.get("run"))  # anyone may have written it
                busy = record.get("state") != "waiting" or not isinstance(record.get("since"), (int, float)) or record["since"] > self.since
                if run != self.run and busy:
                    self.seen[name] = run

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
