"""Answers of handout §1.2.1 (attention scaling) and of the ReLU/SoftMax–Performer benchmark (study ``mha``)
from a run's tables."""

from __future__ import annotations

import re

import pandas as pd

from cs336sys.analysis.findings import paired_ratios
from cs336sys.analysis.peaks import peak_tflops
from cs336sys.analysis.tables import ok_rows
from cs336sys.handout.answers_common import Note, Run, device, first, links, listing, mib, not_measured, num, section

QA = list[tuple[str, str]]


def _reference(df: pd.DataFrame) -> dict:
    """The measured configuration closest to the handout's: eager softmax attention, fp32, causal."""
    keys = ["impl", "activation", "precision", "causal"]
    measured = ok_rows(df)[keys].drop_duplicates()
    best = max(
        measured.itertuples(index=False), key=lambda c: (c.impl == "eager", c.activation == "softmax", c.precision == "fp32", c.causal == 1)
    )
    return dict(zip(keys, best))


def _name(ref: dict) -> str:
    return f"{ref['impl']} {ref['activation']} attention ({ref['precision']}{', causal' if ref['causal'] else ''})"


def _ran(largest_ok) -> str:
    return f" (largest that ran: {largest_ok:.0f})" if largest_ok is not None and pd.notna(largest_ok) else " (no shorter length ran)"


def _attention_qa(run: Run) -> list[str]:
    df = run.rows("attention")
    if df is None:
        return [run.absent("attention", "`attention.grid.seq_len`")] * 4
    ref, dev, note, facts = _reference(df), device(df), Note(df), run.facts("attention")
    rows = ok_rows(df, **ref)
    fig = run.figure("attention", f"scaling_causal-{ref['causal']}_{ref['precision']}")
    per_d = []
    for d in sorted(rows["d_model"].unique()):
        part = rows[(rows["d_model"] == d) & (rows["mode"] == "train")]
        lo, hi = part["seq_len"].min(), part["seq_len"].max()
        ends = [(ph, first(part, seq_len=lo, phase=ph), first(part, seq_len=hi, phase=ph)) for ph in ("forward", "backward")]
        times = [
            f"{ph} {note.ms(at_lo)} at {lo} → {note.ms(at_hi)} at {hi}"
            for ph, at_lo, at_hi in ends
            if at_lo is not None and at_hi is not None
        ]
        per_d.append(f"d_model {d}: {', '.join(times)}")
    batch = rows["batch_size"].dropna() if "batch_size" in rows else pd.Series(dtype=float)
    batch = f", batch {int(batch.max())}" if len(batch) else ""
    a = note.end(f"On {dev}, {_name(ref)}{batch} — {'; '.join(per_d)}.{_bandwidth(ok_rows(facts.roofline, **ref))}") + links(
        section("attention"), fig
    )

    check = facts.memory
    mine = (
        check[(check["impl"] == ref["impl"]) & (check["activation"] == ref["activation"]) & (check["precision"] == ref["precision"])]
        if not check.empty
        else check
    )
    if mine.empty:
        b = f"_not measured in this run: no memory statistics for {_name(ref)} (they need a CUDA device; this run: {dev})._"
    else:
        d = mine["d_model"].max()
        mine = mine[mine["d_model"] == d].sort_values("seq_len")
        lo, hi = mine.iloc[0], mine.iloc[-1]
        others = check[(check["impl"] != ref["impl"]) & (check["seq_len"] == hi["seq_len"]) & (check["d_model"] == d)]
        rest = [f"{r.impl} {r.activation} keeps {num(r.kept_for_backward_mib)} MiB" for r in others.itertuples()]
        grows = (
            (
                f" — and {num(lo['kept_for_backward_mib'])} MiB at {lo['seq_len']}: {hi['kept_for_backward_mib'] / lo['kept_for_backward_mib']:.3g}× "
                f"for a {hi['seq_len'] / lo['seq_len']:.3g}× longer sequence"
            )
            if hi["seq_len"] > lo["seq_len"] and lo["kept_for_backward_mib"] > 0
            else ""
        )
        b = (
            f"With d_model {d}, {_name(ref)} keeps {num(hi['kept_for_backward_mib'])} MiB for the backward at seq_len {hi['seq_len']}, "
            f"{hi['kept_in_LxL_matrices']:.3g} (batch, L, L) matrices of {num(hi['one_LxL_matrix_mib'])} MiB{grows}"
            + (f"; at {hi['seq_len']}, {listing(rest)}" if rest else "")
            + "."
            + links(section("attention"))
        )

    front = facts.frontier
    hit = front[front["first_oom"].notna()]
    if hit.empty:
        c = f"No configuration ran out of memory on {dev}, up to seq_len {df['seq_len'].max()}." + links(section("attention"))
    else:
        fails = []
        for r in hit.itertuples():
            err = df[(df["status"] == "oom") & (df["seq_len"] == r.first_oom) & (df["impl"] == r.impl) & (df["activation"] == r.activation)]
            asked = re.search(r"Tried to allocate [\d.]+ \w+", " ".join(err["error"].astype(str)))
            fails.append(
                f"{r.impl} {r.activation} (d_model {r.d_model}, {r.precision}) at seq_len {r.first_oom:.0f}"
                f"{_ran(r.largest_ok)}{f' ({asked.group(0)})' if asked else ''}"
            )
        c = f"On {dev}, the first out-of-memory: {listing(fails)}; the other configurations ran every length." + links(section("attention"))

    slopes = facts.slopes
    slopes = slopes[(slopes["precision"] == ref["precision"]) & (slopes["causal"] == ref["causal"])]
    mem = [f"{r.impl} {r.activation} {r.slope_step_mem:.3g}" for r in slopes.itertuples() if pd.notna(r.slope_step_mem)]
    tim = [f"{r.impl} {r.activation} {r.slope_forward_time:.3g}" for r in slopes.itertuples() if pd.notna(r.slope_forward_time)]
    peak = f"peak memory: {', '.join(mem)}" if mem else f"peak memory not measured (memory statistics need a CUDA device; this run: {dev})"
    if tim:
        slope = f"Log–log slope in seq_len over the longest lengths that ran (2 is quadratic) — {peak}; forward time: {', '.join(tim)}."
        d_ = slope + links(section("attention"), fig)
    else:
        d_ = not_measured("`attention.grid.seq_len` with two or more lengths")
    return [a, b, c, d_]


