"""The one memory routine: allocator statistics on CUDA, ``None`` (with a reason) elsewhere.

Peak memory is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``:
bytes held by live tensors at their highest point, not the allocator's reserved pool
(that is ``max_memory_reserved``, reported beside it where a study asks).
"""

from __future__ import annotations

import gc

import torch

NO_CUDA_REASON = "memory statistics need CUDA; this cell ran on CPU"


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_allocated_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def peak_reserved_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_reserved(device))


def allocated_bytes(device: torch.device) -> int | None:
    """Bytes held by live tensors now (host-side allocator counter: no synchronisation)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.memory_allocated(device))


def release(device: torch.device) -> None:
    """Drop cached blocks after an OOM or between parts of a cell."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def cap_memory(fraction: float | None, device: torch.device) -> None:
    """Limit this process to ``fraction`` of the GPU, to reproduce a smaller card's OOM frontier."""
    if fraction is not None and device.type == "cuda":
        # the API wants an index: a bare torch.device("cuda") is rejected ("a specified index")
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_per_process_memory_fraction(float(fraction), index)
