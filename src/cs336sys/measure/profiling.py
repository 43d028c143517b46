"""Kernel tables from torch.profiler, for the handout's nsys_profile questions (§1.1.4).

nsys is not needed: `torch.profiler` (kineto + CUPTI) records the same device
kernels with start times, and every kernel carries the correlation id of the
CPU op that launched it. The flow is

    prof = profile_steps(step, session, steps=5, device="cuda", trace_path="t.json.gz")
    ranges, kernels = events_from_profiler(prof)
    table = attribute_kernels(ranges, kernels)       # pure, no torch

The caller wraps the phases of its step in
`torch.profiler.record_function("forward" | "backward" | "optimizer_step")`
and the attention code wraps its parts in "computing attention scores",
"computing softmax" and "final matmul" (the handout's NVTX range names).

Device kinds. On CUDA a `Kernel` is a device activity (kernel, memcpy or
memset) with its GPU start and duration. On CPU there is no device timeline,
so a `Kernel` is a CPU op with its *self* CPU time (exclusive of its child
ops, so nothing is counted twice; for `aten::addmm` the self time is the BLAS
call itself), placed at the op's start: [start, start + self time) lies inside
the op and hence inside its phase. `Kernel.device_kind` says which.

Verified on torch 2.13 (CPU build): `prof.events()` gives FunctionEvents with
`device_type`, `time_range` (µs from trace start), `id` (the kineto
correlation id), `linked_correlation_id`, `is_user_annotation` and
`self_cpu_time_total`; record_function ranges are user annotations on the
CPU. The GPU machine runs torch 2.11; where a FunctionEvent lacks
`linked_correlation_id` we read it from the raw kineto events, matched on
(start, end), which `_parse_kineto_results` copies verbatim.
"""

from __future__ import annotations

import gzip
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from cs336sys.fileio import atomic_path, create_temp
from cs336sys.measure.session import Session

if TYPE_CHECKING:  # torch is only needed to record, not to attribute
    import torch.profiler

PHASES = ("forward", "backward", "optimizer_step")
ATTENTION_RANGES = ("computing attention scores", "computing softmax", "final matmul")
RANGE_NAMES = PHASES + ATTENTION_RANGES
OTHER = "other"  # kernels outside every phase (e.g. the final synchronise)

# Which kernel names count as matrix multiplies. cuBLAS/cuBLASLt kernels are
# named *gemm*, cutlass_*, sm90_xmma_*, nvjet_* (Hopper cuBLASLt) or cublas*;
# on CPU the ops are aten::mm / addmm / bmm / matmul. "mm" is deliberately
# loose (it would also match a kernel named "...comm..."); check the table.
MATMUL_PATTERN = re.compile(r"gemm|matmul|mm|cutlass|sm90_xmma|nvjet|cublas", re.IGNORECASE)


@dataclass(frozen=True)
class Range:
    """One record_function range on the device timeline (µs from trace start)."""

    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Kernel:
    """One device kernel ("cuda"), or one CPU op's self time ("cpu")."""

    name: str
    start_us: float
    duration_us: float
    device_kind: str = "cuda"


def profile_steps(
    step_fn: Callable[[], None], session: Session, *, steps: int, device: str, trace_path: str | None
) -> torch.profiler.profile:
    """Run `step_fn` `steps` times under torch.profiler; export a chrome trace if asked."""
    with session.part("profile"):
        return _profile(step_fn, session, steps, device, trace_path)


def _profile(step_fn: Callable[[], None], session: Session, steps: int, device: str, trace_path: str | None) -> torch.profiler.profile:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step_fn()
        if device == "cuda":
            # inside the profiler: kernels still queued at exit would be cut off
            torch.cuda.synchronize()
    if device == "cuda":
        session.mark_profiled("the profile study (torch.profiler)")
    if trace_path is not None:
        export_trace(prof, trace_path)
    return prof


