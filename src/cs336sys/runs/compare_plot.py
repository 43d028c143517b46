"""How a run comparison is shown: the ratio figure (one point per row, b/a median time with its
interval; :data:`SHOWN_ROWS` of them at most) and the text of the report's markdown tables
(:data:`LISTED` rows each, the rest counted).

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
SHOWN_ROWS = 60  # rows a ratio figure draws and labels, at 8 pt: beyond, the lowest and highest ratios
DASH = "—"
LISTED = 50  # rows a report's table lists; the rest are counted (compare.csv holds every row)


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


def shown_rows(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows a ratio figure draws, sorted by ratio: all of them up to :data:`SHOWN_ROWS`, else the
    lowest and the highest ratios (half each), and where the rows left out go (the position of the gap)."""
    if len(rows) <= SHOWN_ROWS:
        return rows, len(rows)
    half = SHOWN_ROWS // 2
    return pd.concat([rows.head(half), rows.tail(half)]), half


def ratio_figure(table: pd.DataFrame, title: str):
    """A figure of the rows of ``table`` that have a ratio, sorted by it; the caller saves and closes it.

    Points are coloured by verdict; the horizontal bars are the conservative ratio
    intervals (clipped at zero); the dashed line at 1 is "no change". Labels a reader can
    read: beyond :data:`SHOWN_ROWS` rows, the lowest and the highest ratios are drawn, and the
    figure says how many lie between and over which range (every row is in compare.csv); the
    legend counts every row.
    """
    every = table[np.isfinite(table["ratio"].astype(float))].sort_values("ratio", kind="stable").reset_index(drop=True)
    rows, gap = shown_rows(every)
    n, left_out = len(rows), len(every) - len(rows)
    y = np.arange(n) + (np.arange(n) >= gap) * (left_out > 0)  # one slot left empty where rows are left out
    fig, ax = plt.subplots(figsize=(10, max(3.0, 1.6 + 0.26 * (n + bool(left_out)))), dpi=120)
    ratio = rows["ratio"].astype(float)
    low = rows["ratio_low"].astype(float).clip(lower=0.0)
    high = rows["ratio_high"].astype(float)
    edge = 1.1 * max(ratio.max(), np.max(high[np.isfinite(high)].to_numpy(), initial=0.0))
    high = high.replace(np.inf, edge)  # unbounded above: the bar runs to the plot's edge
    for verdict, colour in COLOURS.items():
        sel = (rows["verdict"] == verdict).to_numpy()
        label = f"{verdict} ({int((every['verdict'] == verdict).sum())})"
        if not sel.any():
            if (every["verdict"] == verdict).any():  # only among the rows left out: still counted
                ax.plot([], [], "o", ms=4, color=colour, label=label)
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
            label=label,
        )
    ax.axvline(1.0, color="black", lw=1, ls="--", zorder=0)
    ax.set_yticks(y, [cell_label(r) for _, r in rows.iterrows()], fontsize=8)
    if left_out:
        between = every["ratio"].iloc[gap : gap + left_out].astype(float)
        ax.axhline(gap, color="grey", lw=0.8, ls=":")
        ax.text(
            0.5,
            gap,
            f"… {left_out} rows between, ratio {between.min():.3g} to {between.max():.3g} (every row in compare.csv)",
            transform=ax.get_yaxis_transform(),
            ha="center",
            va="center",
            fontsize=8,
            backgroundcolor="white",
        )
        title += f"\n{n} of {len(every)} rows: the {gap} lowest and {n - gap} highest ratios"
    ax.set_ylim(-0.7, y.max() + 0.7 if n else 0.7)
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


def texts_where(where: np.ndarray, text: Callable[..., str], *columns: pd.Series) -> np.ndarray:
    """``text`` of the columns' values on the rows ``where`` (few: the rows that need a note), "" elsewhere."""
    out = np.full(len(where), "", dtype=object)
    out[where] = [text(*values) for values in zip(*(np.asarray(c)[where] for c in columns))]
    return out


def ratio_texts(rows: pd.DataFrame) -> list[str]:
    """:func:`ratio_text` of every row, without building a Series per row."""
    cols = [rows[c].astype(float).to_numpy() for c in ("ratio", "ratio_low", "ratio_high")]
    return [ratio_text({"ratio": r, "ratio_low": lo, "ratio_high": hi}) for r, lo, hi in zip(*cols)]


def listed(rows: pd.DataFrame, show: Callable[[pd.DataFrame], str], limit: int | None = None) -> str:
    """``show`` of the first ``limit`` rows (:data:`LISTED`), then how many more: a report a reader can read."""
    limit = LISTED if limit is None else limit
    more = len(rows) - limit
    return show(rows.head(limit)) + (f"\n\n… and {more} more, every row in compare.csv" if more > 0 else "")


def md(df: pd.DataFrame, fmt: Mapping[str, Callable[[Any], str]] | None = None) -> str:
    fmt = {"median_a_ms": lambda v: sig(v, 4), "median_b_ms": lambda v: sig(v, 4), **(fmt or {})}
    shown = pd.DataFrame({c: [fmt[c](v) if c in fmt else cell_text(v) for v in df[c]] for c in df.columns})
    return shown.to_markdown(index=False, disable_numparse=True)


def cells_md(rows: pd.DataFrame, extra: Sequence[str] = ()) -> str:
    view = rows.assign(**{"ratio b/a [interval]": ratio_texts(rows)})
    cols = [c for c in ("study", "cell_id", "mode", "phase") if c in view and (view[c] != "").any()]
    return md(view[cols + ["median_a_ms", "median_b_ms", "ratio b/a [interval]", *extra]])
