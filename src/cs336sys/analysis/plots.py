"""Figures, one function per figure kind, one shared style; :func:`cs336sys.runs.figures.plot_study`
picks them per study (from its report module).

Every figure is a PNG whose title names the run, the device and the fixed settings;
failed cells (oom, timeout, error) are drawn as ✕ markers at the top of the axes
at their x position, never silently dropped. Readable at a viewer's width: titles
wrap to fit their figure or panel, figures of many panels are laid out two panels
a row with one shared legend, long labels (kernel names) are shortened in the
middle with a legend of the full names (:mod:`cs336sys.analysis.long_labels`),
groups of model sizes follow the size table, and no error bar reaches below zero.
Each series has its own colour and marker (and the same ones in every panel of a
figure); where every series has one point on a single x, the panel is a dot chart
with one named position per series.
The series styles and the PNG writer live in :mod:`cs336sys.analysis.figure_style`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.transforms as mtransforms  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cs336sys.analysis.figure_style import style_of, write_png  # noqa: E402
from cs336sys.analysis.markdown import MIB, size_key, value_key  # noqa: E402
from cs336sys.rows import Status  # noqa: E402

OK = Status.OK.value

FAIL_MARKERS = {"oom": "x", "timeout": "1", "error": "4", "wrong": "*"}
STYLE = {"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3, "font.size": 8, "legend.fontsize": 7, "axes.titlesize": 9}


def device_of(df: pd.DataFrame) -> str:
    names = df.get("device_name", pd.Series(dtype=str)).dropna()
    names = names[names != ""]
    return names.iloc[0] if len(names) else "unknown device"


def fit_text(artist, max_px: float) -> None:
    """Wrap ``artist``'s text at spaces to ``max_px`` wide, then shrink it (to 6 pt at least) if one word is still wider."""
    renderer = artist.get_figure().canvas.get_renderer()
    if not artist.get_text() or artist.get_window_extent(renderer).width <= max_px:
        return
    lines = []
    for paragraph in artist.get_text().split("\n"):
        line = ""
        for word in paragraph.split(" "):
            trial = f"{line} {word}" if line else word
            artist.set_text(trial)
            if line and artist.get_window_extent(renderer).width > max_px:
                lines.append(line)
                line = word
            else:
                line = trial
        lines.append(line)
    artist.set_text("\n".join(lines))
    while artist.get_window_extent(renderer).width > max_px and artist.get_fontsize() > 6:
        artist.set_fontsize(artist.get_fontsize() - 0.5)


def title(fig, run: str, df: pd.DataFrame, what: str) -> None:
    # a fixed 0.05 in from the top: tight_layout makes room for the title's height only, so the
    # default y=0.98 (a share of the height) would overlap the first panels of a tall figure
    text = fig.suptitle(f"{what} — run {run}, {device_of(df)}", fontsize=10, y=1 - 0.05 / fig.get_figheight())
    fit_text(text, 0.96 * fig.bbox.width)


def save(fig, path: Path, bottom: float = 0.0) -> Path:
    """Lay out (above ``bottom``, a share of the height), wrap each panel title to its panel, lay out again, write."""
    rect = (0, bottom, 1, 1)
    fig.tight_layout(rect=rect)
    for ax in fig.axes:
        if ax.get_title() and ax.axison:
            fit_text(ax.title, ax.get_window_extent().width)
    fig.tight_layout(rect=rect)
    write_png(fig, path)
    plt.close(fig)
    return path


def panel_grid(n: int):
    """``n`` panels two a row (readable at a viewer's width) and one free slot after them for a shared legend.

    Returns (figure, the ``n`` panel axes, the legend's axes); slots beyond those are hidden.
    """
    rows = math.ceil((n + 1) / 2)
    fig, grid = plt.subplots(rows, 2, figsize=(8.8, 3.2 * rows), squeeze=False)  # 4.4 x 3.2 in a panel
    slots = list(grid.flat)
    for ax in slots[n + 1 :]:
        ax.axis("off")
    slots[n].axis("off")
    return fig, slots[:n], slots[n]


