"""Figures, one function per figure kind, one shared style; ``plot_study`` picks them per study.

Every figure is a PNG whose title names the run, the device and the fixed settings;
failed cells (oom, timeout, error) are drawn as ✕ markers at the top of the axes
at their x position, never silently dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.transforms as mtransforms  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cs336sys.results import OK  # noqa: E402

FAIL_MARKERS = {"oom": "x", "timeout": "1", "error": "4"}
STYLE = {"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3, "font.size": 8, "legend.fontsize": 7, "axes.titlesize": 9}


def _device(df: pd.DataFrame) -> str:
    names = df.get("device_name", pd.Series(dtype=str)).dropna()
    names = names[names != ""]
    return names.iloc[0] if len(names) else "unknown device"


def _title(fig, run: str, df: pd.DataFrame, what: str) -> None:
    fig.suptitle(f"{what} — run {run}, {_device(df)}", fontsize=10)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _label(key: tuple | str, names: Sequence[str]) -> str:
    key = key if isinstance(key, tuple) else (key,)
    return ", ".join(f"{n}={v}" for n, v in zip(names, key))


def draw_lines(
    ax,
    df: pd.DataFrame,
    x: str,
    y: str,
    groups: Sequence[str],
    *,
    yerr: str | None = None,
    failed: pd.DataFrame | None = None,
    logx: bool = False,
    logy: bool = False,
) -> None:
    """One line per group of ``groups`` (y vs x, optional error bars); failed cells as markers on top."""
    colors = {}
    if not df.empty:
        for i, (key, part) in enumerate(df.groupby(list(groups), sort=True)):
            part = part.sort_values(x)
            err = part[yerr] if yerr and yerr in part else None
            line = ax.errorbar(part[x], part[y], yerr=err, marker="o", ms=3, capsize=2, label=_label(key, groups))
            colors[key if isinstance(key, tuple) else (key,)] = line[0].get_color()
    if failed is not None and not failed.empty:
        top = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
        for (status, *key), part in failed.groupby(["status", *groups]):
            color = colors.get(tuple(key), "black")
            ax.plot(part[x], np.full(len(part), 0.96), FAIL_MARKERS.get(status, "x"), color=color, ms=8, mew=2,
                    transform=top, label=f"{status}: {_label(tuple(key), groups)}", clip_on=False)  # fmt: skip
    # log scales only over drawn data: an axis holding nothing cannot be log-scaled
    if logx and (not df.empty or (failed is not None and not failed.empty)):
        ax.set_xscale("log", base=2)
    if logy and not df.empty:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _failed(df: pd.DataFrame, **where) -> pd.DataFrame:
    bad = df[df["status"] != OK] if "status" in df else df.iloc[0:0]
    for col, value in where.items():
        if col in bad and value is not None:
            bad = bad[bad[col].isna() | (bad[col] == value)] if col in ("mode", "phase") else bad[bad[col] == value]
    return bad.drop_duplicates(subset=["cell_id"]) if "cell_id" in bad else bad


def _ok(df: pd.DataFrame, **where) -> pd.DataFrame:
    out = df[df["status"] == OK] if "status" in df else df
    for col, value in where.items():
        out = out[out[col] == value] if col in out else out.iloc[0:0]
    return out


def plot_no_cells(df: pd.DataFrame, path: Path, run: str, study: str) -> Path:
    """Stand-in figure for a study none of whose cells ran, naming why."""
    fig, ax = plt.subplots(figsize=(7, 2.4))
    ax.axis("off")
    reasons = df.drop_duplicates(subset=["status", "error"]) if not df.empty else df
    lines = [f"{r.status}: {str(r.error)[:110]}" for r in reasons.itertuples()][:6] or ["no cells in the grid"]
    ax.text(0.01, 0.95, "No cell of this study ran:\n" + "\n".join(lines), va="top", family="monospace", fontsize=7, transform=ax.transAxes)
    _title(fig, run, df, f"study {study}")
    return _save(fig, path)


# --- e2e -----------------------------------------------------------------------------------------
E2E_PANELS = [("inference", "forward"), ("train", "forward"), ("train", "backward"), ("train", "optimizer_step"), ("train", "step")]


def plot_e2e_times(df: pd.DataFrame, path: Path, run: str, attn: str) -> Path:
    data = df[df["attn"] == attn]
    fig, axes = plt.subplots(1, len(E2E_PANELS), figsize=(4 * len(E2E_PANELS), 3.6))
    for ax, (mode, phase) in zip(axes, E2E_PANELS):
        draw_lines(ax, _ok(data, mode=mode, phase=phase), "ctx", "mean_ms", ["size", "precision"], yerr="std_ms",
                   failed=_failed(data, mode=mode), logx=True, logy=True)  # fmt: skip
        ax.set_title(f"{mode} {phase} (mean ± std)")
    _title(fig, run, data, f"e2e time per size and context, attention={attn}")
    return _save(fig, path)


def plot_e2e_speedup(df: pd.DataFrame, path: Path, run: str) -> Path:
    data = _ok(df)
    data = data[data["phase"] == "step"]
    piv = data.pivot_table(index=["attn", "mode", "size", "ctx"], columns="precision", values="median_ms")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if {"fp32", "bf16"} <= set(piv.columns):
        sp = (piv["fp32"] / piv["bf16"]).rename("speedup").reset_index()
        draw_lines(ax, sp, "ctx", "speedup", ["attn", "mode", "size"], logx=True)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("fp32 / bf16 median step time")
    _title(fig, run, df, "bf16 speedup over fp32")
    return _save(fig, path)


def plot_e2e_mfu(df: pd.DataFrame, path: Path, run: str) -> Path:
    data = _ok(df, mode="train", phase="step")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if "mfu_pct" in data and data["mfu_pct"].notna().any():
        draw_lines(ax, data, "ctx", "mfu_pct", ["attn", "size", "precision"], logx=True)
    else:
        ax.text(0.5, 0.5, "MFU not available on this device\n(no peak TFLOP/s known)", ha="center", va="center", transform=ax.transAxes)
    _title(fig, run, df, "training-step MFU")
    return _save(fig, path)


def plot_warmup(df: pd.DataFrame, path: Path, run: str) -> Path:
    fig, axes = plt.subplots(1, len(E2E_PANELS), figsize=(4 * len(E2E_PANELS), 3.6))
    for ax, (mode, phase) in zip(axes, E2E_PANELS):
        data = _ok(df, mode=mode, phase=phase)
        draw_lines(ax, data, "warmup", "mean_ms", ["compile"], yerr="std_ms", failed=_failed(df, mode=mode))
        if not data.empty:
            ax.plot(data["warmup"], data["median_ms"], "k_", ms=10, label="median")
        ax.set_title(f"{mode} {phase}: mean ± std vs warm-up steps")
    _title(fig, run, df, "effect of warm-up steps")
    return _save(fig, path)


# --- attention -----------------------------------------------------------------------------------


def plot_scaling(df: pd.DataFrame, path: Path, run: str, groups: Sequence[str], panels: Iterable[tuple[str, str, str]], what: str) -> Path:
    """Log–log time/memory vs sequence length; ``panels`` = (mode, phase, column)."""
    panels = list(panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8))
    for ax, (mode, phase, column) in zip(np.atleast_1d(axes), panels):
        data = _ok(df, mode=mode, phase=phase)
        if column in data and data[column].notna().any():
            draw_lines(ax, data.dropna(subset=[column]), "seq", column, groups, failed=_failed(df, mode=mode), logx=True, logy=True)
        else:
            ax.text(0.5, 0.5, f"{column}: not measured here\n(memory needs CUDA)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{mode} {phase}: {column}")
    _title(fig, run, df, what)
    return _save(fig, path)


# --- mha: the ReLU/SoftMax pages' layout ------------------------------------------------------
MHA_METRICS = {"forward_ms": ("inference", "forward", "median_ms"), "backward_ms": ("train", "backward", "median_ms"), "peak_mem": ("train", "step", "peak_mem_bytes")}


def plot_mha_grid(df: pd.DataFrame, path: Path, run: str, embed: int, kernel: str, metric: str) -> Path:
    mode, phase, column = MHA_METRICS[metric]
    data = df[(df["embed"] == embed) & (df["kernel"] == kernel)]
    heads = sorted(data["heads"].unique())
    ms = sorted(m for m in data["m"].unique() if m > 0) or [0]
    # at least ~6.5 in wide, or a single panel's title is cut off
    fig, axes = plt.subplots(len(heads), len(ms), figsize=(max(3.6 * len(ms), 6.5), 3.2 * len(heads)), squeeze=False)
    for i, h in enumerate(heads):
        for j, m in enumerate(ms):
            ax = axes[i][j]
            panel = data[(data["heads"] == h) & ((data["m"] == m) | (data["variant"] != "performer"))]
            ok = _ok(panel, mode=mode, phase=phase)
            if column in ok and ok[column].notna().any():
                draw_lines(ax, ok.dropna(subset=[column]), "seq", column, ["variant"], failed=_failed(panel, mode=mode), logx=True, logy=True)
            else:
                ax.text(0.5, 0.5, f"{column}: not measured here", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(f"heads={h}, m={m}")
    _title(fig, run, data, f"mha {metric}: embed={embed}, kernel={kernel}, exact vs performer")
    return _save(fig, path)


# --- flash ---------------------------------------------------------------------------------------


def plot_flash(df: pd.DataFrame, path: Path, run: str, precision: str, heads: int) -> Path:
    data = df[(df["precision"] == precision) & (df["heads"] == heads)]
    dims = sorted(data["d"].unique())
    phases = ["forward", "backward", "forward_backward"]
    fig, axes = plt.subplots(len(phases), len(dims), figsize=(4 * len(dims), 3.2 * len(phases)), squeeze=False)
    for i, phase in enumerate(phases):
        for j, d in enumerate(dims):
            part = data[data["d"] == d]
            draw_lines(axes[i][j], _ok(part, phase=phase), "seq", "tflops", ["impl"], failed=_failed(part, mode="train"), logx=True)
            axes[i][j].set_title(f"{phase}, d={d}")
    _title(fig, run, data, f"fused attention TFLOP/s, {precision}, heads={heads}, causal")
    return _save(fig, path)


# --- profile, memory, precision -----------------------------------------------------------------


def plot_kernel_shares(df: pd.DataFrame, path: Path, run: str, cell: str, top: int = 12) -> Path:
    """Top kernels by share of each phase's device time, for one profile cell."""
    data = df[(df["cell_id"] == cell) & (df["kind"] == "kernel")]
    panels = [(m, p) for m, p in [("inference", "forward"), ("train", "forward"), ("train", "backward"), ("train", "optimizer_step")]
              if not data[(data["mode"] == m) & (data["phase"] == p)].empty]  # fmt: skip
    fig, axes = plt.subplots(len(panels) or 1, 1, figsize=(9, 2.6 * max(len(panels), 1)), squeeze=False)
    for ax, (mode, phase) in zip(axes[:, 0], panels):
        part = data[(data["mode"] == mode) & (data["phase"] == phase)].nlargest(top, "total_us")[::-1]
        ax.barh([k[:70] for k in part["kernel"]], 100 * part["share_of_phase"])
        ax.set_xlabel("% of phase time")
        ax.set_title(f"{mode} {phase}: top {len(part)} kernels")
    _title(fig, run, data, f"profile {cell} ({data['device_kind'].iloc[0] if len(data) else ''})")
    return _save(fig, path)


