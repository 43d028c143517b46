"""Figures, findings and facts of study ``e2e``: times per size and context, bf16 speedup, MFU, backward/forward,
the GPU time of each phase beside its eager time, the paired comparisons (``paired.py``), and the fastest
configuration per size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cs336sys.analysis.energy import energy_interval, tokens_interval
from cs336sys.analysis.findings import TIGHT_REL, describe_ratio, paired_ratios, separation
from cs336sys.analysis.markdown import is_empty, md_table, size_key, value_key
from cs336sys.analysis.plots import (
    CI_ERR,
    draw_lines,
    empty_panel,
    failed_cells,
    ok_cells,
    panel_grid,
    plt,
    save,
    shared_legend,
    title,
    with_ci,
)
from cs336sys.analysis.tables import timed
from cs336sys.measure.stats import fmt_interval, paired_ratio
from cs336sys.studies.e2e import STUDY
from cs336sys.studies.e2e.paired import LM_KEYS, comparison, gpu_frame, gpu_notes, gpu_table, pair_table

CONFIG = ["precision", "impl", "compile", "cuda_graphs"]  # what a user picks for one size and context
BEST_GROUP = ["size", "context_length", "mode"]
WINNER_COLUMNS = ["optimizer", "median_ms", "ci_low_ms", "ci_high_ms", "tflops", "mfu_pct", "mfu_note", "tokens_per_s"]
PANELS = [("inference", "forward"), ("train", "forward"), ("train", "backward"), ("train", "optimizer_step"), ("train", "step")]


def backward_forward_ratio(df: pd.DataFrame) -> pd.DataFrame:
    """Backward / forward time of the training step, per cell, with its 95% interval.

    The forward and backward of one step ran back to back, so where the rows kept their
    step times (``samples_ms``, in step order) the ratio is paired step by step
    (:func:`cs336sys.measure.stats.paired_ratio`): the host's drift slows both and cancels.
    Otherwise, interval arithmetic on the two rows' intervals.
    """
    rows = timed(df, mode="train")
    out = paired_ratios(rows[rows["phase"].isin(["forward", "backward"])], LM_KEYS, "phase", "backward", "forward")
    if out.empty or "samples_ms" not in rows:
        return out
    keys = [k for k in LM_KEYS if k in rows and k in out]
    for i, r in out.iterrows():
        same = rows[(rows[keys] == r[keys]).all(axis=1)]
        steps = {p: [float(x) for x in str(v).split(";") if x] for p, v in zip(same["phase"], same["samples_ms"]) if isinstance(v, str)}
        fwd, bwd = steps.get("forward", []), steps.get("backward", [])
        if len(fwd) < 3 or len(fwd) != len(bwd):
            continue
        ratio = paired_ratio(bwd, fwd)
        out.loc[i, ["ratio", "ratio_low", "ratio_high"]] = [ratio.median, ratio.low, ratio.high]
        out.loc[i, "significant"] = bool(ratio.bounded and not ratio.low <= 1.0 <= ratio.high)
        out.loc[i, "finding"] = describe_ratio(ratio)
    return out


def bf16_speedup(df: pd.DataFrame) -> pd.DataFrame:
    """fp32 step time / bf16 step time per size × context × attention × mode, with its interval."""
    keys = [k for k in LM_KEYS if k != "precision"] + ["mode"]
    return paired_ratios(timed(df, phase="step"), keys, "precision", "fp32", "bf16")


def sdpa_speedup(df: pd.DataFrame) -> pd.DataFrame:
    """eager step time / SDPA step time, per cell and mode, with its interval."""
    keys = [k for k in LM_KEYS if k != "impl"] + ["mode"]
    return paired_ratios(timed(df, phase="step"), keys, "impl", "eager", "sdpa")


def graph_speedup(df: pd.DataFrame) -> pd.DataFrame:
    """Eager step time / CUDA-graph replay time, per cell and mode: what launching costs."""
    keys = [k for k in LM_KEYS if k != "cuda_graphs"] + ["mode"]
    ratios = paired_ratios(timed(df, phase="step"), keys, "cuda_graphs", 0, 1)
    return ratios.rename(columns={"0_ms": "eager_ms", "1_ms": "graph_ms"})  # the axis values, named


def trust(df: pd.DataFrame) -> pd.DataFrame:
    """Whole-step rows flagged noisy or host-bound, with the GPU's busy share and the interval."""
    steps = timed(df, phase="step")
    cols = [c for c in ("noisy", "host_bound") if c in steps]
    if not cols:
        return pd.DataFrame()
    flagged = steps[steps[cols].fillna(False).astype(bool).any(axis=1)]
    keep = [c for c in LM_KEYS + ["mode", "median_ms", "ci_low_ms", "ci_high_ms", "ci_rel", "gpu_busy_frac", *cols] if c in flagged]
    return flagged[keep]


