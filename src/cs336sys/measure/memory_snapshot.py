"""CUDA memory snapshots for the handout's memory_profiling question (§1.1.6).

Record with

    with record_history():
        run_the_step()
        dump_snapshot("snapshot.pickle")   # inside: the history belongs to the recording

then, on any machine (no torch needed), `active_timeline` rebuilds the curve of
pytorch.org/memory_viz's "Active Memory Timeline", `plot_timeline` draws it and
`largest_allocations` lists the biggest allocations with the user code that made them.

Snapshot format (torch.cuda.memory._snapshot docstring and
torch/csrc/cuda/memory_snapshot.cpp; same keys in torch 2.11 and 2.13):
`segments` is a list of dicts with `device`, `address`, `total_size`, `stream`
and `blocks` (each with `address`, `size`, `requested_size`, `state` in
{active_allocated, active_pending_free, inactive}, `frames`); `device_traces[d]`
is the list of allocator events of device d, each with `action`, `addr`
(`device_free` instead for oom), `size`, `stream`, `frames` and `time_us`.
`time_us` is wall-clock epoch time in µs (the allocator converts its TSC stamps),
so `clock_us()` below gives phase boundaries on the same clock. Frames are
innermost first.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sysconfig
import time
from collections.abc import Iterator

import pandas as pd

from cs336sys.fileio import atomic_path

MIB = 2**20


def _require_cuda(what: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} records the CUDA caching allocator and needs a CUDA device")


@contextlib.contextmanager
def record_history(max_entries: int = 1_000_000) -> Iterator[None]:
    """Record every CUDA allocator event (with its Python stack) while the block runs."""
    _require_cuda("record_history")
    import torch

    # The history is a ring buffer of max_entries events; older ones are dropped. Python stacks
    # only: the allocation table names user code, and symbolising C++ frames made the first dump in a
    # process take 1.0-2.4 s (2.7B model, H200) where a Python-only one took 0.04-0.12 s.
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def dump_snapshot(path: str) -> None:
    """Pickle the allocator state and recorded history to `path` (call inside record_history)."""
    _require_cuda("dump_snapshot")
    import torch

    with atomic_path(path) as tmp:  # a killed job leaves no half pickle
        torch.cuda.memory._dump_snapshot(str(tmp))


def load_snapshot(path: str) -> dict:
    """The snapshot dict written by `dump_snapshot` (only load files you made: it is pickle)."""
    with open(path, "rb") as f:
        return pickle.load(f)


def clock_us() -> float:
    """Now, on the clock of the snapshot's `time_us` (epoch µs), for phase boundaries."""
    return time.time_ns() / 1000


def _blocks(snapshot: dict, device: int) -> Iterator[dict]:
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            # old snapshots have no block address: blocks tile their segment in order
            yield {**b, "address": b.get("address", addr)}
            addr += b["size"]


def active_timeline(snapshot: dict, device: int = 0) -> pd.DataFrame:
    """Allocated bytes after every alloc / free_completed event: columns time_us, allocated_bytes.

    Mirrors `process_alloc_data` in torch/utils/viz/MemoryViz.js: memory allocated
    before recording began is counted from the start, found as (a) frees of
    addresses never allocated in the trace and (b) blocks still active_allocated in
    `segments` that no traced alloc accounts for. A free counts when it completes
    (free_requested only marks it, e.g. while another stream still uses the block).
    The first row is the baseline at the first traced event; the x axis is real
    time, where memory_viz uses the event index.
    """
    traces = snapshot.get("device_traces", [])
    events = traces[device] if device < len(traces) else []
    live: dict[int, int] = {}  # addr -> size of allocations made during the trace
    baseline = 0
    steps: list[tuple[float, int]] = []  # (time_us, +/- bytes)
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            steps.append((e["time_us"], e["size"]))
        elif e["action"] == "free_completed":
            if e["addr"] in live:
                steps.append((e["time_us"], -live.pop(e["addr"])))
            else:  # allocated before recording started (or before the ring buffer wrapped)
                baseline += e["size"]
                steps.append((e["time_us"], -e["size"]))
    for b in _blocks(snapshot, device):
        if b["state"] == "active_allocated" and b["address"] not in live:
            baseline += b.get("requested_size", b["size"])

    if not events:
        return pd.DataFrame({"time_us": pd.Series(dtype=float), "allocated_bytes": pd.Series(dtype="int64")})
    times = [float(events[0]["time_us"])] + [float(t) for t, _ in steps]
    allocated = [baseline]
    for _, delta in steps:
        allocated.append(allocated[-1] + delta)
    return pd.DataFrame({"time_us": times, "allocated_bytes": pd.Series(allocated, dtype="int64")})


