"""One measured cell at a time per GPU, across every process on the host.

Two ``snakemake`` runs (or two run names, or a run restarted after ``--unlock``) know
nothing of each other: without a host-wide lock they time kernels on one GPU at once and
get timings 9-20x off with no trace in the rows. So each cell holds an exclusive
``fcntl.flock`` on ``<lock_dir>/<gpu uuid>.lock`` while it measures; with N GPUs up to N
cells hold one each, so ``snakemake --cores N`` fills the host. flock and not a pid
file: the kernel drops the lock when its holder dies, SIGKILL and the OOM killer
included, so a dead holder never leaves a stale lock and no one guesses whether a
recorded pid still lives. The pid/user/run/start written in the file only informs people
and the log. Lock files are never deleted (unlinking one that another process has open
lets two holders lock two inodes). The directory must be host-local and shared by every
run: a SLURM job or service with a private /tmp needs ``CS336SYS_LOCK_DIR``. No torch
import and no CUDA initialisation here, so the caller may still fork CUDA children.

The directory (/tmp/cs336sys-gpu-locks after a reboot) can be made by anyone, and GPU
UUIDs are public, so nothing in it is trusted. Refused, with a message that names the path
and its owner (``LockRefused``):

- a lock directory owned by another user who is not root (its owner could swap the lock
  files), one that others may write without the sticky bit (anyone could), or anything
  but a directory at its path (a symlink included);
- a lock path that is a symlink, FIFO, directory, socket or a file with more than one
  hard link: never opened through a link (``O_NOFOLLOW``), never chmodded unless we just
  created it (``O_CREAT|O_EXCL``), never truncated or written unless ``fstat`` of the
  opened file shows one plain file;
- a GPU id that would name a path outside the directory.

A refused GPU is left out; with none left the caller runs unlocked (``pipeline.cells``
then writes ``gpu_lock = "none: <reason>"`` in every row: a measurement that is most
likely fine is kept and marked, rather than lost, and nobody who can create a directory
in /tmp can stop everyone's sweeps). An administrator can make the shared directory
once, root-owned: ``install -d -m 1777 -o root /tmp/cs336sys-gpu-locks``.

Waiting for a busy GPU prints its holder to the job's log every ``WAIT_LOG_EVERY_S``
seconds, and ends at ``timeout_s`` with a TimeoutError that names the holders.

The lock covers the measuring process only; what other runs do beside it is recorded by
``pipeline.hostjobs`` (job records in the same directory, checked the same way).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import socket
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cs336sys.pipeline.gpus import GpuId, find_gpus, visible_gpus  # noqa: F401  (re-exported: callers lock what they list)

DEFAULT_LOCK_DIR = "/tmp/cs336sys-gpu-locks"
WAIT_LOG_EVERY_S = 5.0  # how often a job waiting for a GPU says who holds it
# every open here: never through a symlink, never kept by an exec'd child, never a controlling terminal
SAFE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


class LockRefused(RuntimeError):
    """The lock directory or a lock file is not safe to use; the message names the path and its owner."""


@dataclass
class GpuLease:
    index: int
    uuid: str
    waited_s: float
    path: Path
    _fd: int | None = field(default=None, repr=False, compare=False)

    def release(self) -> None:
        """Give the GPU back; a second call does nothing."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # before unlocking, so a new holder's record is never erased
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def say(message: str) -> None:
    # the job's stdout and stderr are its log (pipeline.jobs.log_to)
    print(f"cs336sys gpu lock: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the directory and its files, checked


def _owner(st: os.stat_result) -> str:
    try:
        return f"{pwd.getpwuid(st.st_uid).pw_name} (uid {st.st_uid})"
    except KeyError:
        return f"uid {st.st_uid}"


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    kinds = {stat.S_ISLNK: "a symbolic link", stat.S_ISFIFO: "a fifo (named pipe)", stat.S_ISDIR: "a directory", stat.S_ISSOCK: "a socket"}
    for test, kind in kinds.items():
        if test(mode):
            return kind
    if not stat.S_ISREG(mode):
        return "a device node"
    return f"a regular file with {st.st_nlink} hard links" if st.st_nlink != 1 else "a regular file"


def _what(name: str | Path, dir_fd: int | None = None) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    return f"{_kind(st)} owned by {_owner(st)}"


def _check_dir(path: Path, st: os.stat_result) -> None:
    if st.st_uid not in (os.geteuid(), 0):
        raise LockRefused(
            f"lock directory {path} is owned by {_owner(st)}, neither you nor root: its owner could swap the lock files; "
            "have it removed, or set CS336SYS_LOCK_DIR to a directory of yours"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise LockRefused(
            f"lock directory {path} (owned by {_owner(st)}, mode {stat.S_IMODE(st.st_mode):o}) is writable by others "
            "without the sticky bit: anyone could replace its lock files; chmod +t or go-w it, or set CS336SYS_LOCK_DIR"
        )


def open_lock_dir() -> tuple[Path, int]:
    """The lock directory, made if missing, checked; its path and an fd that every later open goes through."""
    path = Path(os.environ.get("CS336SYS_LOCK_DIR") or DEFAULT_LOCK_DIR)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        made = True
        try:
            os.mkdir(path, 0o700)  # private until we hold it open and know it is ours
        except FileExistsError:
            made = False
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | SAFE_FLAGS)
    except OSError as exc:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise LockRefused(f"lock directory {path} is {_what(path)}, not a directory: refused, not followed") from None
        raise LockRefused(f"cannot use lock directory {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if made and st.st_uid == os.geteuid():
            os.fchmod(fd, 0o1777)  # like /tmp: every user's runs share it, and nobody deletes another's files
            st = os.fstat(fd)
        _check_dir(path, st)
    except BaseException:
        os.close(fd)
        raise
    return path, fd


def lock_dir() -> Path:
    """The host-wide lock directory: ``$CS336SYS_LOCK_DIR`` or /tmp/cs336sys-gpu-locks.

    Made world-writable and sticky (0o1777, like /tmp) so runs of other users share it
    and nobody can delete another user's lock file; LockRefused where it is not safe.
    """
    path, fd = open_lock_dir()
    os.close(fd)
    return path


def _open_existing(name: str, dir_fd: int) -> int:
    flags = SAFE_FLAGS | os.O_NONBLOCK  # a FIFO must not block the open: fstat refuses it next
    try:
        return os.open(name, os.O_RDWR | flags, dir_fd=dir_fd)
    except PermissionError:  # another user's 0644 file: flock works on a read-only fd too
        return os.open(name, os.O_RDONLY | flags, dir_fd=dir_fd)


def _open_lock_file(directory: Path, dir_fd: int, uuid: str) -> int:
    if not uuid or "/" in uuid or uuid.startswith("."):
        raise LockRefused(f"GPU id {uuid!r} cannot name a lock file in {directory} (no '/', no leading '.')")
    name = f"{uuid}.lock"
    for _ in range(3):
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | SAFE_FLAGS, 0o666, dir_fd=dir_fd)
        except FileExistsError:
            pass
        else:
            os.fchmod(fd, 0o666)  # the file we just made (the umask cut its mode): others may record after us
            return fd
        try:
            fd = _open_existing(name, dir_fd)
        except FileNotFoundError:
            continue  # its owner removed it between our two opens: make it again
        except OSError:  # ELOOP (a symlink), EISDIR, ENXIO (a socket), ...
            raise LockRefused(f"lock file {directory / name} is {_what(name, dir_fd)}: refused, not opened through it") from None
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return fd
        os.close(fd)
        raise LockRefused(f"lock file {directory / name} is {_kind(st)} owned by {_owner(st)}, not one plain file: refused")
    raise LockRefused(f"lock file {directory / name} keeps disappearing: refused")


# ---------------------------------------------------------------- the lease


def holder_record(**extra: object) -> dict[str, object]:
    """Who this process is, for the people and logs that read a lock file or job record."""
    return {
        "pid": os.getpid(),
        "user": _user(),
        "host": socket.gethostname(),
        "run": os.getcwd()[:1024],
        "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid with no passwd entry (a container's)
        return str(os.geteuid())


def _holder(fd: int) -> str:
    try:  # through our fd: a path could have been swapped since
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return "unknown holder"
    if not isinstance(info, dict) or "pid" not in info:
        return "unknown holder"
    who = ", ".join(f"{k} {info[k]}" if k == "run" else str(info[k]) for k in ("user", "run") if info.get(k))
    text = f"pid {info['pid']}" + (f" ({who})" if who else "") + f" on {info.get('host')} since {info.get('start')}"
    return "".join(c if c.isprintable() else "?" for c in text)[:500]  # whoever wrote it: one line in our log, not a page


@contextlib.contextmanager
def acquire_gpu(gpus: Sequence[GpuId] | None = None, *, timeout_s: float | None = None, poll_s: float = 0.2) -> Iterator[GpuLease]:
    """Hold one of ``gpus`` (default: ``visible_gpus()``) exclusively for the block.

    Tries each GPU in order without blocking, then sleeps ``poll_s`` and tries again,
    printing the holders every ``WAIT_LOG_EVERY_S``; ``timeout_s`` (None: wait forever)
    ends the wait with a TimeoutError that names the GPUs and their holders. A GPU whose
    lock file is refused is left out; LockRefused when none is left. A child *forked*
    (not exec'd: the fd is close-on-exec) while the lease is held shares the lock: if
    the job dies, its orphan keeps the GPU locked until it dies too; but release() frees
    it for both, so stop the child first.
    """
    gpus = list(visible_gpus() if gpus is None else gpus)
    if not gpus:
        raise RuntimeError("no visible GPU to lock (CS336SYS_FAKE_GPUS=fake-0 fakes one for tests)")
    directory, dir_fd = open_lock_dir()
    fds: dict[GpuId, int] = {}
    refused = []
    try:
        for gpu in gpus:
            try:
                fds[gpu] = _open_lock_file(directory, dir_fd, gpu.uuid)
            except LockRefused as exc:
                refused.append(str(exc))
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    finally:
        os.close(dir_fd)
    if not fds:
        raise LockRefused("; ".join(refused))
    for reason in refused:
        say(f"{reason}; that GPU is left out")

    def holders() -> str:
        return "; ".join(f"GPU {g.index} ({g.uuid}): {_holder(fd)}" for g, fd in fds.items())

    t0 = time.monotonic()
    next_note, lease = t0, None
    try:
        while lease is None:
            for gpu, fd in fds.items():
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                lease = GpuLease(gpu.index, gpu.uuid, time.monotonic() - t0, directory / f"{gpu.uuid}.lock", fd)
                break
            if lease is not None:
                break
            now = time.monotonic()
            if timeout_s is not None and now - t0 >= timeout_s:
                raise TimeoutError(f"no GPU free after {now - t0:.1f} s: {holders()}")
            if now >= next_note:
                limit = f" of at most {timeout_s:g} s" if timeout_s is not None else ""
                say(f"waiting for a GPU ({now - t0:.0f} s so far{limit}): {holders()}")
                next_note += WAIT_LOG_EVERY_S
            time.sleep(poll_s if timeout_s is None else max(0.0, min(poll_s, t0 + timeout_s - now)))
    finally:
        for fd in fds.values():
            if lease is None or fd != lease._fd:
                os.close(fd)
    with contextlib.suppress(OSError):  # a read-only fd (another user's file): no record
        os.ftruncate(lease._fd, 0)
        os.pwrite(lease._fd, (json.dumps(holder_record(waited_s=round(lease.waited_s, 3))) + "\n").encode(), 0)
    try:
        yield lease
    finally:
        lease.release()


# ---------------------------------------------------------------- the GPUs


def pin_environment(lease: GpuLease) -> dict[str, str]:
    """Environment variables that confine a child to the leased GPU.

    CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises, so these must be in the
    child's environment before it touches CUDA (pass them to the spawn, or set them in
    os.environ before the first torch.cuda call). A real GPU is named by UUID, which
    does not depend on CUDA's enumeration order; a fake one (tests) by its index.
    CS336SYS_GPU_INDEX is the NVML index, for gpu_state() in the child.
    """
    real = lease.uuid.startswith(("GPU-", "MIG-"))
    return {
        "CUDA_VISIBLE_DEVICES": lease.uuid if real else str(lease.index),
        "CS336SYS_GPU_INDEX": str(lease.index),
        "CS336SYS_GPU_UUID": lease.uuid,
    }


def lease_columns(lease: GpuLease) -> dict[str, object]:
    """The row columns recording which GPU a cell held and how long it queued for it."""
    return {"gpu_index": lease.index, "gpu_uuid": lease.uuid, "gpu_wait_s": round(lease.waited_s, 3)}
