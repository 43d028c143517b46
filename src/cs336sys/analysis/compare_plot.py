"""The ratio figure of a run comparison: one point per cell (b/a median time) with its interval.

Kept apart from :mod:`cs336sys.analysis.compare` so that the table logic stays short; like it,
this module imports no torch and nothing else from cs336sys.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, no display: set before pyplot is imported

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

COLOURS = {"slower": "#d62728", "faster": "#2ca02c", "same": "#7f7f7f", "n/a": "#9467bd"}
LABEL_WIDTH = 60
MAX_HEIGHT_IN = 40.0


def shorten(text: str, width: int = LABEL_WIDTH) -> str:
    """``text`` cut in the middle to at most ``width`` characters (both ends carry the axes)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    tail = width - 1 - head
    return f"{text[:head]}…{text[-tail:]}"


def cell_label(row) -> str:
    where = "/".join(str(v) for v in (row["mode"], row["phase"]) if isinstance(v, str) and v)
    cell = str(row["cell_id"])
    if not where:
        return shorten(cell)
    return f"{shorten(cell, LABEL_WIDTH - len(where) - 3)} · {where}"


def ratio_figure(table: pd.DataFrame, title: str):
    """A figure of the rows of ``table`` that have a ratio, sorted by it; the caller saves and closes it.

    Points are coloured by verdict; the horizontal bars are the conservative ratio
    intervals (clipped at zero); the dashed line at 1 is "no change".
    """
    rows = table[np.isfinite(table["ratio"].astype(float))].sort_values("ratio", kind="stable").reset_index(drop=True)
    n = len(rows)
    height = min(MAX_HEIGHT_IN, max(3.0, 1.6 + 0.26 * n))
    fontsize = 8.0 if n <= 150 else max(3.5, 8.0 * 150 / n)
    fig, ax = plt.subplots(figsize=(10, height), dpi=120)
    y = np.arange(n)
    ratio = rows["ratio"].astype(float)
    low = rows["ratio_low"].astype(float).clip(lower=0.0)
    high = rows["ratio_high"].astype(float)
    for verdict, colour in COLOURS.items():
        sel = (rows["verdict"] == verdict).to_numpy()
        if not sel.any():
            continue
        below = (ratio[sel] - low[sel]).clip(lower=0.0).fillna(0.0)
        above = (high[sel] - ratio[sel]).clip(lower=0.0).fillna(0.0)
        ax.errorbar(
            ratio[sel],
            y[sel],
            xerr=[below.to_numpy(), above.to_numpy()],
            fmt="o",
            ms=4,
            capsize=2,
            color=colour,
            ecolor=colour,
            lw=1,
            label=f"{verdict} ({int(sel.sum())})",
        )
    ax.axvline(1.0, color="black", lw=1, ls="--", zorder=0)
    ax.set_yticks(y, [cell_label(r) for _, r in rows.iterrows()], fontsize=fontsize)
    ax.set_ylim(-0.7, n - 0.3)
    lo = np.nanmin(np.concatenate([ratio.to_numpy(), low.to_numpy(), [1.0]]))
    hi = np.nanmax(np.concatenate([ratio.to_numpy(), high.replace(np.inf, np.nan).to_numpy(), [1.0]]))
    if lo > 0 and hi / lo > 4:
        ax.set_xscale("log")  # wide spread: equal factors get equal room on both sides of 1
    else:
        pad = 0.05 * (hi - lo) + 0.01
        ax.set_xlim(max(0.0, lo - pad), hi + pad)
    ax.set_xlabel("ratio b/a of median time (> 1: b slower), with its interval", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def close(fig) -> None:
    plt.close(fig)
