"""Answers of handout §1.1.3 (end-to-end timing, warm-up, the fastest configuration per size) from a run's tables."""

from __future__ import annotations

import math

import pandas as pd

from cs336sys.analysis.energy import power_capped
from cs336sys.analysis.findings import GRAPH_CELL, NOT_SEPARATED, PAIRED, REPLAY, SEPARATED, busy_words, stopped_on_budget, why_wide
from cs336sys.analysis.markdown import is_empty, md_table
from cs336sys.analysis.tables import ok_rows, timed
from cs336sys.handout.answers_common import Note, Run, device, first, links, listing, not_measured, num, pct, section, size_order, times
from cs336sys.handout.lm_rows import Slice, eager_launches, forward_backward, is_wide, same_slice

QA = list[tuple[str, str]]
# where the GPU times of a slice came from, where they all came from one place (the e2e facts' `gpu_source`)
GPU_FROM = {frozenset({REPLAY}): " in the same process", frozenset({GRAPH_CELL}): ", from the CUDA-graph cell of the same configuration"}


def timing_per_size(run: Run, found: Slice | None) -> str:
    if found is None:
        return run.absent("e2e", "`e2e.grid.size`")
    part, gpu, key = found.part, found.gpu, found.key
    note = Note(part)
    per_size, overhead, wide, source = [], [], {}, set()
    for size in size_order(run, part["size"]):
        shown, extra = [], []
        for phase in ("forward", "backward"):
            row, replay = first(part, size=size, phase=phase), first(gpu, size=size, phase=phase) if not gpu.empty else None
            if row is None:
                continue
            shown.append(f"{phase} {note.ms(row)}" + (f" (GPU {note.ms(replay)})" if replay is not None else ""))
            if replay is not None:
                source.add(replay["gpu_source"])
                extra.append(f"{num(float(row['median_ms']) - float(replay['median_ms']))} ms of the {phase}")
            why = why_wide(row) if is_wide(row) else ""
            if why:
                wide.setdefault(why, []).append(f"{size} {phase}")
        per_size.append(f"{size}: {', '.join(shown)}")
        if extra:
            overhead.append(f"{size} {listing(extra)}")
    gpu_words = f"; GPU: the same phase replayed as a CUDA graph{GPU_FROM.get(frozenset(source), '')}" if source else ""
    text = f"On {device(part)} ({found.where}), a training step's forward and backward take (eager wall time [95% interval]{gpu_words}) — {'; '.join(per_size)}."
    if overhead:
        text += f" Host overhead (eager − GPU: Python, kernel launches and the gaps between them): {'; '.join(overhead)}."
    if wide:
        said = [f"{listing(rows)} ({why})" for why, rows in wide.items()]
        text += f" Wide eager intervals: {'; '.join(said)}" + (" — the GPU time is the same work without the host." if source else ".")
    text += _backward_forward_ratios(run, found, note) + _power_capped(run)
    return note.end(text) + links(section("e2e"), run.figure("e2e", f"times_impl-{key[2]}"))


def _backward_forward_ratios(run: Run, found: Slice, note: Note) -> str:
    """ " Backward / forward: GPU time …; eager wall time …" for the slice of §1.1.3(a)."""
    text, facts, key, part = "", run.facts("e2e"), found.key, found.part
    from_gpu = same_slice(facts.backward_forward_gpu, key) if not found.gpu.empty else pd.DataFrame()
    if not from_gpu.empty:
        text += f" Backward / forward, GPU time: {listing([f'{s} {note.ratio(first(from_gpu, size=s))}' for s in size_order(run, from_gpu['size'])])}"
    eager = same_slice(facts.backward_forward, key)
    shown = []
    for size in size_order(run, eager["size"]) if not eager.empty else []:
        rows = part[part["size"] == size]
        worst = rows.sort_values("ci_rel", ascending=False).iloc[0] if "ci_rel" in rows and len(rows) else None
        why = why_wide(worst) if worst is not None and is_wide(worst) else ""
        budget = "stop_reason" in rows and rows["stop_reason"].map(stopped_on_budget).any()
        shown.append(f"{size} {note.ratio(first(eager, size=size), budget=budget, why=why)}")
    if shown:
        text += ("; eager wall time: " if text else " Backward time / forward time: ") + listing(shown)
    return text + "." if text else ""


def _power_capped(run: Run) -> str:
    """ " The 2.7B bf16 training step (…) is power-capped: 683 W, 312 J per step [300, 325]." where NVML said so at the end of timing."""
    steps = timed(run.rows("e2e"), phase="step")
    if "size" in steps:
        order = size_order(run, steps["size"])
        steps = steps.sort_values("size", key=lambda s: s.map(order.index), kind="stable")
    said = power_capped(steps)
    if not said:
        return ""
    text = "; ".join(said[:4]) + (f"; and {len(said) - 4} more step rows" if len(said) > 4 else "")
    return f" {text[0].upper()}{text[1:]}."


