"""Checking cell CSVs against the row contract before they are merged: a bad file is named, never dropped.

A cell CSV holds a header and at least one row; every row has the head columns
(``study``, ``cell_id``, ``status``, ``error``) and the study's axes, a status from
:data:`cs336sys.rows.STATUSES`, and the cell id of the file it is in (the
workflow names a cell's file after its id, ``<cell_id>.csv``) and that its axes make;
and its rows keep the row contract (:func:`cs336sys.rows.problems`: times above zero,
intervals that hold them, no row twice; a duplicated timed row would pass for a second
pass and set the cell's interval), and one file holds one pass.
A header-only file would vanish from the merge and the report would count one cell
fewer; garbage would become a junk row and column; a missing ``status`` would crash the
report later, far from the file. So the merge reads every file through :func:`read_cells`
and stops, naming each bad file and what is wrong with it, before anything is written.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from cs336sys.rows import HEAD_COLUMNS, STATUSES, parse_rows, timed_ok
from cs336sys.rows import problems as row_problems
from cs336sys.studies import cell_id
from cs336sys.studies import study as get_study

REMEASURE = "delete the file and rerun the workflow to measure the cell again"


class BadCellError(ValueError):
    """Cell CSVs that break the row contract; the message names each file and what is wrong with it."""


def problem(text: str, study: str, expected_id: str) -> str | None:
    """What makes ``text`` (a cell CSV's content) break the row contract for cell ``expected_id``; None if nothing."""
    if not text.strip():
        return "empty file: no header and no rows (a write cut short?)"
    if "\0" in text:
        return "holds NUL bytes: not a CSV"
    try:
        records = [r for r in csv.reader(io.StringIO(text, newline="")) if r]  # blank lines: pandas skips them too
    except csv.Error as exc:
        return f"not a CSV ({exc})"
    header, body = records[0], records[1:]
    axes = list(get_study(study).axes)
    missing = [c for c in dict.fromkeys(HEAD_COLUMNS + axes) if c not in header]
    if missing:
        return (
            f"missing column{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))} "
            f"(a cell CSV of {study} has {', '.join(HEAD_COLUMNS + axes)}, then its measurements)"
        )
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        return f"column {', '.join(map(repr, twice))} appears more than once"
    if not body:
        return "no rows (header only): the cell recorded no result, not even a failure"
    for n, record in enumerate(body, 1):
        where = f"row {n} of {len(body)}"
        if len(record) != len(header):
            return f"{where} has {len(record)} fields where the header has {len(header)} (a truncated or damaged row)"
        row = dict(zip(header, record))
        if row["study"] != study:
            return f"{where}: study {row['study']!r}, but the file is a cell of {study!r}"
        if row["status"] not in STATUSES:
            return f"{where}: status {row['status']!r} is not one of {', '.join(STATUSES)}"
        if row["cell_id"] != expected_id:
            return f"{where}: cell_id {row['cell_id']!r}, but the file is cell {expected_id!r}"
        made = cell_id(study, {a: row[a] for a in axes})  # axes as written: 16, fp32, 1 for True
        if made != expected_id:
            return f"{where}: its axes make cell {made!r}, not {expected_id!r}"
    return None


def _read(path: Path, study: str) -> tuple[pd.DataFrame | None, str | None]:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text (byte {exc.start}): binary or damaged"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    what = problem(text, study, path.stem)  # a cell CSV is named by its cell id
    if what is not None:
        return None, what
    frame = parse_rows(text)
    found = row_problems(frame, merged=False)
    return (None, "; ".join(found)) if found else (frame, None)


def read_cells(paths: Iterable[str | Path], study: str) -> list[pd.DataFrame]:
    """Every cell CSV of ``paths`` read and checked; one :class:`BadCellError` naming every bad file, if any."""
    paths = [Path(p) for p in paths]
    frames, bad = [], []
    for path in paths:
        frame, what = _read(path, study)
        if what is None:
            frames.append(frame)
        else:
            bad.append(f"{path}: {what}")
    bad = bad or _same_pass_twice(frames, paths)
    if len(bad) == 1:
        raise BadCellError(f"bad cell CSV {bad[0]}; {REMEASURE}")
    if bad:
        raise BadCellError(
            f"{len(bad)} bad cell CSVs of study {study} (delete each and rerun the workflow to measure "
            "those cells again):\n" + "\n".join(f"  {b}" for b in bad)
        )
    return frames


def _same_pass_twice(frames: list[pd.DataFrame], paths: list[Path]) -> list[str]:
    """A cell's pass recorded in two files (one pass's CSV copied over another's), or a file holding rows
    of two passes: the merge would fold its timed rows as passes of one cell, as it would a duplicated row."""
    seen: dict[tuple[str, str], Path] = {}
    out = []
    for frame, path in zip(frames, paths):
        if "pass_index" not in frame:
            continue
        if (passes := sorted(frame["pass_index"].dropna().astype(str).unique())) and len(passes) > 1:
            out.append(f"{path}: rows of passes {', '.join(passes)}: a cell CSV holds one pass")
            continue
        timed = frame[timed_ok(frame)]
        for key in dict.fromkeys(zip(timed["cell_id"].astype(str), timed["pass_index"].astype(str))):
            if key in seen:
                out.append(f"{path}: pass {key[1]} of cell {key[0]} again, as in {seen[key]}")
            else:
                seen[key] = path
    return out
