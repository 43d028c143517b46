"""The Snakemake workflow through the `snakemake` command, on CPU (tests/workflow_helpers.py does the plumbing).

Every run works in a temporary copy of the repository with cwd = the copy. The full cpu-demo preset
runs at most once per session (the `finished_demo` fixture of conftest.py, shared with the HTML-report
test; the checkout's own demo where it is up to date); the rerun tests share one run of a reduced grid
(`reduced`, 7 cells)
and each inspects a dry run (`snakemake -n`) of its own clone of that finished run; failure
injection (CS336SYS_INJECT_FAULT, see cs336sys.pipeline.cells) uses attention-only grids of one or two cells.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
import torch

from cs336sys.measure.env import environment
from cs336sys.pipeline.config import validate_config
from cs336sys.rows import ENV_COLUMNS, STATUSES
from workflow_helpers import (
    DEMO,
    DEMO_RUN,
    FAULT_ENV,
    IMPORT_LOG_ENV,
    REPO,
    add_import_hook,
    clone_run,
    copy_repo,
    dry_run,
    grid,
    load_config,
    markdown_section,
    once_per_session,
    result_from,
    snakemake,
    write_yaml,
)

# every test here starts snakemake (a run, a dry run or a parse): the full suite, not the fast lane
pytestmark = pytest.mark.slow

# the environment columns every row carries on any device (ENV_COLUMNS adds GPU/host state where there is one)
BASE_ENV = [c for c in ENV_COLUMNS if c in environment(torch.device("cpu"))]

# --- the full cpu-demo preset, once a session ------------------------------------------------------


@pytest.fixture(scope="module")
def demo(finished_demo):
    return finished_demo.root, finished_demo.result, load_config(finished_demo.root, DEMO)


def _require_success(result):
    """The run went well (None: the demo was already finished and up to date, which a dry run checked)."""
    assert result is None or result.returncode == 0, f"the workflow failed:\n{result.describe()}"


def test_cpu_demo_runs_end_to_end(demo):
    root, result, config = demo
    _require_success(result)
    assert config["run"] == DEMO_RUN
    missing = []
    for study in config["studies"]:
        csv = root / "results" / DEMO_RUN / f"{study}.csv"
        figures = sorted((root / "report" / DEMO_RUN / "figures" / study).glob("*.png"))
        if not csv.is_file() or csv.stat().st_size == 0:
            missing.append(f"{csv.relative_to(root)} (merged CSV)")
        if not figures:
            missing.append(f"report/{DEMO_RUN}/figures/{study}/*.png (no figure)")
    assert not missing, "missing outputs:\n  " + "\n  ".join(missing)
    assert (root / "report" / DEMO_RUN / "report.md").is_file()


def test_a_finished_run_says_where_its_report_and_answers_are(demo):
    root, result, _ = demo
    if result is None:
        pytest.skip("the checkout's own demo was up to date: no run here to print anything")
    _require_success(result)
    printed = result.output[result.output.rindex(f"Run `{DEMO_RUN}` finished:") :]
    for path in (f"report/{DEMO_RUN}/report.md", f"report/{DEMO_RUN}/answers.md", f"results/{DEMO_RUN}/<study>.csv"):
        assert path in printed, printed
    assert f"snakemake --report report.html --configfile {DEMO}" in printed, printed


def test_the_demos_report_says_its_cpu_numbers_only_exercise_the_pipeline(demo):
    root, _, _ = demo
    head = (root / "report" / DEMO_RUN / "report.md").read_text().split("## Environment")[0]
    assert "CPU numbers only exercise the pipeline" in head


def test_cpu_demo_merged_csvs_keep_every_cell_status_and_environment(demo):
    root, _, config = demo
    for study in config["studies"]:
        df = pd.read_csv(root / "results" / DEMO_RUN / f"{study}.csv")
        missing = [c for c in ["study", "cell_id", "status", "error", *BASE_ENV] if c not in df.columns]
        assert not missing, f"{study}.csv lacks columns {missing}"
        assert set(df["cell_id"]) == set(grid(config, study)), f"{study}.csv does not hold exactly the grid's cells"
        assert set(df["status"]) <= set(STATUSES), f"{study}.csv: unknown statuses {set(df['status']) - set(STATUSES)}"
        broken = df[df["status"].isin(["error", "timeout"])]
        assert broken.empty, f"{study}: cells failed in the CPU demo:\n{broken[['cell_id', 'status', 'error']].to_string()}"


def test_cpu_demo_report_has_a_section_per_study(demo):
    root, _, config = demo
    text = (root / "report" / DEMO_RUN / "report.md").read_text()
    for study in config["studies"]:
        assert f"## Study `{study}`" in text, f"report.md has no section for {study}"


def test_cpu_demo_html_report(demo, tmp_path):
    root, result, _ = demo
    _require_success(result)
    html = tmp_path / "report.html"
    r = snakemake(root, "--report", str(html), "--nolock", "--configfile", DEMO)
    assert r.returncode == 0, r.describe()
    assert html.is_file() and html.stat().st_size > 1000, r.describe()
    assert "<html" in html.read_text(errors="replace")[:5000].lower()


def test_cpu_demo_second_invocation_runs_nothing(demo):
    root, result, _ = demo
    _require_success(result)
    again = dry_run(root, DEMO, extra=("--nolock",))
    assert again.nothing_to_do, again.describe()


# --- a reduced grid for the rerun tests ----------------------------------------------------------

REDUCED_FILE = "config/test-reduced.yaml"
REDUCED_STUDIES = ["e2e", "warmup", "attention", "mha", "flash"]
ATTENTION_GRID = {
    "d_model": [16],
    "seq_len": [64],
    "activation": ["softmax", "relu"],
    "impl": ["eager"],
    "causal": [True],
    "precision": ["fp32"],
}
MHA_GRID = {
    "embed_dim": [32],
    "num_heads": [4],
    "seq_len": [64],
    "variant": ["exact-eager", "performer"],
    "kernel": ["relu"],
    "num_features": [16],
}
REDUCED = {  # over config/cpu-demo.yaml: 1-2 cells per study, mha with an exact and a performer cell
    "studies": REDUCED_STUDIES,
    "e2e": {"grid": {"size": ["tiny"], "context_length": [32], "precision": ["fp32"], "impl": ["eager"], "compile": [False]}},
    "warmup": {"grid": {"warmup_steps": [0]}},
    "attention": {"grid": ATTENTION_GRID},
    "mha": {"grid": MHA_GRID},
    "flash": {"grid": {"seq_len": [64], "head_dim": [16], "precision": ["fp32"], "impl": ["eager"]}, "leaderboard": None},
}


@pytest.fixture(scope="session")  # once for every worker (read only: a test edits a clone, `rerun`)
def reduced(tmp_path_factory):
    def build(folder: Path) -> str:
        root = copy_repo(folder / "repo")
        write_yaml(root / REDUCED_FILE, REDUCED)
        result = snakemake(root, "--configfile", DEMO, REDUCED_FILE)
        assert result.returncode == 0, f"the reduced workflow failed:\n{result.describe()}"
        return str(root)

    return Path(once_per_session(tmp_path_factory, "reduced", build))


@pytest.fixture
def rerun(reduced, tmp_path):
    """A private clone of the finished reduced run, to edit and dry-run."""
    return clone_run(reduced, tmp_path / "repo")


def _cells(root: Path, predicate=lambda study, axes: True) -> set[tuple[str, str]]:
    """(rule, cell id) of every job of every pass: rule <study>_cell for pass 0, <study>_pass<k> after."""
    config, _ = validate_config(load_config(root, DEMO, REDUCED_FILE))  # with the schema's defaults: warmup has 2 passes
    rules = {s: [f"{s}_cell"] + [f"{s}_pass{k}" for k in range(1, config[s].get("passes", 1))] for s in config["studies"]}
    return {(r, cid) for s in config["studies"] for cid, axes in grid(config, s).items() if predicate(s, axes) for r in rules[s]}


def test_rerun_nothing_on_second_invocation(rerun):
    run = dry_run(rerun, DEMO, REDUCED_FILE)
    assert run.nothing_to_do, run.describe()
    assert "code changed" not in run.result.output, run.describe()


def test_rerun_touching_sources_reruns_nothing(rerun):
    now = time.time() + 5
    touched = [rerun / "Snakefile", *(rerun / "workflow" / "rules").glob("*.smk")]
    for folder in (rerun / "src", rerun / "workflow" / "scripts"):
        touched += [p for p in folder.rglob("*") if p.is_file()]
    for path in touched:
        os.utime(path, (now, now))
    run = dry_run(rerun, DEMO, REDUCED_FILE)
    assert run.nothing_to_do, run.describe()


def test_rerun_after_editing_attention_py(rerun):
    with open(rerun / "src" / "cs336sys" / "models" / "attention.py", "a") as f:
        f.write("\n# edited by tests/test_workflow.py\n")
    run = dry_run(rerun, DEMO, REDUCED_FILE)

    performer = _cells(rerun, lambda s, axes: s == "mha" and axes["variant"] == "performer")
    expected = _cells(rerun) - performer  # e2e, warmup, attention, flash and the exact mha cells all run models/attention.py
    assert performer, "the reduced grid should hold mha performer cells"
    assert {r for r, _ in expected} >= {"e2e_cell", "warmup_cell", "attention_cell", "mha_cell"}
    assert run.cells() == expected, (
        f"unexpected cells: {sorted(run.cells() - expected)}\nmissing cells: {sorted(expected - run.cells())}\n{run.describe()}"
    )
    assert not run.cells() & performer
    for job in run.jobs:
        if re.search(r"_(cell|pass\d+)$", job.rule):
            assert "params" in job.reason.lower(), f"{job.rule} {job.wildcards} reran for another reason: {job.reason}"
    # the reason names the edited file, with how many cell jobs it reruns
    assert "code changed since these cells were measured: models/attention.py → " in run.result.output, run.describe()
    assert run.studies("merge") == set(REDUCED_STUDIES), run.describe()
    assert run.studies("plots") == set(REDUCED_STUDIES), run.describe()
    assert run.counts()["report"] == 1 and run.counts()["all"] == 1, run.describe()


def test_rerun_after_editing_the_triton_kernels_reruns_no_cell_without_triton(rerun):
    """No cell of the reduced grid selects impl=triton: an edit to the kernels must rerun nothing."""
    with open(rerun / "src" / "cs336sys" / "models" / "triton_attention.py", "a") as f:
        f.write("\n# edited by tests/test_workflow.py\n")
    assert not _cells(rerun, lambda s, axes: axes.get("impl") == "triton")
    run = dry_run(rerun, DEMO, REDUCED_FILE)
    assert run.nothing_to_do, run.describe()


def test_rerun_after_editing_a_study_report_reruns_no_cell_and_no_merge(rerun):
    with open(rerun / "src" / "cs336sys" / "studies" / "mha" / "report.py", "a") as f:
        f.write("\n# edited by tests/test_workflow.py\n")
    run = dry_run(rerun, DEMO, REDUCED_FILE)
    assert not run.cells(), run.describe()
    # answers.md reads every study's findings, so it follows any report module
    assert run.rules() <= {"plots", "report", "answers", "report_html", "all"} and run.studies("plots") == {"mha"}, run.describe()
    assert run.counts()["report"] == 1, run.describe()


def test_rerun_after_editing_plot_script_reruns_only_plots_and_report(rerun):
    with open(rerun / "workflow" / "scripts" / "plot.py", "a") as f:
        f.write("\n# edited by tests/test_workflow.py\n")
    run = dry_run(rerun, DEMO, REDUCED_FILE)
    assert run.rules() == {"plots", "report", "report_html", "all"}, run.describe()
    assert run.studies("plots") == set(REDUCED_STUDIES), run.describe()
    assert not run.cells(), run.describe()


def test_rerun_after_changing_time_limits_and_resources_runs_nothing(rerun):
    """timeout_s and resources are job resources, not cell params: changing them reruns no cell and no merge.

    The run's snapshot leaves job limits out, so its report does not rerun either.
    """
    attention = {**REDUCED["attention"], "timeout_s": 77, "resources": {"runtime_min": 7, "mem_mb": 1234}}
    changed = {**REDUCED, "attention": attention, "e2e": {**REDUCED["e2e"], "timeout_s": 99}}
    write_yaml(rerun / REDUCED_FILE, changed)
    run = dry_run(rerun, DEMO, REDUCED_FILE)
    assert not run.cells(), run.describe()
    assert run.rules() <= {"all"}, run.describe()


def test_rerun_after_adding_a_grid_value_runs_only_the_new_cells(rerun):
    before = _cells(rerun)
    bigger = {**REDUCED, "attention": {"grid": {**REDUCED["attention"]["grid"], "seq_len": [64, 128]}}}
    write_yaml(rerun / REDUCED_FILE, bigger)
    new = _cells(rerun) - before
    assert new and {r for r, _ in new} == {"attention_cell"}

    run = dry_run(rerun, DEMO, REDUCED_FILE)
    assert run.cells() == new, f"expected only the new cells {sorted(new)}\n{run.describe()}"
    # the grid is part of the run's settings: its snapshot, report and answers follow
    assert run.rules() == {"attention_cell", "merge", "plots", "snapshot", "report", "answers", "report_html", "all"}, run.describe()
    assert run.studies("merge") == {"attention"} and run.studies("plots") == {"attention"}, run.describe()


def test_rerun_after_adding_a_pass_runs_only_the_new_pass(rerun):
    config = load_config(rerun, DEMO, REDUCED_FILE)
    passes = config["e2e"]["passes"]
    assert passes >= 2, "the demo's e2e should measure in passes"
    write_yaml(rerun / REDUCED_FILE, {**REDUCED, "e2e": {**REDUCED.get("e2e", {}), "passes": passes + 1}})
    run = dry_run(rerun, DEMO, REDUCED_FILE)
    new = {(f"e2e_pass{passes}", cid) for cid in grid(config, "e2e")}
    assert run.cells() == new, f"expected only pass {passes} of e2e\n{run.describe()}"
    assert run.studies("merge") == {"e2e"}, run.describe()


# --- failures become data ------------------------------------------------------------------------

FAULT_FILE = "config/test-fault.yaml"
ATTENTION_ONLY = {"studies": ["attention"], "attention": {"grid": ATTENTION_GRID}}


def _fault_run(tmp_path_factory, name: str, fault: str, override: dict, import_log: bool = False):
    return _fault_run_in(tmp_path_factory.mktemp(name), fault, override, import_log)


def _fault_run_in(folder: Path, fault: str, override: dict, import_log: bool = False):
    root = copy_repo(folder / "repo")
    write_yaml(root / FAULT_FILE, override)
    env = {FAULT_ENV: fault}
    if import_log:
        add_import_hook(root)
        env[IMPORT_LOG_ENV] = str(root.parent / "imports.log")
    result = snakemake(root, "--configfile", DEMO, FAULT_FILE, env=env)
    return root, result


def _merged(root: Path, study: str) -> pd.DataFrame:
    df = pd.read_csv(root / "results" / DEMO_RUN / f"{study}.csv")
    df["error"] = df["error"].fillna("")
    return df


def _failure_lines(root: Path) -> list[str]:
    text = (root / "report" / DEMO_RUN / "report.md").read_text()
    section = markdown_section(text, "Failed")
    assert section, "report.md has no 'Failed …' section"
    return section.splitlines()


@pytest.fixture(scope="session")  # as `reduced`
def oom_run(tmp_path_factory):
    def build(folder: Path) -> dict:
        root, result = _fault_run_in(folder, "oom:activation=relu", ATTENTION_ONLY, import_log=True)
        return {"root": str(root), "result": asdict(result)}

    shared = once_per_session(tmp_path_factory, "oom", build)
    return Path(shared["root"]), result_from(shared["result"])


def test_injected_oom_is_a_row_and_the_workflow_finishes(oom_run):
    root, result = oom_run
    _require_success(result)
    df = _merged(root, "attention")
    relu, softmax = df[df["cell_id"].str.contains("activation=relu")], df[df["cell_id"].str.contains("activation=softmax")]
    assert not relu.empty and set(relu["status"]) == {"oom"}, df[["cell_id", "status", "error"]].to_string()
    assert relu["error"].str.contains("out of memory", case=False).all()
    assert not softmax.empty and set(softmax["status"]) == {"ok"}, df[["cell_id", "status", "error"]].to_string()
    assert BASE_ENV and all(c in df.columns for c in BASE_ENV)

    (cell,) = set(relu["cell_id"])
    lines = _failure_lines(root)
    assert any(cell in line and "oom" in line for line in lines), "\n".join(lines)
    assert not any(softmax["cell_id"].iloc[0] in line for line in lines)


def test_jobs_import_the_checkouts_own_library(oom_run):
    """Job scripts must import the copy's src/, not an installed cs336sys: the code hashes are of the copy."""
    root, result = oom_run
    _require_success(result)
    log = root.parent / "imports.log"
    lines = log.read_text().splitlines() if log.exists() else []
    paths = {line.split(" ", 1)[1] for line in lines}
    own = root / "src" / "cs336sys" / "__init__.py"
    assert paths <= {str(own)}, f"processes imported another cs336sys: {paths - {str(own)}}"
    # the Snakefile's parse, plus one import per script job: 2 cells, merge, plots, report
    assert len({line.split(" ", 1)[0] for line in lines}) >= 1 + 5, (
        f"only {len(lines)} processes imported {own}; the job scripts imported a cs336sys from elsewhere "
        "(workflow/scripts/*.py put Path(snakemake.scriptdir).parents[1] / 'src' on sys.path)"
    )