def _bandwidth(rows: pd.DataFrame) -> str:
    """How close the longest measured forward and backward run to the GPU's DRAM bandwidth ('' where not measured)."""
    rows = rows[rows["phase"].isin(["forward", "backward"]) & pd.to_numeric(rows["bw_frac"], errors="coerce").notna()]
    if rows.empty:
        return ""
    top = rows[rows["seq_len"] == rows["seq_len"].max()]
    top = top[top["d_model"] == top["d_model"].max()].sort_values("phase", key=lambda s: s != "forward")
    first_row = top.iloc[0]
    parts = [
        f"the {r.phase} moves {num(r.bytes_moved / 1e9, 3)} GB at {num(r.achieved_gbps, 3)} GB/s ({100 * r.bw_frac:.0f}%"
        + (f" of the {num(r.peak_gbps)} GB/s DRAM peak)" if i == 0 else ")")
        for i, r in enumerate(top.itertuples())
    ]
    text = f" At seq_len {first_row['seq_len']} (d_model {first_row['d_model']}), bytes counted per op, {', '.join(parts)}"
    peak = peak_tflops(str(first_row["device_name"]), str(first_row["precision"]))
    if set(top["bound"].dropna()) == {"memory"} and peak:
        ridge = peak * 1e3 / float(first_row["peak_gbps"])
        at = " and ".join(f"{r.arith_intensity:.2g}" for r in top.itertuples())
        text += f": memory-bound, at {at} FLOP/byte against the roofline's ridge at {ridge:.3g} ({first_row['precision']})"
    return text + "."


def answers_121(run: Run) -> QA:
    a, b, c, d = _attention_qa(run)
    return [
        ("(a) How long do attention's forward and backward take, per d_model and sequence length?", a),
        ("(b) How much memory is held for the backward, and how does it grow?", b),
        ("(c) Where does it run out of memory?", c),
        ("(d) How does memory scale with sequence length?", d),
    ]


