"""One e2e cell: an inference forward and a training step of the same model and batch.

The training step's forward (with the loss), backward and optimizer step are
timed by CUDA events inside the same step and the whole step by the wall clock.
With ``cuda_graphs`` each phase is captured once and replayed: the GPU-bound time
of the same computation. Every mode also records the share of its step the GPU
was busy (``gpu_busy_frac``).

A cell first times its own configuration alone (its peak memory and busy share
come from this block, before anything else allocates; on a GPU with partners, two blocks of
at least ``measure.energy.MIN_BLOCK_S``, long enough to hold two of the energy counter's
updates: the interleaved blocks are a few steps each and run without the meter's sampler).
With partners (the study's ``Study.pairs``) it then times more, in the same process, as
interleaved blocks (``measure.interleave.time_arms``): the same step replayed as CUDA graphs (its
``gpu_*`` columns: what the GPU needs, free of the host's drift) and each partner configuration
(bf16 beside fp32, SDPA beside eager attention…), whose paired ratios become ``kind=pair`` rows;
the cell's own blocks join its first one. The busy share is profiled last, once nothing more is
timed in the process (``measure.busy``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from cs336sys.columns import GPU_TIME_PREFIX, GPU_TIME_STATS, PAIR_KIND
from cs336sys.measure import energy, memory
from cs336sys.measure.busy import busy_note, gpu_busy_share
from cs336sys.measure.flops import lm_forward_flops, phase_flops
from cs336sys.measure.interleave import ArmsTiming, time_arms
from cs336sys.measure.lm_steps import LMCell, graph_optimizer, graphed_lm_steps, lm_steps
from cs336sys.measure.session import Session
from cs336sys.measure.timing import STEP, StepClock, Timing, merge_timings, time_steps, timing_rows
from cs336sys.models.dtypes import set_matmul_precision
from cs336sys.models.optim import make_optimizer
from cs336sys.models.variants import MODES, needs_cuda
from cs336sys.rows import Skip
from cs336sys.studies import partner_name

OWN, GRAPH = "own", partner_name("cuda_graphs", True)
ENERGY_BLOCKS = 2  # per pass: the energy interval's samples (about 1 s of steps more per mode)
NO_GRAPH_ON_CPU = "GPU time needs CUDA graphs (a CUDA device)"


def measure(
    device: torch.device,
    context: dict,
    session: Session,
    *,
    compile: bool,
    cuda_graphs: bool,
    warmup_steps: int,
    measure_steps: int,
    block_steps: int | None,  # None: a cell that times no partners (warmup) interleaves no blocks
    modes: Sequence[str],
    partners: Sequence[Mapping[str, Any]],
    **lm: Any,  # the LM settings the four LM studies share: LMCell's fields
) -> Iterator[dict[str, Any]]:
    cell = LMCell(**lm)
    precision, optimizer = cell.precision, cell.optimizer
    if needs_cuda(cell.impl) and device.type != "cuda":
        raise Skip(f"attention {cell.impl!r} needs CUDA")
    if cuda_graphs and device.type != "cuda":
        raise Skip("CUDA graphs need CUDA")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    if partners and block_steps is None:
        raise ValueError("a cell that times partners needs block_steps (steps per interleaved block)")
    model, inputs, targets = cell.setup(device)
    run_model = torch.compile(model) if compile else model
    fwd = lm_forward_flops(cell.spec, cell.batch_size, cell.context_length, cell.vocab_size)
    memory_log: dict[str, int | None] = {}
    opt = None
    if cuda_graphs:
        try:
            with session.part("graph"):
                own = graphed_lm_steps(model, run_model, inputs, targets, precision, device, graph_optimizer(optimizer, model))
        except RuntimeError as exc:
            if isinstance(exc, torch.OutOfMemoryError):
                raise
            raise Skip(f"CUDA graph capture failed: {str(exc).splitlines()[0][:300]}") from exc
    else:
        opt = make_optimizer(optimizer, model.parameters())
        own = lm_steps(model, run_model, inputs, targets, precision, device, optimizer, memory_log, opt=opt)
    common = {
        "batch_size": cell.batch_size,
        "tokens": cell.tokens,
        "params": model.num_parameters(),
        "memory_note": "" if device.type == "cuda" else memory.NO_CUDA_REASON,
        # a graph needs a capturable optimizer; the course's is captured with its step size baked in
        "optimizer": f"{optimizer}-captured" if cuda_graphs else optimizer,
    }
    run = [m for m in MODES if m in modes]
    # 1. The cell's own configuration alone, as a cell without partners times it (the warm-up study's
    #    cold steps included): its rows and peak memory, before any other arm allocates.
    alone: dict[str, tuple[Timing, dict[str, Any]]] = {}
    paired: dict[str, ArmsTiming] = {}
    notes: dict[str, str] = {}
    # With partners, the interleaved blocks below sample until the target and the cell's own blocks here need
    # one (peak memory); on a GPU two, each long enough for the energy meter: interleaved blocks are not metered.
    metered = bool(partners) and device.type == "cuda"
    policy = dataclasses.replace(session.policy, target_rel=0.0, min_measure_s=0.0) if partners else session.policy
    policy = dataclasses.replace(policy, trials=ENERGY_BLOCKS, min_measure_s=energy.MIN_BLOCK_S) if metered else policy
    per_block = block_steps if partners else measure_steps
    try:
        for mode in run:
            context["mode"] = mode
            memory.reset_peak(device)
            with session.part("energy") if metered else contextlib.nullcontext():
                timing = time_steps(own[mode], session, warmup=warmup_steps, steps=per_block, device=device, policy=policy)
            extra = {"peak_mem_bytes": memory.peak_allocated_bytes(device)}
            if mode == "train":
                extra["mem_before_bwd_bytes"] = memory_log.get("before_backward")
            alone[mode] = (timing, extra)
        # 2. The arms timed beside it, interleaved: the CUDA-graph replay of the same step and the partners.
        arms, notes = _arms(own, cuda_graphs, partners, device, session, cell, model, run_model, inputs, targets, opt)
        for mode in run:
            context["mode"] = mode
            if len(arms) > 1:
                mode_arms = {name: steps[mode] for name, steps in arms.items()}  # the own arm is warm from its first block
                paired[mode] = time_arms(mode_arms, session, warmup=warmup_steps, block_steps=block_steps, device=device, warm=(OWN,))
    except torch.OutOfMemoryError:
        # a mode measured before the one that ran out keeps its rows; the runner records the OOM of this one
        failed = context.get("mode")
        memory.release(device)
        for mode in alone:
            if mode != failed:
                alone[mode][1].update(gpu_busy_frac=None, gpu_busy_note=f"not measured: {failed} ran out of memory after it")
                yield from _mode_rows(mode, alone[mode], paired.get(mode), notes, common, fwd)
        context["mode"] = failed
        raise
    # 3. The busy share last: the profiler leaves CUPTI attached to the process (kineto tears it down only with
    #    TEARDOWN_CUPTI=1), and every launch after it ran 10-45% slower on the H100 (Session.check_not_profiled).
    for mode in run:
        context["mode"] = mode
        busy = gpu_busy_share(own[mode], device, session)
        alone[mode][1].update(gpu_busy_frac=busy, gpu_busy_note=busy_note(busy, device, session))
    for mode in run:
        context["mode"] = mode
        yield from _mode_rows(mode, alone[mode], paired.get(mode), notes, common, fwd)
    memory.release(device)


def _mode_rows(
    mode: str,
    alone: tuple[Timing, dict[str, Any]],
    result: ArmsTiming | None,
    notes: Mapping[str, str],
    common: Mapping[str, Any],
    fwd: float,
) -> Iterator[dict[str, Any]]:
    """One mode's rows: its phases (with their GPU time), its paired ratios, and why a partner is missing."""
    timing, extra = alone
    if result is not None:
        timing = merge_timings(timing, result.arms[OWN])  # every timed block of the cell's own step
    extra = {"mode": mode, **common, **extra, "gpu_note": notes.get(GRAPH, "")}
    graph = result.arms.get(GRAPH) if result is not None else None
    for row in timing_rows(timing, phase_flops(fwd, mode), extra):
        yield {**row, **_gpu_columns(graph, row["phase"])}
    if result is not None:
        yield from _pair_rows(result, mode, extra["optimizer"])
    for name, note in notes.items():
        if name != GRAPH:
            yield {"kind": PAIR_KIND, "mode": mode, "phase": STEP, "pair_with": name, "pair_note": note}