def test_injected_abort_is_an_error_row_naming_sigabrt(tmp_path_factory):
    root, result = _fault_run(tmp_path_factory, "abort", "abort:activation=relu", ATTENTION_ONLY)
    _require_success(result)
    df = _merged(root, "attention")
    relu = df[df["cell_id"].str.contains("activation=relu")]
    assert not relu.empty and set(relu["status"]) == {"error"}, df[["cell_id", "status", "error"]].to_string()
    assert relu["error"].str.contains("SIGABRT").all(), relu["error"].tolist()
    assert set(df.loc[df["cell_id"].str.contains("activation=softmax"), "status"]) == {"ok"}
    (cell,) = set(relu["cell_id"])
    assert any(cell in line and "error" in line for line in _failure_lines(root))


def test_a_study_whose_every_cell_failed_is_still_merged_plotted_and_reported(tmp_path_factory):
    """On a small GPU every cell of a study can run out of memory; the workflow must still finish."""
    override = {
        "studies": ["e2e", "attention"],
        "e2e": {"grid": {"size": ["tiny"], "context_length": [32], "precision": ["fp32"], "impl": ["eager"], "compile": [False]}},
        "attention": {"grid": {**ATTENTION_ONLY["attention"]["grid"], "activation": ["softmax"]}},
    }
    root, result = _fault_run(tmp_path_factory, "allfail", "oom:precision=fp32", override)  # matches every cell
    _require_success(result)
    text = (root / "report" / DEMO_RUN / "report.md").read_text()
    lines = _failure_lines(root)
    for study in override["studies"]:
        df = _merged(root, study)
        assert not df.empty and set(df["status"]) == {"oom"}, df[["cell_id", "status", "error"]].to_string()
        assert (root / "report" / DEMO_RUN / "figures" / study).is_dir()
        assert f"## Study `{study}`" in text
        for cell in set(df["cell_id"]):
            assert any(cell in line and "oom" in line for line in lines), f"{cell} not in the failure list"


