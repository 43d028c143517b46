"""One profile cell: the harness's timing of the LM steps, then ``torch.profiler`` over a few more.

Rows are typed by ``kind``: ``timing`` (the harness's numbers for the same
cell), ``kernel`` (one row per phase × kernel: calls, total and mean GPU µs,
share of the phase) and ``subrange`` (attention's scores / softmax / final
matmul ranges). The trace is written beside the cell CSV, out of git.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from cs336sys.measure import memory, profiling
from cs336sys.measure.busy import busy_note, gpu_busy_share
from cs336sys.measure.lm_steps import LMCell, lm_steps
from cs336sys.measure.session import Session
from cs336sys.measure.timing import StepClock, time_steps


def measure(
    device: torch.device,
    context: dict,
    session: Session,
    *,
    warmup_steps: int,
    measure_steps: int,
    profile_steps: int,
    artifact_dir: str | None,  # None: no trace file
    cell_id: str,
    nsys: bool,  # the workflow's separate nsys rule reads it; nothing to do here
    **lm: Any,  # the LM settings the four LM studies share: measure.lm_steps.LMCell's fields
) -> Iterator[dict[str, Any]]:
    cell = LMCell(**lm)
    model, inputs, targets = cell.setup(device)
    device_kind = "cuda" if device.type == "cuda" else "cpu (CPU activities only: no GPU timeline)"
    steps = lm_steps(model, model, inputs, targets, cell.precision, device, cell.optimizer, {})
    timings = {}
    for mode, step in steps.items():
        context["mode"] = mode
        timings[mode] = time_steps(step, session, warmup=warmup_steps, steps=measure_steps, device=device)
    # every mode timed before any is profiled: the profiler slows each later launch (Session.check_not_profiled).
    # The busy share says whether the timing rows are host-bound (a comparison of two machines needs it).
    busy = {mode: _busy(step, device, session) for mode, step in steps.items()}
    for mode, timing in timings.items():
        for phase, stats in timing.phases.items():
            yield {
                "kind": "timing",
                "mode": mode,
                "phase": phase,
                **stats.as_row(),
                **timing.state,  # the GPU's clocks and the host probe around the timed blocks, as time_steps' other callers
                "gpu_busy_frac": busy[mode][0],
                "gpu_busy_note": busy[mode][1],
                "profiled_steps": profile_steps,
                "device_kind": device_kind,
            }
    for mode, step in steps.items():
        context["mode"] = mode
        trace = str(Path(artifact_dir) / f"{cell_id}_{mode}.json.gz") if artifact_dir else None
        prof = profiling.profile_steps(lambda: step(StepClock(device)), session, steps=profile_steps, device=device.type, trace_path=trace)
        ranges, kernels = profiling.events_from_profiler(prof)
        for rec in profiling.attribute_kernels(ranges, kernels).to_dict("records"):
            yield {
                "kind": "kernel",
                "mode": mode,
                **rec,
                "profiled_steps": profile_steps,
                "trace_path": trace or "",
                "device_kind": device_kind,
            }
        for rec in profiling.attention_subrange_table(ranges, kernels).to_dict("records"):
            yield {
                "kind": "subrange",
                "mode": mode,
                "phase": rec.pop("range"),
                **rec,
                "profiled_steps": profile_steps,
                "device_kind": device_kind,
            }
        del prof
        memory.release(device)


def _busy(step, device: torch.device, session: Session) -> tuple[float | None, str]:
    """The step's GPU busy share and why it is empty; out of memory under the profiler costs only the share."""
    try:
        share = gpu_busy_share(step, device, session)
    except torch.OutOfMemoryError:
        memory.release(device)
        return None, "not measured: out of memory under the profiler"
    return share, busy_note(share, device, session)
