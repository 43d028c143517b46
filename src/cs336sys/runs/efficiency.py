"""Where a sweep's wall time went: measuring, or starting Python, torch and compilers.

From the rows: each cell's measuring process reports when it started and ended
(``started_at``, ``finished_at``) and how long its first step took
(``first_step_s``: compilation and autotuning land there). From Snakemake's
``benchmark:`` files (``benchmarks/<run>/<study>/<cell>.tsv``, written for free
per job): each job's wall time, so a job's start-up is its wall time minus its
measuring process's. The share of the sweep spent measuring is the measuring
processes' time over the sweep's span (first cell start to last cell end), times the
number of GPUs that measured.

With several GPUs (``--resources gpu=N``) each row names the GPU its cell held
(``gpu_index``, ``gpu_uuid``), and the sweep is read per GPU as well: its cell jobs,
its busy time (its measuring processes' spans, overlaps merged) as a share of the
sweep's span, its idle gaps between cells, and the tail: how long before the sweep's
end each GPU ran out of cells. A merged multi-pass row names its first pass's GPU
only; the other passes' GPUs come from their own cell files (``results/<run>/<study>/
cells/pass<k>/``) where those are at hand, else those jobs are counted as on no
named GPU. The per-GPU figures themselves: :mod:`cs336sys.runs.gpu_use`.

Where each cell job's own wall time went (``time_*_s``, written by the cell runner on every
row: start-up, correctness check, warm-up, timed blocks, paired blocks, graph capture, energy
blocks, profiling, the rest) is summed per study by :func:`time_split`; a merged row carries
the sum over the passes it folds, so each job is counted once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import pandas as pd

from cs336sys.columns import TIME_COLUMNS, TIME_PARTS
from cs336sys.runs.gpu_use import SweepSummary, summarize

GPU = ["gpu_index", "gpu_uuid"]
MEASURING = ("timed", "pairs", "energy")  # the parts whose steps become the rows' samples


def _pass_index(df: pd.DataFrame) -> pd.Series | int:
    return pd.to_numeric(df["pass_index"], errors="coerce").fillna(0).astype(int) if "pass_index" in df else 0


def _per_pass(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (row, pass) with that pass's start and end: merged rows keep them ;-joined.

    A merged row names each pass's GPU in ``pass_gpu_index``/``pass_gpu_uuid``; one merged before
    those existed names its first pass's only (``gpu_index``, ``gpu_uuid``): its other passes'
    GPU is left empty here, to be found in their cell files (:func:`_jobs`).
    """
    df = df.assign(**{c: df[c] if c in df else None for c in GPU})
    if "pass_started_at" not in df:
        return df.assign(pass_index=_pass_index(df))
    multi = df["pass_started_at"].notna()
    single = df[~multi]
    single = single.assign(pass_index=_pass_index(single))  # a failure row of pass k is pass k's job
    spans = df[multi].assign(
        started_at=df.loc[multi, "pass_started_at"].astype(str).str.split(";"),
        finished_at=df.loc[multi, "pass_finished_at"].astype(str).str.split(";"),
    )
    spans = spans.assign(pass_index=[list(range(len(v))) for v in spans["started_at"]])
    per_pass_gpu = all(f"pass_{c}" in df for c in GPU)
    if per_pass_gpu:
        spans = spans.assign(**{c: spans[f"pass_{c}"].astype(str).str.split(";") for c in GPU})
        per_pass_gpu = all(len(g) == len(s) for c in GPU for g, s in zip(spans[c], spans["started_at"]))
    if not per_pass_gpu:
        spans = spans.assign(**{c: df.loc[multi, c] for c in GPU})
    spans = spans.explode(["started_at", "finished_at", "pass_index", *(GPU if per_pass_gpu else [])])
    spans[GPU] = spans[GPU].astype(object).replace({"": None, "nan": None})
    if not per_pass_gpu:
        spans.loc[spans["pass_index"] > 0, GPU] = None
    return pd.concat([single, spans], ignore_index=True)