# --- parse-time checks (a snakemake process each, no job) --------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the default GPU config is valid here")
def test_default_config_without_cuda_points_to_the_cpu_demo(tmp_path):
    """A real run of the GPU sweep stops before any job and names the demo; a dry run works without CUDA."""
    root = copy_repo(tmp_path / "repo")
    r = snakemake(root, "--cores", "1", timeout=600)
    assert r.returncode != 0, r.describe()
    assert "--configfile config/cpu-demo.yaml" in r.output, r.describe()
    assert not (root / "results").exists()
    dry = snakemake(root, "-n", "--config", "run=h100", timeout=600)
    assert dry.returncode == 0, dry.describe()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the default GPU config is valid here")
def test_report_without_a_configfile_and_without_a_gpu_points_to_the_demos_report(tmp_path):
    root = copy_repo(tmp_path / "repo")
    r = snakemake(root, "--report", "report.html", timeout=600)
    assert r.returncode != 0, r.describe()
    assert "this machine has no GPU" in r.output and "snakemake --report report.html --configfile config/cpu-demo.yaml" in r.output, (
        r.describe()
    )
    assert "report/cpu/report.md" in r.output and "Traceback" not in r.output, r.describe()
    # a comparison's report names its target: not this run's, so no such message
    other = snakemake(root, "report/compare/a-vs-b/report.md", "--report", "compare.html", timeout=600)
    assert "There is no run to package" not in other.output, other.describe()