def shared_legend(axes: Sequence, where) -> None:
    """One legend in ``where`` for every labelled line of ``axes``, each label once, in first-drawn order."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        where.legend(list(entries.values()), list(entries), loc="center", frameon=False, fontsize=7)


CI_ERR = ("err_low", "err_high")


def with_ci(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the bar lengths of each row's 95% interval (``CI_ERR``), 0 where none was recorded."""
    if df.empty or "ci_low_ms" not in df:
        return df.assign(err_low=0.0, err_high=0.0)
    return df.assign(
        err_low=(df["median_ms"] - df["ci_low_ms"]).clip(lower=0).fillna(0),
        err_high=(df["ci_high_ms"] - df["median_ms"]).clip(lower=0).fillna(0),
    )


def _label(key: tuple | str, names: Sequence[str]) -> str:
    key = key if isinstance(key, tuple) else (key,)
    return ", ".join(f"{n}={v}" for n, v in zip(names, key))


def group_key(key: tuple | str, names: Sequence[str]) -> tuple:
    """Sort key of one group of lines: model sizes in the size table's order, other values as numbers or text."""
    key = key if isinstance(key, tuple) else (key,)
    return tuple(size_key(v) if n == "size" else value_key(v) for n, v in zip(names, key))


def error_bars(part: pd.DataFrame, y: str, yerr: str | tuple[str, str] | None) -> list | None:
    """(below, above) bar lengths per point: a column for both (a std) or one each (an interval).

    Missing lengths are 0, and the bar below never reaches under zero: a time or a ratio
    cannot be negative even where mean − std is.
    """
    if isinstance(yerr, tuple):
        if not set(yerr) <= set(part.columns):
            return None
        below, above = (part[c].astype(float).clip(lower=0).fillna(0) for c in yerr)
    elif yerr and yerr in part:
        below = above = part[yerr].astype(float).clip(lower=0).fillna(0)
    else:
        return None
    return [np.minimum(below, part[y].astype(float).clip(lower=0)).to_numpy(), above.to_numpy()]


def _mark_failed(ax, xs, status: str, label: str, color: str = "black") -> None:
    """Failed cells' markers (by status) at the top of the panel: at their x in data, at 0.96 of the height."""
    top = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    marker = FAIL_MARKERS.get(status, "x")
    ax.plot(xs, np.full(len(xs), 0.96), marker, color=color, ms=8, mew=2, transform=top, label=f"{status}: {label}", clip_on=False)


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
    legend: bool = True,
) -> None:
    """One line per group of ``groups`` (y vs x, optional error bars); failed cells as markers on top.

    Where every drawn cell has the same x, lines would be single points stacked on one x:
    the panel becomes a dot chart instead (:func:`draw_dots`). ``legend=False`` leaves the
    legend to :func:`shared_legend` (figures of several panels).
    """
    xs = [f[x] for f in (df, failed) if f is not None and x in f]
    if xs and pd.concat(xs).nunique() == 1:
        draw_dots(ax, df, x, y, groups, yerr=yerr, failed=failed, logy=logy)
        return
    styles = {}
    if not df.empty:
        parts = sorted(df.groupby(list(groups), sort=False), key=lambda kv: group_key(kv[0], groups))
        for key, part in parts:
            part = part.sort_values(x)
            err = error_bars(part, y, yerr)
            label = _label(key, groups)
            styles[key if isinstance(key, tuple) else (key,)] = style = style_of(ax.figure, label)
            ax.errorbar(part[x], part[y], yerr=err, ms=3.5, capsize=2, label=label, **style)
    if failed is not None and not failed.empty:
        for (status, *key), part in failed.groupby(["status", *groups]):
            color = styles.get(tuple(key), {}).get("color", "black")
            _mark_failed(ax, part[x], status, _label(tuple(key), groups), color)
    # log scales only over drawn data: an axis holding nothing cannot be log-scaled
    if logx and (not df.empty or (failed is not None and not failed.empty)):
        ax.set_xscale("log", base=2)
    if logy and not df.empty:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    entries = len(ax.get_legend_handles_labels()[0])
    if legend and entries:
        # beside the panel once it would cover the lines
        ax.legend(**({"loc": "upper left", "bbox_to_anchor": (1.01, 1)} if entries > 5 else {}))


