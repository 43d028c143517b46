"""Cell jobs' Snakemake priorities: the longest expected cells first, pass k of every cell before pass k+1.

Expected durations come from the same cell's measuring process in the run's previous results (its
per-cell CSVs), else from the study's estimate. The dry run at the end checks that Snakemake takes
the priorities from the rule as this module computes them.
"""

from pathlib import Path

import pandas as pd
import pytest

from cs336sys import studies as S
from cs336sys.pipeline.priorities import callable_priorities, expected_seconds, job_priorities, measured_s
from workflow_helpers import DEMO, DEMO_RUN, copy_repo, dry_run, grid, load_config

T0 = pd.Timestamp("2026-01-01T00:00:00+00:00")


def _at(seconds: float) -> str:
    return (T0 + pd.Timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


def _cell_csv(path: Path, spans) -> Path:
    """A cell CSV whose rows (modes, phases) ran between the given (start, end) seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"cell_id": path.stem, "status": "ok", "started_at": _at(s), "finished_at": _at(e)} for s, e in spans]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _layout(root: Path):
    """results/<run>/<study>/cells/[pass<k>/]<cell>.csv, as common.smk spells it."""
    return lambda study, cell, k: root / study / "cells" / ("" if k == 0 else f"pass{k}") / f"{cell}.csv"


def test_a_cell_files_measuring_time_is_its_first_start_to_last_end(tmp_path):
    assert measured_s(_cell_csv(tmp_path / "a.csv", [(0, 30), (2, 42.5)])) == pytest.approx(42.5)
    assert measured_s(tmp_path / "missing.csv") is None
    (tmp_path / "old.csv").write_text("cell_id,status\na,ok\n")  # no timestamps: nothing to go by
    assert measured_s(tmp_path / "old.csv") is None


def test_previous_results_else_the_study_estimate(tmp_path):
    cell_file = _layout(tmp_path)
    _cell_csv(cell_file("e2e", "long", 0), [(0, 40)])
    _cell_csv(cell_file("e2e", "long", 1), [(100, 120)])
    _cell_csv(cell_file("e2e", "short", 0), [(0, 1)])
    grids = {"e2e": ["long", "short", "new"], "attention": ["x"], "brand-new-study": ["y"]}
    estimates = {"e2e": 5.0, "attention": 4.0, "brand-new-study": 7.0}
    expected = expected_seconds(grids, {"e2e": 2, "attention": 1, "brand-new-study": 1}, cell_file, estimates)
    assert expected[("e2e", "long")] == pytest.approx(30.0)  # the mean of its passes
    assert expected[("e2e", "short")] == pytest.approx(1.0)
    assert expected[("e2e", "new")] == 5.0
    assert expected[("attention", "x")] == 4.0
    assert expected[("brand-new-study", "y")] == 7.0


def test_each_study_carries_its_estimate_and_a_new_one_gets_the_default():
    assert all(S.study(name).estimate_s > 0 for name in S.STUDIES)
    assert S.study("profile").estimate_s > S.study("precision").estimate_s  # the H100 sweep's medians: 11 s and 0.5 s
    assert S.Study(name="toy", question="?", axes=("width",), kind="toy").estimate_s == 5.0


def test_longest_first_within_a_pass_and_every_pass_before_the_next():
    expected = {("e2e", "a"): 3.0, ("e2e", "b"): 30.0, ("attention", "c"): 10.0, ("e2e", "d"): 10.0}
    prio = job_priorities(expected, max_passes=2)
    for k in (0, 1):
        order = sorted(expected, key=lambda key: -prio.cell(*key, k))
        assert order == [("e2e", "b"), ("attention", "c"), ("e2e", "d"), ("e2e", "a")]  # ties: study, then cell
        assert len({prio.cell(*key, k) for key in expected}) == len(expected)
    assert min(prio.cell(*key, 0) for key in expected) > max(prio.cell(*key, 1) for key in expected)
    # the snapshot runs before every cell; merges, figures and reports (priority 0) after them
    assert prio.above_cells > max(prio.cell(*key, 0) for key in expected)
    assert min(prio.cell(*key, 1) for key in expected) > 0
    assert all(isinstance(prio.cell(*key, k), int) for key in expected for k in (0, 1))


def test_a_cell_outside_the_grid_gets_its_pass_floor():
    prio = job_priorities({("e2e", "a"): 3.0}, max_passes=2)
    assert prio.cell("e2e", "unknown", 1) == prio.pass_floor(1) < prio.pass_floor(0) <= prio.cell("e2e", "a", 0)


@pytest.mark.parametrize(("version", "ok"), [("9.0.0", False), ("9.16.3", False), ("9.17.0", True), ("9.27.1", True), ("10.1", True)])
def test_callable_priorities_from_snakemake_9_17(version, ok):
    assert callable_priorities(version) is ok


@pytest.mark.slow  # a snakemake dry run of the demo
def test_the_dry_run_orders_a_long_previous_cell_first(tmp_path):
    root = copy_repo(tmp_path / "repo")
    cells = sorted(grid(load_config(root, DEMO), "e2e"))
    slow = cells[-1]  # ties go to the first cell id: only its previous time can put this one first
    _cell_csv(_layout(root / "results" / DEMO_RUN)("e2e", slow, 1), [(0, 1000)])
    run = dry_run(root, DEMO, extra=["--forceall"])
    prio = {(j.rule, j.wildcards.get("cell", "")): int(j.fields.get("priority", 0)) for j in run.jobs}
    first = {k: v for k, v in prio.items() if k[0].endswith("_cell")}
    second = {k: v for k, v in prio.items() if k[0].endswith("_pass1")}
    assert max(first, key=first.get) == ("e2e_cell", slow), run.describe()
    assert second and min(first.values()) > max(second.values()) > 0
    assert prio[("snapshot", "")] > max(first.values())
    assert prio[("report", "")] == 0
