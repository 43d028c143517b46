"""The rows of an LM run that the answers read: steps launched eagerly (no torch.compile, no CUDA
graph: the handout's plain PyTorch step) and §1.1.3(a)'s slice, the (context_length, precision,
impl) measured for the most sizes."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from cs336sys.analysis.markdown import is_empty
from cs336sys.analysis.tables import timed
from cs336sys.handout.answers_common import Run

EAGER_LAUNCHES = {"compile": 0, "cuda_graphs": 0}  # the handout's plain PyTorch step


def eager_rows(df: pd.DataFrame, **where) -> pd.DataFrame:
    """Timed ok rows of plain eager steps (no torch.compile, no CUDA graph) matching ``where``."""
    return eager_launches(timed(df, **where))


def eager_launches(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of steps launched eagerly: no torch.compile, no CUDA graph (where the table has those axes)."""
    for col, value in EAGER_LAUNCHES.items():
        df = df[df[col] == value] if col in df else df
    return df


def lm_slice(rows: pd.DataFrame) -> tuple | None:
    """(context_length, precision, impl) measured for the most sizes; fp32, eager and long contexts first."""
    if rows.empty:
        return None
    counts = rows.groupby(["context_length", "precision", "impl"])["size"].nunique()
    return max(counts.index, key=lambda k: (counts[k], k[1] == "fp32", k[2] == "eager", k[0]))


@dataclass(frozen=True)
class Slice:
    """The rows of §1.1.3(a): the (context_length, precision, impl) measured for the most sizes, eager launches."""

    key: tuple  # (context_length, precision, impl)
    part: pd.DataFrame  # its training forward and backward rows
    gpu: pd.DataFrame  # the GPU times of its training rows (the e2e facts' `gpu`)
    where: str  # "fp32, eager attention, context 512, batch 4"


def forward_backward(run: Run) -> Slice | None:
    e2e = run.rows("e2e")
    if e2e is None:
        return None
    train = eager_rows(e2e, mode="train")
    train = train[train["phase"].isin(["forward", "backward"])].dropna(subset=["median_ms"])
    key = lm_slice(train)
    if key is None:
        return None
    ctx, precision, impl = key
    part = train[(train["context_length"] == ctx) & (train["precision"] == precision) & (train["impl"] == impl)]
    batch = part["batch_size"].dropna() if "batch_size" in part else pd.Series(dtype=float)
    where = f"{precision}, {impl} attention, context {ctx}" + (f", batch {int(batch.iloc[0])}" if len(batch) else "")
    gpu = same_slice(run.facts("e2e").gpu, key)
    return Slice(key, part, gpu[gpu["mode"] == "train"] if not gpu.empty else gpu, where)


def same_slice(df: pd.DataFrame, key: tuple) -> pd.DataFrame:
    """Rows of one (context_length, precision, impl) slice launched eagerly (no compile, no CUDA graph)."""
    ctx, precision, impl = key
    return df if df.empty else eager_launches(df[(df["context_length"] == ctx) & (df["precision"] == precision) & (df["impl"] == impl)])


def is_wide(row: pd.Series) -> bool:
    """True where the row's interval is wider than the `noisy` threshold (the merge's flag)."""
    flag = row.get("noisy")
    return bool(flag) if not is_empty(flag) else False