def draw_dots(
    ax,
    df: pd.DataFrame,
    x: str,
    y: str,
    groups: Sequence[str],
    *,
    yerr: str | tuple[str, str] | None = None,
    failed: pd.DataFrame | None = None,
    logy: bool = False,
) -> None:
    """A dot chart: one named position per group (its value of ``y`` with error bars), for a panel whose
    cells all share one ``x``; a failed group's marker sits at the top of its position.

    The groups are named on the x axis (no legend needed), y keeps its meaning, so a caller's
    ``axhline`` or y label still applies.
    """
    frames = [f for f in (df, failed) if f is not None and not f.empty]
    keys = sorted(
        {k if isinstance(k, tuple) else (k,) for f in frames for k, _ in f.groupby(list(groups), sort=False)},
        key=lambda k: group_key(k, groups),
    )
    where = {key: i for i, key in enumerate(keys)}
    if not df.empty:
        for key, part in df.groupby(list(groups), sort=False):
            key = key if isinstance(key, tuple) else (key,)
            style = {**style_of(ax.figure, _label(key, groups)), "linestyle": "none"}
            ax.errorbar(
                np.full(len(part), where[key]), part[y], yerr=error_bars(part, y, yerr), ms=6, capsize=3, label=_label(key, groups), **style
            )
    if failed is not None and not failed.empty:
        for (status, *key), part in failed.groupby(["status", *groups]):
            _mark_failed(ax, [where[tuple(key)]], status, _label(tuple(key), groups))
    # values only on the ticks, the axes' names once below them
    ax.set_xticks(range(len(keys)), [", ".join(str(v) for v in k) for k in keys], rotation=30, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(keys) - 0.4)
    ax.grid(False, axis="x")
    if logy and not df.empty:
        ax.set_yscale("log")
    value = pd.concat([f[x] for f in frames]).iloc[0] if frames else ""
    ax.set_xlabel(f"{', '.join(groups)}   ({x} = {value})")
    ax.set_ylabel(y)


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


def empty_panel(ax, text: str) -> None:
    """A panel with nothing to draw: ``text`` in its middle and no axes to misread."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def in_mib(df: pd.DataFrame, column: str) -> tuple[pd.DataFrame, str]:
    """A ``*_bytes`` column as MiB (the unit in its name); any other column unchanged."""
    if not column.endswith("_bytes") or column not in df:
        return df, column
    mib = column[: -len("_bytes")] + "_mib"
    return df.assign(**{mib: df[column] / MIB}), mib


def plot_scaling(df: pd.DataFrame, path: Path, run: str, groups: Sequence[str], panels: Iterable[tuple[str, str, str]], what: str) -> Path:
    """Log–log time/memory vs sequence length; ``panels`` = (mode, phase, column)."""
    panels = list(panels)
    fig, axes, legend_ax = panel_grid(len(panels))
    for ax, (mode, phase, column) in zip(axes, panels):
        data, column = in_mib(ok_cells(df, mode=mode, phase=phase), column)
        if column in data and data[column].notna().any():
            ran = data.dropna(subset=[column])
            draw_lines(ax, ran, "seq_len", column, groups, failed=failed_cells(df, mode=mode), logx=True, logy=True, legend=False)
        else:
            empty_panel(ax, f"{column}: not measured here\n(memory needs CUDA)")
        ax.set_title(f"{mode} {phase}: {column}")
    shared_legend(axes, legend_ax)
    title(fig, run, df, what)
    return save(fig, path)
