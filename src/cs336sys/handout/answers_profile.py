"""Answers of handout §1.1.4 (profiling) and §1.1.6 (memory) from a run's tables."""

from __future__ import annotations

import pandas as pd

from cs336sys.analysis.findings import MIB
from cs336sys.handout.answers_common import (
    Note,
    Run,
    device,
    first,
    kernel_name,
    links,
    listing,
    mib,
    not_measured,
    num,
    pct,
    section,
    size_order,
)
from cs336sys.handout.lm_rows import eager_rows
from cs336sys.measure.flops import attention_core_flops

QA = list[tuple[str, str]]
# Softmax work per attention score: max, subtract, exp, sum, divide (the report's FLOP convention
# counts matmuls only; this is the usual estimate for the comparison the handout asks for).
SOFTMAX_FLOPS_PER_SCORE = 5


def _cells(run: Run) -> tuple[pd.DataFrame, pd.DataFrame, list[pd.Series]] | None:
    """The profile rows, the per-cell answers and the cells (with their axes), smallest model first."""
    prof = run.rows("profile")
    if prof is None:
        return None
    answers = run.facts("profile").answers
    if answers.empty:
        return None
    axes = prof.drop_duplicates("cell_id").set_index("cell_id")
    cells = [answers[answers["cell_id"] == cid].iloc[0] for cid in answers["cell_id"]]
    order = size_order(run, [axes.loc[c["cell_id"], "size"] for c in cells])
    cells.sort(key=lambda c: (order.index(axes.loc[c["cell_id"], "size"]), axes.loc[c["cell_id"], "context_length"]))
    return prof, axes, cells


def _label(axes: pd.DataFrame, cell: pd.Series) -> str:
    a = axes.loc[cell["cell_id"]]
    return f"{a['size']} (context {a['context_length']}, {a['precision']})"


def _profile_qa(run: Run) -> list[str]:
    found = _cells(run)
    if found is None:
        return [run.absent("profile", "`profile.grid.size`")] * 5
    prof, axes, cells = found
    # the largest cell whose training step ran: the largest one may be an OOM row with no kernels
    trained = [c for c in cells if pd.notna(c.get("forward_top_kernel"))]
    big = trained[-1] if trained else cells[-1]
    dev = device(prof)
    cpu = (
        "This run profiled CPU operators (no CUDA): their self time stands in for kernel time. "
        if str(big.get("profiler", "")).startswith("cpu")
        else ""
    )
    note = Note(prof)
    pairs = []
    for c in cells:
        timing = first(prof[prof["cell_id"] == c["cell_id"]], kind="timing", mode="inference", phase="forward")
        harness = note.ms(timing) if timing is not None else f"{num(c['inference_forward_harness_ms'])} ms"
        pairs.append(f"{_label(axes, c)}: {num(c['inference_forward_profiler_ms'])} ms profiled against {harness} timed")
    a = note.end(
        f"{cpu}On {dev}, one inference forward's kernel time in the profiler against the timing harness's median — {'; '.join(pairs)}."
    )
    a += links(section("profile"))

    compared = [c for c in cells if pd.notna(c.get("same_top_kernel"))]  # cells whose training step ran
    same = sum(bool(c["same_top_kernel"]) for c in compared)
    if pd.isna(big.get("forward_top_kernel")):
        b = not_measured("`profile.grid` with `impl: [eager]` (no training-forward kernels were recorded)")
    else:
        lead = (
            "the same kernel also leads forward+backward"
            if bool(big["same_top_kernel"])
            else f"over forward+backward a different kernel leads, {kernel_name(_full_name(prof, big['cell_id'], big['fwd+bwd_top_kernel'], ('forward', 'backward')))}"
        )
        b = (
            f"In the training forward of {_label(axes, big)}, {kernel_name(_full_name(prof, big['cell_id'], big['forward_top_kernel'], ('forward',)))} takes the most kernel time "
            f"({pct(big['its_share_of_forward'])} of the forward), invoked {num(big['its_calls_per_forward'], 3)} times per forward; "
            f"{lead} (the same kernel leads both in {same} of the {len(compared)} profiled cells whose training step ran)."
        ) + links(section("profile"), run.figure("profile", f"kernels_{big['cell_id']}"))

    nm = run.facts("profile").non_matmul
    nm = nm[nm["cell_id"] == big["cell_id"]]
    tops = [
        f"{kernel_name(_full_name(prof, big['cell_id'], r['kernel'], (r['phase'],)))} ({pct(r['share_of_phase'])} of the {p.replace('_', ' ')})"
        for p in ("forward", "backward", "optimizer_step")
        for _, r in nm[nm["phase"] == p].head(1).iterrows()
    ]
    shares = [f"{pct(1 - c['inference_matmul_share'])} for {_label(axes, c)}" for c in cells if pd.notna(c["inference_matmul_share"])]
    c_ = f"Non-matmul kernels take {listing(shares)} of an inference forward's kernel time" if shares else ""
    if tops:
        c_ += f"{'; ' if c_ else ''}the largest in {_label(axes, big)}'s training step are {listing(tops)}"
    c_ = (c_ + "." + links(section("profile"))) if c_ else not_measured("`profile` on a device with kernel traces")

    mm = [
        f"{pct(c['inference_matmul_share'])} vs {pct(c['train_matmul_share'])} for {_label(axes, c)}"
        for c in cells
        if pd.notna(c["inference_matmul_share"]) and pd.notna(c["train_matmul_share"])
    ]
    if mm:
        d = f"Matmul kernels' share of kernel time, inference forward vs whole training step: {'; '.join(mm)}." + links(section("profile"))
    else:
        d = not_measured("`profile.grid` with `modes` inference and train")

    return [a, b, c_, d, _softmax_vs_matmul(run, axes, cells)]