def plot_memory_timeline(df: pd.DataFrame, path: Path, run: str, cell: str) -> Path:
    from cs336sys.memory_snapshot import plot_timeline

    data = df[df["cell_id"] == cell]
    timeline = data[data["kind"] == "timeline"][["time_us", "allocated_bytes"]].sort_values("time_us")
    phases = [(r.phase, r.start_us, r.end_us) for r in data[data["kind"] == "phase"].itertuples()]
    plot_timeline(timeline, str(path), title=f"active memory, {cell} — run {run}, {_device(data)}", phases=phases)
    return path


def plot_memory_peaks(df: pd.DataFrame, path: Path, run: str) -> Path:
    data = _ok(df, kind="summary").assign(peak_mib=lambda d: d["peak_mem_bytes"] / 2**20)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    draw_lines(ax, data, "ctx", "peak_mib", ["size", "precision", "mode"], failed=_failed(df), logx=True)
    ax.set_ylabel("peak allocated (MiB)")
    _title(fig, run, df, "peak memory")
    return _save(fig, path)


def plot_accumulation(df: pd.DataFrame, path: Path, run: str) -> Path:
    data = _ok(df, kind="accumulation")
    fig, ax = plt.subplots(figsize=(6, 3))
    labels = [f"{a} += {s}" + (" (cast)" if "cast" in str(c) else "") for a, s, c in zip(data["accumulator"], data["summand"], data["case"])]
    ax.barh(labels, data["abs_error"].clip(lower=1e-9))
    ax.set_xscale("log")
    ax.set_xlabel("|sum − 10| after adding 0.01 a thousand times")
    _title(fig, run, df, "accumulation error by dtype")
    return _save(fig, path)