# Lint categories we accept, each with the reason; any other category fails the test.
ACCEPTED_LINTS = {
    # cells must run in the user's own CUDA/torch build (DESIGN: users bring their own CUDA build);
    # a conda env or container per rule would pin one.
    "Specify a conda environment or container for each rule.",
}


def test_snakemake_lint(tmp_path):
    root = copy_repo(tmp_path / "repo")
    r = snakemake(root, "--lint", "--configfile", DEMO, timeout=600)
    assert "Traceback" not in r.output and "WorkflowError" not in r.output, r.describe()
    findings: dict[str, list[str]] = {}
    where = "?"
    for line in r.output.splitlines():
        m = re.match(r"^Lints for (.+?)(?: \(line.*)?:$", line)
        if m:
            where = m.group(1)
            continue
        m = re.match(r"^\s+\* (.+?):?$", line)
        if m:
            findings.setdefault(m.group(1).rstrip(":"), []).append(where)
    print("snakemake --lint findings:", *(f"  {k}: {v}" for k, v in findings.items()), sep="\n")
    assert r.returncode in (0, 1), r.describe()
    assert r.returncode == 0 or findings, f"lint failed without findings:\n{r.describe()}"
    assert "Mixed rules and functions" not in r.output
    unexpected = {k: v for k, v in findings.items() if k not in ACCEPTED_LINTS}
    assert not unexpected, f"new lint findings: {unexpected}\n{r.describe()}"