def _full_name(prof: pd.DataFrame, cell: str, short: str, phases: tuple) -> str:
    """The untruncated name of a kernel that ``profile_answers``/``non_matmul_kernels`` shortened for their tables:
    the training-step kernel of ``phases`` starting with ``short`` that takes the most time."""
    k = prof[(prof["cell_id"] == cell) & (prof["kind"] == "kernel") & (prof["mode"] == "train") & prof["phase"].isin(phases)]
    k = k[k["kernel"].str.startswith(str(short))]
    return str(k.groupby("kernel")["total_us"].sum().idxmax()) if len(k) else str(short)


def _softmax_vs_matmul(run: Run, axes: pd.DataFrame, cells: list[pd.Series]) -> str:
    with_ratio = [c for c in cells if pd.notna(c.get("attn_softmax_over_matmul_time"))]
    if not with_ratio:
        return not_measured("`profile.grid.impl: [eager]` (attention sub-ranges are recorded for eager attention)")
    parts, counted = [], False
    for c in with_ratio:
        size = run.sizes().get(axes.loc[c["cell_id"], "size"])
        text = f"{c['attn_softmax_over_matmul_time']:.3g}× for {_label(axes, c)}"
        if size is not None:
            d_head, counted = size.d_model // size.num_heads, True
            flops = SOFTMAX_FLOPS_PER_SCORE / attention_core_flops(1, 1, 1, d_head, causal=False)
            text += f" against a FLOP ratio of {flops:.3g} (d_head {d_head}: its time per FLOP is {c['attn_softmax_over_matmul_time'] / flops:.3g}× the matmuls')"
        parts.append(text)
    flops = (
        f", counting {SOFTMAX_FLOPS_PER_SCORE} FLOPs per score for softmax (max, subtract, exp, sum, divide) against 4·d_head for the matmuls"
        if counted
        else ""
    )
    return (
        f"Inside attention (training forward), the softmax kernels' time over the two matmuls' (QKᵀ and PV): {'; '.join(parts)}{flops}."
        + links(section("profile"))
    )


def answers_114(run: Run) -> QA:
    a, b, c, d, e = _profile_qa(run)
    return [
        ("(a) Does the profiler's forward time match the timing harness?", a),
        ("(b) Which kernel takes the most forward time, how often is it called, and does it also lead forward+backward?", b),
        ("(c) Which non-matmul kernels take non-trivial time?", c),
        ("(d) What share of time do matmuls take in an inference forward vs a training step?", d),
        ("(e) Inside attention, how does softmax time compare with matmul time, and with their FLOPs?", e),
    ]


def _memory_slice(summary: pd.DataFrame, run: Run) -> tuple[str, str, pd.DataFrame]:
    size = size_order(run, summary["size"])[-1]
    part = summary[summary["size"] == size]
    precision = "fp32" if (part["precision"] == "fp32").any() else str(part["precision"].iloc[0])
    return size, precision, part[part["precision"] == precision].sort_values("context_length")


def _peak(part: pd.DataFrame, ctx, mode: str) -> str:
    row = first(part, context_length=ctx, mode=mode)
    return mib(row["peak_mem_mib"] * MIB) if row is not None and pd.notna(row["peak_mem_mib"]) else "—"


