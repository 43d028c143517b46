"""Markdown tables for people: the one formatter the report, the answers and the CLI share.

The rules every table follows, so that no caller formats numbers by hand:

- integers print as integers: ``32768.0`` → ``32768`` (pandas makes a column float as
  soon as one of its cells is empty);
- no exponent for large numbers: 15360.4 at 4 significant digits prints ``15360``, not
  ``1.536e+04``; tiny values (accumulation errors) keep theirs;
- memory in MiB or GiB with the unit in the header: a ``*_bytes`` column becomes MiB, a MiB
  column (``*_mib``, ``… MiB``) that reaches 1 GiB becomes GiB, renamed to say so (unless it
  also holds values under 0.1 GiB: those stay readable in MiB);
- an empty cell says why: the row's failure where the row has one (``OOM``, ``timeout``,
  ``error``, ``skipped``), otherwise ``n/a`` or the caller's word for that column;
- rows in model-size order (small < medium < large < xl < 2.7B), never alphabetical.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from cs336sys.models.sizes import MODEL_SIZES, parameter_count

MIB = 2**20
NOT_APPLICABLE = "n/a"
# what an empty cell of a failed row says, by row status; the first that the row has wins
EMPTY_BY_STATUS = {"oom": "OOM", "timeout": "timeout", "error": "error", "wrong": "wrong", "skipped": "skipped"}


def size_key(name: Any) -> tuple:
    """Sort key of a model size: the built-in table by parameter count, extra sizes (``tiny``…) first.

    Extra sizes come from a config and are smaller CPU shapes in every committed config;
    among themselves they sort by name.
    """
    size = MODEL_SIZES.get(str(name))
    return (1, parameter_count(size), "") if size else (0, 0, str(name))


def value_key(value: Any) -> tuple:
    """Sort key for one axis value of mixed or missing type: numbers, then text, then empty."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (2, 0, "")
    if is_number(value):
        return (0, float(value), "")
    return (1, 0, str(value))


def in_size_order(df: pd.DataFrame) -> pd.DataFrame:
    """Rows reordered by model size within each run of equal columns left of ``size``; otherwise kept.

    The rows' order stays the caller's except that sizes follow the size table: a table
    sorted by (size, context) alphabetically becomes small, medium, … with contexts in order.
    """
    if "size" not in df.columns or len(df) < 2:
        return df
    left = list(df.columns[: list(df.columns).index("size")])
    block = df.groupby(left, sort=False, dropna=False).ngroup().to_numpy() if left else np.zeros(len(df), dtype=int)
    order = sorted(range(len(df)), key=lambda i: (block[i], size_key(df["size"].iloc[i])))  # stable
    return df.iloc[order]


def is_empty(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def format_number(value: Any, floatfmt: str = ".4g") -> str:
    """One number as a reader wants it: whole numbers without ``.0``, no ``e+`` exponents."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    v = float(value)
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    text = format(v, floatfmt)
    if "e+" in text:  # 1.536e+04 → 15360: a number this large reads best as a whole number
        return f"{v:.0f}"
    return text


def format_gib(value: float) -> str:
    """GiB to three significant digits, keeping the decimals that say so: 15.0, 1.50, 150."""
    decimals = max(0, min(2, 2 - math.floor(math.log10(abs(value))))) if value else 1
    return f"{value:.{decimals}f}"


def _is_mib(name: str) -> bool:
    return name.endswith("_mib") or "MiB" in name


def _gib_reads_better(mib: pd.Series) -> bool:
    """GiB once a column reaches 1 GiB, unless it also holds values under 0.1 GiB (they would read 0.00)."""
    sizes = mib.abs().dropna()
    sizes = sizes[sizes > 0]
    return bool(len(sizes)) and sizes.max() >= 1024 and sizes.min() >= 102.4


def _in_gib(name: str) -> str:
    """The header of a MiB column converted to GiB: ``peak_mem_mib`` → ``peak_mem_gib``, ``peak MiB`` → ``peak GiB``."""
    return name[: -len("_mib")] + "_gib" if name.endswith("_mib") else name.replace("MiB", "GiB")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _numeric(column: pd.Series) -> bool:
    values = [v for v in column if not is_empty(v)]
    return bool(values) and all(is_number(v) for v in values)


def _explain_empty(status: Any, default: str) -> str:
    statuses = set(str(status).split(",")) if not is_empty(status) else set()
    return next((word for s, word in EMPTY_BY_STATUS.items() if s in statuses), default)


Empty = str | Mapping[Hashable, str]  # the word for an empty cell: one for all columns, or per column


def readable(df: pd.DataFrame, floatfmt: str = ".4g", empty: Empty = NOT_APPLICABLE) -> tuple[pd.DataFrame, list[str]]:
    """``df`` as text cells under the rules above, and each column's alignment (numbers right).

    ``empty``: the word for an empty cell of a row that did not fail, one for every column
    or per column (``{"first_oom": "none"}``; columns not named get ``n/a``).
    """
    df = in_size_order(df.reset_index(drop=True))
    status = df["status"] if "status" in df.columns else pd.Series([None] * len(df))
    out, align = {}, []
    for name in df.columns:
        column = df[name]
        default = empty.get(name, NOT_APPLICABLE) if isinstance(empty, Mapping) else empty
        fmt = partial(format_number, floatfmt=floatfmt)
        numeric = _numeric(column)
        header = str(name)
        if numeric and header.endswith("_bytes"):
            column, header = column.astype(float) / MIB, header[: -len("_bytes")] + "_mib"
        if numeric and _is_mib(header) and _gib_reads_better(column.astype(float)):
            column, header, fmt = column.astype(float) / 1024, _in_gib(header), format_gib
        out[header] = [
            _explain_empty(s, default) if is_empty(v) else fmt(v) if numeric or is_number(v) else str(v) for v, s in zip(column, status)
        ]
        align.append("right" if numeric else "left")
    return pd.DataFrame(out, columns=list(out)), align


def md_table(df: pd.DataFrame | None, floatfmt: str = ".4g", *, empty: Empty = NOT_APPLICABLE) -> str:
    """``df`` as a markdown table that a reader can read (see the module's rules)."""
    if df is None or df.empty:
        return "_(no rows)_"
    text, align = readable(df, floatfmt, empty)
    return text.to_markdown(index=False, disable_numparse=True, colalign=align)
