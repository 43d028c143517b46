"""A run's rows are replaced only by rows as good, or when the user asks; and what a run prints reproduces it.

a. A cell job whose new rows are worse (skipped, error, timeout where its earlier CSV held ``ok`` rows)
   writes nothing and fails, naming the file and the opt-in (``--config overwrite=true``); a run
   name whose snapshot (results/<run>/config.yaml) says another device path is refused at parse time.
b. The HTML command printed at the end of a run reproduces its settings: every ``--configfile`` once,
   in order, and every ``--config`` override.
c. Every hint the CLI prints names a flag that its study accepts.
d. ``--rerun-triggers`` without ``params`` (which carries the cells' code hashes) is warned about at
   parse time.
"""

from __future__ import annotations

import copy
import csv
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN
from cs336sys.cli import build_parser, result_tables
from cs336sys.pipeline import cells, plan, warm
from cs336sys.pipeline import config as C
from cs336sys.pipeline.config import ConfigError, validate_config
from cs336sys.pipeline.finish import finished_message, run_command
from workflow_helpers import DEMO, REPO, copy_repo, load_config, snakemake

# ---------------------------------------------------------------- a. no row replaced by a worse one unless asked

CELL = {"study": "unit", "cell_id": "x=1", "axes": {"x": 1}, "target": "unit:measure", "device": "cuda"}
OK_ROWS = [
    {"study": "unit", "cell_id": "x=1", "x": 1, "mode": mode, "status": "ok", "error": "", "median_ms": 1.5}
    for mode in ("inference", "train")
]
SKIPPED = [{"study": "unit", "cell_id": "x=1", "x": 1, "mode": "", "status": "skipped", "error": "CUDA is not available on this machine"}]
ERROR = [{**OK_ROWS[0]}, {"study": "unit", "cell_id": "x=1", "x": 1, "mode": "train", "status": "timeout", "error": "cell exceeded"}]
OOM = [{"study": "unit", "cell_id": "x=1", "x": 1, "mode": "inference", "status": "oom", "error": "CUDA out of memory"}]


@pytest.fixture
def job(tmp_path, monkeypatch):
    """``job(rows, **kw)``: one cell job as the workflow's script runs it (in this process), measuring ``rows``."""
    out, log = tmp_path / "results" / "r" / "unit" / "cells" / "x=1.csv", tmp_path / "logs" / "x=1.log"

    def run(rows, **kwargs):
        monkeypatch.setattr(cells, "run_cell", lambda cell, **_: [dict(r) for r in rows])
        return warm.run_job(CELL, 60.0, str(out), str(log), warm=False, **kwargs)

    run.out = out
    return run


def _statuses(path: Path) -> list[str]:
    with open(path, newline="") as f:
        return [row["status"] for row in csv.DictReader(f)]


@pytest.mark.parametrize("worse", [SKIPPED, ERROR], ids=["skipped", "ok+timeout"])
def test_a_worse_status_never_replaces_ok_rows_unless_asked(job, worse):
    job(OK_ROWS)
    before = job.out.read_bytes()
    with pytest.raises(Exception) as info:  # the file is still there (snakemake's update, the CLI)
        job(worse)
    message = str(info.value)
    for text in (str(job.out), "2 ok rows", worse[-1]["status"], "overwrite=true", "--config run="):
        assert text in message, (text, message)
    assert job.out.read_bytes() == before
    # Snakemake removes a job's output before the job runs: the earlier rows are still found, and kept
    job.out.unlink()
    with pytest.raises(Exception, match="overwrite=true"):
        job(worse)
    assert not job.out.exists()
    job(worse, replace=True)  # asked for: replaced
    assert _statuses(job.out) == [r["status"] for r in worse]


def test_rows_as_good_or_measured_failures_replace_the_earlier_rows(job):
    job(OK_ROWS)
    job.out.unlink()
    job(OK_ROWS[:1] + [{**OK_ROWS[1], "median_ms": 9.0}])  # ok again: replaced
    job(OOM)  # out of memory is a measurement of today's code, not a worse status
    assert _statuses(job.out) == ["oom"]
    job(SKIPPED)  # nothing ok to protect any more
    assert _statuses(job.out) == ["skipped"]


