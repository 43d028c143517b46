"""One GPU's part of a sweep: its cell jobs, busy time, idle gaps and when it ran out of cells.

A sweep on N GPUs (``--resources gpu=N``) ends when its last cell does: a GPU whose cells
ran out early sat idle for the tail. From one row per cell job (runs.efficiency reads
them from the rows and cell files), per GPU: busy time (its measuring processes' spans,
overlaps merged) as a share of the sweep's span, idle gaps between its cells longer than a
job's start-up, and the end of its last cell. GPUs that measured one after another (a run
resumed on another machine's GPU) are not several GPUs: :attr:`SweepSummary.at_once` counts
those that measured side by side.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

# A gap between two cells on one GPU longer than a job's start-up (0.4-0.6 s median with the warm
# worker, about 6 s without: docs/usage.md) is the GPU waiting for work, not for Python.
IDLE_GAP_S = 5.0


@dataclass(frozen=True)
class GpuUse:
    """One GPU's part of a sweep; times in seconds after the sweep's first cell start."""

    index: int | None
    uuid: str
    jobs: int
    busy_s: float  # its measuring processes' spans, overlaps merged
    first_start_s: float
    last_end_s: float
    idle_gaps: int  # gaps between its cells longer than IDLE_GAP_S
    idle_gap_s: float

    @property
    def label(self) -> str:
        return f"GPU {self.index}" if self.index is not None else self.uuid


@dataclass(frozen=True)
class SweepSummary:
    """A sweep's span, its measuring time and each GPU's part (none listed for a CPU run)."""

    span_s: float
    jobs: int
    measuring_s: float
    gpus: tuple[GpuUse, ...]
    unattributed: int  # jobs of a run with named GPUs whose GPU neither their rows nor cell files name
    at_once: int  # the most GPUs measuring at the same time: 1 where a run went on on another machine's GPU

    @property
    def several(self) -> bool:
        """Whether GPUs measured side by side (``--resources gpu=N``), not one after another."""
        return self.at_once > 1

    @property
    def tail_s(self) -> float:
        """How long the GPU that ran out of cells first sat idle before the last one finished."""
        ends = [g.last_end_s for g in self.gpus]
        return max(ends) - min(ends) if ends else 0.0


def _busy(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Spans merged where they overlap, in order."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _gpu_use(gpu: pd.DataFrame, t0: pd.Timestamp) -> GpuUse:
    spans = _busy(zip((gpu["started"] - t0).dt.total_seconds(), (gpu["finished"] - t0).dt.total_seconds()))
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    idle = [g for g in gaps if g > IDLE_GAP_S]
    index = pd.to_numeric(gpu["gpu_index"], errors="coerce").dropna()
    uuid = gpu["gpu_uuid"].dropna().astype(str)
    return GpuUse(
        index=int(index.iloc[0]) if len(index) else None,
        uuid=uuid.iloc[0] if len(uuid) else "",
        jobs=len(gpu),
        busy_s=sum(b - a for a, b in spans),
        first_start_s=spans[0][0],
        last_end_s=spans[-1][1],
        idle_gaps=len(idle),
        idle_gap_s=float(sum(idle)),
    )


def _at_once(gpus: Iterable[GpuUse]) -> int:
    """The most GPUs whose first-start-to-last-end windows overlap at one moment."""
    events = sorted(e for g in gpus for e in ((g.first_start_s, 1), (g.last_end_s, -1)))  # an end sorts before a start
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def summarize(jobs: pd.DataFrame) -> SweepSummary | None:
    """The summary of one row per cell job: ``started``, ``finished`` (UTC timestamps), ``measuring_s``, ``gpu``
    (which GPU: empty where unknown), ``gpu_index``, ``gpu_uuid``."""
    if jobs.empty:
        return None
    t0 = jobs["started"].min()
    gpus = [_gpu_use(g, t0) for _, g in jobs.dropna(subset=["gpu"]).groupby("gpu")]
    gpus.sort(key=lambda g: (g.index is None, g.index or 0, g.uuid))
    return SweepSummary(
        span_s=(jobs["finished"].max() - t0).total_seconds(),
        jobs=len(jobs),
        measuring_s=float(jobs["measuring_s"].sum()),
        gpus=tuple(gpus),
        unattributed=int(jobs["gpu"].isna().sum()) if gpus else 0,
        at_once=_at_once(gpus),
    )


def per_gpu_table(summary: SweepSummary | None) -> pd.DataFrame:
    """One row per GPU; empty for a run on one GPU at a time or none."""
    if summary is None or not summary.several:
        return pd.DataFrame()
    end = max(g.last_end_s for g in summary.gpus)
    return pd.DataFrame(
        [
            {
                "GPU": g.index if g.index is not None else "?",
                "UUID": g.uuid,
                "cell jobs": g.jobs,
                "busy (s)": f"{g.busy_s:.1f}",
                "busy (% of span)": f"{100 * g.busy_s / summary.span_s:.0f}%" if summary.span_s > 0 else "n/a",
                "first cell start (s)": f"{g.first_start_s:.1f}",
                "last cell end (s)": f"{g.last_end_s:.1f}",
                "idle at the end (s)": f"{end - g.last_end_s:.1f}",
                f"idle gaps > {IDLE_GAP_S:g} s": g.idle_gaps,
                "idle in those gaps (s)": f"{g.idle_gap_s:.1f}",
            }
            for g in summary.gpus
        ]
    )


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def per_gpu_line(summary: SweepSummary | None) -> str:
    """One sentence: each GPU's busy share of the span and the tail; empty for a run on one GPU at a time or none."""
    if summary is None or not summary.several or summary.span_s <= 0:
        return ""
    shares = [f"{100 * g.busy_s / summary.span_s:.0f}%" for g in summary.gpus]
    n = summary.unattributed
    line = f"{len(summary.gpus)} GPUs: busy {'at least ' if n else ''}{_and(shares)} of the {summary.span_s:.0f} s span"
    if n:  # which GPU ran out of cells first is unknown while some jobs' GPU is
        return line + (
            f"; {n} cell job{'s' if n > 1 else ''} left out: a merged row names its first pass's GPU only, "
            "and the later passes' cell files were not at hand"
        )
    first_done = min(summary.gpus, key=lambda g: g.last_end_s)
    indices = [g.index for g in summary.gpus]
    label = first_done.label if len(set(indices)) == len(indices) else first_done.uuid  # two hosts' GPU 0
    if summary.tail_s >= 0.5:
        return line + f"; {label} idle for the last {summary.tail_s:.0f} s"
    return line + "; every GPU measured until the end"