def export_trace(prof: torch.profiler.profile, path: str) -> None:
    """The chrome trace at ``path`` (atomically), gzipped where the name ends in ``.gz``.

    torch gzips by itself, but line by line at level 9: 2.4 s of the profile cell's 8 s on the
    H200 (two traces of ~260,000 lines). Here the JSON is written plain beside it and compressed in
    1 MiB chunks at level 1: the traces stay out of git, and the cell's time counts more than their size.
    """
    with atomic_path(path) as tmp:
        if not path.endswith(".gz"):
            prof.export_chrome_trace(str(tmp))
            return
        plain = tmp.with_name(tmp.name.removesuffix(".gz"))  # .tmp-<pid>-….json: a temp name, never a result
        try:
            create_temp(plain, Path(path))  # exclusively, as atomic_path makes tmp: a link planted there is refused
            prof.export_chrome_trace(str(plain))
            with open(plain, "rb") as src, gzip.open(tmp, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        finally:
            plain.unlink(missing_ok=True)


def _time_key(start_us: float, end_us: float) -> tuple[float, float]:
    return round(start_us, 3), round(end_us, 3)  # kineto stamps are whole ns


def _linked_ids_from_kineto(prof) -> dict[tuple[float, float], int]:
    # Fallback for torch versions whose FunctionEvent has no linked_correlation_id:
    # FunctionEvent times are (kineto ns - trace start ns) / 1000; match on them.
    results = prof.profiler.kineto_results
    t0 = results.trace_start_ns()
    return {_time_key((e.start_ns() - t0) / 1000, (e.end_ns() - t0) / 1000): e.linked_correlation_id() for e in results.events()}


def events_from_profiler(prof) -> tuple[list[Range], list[Kernel]]:
    """Phase and attention ranges placed on the device timeline, and the device kernels."""
    from torch.autograd import DeviceType

    events = list(prof.events())
    cpu_ranges = [e for e in events if e.device_type == DeviceType.CPU and e.name in RANGE_NAMES]
    # Kineto mirrors each CPU user annotation (our ranges, "Optimizer.step#AdamW.step")
    # onto the GPU as a gpu_user_annotation spanning its kernels: not a kernel, and
    # counting it would double the time. Excluded by flag, activity type and name,
    # whichever this torch version provides.
    annotations = set(RANGE_NAMES) | {e.name for e in events if e.device_type == DeviceType.CPU and getattr(e, "is_user_annotation", False)}
    device_events = [
        e
        for e in events
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and "user_annotation" not in str(getattr(e, "activity_type", "") or "")
        and e.name not in annotations
    ]

    if not device_events:  # CPU run: the CPU is the device, ranges are their own interval
        kernels = [
            Kernel(e.name, e.time_range.start, e.self_cpu_time_total, "cpu")
            for e in events
            if e.device_type == DeviceType.CPU
            and not getattr(e, "is_user_annotation", False)
            and e.name not in RANGE_NAMES
            and e.self_cpu_time_total > 0
        ]
        ranges = [Range(e.name, e.time_range.start, e.time_range.end) for e in cpu_ranges]
        return sorted(ranges, key=lambda r: r.start_us), sorted(kernels, key=lambda k: k.start_us)

    # CUDA run: launch time of each kernel = CPU start of the op whose correlation id
    # the kernel links to. Backward ops run on autograd threads, so a range owns the
    # kernels launched within its CPU interval on any thread, not only its children.
    if hasattr(device_events[0], "linked_correlation_id"):
        linked = {id(e): e.linked_correlation_id for e in events}
    else:
        by_time = _linked_ids_from_kineto(prof)
        linked = {id(e): by_time.get(_time_key(e.time_range.start, e.time_range.end), 0) for e in events}
    # Only front-end ops (linked id 0) are keys: runtime calls such as cudaLaunchKernel
    # carry CUPTI correlation ids, a different id space that can collide with op ids.
    op_start_us = {
        e.id: e.time_range.start for e in events if e.device_type == DeviceType.CPU and linked[id(e)] == 0 and e.name not in RANGE_NAMES
    }
    kernels, launches = [], []
    for e in device_events:
        kernels.append(Kernel(e.name, e.time_range.start, e.time_range.elapsed_us(), "cuda"))
        launches.append(op_start_us.get(linked[id(e)], np.nan))
    launch = np.asarray(launches, dtype=float)
    start = np.array([k.start_us for k in kernels])
    end = start + np.array([k.duration_us for k in kernels])

    # Kineto mirrors a user annotation onto the GPU timeline over the kernels it
    # launched on its own thread. The attention sub-ranges are short and launched
    # from the main thread, so their mirrors are exact; on torch 2.11 the
    # correlation route below lost the softmax range (seen on an H200). Phases
    # (backward runs on autograd threads) keep the correlation route.
    mirrored = [
        Range(e.name, e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == DeviceType.CUDA
        and e.name in ATTENTION_RANGES
        and (getattr(e, "is_user_annotation", False) or "user_annotation" in str(getattr(e, "activity_type", "") or ""))
    ]
    mirrored_names = {r.name for r in mirrored}
    ranges = list(mirrored)
    for r in cpu_ranges:
        if r.name in mirrored_names:
            continue
        inside = (launch >= r.time_range.start) & (launch <= r.time_range.end)
        if inside.any():  # a range that launched nothing has no device interval
            ranges.append(Range(r.name, float(start[inside].min()), float(end[inside].max())))
    return sorted(ranges, key=lambda r: r.start_us), sorted(kernels, key=lambda k: k.start_us)


def _overlap_us(ranges: list[Range], kernels: list[Kernel]) -> np.ndarray:
    """(kernels × ranges) overlap in µs; a zero-length kernel counts as 1e-9 µs if inside."""
    start = np.array([k.start_us for k in kernels], dtype=float)
    dur = np.array([k.duration_us for k in kernels], dtype=float)
    end = start + dur
    out = np.zeros((len(kernels), len(ranges)))
    if not kernels:
        return out
    order = np.argsort(start, kind="stable")
    sorted_start = start[order]
    max_dur = dur.max()
    for j, r in enumerate(ranges):
        # only kernels starting in [r.start - longest kernel, r.end] can overlap r
        lo = np.searchsorted(sorted_start, r.start_us - max_dur, side="left")
        hi = np.searchsorted(sorted_start, r.end_us, side="right")
        idx = order[lo:hi]
        ov = np.minimum(end[idx], r.end_us) - np.maximum(start[idx], r.start_us)
        point = (dur[idx] == 0) & (start[idx] >= r.start_us) & (start[idx] <= r.end_us)
        out[idx, j] = np.where(point, 1e-9, np.clip(ov, 0.0, None))
    return out


def kernel_phases(ranges: list[Range], kernels: list[Kernel]) -> list[str]:
    """Phase of each kernel: the phase name whose ranges overlap it most, else "other"."""
    phase_ranges = [r for r in ranges if r.name in PHASES]
    overlap = _overlap_us(phase_ranges, kernels)
    # sum the overlap per phase name (all steps' "forward" ranges count as one phase)
    per_phase = np.zeros((len(kernels), len(PHASES)))
    for j, r in enumerate(phase_ranges):
        per_phase[:, PHASES.index(r.name)] += overlap[:, j]
    best = per_phase.argmax(axis=1) if len(kernels) else np.array([], dtype=int)
    has = per_phase.max(axis=1) > 0 if len(kernels) else np.array([], dtype=bool)
    return [PHASES[b] if h else OTHER for b, h in zip(best, has)]


def attribute_kernels(ranges: list[Range], kernels: list[Kernel]) -> pd.DataFrame:
    """Kernel table per phase: phase, kernel, calls, total_us, mean_us, share_of_phase.

    Each kernel counts in full towards the one phase it overlaps most on the device
    timeline (a kernel straddling a boundary is not split), so each phase's
    `total_us` column sums to that phase's kernel time and its shares sum to 1.
    """
    columns = ["phase", "kernel", "calls", "total_us", "mean_us", "share_of_phase"]
    if not kernels:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(
        {
            "phase": kernel_phases(ranges, kernels),
            "kernel": [k.name for k in kernels],
            "duration_us": [k.duration_us for k in kernels],
        }
    )
    table = df.groupby(["phase", "kernel"], sort=False)["duration_us"].agg(calls="count", total_us="sum").reset_index()
    table["mean_us"] = table["total_us"] / table["calls"]
    phase_total = table.groupby("phase")["total_us"].transform("sum")
    table["share_of_phase"] = table["total_us"] / phase_total
    order = {p: i for i, p in enumerate(PHASES + (OTHER,))}
    table = table.assign(_o=table["phase"].map(order)).sort_values(["_o", "total_us"], ascending=[True, False], kind="stable")
    return table.drop(columns="_o").reset_index(drop=True)[columns]


def attention_subrange_table(ranges: list[Range], kernels: list[Kernel]) -> pd.DataFrame:
    """Device time of the attention sub-ranges, summed over layers and steps.

    `total_us` sums the ranges' device intervals (first kernel start to last kernel
    end, gaps included); `kernel_us` sums the kernel time inside them. A sub-range
    that never occurred has count 0 and empty times.
    """
    rows = []
    for name in ATTENTION_RANGES:
        rs = [r for r in ranges if r.name == name]
        if not rs:
            rows.append(dict(range=name, count=0, total_us=np.nan, mean_us=np.nan, kernel_us=np.nan))
            continue
        total = float(sum(r.end_us - r.start_us for r in rs))
        kernel_us = float(_overlap_us(rs, kernels).sum()) if kernels else 0.0
        rows.append(dict(range=name, count=len(rs), total_us=total, mean_us=total / len(rs), kernel_us=kernel_us))
    return pd.DataFrame(rows, columns=["range", "count", "total_us", "mean_us", "kernel_us"])
