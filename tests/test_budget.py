"""Where a cell job's time goes: the parts a measurement marks, the runner's split of the job's wall time, the report's table."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys.columns import TIME_COLUMNS, fold_of
from cs336sys.measure.session import PARTS, Policy, Session
from cs336sys.pipeline.cells import _time_columns
from cs336sys.runs.efficiency import measuring_share, sweep_efficiency, time_split
from cs336sys.runs.report import write_report


def test_a_part_inside_another_counts_towards_the_outer_one():
    session = Session()
    with session.part("pairs"):
        with session.part("timed"):  # a paired comparison's timed blocks are the comparison's
            time.sleep(0.02)
    with session.part("check"):
        time.sleep(0.01)
    spent = session.spent()
    assert spent["pairs"] >= 0.02 and spent["check"] >= 0.01
    assert spent["timed"] == 0.0
    with pytest.raises(ValueError, match="unknown part 'compile'"):
        with session.part("compile"):
            pass
    assert Session().spent() == dict.fromkeys(PARTS, 0.0)  # another cell's session counts from zero


def test_the_harness_splits_a_call_by_its_own_warm_up():
    session = Session()
    session.add_steps(warmup_s=0.01, total_s=0.03)  # the harness's own warm-up seconds: the rows' warmup_s
    assert session.spent()["warmup"] == 0.01 and session.spent()["timed"] == pytest.approx(0.02)
    with session.part("energy"):  # blocks timed for their energy: warm-up and blocks are the energy part's
        time.sleep(0.03)
        session.add_steps(warmup_s=0.01, total_s=0.03)
    assert session.spent()["warmup"] == 0.01 and session.spent()["energy"] >= 0.03


def test_the_runner_splits_the_job_into_parts_that_add_up():
    now = time.monotonic()
    clock = {"job": now - 10.0, "begun": now - 7.5, "spent": {**dict.fromkeys(PARTS, 0.0), "warmup": 1.0, "timed": 4.0}}
    cols = _time_columns(clock)
    assert set(cols) == set(TIME_COLUMNS)
    assert cols["time_job_s"] == pytest.approx(10.0, abs=0.05) and cols["time_startup_s"] == pytest.approx(2.5, abs=0.05)
    assert cols["time_other_s"] == pytest.approx(2.5, abs=0.05)
    assert sum(v for k, v in cols.items() if k != "time_job_s") == pytest.approx(cols["time_job_s"], abs=0.01)
    before = _time_columns({"job": now - 3.0})  # the child never began measuring: all of it was start-up
    assert before["time_startup_s"] == before["time_job_s"] and before["time_other_s"] == 0.0 and before["time_timed_s"] is None
    crashed = _time_columns({"job": now - 3.0, "begun": now - 2.0})  # it died measuring: its parts are unknown
    assert crashed["time_timed_s"] is None and crashed["time_other_s"] == pytest.approx(2.0, abs=0.05)


def test_every_time_column_folds_by_summing_the_passes():
    assert {fold_of(c) for c in TIME_COLUMNS} == {"sum"}


def test_the_harness_marks_warm_up_and_timed_blocks_and_an_interleaved_comparison_its_pairs():
    from cs336sys.measure.interleave import time_arms
    from cs336sys.measure.timing import time_steps

    def step(clock):
        time.sleep(0.002)

    cpu, session = torch.device("cpu"), Session(Policy(trials=2))
    time_steps(step, session, warmup=2, steps=3, device=cpu)
    after_steps = session.spent()
    assert after_steps["warmup"] >= 0.004 and after_steps["timed"] >= 0.012 and after_steps["pairs"] == 0.0
    time_arms({"own": step, "partner": step}, session, warmup=1, block_steps=1, device=cpu, min_pairs=2)
    spent = session.spent()
    assert spent["pairs"] >= 0.008  # its warm-up and blocks are the comparison's, not warm-up or timed
    assert (spent["warmup"], spent["timed"]) == (after_steps["warmup"], after_steps["timed"])


def test_an_attention_cell_marks_its_correctness_check():
    from cs336sys.studies.attention.measure import measure

    session = Session()
    kwargs = cell_kwargs("attention", d_model=16, seq_len=32, batch_size=1, warmup_steps=0, measure_steps=1)
    list(measure(torch.device("cpu"), {}, session, **kwargs))
    assert session.spent()["check"] > 0


def test_a_flash_cell_marks_its_first_call_check_and_timed_calls():
    from cs336sys.studies.flash.measure import measure

    session = Session()
    list(
        measure(
            torch.device("cpu"), {}, session, **cell_kwargs("flash", seq_len=32, head_dim=16, precision="fp32", impl="eager", rep_ms=1.0)
        )
    )
    spent = session.spent()
    assert spent["warmup"] > 0 and spent["check"] > 0 and spent["timed"] > 0  # compilation and autotuning: its first call


def _job(cell, started, job, startup, timed, pairs=0.0, **extra):
    return {
        "cell_id": cell,
        "started_at": started,
        "finished_at": started,
        "time_job_s": job,
        "time_startup_s": startup,
        "time_timed_s": timed,
        "time_pairs_s": pairs,
        "time_other_s": job - startup - timed - pairs,
        **extra,
    }


def _frames():
    t0, t1 = "2026-01-01T00:00:00.000+00:00", "2026-01-01T00:01:00.000+00:00"
    both = {"pass_started_at": f"{t0};{t1}", "pass_finished_at": f"{t0};{t1}"}
    e2e = pd.DataFrame(
        [
            # a merged row of two passes (the sums), another phase of the same mode, and a pair row of pass 0
            _job("a", t0, 20.0, 2.0, 8.0, 6.0, mode="train", phase="step", **both),
            _job("a", t0, 20.0, 2.0, 8.0, 6.0, mode="train", phase="forward", **both),
            _job("a", t0, 11.0, 1.0, 4.0, 3.0, mode="train", phase="step", kind="pair"),
            # a cell whose pass 1 failed: its failure row is its own job
            _job("b", t0, 5.0, 1.0, 3.0, mode="train", phase="step"),
            _job("b", t1, 4.0, 4.0, 0.0, mode="train", status="oom"),
        ]
    )
    flash = pd.DataFrame([_job("c", t0, 10.0, 5.0, 5.0, phase=p) for p in ("forward", "backward")])
    return {"e2e": e2e, "flash": flash}


def test_the_time_split_counts_each_job_once_per_study():
    table = time_split(_frames()).set_index("study")
    assert table.loc["e2e", "cell jobs"] == 4 and table.loc["e2e", "job wall (s)"] == 29.0  # 20 + 5 + 4
    assert table.loc["e2e", "startup (%)"] == round(100 * 7 / 29, 1)  # 2 + 1 + 4
    assert table.loc["e2e", "pairs (%)"] == round(100 * 6 / 29, 1)
    assert table.loc["flash", "cell jobs"] == 1 and table.loc["flash", "timed (%)"] == 50.0
    assert table.loc["all", "job wall (s)"] == 39.0
    shares = [c for c in table.columns if c.endswith("(%)")]
    assert table.loc["all", shares].sum() == pytest.approx(100.0, abs=0.5)
    assert measuring_share(_frames()) == (8.0 + 6.0 + 3.0 + 5.0, 39.0)
    efficiency = dict(sweep_efficiency(_frames()).itertuples(index=False))
    assert efficiency[next(k for k in efficiency if "spent measuring" in k)] == "22.0 s of 39.0 s (56%)"


def test_runs_without_time_columns_have_no_split():
    assert time_split({"e2e": pd.DataFrame({"cell_id": ["a"], "started_at": ["x"]})}).empty


def test_the_report_shows_where_the_sweep_time_went(tmp_path: Path):
    # the precision study's report needs no timing columns: these rows stand for any study's
    csv = tmp_path / "precision.csv"
    rows = _frames()["e2e"]
    rows.assign(study="precision", part="accumulation", status=rows["status"].fillna("ok")).to_csv(csv, index=False)
    text = write_report(tmp_path / "report.md", "r", ["precision"], [csv], [tmp_path / "figures"]).read_text()
    section = text.split("## Sweep efficiency")[1].split("\n## ")[0]
    assert "Where the cell jobs' time went" in section
    assert "| precision " in section and "| all " in section
