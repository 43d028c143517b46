"""How far a cell moves between the sweep's passes, and which cells share that drift.

Drift comes from the host (a cloud VM's vCPUs), so it grows with the share of a step the GPU
waits on Python: cells are put in drift classes by how busy their GPU was (:func:`drift_class`),
a class pools the between-pass spread of its cells' log medians (:func:`pooled_drift`), and a
cell's between-pass interval uses that pool or its own spread, whichever is wider
(:func:`pass_interval`). ``analysis.passes`` folds a cell's passes with it; a comparison's two
sides drift as the more host-bound one does (:func:`pair_busy`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from cs336sys.measure.stats import log_t_interval, t_quantile_975

# Every drift class pools its between-pass drift, GPU-bound cells (0.2-0.7% between runs on the
# H100) and launch-bound ones (2% to 90%) apart; a cell's own spread still wins where it is wider
# (pass_interval), so a wild cell stays wild. A pool needs MIN_POOL_DF degrees of freedom: two
# passes of one cell alone give one, t = 12.7, and the "[0, 129] ms" intervals of launch-bound rows.
POOLED = frozenset({"gpu-bound", "partly host-bound", "launch-bound", "unknown"})  # unknown: a CPU run
MIN_POOL_DF = 3


def _log_spread(pass_medians: Sequence[float]) -> tuple[float, int]:
    """Sum of squared deviations of log pass medians from their mean, and its degrees of freedom."""
    m = np.log([x for x in pass_medians if math.isfinite(x) and x > 0])
    if m.size < 2:
        return 0.0, 0
    return float(((m - m.mean()) ** 2).sum()), int(m.size - 1)


def pooled_drift(groups: Sequence[tuple[str, Sequence[float]]]) -> dict[str, tuple[float, int]]:
    """Per class: the pooled standard deviation of log pass medians, and its degrees of freedom.

    ``groups`` holds (class, pass medians) per cell. Pooling the between-pass variance
    over the cells of a class (host-bound or not) gives an estimate with many degrees
    of freedom where one cell's two passes give one, whose t quantile (12.7) would
    make every interval eight times its spread.
    """
    totals: dict[str, list[float]] = {}
    for cls, medians in groups:
        ss, df = _log_spread(medians)
        if df:
            acc = totals.setdefault(cls, [0.0, 0])
            acc[0] += ss
            acc[1] += df
    return {cls: (math.sqrt(ss / df), int(df)) for cls, (ss, df) in totals.items()}


def pass_interval(median: float, pass_medians: Sequence[float], pooled: tuple[float, int] | None) -> tuple[float, float] | None:
    """The between-pass part of a cell's interval.

    Pooled (the cell's drift class has at least :data:`MIN_POOL_DF` degrees of freedom):
    median·exp(±t(df)·s/√P) on the log scale, with s the larger of the pool's spread and
    this cell's own and df the pool's. Otherwise the Student-t interval of this cell's log
    pass medians alone (t = 12.7 with two passes: wide, but never below zero). None with one pass.
    """
    ss, df_cell = _log_spread(pass_medians)
    if not df_cell or not (math.isfinite(median) and median > 0):
        return None
    if pooled is None or pooled[1] < max(df_cell, MIN_POOL_DF):
        _, low, high = log_t_interval(pass_medians)
        return low, high
    s_pool, df = pooled
    half = t_quantile_975(df) * max(s_pool, math.sqrt(ss / df_cell)) / math.sqrt(df_cell + 1)
    return median * math.exp(-half), median * math.exp(half)


def partner_cell(cell_id: str, pair_with: str) -> str:
    """The cell id of a comparison's partner: ``pair_with`` (``axis=value``) in place of the cell's own value."""
    axis, _, value = str(pair_with).partition("=")
    return re.sub(rf"(^|_){re.escape(axis)}=[^_]*", lambda m: f"{m.group(1)}{axis}={value}", str(cell_id), count=1)


def pair_busy(cell_id: str, mode: str, pair_with: str, busy) -> float | None:
    """The lower busy share of a comparison's two sides (``busy``: (cell id, mode) → the step's share): an
    fp32 step paired with its launch-bound bf16 partner moves with the host as the bf16 one does (on an
    H100, 2.00 in one pass and 1.01 in the next)."""
    if not len(busy):
        return None
    own = busy.get((cell_id, mode))
    other = busy.get((partner_cell(cell_id, pair_with), mode))
    sides = [float(b) for b in (own, other) if b is not None and pd.notna(b)]
    return min(sides) if sides else None


def drift_class(busy: object, min_gpu_busy: float) -> str:
    """Cells pool their between-pass drift with cells whose GPU was about as busy.

    Drift comes from the host, so it grows with the share of a step the GPU waits
    on Python: GPU-bound (busy ≥ ``min_gpu_busy``), partly host-bound (≥ half of
    that) and launch-bound cells drift differently. Between runs h100-e2e-p1/-p2
    (H100, report/h100-repeatability-passes) their rows moved by a median 0.18%,
    0.36% and 13% (max 0.66%, 0.92%, 93%).
    """
    b = pd.to_numeric(pd.Series([busy]), errors="coerce").iloc[0]
    if pd.isna(b):
        return "unknown"
    return "gpu-bound" if b >= min_gpu_busy else "partly host-bound" if b >= min_gpu_busy / 2 else "launch-bound"
