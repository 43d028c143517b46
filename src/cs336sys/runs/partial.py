"""Merge, draw and report a run whose sweep stopped before every cell ran: a named slice.

Snakemake merges a study only once every cell of its grid has a CSV, so a sweep cut short (device
time, a deadline) leaves its cells in ``results/<run>/<study>/cells/`` and no report. This makes
the merged CSVs, the figures, ``report.md`` and ``answers.md`` from the cells there are, with the
same library calls as the merge, plots, report and answers rules, and names the grid's cells that
are missing (printed, and in the report), so the slice is never read as the whole grid. Rerunning the sweep later fills the grid and Snakemake
replaces these files.

    python -m cs336sys.runs.partial results/h100-e2e-best
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from cs336sys import studies as S
from cs336sys.handout.answers import write_answers
from cs336sys.pipeline.config import load_yaml
from cs336sys.pipeline.merge import load_study, merge_cells
from cs336sys.pipeline.plan import grid
from cs336sys.plugins import offered
from cs336sys.rows import write_csv_atomic
from cs336sys.runs.figures import plot_study
from cs336sys.runs.report import write_report


def study_cells(results: Path, study: str, config: dict) -> tuple[list[Path], list[str]]:
    """The CSVs of ``study``'s cells that have every pass, and the ids of the cells that do not.

    A cell with only some of its passes is left out rather than merged: its interval would lack
    the between-pass spread the run was configured to measure.
    """
    present, missing = [], []
    for cid in grid(study, config, offered(config.get("plugins"))):
        paths = [results / study / "cells" / f"{S.pass_dir(k)}{cid}.csv" for k in range(config[study].get("passes", 1))]
        if all(p.is_file() for p in paths):
            present += paths
        else:
            missing.append(cid)
    return present, missing


def report_partial(results: Path, report_dir: Path | None = None) -> dict[str, list[str]]:
    """Write the run's merged CSVs, figures, report.md and answers.md from its cells; return the missing cells per study."""
    run = results.resolve().name
    snapshot = results / "config.yaml"
    if not snapshot.is_file():
        raise FileNotFoundError(
            f"{snapshot}: no config snapshot; make it with the run's own flags, e.g. "
            f"`snakemake --configfile <overlay> --config run={run} {snapshot}`"
        )
    config = load_yaml(snapshot)
    report_dir = report_dir or Path("report") / run
    csvs, figures, missing = {}, [], {}
    for study in config["studies"]:
        present, missing[study] = study_cells(results, study, config)
        if not present:
            continue
        # config.get: a run snapshotted before peak_gbps existed has none
        merged = merge_cells(present, study, config["peak_tflops"], config["flags"], config["interval_floor_rel"], config.get("peak_gbps"))
        csvs[study] = results / f"{study}.csv"
        write_csv_atomic(merged, csvs[study])
        figures.append(report_dir / "figures" / study)
        plot_study(study, load_study(csvs[study], study), figures[-1], run=run)
    if not csvs:
        raise FileNotFoundError(f"{results}: no cell CSV of any study in {', '.join(config['studies'])}")
    write_report(
        out=report_dir / "report.md",
        run=run,
        studies=list(csvs),
        csvs=list(csvs.values()),
        figure_dirs=figures,
        config=config,
        benchmarks=Path("benchmarks") / run,
        missing=missing,
    )
    write_answers(out=report_dir / "answers.md", run=run, csvs=csvs, config=config)
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cs336sys.runs.partial", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, metavar="RUN_DIR", help="results/<run>: its config.yaml snapshot and <study>/cells/")
    parser.add_argument("--report-dir", type=Path, help="where report.md, answers.md and figures/ go (default report/<run>)")
    args = parser.parse_args(argv)
    try:
        missing = report_partial(args.results, args.report_dir)
    except FileNotFoundError as err:
        parser.error(str(err))
    for study, cells in missing.items():
        config = load_yaml(args.results / "config.yaml")
        total = len(grid(study, config, offered(config.get("plugins"))))
        print(f"{study}: {total - len(cells)} of {total} cells" + (f"; missing: {', '.join(cells)}" if cells else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
