"""Output paths and cell CSVs that break the contract: refused with a message naming the file, never used silently.

Three defects: an output path naming a FIFO, a device, a symlink… was replaced by the atomic rename (and
its temporary followed a planted symlink); a corrupt or partial cell CSV vanished from the merge or became
a junk row; an all-digit commit lost its leading zero when a CSV was read back.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN
from cs336sys.cli import main
from cs336sys.fileio import write_text_atomic
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import validate_config
from cs336sys.pipeline.merge import load_study, merge_cells
from cs336sys.rows import write_csv_atomic
from cs336sys.runs.compare import load_run
from workflow_helpers import REPO

# ---------------------------------------------------------------- 1. output paths: only a regular file (or nothing) is replaced


def _fifo(path: Path) -> str:
    os.mkfifo(path)
    return "FIFO"


def _socket(path: Path) -> str:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the node stays
    return "socket"


def _char_device(path: Path) -> str:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a second /dev/null
    except PermissionError:
        pytest.skip("making a device node needs root")
    return "character device"


def _directory(path: Path) -> str:
    path.mkdir()
    return "directory"


def _symlink(path: Path) -> str:
    victim = path.with_name("victim.txt")
    victim.write_text("precious\n")
    path.symlink_to(victim)
    return "symbolic link"


def _dangling_symlink(path: Path) -> str:
    path.symlink_to(path.with_name("nowhere"))
    return "symbolic link"


SPECIAL = {
    "fifo": _fifo,
    "socket": _socket,
    "char-device": _char_device,
    "directory": _directory,
    "symlink": _symlink,
    "dangling-symlink": _dangling_symlink,
}


def _kind_of(path: Path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


@pytest.mark.parametrize("kind", list(SPECIAL))
@pytest.mark.parametrize("writer", ["text", "csv"])
def test_writers_refuse_to_replace_anything_but_a_regular_file(tmp_path, kind, writer):
    target = tmp_path / "out.csv"
    what = SPECIAL[kind](target)
    before = _kind_of(target)
    with pytest.raises(OSError) as exc:
        if writer == "text":
            write_text_atomic(target, "a\n1\n")
        else:
            write_csv_atomic(pd.DataFrame({"a": [1]}), target)
    assert str(target) in str(exc.value) and what in str(exc.value)
    assert _kind_of(target) == before, "the node was replaced"
    if kind == "symlink":
        assert (tmp_path / "victim.txt").read_text() == "precious\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")], "a temporary was left behind"


def test_a_planted_symlink_at_the_temporary_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    target = tmp_path / "out.csv"
    planted = tmp_path / f".tmp-{os.getpid()}-out.csv"
    planted.symlink_to(victim)
    with pytest.raises(OSError) as exc:
        write_text_atomic(target, "a\n1\n")
    assert str(planted) in str(exc.value) and "symbolic link" in str(exc.value)
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not os.path.lexists(target), "the output was made (a link to the victim, before the fix)"


def test_a_stale_temporary_of_our_own_is_replaced_and_a_regular_output_is_overwritten(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("old\n")
    (tmp_path / f".tmp-{os.getpid()}-out.csv").write_text("left by a killed writer with our pid\n")
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


@pytest.fixture
def no_measurement(monkeypatch):
    """Fail the test if the CLI starts measuring: the --csv check must come first."""

    def measure(*args, **kwargs):
        raise AssertionError("the cell was measured before --csv was checked")

    monkeypatch.setattr("cs336sys.pipeline.cells.run_cell", measure)
    monkeypatch.delenv("CS336SYS_INJECT_FAULT", raising=False)


S_ISKIND = {"fifo": stat.S_ISFIFO, "char-device": stat.S_ISCHR, "symlink": stat.S_ISLNK, "socket": stat.S_ISSOCK}


@pytest.mark.parametrize("kind", list(S_ISKIND))
def test_cli_refuses_a_csv_path_that_is_not_a_regular_file_before_measuring(tmp_path, capsys, no_measurement, kind):
    target = tmp_path / "rows.csv"
    what = SPECIAL[kind](target)
    with pytest.raises(SystemExit) as exc:
        main(["attention", "--d-model", "16", "--seq-len", "64", "--device", "cpu", "--csv", str(target)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--csv {target}" in err and what in err and "name a file" in err
    assert S_ISKIND[kind](os.lstat(target).st_mode), "the node was replaced"


# ---------------------------------------------------------------- 2. corrupt or partial cell CSVs: named, never dropped

GRID = {
    "d_model": [16, 32],
    "seq_len": [64, 128, 256, 512, 1024],
    "activation": ["softmax"],
    "impl": ["eager"],
    "causal": [True],
    "precision": ["fp32"],
}
COMMIT = "018351308966"  # all digits, leading zero: about 1 commit in 280 looks like this


def _config() -> dict:
    return validate_config({"run": "bad", "device": "cpu", "studies": ["attention"], "attention": {"grid": GRID}})[0]


def _rows(cid: str, axes: dict) -> pd.DataFrame:
    rows = []
    for phase in ("forward", "backward"):
        rows.append(
            dict(
                study="attention",
                cell_id=cid,
                status="ok",
                error="",
                **axes,
                mode="train",
                phase=phase,
                median_ms=2.0,
                ci_low_ms=1.9,
                ci_high_ms=2.1,
                mean_ms=2.0,
                std_ms=0.1,
                min_ms=1.9,
                max_ms=2.1,
                n=3,
                trials=1,
                device="cpu",
                device_name="cpu (x86_64)",
                torch_version="2.5.1",
                git_commit=COMMIT,
                host="0042",
                pass_index=0,
            )
        )
    return pd.DataFrame(rows)


@pytest.fixture
def cells(tmp_path) -> list[Path]:
    """The ten valid cell CSVs of a ten-cell attention grid, named as the workflow names them."""
    folder = tmp_path / "results" / "bad" / "attention" / "cells"
    paths = []
    for cid, axes in plan.grid("attention", _config(), BUILT_IN).items():
        paths.append(folder / f"{cid}.csv")
        write_csv_atomic(_rows(cid, axes), paths[-1])
    assert len(paths) == 10
    return paths


def _edit(path: Path, **changes) -> None:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    for column, value in changes.items():
        df.loc[len(df) - 1, column] = value
    df.to_csv(path, index=False)


def _drop(path: Path, column: str) -> None:
    pd.read_csv(path, dtype=str, keep_default_na=False).drop(columns=column).to_csv(path, index=False)


def _other_cell(path: Path) -> None:
    other = sorted(p for p in path.parent.glob("*.csv") if p != path)[0]
    path.write_bytes(other.read_bytes())


def _truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 40])  # the last row cut after 40 characters


# name → (damage done to one cell file, words the error must hold besides the path): one case a line, a table
# to scan (hence `fmt: skip` on its last line)
BAD_CELLS = {
    "header-only": (lambda p: p.write_text(p.read_text().splitlines()[0] + "\n"), ["no rows"]),
    "empty-file": (lambda p: p.write_text(""), ["empty"]),
    "binary-garbage": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe garbage"), ["not UTF-8 text"]),
    "text-garbage": (lambda p: p.write_text("hello world\nthis is not a cell\n"), ["missing column", "'status'"]),
    "no-status-column": (lambda p: _drop(p, "status"), ["missing column", "'status'"]),
    "no-cell-id-column": (lambda p: _drop(p, "cell_id"), ["missing column", "'cell_id'"]),
    "no-axis-column": (lambda p: _drop(p, "seq_len"), ["missing column", "'seq_len'"]),
    "unknown-status": (lambda p: _edit(p, status="done"), ["status 'done'", "ok, oom, error, timeout, skipped"]),
    "empty-status": (lambda p: _edit(p, status=""), ["status ''", "ok, oom, error, timeout, skipped"]),
    "another-cells-file": (_other_cell, ["cell_id", "seq_len=128"]),
    "axis-disagrees": (lambda p: _edit(p, seq_len="999"), ["seq_len=999"]),
    "empty-axis": (lambda p: _edit(p, d_model=""), ["d_model="]),
    "wrong-study": (lambda p: _edit(p, study="mha"), ["study 'mha'", "'attention'"]),
    "truncated-row": (_truncate, ["row 2", "fields"]),
    "junk-row-appended": (lambda p: p.write_text(p.read_text() + "garbage\n"), ["row 3", "fields"]),
    # rows that read well but cannot be right: a duplicated timed row would fold as a second pass
    "duplicated-row": (lambda p: p.write_text(p.read_text() + p.read_text().splitlines()[-1] + "\n"),
                       ["rows 2, 3", "phase backward", "duplicated row"]),
    "negative-median": (lambda p: _edit(p, median_ms="-2.0"), ["row 2", "median_ms -2.0", "above zero"]),
    "zero-median": (lambda p: _edit(p, median_ms="0"), ["median_ms 0", "above zero"]),
    "nan-median": (lambda p: _edit(p, median_ms="nan"), ["row 2", "no median_ms"]),
    "inf-median": (lambda p: _edit(p, median_ms="inf"), ["median_ms inf"]),
    "text-median": (lambda p: _edit(p, median_ms="fast"), ["median_ms 'fast'"]),
    "upside-down-interval": (lambda p: _edit(p, ci_low_ms="2.1", ci_high_ms="1.9"), ["does not hold", "[2.1, 1.9]"]),
    "infinite-bound": (lambda p: _edit(p, ci_high_ms="inf"), ["not finite"]),
    "one-bound-missing": (lambda p: _edit(p, ci_high_ms=""), ["no interval"]),
    "two-passes-in-one-file": (lambda p: _edit(p, pass_index="1"), ["rows of passes 0, 1", "one pass"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_CELLS))
def test_a_bad_cell_csv_stops_the_merge_naming_the_file_and_what_is_wrong(cells, case):
    damage, words = BAD_CELLS[case]
    bad = cells[1]  # d_model=16, seq_len=128
    damage(bad)
    with pytest.raises(ValueError) as exc:
        merge_cells(cells, "attention")
    message = str(exc.value)
    assert str(bad) in message, message
    for word in words:
        assert word in message, f"{word!r} not in: {message}"
    assert "delete" in message and "rerun" in message, message  # how to measure the cell again
    assert str(cells[0]) not in message, "a good file was named"


def test_every_bad_file_is_named_at_once(cells):
    cells[3].write_text("")
    cells[7].write_text(cells[7].read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError) as exc:
        merge_cells(cells, "attention")
    assert str(cells[3]) in str(exc.value) and str(cells[7]) in str(exc.value)


def test_a_pass_recorded_twice_stops_the_merge_naming_both_files(cells):
    """Pass 1's file a copy of pass 0's (pass_index 0 in both): folded, it would be a second pass of one cell."""
    copy = cells[0].parent / S.pass_dir(1) / cells[0].name
    copy.parent.mkdir()
    copy.write_bytes(cells[0].read_bytes())
    with pytest.raises(ValueError) as exc:
        merge_cells([*cells, copy], "attention")
    assert str(copy) in str(exc.value) and str(cells[0]) in str(exc.value) and "pass 0" in str(exc.value)


def test_a_cell_csvs_one_step_interval_and_a_noisy_low_bound_still_merge(cells):
    """As measured, one step gives no interval and a very noisy cell's low bound may fall below zero (measure.stats)."""
    _edit(cells[0], ci_low_ms="", ci_high_ms="")
    _edit(cells[1], ci_low_ms="-0.5")
    merged = merge_cells(cells, "attention")
    assert len(merged) == 20 and (merged["ci_low_ms"] >= 0).all() and merged["ci_high_ms"].notna().all()


