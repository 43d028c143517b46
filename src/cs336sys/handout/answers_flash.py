"""Answers of handout §1.3 from a run's tables: what torch.compile and CUDA graphs gain, our Triton
FlashAttention-2 kernel against PyTorch's implementations, and the leaderboard configuration."""

from __future__ import annotations

import itertools

import pandas as pd

from cs336sys.analysis.findings import PAIRED, paired_ratios
from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.tables import ok_rows
from cs336sys.handout.answers_common import Note, Run, cannot_measure, device, first, links, listing, not_measured, section

QA = list[tuple[str, str]]
SHAPE = ["seq_len", "head_dim", "precision", "num_heads"]


def _compile(run: Run) -> str:
    parts, note, used = [], Note(run.rows("attention"), run.rows("e2e"), run.rows("warmup")), []
    att = run.rows("attention")
    if att is not None and {"eager", "compiled"} <= set(ok_rows(att)["impl"]):
        r = paired_ratios(
            ok_rows(att, mode="train", phase="step"),
            ["d_model", "seq_len", "activation", "causal", "precision"],
            "impl",
            "eager",
            "compiled",
        )
        if not r.empty:
            top = r.sort_values("seq_len").iloc[-1]
            used.append("attention")
            parts.append(
                f"eager / compiled attention training step at seq_len {top['seq_len']} (d_model {top['d_model']}): {note.ratio(top)}"
            )
    e2e = run.rows("e2e")
    r = run.facts("e2e").compared["compile"] if e2e is not None and "compile" in e2e else pd.DataFrame()
    if not r.empty:
        # paired first, then pairs launched the same way (eager launches first; a CUDA-graph run may have only graphed pairs)
        r = r.assign(_paired=r["source"] != PAIRED).sort_values(["_paired", "cuda_graphs"], kind="stable")
        used.append("e2e")
        graphed = lambda x: ", CUDA graphs" if int(x.get("cuda_graphs", 0) or 0) else ""  # noqa: E731
        paired = lambda x: ", paired in one process" if x["source"] == PAIRED else ""  # noqa: E731
        parts += [
            f"eager / compiled {x['mode']} step of {x['size']} (context {x['context_length']}, {x['precision']}, {x['impl']}{graphed(x)}{paired(x)}): "
            f"{note.compared(x, faster='compiled is faster', slower='compiled is slower')}"
            for _, x in r.iterrows()
        ][:4]
    warm = run.rows("warmup")
    if not parts and warm is not None and ok_rows(warm)["compile"].nunique() > 1:
        rows = ok_rows(warm, warmup_steps=ok_rows(warm)["warmup_steps"].max())
        r = paired_ratios(rows[rows["phase"] == "step"], ["mode"], "compile", 0, 1)
        used += ["warmup"] if not r.empty else []
        parts += [f"eager / compiled {x['mode']} step after warm-up (warmup study): {note.ratio(x)}" for _, x in r.iterrows()]
    if not parts:
        return not_measured("`e2e.grid.compile: [false, true]` or `attention.grid.impl: [eager, compiled]`")
    return note.end(f"On {device(att, e2e, warm)}: {'; '.join(parts)} (above 1×: compiled is faster).") + links(*map(section, used))


def _graphs(run: Run) -> str:
    e2e = run.rows("e2e")
    ratios = run.facts("e2e").compared["cuda_graphs"] if e2e is not None and "cuda_graphs" in e2e else pd.DataFrame()
    if ratios.empty:
        why = run.facts("e2e").gpu_notes if e2e is not None else ()
        return cannot_measure(f"{why[0]}; this run: {device(e2e)}") if why else not_measured("`e2e.grid.cuda_graphs: [false, true]`")
    note = Note(e2e)
    parts = [
        f"{r['mode']} step of {r['size']} (context {r['context_length']}, {r['precision']}, {r['impl']}): "
        f"{note.compared(r, faster='the graph is faster', slower='the graph is slower')}"
        for _, r in ratios.iterrows()
    ]
    paired = (ratios["source"] == PAIRED).all()
    if paired:
        head = f"Eager launches / the same step replayed as CUDA graphs (one graph per phase), paired in one process on {device(e2e)}"
        optim = " (the graph replays the same optimizer, captured)" if (ratios["mode"] == "train").any() else ""
    else:
        head = f"Eager launches / one replayed CUDA graph on {device(e2e)}"
        optim = (
            " (the graph's training step uses fused, capturable AdamW; the eager one the configured optimizer)"
            if (ratios["mode"] == "train").any() and (ratios["source"] != PAIRED).any()
            else ""
        )
    return note.end(f"{head}: {'; '.join(parts)}{optim}.") + links(section("e2e"))


