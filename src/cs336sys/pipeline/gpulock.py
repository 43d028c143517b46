"""One measured cell at a time per GPU, across every process on the host.

Two ``snakemake`` runs (or two run names, or a run restarted after ``--unlock``) know
nothing of each other: without a host-wide lock they time kernels on one GPU at once and
get timings 9-20x off with no trace in the rows. So each cell holds an exclusive
``fcntl.flock`` on ``<lock_dir>/<gpu uuid>.lock`` while it measures; with N GPUs up to N
cells hold one each, so ``snakemake --cores N`` fills the host. flock and not a pid
file: the kernel drops the lock when its holder dies, SIGKILL and the OOM killer
included, so a dead holder never leaves a stale lock and no one guesses whether a
recorded pid still lives. The pid/host/start written in the file only informs people
and error messages. Lock files are never deleted (unlinking one that another process has
open lets two holders lock two inodes). The directory must be host-local and shared by
every run: a SLURM job or service with a private /tmp needs ``CS336SYS_LOCK_DIR``. No
torch import and no CUDA initialisation here, so the caller may still fork CUDA children.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_LOCK_DIR = "/tmp/cs336sys-gpu-locks"


@dataclass(frozen=True)
class GpuId:
    index: int  # NVML (PCI bus) index: what nvidia-smi shows, not CUDA's "fastest first" order
    uuid: str


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


def lock_dir() -> Path:
    """The host-wide lock directory: ``$CS336SYS_LOCK_DIR`` or /tmp/cs336sys-gpu-locks.

    Created world-writable and sticky (0o1777, like /tmp) so runs of other users share it
    and nobody can delete another user's lock file.
    """
    path = Path(os.environ.get("CS336SYS_LOCK_DIR") or DEFAULT_LOCK_DIR)
    try:
        path.mkdir(parents=True)
        os.chmod(path, 0o1777)  # mkdir's mode is cut by the umask
    except FileExistsError:
        pass
    return path


def _open_lock_file(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        return os.open(path, os.O_RDONLY)  # another user's file: flock works on a read-only fd too
    with contextlib.suppress(PermissionError):
        os.fchmod(fd, 0o666)  # so other users can write their holder record after us
    return fd


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "unknown holder"
    return f"pid {info['pid']} on {info.get('host')} since {info.get('start')}" if "pid" in info else "unknown holder"


@contextlib.contextmanager
def acquire_gpu(gpus: Sequence[GpuId] | None = None, *, timeout_s: float | None = None, poll_s: float = 0.2) -> Iterator[GpuLease]:
    """Hold one of ``gpus`` (default: ``visible_gpus()``) exclusively for the block.

    Tries each GPU in order without blocking, then sleeps ``poll_s`` and tries again;
    ``timeout_s`` (None: wait forever) ends the wait with a TimeoutError that names the
    GPUs and their holders. A child *forked* (not exec'd: the fd is close-on-exec) while
    the lease is held shares the lock: if the job dies, its orphan keeps the GPU locked
    until it dies too; but release() frees it for both, so stop the child first.
    """
    gpus = list(visible_gpus() if gpus is None else gpus)
    if not gpus:
        raise RuntimeError("no visible GPU to lock (CS336SYS_FAKE_GPUS=fake-0 fakes one for tests)")
    directory = lock_dir()
    fds = {gpu: _open_lock_file(directory / f"{gpu.uuid}.lock") for gpu in gpus}
    t0 = time.monotonic()
    lease = None
    try:
        while lease is None:
            for gpu, fd in fds.items():
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                lease = GpuLease(gpu.index, gpu.uuid, time.monotonic() - t0, directory / f"{gpu.uuid}.lock", fd)
                break
            if lease is None:
                if timeout_s is not None and time.monotonic() - t0 >= timeout_s:
                    held = "; ".join(f"GPU {g.index} ({g.uuid}): {_holder(directory / f'{g.uuid}.lock')}" for g in gpus)
                    raise TimeoutError(f"no GPU free after {timeout_s:.1f} s: {held}")
                time.sleep(poll_s)
    finally:
        for fd in fds.values():
            if lease is None or fd != lease._fd:
                os.close(fd)
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "waited_s": round(lease.waited_s, 3),
    }
    with contextlib.suppress(OSError):  # a read-only fd (another user's file): no record
        os.ftruncate(lease._fd, 0)
        os.pwrite(lease._fd, (json.dumps(record) + "\n").encode(), 0)
    try:
        yield lease
    finally:
        lease.release()


def _select_visible(gpus: list[GpuId], cuda_visible: str | None) -> list[GpuId]:
    """Apply CUDA_VISIBLE_DEVICES to the host's GPUs, the way the CUDA runtime does.

    Entries are NVML indices or (prefixes of) UUIDs; like CUDA, the list ends at the
    first entry that names no GPU (so "" or "-1" hides every GPU). Integer entries are
    read as NVML indices, which matches CUDA's order only under CUDA_DEVICE_ORDER=PCI_BUS_ID
    or on hosts of identical GPUs (the usual case, and what SLURM assumes).
    """
    if cuda_visible is None:
        return gpus
    chosen: list[GpuId] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if entry.isdigit():
            match = [g for g in gpus if g.index == int(entry)]
        else:
            prefix = entry if entry.startswith(("GPU-", "MIG-")) else "GPU-" + entry
            match = [g for g in gpus if g.uuid.startswith(prefix)] if entry else []
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def _nvml_gpus() -> list[GpuId] | None:
    try:
        import pynvml  # from nvidia-ml-py; talks to the driver without creating a CUDA context
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return [GpuId(i, str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))) for i in range(pynvml.nvmlDeviceGetCount())]
    except (pynvml.NVMLError, OSError):
        return None
    finally:
        with contextlib.suppress(pynvml.NVMLError, OSError):
            pynvml.nvmlShutdown()  # harmless when init failed: NVML answers "uninitialized"


def _smi_gpus() -> list[GpuId] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    try:
        return [GpuId(int(i), u.strip()) for i, u in (line.split(",") for line in out.stdout.splitlines() if line.strip())]
    except ValueError:  # not the two columns asked for: an old or broken nvidia-smi
        return None


def visible_gpus() -> list[GpuId]:
    """The GPUs this process may use, found without initialising CUDA.

    ``CS336SYS_FAKE_GPUS`` ("fake-0,fake-1") fakes them for tests; otherwise NVML, then
    nvidia-smi, filtered by CUDA_VISIBLE_DEVICES; [] when neither answers.
    """
    fake = os.environ.get("CS336SYS_FAKE_GPUS")
    if fake:
        return [GpuId(i, u.strip()) for i, u in enumerate(fake.split(",")) if u.strip()]
    gpus = _nvml_gpus()
    if gpus is None:
        gpus = _smi_gpus() or []
    return _select_visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


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
