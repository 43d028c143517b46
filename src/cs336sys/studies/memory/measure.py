"""One memory cell: the CUDA allocator's history over a few steps of one mode.

Rows are typed by ``kind``: ``summary`` (peaks, memory before backward, one
residual-stream activation), ``timeline`` (allocated bytes over time,
downsampled), ``phase`` (step spans on the same clock) and ``allocation``
(largest allocations with the frames they come from). The raw snapshot pickle
stays beside the cell CSV (``snapshot_path``), out of git.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from cs336sys.measure import memory
from cs336sys.measure.lm_steps import LMCell, lm_steps
from cs336sys.measure.session import Session
from cs336sys.measure.timing import StepClock
from cs336sys.rows import Skip

TIMELINE_POINTS = 600  # per cell; enough for a figure, small enough for a merged CSV in git


def _downsample(timeline: pd.DataFrame, points: int) -> pd.DataFrame:
    """Keep at most ``points`` rows, taking each bin's maximum so peaks survive."""
    if len(timeline) <= points:
        return timeline
    bins = np.arange(len(timeline)) * points // len(timeline)
    idx = timeline.groupby(bins)["allocated_bytes"].idxmax()
    return timeline.loc[idx.sort_values()]


def measure(
    device: torch.device,
    context: dict,
    session: Session,  # it times nothing: the allocator's history is its measurement
    *,
    mode: str,
    warmup_steps: int,
    measure_steps: int,
    top_n: int,
    artifact_dir: str | None,  # None: the snapshot pickle goes to the working directory
    cell_id: str,
    **lm: Any,  # the LM settings the four LM studies share: measure.lm_steps.LMCell's fields
) -> Iterator[dict[str, Any]]:
    cell = LMCell(**lm)
    if device.type != "cuda":
        raise Skip("the memory study records CUDA allocator history; this machine has no CUDA")
    from cs336sys.measure import memory_snapshot as snap

    context["mode"] = mode
    model, inputs, targets = cell.setup(device)
    log: dict[str, int | None] = {}
    step = lm_steps(model, model, inputs, targets, cell.precision, device, cell.optimizer, log)[mode]
    for _ in range(warmup_steps):
        step(StepClock(device))
    memory.reset_peak(device)
    phases: list[tuple[str, float, float]] = []
    path = str(Path(artifact_dir or ".") / f"{cell_id}.pickle")
    with snap.record_history():
        for i in range(measure_steps):
            torch.cuda.synchronize(device)
            start = snap.clock_us()
            step(StepClock(device))
            torch.cuda.synchronize(device)
            phases.append((f"step {i + 1}", start, snap.clock_us()))
        snap.dump_snapshot(path)
    snapshot = snap.load_snapshot(path)
    common = {"mode": mode, "snapshot_path": path}
    yield {
        "kind": "summary",
        **common,
        "peak_mem_bytes": memory.peak_allocated_bytes(device),
        "peak_reserved_bytes": memory.peak_reserved_bytes(device),
        "mem_before_bwd_bytes": log.get("before_backward"),
        # one fp32 residual-stream activation: batch × context × d_model × 4 bytes
        "residual_activation_bytes": cell.tokens * cell.spec.d_model * 4,
        "params": model.num_parameters(),
    }
    timeline = _downsample(snap.active_timeline(snapshot), TIMELINE_POINTS)
    for rec in timeline.to_dict("records"):
        yield {"kind": "timeline", **common, **rec}
    for label, start, end in phases:
        yield {"kind": "phase", **common, "phase": label, "start_us": start, "end_us": end}
    for rank, rec in enumerate(snap.largest_allocations(snapshot, top_n=top_n).to_dict("records"), 1):
        yield {"kind": "allocation", **common, "rank": rank, **rec}
