"""Merged study CSVs that break the row contract (cs336sys.rows.problems) are refused, naming the file and row.

Every reader of a run's rows goes through ``pipeline.merge.load_study``: the comparison and its gate, the
handout page, the between-device figures, the report. Before, a negative median, an interval upside down,
a duplicated row or a missing ``status`` were read as numbers and published (a page printed "-2.0 [2.1,
1.9] ms"); a CSV pandas could not parse gave a traceback that named no file. CPU only, in-process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from cs336sys import rows
from cs336sys.handout import page
from cs336sys.pipeline.merge import load_study

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cpu-demo"
TIMED = 1  # row 2 of the fixture's e2e.csv: an ok timed row (inference forward, 21.17 ms [4.04, 110.9])
PAIR = 7  # row 8: a paired ratio (train step, fp32 / bf16)


def _edit(path: Path, row: int, **changes) -> None:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    for column, value in changes.items():
        df.loc[row, column] = value
    df.to_csv(path, index=False)


def _drop(path: Path, column: str) -> None:
    pd.read_csv(path, dtype=str, keep_default_na=False).drop(columns=column).to_csv(path, index=False)


def _append_copy(path: Path, row: int) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[row + 1]]) + "\n")


# name → (damage done to e2e.csv, words the error must hold besides the path)
BAD_MERGED = {
    "no-status-column": (lambda p: _drop(p, "status"), ["missing column", "'status'"]),
    "no-study-column": (lambda p: _drop(p, "study"), ["missing column", "'study'"]),
    "unknown-status": (lambda p: _edit(p, TIMED, status="done"), ["row 2", "status 'done'"]),
    "empty-status": (lambda p: _edit(p, TIMED, status=""), ["row 2", "status ''"]),
    "negative-median": (lambda p: _edit(p, TIMED, median_ms="-21.2"), ["row 2", "median_ms -21.2"]),
    "zero-median": (lambda p: _edit(p, TIMED, median_ms="0"), ["row 2", "median_ms 0"]),
    "nan-median": (lambda p: _edit(p, TIMED, median_ms=""), ["row 2", "no median_ms"]),
    "inf-median": (lambda p: _edit(p, TIMED, median_ms="inf"), ["row 2", "median_ms inf"]),
    "upside-down": (lambda p: _edit(p, TIMED, ci_low_ms="110.9", ci_high_ms="4.04"), ["row 2", "does not hold", "[110.9, 4.04]"]),
    "negative-low": (lambda p: _edit(p, TIMED, ci_low_ms="-1"), ["row 2", "below zero"]),
    "no-interval": (lambda p: _edit(p, TIMED, ci_low_ms="", ci_high_ms=""), ["row 2", "no interval"]),
    "inf-bound": (lambda p: _edit(p, TIMED, ci_high_ms="inf"), ["row 2", "not finite"]),
    "one-bound-column": (lambda p: _drop(p, "ci_high_ms"), ["'ci_low_ms' without its other bound"]),
    "bad-gpu-time": (lambda p: _edit(p, TIMED, gpu_median_ms="-3", gpu_ci_low_ms="1", gpu_ci_high_ms="2"), ["gpu_median_ms -3"]),
    "inf-ratio": (lambda p: _edit(p, PAIR, ratio="inf"), ["row 8", "ratio inf"]),
    "duplicated-timed-row": (lambda p: _append_copy(p, TIMED), ["rows 2, 31", "inference", "forward", "duplicated row"]),
    "duplicated-pair": (lambda p: _append_copy(p, PAIR), ["rows 8, 31", "paired ratio", "pair_with precision=bf16"]),
    "empty-file": (lambda p: p.write_text(""), ["not a CSV"]),
    "binary": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00garbage"), ["not a CSV"]),
    "unclosed-quote": (lambda p: p.write_text('study,cell_id,status,error\ne2e,"unclosed,ok,\n'), ["not a CSV"]),
    "empty-cell-id": (lambda p: _edit(p, TIMED, cell_id=""), ["row 2", "no cell_id"]),
    "repeated-column": (
        lambda p: p.write_text(p.read_text().replace("median_ms,", "median_ms,median_ms,", 1)),
        ["'median_ms' appears more than once"],
    ),
    "a-directory": (lambda p: (p.unlink(), p.mkdir()), ["cannot be read"]),
}


@pytest.fixture
def run(tmp_path) -> Path:
    out = tmp_path / "results" / "run1"
    shutil.copytree(FIXTURE, out)
    return out


@pytest.mark.parametrize("case", list(BAD_MERGED))
def test_a_merged_csv_that_breaks_the_contract_is_refused_naming_file_and_row(run, case):
    damage, words = BAD_MERGED[case]
    damage(run / "e2e.csv")
    with pytest.raises(ValueError) as exc:
        load_study(run / "e2e.csv", check=True)
    message = str(exc.value)
    assert message.startswith(str(run / "e2e.csv")), message
    for word in words:
        assert word in message, f"{word!r} not in: {message}"


def test_the_fixture_runs_keep_the_contract():
    for path in sorted(FIXTURE.glob("*.csv")):
        assert rows.problems(load_study(path)) == [], path


def test_a_study_with_no_row_and_no_error_column_still_loads(run):
    """A reduced run may keep no cell of a study (its answers say "not measured") and no failure (no error text)."""
    (run / "mha.csv").write_text((run / "mha.csv").read_text().splitlines()[0] + "\n")
    _drop(run / "e2e.csv", "error")
    assert load_study(run / "mha.csv", check=True).empty and len(load_study(run / "e2e.csv", check=True)) == 30


def test_an_old_run_without_interval_columns_still_loads(run):
    """Runs before intervals recorded none: readable (compare says `n/a`); a candidate without them fails the gate."""
    _drop(run / "e2e.csv", "ci_low_ms")
    _drop(run / "e2e.csv", "ci_high_ms")
    assert len(load_study(run / "e2e.csv", check=True)) == 30


def test_a_csv_that_is_no_studys_is_read_as_it_is(run):
    pd.DataFrame({"x": [1, 1]}).to_csv(run / "summary.csv", index=False)
    assert len(load_study(run / "summary.csv")) == 2


def test_a_row_named_many_times_is_counted_not_listed(run):
    for row in range(6):
        _edit(run / "e2e.csv", row, median_ms="-1")
    message = str(pytest.raises(ValueError, load_study, run / "e2e.csv", check=True).value)
    assert message.count("median_ms -1") == 3 and "… and 3 more row(s) like these" in message


# ---------------------------------------------------------------- the handout page: refuses, names the file, no traceback


def test_the_page_refuses_bad_rows_naming_the_file(run, tmp_path, capsys):
    _edit(run / "e2e.csv", TIMED, median_ms="-21.2", ci_low_ms="110.9", ci_high_ms="4.04")
    out = tmp_path / "page.md"
    assert page.main(["--out", str(out), str(run)]) == 1
    err = capsys.readouterr().err
    assert str(run / "e2e.csv") in err and "median_ms -21.2" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("case", ["binary", "unclosed-quote", "no-status-column"])
def test_the_page_names_a_malformed_csv_and_does_not_blame_itself(run, tmp_path, capsys, case):
    BAD_MERGED[case][0](run / "attention.csv")
    out = tmp_path / "page.md"
    assert page.main(["--out", str(out), str(run)]) == 1
    err = capsys.readouterr().err
    assert str(run / "attention.csv") in err and "bug" not in err
    assert not out.exists()


def _usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        page.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m cs336sys.handout") and "Traceback" not in err
    return err


def test_usage_errors_are_usage_errors(run, tmp_path, capsys):
    out = str(tmp_path / "page.md")
    assert "no run folder" in _usage_error(capsys, ["--out", out, str(tmp_path / "missing")])
    assert "no run folder" in _usage_error(capsys, ["--out", out, str(run / "e2e.csv")])
    assert "two runs share a name: run1" in _usage_error(capsys, ["--out", out, str(run), str(run)])
    assert "cannot be a file" in _usage_error(capsys, ["--out", str(tmp_path), str(run)])
    assert "the following arguments are required" in _usage_error(capsys, [str(run)])
    assert "cannot be a file" in _usage_error(capsys, ["--out", str(run / "e2e.csv" / "page.md"), str(run)])
    assert not Path(out).exists()