def answers_mha(run: Run) -> QA:
    df = run.rows("mha")
    if df is None:
        return [(q, run.absent("mha", "`mha.grid.seq_len`")) for q in _MHA_QUESTIONS]
    ok, note, facts = ok_rows(df), Note(df), run.facts("mha")
    dims = ok.groupby(["embed_dim", "num_heads"])["seq_len"].nunique().idxmax()
    sel = _of_dims(df, dims)
    where = f"embed_dim {dims[0]}, {dims[1]} heads, {device(sel)}"
    label = lambda r: f"{r.variant} {r.kernel}" + (f" (m={r.num_features})" if r.variant == "performer" else "")
    slopes = _of_dims(facts.slopes, dims)
    fwd = [f"{label(r)} {r.slope_forward_time:.3g}" for r in slopes.itertuples() if pd.notna(r.slope_forward_time)]
    mem = [f"{label(r)} {r.slope_step_mem:.3g}" for r in slopes.itertuples() if pd.notna(r.slope_step_mem)]
    peak = (
        f"; of training-step peak memory: {', '.join(mem)}"
        if mem
        else f"; peak memory not measured (memory statistics need a CUDA device; this run: {device(sel)})"
    )
    if fwd:
        slope = f"Log–log slope in seq_len ({where}) of forward time: {', '.join(fwd)}{peak} (2 is quadratic, 1 linear)."
        a = slope + links(section("mha"), run.figure("mha", f"mha_embed-{dims[0]}"))
    else:
        a = not_measured("`mha.grid.seq_len` with two or more lengths")
    front = _of_dims(facts.frontier, dims)
    hit = [f"{label(r)} at seq_len {r.first_oom:.0f}{_ran(r.largest_ok)}" for r in front.itertuples() if pd.notna(r.first_oom)]
    b = (
        f"First out-of-memory ({where}): {listing(hit)}; every other variant ran up to seq_len {sel['seq_len'].max()}."
        if hit
        else f"No variant ran out of memory ({where}), up to seq_len {sel['seq_len'].max()}."
    ) + links(section("mha"))
    L = ok_rows(sel, mode="inference", phase="forward").dropna(subset=["median_ms"])["seq_len"].max()
    at = [(label(r), r) for r in ok_rows(sel, seq_len=L).itertuples()] if pd.notna(L) else []
    fw = {name: r for name, r in at if r.mode == "inference" and r.phase == "forward"}
    pk = {name: r.peak_mem_bytes for name, r in at if r.mode == "train" and r.phase == "step" and pd.notna(r.peak_mem_bytes)}
    said = [
        f"{name} forward {note.ms(r._asdict())}" + (f", training-step peak {mib(pk[name])}" if name in pk else "") for name, r in fw.items()
    ]
    c = note.end(f"At seq_len {L} ({where}): " + "; ".join(said) + ".")
    c = (c + links(section("mha"))) if fw else not_measured("`mha.modes` with `inference`")
    return list(zip(_MHA_QUESTIONS, [a, b, c, _relu_vs_softmax(run, sel, note, where)]))


def _of_dims(table: pd.DataFrame, dims: tuple) -> pd.DataFrame:
    """The rows of ``table`` with (embed_dim, num_heads) ``dims``."""
    return table[(table["embed_dim"] == dims[0]) & (table["num_heads"] == dims[1])]


def _relu_vs_softmax(run: Run, sel: pd.DataFrame, note: Note, where: str) -> str:
    parts = []
    fwd = ok_rows(sel, mode="inference", phase="forward")
    r = paired_ratios(fwd, ["variant", "num_features", "seq_len"], "kernel", "softmax", "relu")
    for variant, g in r.groupby("variant") if not r.empty else []:
        top = g.sort_values("seq_len").iloc[-1]
        parts.append(f"{variant} softmax / ReLU forward at seq_len {top['seq_len']}: {note.ratio(top)}")
    att = run.rows("attention")
    if att is not None:
        ref = _reference(att)
        r = paired_ratios(
            ok_rows(att, mode="train", phase="forward"),
            ["impl", "d_model", "seq_len", "causal", "precision"],
            "activation",
            "softmax",
            "relu",
        )
        r = r[r["impl"] == ref["impl"]] if not r.empty else r
        if not r.empty:
            top = r.sort_values("seq_len").iloc[-1]
            parts.append(
                f"{ref['impl']} attention core softmax / ReLU forward at seq_len {top['seq_len']} (attention study): {note.ratio(top)}"
            )
    if not parts:
        return not_measured("`mha.grid.kernel: [softmax, relu]` or `attention.grid.activation: [softmax, relu]`")
    return note.end(f"Time of softmax over ReLU attention ({where}): {'; '.join(parts)} (above 1×: ReLU is faster).") + links(
        section("mha")
    )


_MHA_QUESTIONS = [
    "(a) Do exact and Performer attention scale as expected (slope ≈2 vs ≈1)?",
    "(b) Where does each variant run out of memory?",
    "(c) How do time and memory compare at the longest sequence?",
    "(d) ReLU vs softmax: is ReLU attention faster?",
]
