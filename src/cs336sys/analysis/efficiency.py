"""Where a sweep's wall time went: measuring, or starting Python, torch and compilers.

From the rows: each cell's measuring process reports when it started and ended
(``started_at``, ``finished_at``) and how long its first step took
(``first_step_s``: compilation and autotuning land there). From Snakemake's
``benchmark:`` files (``benchmarks/<run>/<study>/<cell>.tsv``, written for free
per job): each job's wall time, so a job's start-up is its wall time minus its
measuring process's. The share of the sweep spent measuring is the measuring
processes' time over the sweep's span (first cell start to last cell end).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import pandas as pd


def _per_pass(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (row, pass) with that pass's start and end: merged rows keep them ;-joined."""
    if "pass_started_at" not in df:
        return df.assign(pass_index=df["pass_index"] if "pass_index" in df else 0)
    multi = df["pass_started_at"].notna()
    single = df[~multi].assign(pass_index=0)
    spans = df[multi].assign(
        started_at=df.loc[multi, "pass_started_at"].astype(str).str.split(";"),
        finished_at=df.loc[multi, "pass_finished_at"].astype(str).str.split(";"),
    )
    spans = spans.assign(pass_index=[list(range(len(v))) for v in spans["started_at"]])
    spans = spans.explode(["started_at", "finished_at", "pass_index"])
    return pd.concat([single, spans], ignore_index=True)


def _cells(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per cell job (a cell's pass): its measuring process's start, end and first step."""
    rows = []
    for study, df in frames.items():
        if df.empty or not {"started_at", "finished_at", "cell_id"} <= set(df.columns):
            continue
        df = _per_pass(df)
        first = df.groupby(["cell_id", "pass_index"]).agg(started=("started_at", "min"), finished=("finished_at", "max"))
        if "first_step_s" in df:
            first["first_step_s"] = df[df["pass_index"] == 0].groupby(["cell_id", "pass_index"])["first_step_s"].max()
        rows.append(first.reset_index().assign(study=study))
    if not rows:
        return pd.DataFrame()
    cells = pd.concat(rows, ignore_index=True)
    cells["started"] = pd.to_datetime(cells["started"], utc=True, errors="coerce", format="ISO8601")
    cells["finished"] = pd.to_datetime(cells["finished"], utc=True, errors="coerce", format="ISO8601")
    cells["measuring_s"] = (cells["finished"] - cells["started"]).dt.total_seconds()
    return cells.dropna(subset=["measuring_s"])


def _stepping_s(frames: Mapping[str, pd.DataFrame]) -> float | None:
    """Seconds of warm-up and timed blocks over every cell, pass and mode (rows of one mode share them)."""
    total, seen = 0.0, False
    for df in frames.values():
        if df.empty or not {"warmup_s", "timed_s", "cell_id"} <= set(df.columns):
            continue
        key = [c for c in ("cell_id", "pass_index", "mode") if c in df]
        once = df.dropna(subset=["timed_s"]).drop_duplicates(key)
        total += float(
            pd.to_numeric(once["warmup_s"], errors="coerce").fillna(0).sum() + pd.to_numeric(once["timed_s"], errors="coerce").sum()
        )
        seen = seen or not once.empty
    return total if seen else None


def _benchmarks(folder: Path | None) -> pd.DataFrame:
    if folder is None or not folder.is_dir():
        return pd.DataFrame()
    rows = []
    for path in [*folder.glob("*/*.tsv"), *folder.glob("*/pass*/*.tsv")]:  # pass k > 0 in pass<k>/
        table = pd.read_csv(path, sep="\t")
        in_pass = path.parent.name.startswith("pass") and path.parent.name[4:].isdigit()
        study, k = (path.parent.parent.name, int(path.parent.name[4:])) if in_pass else (path.parent.name, 0)
        if "s" in table and len(table):
            rows.append({"study": study, "cell_id": path.stem, "pass_index": k, "job_s": float(table["s"].iloc[-1])})
    return pd.DataFrame(rows)


def sweep_efficiency(frames: Mapping[str, pd.DataFrame], benchmarks: Path | None = None) -> pd.DataFrame:
    """One table: the sweep's span, time measuring and its share, start-up per job, first-step time."""
    cells = _cells(frames)
    if cells.empty:
        return pd.DataFrame()
    span = (cells["finished"].max() - cells["started"].min()).total_seconds()
    measuring = cells["measuring_s"].sum()
    out = [
        ("cell jobs (cells × passes) with start and end times", f"{len(cells)}"),
        ("span: first cell start to last cell end", f"{span:.1f} s"),
        (
            "time inside measuring processes",
            f"{measuring:.1f} s ({100 * measuring / span:.0f}% of the span)" if span > 0 else f"{measuring:.1f} s",
        ),
    ]
    steps = _stepping_s(frames)
    if steps is not None:
        out.append(
            (
                "of which warm-up and timed steps (studies timed step by step; the rest: CUDA context, set-up, profiling)",
                f"{steps:.1f} s ({100 * steps / span:.0f}% of the span)" if span > 0 else f"{steps:.1f} s",
            )
        )
    ordered = cells.sort_values("started")
    gaps = (ordered["started"].iloc[1:].to_numpy() - ordered["finished"].iloc[:-1].to_numpy()) / pd.Timedelta(seconds=1)
    gaps = gaps[gaps >= 0]  # overlapping cells (several GPUs) have no gap between them
    if len(gaps):
        out.append(
            (
                "gap between one cell's end and the next one's start (job start-up, torch import, merges)",
                f"median {pd.Series(gaps).median():.2f} s, max {gaps.max():.2f} s",
            )
        )
    if "first_step_s" in cells and cells["first_step_s"].notna().any():
        first = cells["first_step_s"].dropna()
        out.append(
            (
                "first step of each cell (compilation, autotuning, allocator growth)",
                f"median {first.median():.2f} s, max {first.max():.2f} s, total {first.sum():.1f} s",
            )
        )
    jobs = _benchmarks(benchmarks)
    if not jobs.empty:
        both = jobs.merge(cells[["study", "cell_id", "pass_index", "measuring_s"]], on=["study", "cell_id", "pass_index"])
        startup = (both["job_s"] - both["measuring_s"]).clip(lower=0)
        if len(both):
            out.append(
                (
                    "per-job start-up (Snakemake job wall time − measuring process)",
                    f"median {startup.median():.2f} s, max {startup.max():.2f} s over {len(both)} jobs",
                )
            )
    else:
        out.append(("per-job start-up", "not measured: no Snakemake benchmark files for this run"))
    return pd.DataFrame(out, columns=["what", "value"])
