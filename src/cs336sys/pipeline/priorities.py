"""Which cell job Snakemake starts first: the longest expected cells of a pass first.

With N GPUs (``--resources gpu=N``) a sweep ends when its last cell does; a long cell started
last leaves the other GPUs idle until it finishes. Starting the longest cells first (the LPT
rule of scheduling) leaves the short ones to fill the end. A cell's expected duration is its
measuring process's time in the run's previous results (its per-cell CSVs: first row start
to last row end, the mean over the passes found), else its study's estimate
(``Study.estimate_s``, which the workflow passes in).

The ordering is Snakemake's ``priority`` (higher starts first), in bands: pass k of every
cell outranks pass k+1 of any (so one cell's passes lie minutes apart: analysis.passes),
and within a band the longest cell ranks highest. Every band lies above 0, the priority of
merges, figures and reports, and below :attr:`JobPriorities.above_cells`, the run's
snapshot's. Snakemake takes a priority that is a function of the wildcards from 9.17 on
(snakemake/snakemake#3253); an older Snakemake gets the bands alone.

No torch here: the workflow imports this at parse time.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

CALLABLE_SINCE = (9, 17)  # the first Snakemake whose `priority:` may be a function

CellFile = Callable[[str, str, int], Path]  # (study, cell id, pass) → that pass's cell CSV


def measured_s(path: str | Path) -> float | None:
    """Seconds the measuring process behind one cell CSV ran (its rows' first start to last end); None without both."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        starts = [datetime.fromisoformat(r["started_at"]) for r in rows if r.get("started_at")]
        ends = [datetime.fromisoformat(r["finished_at"]) for r in rows if r.get("finished_at")]
    except (OSError, ValueError, TypeError, csv.Error):  # missing, half-written by an older run, not ISO times
        return None
    if not starts or not ends:
        return None
    seconds = (max(ends) - min(starts)).total_seconds()
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def expected_seconds(
    grids: Mapping[str, Iterable[str]],
    passes: Mapping[str, int],
    cell_file: CellFile,
    estimates: Mapping[str, float],
) -> dict[tuple[str, str], float]:
    """(study, cell id) → the seconds its job is expected to take: its previous passes' mean, else its study's
    estimate (``estimates``: study → seconds, rough: they only place a cell never measured among the others)."""
    expected = {}
    for study, cells in grids.items():
        for cell in cells:
            found = [s for k in range(passes.get(study, 1)) if (s := measured_s(cell_file(study, cell, k))) is not None]
            expected[(study, cell)] = sum(found) / len(found) if found else estimates[study]
    return expected


@dataclass(frozen=True)
class JobPriorities:
    """Snakemake priorities of cell jobs: band ``max_passes - k`` for pass k, the cell's rank inside it."""

    rank: Mapping[tuple[str, str], int]  # 0: the shortest expected cell
    max_passes: int

    @property
    def band(self) -> int:
        return max(len(self.rank), 1)

    def pass_floor(self, k: int) -> int:
        """The lowest priority of pass ``k``: above every priority of pass k+1."""
        return (self.max_passes - k) * self.band

    def cell(self, study: str, cell: str, k: int) -> int:
        """The priority of pass ``k`` of one cell (a cell outside the grid gets its pass's floor)."""
        return self.pass_floor(k) + self.rank.get((study, cell), 0)

    @property
    def above_cells(self) -> int:
        """A priority above every cell job's (the snapshot of the run's settings goes first)."""
        return self.pass_floor(-1)


def job_priorities(expected: Mapping[tuple[str, str], float], max_passes: int) -> JobPriorities:
    """Rank the cells by expected seconds; equal ones by study, then cell id (the first ranks higher)."""
    longest_first = sorted(expected, key=lambda key: (-expected[key], key))
    n = len(longest_first)
    return JobPriorities(rank={key: n - 1 - i for i, key in enumerate(longest_first)}, max_passes=max_passes)


def callable_priorities(version: str) -> bool:
    """Whether Snakemake ``version`` takes a function as a rule's ``priority``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return match is not None and (int(match[1]), int(match[2])) >= CALLABLE_SINCE