def test_nsys_reports_are_jobs_only_when_asked_for_and_nsys_exists(tmp_path):
    """profile.nsys adds one .nsys-rep job per profile cell; without nsys on PATH it stops at parse time."""
    root = copy_repo(tmp_path / "repo")
    override = write_yaml(root / "nsys.yaml", {"studies": ["profile"], "profile": {"nsys": True}})
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nsys").write_text("#!/bin/sh\nexit 0\n")
    (fake / "nsys").chmod(0o755)
    with_nsys = {"PATH": f"{fake}:{os.environ['PATH']}"}
    run = dry_run(root, "config/cpu-demo.yaml", override, env=with_nsys)
    counts = dict(run.counts())
    assert counts.get("profile_nsys") == counts.get("profile_cell") == 1, run.describe()

    without = {"PATH": ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "nsys").exists())}
    r = snakemake(root, "-n", "--configfile", "config/cpu-demo.yaml", override, env=without)
    assert r.returncode != 0 and "nsys" in r.output, r.describe()

    plain = dry_run(root, "config/cpu-demo.yaml", env=with_nsys)
    assert "profile_nsys" not in dict(plain.counts()), plain.describe()


@pytest.mark.parametrize(
    ("extra", "cell_threads"), [(("--cores", "4"), 4), (("--cores", "8", "--resources", "gpu=2"), 4), (("--cores", "1"), 1)]
)
def test_a_cell_holds_its_gpus_share_of_the_cores(extra, cell_threads):
    # one GPU: a cell holds every core, so no merge or figure runs beside a measurement; the
    # post-processing jobs (one core each) run side by side once no cell is left
    run = dry_run(REPO, DEMO, extra=(*extra, "--config", "run=threads-check"))
    threads = {j.rule: int(j.fields.get("threads", "1")) for j in run.jobs}
    assert {t for r, t in threads.items() if r.endswith("_cell")} == {cell_threads}, run.describe()
    assert {t for r, t in threads.items() if not r.endswith("_cell") and "_pass" not in r} == {1}, run.describe()
