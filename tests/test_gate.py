"""The regression gate cannot be fooled (cs336sys.runs.gate): a candidate that measured less, measured with other
settings, or holds rows that cannot be right fails, or is refused naming its file. CPU only, in-process.

Baseline and candidate start as two copies of the fixture run (tests/fixtures/cpu-demo: every study, real
rows and config.yaml), so the gate passes on them; each case damages the candidate one way. Before, every
one of these passed the gate (an all-skipped candidate among them) or died with a traceback naming no file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cs336sys.runs import compare as cmp

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cpu-demo"
E2E_CELL = "size=tiny_context_length=32_precision=fp32_impl=eager_compile=0_cuda_graphs=0"


def _frame(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _rewrite(path: Path, change) -> None:
    df = _frame(path)
    change(df)
    df.to_csv(path, index=False)


def _set(path: Path, row: int | None = None, **values) -> None:
    """Set columns of one row of a CSV (every row where ``row`` is None)."""

    def change(df):
        for column, value in values.items():
            df.loc[df.index if row is None else row, column] = value

    _rewrite(path, change)


def _skip_all(run: Path) -> None:
    for path in run.glob("*.csv"):
        _set(path, status="skipped", error="the study needs CUDA; this machine has none")


def _skip_one_cell(run: Path) -> None:
    rows = _frame(run / "e2e.csv").index[_frame(run / "e2e.csv")["cell_id"] == E2E_CELL]
    for row in rows:
        _set(run / "e2e.csv", row, status="skipped", error="no CUDA")


def _error_one_cell(run: Path) -> None:
    df = _frame(run / "e2e.csv")
    keep = df[df["cell_id"] != E2E_CELL]
    failed = df[df["cell_id"] == E2E_CELL].head(1).assign(status="error", error="RuntimeError: boom", mode="", phase="", kind="")
    pd.concat([keep, failed]).to_csv(run / "e2e.csv", index=False)


def _drop_cell(run: Path, study="e2e", cell=E2E_CELL) -> None:
    df = _frame(run / f"{study}.csv")
    df[df["cell_id"] != cell].to_csv(run / f"{study}.csv", index=False)


def _drop_columns(run: Path, *columns: str) -> None:
    _frame(run / "e2e.csv").drop(columns=list(columns)).to_csv(run / "e2e.csv", index=False)


def _config(run: Path, change) -> None:
    config = yaml.safe_load((run / "config.yaml").read_text())
    change(config)
    (run / "config.yaml").write_text(yaml.safe_dump(config))


def _first_precision_cell(run: Path) -> str:
    return _frame(run / "precision.csv")["cell_id"].iloc[0]


# name → (damage done to the candidate, words the gate's failure must hold)
FOOLED = {
    "all-skipped": (_skip_all, ["ok → skipped"]),
    "one-cell-skipped": (_skip_one_cell, ["ok → skipped", E2E_CELL]),
    "one-cell-error": (_error_one_cell, ["ok → error", E2E_CELL]),
    "cell-missing": (_drop_cell, ["missing in b", E2E_CELL]),
    "study-missing": (lambda r: (r / "precision.csv").unlink(), ["Studies of a missing in b: `precision`"]),
    "study-header-only": (
        lambda r: (r / "e2e.csv").write_text((r / "e2e.csv").read_text().splitlines()[0] + "\n"),
        ["Studies of a missing in b: `e2e`"],
    ),
    "untimed-cell-missing": (
        lambda r: _drop_cell(r, "precision", _first_precision_cell(r)),
        ["Cells ok in a with no ok row in b", "missing"],
    ),
    "no-interval-columns": (lambda r: _drop_columns(r, "ci_low_ms", "ci_high_ms"), ["no interval in b: not judged"]),
    "no-median-column": (lambda r: _drop_columns(r, "median_ms"), ["no median in b: not judged"]),
    "batch-size-in-config": (lambda r: _config(r, lambda c: c["e2e"].update(batch_size=4)), ["`e2e.batch_size` (config.yaml): 2 → 4"]),
    "trials-in-config": (lambda r: _config(r, lambda c: c["attention"].update(trials=9)), ["`attention.trials` (config.yaml): 3 → 9"]),
    "steps-in-config": (lambda r: _config(r, lambda c: c["mha"].update(measure_steps=30)), ["`mha.measure_steps` (config.yaml): 3 → 30"]),
    "interval-floor": (
        lambda r: _config(r, lambda c: c.update(interval_floor_rel=0.5)),
        ["`interval_floor_rel` (config.yaml): 0.01 → 0.5"],
    ),
    "config-missing": (lambda r: (r / "config.yaml").unlink(), ["`config.yaml`", "the candidate's settings cannot be compared"]),
    "batch-size-in-rows": (lambda r: _set(r / "e2e.csv", batch_size="8"), ["`e2e.batch_size` (rows of 2 cell(s)): 2 → 8"]),
}


@pytest.fixture
def runs(tmp_path) -> tuple[Path, Path]:
    a, b = tmp_path / "results" / "base", tmp_path / "results" / "new"
    shutil.copytree(FIXTURE, a)
    shutil.copytree(FIXTURE, b)
    return a, b


def test_two_copies_of_one_run_pass(runs, tmp_path):
    out = tmp_path / "gate.txt"
    assert cmp.gate(list(runs), ["base", "new"], 1.05, out) is None
    assert out.read_text().startswith("passed: `new` vs `base` (baseline), fail above 1.05")


@pytest.mark.parametrize("case", list(FOOLED))
def test_the_gate_fails_a_candidate_that_measured_less_or_otherwise(runs, tmp_path, case):
    damage, words = FOOLED[case]
    damage(runs[1])
    out = tmp_path / "gate.txt"
    failure = cmp.gate(list(runs), ["base", "new"], 1.05, out)
    assert failure is not None and failure.startswith("FAILED: `new` vs `base` (baseline), fail above 1.05"), failure
    for word in words:
        assert word in failure, f"{word!r} not in: {failure}"
    assert not out.exists()


def test_an_all_skipped_candidate_fails_the_clis_gate_and_the_reports(runs, tmp_path, capsys):
    _skip_all(runs[1])
    assert cmp.main([*map(str, runs), "--out", str(tmp_path / "cli"), "--fail-above", "1.05"]) == 1
    assert "ok → skipped" in capsys.readouterr().out
    report = (tmp_path / "cli" / "report.md").read_text()
    assert "Fail above 1.05: **FAILED**" in report and "ok → skipped" in report


BAD_CANDIDATE = {
    "no-status-column": (lambda p: _frame(p).drop(columns="status").to_csv(p, index=False), "missing column 'status'"),
    "unknown-status": (lambda p: _set(p, 1, status="fine"), "status 'fine'"),
    "nan-median": (lambda p: _set(p, 1, median_ms=""), "no median_ms"),
    "negative-median": (lambda p: _set(p, 1, median_ms="-5"), "median_ms -5"),
    "zero-median": (lambda p: _set(p, 1, median_ms="0"), "median_ms 0"),
    "upside-down": (lambda p: _set(p, 1, ci_low_ms="200", ci_high_ms="1"), "does not hold"),
    "no-interval-values": (lambda p: _set(p, 1, ci_low_ms="", ci_high_ms=""), "no interval"),
    "duplicated-rows": (lambda p: p.write_text(p.read_text() + p.read_text().splitlines()[2] + "\n"), "duplicated row"),
    "binary": (lambda p: p.write_bytes(b"\x00\xff\xfe garbage"), "not a CSV"),
    "a-second-copy": (lambda p: shutil.copy(p, p.with_name("e2e-again.csv")), "repeat each other"),
}


@pytest.mark.parametrize("case", list(BAD_CANDIDATE))
def test_a_candidate_csv_that_breaks_the_row_contract_is_refused_naming_it(runs, tmp_path, capsys, case):
    damage, words = BAD_CANDIDATE[case]
    csv = runs[1] / "e2e.csv"
    damage(csv)
    with pytest.raises(ValueError) as exc:
        cmp.gate(list(runs), ["base", "new"], 1.05, tmp_path / "gate.txt")
    assert str(csv) in str(exc.value) and words in str(exc.value), str(exc.value)
    assert not (tmp_path / "gate.txt").exists()
    assert cmp.main([*map(str, runs), "--out", str(tmp_path / "cli"), "--fail-above", "1.05"]) == 2
    assert str(csv) in capsys.readouterr().err


def test_a_baseline_that_measured_nothing_fails_the_gate(runs, tmp_path):
    """Two all-skipped runs have no regression between them, and nothing to show either: the gate fails."""
    for run in runs:
        _skip_all(run)
    failure = cmp.gate(list(runs), ["base", "new"], 1.05, tmp_path / "gate.txt")
    assert failure is not None and "Baseline: no ok row in a: nothing to gate b against" in failure


def test_new_cells_in_the_candidate_and_an_old_baseline_without_intervals_still_pass(runs, tmp_path):
    """Cells only in b are not failures; a baseline from before intervals is compared, not judged, and said so."""
    _drop_cell(runs[0])
    _drop_columns(runs[0], "ci_low_ms", "ci_high_ms")
    out = tmp_path / "gate.txt"
    assert cmp.gate(list(runs), ["base", "new"], 1.05, out) is None
    assert "not checked: 6 row(s) ok in both not judged: the baseline recorded no median or interval" in out.read_text()


def test_runs_without_config_are_compared_by_their_rows_and_say_so(runs, tmp_path):
    for run in runs:
        (run / "config.yaml").unlink()
    out = tmp_path / "gate.txt"
    assert cmp.gate(list(runs), ["base", "new"], 1.05, out) is None
    assert "settings compared from the rows only" in out.read_text()
    _set(runs[1] / "flash.csv", batch_size="4")
    assert "`flash.batch_size` (rows of 2 cell(s)): 1 → 4" in cmp.gate(list(runs), ["base", "new"], 1.05, out)


@pytest.mark.parametrize("text", ["e2e: {batch_size: [unclosed\n", "- a list\n- of things\n"])
def test_a_candidates_config_yaml_that_is_no_mapping_is_refused_naming_it(runs, tmp_path, capsys, text):
    (runs[1] / "config.yaml").write_text(text)
    with pytest.raises(ValueError) as exc:
        cmp.gate(list(runs), ["base", "new"], 1.05, tmp_path / "gate.txt")
    assert str(runs[1] / "config.yaml") in str(exc.value)
    assert cmp.main([*map(str, runs), "--out", str(tmp_path / "cli"), "--fail-above", "1.05"]) == 2
    assert str(runs[1] / "config.yaml") in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1.05"])
def test_a_threshold_that_lets_every_row_pass_is_a_usage_error(runs, tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exc:
        cmp.main([*map(str, runs), "--out", str(tmp_path / "cli"), "--fail-above", value])
    assert exc.value.code == 2 and "not a finite ratio above 0" in capsys.readouterr().err


# runs workflow/scripts/compare.py as Snakemake does: in its own process, with a `snakemake` object
GATE_JOB = """
import json, runpy, sys
from types import SimpleNamespace as N
job = json.loads(sys.argv[1])
params = N(runs=job["runs"], names=["base", "new"], fail_above=1.05, keys=lambda: ["runs", "names", "fail_above"])
snakemake = N(scriptdir=job["scriptdir"], output=[job["out"]], log=[job["log"]], params=params)
runpy.run_path(job["scriptdir"] + "/compare.py", init_globals={"snakemake": snakemake})
"""


@pytest.mark.slow  # a process, as the workflow's gate job
def test_the_workflows_gate_job_refuses_a_bad_csv_naming_it_and_writes_nothing(runs, tmp_path):
    import json
    import subprocess
    import sys

    _set(runs[1] / "e2e.csv", 1, median_ms="-5")  # read as "faster" before
    out, log = tmp_path / "gate-1.05.txt", tmp_path / "gate.log"
    scripts = Path(__file__).resolve().parents[1] / "workflow" / "scripts"
    job = {"scriptdir": str(scripts), "runs": [str(r) for r in runs], "out": str(out), "log": str(log)}
    proc = subprocess.run([sys.executable, "-c", GATE_JOB, json.dumps(job)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and not out.exists()
    assert f"refused: {runs[1] / 'e2e.csv'}: breaks the row contract" in proc.stderr and "median_ms -5" in proc.stderr
    assert "Traceback" not in proc.stderr