STOP_WORDS = {
    "target": "the interval met its target, `target_rel`",
    "budget": "the time budget, `max_measure_s`, ran out first",
    "fixed": "the configured number of trials, no target",
}


def _sampling(rows: pd.DataFrame) -> str:
    """How many trials (timed blocks) each row took, grouped by why sampling stopped; "" where the run did not record it."""
    if "stop_reason" not in rows or rows["stop_reason"].isna().all() or "trials" not in rows:
        return ""
    trials = pd.to_numeric(rows["trials"], errors="coerce")
    why = rows["stop_reason"].map(lambda r: "budget" if stopped_on_budget(r) else "target" if "target" in str(r) else "fixed")
    groups = []
    for reason, words in STOP_WORDS.items():
        mine = rows[(why == reason) & trials.notna()]
        if mine.empty:
            continue
        t = trials[mine.index].astype(int)
        if len(rows) <= 8 and {"size", "phase"} <= set(rows):  # few rows: each one
            said = listing([f"{r['size']} {r['phase']} {n}" for (_, r), n in zip(mine.iterrows(), t)])
        else:
            said = f"{len(mine)} rows, {t.min()}–{t.max()}" if t.nunique() > 1 else f"{len(mine)} rows, {t.iloc[0]} each"
        groups.append(f"{said} ({words})")
    passes = pd.to_numeric(rows.get("passes", pd.Series(dtype=float)), errors="coerce").dropna()
    over = f", over {int(passes.max())} passes" if len(passes) and passes.max() > 1 else ""
    text = f"trials (timed blocks of steps) per row{over}, by why sampling stopped: {'; '.join(groups)}"
    spread = [x for x in (_pass_spread(r) for _, r in rows.iterrows() if is_wide(r)) if x > 0]
    if spread and (why != "budget").any():  # each pass met its target, yet the merged row is wide: the passes disagree
        text += (
            f". The passes disagree (their medians differ by up to {pct(max(spread))}: the host drifted between them), "
            "which widens the merged intervals"
        )
    return text


def _pass_spread(row: pd.Series) -> float:
    """Largest / smallest pass median − 1 (0 with one pass)."""
    medians = [float(x) for x in str(row.get("pass_medians_ms") or "").split(";") if x.strip() and x != "nan"]
    return max(medians) / min(medians) - 1 if len(medians) > 1 and min(medians) > 0 else 0.0


def _rel(rows: pd.DataFrame) -> pd.Series:
    """Each row's interval half-width over its median."""
    low, high, med = (pd.to_numeric(rows[c], errors="coerce") for c in ("ci_low_ms", "ci_high_ms", "median_ms"))
    return ((high - low) / 2 / med).dropna()


