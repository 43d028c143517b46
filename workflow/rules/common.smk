# Validation, cell lists, paths and code hashes: everything the rules need, built once.
import glob
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))  # this checkout's library, installed or not

from snakemake import __version__ as SNAKEMAKE_VERSION
from snakemake.exceptions import WorkflowError

from cs336sys import studies as S
from cs336sys.cli import command_line
from cs336sys.pipeline.faults import FAULT_ENV, check_fault_spec
from cs336sys.pipeline.eta import write_plan
from cs336sys.pipeline.gpulock import visible_gpus
from cs336sys.pipeline.jobs import cell_threads
from cs336sys.pipeline.priorities import callable_priorities, expected_seconds, job_priorities
from cs336sys.pipeline.config import ConfigError, check_run_snapshot, settings_snapshot, validate_config
from cs336sys.pipeline.config import SCHEMA_PATH  # package data, with studies/*/schema.yaml
from cs336sys.pipeline.config_file import check_layer, load_config_file
from cs336sys.pipeline import plan
from cs336sys.provenance import file_hash, modules_hash, module_closure
from cs336sys.pipeline.code_record import (
    cell_file_hashes,
    invocation_triggers,
    record_path,
    rerun_notes,
    rerun_trigger_warning,
)

try:
    # Snakemake has merged these already, keeping the last of two equal keys and reading YAML 1.1
    # (01024 as 532) silently: read each again as the CLI reads --config, with the same limits
    for _file in workflow.configfiles:
        load_config_file(_file)
    check_layer(dict(workflow.config_settings.config), "--config")  # `--config e2e=` is an empty block too
    # the main invocation imports the user's plug-ins once (in a subprocess: no torch here); each job's parse trusts it.
    # OFFERED: the implementations this config offers, its plug-ins included (what plans its cells asks it)
    _, OFFERED = validate_config(
        config,
        SCHEMA_PATH,
        check_imports="" if workflow.remote_exec or workflow.subprocess_exec else "subprocess",
    )
    check_fault_spec(os.environ.get(FAULT_ENV, ""))
except (ConfigError, ValueError) as exc:
    raise WorkflowError(str(exc)) from None


# Checked when jobs are about to run (onstart), not at parse time, so that -n, --lint and --report
# work on a machine without CUDA. NVML or nvidia-smi, not torch: the workflow must not import it.
def check_local_cuda():
    if config["device"] == "cuda" and config["check_local_cuda"] and not visible_gpus():
        raise WorkflowError(
            "No CUDA device on this machine, and this config (device: cuda) is a GPU sweep.\n"
            "Run the CPU demo instead, which runs the same pipeline with tiny shapes:\n"
            "    snakemake --configfile config/cpu-demo.yaml      (./run snakemake picks it by itself)\n"
            "(On a cluster login node without a GPU, the SLURM profile sets check_local_cuda: false.)"
        )


def measures_cells() -> bool:
    """Whether this invocation runs a cell job: a compare, a report or a merge alone needs no GPU."""
    return any(job.rule.name in CELL_RULES for job in workflow.dag.needrun_jobs())


def write_sweep_plan():
    """The cell jobs this invocation runs, for the estimate of the time left that the jobs print (pipeline.eta)."""
    cells = [
        (CELL_RULES[job.rule.name], job.output[0], S.study(CELL_RULES[job.rule.name]).estimate_s)
        for job in workflow.dag.needrun_jobs()
        if job.rule.name in CELL_RULES
    ]
    write_plan(sweep_plan(), cells, _limit["gpu"] if isinstance(_limit["gpu"], int) else 1)


onstart:
    if measures_cells():
        check_local_cuda()
        write_sweep_plan()


RUN = config["run"]
STUDIES = list(config["studies"])
GRIDS = {study: plan.grid(study, config, OFFERED) for study in STUDIES}
MAX_PASSES = max(config[s].get("passes", 1) for s in STUDIES)
CELL_RULES = {  # rule name → study
    f"{study}_cell" if k == 0 else f"{study}_pass{k}": study for study in STUDIES for k in range(MAX_PASSES)
}