def _gpu_columns(graph: Timing | None, phase: str) -> dict[str, Any]:
    stats = graph.phases.get(phase) if graph is not None else None
    if stats is None:
        return {}
    row = stats.as_row()
    return {GPU_TIME_PREFIX + k: row[k] for k in GPU_TIME_STATS}


def _pair_rows(result, mode: str, optimizer: str) -> Iterator[dict[str, Any]]:
    """One row per (partner, phase): the paired ratio own / partner (above 1: the partner is faster)."""
    for name in result.arms:
        if name == OWN:
            continue
        for phase in result.blocks[OWN]:
            if phase not in result.blocks[name]:
                continue
            ratio = result.ratio(OWN, name, phase)
            own_b, other_b = result.blocks[OWN][phase], result.blocks[name][phase]
            yield {
                "kind": PAIR_KIND,
                "mode": mode,
                "phase": phase,
                "pair_with": name,
                "ratio": ratio.median,
                "ratio_ci_low": ratio.low,
                "ratio_ci_high": ratio.high,
                "pairs": ratio.n,
                "own_ms": result.arms[OWN].phases[phase].median_ms,
                "partner_ms": result.arms[name].phases[phase].median_ms,
                "own_blocks_ms": ";".join(f"{x:.4f}" for x in own_b),
                "partner_blocks_ms": ";".join(f"{x:.4f}" for x in other_b),
                "stop_reason": result.stop_reason,
                "optimizer": optimizer,
                "pair_note": "",
            }