def variability(run: Run, found: Slice | None) -> str:
    if found is None:
        return run.absent("e2e", "`e2e.grid.size`")
    part, dev, where = found.part, device(found.part), found.where
    cv = (part["std_ms"] / part["mean_ms"]).dropna() if {"std_ms", "mean_ms"} <= set(part) else pd.Series(dtype=float)
    if cv.empty:
        return not_measured("`e2e`", "no step-time spread was recorded")
    warm = part["warmup_steps_run"].dropna() if "warmup_steps_run" in part else pd.Series(dtype=float)
    steps = (run.config.get("e2e") or {}).get("warmup_steps")
    trials = part["trials"].dropna() if "trials" in part else pd.Series(dtype=float)
    if len(warm) and len(trials):
        after = f"With {int(trials.max())} timed blocks (trials) after {int(warm.max())} warm-up steps in all"
    else:
        after = f"After {steps} warm-up steps" if steps is not None else "After warm-up"
    n = part["n"].dropna() if "n" in part else pd.Series(dtype=float)
    count = f"{int(n.min())}–{int(n.max())} " if n.nunique() > 1 else f"{int(n.iloc[0])} " if len(n) else ""
    text = (
        f"{after}, the standard deviation of the {count}timed steps is "
        f"{pct(cv.min())}–{pct(cv.max())} of their mean across the forward and backward rows of §1.1.3(a) ({dev}, {where})"
    )
    note = Note(part)
    if "ci_rel" in part and part["ci_rel"].notna().any():
        text += f"; the 95% interval of each median is within ±{pct(part['ci_rel'].min())}–{pct(part['ci_rel'].max())} of it"
    else:
        note.bare = True
    flags = [
        f"{int(part[c].fillna(False).astype(bool).sum())} of {len(part)} rows are flagged `{c}`"
        for c in ("noisy", "host_bound")
        if c in part
    ]
    if flags:
        text += f" ({listing(flags)})"
    text += "."
    sampling = _sampling(part) if "stop_reason" in part and part["stop_reason"].notna().any() else ""
    if sampling:
        text += f" {sampling[0].upper()}{sampling[1:]}."
    busy = [busy_words(b) for b in part.get("gpu_busy_frac", pd.Series(dtype=float)).dropna()]
    busy_share = pd.to_numeric(part.get("gpu_busy_frac", pd.Series(dtype=float)), errors="coerce").dropna()
    if any(busy) and len(busy_share):
        text += (
            f" The eager steps are host-bound (the GPU was busy {pct(busy_share.min())}–{pct(busy_share.max())} of the step): "
            "their time is Python's and the kernel launches' as much as the GPU's, and moves as the host drifts."
        )
    gpu = found.gpu[found.gpu["phase"].isin(["forward", "backward"])] if not found.gpu.empty else found.gpu
    rel = _rel(gpu) if not gpu.empty else pd.Series(dtype=float)
    if len(rel):
        span = pct(rel.max()) if pct(rel.min()) == pct(rel.max()) else f"{pct(rel.min())}–{pct(rel.max())}"
        trials = pd.to_numeric(gpu.get("trials", pd.Series(dtype=float)), errors="coerce").dropna()
        took = f", {int(trials.min())}–{int(trials.max())} trials per row" if len(trials) else ""
        text += f" The same phases replayed as CUDA graphs (GPU time) have intervals within ±{span} of their median{took}."
    return note.end(text) + links(section("e2e"))


def warmup_answer(run: Run) -> str:
    df = run.rows("warmup")
    setting = "`warmup.grid.warmup_steps: [0, 1, 2, 5]`"
    if df is None:
        return run.absent("warmup", setting)
    rows = ok_rows(df).dropna(subset=["median_ms"])
    if rows["warmup_steps"].nunique() < 2:
        return not_measured(f"two or more values of {setting}")
    effect = run.facts("warmup").effect
    few, many = rows["warmup_steps"].min(), rows["warmup_steps"].max()
    plain = rows[rows["compile"] == 0] if "compile" in rows and (rows["compile"] == 0).any() else rows
    step = plain[(plain["mode"] == "train") & (plain["phase"] == "step")]
    mean = step.groupby("warmup_steps")["mean_ms"].mean()
    slowest = step.groupby("warmup_steps")["max_ms"].mean() if "max_ms" in step else mean * float("nan")
    eff = first(effect, compile=plain["compile"].iloc[0], mode="train", phase="step") if "compile" in plain else None
    if eff is None or few not in mean or many not in mean:
        return not_measured(f"{setting} with `modes: [inference, train]`")
    note = Note(df)
    cell = step.iloc[0]
    median = note.ratio(eff.rename({"median_ratio": "ratio"}))
    why = (
        " (one-off costs of the first steps, such as library initialisation and allocator growth, land in the timed steps)"
        if mean[few] > mean[many]
        else ""
    )
    text = (
        f"On {device(step)} ({cell['size']}, context {cell['context_length']}, {cell['precision']}), with {few} warm-up steps "
        f"the mean training step is {times(mean[few] / mean[many])} the mean with {many} and the slowest step "
        f"{times(slowest[few] / slowest[many])} the slowest{why}; the medians: {median}."
    )
    middle = [w for w in sorted(mean.index) if few < w < many]
    if middle:
        text += f" With {listing([str(w) for w in middle])} warm-up step{'' if middle == [1] else 's'} the mean is " + listing(
            [times(mean[w] / mean[many]) for w in middle]
        )
        text += f" the {many}-step mean (slowest step {listing([times(slowest[w] / slowest[many]) for w in middle])})."
    compiled = (
        step.iloc[0:0] if "compile" not in rows else rows[(rows["compile"] == 1) & (rows["mode"] == "train") & (rows["phase"] == "step")]
    )
    cm = compiled.groupby("warmup_steps")["mean_ms"].mean()
    if few in cm and many in cm:
        text += f" With torch.compile the {few}-step mean is {times(cm[few] / cm[many])} the {many}-step one (compilation lands in the timed steps)."
    return note.end(text) + links(section("warmup"), run.figure("warmup", "warmup"))


MODE_WORDS = {"train": "training step", "inference": "inference forward"}


