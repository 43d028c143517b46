"""Answers of handout §1.1.3 (end-to-end timing, warm-up, the fastest configuration per size) and §1.1.5
(mixed precision) from a run's tables."""

from __future__ import annotations

import math

import pandas as pd

from cs336sys.analysis.answers_common import Note, Run, device, first, links, listing, not_measured, pct, section, size_order, times
from cs336sys.analysis.markdown import is_empty, md_table
from cs336sys.analysis.tables import ok_rows
from cs336sys.studies.e2e.report import NOT_SEPARATED, SEPARATED, backward_forward_ratio, bf16_speedup, describe_config, fastest_per_size
from cs336sys.studies.warmup.report import warmup_effect

QA = list[tuple[str, str]]
EAGER_LAUNCHES = {"compile": 0, "cuda_graphs": 0}  # the handout's plain PyTorch step


def eager_rows(df: pd.DataFrame, **where) -> pd.DataFrame:
    """Ok rows of plain eager steps (no torch.compile, no CUDA graph) matching ``where``."""
    rows = ok_rows(df, **where)
    for col, value in EAGER_LAUNCHES.items():
        if col in rows:
            rows = rows[rows[col] == value]
    return rows


def lm_slice(rows: pd.DataFrame) -> tuple | None:
    """(context_length, precision, impl) measured for the most sizes; fp32, eager and long contexts first."""
    if rows.empty:
        return None
    counts = rows.groupby(["context_length", "precision", "impl"])["size"].nunique()
    return max(counts.index, key=lambda k: (counts[k], k[1] == "fp32", k[2] == "eager", k[0]))


def _forward_backward(run: Run) -> tuple[str, str, pd.DataFrame, tuple] | None:
    e2e = run.rows("e2e")
    if e2e is None:
        return None
    train = eager_rows(e2e, mode="train")
    train = train[train["phase"].isin(["forward", "backward"])].dropna(subset=["median_ms"])
    key = lm_slice(train)
    if key is None:
        return None
    ctx, precision, impl = key
    part = train[(train["context_length"] == ctx) & (train["precision"] == precision) & (train["impl"] == impl)]
    batch = part["batch_size"].dropna() if "batch_size" in part else pd.Series(dtype=float)
    where = f"{precision}, {impl} attention, context {ctx}" + (f", batch {int(batch.iloc[0])}" if len(batch) else "")
    return device(part), where, part, key


def timing_per_size(run: Run) -> str:
    found = _forward_backward(run)
    if found is None:
        return run.absent("e2e", "`e2e.grid.size`")
    dev, where, part, (ctx, precision, impl) = found
    note = Note(part)
    per_size = []
    for size in size_order(run, part["size"]):
        fwd, bwd = first(part, size=size, phase="forward"), first(part, size=size, phase="backward")
        times = [f"forward {note.ms(fwd)}" if fwd is not None else "", f"backward {note.ms(bwd)}" if bwd is not None else ""]
        per_size.append(f"{size}: {', '.join(t for t in times if t)}")
    text = f"On {dev} ({where}), a training step's forward and backward take — {'; '.join(per_size)}."
    ratios = backward_forward_ratio(run.rows("e2e"))
    if not ratios.empty:
        ratios = ratios[(ratios["context_length"] == ctx) & (ratios["precision"] == precision) & (ratios["impl"] == impl)]
        for col, value in EAGER_LAUNCHES.items():
            ratios = ratios[ratios[col] == value] if col in ratios else ratios
        sizes = size_order(run, ratios["size"])
        shown = [f"{s} {note.ratio(first(ratios, size=s))}" for s in sizes]
        if shown:
            text += f" Backward time / forward time: {listing(shown)}."
    return note.end(text) + links(section("e2e"), run.figure("e2e", f"times_impl-{impl}"))


def variability(run: Run) -> str:
    found = _forward_backward(run)
    if found is None:
        return run.absent("e2e", "`e2e.grid.size`")
    dev, where, part, _ = found
    cv = (part["std_ms"] / part["mean_ms"]).dropna() if {"std_ms", "mean_ms"} <= set(part) else pd.Series(dtype=float)
    if cv.empty:
        return not_measured("`e2e`", "no step-time spread was recorded")
    warm = part["warmup_steps_run"].dropna() if "warmup_steps_run" in part else pd.Series(dtype=float)
    steps = (run.config.get("e2e") or {}).get("warmup_steps")
    trials = part["trials"].dropna() if "trials" in part else pd.Series(dtype=float)
    if len(warm) and len(trials):
        after = f"With {int(trials.max())} trials, each after a warm-up ({int(warm.max())} warm-up steps in all)"
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
    return note.end(text + ".") + links(section("e2e"))


