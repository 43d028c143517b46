"""Study tables as the report modules read them: the ok rows, the failures, the rows of one kind.

A merged study CSV loads through :func:`cs336sys.pipeline.merge.load_study` (which also
upgrades a run committed under older column names); these helpers only filter the table.
"""

from __future__ import annotations

import pandas as pd

from cs336sys.columns import timed_kind
from cs336sys.rows import Status

OK = Status.OK.value


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


def timed(df: pd.DataFrame, **where) -> pd.DataFrame:
    """The ok timed rows (a median, not a pair row) matching column == value for each keyword."""
    rows = ok_rows(df, **where)
    if rows.empty or "median_ms" not in rows:
        return rows.iloc[0:0]
    if "kind" in rows:
        rows = rows[timed_kind(rows["kind"])]
    return rows[pd.to_numeric(rows["median_ms"], errors="coerce").notna()]


def of_kind(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The ok rows of one ``kind`` (none when no cell produced that kind, e.g. all skipped)."""
    if "kind" not in df:
        return df.iloc[0:0]
    return df[(df["status"] == OK) & (df["kind"] == kind)]