def _memory_qa(run: Run) -> list[str]:
    mem = run.rows("memory")
    summary = run.facts("memory").summary if mem is not None else pd.DataFrame()
    if summary.empty:
        return [run.absent("memory", "`memory.grid.context_length`")] * 5
    size, precision, part = _memory_slice(summary, run)
    dev = device(mem)
    both = [c for c in part["context_length"].unique() if {"inference", "train"} <= set(part.loc[part["context_length"] == c, "mode"])]
    ctx = max(both) if both else part["context_length"].max()
    cells = {
        m: mem.loc[(mem["size"] == size) & (mem["precision"] == precision) & (mem["context_length"] == ctx) & (mem["mode"] == m), "cell_id"]
        for m in ("inference", "train")
    }
    figs = [run.figure("memory", f"timeline_{ids.iloc[0]}") for ids in cells.values() if len(ids)]
    train = first(part, context_length=ctx, mode="train")
    held = (
        f", holding {mib(train['mem_before_bwd_mib'] * MIB)} when the backward starts"
        if train is not None and pd.notna(train["mem_before_bwd_mib"])
        else ""
    )
    a = (
        f"On {dev}, {size} at context {ctx} ({precision}): an inference forward peaks at {_peak(part, ctx, 'inference')} allocated, "
        f"a training step at {_peak(part, ctx, 'train')}{held}."
    ) + links(section("memory"), *figs)
    per_ctx = [
        f"{c}: {_peak(part, c, 'inference')} forward, {_peak(part, c, 'train')} training step"
        for c in sorted(part["context_length"].unique())
    ]
    b = f"Peak allocated memory of {size} ({precision}, {dev}) per context length — {'; '.join(per_ctx)}." + links(
        section("memory"), run.figure("memory", "peak_memory")
    )
    c = _precision_memory(run, summary, size, ctx)
    res = [
        f"{mib(r['residual_activation_mib'] * MIB)} at context {r['context_length']}"
        for _, r in part.drop_duplicates("context_length").iterrows()
        if pd.notna(r["residual_activation_mib"])
    ]
    if res:
        d = f"One residual-stream activation of {size} (batch × context × d_model, fp32) is {listing(res)}." + links(section("memory"))
    else:
        d = not_measured("`memory`")
    big = run.facts("memory").largest
    lines = []
    for mode, ids in cells.items():
        top = big[big["cell_id"].isin(ids)].sort_values("rank")
        if not top.empty:
            same = int((top["size_mib"] == top["size_mib"].iloc[0]).sum())
            lines.append(
                f"in the {mode} cell the largest is {num(top['size_mib'].iloc[0])} MiB ({same} of the top {len(top)} are that size), from `{top['frames'].iloc[0]}`"
            )
    e = (
        (f"{size} at context {ctx} ({precision}): {'; '.join(lines)}." + links(section("memory")))
        if lines
        else not_measured("`memory.top_n`")
    )
    return [a, b, c, d, e]


def _precision_memory(run: Run, summary: pd.DataFrame, size: str, ctx) -> str:
    setting = "`memory.grid.precision: [fp32, bf16]`"
    rows = summary[(summary["size"] == size) & (summary["context_length"] == ctx)]
    if {"fp32", "bf16"} <= set(rows["precision"]):
        peaks = [
            f"{m}: {_peak(rows[rows['precision'] == 'fp32'], ctx, m)} in fp32, {_peak(rows[rows['precision'] == 'bf16'], ctx, m)} with bf16"
            for m in ("inference", "train")
            if (rows["mode"] == m).any()
        ]
        return f"Peak allocated memory of {size} at context {ctx}: {'; '.join(peaks)}." + links(section("memory"))
    e2e = run.rows("e2e")
    steps = eager_rows(e2e, mode="train", phase="step").dropna(subset=["peak_mem_bytes"]) if e2e is not None else pd.DataFrame()
    if steps.empty or "peak_mem_bytes" not in steps:
        return not_measured(setting)
    pairs = steps.groupby(["size", "context_length", "impl"]).filter(lambda g: {"fp32", "bf16"} <= set(g["precision"]))
    if pairs.empty:
        return not_measured(setting)
    big = size_order(run, pairs["size"])[-1]
    pairs = pairs[pairs["size"] == big]
    pick = pairs[pairs["context_length"] == pairs["context_length"].max()]
    pick = pick[pick["impl"] == ("eager" if (pick["impl"] == "eager").any() else pick["impl"].iloc[0])]
    fp32, bf16 = first(pick, precision="fp32"), first(pick, precision="bf16")
    return (
        f"The memory study measured one precision (set {setting} to compare there); from the e2e study on {device(pick)}, a training "
        f"step of {big} at context {fp32['context_length']} ({fp32['impl']} attention) peaks at {mib(fp32['peak_mem_bytes'])} in fp32 "
        f"and {mib(bf16['peak_mem_bytes'])} with bf16 autocast (fp32 parameters and optimizer state in both)." + links(section("e2e"))
    )


def answers_116(run: Run) -> QA:
    a, b, c, d, e = _memory_qa(run)
    return [
        ("(a) How does memory evolve over an inference forward vs a training step?", a),
        ("(b) What is the peak memory per context length?", b),
        ("(c) Does bf16 mixed precision change the peak?", c),
        ("(d) How large is one residual-stream activation?", d),
        ("(e) What are the largest allocations, and where do they come from?", e),
    ]
