"""How a run comparison is shown: the ratio figure (one point per cell, b/a median time with its
interval) and the text of the report's markdown tables.

Kept apart from :mod:`cs336sys.runs.compare` so that the table logic stays short; like it,
this module imports no torch and nothing else from cs336sys.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, no display: set before pyplot is imported

from collections.abc import Callable, Mapping, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

COLOURS = {"slower": "#d62728", "faster": "#2ca02c", "host-dependent": "#ff7f0e", "same": "#7f7f7f", "n/a": "#9467bd"}
LABEL_WIDTH = 60
MAX_HEIGHT_IN = 40.0
DASH = "—"


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
    edge = 1.1 * max(ratio.max(), np.max(high[np.isfinite(high)].to_numpy(), initial=0.0))
    high = high.replace(np.inf, edge)  # unbounded above: the bar runs to the plot's edge
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


# --- text of the report's tables ------------------------------------------------------------


def sig(x: Any, digits: int) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return DASH
    if np.isinf(x):
        return "∞"
    return f"{x:.0f}" if abs(x) >= 10**digits else f"{x:#.{digits}g}".rstrip(".")


def cell_text(value: Any) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)) or value == "":
        return DASH
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    return sig(value, 4) if isinstance(value, (float, np.floating)) else str(value).replace("|", "\\|")


def ratio_text(row) -> str:
    """'1.12 [1.08, 1.16]': the ratio with its interval (just the ratio when the interval is unknown)."""
    if pd.isna(row["ratio_low"]) or pd.isna(row["ratio_high"]):
        return sig(row["ratio"], 3)
    high = "∞" if np.isinf(float(row["ratio_high"])) else sig(row["ratio_high"], 3)
    return f"{sig(row['ratio'], 3)} [{sig(row['ratio_low'], 3)}, {high}]"


def md(df: pd.DataFrame, fmt: Mapping[str, Callable[[Any], str]] | None = None) -> str:
    fmt = {"median_a_ms": lambda v: sig(v, 4), "median_b_ms": lambda v: sig(v, 4), **(fmt or {})}
    shown = pd.DataFrame({c: [fmt[c](v) if c in fmt else cell_text(v) for v in df[c]] for c in df.columns})
    return shown.to_markdown(index=False, disable_numparse=True)


def cells_md(rows: pd.DataFrame, extra: Sequence[str] = ()) -> str:
    view = rows.assign(**{"ratio b/a [interval]": [ratio_text(r) for _, r in rows.iterrows()]})
    cols = [c for c in ("study", "cell_id", "mode", "phase") if c in view and (view[c] != "").any()]
    return md(view[cols + ["median_a_ms", "median_b_ms", "ratio b/a [interval]", *extra]])
