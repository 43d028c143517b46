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

Two lock files per GPU (``pipeline.lockdirs``): one in the directory every account shares
(/tmp/cs336sys-gpu-locks), which keeps two accounts apart, and one in a directory of this
account's own, which keeps this account's runs apart whatever another account does to the
shared one. A job takes its own first, then the shared one, each without blocking, and
holds the GPU only with both. The shared directory can be made by anyone, and GPU UUIDs
are public, so nothing in it is trusted. Refused, with a message that names the path and
its owner (``LockRefused``):

- a shared directory owned by another user who is not root (its owner could swap the lock
  files), one that others may write without the sticky bit (anyone could), or anything
  but a directory at its path (a symlink included);
- a lock path that is a symlink, FIFO, directory, socket or a file with more than one
  hard link: never opened through a link (``O_NOFOLLOW``), never chmodded unless we just
  created it (``O_CREAT|O_EXCL``), never truncated or written unless ``fstat`` of the
  opened file shows one plain file;
- a GPU id that would name a path outside the directory.

Where one of a GPU's two files is refused the other alone holds it, and the rows say so
(``gpu_lock = "held: this account's runs only (<why>)"``): another account that makes the
shared directory first cannot switch the lock off. A GPU with neither is left out; with
none left the caller runs unlocked (``pipeline.cells`` then writes ``gpu_lock = "none:
<reason>"`` in every row: a measurement that is most likely fine is kept and marked,
rather than lost). An administrator can make the shared directory once, root-owned:
``install -d -m 1777 -o root /tmp/cs336sys-gpu-locks``.

Waiting for a busy GPU prints its holder to the job's log every ``WAIT_LOG_EVERY_S``
seconds, and ends at ``timeout_s`` with a TimeoutError that names the holders.

The lock covers the measuring process only; what other runs do beside it is recorded by
``pipeline.hostjobs`` (job records in this account's own directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import socket
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cs336sys.pipeline.gpus import GpuId, visible_gpus
from cs336sys.pipeline.lockdirs import SAFE_FLAGS, LockRefused, kind, open_own_dir, open_shared_dir, owner, say, what

WAIT_LOG_EVERY_S = 5.0  # how often a job waiting for a GPU says who holds it


@dataclass
class GpuLease:
    index: int
    uuid: str
    waited_s: float
    path: Path  # the shared lock file where it is held, else this account's own
    note: str = "held"  # the rows' gpu_lock: "held", or "held: <which lock only> (<why>)"
    _fds: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def release(self) -> None:
        """Give the GPU back; a second call does nothing."""
        fds, self._fds = self._fds, ()
        for fd in reversed(fds):  # the shared lock first: while a job holds it, it holds its own too
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # before unlocking, so a new holder's record is never erased
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _open_existing(name: str, dir_fd: int) -> int:
    flags = SAFE_FLAGS | os.O_NONBLOCK  # a FIFO must not block the open: fstat refuses it next
    try:
        return os.open(name, os.O_RDWR | flags, dir_fd=dir_fd)
    except PermissionError:  # another user's 0644 file: flock works on a read-only fd too
        return os.open(name, os.O_RDONLY | flags, dir_fd=dir_fd)


def _open_lock_file(directory: Path, dir_fd: int, uuid: str, mode: int = 0o666) -> int:
    """``<uuid>.lock`` in ``directory``: made ``mode`` (0o666 shared: others may record after us), or opened if one plain file."""
    if not uuid or "/" in uuid or uuid.startswith("."):
        raise LockRefused(f"GPU id {uuid!r} cannot name a lock file in {directory} (no '/', no leading '.')")
    name = f"{uuid}.lock"
    for _ in range(3):
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | SAFE_FLAGS, mode, dir_fd=dir_fd)
        except FileExistsError:
            pass
        else:
            os.fchmod(fd, mode)  # the file we just made (the umask cut its mode)
            return fd
        try:
            fd = _open_existing(name, dir_fd)
        except FileNotFoundError:
            continue  # its owner removed it between our two opens: make it again
        except OSError:  # ELOOP (a symlink), EISDIR, ENXIO (a socket), ...
            raise LockRefused(f"lock file {directory / name} is {what(name, dir_fd)}: refused, not opened through it") from None
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return fd
        os.close(fd)
        raise LockRefused(f"lock file {directory / name} is {kind(st)} owned by {owner(st)}, not one plain file: refused")
    raise LockRefused(f"lock file {directory / name} keeps disappearing: refused")


# ---------------------------------------------------------------- the lease


def holder_record(**extra: object) -> dict[str, object]:
    """Who this process is, for the people and logs that read a lock file."""
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


def _shown(value: object) -> str:
    """A field of a lock file's record, which anyone may have written: letters, digits and path marks only."""
    return re.sub(r"[^A-Za-z0-9._/+:~ -]", "?", str(value))[:200]