@pytest.mark.parametrize("text", ["", 'not,a\ncsv,"file', "a,b\n1,2\n"], ids=["empty", "malformed", "no-status"])
def test_an_unreadable_earlier_file_holds_no_ok_rows_to_protect(job, text):
    job.out.parent.mkdir(parents=True)
    job.out.write_text(text)
    job(SKIPPED)
    assert _statuses(job.out) == ["skipped"]


# the settings a run's rows depend on: a GPU sweep named like a committed run
def _gpu_config(**changes) -> dict:
    config = load_config(REPO, validated=False)
    config.update(run="h100", **changes)
    return validate_config(config)[0]


def _snapshot(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "results" / config["run"] / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(C.settings_snapshot(config), sort_keys=False))
    return path


def test_a_gpu_run_is_not_remeasured_where_the_local_gpu_check_is_off(tmp_path):
    # the case: `--config run=h100 check_local_cuda=false` on a host whose GPU is missing
    snapshot = _snapshot(tmp_path, _gpu_config())
    changed = _gpu_config(check_local_cuda=False)
    with pytest.raises(ConfigError) as info:
        C.check_run_snapshot(changed, snapshot)
    said = (
        "'check_local_cuda'",
        "check_local_cuda: true",
        "check_local_cuda: false",
        str(snapshot),
        "--config run=h100-2",
        "overwrite=true",
    )
    for text in said:
        assert text in str(info.value), (text, str(info.value))
    C.check_run_snapshot({**copy.deepcopy(changed), "overwrite": True}, snapshot)  # asked for


def test_the_local_gpu_check_of_a_cpu_run_changes_nothing(tmp_path):
    config, _ = validate_config(load_config(REPO, DEMO, validated=False))
    snapshot = _snapshot(tmp_path, config)
    C.check_run_snapshot({**copy.deepcopy(config), "check_local_cuda": True}, snapshot)  # device: cpu never checks


def _one_cell(config: dict, study: str = "attention") -> str:
    cell = next(iter(plan.grid(study, config, BUILT_IN)))
    return f"results/{config['run']}/{study}/cells/{S.pass_dir(0)}{cell}.csv"


@pytest.mark.slow
def test_a_rerun_that_measures_worse_keeps_the_rows_and_fails(tmp_path):
    root = copy_repo(tmp_path / "repo")
    target = _one_cell(load_config(REPO, DEMO))
    first = snakemake(root, "--cores", "1", "--configfile", DEMO, "--", target, timeout=900)
    assert first.returncode == 0, first.describe()
    assert set(_statuses(root / target)) == {"ok"}
    fault = {"CS336SYS_INJECT_FAULT": "error"}
    again = ["--cores", "1", "--configfile", DEMO, "--forcerun", "attention_cell"]
    worse = snakemake(root, *again, "--", target, env=fault, timeout=900)
    assert worse.returncode != 0, worse.describe()
    for text in (target, "ok rows", "error", "overwrite=true"):
        assert text in worse.output, (text, worse.describe())
    asked = snakemake(root, *again, "--config", "overwrite=true", "--", target, env=fault, timeout=900)
    assert asked.returncode == 0, asked.describe()
    assert set(_statuses(root / target)) == {"error"}


@pytest.mark.slow
def test_a_committed_gpu_run_named_again_without_the_gpu_check_stops_before_any_job(tmp_path):
    root = copy_repo(tmp_path / "repo")
    _snapshot(root, _gpu_config())
    r = snakemake(root, "-n", "--config", "run=h100", "check_local_cuda=false", timeout=600)
    assert r.returncode != 0, r.describe()
    for text in ("'check_local_cuda'", "check_local_cuda: true", "check_local_cuda: false", "overwrite=true"):
        assert text in r.output, (text, r.describe())
    assert not (root / "logs" / "h100").exists()