def energy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per whole-step row with energy: J per step [95% interval], average watts, tokens per joule [95%], where it came from."""
    steps = timed(df, phase="step")
    if "energy_j" not in steps:
        return pd.DataFrame()
    steps = steps[pd.to_numeric(steps["energy_j"], errors="coerce").notna()]
    rows = []
    for _, r in steps.iterrows():
        note = "" if is_empty(r.get("energy_note")) else str(r.get("energy_note"))
        rows.append(
            {
                **{k: r[k] for k in LM_KEYS + ["mode"] if k in r},
                "J/step [95%]": fmt_interval(energy_interval(r), 3),
                "avg W": r.get("avg_power_w"),
                "tokens/J [95%]": fmt_interval(tokens_interval(r), 3),
                "source": r.get("energy_source", ""),
                "note": note,
            }
        )
    return pd.DataFrame(rows)


def describe_config(row: pd.Series | dict) -> str:
    """A configuration in words, ``bf16, sdpa, compile, CUDA graphs``; axes the row lacks are left out."""
    parts = [str(row[c]) for c in ("precision", "impl") if c in row and not is_empty(row[c])]
    for column, on, off in (("compile", "compile", "no compile"), ("cuda_graphs", "CUDA graphs", "no CUDA graphs")):
        if column in row and not is_empty(row[column]):
            parts.append(on if int(row[column]) else off)
    return ", ".join(parts)


def fastest_per_size(df: pd.DataFrame) -> pd.DataFrame:
    """Per size × context × mode with two or more ok configurations: the one with the lowest median step time.

    Whole steps only (``phase == "step"``); failed cells (oom, error, …) are never candidates.
    Each row: how many configurations were compared, the winner's configuration, median with
    its 95% interval, TFLOP/s, MFU and tokens/s where the merge derived them; the runner-up in
    words with its median and interval; ``separated``: "yes" only where the winner's interval
    lies wholly below the runner-up's, otherwise "no significant difference". Sizes in model
    order (small … 2.7B), then context, then mode.
    """
    steps = timed(df, phase="step")
    if steps.empty or not {"median_ms", *BEST_GROUP} <= set(steps.columns):
        return pd.DataFrame()
    config = [c for c in CONFIG if c in steps]
    # the fastest row of each configuration (one per configuration after the merge; duplicates would count once)
    steps = steps.dropna(subset=["median_ms"]).sort_values("median_ms", kind="stable").drop_duplicates(BEST_GROUP + config)
    extra = [c for c in WINNER_COLUMNS if c in steps]
    rows = []
    for key, part in steps.groupby(BEST_GROUP, sort=False, dropna=False):
        if len(part) < 2:
            continue
        best, second = part.iloc[0], part.iloc[1]
        rows.append(
            {
                **dict(zip(BEST_GROUP, key)),
                "configs_compared": len(part),
                **best[config + extra].to_dict(),
                "runner_up": describe_config(second),
                "runner_up_ms": second["median_ms"],
                "runner_up_ci_low_ms": second.get("ci_low_ms", float("nan")),
                "runner_up_ci_high_ms": second.get("ci_high_ms", float("nan")),
                "separated": separation(best, second),
            }
        )
    rows.sort(key=lambda r: (size_key(r["size"]), value_key(r["context_length"]), str(r["mode"])))
    return pd.DataFrame(rows)


def plot_times(df: pd.DataFrame, path: Path, run: str, impl: str) -> Path:
    data = pd.concat([timed(df), df[df["status"] != "ok"]]) if "status" in df else df
    data = data[data["impl"] == impl]
    groups = [c for c in ("size", "precision", "cuda_graphs") if c in data]
    fig, axes, legend_ax = panel_grid(len(PANELS))
    for ax, (mode, phase) in zip(axes, PANELS):
        cells, failed = with_ci(ok_cells(data, mode=mode, phase=phase)), failed_cells(data, mode=mode)
        draw_lines(ax, cells, "context_length", "median_ms", groups, yerr=CI_ERR, failed=failed, logx=True, logy=True, legend=False)
        ax.set_title(f"{mode} {phase} (median, 95% interval)")
    shared_legend(axes, legend_ax)
    title(fig, run, data, f"e2e time per size and context, attention={impl}")
    return save(fig, path)


def plot_speedup(df: pd.DataFrame, path: Path, run: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    sp = bf16_speedup(df)
    if not sp.empty:
        sp = sp.assign(err_low=sp["ratio"] - sp["ratio_low"], err_high=sp["ratio_high"] - sp["ratio"])
        draw_lines(ax, sp, "context_length", "ratio", ["impl", "mode", "size"], yerr=("err_low", "err_high"), logx=True)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("fp32 / bf16 median step time")
    title(fig, run, df, "bf16 speedup over fp32")
    return save(fig, path)


def plot_mfu(df: pd.DataFrame, path: Path, run: str) -> Path:
    data = ok_cells(timed(df), mode="train", phase="step")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if "mfu_pct" in data and data["mfu_pct"].notna().any():
        draw_lines(ax, data, "context_length", "mfu_pct", ["impl", "size", "precision"], logx=True)
    else:
        empty_panel(ax, "MFU not available on this device\n(no peak TFLOP/s known)")
    title(fig, run, df, "training-step MFU")
    return save(fig, path)


def figures(df: pd.DataFrame, run: str) -> list:
    jobs = [(f"times_impl-{i}", lambda p, i=i: plot_times(df, p, run, i)) for i in sorted(df["impl"].unique())]
    return jobs + [("bf16_speedup", lambda p: plot_speedup(df, p, run)), ("mfu", lambda p: plot_mfu(df, p, run))]


def findings(df: pd.DataFrame) -> str:
    parts = [
        "Every ratio below carries a 95% interval: between two cells, interval arithmetic on the two medians' "
        "intervals; a *paired* ratio, the interval of its pairs of interleaved blocks timed in one process (host drift "
        f"cancels). An interval that excludes 1 is a finding; one that holds 1 reads *no difference within ±x%* where it "
        f"lies within ±{TIGHT_REL:.0%} of 1, *unbounded* where sampling stopped because its time budget "
        "(`max_measure_s`) ran out, otherwise *no significant difference*."
    ]
    gpu = gpu_table(df)
    if not gpu.empty:
        parts += [
            "**Eager time and GPU time per phase**: the eager wall time of each phase against the same phase replayed "
            "as CUDA graphs (one graph per phase, in the same process: the time the GPU needs); `host overhead ms` = "
            "eager − GPU, per occurrence of the phase in a step: Python, kernel launches and their gaps. "
            "`GPU time from`: *replay* (the eager cell's own replay) or *graph cell* (the CUDA-graph cell of the same "
            "configuration, in runs before the replay):",
            md_table(gpu, ".3g"),
        ]
    missing = gpu_notes(df)
    if missing:
        parts.append(f"GPU time not measured{' in some rows' if not gpu.empty else ''}: {'; '.join(missing)}.")
    pairs = pair_table(df)
    if not pairs.empty:
        parts += [
            "**Paired comparisons** (own time / partner time, above 1: the partner is faster; the comparisons the "
            "study declares, each timed as interleaved blocks A B / B A in the base cell's process; `stop_reason`: "
            "*target* where the interval met `target_rel`, *budget* where `max_measure_s` ran out first, *fixed* for "
            "the configured count; passes join theirs with `;`):",
            md_table(pairs, ".3g"),
        ]
    parts += ["**Backward / forward ratio** (training step, eager wall time):", md_table(backward_forward_ratio(df), ".3g")]
    gpu_bf = backward_forward_ratio(gpu_frame(df))
    if not gpu_bf.empty:
        parts += ["**Backward / forward ratio, GPU time** (each phase replayed as a CUDA graph):", md_table(gpu_bf, ".3g")]
    parts += ["**bf16 speedup** (fp32 / bf16, whole steps, two cells' intervals):", md_table(bf16_speedup(df), ".3g")]
    gpu_sp = bf16_speedup(gpu_frame(df))
    if not gpu_sp.empty:
        parts += ["**bf16 speedup, GPU time** (fp32 / bf16 whole steps replayed as CUDA graphs):", md_table(gpu_sp, ".3g")]
    if df["impl"].nunique() > 1:
        parts += ["**SDPA speedup** (eager / sdpa attention, whole steps, two cells' intervals):", md_table(sdpa_speedup(df), ".3g")]
    if "cuda_graphs" in df and df["cuda_graphs"].nunique() > 1:
        parts += [
            "**CUDA-graph speedup** (eager launches / one replayed graph, whole steps, two cells' intervals; the graph's "
            "training step uses fused capturable AdamW, the eager one the configured optimizer):",
            md_table(graph_speedup(df), ".3g"),
        ]
    flagged = trust(df)
    if not flagged.empty:
        parts += [
            "**Cells to read with care** — `noisy`: the interval is wider than the configured share of the median; "
            "`host_bound`: the GPU idled for part of the step, so the number measures Python and the CPU as much "
            "as the GPU and moves with host load (the GPU time above is the same work without the host):",
            md_table(flagged, ".3g"),
        ]
    joules = energy_table(df)
    if not joules.empty:
        parts += [
            "**Energy per step** (the GPU's, from NVML's energy counter sampled beside the cell's own timed blocks of at "
            "least 0.5 s, whole steps: every phase; interval over blocks and passes; `avg W` = joules / the steps' own "
            "seconds; tokens per joule = batch × context / J):",
            md_table(joules, ".3g"),
        ]
    elif "energy_note" in df:
        why = sorted({str(v) for v in timed(df, phase="step").get("energy_note", pd.Series(dtype=str)).dropna() if str(v)})
        parts.append(f"Energy per step: empty — {'; '.join(why) or 'not recorded'}.")
    steps = timed(df, mode="train", phase="step")
    if "mfu_pct" in steps and steps["mfu_pct"].notna().any():
        parts += ["**Training-step TFLOP/s and MFU:**", md_table(steps[LM_KEYS + ["tflops", "mfu_pct"]], ".3g")]
    elif not steps.empty:
        notes = sorted(set(steps.get("mfu_note", pd.Series(dtype=str)).dropna()))
        parts.append(f"MFU: empty — {'; '.join(notes) or 'no peak known'}.")
    best = fastest_per_size(df)
    if not best.empty:
        if "mfu_note" in best and best["mfu_note"].map(lambda v: is_empty(v) or not str(v)).all():
            best = best.drop(columns="mfu_note")  # every MFU known: nothing to explain
        parts += [
            "**Fastest configuration per size** (whole steps): for each size, context and mode in which two or more "
            "configurations ran, the one with the lowest median step time, against the runner-up; `separated` is *yes* "
            "only where the two 95% intervals do not overlap, otherwise *no significant difference*:",
            md_table(best, ".3g"),
        ]
    return "\n\n".join(parts)


@dataclass(frozen=True)
class E2EFacts:
    """What the handout's answers quote of an e2e run: tables of medians and ratios, each with its 95% interval."""

    gpu: pd.DataFrame  # each timed row's GPU time (:func:`gpu_frame`), ``gpu_source`` replay or graph cell
    backward_forward: pd.DataFrame  # backward / forward per training-step cell, eager wall time
    backward_forward_gpu: pd.DataFrame  # the same of the GPU times
    bf16_gpu: pd.DataFrame  # fp32 / bf16 of whole steps' GPU times, two cells' intervals
    compared: Mapping[str, pd.DataFrame]  # axis of a declared pair → :func:`comparison` along it (``source`` paired or two cells)
    fastest: pd.DataFrame  # :func:`fastest_per_size`, with the winner's configuration in words (``config``)
    gpu_notes: tuple[str, ...]  # why rows have no GPU time


def facts(df: pd.DataFrame) -> E2EFacts:
    gpu, best = gpu_frame(df), fastest_per_size(df)
    return E2EFacts(
        gpu=gpu,
        backward_forward=backward_forward_ratio(df),
        backward_forward_gpu=backward_forward_ratio(gpu),
        bf16_gpu=bf16_speedup(gpu),
        compared={p.axis: comparison(df, p.axis) for p in STUDY.pairs},
        fastest=best.assign(config=[describe_config(r) for _, r in best.iterrows()]) if not best.empty else best,
        gpu_notes=tuple(gpu_notes(df)),
    )