def _holder(fd: int) -> str:
    try:  # through our fd: a path could have been swapped since
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return "unknown holder"
    if not isinstance(info, dict) or type(info.get("pid")) is not int:
        return "unknown holder"
    who = ", ".join(f"{k} {_shown(info[k])}" if k == "run" else _shown(info[k]) for k in ("user", "run") if info.get(k))
    return f"pid {info['pid']}" + (f" ({who})" if who else "") + f" on {_shown(info.get('host'))} since {_shown(info.get('start'))}"


# what a lease that holds one layer's lock alone keeps apart
ONLY = {"own": "this account's runs only", "shared": "the shared lock only"}


def _lock_files(gpus: Sequence[GpuId]) -> tuple[dict[GpuId, list[tuple[int, Path]]], dict[GpuId, str], list[str]]:
    """Each GPU's lock files, this account's own first, then the shared one; the note of a GPU that has
    one of the two (``held: <which alone> (<why>)``); and why the GPUs that have neither are left out."""
    layers, missing = [], {}
    for layer, opener, mode in (("own", open_own_dir, 0o600), ("shared", open_shared_dir, 0o666)):
        try:
            directory, dir_fd = opener()
        except LockRefused as exc:
            missing[layer] = str(exc)
        else:
            layers.append((layer, directory, dir_fd, mode))
    files: dict[GpuId, list[tuple[int, Path]]] = {}
    notes, refused = {}, []
    try:
        for gpu in gpus:
            why = dict(missing)
            for layer, directory, dir_fd, mode in layers:  # in this order in every job: none waits holding half
                try:
                    files.setdefault(gpu, []).append((_open_lock_file(directory, dir_fd, gpu.uuid, mode), directory / f"{gpu.uuid}.lock"))
                except LockRefused as exc:
                    why[layer] = str(exc)
            if not files.get(gpu):
                files.pop(gpu, None)
                refused.append("; ".join(why.values()))
            elif why:
                ((lacking, reason),) = why.items()
                notes[gpu] = f"held: {ONLY['shared' if lacking == 'own' else 'own']} ({reason})"
    except BaseException:
        for held in files.values():
            for fd, _ in held:
                os.close(fd)
        raise
    finally:
        for *_, dir_fd, _ in layers:
            os.close(dir_fd)
    return files, notes, refused


@contextlib.contextmanager
def acquire_gpu(gpus: Sequence[GpuId] | None = None, *, timeout_s: float | None = None, poll_s: float = 0.2) -> Iterator[GpuLease]:
    """Hold one of ``gpus`` (default: ``visible_gpus()``) exclusively for the block.

    A GPU is held when both its lock files are: this account's own, then the shared one
    (``pipeline.lockdirs``); where one of the two is refused, the other alone, and the
    lease's ``note`` says which and why. Tries each GPU in order without blocking, then
    sleeps ``poll_s`` and tries again, printing the holders every ``WAIT_LOG_EVERY_S``;
    ``timeout_s`` (None: wait forever) ends the wait with a TimeoutError that names the GPUs
    and their holders. A GPU with neither lock file is left out; LockRefused when none is
    left. A child *forked* (not exec'd: the fds are close-on-exec) while the lease is held
    shares the lock: if the job dies, its orphan keeps the GPU locked until it dies too;
    but release() frees it for both, so stop the child first.
    """
    gpus = list(visible_gpus() if gpus is None else gpus)
    if not gpus:
        raise RuntimeError("no visible GPU to lock (CS336SYS_FAKE_GPUS=fake-0 fakes one for tests)")
    files, notes, refused = _lock_files(gpus)
    if not files:
        raise LockRefused("; ".join(refused))
    for reason in refused:
        say(f"{reason}; that GPU is left out")
    for note in dict.fromkeys(notes.values()):
        say(note)

    def holders() -> str:
        return "; ".join(f"GPU {g.index} ({g.uuid}): {_holder(held[-1][0])}" for g, held in files.items())

    t0 = time.monotonic()
    next_note, lease = t0, None
    try:
        while lease is None:
            for gpu, held in files.items():
                got = []
                for fd, _ in held:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        break
                    got.append(fd)
                if len(got) == len(held):
                    waited = time.monotonic() - t0
                    lease = GpuLease(gpu.index, gpu.uuid, waited, held[-1][1], notes.get(gpu, "held"), tuple(got))
                    break
                for fd in got:
                    fcntl.flock(fd, fcntl.LOCK_UN)
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
        for held in files.values():
            for fd, _ in held:
                if lease is None or fd not in lease._fds:
                    os.close(fd)
    record = (json.dumps(holder_record(waited_s=round(lease.waited_s, 3))) + "\n").encode()
    for fd in lease._fds:
        with contextlib.suppress(OSError):  # a read-only fd (another user's file): no record
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
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