def plot_timeline(
    timeline: pd.DataFrame,
    path: str,
    *,
    title: str,
    phases: list[tuple[str, float, float]] | None = None,
) -> None:
    """PNG of allocated MiB against ms since the first event; phases (label, start_us, end_us)
    are shaded, on the clock of `time_us` (see `clock_us`)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    t0 = float(timeline["time_us"].iloc[0]) if len(timeline) else 0.0
    x_ms = (timeline["time_us"] - t0) / 1000
    y_mib = timeline["allocated_bytes"] / MIB
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.add_subplot()
    colors = ["#4e79a7", "#f28e2c", "#59a14f", "#e15759", "#76b7b2", "#edc949"]
    for i, (label, start_us, end_us) in enumerate(phases or []):
        lo, hi = (start_us - t0) / 1000, (end_us - t0) / 1000
        ax.axvspan(lo, hi, color=colors[i % len(colors)], alpha=0.15, lw=0)
        ax.text((lo + hi) / 2, 1.0, label, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=8)
    ax.step(x_ms, y_mib, where="post", color="black", lw=1)
    if len(timeline):
        peak = float(y_mib.max())
        ax.axhline(peak, color="gray", ls="--", lw=0.8)
        ax.annotate(
            f"peak {peak:.1f} MiB",
            (0, peak),
            xycoords=("axes fraction", "data"),
            xytext=(4, 2),
            textcoords="offset points",
            fontsize=8,
            color="gray",
        )
    ax.set_xlabel("time since first allocator event (ms)")
    ax.set_ylabel("allocated (MiB)")
    ax.set_ylim(bottom=0)
    fig.suptitle(title, fontsize=10)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")


_STDLIB = tuple({os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "platstdlib")})


def _is_user_frame(frame: dict) -> bool:
    # Python source outside torch and the standard library; C++ frames (.cpp, .h,
    # "??") and frozen modules are the allocator's and the interpreter's own.
    # site-packages may sit under the stdlib folder and may hold this package.
    name = frame["filename"]
    stdlib = name.startswith(_STDLIB) and "-packages" not in name
    return name.endswith(".py") and f"{os.sep}torch{os.sep}" not in name and not stdlib


def format_frames(frames: list[dict]) -> str:
    """'file.py:line name ← caller.py:line name …' over the first three user-code frames."""
    user = [f for f in frames if _is_user_frame(f)]
    user = user or [f for f in frames if f["filename"].endswith(".py")]
    if not user:
        return "(no Python frames recorded)"
    return " ← ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in user[:3])


def largest_allocations(snapshot: dict, top_n: int = 10, device: int = 0) -> pd.DataFrame:
    """The `top_n` largest traced allocations: time_us, size_bytes, size_mib, frames."""
    traces = snapshot.get("device_traces", [])
    events = traces[device] if device < len(traces) else []
    allocs = [e for e in events if e["action"] == "alloc"]
    # stable sort: equal sizes keep their order in time
    allocs = sorted(allocs, key=lambda e: -e["size"])[:top_n]
    return pd.DataFrame(
        {
            "time_us": pd.Series([float(e["time_us"]) for e in allocs], dtype=float),
            "size_bytes": pd.Series([e["size"] for e in allocs], dtype="int64"),
            "size_mib": pd.Series([e["size"] / MIB for e in allocs], dtype=float),
            "frames": pd.Series([format_frames(e.get("frames", [])) for e in allocs], dtype=object),
        }
    )
