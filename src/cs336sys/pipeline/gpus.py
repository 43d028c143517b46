"""The GPUs this process may use, found without initialising CUDA (NVML, then nvidia-smi).

No torch here: the workflow's parse and the cell job list GPUs before any CUDA
context exists, so the measuring child can still be forked.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuId:
    index: int  # NVML (PCI bus) index: what nvidia-smi shows, not CUDA's "fastest first" order
    uuid: str


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


def find_gpus() -> tuple[list[GpuId], str]:
    """The GPUs this process may use, found without initialising CUDA, and why there are none ("" if some).

    ``CS336SYS_FAKE_GPUS`` ("fake-0,fake-1") fakes them for tests; otherwise NVML, then
    nvidia-smi, filtered by CUDA_VISIBLE_DEVICES. A MIG slice (``MIG-…``) is not locked:
    NVML lists whole GPUs, and slices of one GPU are meant to run side by side.
    """
    fake = os.environ.get("CS336SYS_FAKE_GPUS")
    if fake:
        return [GpuId(i, u.strip()) for i, u in enumerate(fake.split(",")) if u.strip()], ""
    gpus = _nvml_gpus()
    if gpus is None:
        gpus = _smi_gpus()
    if gpus is None:
        return [], "no GPU could be listed (NVML and nvidia-smi failed)"
    if not gpus:
        return [], "no GPU on this host (NVML or nvidia-smi lists none)"
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    chosen = _select_visible(gpus, cuda_visible)
    if chosen:
        return chosen, ""
    if (cuda_visible or "").strip().startswith("MIG-"):
        return [], f"MIG device (CUDA_VISIBLE_DEVICES={cuda_visible!r}): a slice of a GPU is not locked"
    return [], f"CUDA_VISIBLE_DEVICES={cuda_visible!r} names none of this host's GPUs"


def visible_gpus() -> list[GpuId]:
    """The GPUs this process may use (``find_gpus`` without the reason); [] when none."""
    return find_gpus()[0]
