"""Ground floor: the row schema every cell CSV follows, the one way rows become a file, and the
row contract every reader of rows checks (:func:`problems`).

A row is one measured (cell, mode, phase) or one typed record (``kind``) of a
cell. Every row carries the head columns, the cell's axes, its measurements and
the environment columns; a failure is a row with a status and empty
measurements. No torch here: the analysis layer reads the same schema.
"""

from __future__ import annotations

import enum
import io
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from cs336sys.columns import (  # noqa: F401
    ENV_COLUMNS,
    GPU_TIME_PREFIX,
    HEAD_COLUMNS,
    PAIR_KIND,
    WHERE_COLUMNS,
    timed_kind,
)
from cs336sys.fileio import atomic_path


class Status(str, enum.Enum):
    OK = "ok"
    OOM = "oom"
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    WRONG = "wrong"  # an attention implementation failed its check against a float64 reference: not timed

    def __str__(self) -> str:  # rows and CSVs hold the plain value
        return self.value


STATUSES = tuple(s.value for s in Status)

# Columns read back as text, never as numbers: an all-digit commit ("018351308966", about one
# commit in 280) or a host "0042" would lose its leading zeros, CUDA "12.10" would become 12.1.
TEXT_COLUMNS = frozenset(
    HEAD_COLUMNS
    + WHERE_COLUMNS
    + "device device_name driver_version torch_version cuda_version python_version git_commit host started_at finished_at".split()
    + "pass_started_at pass_finished_at gpu_uuid gpu_state_note cpu_model kind stop_reason model".split()
)
TEXT_SUFFIXES = ("_version", "_note")  # triton_version, mfu_note, pair_note, …


class Skip(Exception):
    """Raised by a measurement that cannot run on this machine; the cell becomes ``skipped``."""


class Wrong(Exception):
    """Raised by a measurement whose implementation computes a wrong answer; the cell becomes ``wrong``, untimed."""


def order_columns(columns: Iterable[str], axes: Iterable[str] = ()) -> list[str]:
    """The CSV schema's column order: head, axes, mode/phase, measurements, environment."""
    columns = list(dict.fromkeys(columns))
    axes = [a for a in axes if a in columns and a not in HEAD_COLUMNS]
    head = [c for c in HEAD_COLUMNS if c in columns]
    env = [c for c in ENV_COLUMNS if c in columns]
    where = [c for c in WHERE_COLUMNS if c in columns and c not in axes]
    rest = [c for c in columns if c not in head + axes + where + env]
    return head + axes + where + rest + env


def rows_to_frame(rows: list[Mapping[str, Any]], axes: Iterable[str] = ()) -> pd.DataFrame:
    frame = pd.DataFrame([{k: str(v) if isinstance(v, Status) else v for k, v in r.items()} for r in rows])
    return frame[order_columns(frame.columns, axes)]


def write_csv_atomic(frame: pd.DataFrame, path: str | os.PathLike) -> None:
    """A killed run leaves no half CSV, and only a regular file is replaced (see :mod:`cs336sys.fileio`)."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def is_text_column(name: str) -> bool:
    return name in TEXT_COLUMNS or name.endswith(TEXT_SUFFIXES)


def _text_dtypes(columns: Iterable[str]) -> dict[str, type]:
    return {c: str for c in columns if is_text_column(c)}


def read_rows(path: str | os.PathLike) -> pd.DataFrame:
    """A cell or merged CSV, its text columns (:data:`TEXT_COLUMNS`) as text and the rest inferred; empty cells are NaN."""
    return pd.read_csv(path, dtype=_text_dtypes(pd.read_csv(path, nrows=0).columns))


def parse_rows(text: str) -> pd.DataFrame:
    """:func:`read_rows` of a CSV already in memory."""
    return pd.read_csv(io.StringIO(text), dtype=_text_dtypes(pd.read_csv(io.StringIO(text), nrows=0).columns))


# --- the row contract -------------------------------------------------------------------------
# The cell check before the merge (pipeline.cellcheck) and every reader of a run handed in (the comparison
# and its gate, the handout page, the between-device figures: pipeline.merge.load_study(check=True)) read
# rows through it, so a CSV whose numbers cannot be right is refused, named, before any of them turns it
# into a ratio, an interval or an answer.
TIME_TRIPLE = ("median_ms", "ci_low_ms", "ci_high_ms")
GPU_TIME_TRIPLE = tuple(GPU_TIME_PREFIX + c for c in TIME_TRIPLE)  # the same phase replayed as CUDA graphs
PAIR_TRIPLE = ("ratio", "ratio_ci_low", "ratio_ci_high")
SHOWN = 3  # broken rows named per rule; the rest are counted
# A cell CSV has every head column (pipeline.cellcheck); a merged CSV may lack ``error`` (no failure) and
# hold no row at all (a study none of whose cells a reduced run kept: its answers say "not measured").
REQUIRED_COLUMNS = ("study", "cell_id", "status")


class BadRowsError(ValueError):
    """Rows that break the row contract; the message names the file and each broken row by number and key."""


def _shown(value: Any) -> str:
    """A cell's value as the CSV holds it: text quoted, numbers as numbers."""
    return repr(value) if isinstance(value, str) else str(value)