def _mfu(row: pd.Series) -> str:
    """``MFU 41.2%``, or why there is none (the merge's ``mfu_note``)."""
    mfu = row.get("mfu_pct", math.nan)
    if not is_empty(mfu) and math.isfinite(float(mfu)):
        return f"MFU {float(mfu):.3g}%"
    why = row.get("mfu_note")
    return f"MFU unknown ({why if not is_empty(why) and str(why) else 'no FLOP count or peak TFLOP/s recorded'})"


def _runner_up_times(row: pd.Series) -> dict:
    """The runner-up's median and interval under the names ``Note.ms`` reads."""
    return {"median_ms": row["runner_up_ms"], "ci_low_ms": row["runner_up_ci_low_ms"], "ci_high_ms": row["runner_up_ci_high_ms"]}


def _runner_up(row: pd.Series, note: Note) -> str:
    """The runner-up in words with its median, and whether the winner is separated from it."""
    text = f"{row['runner_up']}, {note.ms(_runner_up_times(row))}"
    if row["separated"] == SEPARATED:
        return f"separated from the runner-up ({text})"
    if row["separated"] == NOT_SEPARATED:
        return f"no significant difference from the runner-up ({text})"
    return f"runner-up {text}"


def fastest_configuration(run: Run) -> str:
    df = run.rows("e2e")
    setting = "two or more values of `e2e.grid.precision`, `e2e.grid.impl`, `e2e.grid.compile` or `e2e.grid.cuda_graphs`"
    if df is None:
        return run.absent("e2e", setting)
    best = run.facts("e2e").fastest
    if best.empty:
        return not_measured(setting, "each size and context ran in one configuration")
    note = Note(df)
    # the headline: the largest size, its training step if one was compared, at its longest context
    size = size_order(run, best["size"])[-1]
    part = best[best["size"] == size]
    part = part[part["mode"] == "train"] if (part["mode"] == "train").any() else part
    top = part.sort_values("context_length").iloc[-1]
    optimizer = f", {top['optimizer']} AdamW" if top["mode"] == "train" and not is_empty(top.get("optimizer")) else ""
    text = (
        f"On {device(ok_rows(df, phase='step'))}, the fastest {MODE_WORDS.get(top['mode'], str(top['mode']) + ' step')} "
        f"for the {size} model at context {top['context_length']}: {top['config']}{optimizer}, {note.ms(top)}, "
        f"{_mfu(top)}; {_runner_up(top, note)}."
    )
    answer = note.end(text + _sdpa_pairs(run, note)) + links(section("e2e"), run.figure("e2e", "mfu"))
    if len(best) > 1:  # every size, context and mode in which two or more configurations ran
        table = pd.DataFrame(
            {
                "size": best["size"],
                "context_length": best["context_length"],
                "mode": best["mode"],
                "compared": best["configs_compared"],
                "fastest": best["config"],
                **({"optimizer": best["optimizer"]} if "optimizer" in best else {}),
                "median [95% interval]": [note.ms(r) for _, r in best.iterrows()],
                "mfu_pct": best["mfu_pct"] if "mfu_pct" in best else math.nan,
                "runner-up": [f"{r['runner_up']}, {note.ms(_runner_up_times(r))}" for _, r in best.iterrows()],
                "separated": best["separated"],
            }
        )
        answer += "\n\n" + md_table(table, ".3g")
        notes = sorted({str(v) for v in best.get("mfu_note", pd.Series(dtype=object)) if not is_empty(v) and str(v)})
        answer += f"\n\nMFU is empty where it cannot be computed: {'; '.join(notes)}." if notes else ""
    return answer


def _sdpa_pairs(run: Run, note: Note) -> str:
    """ " Paired in one process, eager attention / SDPA training step: …" where the eager-attention cells timed SDPA beside them."""
    comp = eager_launches(run.facts("e2e").compared["impl"])
    comp = comp[(comp["source"] == PAIRED) & (comp["mode"] == "train")] if not comp.empty else comp
    if comp.empty:
        return ""
    said = [
        f"{r['size']} (context {r['context_length']}, {r['precision']}) {note.compared(r, faster='SDPA is faster', slower='SDPA is slower')}"
        for _, r in comp.iterrows()
    ]
    return f" Eager attention / SDPA training step, paired in one process: {'; '.join(said)}."


def answers_113(run: Run) -> QA:
    found = forward_backward(run)
    return [
        ("(a) How long do a forward and a backward pass take, per model size?", timing_per_size(run, found)),
        ("(b) With warm-up, how variable are the timings?", variability(run, found)),
        ("(c) What changes without warm-up, or with only 1–2 warm-up steps?", warmup_answer(run)),
        ("(fastest configuration) Which configuration runs a step fastest, per size, and at what MFU?", fastest_configuration(run)),
    ]