def _cells(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per cell job (a cell's pass): its measuring process's start, end, first step and GPU."""
    rows = []
    for study, df in frames.items():
        if df.empty or not {"started_at", "finished_at", "cell_id"} <= set(df.columns):
            continue
        df = _per_pass(df)
        first = df.groupby(["cell_id", "pass_index"]).agg(
            started=("started_at", "min"),
            finished=("finished_at", "max"),
            gpu_index=("gpu_index", "first"),
            gpu_uuid=("gpu_uuid", "first"),
        )
        if "first_step_s" in df:
            first["first_step_s"] = df[df["pass_index"] == 0].groupby(["cell_id", "pass_index"])["first_step_s"].max()
        rows.append(first.reset_index().assign(study=study))
    if not rows:
        return pd.DataFrame()
    cells = pd.concat(rows, ignore_index=True)
    cells["pass_index"] = cells["pass_index"].astype(int)  # exploded lists leave objects; benchmarks' are ints
    cells["started_at"] = cells["started"].astype(str)  # the key into the cell files (:func:`_jobs`)
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


def _cell_file_gpus(cells: Mapping[str, Path]) -> pd.DataFrame:
    """The GPU of every job from its own cell file: study, cell id and start → ``gpu_index``, ``gpu_uuid``."""
    want = {"cell_id", "started_at", *GPU}
    rows = []
    for study, folder in cells.items():
        for path in [*Path(folder).glob("*.csv"), *Path(folder).glob("pass*/*.csv")]:  # pass k > 0 in pass<k>/
            if path.name.startswith("."):  # an atomic write's temporary
                continue
            try:
                df = pd.read_csv(path, usecols=lambda c: c in want, dtype=str)
            except (OSError, ValueError, pd.errors.EmptyDataError):
                continue
            if want <= set(df.columns):
                rows.append(df.dropna(subset=["started_at"]).drop_duplicates(["cell_id", "started_at"]).assign(study=study))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["study", *want])


def _gpu_key(jobs: pd.DataFrame) -> pd.Series:
    """Which GPU a job held: its UUID, else its index; empty where the rows name none (a CPU run)."""
    uuid = jobs["gpu_uuid"].astype(object).where(jobs["gpu_uuid"].notna() & (jobs["gpu_uuid"].astype(str) != ""))
    index = pd.to_numeric(jobs["gpu_index"], errors="coerce")
    return uuid.fillna(index.map(lambda i: f"#{i:g}", na_action="ignore"))


def _jobs(frames: Mapping[str, pd.DataFrame], cells: Mapping[str, Path] | None = None) -> pd.DataFrame:
    """:func:`_cells` with the GPU (``gpu``) of every job the rows or cell files name."""
    jobs = _cells(frames)
    if jobs.empty:
        return jobs
    jobs["gpu"] = _gpu_key(jobs)
    unknown, known = jobs["gpu"].isna(), jobs["gpu"].dropna().unique()
    if len(known) == 1:  # one GPU measured everything: a later pass ran there too
        jobs.loc[unknown, GPU + ["gpu"]] = jobs.loc[~unknown, GPU + ["gpu"]].iloc[0].to_numpy()
    elif len(known) > 1 and unknown.any() and cells:
        found = _cell_file_gpus(cells).drop_duplicates(["study", "cell_id", "started_at"])
        key = ["study", "cell_id", "started_at"]
        filled = jobs.loc[unknown, key].merge(found, on=key, how="left")
        jobs.loc[unknown, GPU] = filled[GPU].to_numpy()
        jobs["gpu"] = _gpu_key(jobs)
    return jobs


def sweep_summary(frames: Mapping[str, pd.DataFrame], cells: Mapping[str, Path] | None = None) -> SweepSummary | None:
    """The sweep's span and each GPU's part; ``cells``: study → its cells/ folder (later passes' GPUs)."""
    return summarize(_jobs(frames, cells))


def _share(seconds: float, span: float, gpus: int) -> str:
    """``seconds`` as a share of the span on every GPU that measured (one GPU, or a CPU run: of the span)."""
    if span <= 0:
        return f"{seconds:.1f} s"
    if gpus > 1:
        return f"{seconds:.1f} s on {gpus} GPUs ({100 * seconds / (gpus * span):.0f}% of {gpus} × the span)"
    return f"{seconds:.1f} s ({100 * seconds / span:.0f}% of the span)"


def _gaps(cells: pd.DataFrame) -> pd.Series:
    """Seconds between one job's end and the next one's start on the same GPU (one sequence on a CPU run)."""
    gaps = []
    for _, jobs in cells.groupby(cells["gpu"].fillna(""), sort=False):
        ordered = jobs.sort_values("started")
        gaps += list((ordered["started"].iloc[1:].to_numpy() - ordered["finished"].iloc[:-1].to_numpy()) / pd.Timedelta(seconds=1))
    gaps = pd.Series(gaps, dtype=float)
    return gaps[gaps >= 0]  # overlapping jobs (GPUs the rows do not name) have no gap between them


def sweep_efficiency(
    frames: Mapping[str, pd.DataFrame], benchmarks: Path | None = None, cells: Mapping[str, Path] | None = None
) -> pd.DataFrame:
    """One table: the sweep's span, time measuring and its share, start-up per job, first-step time.

    ``cells`` (study → its cells/ folder) names the GPU of a merged row's later passes.
    """
    jobs = _jobs(frames, cells)
    if jobs.empty:
        return pd.DataFrame()
    summary = summarize(jobs)
    gpus = summary.at_once
    span = summary.span_s
    out = [
        ("cell jobs (cells × passes) with start and end times", f"{len(jobs)}"),
        ("span: first cell start to last cell end", f"{span:.1f} s"),
        ("time inside measuring processes", _share(summary.measuring_s, span, gpus)),
    ]
    steps = _stepping_s(frames)
    if steps is not None:
        out.append(
            (
                "of which warm-up and timed steps (studies timed step by step; the rest: CUDA context, set-up, profiling)",
                _share(steps, span, gpus),
            )
        )
    measured = measuring_share(frames)
    if measured is not None and measured[1] > 0:
        seconds, wall = measured
        out.append(
            (
                "of the cell jobs' own wall time (rows' time_*_s), spent measuring: timed, paired and energy blocks",
                f"{seconds:.1f} s of {wall:.1f} s ({100 * seconds / wall:.0f}%)",
            )
        )
    gaps = _gaps(jobs) if gpus > 1 else _gaps(jobs.assign(gpu=None))
    if len(gaps):
        where = " on the same GPU" if gpus > 1 else ""
        out.append(
            (
                f"gap between one cell's end and the next one's start{where} (job start-up, torch import, merges)",
                f"median {gaps.median():.2f} s, max {gaps.max():.2f} s",
            )
        )
    if "first_step_s" in jobs and jobs["first_step_s"].notna().any():
        first = jobs["first_step_s"].dropna()
        out.append(
            (
                "first step of each cell (compilation, autotuning, allocator growth)",
                f"median {first.median():.2f} s, max {first.max():.2f} s, total {first.sum():.1f} s",
            )
        )
    runs = _benchmarks(benchmarks)
    if not runs.empty:
        both = runs.merge(jobs[["study", "cell_id", "pass_index", "measuring_s"]], on=["study", "cell_id", "pass_index"])
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


def _jobs_of(row: pd.Series) -> frozenset[str]:
    """The jobs (by start time) a row's time columns cover: a merged row's every pass, else its own."""
    passes = row.get("pass_started_at")
    if isinstance(passes, str) and passes:
        return frozenset(passes.split(";"))
    return frozenset([str(row.get("started_at", row.get("pass_index", 0)))])


def _cell_times(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: its ``time_*_s`` over every job it ran (cell × pass), each job counted once."""
    if df.empty or not {"time_job_s", "cell_id"} <= set(df.columns):
        return pd.DataFrame()
    cols = [c for c in TIME_COLUMNS if c in df]
    have = df[pd.to_numeric(df["time_job_s"], errors="coerce").notna()]
    out = []
    for cell, rows in have.groupby("cell_id", sort=False):
        covered: set[str] = set()
        total = dict.fromkeys(cols, 0.0)
        for jobs, row in sorted(((_jobs_of(r), r) for _, r in rows.iterrows()), key=lambda jr: -len(jr[0])):
            if jobs & covered:  # a row of jobs already counted (the phases of one mode, a pair row)
                continue
            covered |= jobs
            for c in cols:
                value = pd.to_numeric(row[c], errors="coerce")
                total[c] += 0.0 if pd.isna(value) else float(value)
        out.append({"cell_id": cell, "jobs": len(covered), **total})
    return pd.DataFrame(out)


def time_split(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per study and in all: cell jobs, their wall time, and each part's share of it; empty where no row says."""
    rows = []
    for study, df in frames.items():
        cells = _cell_times(df)
        if not cells.empty:
            rows.append({"study": study, "jobs": int(cells["jobs"].sum()), **cells.drop(columns=["cell_id", "jobs"]).sum()})
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows).fillna(0.0)
    total = table.drop(columns="study").sum()
    table = pd.concat([table, pd.DataFrame([{"study": "all", **total}])], ignore_index=True)
    out = table[["study"]].assign(**{"cell jobs": table["jobs"].astype(int), "job wall (s)": table["time_job_s"].round(1)})
    for p in TIME_PARTS:
        col = f"time_{p}_s"
        share = 100 * table[col] / table["time_job_s"].where(table["time_job_s"] > 0) if col in table else float("nan")
        out[f"{p} (%)"] = pd.Series(share, index=table.index).round(1)
    return out


def measuring_share(frames: Mapping[str, pd.DataFrame]) -> tuple[float, float] | None:
    """(seconds of timed, paired and energy blocks, the cell jobs' wall seconds) over every study; None where no row says."""
    cells = [c for c in (_cell_times(df) for df in frames.values()) if not c.empty]
    if not cells:
        return None
    both = pd.concat(cells, ignore_index=True)
    measuring = sum(float(both[f"time_{p}_s"].sum()) for p in MEASURING if f"time_{p}_s" in both)
    return measuring, float(both["time_job_s"].sum())