def _leaderboard(run: Run, ok: pd.DataFrame) -> tuple[tuple, str] | None:
    """The leaderboard shape and where it came from: the run's config, else a shape outside the grid.

    Without a config snapshot (runs before snapshots), the leaderboard cells are the shape whose
    removal leaves a full product of axis values; where several qualify, the one with the most heads
    (the leaderboard is multi-head, the flash grid sweeps one head), then the longest sequence.
    """
    board = (run.config.get("flash") or {}).get("leaderboard")
    if board:
        return tuple(board[k] for k in SHAPE), "the run's `flash.leaderboard`"
    shapes = set(ok[SHAPE].drop_duplicates().itertuples(index=False, name=None))
    found = []
    for s in shapes:
        rest = shapes - {s}
        grid = set(itertools.product(*({x[i] for x in rest} for i in range(len(SHAPE)))))
        if rest and grid == rest and s not in grid:
            found.append(s)
    if not found:
        return None
    best = max(found, key=lambda s: (s[3], s[0], s[1]))
    return best, "no config recorded: the cells outside the grid's product" + (", with the most heads" if len(found) > 1 else "")


def _flash(run: Run) -> tuple[str, str]:
    df = run.rows("flash")
    if df is None:
        return run.absent("flash", "`flash.grid.impl: [triton, sdpa-flash, …]`"), run.absent("flash", "`flash.leaderboard`")
    ok = ok_rows(df).dropna(subset=["median_ms"])
    impls = sorted(ok["impl"].unique())
    if "triton" not in impls or len(impls) < 2:
        return not_measured("`flash.grid.impl` with `triton` and a PyTorch implementation"), not_measured("`flash.leaderboard`")
    note, table, wins = Note(ok), [], []
    for shape in run.facts("flash").shapes:
        part = shape.rows
        row = shape.key | {impl: note.ms(r) for impl in impls if (r := first(part, impl=impl)) is not None}
        # against PyTorch's implementations only: ours, the tutorial kernel and plug-ins are listed in the table
        if shape.fastest_pytorch is not None:
            r = shape.versus_ours
            row["fastest PyTorch / ours"] = f"{shape.fastest_pytorch}: {note.ratio(r)}" if r is not None else "—"
            # a win: the ratio above 1 and its interval too (a run without intervals counts its ratio alone)
            wins += [bool(r["ratio"] > 1 and not r["ratio_low"] <= 1)] if r is not None else []
        table.append(row)
    table = pd.DataFrame(table)
    a = note.end(
        f"On {device(ok)}, our Triton FlashAttention-2 kernel (`triton`) is faster than the fastest PyTorch implementation "
        f"in {sum(wins)} of {len(wins)} (shape, phase) rows; median ms (do_bench) per implementation below."
    ) + links(section("flash"))
    a += "\n\n" + md_table(table.rename(columns={"triton": "triton (ours)"}))
    found = _leaderboard(run, ok)
    if found is None:
        return a, not_measured("`flash.leaderboard`")
    shape, source = found
    board = ok[(ok[SHAPE].apply(tuple, axis=1) == shape) & (ok["phase"] == "forward_backward")]
    ours = first(board, impl="triton")
    if ours is None:
        return a, not_measured("`flash.leaderboard` with `flash.grid.impl` including `triton`")
    lb = Note(ok)
    rivals = []
    for _, r in board[board["impl"] != "triton"].iterrows():
        ratio = paired_ratios(board, ["phase"], "impl", r["impl"], "triton")
        rivals.append(f"{r['impl']} {lb.ms(r)}" + (f" ({lb.ratio(ratio.iloc[0])} our time)" if not ratio.empty else ""))
    if not rivals:
        return a, not_measured("`flash.leaderboard` with `flash.grid.impl` including a PyTorch implementation")
    b = lb.end(
        f"Leaderboard configuration (seq_len {shape[0]}, head_dim {shape[1]}, {shape[2]}, {shape[3]} heads; {source}) on {device(board)}: "
        f"forward+backward {lb.ms(ours)} with our Triton kernel, against {listing(rivals)}."
    ) + links(section("flash"))
    return a, b


def answers_13(run: Run) -> QA:
    table, board = _flash(run)
    return [
        ("(torch.compile) How much does torch.compile speed up attention and the whole model?", _compile(run)),
        ("(CUDA graphs) What does launching each kernel from Python cost?", _graphs(run)),
        ("(FlashAttention-2) How does our Triton kernel compare with PyTorch's implementations?", table),
        ("(leaderboard) How fast is the leaderboard configuration?", board),
    ]