_limit = {
    name: getattr(workflow.global_resources.get(name), "value", workflow.global_resources.get(name))
    for name in ("_cores", "gpu")
}
CELL_THREADS = cell_threads(_limit["_cores"], _limit["gpu"], workflow.local_exec)  # pipeline.jobs
SCRIPTS = Path(workflow.basedir) / "workflow/scripts"
SCRIPT_HASH = {p.name: file_hash(p) for p in SCRIPTS.glob("*.py")}
# merge, figures and report hash the modules they import (report modules of the studies run)
_REPORTS = [S.study(s).report_module for s in STUDIES]
MERGE_CODE = modules_hash(module_closure(["cs336sys.pipeline.merge"]))
# each study's figures hash its own report module: editing one study's figures replots only it
PLOT_CODE = {
    s: modules_hash(module_closure(["cs336sys.runs.figures", S.study(s).report_module])) for s in STUDIES
}
REPORT_CODE = modules_hash(module_closure(["cs336sys.runs.report", *_REPORTS]))


wildcard_constraints:
    study="|".join(STUDIES),
    cell=r"[^/]+",


localrules:
    all,
    snapshot,
    merge,
    plots,
    report,


# --- paths (the only place they are spelled) ---------------------------------------------------
def cell_csv(study, k=0):
    return f"results/{RUN}/{study}/cells/{S.pass_dir(k)}{{cell}}.csv"


def cell_log(study, k=0):
    return f"logs/{RUN}/{study}/{S.pass_dir(k)}{{cell}}.log"


def cell_benchmark(study, k=0):
    return f"benchmarks/{RUN}/{study}/{S.pass_dir(k)}{{cell}}.tsv"


def passes(study):
    return config[study].get("passes", 1)


def pass_cells(study):
    """Every pass's CSV of every cell of ``study``."""
    return [path for k in range(passes(study)) for path in expand(cell_csv(study, k), cell=GRIDS[study])]


def benchmark_dir():
    return f"benchmarks/{RUN}"


def sweep_plan():
    return f"logs/{RUN}/sweep-plan.json"  # this invocation's cell jobs (pipeline.eta)


def study_csv(study="{study}"):
    return f"results/{RUN}/{study}.csv"


def figure_dir(study="{study}"):
    return f"report/{RUN}/figures/{study}"


def config_snapshot():
    return f"results/{RUN}/config.yaml"


try:  # a run measured on another device is not remeasured under its name unless asked (overwrite: true)
    check_run_snapshot(config, config_snapshot())
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None


def report_md():
    return f"report/{RUN}/report.md"


def artifact_dir(study):
    return f"results/{RUN}/{study}/artifacts"


def nsys_rep(cell="{cell}"):
    return f"results/{RUN}/profile/nsys/{cell}.nsys-rep"


def nsys_log():
    return f"logs/{RUN}/profile/nsys/{{cell}}.log"


def answers_md():
    return f"report/{RUN}/answers.md"


def report_html():
    return f"report/{RUN}/report.html"  # report.md and answers.md as one page: the HTML report's landing page


def table_pages():
    return f"report/{RUN}/tables"


NSYS = "profile" in STUDIES and config["profile"]["nsys"]
if NSYS and shutil.which("nsys") is None:
    raise WorkflowError(
        "profile.nsys is true but no `nsys` binary is on PATH; set it to false (torch.profiler covers the study)"
    )


def final_outputs():
    # every cell CSV is a target itself: a deleted or lost cell is measured again on the next run
    # (as the merge's input only, Snakemake would find the merged CSV up to date and skip it)
    cells = [path for s in STUDIES for path in pass_cells(s)]
    nsys = expand(nsys_rep(), cell=GRIDS["profile"]) if NSYS else []
    return (
        [report_md(), report_html(), answers_md(), config_snapshot()]
        + [study_csv(s) for s in STUDIES]
        + cells
        + [figure_dir(s) for s in STUDIES]
        + nsys
    )


# --- input and params functions -------------------------------------------------------------
def _axes(study, cell):
    try:
        return GRIDS[study][cell]
    except KeyError:
        raise WorkflowError(f"{study} cell {cell!r} is not in this config's grid") from None


def cell_params(study, k=0):
    """The cell as its job's params (pipeline.cell.Cell.params): what should rerun it, and nothing else."""

    def params(wildcards):
        axes = _axes(study, wildcards.cell)
        return plan.plan_cell(study, axes, config, OFFERED, k, artifact_dir(study)).params()

    return params


