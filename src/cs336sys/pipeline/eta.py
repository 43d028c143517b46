"""How long a sweep has left, printed by its cell jobs every few cells.

When an invocation is about to measure, the workflow writes its plan (:func:`write_plan`): every
cell job it will run (study, CSV, the duration of that job's previous result where one exists)
and how many cells measure at once. After each cell job, the job reads the plan and the CSVs
written since the plan (:func:`progress`): a study's jobs left take the mean wall time of its
jobs finished in this invocation; a study with none finished yet, each job's previous duration,
else the study's estimate (``Study.estimate_s``, written into the plan). The estimate over the jobs left is divided
by the cells measured at once. A job's duration is its rows' ``time_job_s`` (its process start to
its rows), or, for rows without it, its measuring process's span.

No torch and no pandas: the job's side of a cell imports nothing heavy.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cs336sys.fileio import write_text_atomic
from cs336sys.pipeline.priorities import measured_s

EVERY = 5  # cell jobs between two estimates (and the last one)
SAMPLE = 50  # a study's latest jobs whose CSVs are read for its mean (a full grid has thousands)


def job_seconds(path: str | os.PathLike) -> float | None:
    """Wall seconds of the cell job that wrote the CSV at ``path``; None where it cannot be read."""
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                value = float(row.get("time_job_s") or "nan")
                if math.isfinite(value):
                    return value
    except (OSError, ValueError, csv.Error):
        return None
    return measured_s(path)  # rows from before the time columns


def write_plan(path: str | os.PathLike, jobs: Iterable[tuple[str, str, float]], at_once: int = 1) -> None:
    """The plan of the cell jobs (study, CSV path, the study's estimate in seconds) this invocation runs, with each
    CSV's previous duration; never raises."""
    planned = [
        {"study": study, "csv": str(out), "estimate_s": estimate, "previous_s": job_seconds(out) if Path(out).is_file() else None}
        for study, out, estimate in jobs
    ]
    try:
        write_text_atomic(path, json.dumps({"started": time.time(), "at_once": max(int(at_once or 1), 1), "jobs": planned}))
    except OSError as exc:  # the sweep runs on; it only goes without an estimate of the time left
        print(f"[cs336sys] no estimate of the time left: cannot write {path}: {exc}", file=sys.stderr)


@dataclass
class Progress:
    done: int
    total: int
    measured_s: float  # wall seconds of the jobs done (each study's mean over its latest SAMPLE, times its jobs done)
    left_s: float  # the estimate, at once-measuring cells taken into account
    sources: dict[str, list[str]] = field(default_factory=dict)  # where the estimate came from → studies


def progress(plan_path: str | os.PathLike, every: int | None = None) -> Progress | None:
    """Where the planned sweep stands now; None without a readable plan (or, with ``every``, where no estimate is due)."""
    try:
        plan = json.loads(Path(plan_path).read_text())
        started, jobs, at_once = float(plan["started"]), list(plan["jobs"]), int(plan["at_once"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finished: dict[str, list[tuple[float, str]]] = {}  # study → (mtime, CSV) of its jobs done since the plan
    left: dict[str, list[dict]] = {}
    for job in jobs:
        try:
            mtime = os.stat(job["csv"]).st_mtime
        except OSError:
            mtime = -math.inf
        if mtime >= started:
            finished.setdefault(job["study"], []).append((mtime, job["csv"]))
        else:
            left.setdefault(job["study"], []).append(job)
    n_done = sum(len(v) for v in finished.values())
    if every is not None and not due(n_done, len(jobs), every):
        return None
    mean: dict[str, float] = {}
    for study, files in finished.items():
        seconds = [s for _, f in sorted(files)[-SAMPLE:] if (s := job_seconds(f)) is not None]
        mean[study] = sum(seconds) / len(seconds) if seconds else 0.0
    estimate, sources = 0.0, {}
    for study, todo in left.items():
        if finished.get(study):
            source, seconds = "this run's", len(todo) * mean[study]
        elif all(j.get("previous_s") is not None for j in todo):
            source, seconds = "a previous run's", sum(float(j["previous_s"]) for j in todo)
        else:
            source = "estimates for"
            seconds = sum(float(j.get("previous_s") or j.get("estimate_s") or 0.0) for j in todo)
        estimate += seconds
        sources.setdefault(source, []).append(study)
    measured = sum(mean[s] * len(f) for s, f in finished.items())
    return Progress(n_done, len(jobs), measured, estimate / max(at_once, 1), sources)


def duration(seconds: float) -> str:
    """``2 min 40 s``, ``45 s``, ``1 h 5 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def line(p: Progress) -> str:
    """``[cs336sys] 23 of 41 cell jobs done, 3 min 10 s measured; about 2 min 40 s left (from this run's e2e, attention cells)``."""
    head = f"[cs336sys] {p.done} of {p.total} cell jobs done, {duration(p.measured_s)} measured"
    if p.done >= p.total:
        return head + "; none left"
    words = "; ".join(f"{source} {', '.join(studies)} cells" for source, studies in p.sources.items())
    return f"{head}; about {duration(p.left_s)} left (from {words})"


def due(done: int, total: int, every: int = EVERY) -> bool:
    """Whether a job that finds ``done`` of ``total`` jobs done says where the sweep stands: every ``every``, and the last."""
    return done >= total or (done > 0 and done % every == 0)


def report(plan_path: str | os.PathLike, every: int = EVERY) -> str | None:
    """Print the estimate to stderr where one is due; never fails the job (an estimate is not a result)."""
    try:
        p = progress(plan_path, every)
        if p is None:
            return None
        text = line(p)
    except Exception as exc:  # noqa: BLE001 - the cell is measured and written: a broken estimate only goes unsaid
        text = f"[cs336sys] no estimate of the time left: {type(exc).__name__}: {exc}"
    print(text, file=sys.stderr, flush=True)
    return text