def _key_text(df: pd.DataFrame, i: int) -> str:
    parts = [str(df[c].iat[i]) for c in ("cell_id", "mode", "phase") if c in df and pd.notna(df[c].iat[i]) and str(df[c].iat[i])]
    return " · ".join(parts) or "no cell id"


def _rows_named(df: pd.DataFrame, mask: np.ndarray, what) -> list[str]:
    """'row N (key): what' for the first :data:`SHOWN` rows of ``mask``, then how many more."""
    where = np.flatnonzero(mask)
    out = [f"row {i + 1} ({_key_text(df, i)}): {what(i)}" for i in where[:SHOWN]]
    if len(where) > SHOWN:
        out.append(f"… and {len(where) - SHOWN} more row(s) like these")
    return out


def _triple_problems(df: pd.DataFrame, rows: np.ndarray, names: tuple[str, str, str], merged: bool, required: bool) -> list[str]:
    """A centre and its interval on ``rows`` (the centre recorded there, or ``required``): see :func:`problems`."""
    centre, low_name, high_name = names
    if centre not in df:
        return []
    raw = df[centre]
    value = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    present = rows if required else rows & raw.notna().to_numpy()
    good = present & np.isfinite(value) & (value > 0)
    out = _rows_named(
        df,
        present & ~good,
        lambda i: f"{centre} {_shown(raw.iat[i])} is not a finite number above zero" if pd.notna(raw.iat[i]) else f"no {centre}",
    )
    if (low_name in df) != (high_name in df):
        return out + [f"column {low_name if low_name in df else high_name!r} without its other bound"]
    if low_name not in df:
        return out
    low, high = (pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float) for c in (low_name, high_name))
    unknown = np.isnan(low) & np.isnan(high)  # one step: a cell CSV's interval cannot be known (measure.stats)
    known = good & ~np.isnan(low) & ~np.isnan(high)
    with np.errstate(invalid="ignore"):
        checks = (
            (good & (np.isnan(low) != np.isnan(high)) | (good & unknown & merged), "no interval"),
            (known & ~(np.isfinite(low) & np.isfinite(high)), "an interval that is not finite"),
            (known & ((low > value) | (value > high)), f"an interval that does not hold its {centre}"),
            (known & (low < 0) & merged, "an interval that reaches below zero"),
        )
    for mask, what in checks:
        out += _rows_named(
            df,
            mask,
            lambda i, what=what: f"{what}: [{_shown(df[low_name].iat[i])}, {_shown(df[high_name].iat[i])}] around {_shown(raw.iat[i])}",
        )
    return out


