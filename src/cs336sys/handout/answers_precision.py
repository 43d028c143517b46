"""Answers of handout §1.1.5 (mixed precision: accumulation, autocast dtypes, bf16 vs fp32 step time) from a run's tables."""

from __future__ import annotations

import pandas as pd

from cs336sys.analysis.findings import GRAPH_CELL, PAIRED, busy_words, why_wide
from cs336sys.analysis.tables import ok_rows, timed
from cs336sys.handout.answers_common import Note, Run, device, links, not_measured, pct, section, size_order
from cs336sys.handout.lm_rows import eager_launches, is_wide

QA = list[tuple[str, str]]


def accumulation(run: Run) -> str:
    df = run.rows("precision")
    rows = run.facts("precision").parts["accumulation"] if df is not None else pd.DataFrame()
    if rows.empty:
        return (
            run.absent("precision", "`precision.grid.part: [accumulation]`")
            if df is None
            else not_measured("`precision.grid.part: [accumulation]`")
        )
    parts = [f"{r.accumulator} += {r.summand} ends at {r.result:.7g} (error {r.abs_error:.3g})" for r in rows.itertuples()]
    best, worst = rows.loc[rows["abs_error"].idxmin()], rows.loc[rows["abs_error"].idxmax()]
    return (
        f"The handout's accumulation loop on {device(rows)}: {'; '.join(parts)}. The smallest error comes from a "
        f"{best['accumulator']} accumulator with {best['summand']} summands, the largest from {worst['accumulator']} += "
        f"{worst['summand']}." + links(section("precision"))
    )


def autocast(run: Run) -> str:
    parts = run.facts("precision").parts if run.rows("precision") is not None else {}
    kinds = [k for k in ("autocast-bf16", "autocast-fp16") if k in parts and not parts[k].empty]
    if not kinds:
        setting = "`precision.grid.part: [autocast-bf16, autocast-fp16]`"
        return run.absent("precision", setting) if not parts else not_measured(setting)
    sentences = []
    for kind in kinds:
        rows = parts[kind]
        dtypes = ", ".join(f"{r.quantity} {r.dtype}" for r in rows.itertuples())
        sentences.append(f"Under {rows['autocast_dtype'].iloc[0]} autocast on {device(rows)}: {dtypes}.")
    return " ".join(sentences) + links(section("precision"))


BF16 = {"faster": "bf16 is faster", "slower": "bf16 is slower"}


def bf16_timings(run: Run) -> str:
    df = run.rows("e2e")
    setting = "`e2e.grid.precision: [fp32, bf16]`"
    if df is None:
        return run.absent("e2e", setting)
    speed = eager_launches(run.facts("e2e").compared["precision"])
    speed = speed[speed["mode"] == "train"] if not speed.empty else speed
    if speed.empty:
        return not_measured(setting, "no cell pair differing only in precision ran")
    impl = max(speed["impl"].unique(), key=lambda i: ((speed["impl"] == i).sum(), i == "eager"))
    part = speed[speed["impl"] == impl]
    note = Note(df)
    steps = eager_launches(timed(df, mode="train", phase="step", impl=impl))
    per_size = []
    for size in size_order(run, part["size"]):
        rows = part[part["size"] == size].sort_values("context_length")
        said = []
        for _, r in rows.iterrows():
            cells = steps[(steps["size"] == size) & (steps["context_length"] == r["context_length"])]
            wide = [why_wide(c) for _, c in cells.iterrows() if is_wide(c)] if r["source"] != PAIRED else []
            said.append(f"{size} at context {r['context_length']}: {note.compared(r, **BF16, why=next((w for w in wide if w), ''))}")
        per_size += said
    paired = (part["source"] == PAIRED).all()
    how = "; paired in one process, as interleaved blocks" if paired else ""
    text = (
        f"On {device(ok_rows(df, precision='fp32'))}, fp32 training-step time / bf16-autocast training-step time "
        f"({impl} attention{how}): {'; '.join(per_size)}."
    )
    text += _bf16_gpu_time(run, impl, note, steps)
    return note.end(text) + links(section("e2e"), run.figure("e2e", "bf16_speedup"))


def _bf16_gpu_time(run: Run, impl: str, note: Note, steps: pd.DataFrame) -> str:
    """The GPU-time ratio (fp32 / bf16 of the steps replayed as CUDA graphs) and why it differs from the eager one."""
    facts = run.facts("e2e")
    gpu = eager_launches(facts.bf16_gpu)
    gpu = gpu[(gpu["mode"] == "train") & (gpu["impl"] == impl)] if not gpu.empty else gpu
    if gpu.empty:
        return ""
    per_size = []
    for size in size_order(run, gpu["size"]):
        rows = gpu[gpu["size"] == size].sort_values("context_length")
        per_size += [f"{size} at context {r['context_length']}: {note.ratio(r, **BF16)}" for _, r in rows.iterrows()]
    cells = ", from the CUDA-graph cells of the same configurations" if set(facts.gpu["gpu_source"]) == {GRAPH_CELL} else ""
    text = f" GPU time (the same steps replayed as CUDA graphs{cells}; the two cells' intervals): {'; '.join(per_size)}."
    busy = pd.to_numeric(steps.get("gpu_busy_frac", pd.Series(dtype=float)), errors="coerce").dropna()
    busy = busy[[bool(busy_words(b)) for b in busy]]  # the host-bound steps only
    if len(busy):
        text += (
            f" Where the eager step is host-bound (here the GPU was busy {pct(busy.min())}–{pct(busy.max())} of it), its time "
            "is Python's and the kernel launches', which bf16 autocast does not shorten; the GPU time shows what bf16 does "
            "to the kernels."
        )
    return text


def answers_115(run: Run) -> QA:
    return [
        ("(a) What do the accumulation loops give in each precision?", accumulation(run)),
        ("(b) Which dtype does each part of the model get under autocast?", autocast(run)),
        ("(c) How much faster is a bf16 mixed-precision step than fp32, per size?", bf16_timings(run)),
    ]