def test_the_good_cells_still_merge_one_row_per_cell_and_phase(cells):
    merged = merge_cells(cells, "attention")
    assert merged["cell_id"].nunique() == 10 and len(merged) == 20
    assert set(merged["status"]) == {"ok"}


# runs workflow/scripts/merge.py as Snakemake does: in its own process, with a `snakemake` object
MERGE_JOB = """
import json, runpy, sys
from types import SimpleNamespace as N
job = json.loads(sys.argv[1])
snakemake = N(scriptdir=job["scriptdir"], input=job["input"], output=job["output"], log=job["log"],
              wildcards=N(study="attention"), params=N(peak_tflops={}, peak_gbps={}, flags={}, floor_rel=0.0))
runpy.run_path(job["scriptdir"] + "/merge.py", init_globals={"snakemake": snakemake})
"""


@pytest.mark.slow
def test_the_workflows_merge_job_fails_naming_the_bad_cell_and_writes_nothing(cells, tmp_path):
    cells[4].write_text(cells[4].read_text().splitlines()[0] + "\n")  # header only: the cell that vanished
    out, log = tmp_path / "results" / "bad" / "attention.csv", tmp_path / "logs" / "merge.log"
    job = {"scriptdir": str(REPO / "workflow" / "scripts"), "input": [str(p) for p in cells], "output": [str(out)], "log": [str(log)]}
    proc = subprocess.run([sys.executable, "-c", MERGE_JOB, json.dumps(job)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]
    assert str(cells[4]) in proc.stderr and "no rows" in proc.stderr  # where Snakemake shows a failed script
    assert str(cells[4]) in log.read_text() and "no rows" in log.read_text()  # and in the job's log


# ---------------------------------------------------------------- 3. text columns stay text through merge and reload


def test_an_all_digit_commit_keeps_its_leading_zero_through_merge_reload_and_compare(cells, tmp_path):
    merged = merge_cells(cells, "attention")
    assert set(merged["git_commit"]) == {COMMIT} and set(merged["host"]) == {"0042"}
    run = tmp_path / "results" / "bad"
    write_csv_atomic(merged, run / "attention.csv")
    loaded = load_study(run / "attention.csv", "attention")
    assert set(loaded["git_commit"]) == {COMMIT} and set(loaded["host"]) == {"0042"}
    assert set(loaded["torch_version"]) == {"2.5.1"}
    assert loaded["d_model"].dtype.kind == "i", "axes keep their numbers"
    compared = load_run(run)["attention"]
    assert set(compared["git_commit"]) == {COMMIT} and set(compared["host"]) == {"0042"}
