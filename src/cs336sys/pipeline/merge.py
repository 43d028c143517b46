"""Reading and merging result CSVs: the one place per-cell files become a study table.

Cell CSVs are checked against the row contract as they are merged
(:mod:`cs336sys.pipeline.cellcheck`): a bad one stops the merge, named. Text columns
(commits, hosts, versions, cell ids: :data:`cs336sys.rows.TEXT_COLUMNS`)
are read as text from cell and merged CSVs alike.

Runs committed before the axes got one name each (``ctx``, ``attn``, ``seq``,
…) still load: each study's ``Study.renamed`` renames their columns, its
``added_axes`` fills the axes they lacked, and their cell ids are rebuilt from
the axes, so old and new runs compare cell by cell.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from cs336sys.analysis.metrics import add_derived
from cs336sys.analysis.passes import combine_passes
from cs336sys.catalog import LM
from cs336sys.pipeline.cellcheck import read_cells
from cs336sys.rows import BadRowsError, check_rows, order_columns, read_rows
from cs336sys.studies import STUDIES, cell_id
from cs336sys.studies import study as get_study


def upgrade(df: pd.DataFrame, study: str) -> pd.DataFrame:
    """Rename an old run's axis columns, fill the axes it lacked and rebuild its cell ids; a no-op on current runs."""
    spec = get_study(study) if study in STUDIES else None
    renames = {old: new for old, new in spec.renamed.items() if old in df} if spec else {}
    if not renames:
        return df
    df = df.drop(columns=[new for new in renames.values() if new in df]).rename(columns=renames)
    df = df.assign(**{axis: value for axis, value in spec.added_axes.items() if axis not in df})
    axes = spec.axes
    if set(axes) <= set(df.columns) and "cell_id" in df:
        df["cell_id"] = [cell_id(study, dict(zip(axes, values))) for values in df[list(axes)].itertuples(index=False)]
    return df[order_columns(df.columns, axes)]


def merge_cells(
    paths: Iterable[str | Path],
    study: str,
    peak_overrides: Mapping | None = None,
    flags: Mapping | None = None,
    floor_rel: float = 0.0,
    peak_gbps: Mapping | None = None,
) -> pd.DataFrame:
    """One study's cell CSVs (every pass, every status) as one table with derived metrics.

    Each file must hold cell ``<its stem>`` of ``study`` by the row contract, or
    :class:`cs336sys.pipeline.cellcheck.BadCellError` names every file that does not.
    The passes of a cell become one row per (cell, mode, phase), with intervals at
    least ``floor_rel`` wide (:func:`cs336sys.analysis.passes.combine_passes`).
    """
    frames = read_cells(paths, study)
    if not frames:
        return pd.DataFrame(columns=["study", "cell_id", "status", "error"])
    merged = pd.concat(frames, ignore_index=True, sort=False)
    axes = get_study(study).axes
    merged = combine_passes(merged, floor_rel, (flags or {}).get("min_gpu_busy", 0.9), axes)
    merged = merged[order_columns(merged.columns, axes)]
    return derive(merged, study, peak_overrides, flags, peak_gbps)


def derive(
    df: pd.DataFrame, study: str, peak_overrides: Mapping | None = None, flags: Mapping | None = None, peak_gbps: Mapping | None = None
) -> pd.DataFrame:
    """:func:`cs336sys.analysis.metrics.add_derived` with what ``study`` says of its rows: its attention core, its kind."""
    spec = get_study(study)
    return add_derived(df, peak_overrides, flags, peak_gbps, shape=spec.attention_shape, lm=spec.kind == LM)


def load_study(path: str | Path, study: str | None = None, check: bool = False) -> pd.DataFrame:
    """A merged study CSV, text columns as text, an old run's columns renamed (:func:`upgrade`).

    A file that pandas cannot read as a CSV, or whose header repeats a column, is refused with
    :class:`cs336sys.rows.BadRowsError` naming it. ``check``: its rows must keep the row contract
    (:func:`cs336sys.rows.problems`), or the error names the file and each broken row. The readers of
    runs that anyone may hand them check (a comparison and its gate, the handout page, the between-device
    figures); the workflow's report reads what its merge just checked. A CSV that no ``study`` names,
    whose name is no study's and that has no ``study`` column (a ``summary.csv``) is no study's: as read.
    """
    try:
        df = read_rows(path)
        with open(path, newline="", encoding="utf-8") as lines:
            header = next(csv.reader(lines), [])
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError, csv.Error) as exc:
        raise BadRowsError(f"{path}: not a CSV ({type(exc).__name__}: {str(exc).strip().splitlines()[0]})") from None
    except OSError as exc:
        raise BadRowsError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if twice := sorted({c for c in header if header.count(c) > 1}):  # pandas would read the first as the column
        raise BadRowsError(f"{path}: column {', '.join(map(repr, twice))} appears more than once")
    if study is None and "study" not in df and Path(path).stem not in STUDIES:
        return df
    for column in ("error", "mode", "phase"):  # empty means "none" (a failure before any part), not NaN
        if column in df:
            df[column] = df[column].astype("object").fillna("")
    study = study or (str(df["study"].iloc[0]) if "study" in df and len(df) else None)
    df = upgrade(df, study) if study else df
    return check_rows(df, path) if check else df