# ---------------------------------------------------------------- b. the printed command reproduces the run


def _as_snakemake_reads_it(command: str) -> tuple[list[str], dict]:
    from snakemake.cli import get_argument_parser, parse_config

    words = shlex.split(command)
    assert words[0] == "snakemake", command
    args = get_argument_parser().parse_args(words[1:])
    return [str(p) for p in args.configfile], parse_config(args.config)


OVERRIDES = {
    "run": "auto",
    "check_local_cuda": False,
    "memory_fraction": 0.5,
    "studies": ["e2e", "attention"],
    "e2e": {"grid": {"size": ["small"], "context_length": ["128"]}, "batch_size": "2"},
    "cache_dir": None,
    "plugins": {"path": "my dir/with 'quotes'"},
}


@pytest.mark.slow  # starts a process
def test_the_html_command_names_every_configfile_once_and_every_override(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = run_command("h100", ["config/full.yaml", Path("config/best.yaml")], OVERRIDES, "--report", "report.html")
    assert command.count("--configfile") == 1, command
    files, config = _as_snakemake_reads_it(command)
    assert files == ["config/full.yaml", "config/best.yaml"]
    assert config == {**OVERRIDES, "run": "h100"}  # the run as resolved: `auto` could name another GPU's run
    (tmp_path / "report" / "h100").mkdir(parents=True)
    (tmp_path / "report" / "h100" / "report.md").write_text("# h100\n")
    text = finished_message(
        "h100", "report/h100/report.md", "report/h100/answers.md", ["a.yaml", "b.yaml"], {"run": "h100", "device": "cpu"}
    )
    assert "--configfile a.yaml b.yaml --config run=h100 device=cpu" in text, text


def test_the_html_command_without_overrides_names_no_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_command("cpu-demo", [DEMO], {}, "--report", "report.html") == f"snakemake --report report.html --configfile {DEMO}"


# ---------------------------------------------------------------- c. the CLI's hints name flags its study takes


def _accepted_flags(study: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "study").choices[study]
    return {option for action in sub._actions for option in action.option_strings}


def _flagged_rows(study: str) -> pd.DataFrame:
    row = {"study": study, "status": "ok", "mode": "train", "phase": "step", "median_ms": 10.0, "ci_low_ms": 5.0, "ci_high_ms": 15.0}
    row |= {"noisy": True, "host_bound": True, "trials": 1, "n": 5}
    return pd.DataFrame([row])


@pytest.mark.parametrize("study", list(S.STUDIES))
def test_every_hint_of_the_cli_names_a_flag_its_study_accepts(study):
    text = result_tables(_flagged_rows(study), study)
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    accepted = _accepted_flags(study)
    assert named <= accepted, f"{study}: the hints name {sorted(named - accepted)}, which `cs336sys {study}` rejects:\n{text}"
    assert "noisy:" in text and "one trial:" in text  # the hints are there, with or without a flag to name


# ---------------------------------------------------------------- d. a rerun trigger that turns content reruns off


def test_rerun_triggers_without_params_are_warned_about():
    from cs336sys.pipeline.code_record import rerun_trigger_warning

    warning = rerun_trigger_warning(["mtime"])
    assert warning and "params" in warning and "--rerun-triggers" in warning and "mtime params" in warning
    assert rerun_trigger_warning(["mtime", "params", "input", "software-env"]) is None
    assert rerun_trigger_warning(["params"]) is None


@pytest.mark.slow
def test_snakemake_warns_at_parse_time_when_params_is_no_rerun_trigger(tmp_path):
    root = copy_repo(tmp_path / "repo")
    r = snakemake(root, "-n", "--configfile", DEMO, "--rerun-triggers", "mtime", timeout=600)
    assert r.returncode == 0, r.describe()
    assert "--rerun-triggers" in r.output and "params" in r.output and "code" in r.output.lower(), r.describe()
    quiet = snakemake(root, "-n", "--configfile", DEMO, timeout=600)
    assert "without `params`" not in quiet.output, quiet.describe()
