"""The time left in a sweep, from a fake run folder: the plan, the CSVs written since, their rows' job times."""

from __future__ import annotations

import json
import os
import time

import pytest

from cs336sys import studies as S
from cs336sys.pipeline import eta


def _csv(path, job_s=None, started=None, finished=None, mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    head, row = ["cell_id", "status"], ["c", "ok"]
    if job_s is not None:
        head, row = head + ["time_job_s"], row + [str(job_s)]
    if started is not None:
        head, row = head + ["started_at", "finished_at"], row + [started, finished]
    path.write_text(",".join(head) + "\n" + ",".join(row) + "\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run's folder: two e2e cells and a flash cell measured before, a profile cell never; the plan reruns them all."""
    monkeypatch.chdir(tmp_path)
    cells = tmp_path / "results" / "r"
    old = time.time() - 3600
    csvs = {
        "e2e/a": _csv(cells / "e2e/cells/a.csv", job_s=30.0, mtime=old),
        "e2e/b": _csv(cells / "e2e/cells/b.csv", job_s=34.0, mtime=old),
        "e2e/c": _csv(cells / "e2e/cells/c.csv", job_s=33.0, mtime=old),
        # rows from before the time columns: the measuring process's span, 12 s
        "flash/x": _csv(cells / "flash/cells/x.csv", started="2026-01-01T00:00:00+00:00", finished="2026-01-01T00:00:12+00:00", mtime=old),
        "profile/p": cells / "profile/cells/p.csv",
    }
    plan = tmp_path / "logs" / "r" / "sweep-plan.json"
    jobs = [(key.split("/")[0], str(path.relative_to(tmp_path)), S.study(key.split("/")[0]).estimate_s) for key, path in csvs.items()]
    eta.write_plan(plan, jobs)
    return plan, csvs


def test_the_plan_keeps_each_cell_previous_duration(run):
    plan, _ = run
    jobs = {j["csv"].split("/cells/")[1]: j["previous_s"] for j in json.loads(plan.read_text())["jobs"]}
    assert jobs == {"a.csv": 30.0, "b.csv": 34.0, "c.csv": 33.0, "x.csv": 12.0, "p.csv": None}


def test_before_any_cell_the_estimate_is_the_previous_run_or_the_study_estimate(run):
    plan, _ = run
    p = eta.progress(plan)
    assert (p.done, p.total, p.measured_s) == (0, 5, 0.0)
    assert p.left_s == 30 + 34 + 33 + 12 + S.study("profile").estimate_s
    assert p.sources == {"a previous run's": ["e2e", "flash"], "estimates for": ["profile"]}


def test_finished_cells_of_this_run_set_their_study_mean(run):
    plan, csvs = run
    _csv(csvs["e2e/a"], job_s=10.0)  # measured again in this invocation: written after the plan
    _csv(csvs["profile/p"], job_s=20.0)
    p = eta.progress(plan)
    assert (p.done, p.measured_s) == (2, 30.0)
    assert p.left_s == 2 * 10.0 + 12.0  # e2e's two left at this run's mean; flash at its previous duration
    line = eta.line(p)
    assert (
        line == "[cs336sys] 2 of 5 cell jobs done, 30 s measured; about 32 s left (from this run's e2e cells; a previous run's flash cells)"
    )


def test_several_gpus_share_what_is_left(run, tmp_path):
    _, csvs = run
    plan = tmp_path / "two.json"
    eta.write_plan(plan, [("e2e", str(csvs["e2e/b"]), 30.0), ("e2e", str(csvs["e2e/c"]), 30.0)], at_once=2)
    assert eta.progress(plan).left_s == (34 + 33) / 2


def test_an_estimate_every_few_cells_and_at_the_end(run, capsys):
    plan, csvs = run
    assert eta.report(plan, every=2) is None  # none done yet
    _csv(csvs["e2e/a"], job_s=10.0)
    assert eta.report(plan, every=2) is None
    _csv(csvs["e2e/b"], job_s=14.0)
    assert eta.report(plan, every=2).startswith("[cs336sys] 2 of 5 cell jobs done, 24 s measured; about 35 s left")  # 12 + 12 + 11
    for key in ("e2e/c", "flash/x", "profile/p"):
        _csv(csvs[key], job_s=1.0)
    assert eta.report(plan, every=2) == "[cs336sys] 5 of 5 cell jobs done, 27 s measured; none left"
    assert capsys.readouterr().err.splitlines()[-1].endswith("none left")


def test_a_plan_that_cannot_be_written_only_costs_the_estimate(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    eta.write_plan(tmp_path / "file" / "plan.json", [("e2e", "x.csv", 30.0)])  # under a file: no folder can be made
    assert "no estimate of the time left" in capsys.readouterr().err


def test_no_plan_no_estimate_and_never_an_error(tmp_path, capsys):
    assert eta.report(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{")
    assert eta.report(tmp_path / "bad.json") is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("seconds,words", [(45, "45 s"), (190, "3 min 10 s"), (3900, "1 h 5 min")])
def test_durations_read_as_minutes_and_seconds(seconds, words):
    assert eta.duration(seconds) == words