def warmup_answer(run: Run) -> str:
    df = run.rows("warmup")
    setting = "`warmup.grid.warmup_steps: [0, 1, 2, 5]`"
    if df is None:
        return run.absent("warmup", setting)
    rows = ok_rows(df).dropna(subset=["median_ms"])
    if rows["warmup_steps"].nunique() < 2:
        return not_measured(f"two or more values of {setting}")
    effect = warmup_effect(df)
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
    best = fastest_per_size(df)
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
        f"for the {size} model at context {top['context_length']}: {describe_config(top)}{optimizer}, {note.ms(top)}, "
        f"{_mfu(top)}; {_runner_up(top, note)}."
    )
    answer = note.end(text) + links(section("e2e"), run.figure("e2e", "mfu"))
    if len(best) > 1:  # every size, context and mode in which two or more configurations ran
        table = pd.DataFrame(
            {
                "size": best["size"],
                "context_length": best["context_length"],
                "mode": best["mode"],
                "compared": best["configs_compared"],
                "fastest": [describe_config(r) for _, r in best.iterrows()],
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


def accumulation(run: Run) -> str:
    df = run.rows("precision")
    rows = ok_rows(df, kind="accumulation") if df is not None else pd.DataFrame()
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
    df = run.rows("precision")
    kinds = [k for k in ("autocast-bf16", "autocast-fp16") if df is not None and not ok_rows(df, kind=k).empty]
    if not kinds:
        setting = "`precision.grid.part: [autocast-bf16, autocast-fp16]`"
        return run.absent("precision", setting) if df is None else not_measured(setting)
    sentences = []
    for kind in kinds:
        rows = ok_rows(df, kind=kind)
        dtypes = ", ".join(f"{r.quantity} {r.dtype}" for r in rows.itertuples())
        sentences.append(f"Under {rows['autocast_dtype'].iloc[0]} autocast on {device(rows)}: {dtypes}.")
    return " ".join(sentences) + links(section("precision"))


def bf16_timings(run: Run) -> str:
    df = run.rows("e2e")
    setting = "`e2e.grid.precision: [fp32, bf16]`"
    if df is None:
        return run.absent("e2e", setting)
    speed = bf16_speedup(df)
    for col, value in EAGER_LAUNCHES.items():
        speed = speed[speed[col] == value] if col in speed else speed
    speed = speed[speed["mode"] == "train"] if not speed.empty else speed
    if speed.empty:
        return not_measured(setting, "no cell pair differing only in precision ran")
    impl = max(speed["impl"].unique(), key=lambda i: ((speed["impl"] == i).sum(), i == "eager"))
    part = speed[speed["impl"] == impl]
    note = Note(df)
    per_size = []
    for size in size_order(run, part["size"]):
        rows = part[part["size"] == size].sort_values("context_length")
        per_size.append(f"{size} " + ", ".join(f"{note.ratio(r)} at context {r['context_length']}" for _, r in rows.iterrows()))
    fp32 = ok_rows(df, precision="fp32")
    text = (
        f"On {device(fp32)}, fp32 training-step time / bf16-autocast training-step time ({impl} attention): "
        f"{'; '.join(per_size)} (above 1×: bf16 is faster)."
    )
    return note.end(text) + links(section("e2e"), run.figure("e2e", "bf16_speedup"))


def answers_113(run: Run) -> QA:
    return [
        ("(a) How long do a forward and a backward pass take, per model size?", timing_per_size(run)),
        ("(b) With warm-up, how variable are the timings?", variability(run)),
        ("(c) What changes without warm-up, or with only 1–2 warm-up steps?", warmup_answer(run)),
        ("(fastest configuration) Which configuration runs a step fastest, per size, and at what MFU?", fastest_configuration(run)),
    ]


def answers_115(run: Run) -> QA:
    return [
        ("(a) What do the accumulation loops give in each precision?", accumulation(run)),
        ("(b) Which dtype does each part of the model get under autocast?", autocast(run)),
        ("(c) How much faster is a bf16 mixed-precision step than fp32, per size?", bf16_timings(run)),
    ]
