"""A study's figures job: its report module's figures, drawn in the shared style (``analysis.plots``).

The study is found through the registry (:func:`cs336sys.studies.report_module`); a study where no
cell ran gets one figure saying so instead of its empty panels.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib  # not pyplot: analysis.plots selects the Agg backend before pyplot loads
import pandas as pd

from cs336sys.analysis.plots import OK, STYLE, plot_no_cells
from cs336sys.studies import report_module


def plot_study(study: str, df: pd.DataFrame, outdir: Path, run: str) -> list[Path]:
    """All figures of ``study`` (from its report module) into ``outdir``; returns the files written."""
    outdir.mkdir(parents=True, exist_ok=True)
    matplotlib.rcParams.update(STYLE)
    if df.empty or not (df["status"] == OK).any():
        jobs = [("no_cell_ran", lambda p: plot_no_cells(df, p, run, study))]
    else:
        jobs = report_module(study).figures(df, run)
    return [draw(outdir / f"{name}.png") for name, draw in jobs]