def _duplicates(df: pd.DataFrame, rows: np.ndarray, key: list[str] | None, what: str) -> list[str]:
    """The rows of ``rows`` that repeat another's ``key`` (every column where None), by number."""
    sub = df.loc[rows, [c for c in key if c in df] if key else df.columns].astype(str)
    twice = sub.duplicated(keep=False).to_numpy()
    if not twice.any():
        return []
    positions = np.flatnonzero(rows)[twice]
    groups = list(sub[twice].groupby(list(sub.columns), sort=False, dropna=False).indices.items())
    lines = []
    for values, idx in groups[:SHOWN]:
        named = f" ({', '.join(f'{k} {v}' for k, v in zip(sub.columns, values))})" if key else ""
        lines.append(f"rows {', '.join(str(positions[j] + 1) for j in idx)} are one {what}{named}, twice: a duplicated row")
    if len(groups) > SHOWN:
        lines.append(f"… and {len(groups) - SHOWN} more duplicated {what}(s)")
    return lines


def timed_ok(df: pd.DataFrame) -> np.ndarray:
    """Which rows are ok timed rows (status ok, ``kind`` timed): the rows whose median and interval count."""
    kind = df["kind"] if "kind" in df else pd.Series(np.nan, index=df.index)
    return (df["status"] == Status.OK.value).to_numpy() & timed_kind(kind).to_numpy()


def problems(df: pd.DataFrame, merged: bool = True) -> list[str]:
    """What in ``df`` (a CSV's rows as read, in file order) breaks the row contract; [] when nothing does.

    Every row has a study, a cell id and a status of :data:`STATUSES` (:data:`REQUIRED_COLUMNS`). A timed row
    that is ok (``kind`` timed: :func:`cs336sys.columns.timed_kind`) has a finite median above zero and an
    interval that holds it; its GPU time (``gpu_*``) and a paired ratio (``kind=pair``) likewise where they
    were recorded. No two rows are the same: one timed row per (cell, mode, phase) and pass, one paired
    ratio per partner. ``merged``: a study's merged CSV, whose passes are folded: there the interval is
    known and never below zero. A cell CSV holds one pass as measured: one step gives no interval, and a
    very noisy cell's low bound may fall below zero (``measure.stats`` keeps it). A merged CSV without
    interval columns at all is an old run's (before intervals): allowed here, not judged by the gate.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df]
    if missing:
        return [f"missing column{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))} (every row has {', '.join(REQUIRED_COLUMNS)})"]
    out = []
    for column in ("study", "cell_id"):
        empty = df[column].isna().to_numpy() | (df[column].astype(str).str.strip() == "").to_numpy()
        out += _rows_named(df, empty, lambda i, column=column: f"no {column}")
    status = df["status"]
    out += _rows_named(
        df,
        ~status.isin(STATUSES).to_numpy(),
        lambda i: f"status {_shown(status.iat[i]) if pd.notna(status.iat[i]) else repr('')} is not one of {', '.join(STATUSES)}",
    )
    timed = timed_ok(df)
    out += _triple_problems(df, timed, TIME_TRIPLE, merged, required=True)
    out += _triple_problems(df, timed, GPU_TIME_TRIPLE, merged, required=False)
    pairs = (status == Status.OK.value).to_numpy() & (df["kind"] == PAIR_KIND).to_numpy() if "kind" in df else np.zeros(len(df), bool)
    out += _triple_problems(df, pairs, PAIR_TRIPLE, merged, required=False)
    passes = [] if merged else ["pass_index"]
    out += _duplicates(df, timed, ["study", "cell_id", "mode", "phase", *passes], "timed row")
    out += _duplicates(df, pairs, ["study", "cell_id", "mode", "phase", "pair_with", *passes], "paired ratio")
    whole = df.duplicated(keep=False).to_numpy() & ~timed & ~pairs
    return out + _duplicates(df, whole, None, "row")


def check_rows(df: pd.DataFrame, source: str | os.PathLike, merged: bool = True) -> pd.DataFrame:
    """``df`` unchanged if it keeps the row contract (:func:`problems`); else :class:`BadRowsError` naming ``source``."""
    found = problems(df, merged)
    if found:
        raise BadRowsError(f"{source}: breaks the row contract:\n" + "\n".join(f"  {p}" for p in found))
    return df