def _arms(
    own, cuda_graphs, partners, device, session: Session, cell: LMCell, model, run_model, inputs, targets, opt
) -> tuple[dict[str, dict[str, Callable[[StepClock], None]]], dict[str, str]]:
    """Arm name → mode → step; and arm name → why it could not be built (its rows say so)."""
    precision, optimizer = cell.precision, cell.optimizer
    arms: dict[str, dict[str, Callable[[StepClock], None]]] = {OWN: own}
    notes: dict[str, str] = {}
    if any(p.get("cuda_graphs") for p in partners) and not cuda_graphs:
        if device.type != "cuda":
            notes[GRAPH] = NO_GRAPH_ON_CPU
        else:
            try:
                with session.part("graph"):
                    arms[GRAPH] = graphed_lm_steps(
                        model, run_model, inputs, targets, precision, device, graph_optimizer(optimizer, model, opt)
                    )
            except (RuntimeError, torch.OutOfMemoryError) as exc:  # OOM is a RuntimeError: the eager rows still stand
                memory.release(device)
                why = "out of memory beside the eager step" if isinstance(exc, torch.OutOfMemoryError) else str(exc).splitlines()[0][:200]
                notes[GRAPH] = f"GPU time not measured: CUDA graph capture failed ({why})"
    for overrides in partners:
        ((axis, value),) = overrides.items()
        if axis == "cuda_graphs":
            continue
        name = partner_name(axis, value)
        if name in arms or name in notes:
            continue
        try:
            arms[name] = _partner(axis, value, device, cell, model, run_model, inputs, targets, opt)
        except Skip as exc:
            notes[name] = str(exc)
        except torch.OutOfMemoryError:
            memory.release(device)
            notes[name] = "the two arms do not fit in one process (out of memory): compare the two cells' own intervals"
    return arms, notes


def _partner(axis, value, device, cell: LMCell, model, run_model, inputs, targets, opt) -> dict[str, Callable[[StepClock], None]]:
    """The partner configuration's steps, on the same model and batch where the axis leaves the model alone."""
    precision, optimizer = cell.precision, cell.optimizer
    if axis == "precision":
        steps = lm_steps(model, run_model, inputs, targets, value, device, optimizer, {}, opt=opt)
        return {mode: _with_precision(step, value, precision) for mode, step in steps.items()}
    if axis == "compile":
        return lm_steps(model, torch.compile(model) if value else model, inputs, targets, precision, device, optimizer, {}, opt=opt)
    if axis == "impl":
        if needs_cuda(value) and device.type != "cuda":
            raise Skip(f"attention {value!r} needs CUDA")
        other = cell.build(device, impl=value)  # seeded: the same weights as the cell's own model
        return lm_steps(other, other, inputs, targets, precision, device, optimizer, {})
    raise ValueError(f"e2e cannot pair on axis {axis!r}")


def _with_precision(step: Callable[[StepClock], None], precision: str, own: str) -> Callable[[StepClock], None]:
    """Switch the matmul precision (TF32 or not) for the partner's step and back for the cell's own."""

    def run(clock: StepClock) -> None:
        set_matmul_precision(precision)
        try:
            step(clock)
        finally:
            set_matmul_precision(own)

    return run
