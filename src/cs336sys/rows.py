"""Ground floor: the row schema every cell CSV follows, and the one way rows become a file.

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

import pandas as pd

from cs336sys.columns import ENV_COLUMNS, HEAD_COLUMNS, RESERVED_COLUMNS, TIMING_COLUMNS, WHERE_COLUMNS  # noqa: F401
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
    HEAD_COLUMNS + WHERE_COLUMNS
    + ["device", "device_name", "driver_version", "torch_version", "cuda_version", "python_version", "git_commit",
       "host", "started_at", "finished_at", "pass_started_at", "pass_finished_at", "gpu_uuid", "gpu_state_note",
       "cpu_model", "kind", "stop_reason", "model"]
)  # fmt: skip
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
