"""Reading and merging result CSVs: the one place the per-cell files become a study table."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import pandas as pd

from cs336sys.cells import order_columns
from cs336sys.metrics import add_derived
from cs336sys.studies import study as get_study

OK = "ok"


def merge_cells(paths: Iterable[str | Path], study: str, peak_overrides: Mapping | None = None) -> pd.DataFrame:
    """Concatenate one study's cell CSVs (every status kept) and add derived metrics."""
    frames = [pd.read_csv(p) for p in paths]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=["study", "cell_id", "status", "error"])
    merged = pd.concat(frames, ignore_index=True, sort=False)
    merged = merged[order_columns(merged.columns, get_study(study).axes)]
    return add_derived(merged, peak_overrides)


def load_study(path: str | Path) -> pd.DataFrame:
    df = pd.read_csv(path)
    if "error" in df:
        df["error"] = df["error"].fillna("")
    return df


def failures(df: pd.DataFrame) -> pd.DataFrame:
    """One row per failed (cell, part): status other than ok, with its error text."""
    if df.empty or "status" not in df:
        return df
    bad = df[df["status"] != OK]
    keep = [c for c in ("study", "cell_id", "mode", "status", "error") if c in bad]
    return bad[keep].drop_duplicates()


def ok_rows(df: pd.DataFrame, **where) -> pd.DataFrame:
    """The ok rows matching column == value for each keyword."""
    if df.empty:
        return df
    mask = df["status"] == OK
    for col, value in where.items():
        if col not in df:
            return df.iloc[0:0]
        mask &= df[col] == value
    return df[mask]