# Job order (pipeline.priorities): pass k of every cell before pass k+1 of any and, inside a
# pass, the cells that took longest in this run's previous results first (else by study estimate).
def previous_cell_csv(study, cell, k):
    return Path(cell_csv(study, k).replace("{cell}", cell))


PRIORITIES = job_priorities(
    expected_seconds(
        GRIDS,
        {s: passes(s) for s in STUDIES},
        previous_cell_csv,
        {s: S.study(s).estimate_s for s in STUDIES},
    ),
    MAX_PASSES,
)
SNAPSHOT_PRIORITY = PRIORITIES.above_cells


# Snakemake's reason for a cell whose code hash changed is "params have changed": say which
# files (pipeline.code_record). Once, in the invocation that plans the jobs, not in each job's.
_CODE_FILES = {}  # module set → hashes: one parse hashes each set once


def _current_code(study, axes):
    return cell_file_hashes(study, axes, config["plugins"], OFFERED, _CODE_FILES)


if not (workflow.remote_exec or workflow.subprocess_exec):
    # the code hash rides in the params: a user's --rerun-triggers without them reruns no edited cell
    _warning = rerun_trigger_warning(invocation_triggers(sys.argv[1:]))
    if _warning:
        print(_warning, file=sys.stderr)
    for _note in rerun_notes(
        (s, previous_cell_csv(s, cell, k), _current_code(s, axes))
        for s in STUDIES
        for k in range(passes(s))
        for cell, axes in GRIDS[s].items()
        if record_path(previous_cell_csv(s, cell, k)).is_file()
    ):
        print(_note, file=sys.stderr)


def cell_priority(study, k=0):
    if not callable_priorities(SNAKEMAKE_VERSION):  # before 9.17: the pass order alone
        return PRIORITIES.pass_floor(k)

    def priority(wildcards):
        return PRIORITIES.cell(study, wildcards.cell, k)

    return priority


def cell_code(study):
    def code(wildcards):
        return plan.cell_code_hash(study, _axes(study, wildcards.cell), config["plugins"], OFFERED)

    return code


def cell_resource(study, key):
    return config[study]["resources"][key]


def cell_timeout(study):
    # a resource, not a param: changing a time limit reruns no cell that finished in time
    return int(-(-config[study]["timeout_s"] // 1))


def plot_code(wildcards):
    return PLOT_CODE[wildcards.study]


def run_settings():
    """The config as the run's snapshot records it: without job resources, which change no number."""
    return settings_snapshot(config)


def study_cells(wildcards):
    return pass_cells(wildcards.study)


def nsys_args(wildcards):
    """The CLI flags of `cs336sys e2e` that run the same model and batch as a profile cell."""
    return command_line("profile", _axes("profile", wildcards.cell), config)


# --- comparing finished runs (compare.smk) ----------------------------------------------------
# a run name, which cannot contain "-vs-": "<a>-vs-<b>" then splits one way only
RUN_NAME = r"[A-Za-z0-9](?:(?!-vs-)[A-Za-z0-9.+-])*"
COMPARE_CODE = modules_hash(module_closure(["cs336sys.runs.compare"]))


def compare_dir(root="report"):
    return f"{root}/compare/{{a}}-vs-{{b}}"


def run_files(wildcards):
    """The merged study CSVs (and the config snapshot) of runs a and b, as absolute paths.

    Absolute, so that nothing here is asked to make them: were a run this config's own, the relative
    paths would be outputs of `merge` and `snapshot`, and a comparison would rerun its merge and
    cells whenever Snakemake found them out of date (changed code or settings).
    """
    files = {}
    for side in ("a", "b"):
        run = getattr(wildcards, side)
        csvs = sorted(glob.glob(f"results/{run}/*.csv"))  # glob skips dot files (temporaries)
        if not csvs:
            raise WorkflowError(
                f"compare: run {run!r} has no merged study CSVs (results/{run}/*.csv); "
                f"runs with CSVs: {', '.join(sorted({Path(p).parent.name for p in glob.glob('results/*/*.csv')})) or 'none'}"
            )
        snapshot = glob.glob(f"results/{run}/config.yaml")
        files[side] = [os.path.abspath(p) for p in csvs + snapshot]
    return files
