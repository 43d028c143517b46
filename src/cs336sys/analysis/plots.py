"""Figures, one function per figure kind, one shared style; ``plot_study`` picks them per study.

Every figure is a PNG whose title names the run, the device and the fixed settings;
failed cells (oom, timeout, error) are drawn as ✕ markers at the top of the axes
at their x position, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.transforms as mtransforms  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cs336sys.pipeline.rows import Status  # noqa: E402

OK = Status.OK.value

FAIL_MARKERS = {"oom": "x", "timeout": "1", "error": "4"}
STYLE = {"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3, "font.size": 8, "legend.fontsize": 7, "axes.titlesize": 9}


def device_of(df: pd.DataFrame) -> str:
    names = df.get("device_name", pd.Series(dtype=str)).dropna()
    names = names[names != ""]
    return names.iloc[0] if len(names) else "unknown device"


def title(fig, run: str, df: pd.DataFrame, what: str) -> None:
    fig.suptitle(f"{what} — run {run}, {device_of(df)}", fontsize=10)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


CI_ERR = ("err_low", "err_high")


def with_ci(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the bar lengths of each row's 95% interval (``CI_ERR``), 0 where none was recorded."""
    if df.empty or "ci_low_ms" not in df:
        return df.assign(err_low=0.0, err_high=0.0)
    return df.assign(err_low=(df["median_ms"] - df["ci_low_ms"]).clip(lower=0).fillna(0),
                     err_high=(df["ci_high_ms"] - df["median_ms"]).clip(lower=0).fillna(0))  # fmt: skip


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
    yerr: str | tuple[str, str] | None = None,
    failed: pd.DataFrame | None = None,
    logx: bool = False,
    logy: bool = False,
) -> None:
    """One line per group of ``groups`` (y vs x, optional error bars); failed cells as markers on top."""
    colors = {}
    if not df.empty:
        for i, (key, part) in enumerate(df.groupby(list(groups), sort=True)):
            part = part.sort_values(x)
            if isinstance(yerr, tuple):  # asymmetric bars: (below, above) lengths, never below zero
                err = [part[c].clip(lower=0).fillna(0) for c in yerr] if set(yerr) <= set(part.columns) else None
            else:
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


def failed_cells(df: pd.DataFrame, **where) -> pd.DataFrame:
    bad = df[df["status"] != OK] if "status" in df else df.iloc[0:0]
    for col, value in where.items():
        if col in bad and value is not None:
            bad = bad[bad[col].isna() | (bad[col] == value)] if col in ("mode", "phase") else bad[bad[col] == value]
    return bad.drop_duplicates(subset=["cell_id"]) if "cell_id" in bad else bad


def ok_cells(df: pd.DataFrame, **where) -> pd.DataFrame:
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
    title(fig, run, df, f"study {study}")
    return save(fig, path)


# --- shared by attention and mha ---------------------------------------------------------------


def plot_scaling(df: pd.DataFrame, path: Path, run: str, groups: Sequence[str], panels: Iterable[tuple[str, str, str]], what: str) -> Path:
    """Log–log time/memory vs sequence length; ``panels`` = (mode, phase, column)."""
    panels = list(panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8))
    for ax, (mode, phase, column) in zip(np.atleast_1d(axes), panels):
        data = ok_cells(df, mode=mode, phase=phase)
        if column in data and data[column].notna().any():
            draw_lines(
                ax, data.dropna(subset=[column]), "seq_len", column, groups, failed=failed_cells(df, mode=mode), logx=True, logy=True
            )
        else:
            ax.text(0.5, 0.5, f"{column}: not measured here\n(memory needs CUDA)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{mode} {phase}: {column}")
    title(fig, run, df, what)
    return save(fig, path)


def plot_study(study: str, df: pd.DataFrame, outdir: Path, run: str) -> list[Path]:
    """All figures of ``study`` (from its report module) into ``outdir``; returns the files written."""
    from cs336sys.studies import report_module

    outdir.mkdir(parents=True, exist_ok=True)
    plt.rcParams.update(STYLE)
    if df.empty or not (df["status"] == OK).any():
        jobs = [("no_cell_ran", lambda p: plot_no_cells(df, p, run, study))]
    else:
        jobs = report_module(study).figures(df, run)
    return [draw(outdir / f"{name}.png") for name, draw in jobs]
