"""Figures, findings and facts of study ``precision``: accumulation error and autocast dtype tables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.plots import ok_cells, plt, save, title
from cs336sys.analysis.tables import ok_rows
from cs336sys.rows import ENV_COLUMNS


def plot_accumulation(df: pd.DataFrame, path: Path, run: str) -> Path:
    data = ok_cells(df, kind="accumulation")
    fig, ax = plt.subplots(figsize=(6, 3))
    labels = [
        f"{a} += {s}" + (" (cast)" if "cast" in str(c) else "") for a, s, c in zip(data["accumulator"], data["summand"], data["case"])
    ]
    ax.barh(labels, data["abs_error"].clip(lower=1e-9))
    ax.set_xscale("log")
    ax.set_xlabel("|sum − 10| after adding 0.01 a thousand times")
    title(fig, run, df, "accumulation error by dtype")
    return save(fig, path)


def figures(df: pd.DataFrame, run: str) -> list:
    return [("accumulation", lambda p: plot_accumulation(df, p, run))] if "kind" in df and (df["kind"] == "accumulation").any() else []


KINDS = ("accumulation", "autocast-bf16", "autocast-fp16")  # the parts' row kinds


def findings(df: pd.DataFrame) -> str:
    parts = []
    for kind, rows in facts(df).parts.items():
        if not rows.empty:
            skip = {"study", "cell_id", "status", "error", "part", "mode", "kind", *ENV_COLUMNS}
            keep = [c for c in rows.columns if c not in skip and rows[c].notna().any()]
            parts += [f"**{kind}:**", md_table(rows[keep], ".10g")]
    return "\n\n".join(parts)


@dataclass(frozen=True)
class PrecisionFacts:
    """What the handout's answers quote of a precision run."""

    parts: Mapping[str, pd.DataFrame]  # row kind (accumulation, autocast-bf16, autocast-fp16) → its ok rows


def facts(df: pd.DataFrame) -> PrecisionFacts:
    return PrecisionFacts({kind: ok_rows(df, kind=kind) for kind in KINDS})