def plot_study(study: str, df: pd.DataFrame, outdir: Path, run: str) -> list[Path]:
    """All figures of ``study`` into ``outdir``; returns the files written."""
    outdir.mkdir(parents=True, exist_ok=True)
    plt.rcParams.update(STYLE)
    jobs: list[tuple[str, Callable[[Path], Path]]] = []
    if df.empty or not (df["status"] == OK).any():
        jobs.append(("no_cell_ran", lambda p: plot_no_cells(df, p, run, study)))
    elif study == "e2e":
        jobs += [(f"times_attn-{a}", lambda p, a=a: plot_e2e_times(df, p, run, a)) for a in sorted(df["attn"].unique())]
        jobs += [("bf16_speedup", lambda p: plot_e2e_speedup(df, p, run)), ("mfu", lambda p: plot_e2e_mfu(df, p, run))]
    elif study == "warmup":
        jobs.append(("warmup", lambda p: plot_warmup(df, p, run)))
    elif study == "attention":
        panels = [("train", "forward", "median_ms"), ("train", "backward", "median_ms"), ("train", "step", "peak_mem_bytes")]
        for causal in sorted(df["causal"].unique()):
            for prec in sorted(df["precision"].unique()):
                part = df[(df["causal"] == causal) & (df["precision"] == prec)]
                jobs.append((f"scaling_causal-{causal}_{prec}", lambda p, part=part, c=causal, pr=prec: plot_scaling(
                    part, p, run, ["d", "impl", "act"], panels, f"attention scaling, causal={c}, {pr}")))  # fmt: skip
    elif study == "mha":
        for embed in sorted(df["embed"].unique()):
            for kernel in sorted(df["kernel"].unique()):
                for metric in MHA_METRICS:
                    jobs.append((f"mha_embed-{embed}_{kernel}_{metric}", lambda p, e=embed, k=kernel, m=metric: plot_mha_grid(df, p, run, e, k, m)))
    elif study == "flash":
        for prec in sorted(df["precision"].unique()):
            for heads in sorted(df["heads"].unique()):
                jobs.append((f"flash_{prec}_heads-{heads}", lambda p, pr=prec, h=heads: plot_flash(df, p, run, pr, h)))
    elif study == "profile":
        cells = sorted(df.loc[df["status"] == OK, "cell_id"].unique()) if "kind" in df else []
        jobs += [(f"kernels_{c}", lambda p, c=c: plot_kernel_shares(df, p, run, c)) for c in cells]
    elif study == "memory":
        cells = sorted(df.loc[(df["status"] == OK) & (df.get("kind") == "timeline"), "cell_id"].unique()) if "kind" in df else []
        jobs += [(f"timeline_{c}", lambda p, c=c: plot_memory_timeline(df, p, run, c)) for c in cells]
        if cells:
            jobs.append(("peak_memory", lambda p: plot_memory_peaks(df, p, run)))
    elif study == "precision":
        if "kind" in df and (df["kind"] == "accumulation").any():
            jobs.append(("accumulation", lambda p: plot_accumulation(df, p, run)))
    else:
        raise ValueError(f"no figures defined for study {study!r}")
    return [draw(outdir / f"{name}.png") for name, draw in jobs]
