# Validation, cell lists, paths and code hashes: everything the rules need, built once.
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))  # this checkout's library, installed or not

from snakemake.exceptions import WorkflowError

from cs336sys import studies as S
from cs336sys.config import ConfigError, validate_config
from cs336sys.provenance import code_hash, file_hash

try:
    validate_config(config, Path(workflow.basedir) / "workflow/schemas/config.schema.yaml")
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

if config["device"] == "cuda" and config.get("check_local_cuda", True):
    import torch

    if not torch.cuda.is_available():
        raise WorkflowError(
            "No CUDA device on this machine, and this config (device: cuda) is a GPU sweep.\n"
            "Run the CPU demo instead, which runs the same pipeline with tiny shapes:\n"
            "    snakemake --configfile config/cpu-demo.yaml\n"
            "(On a cluster login node without a GPU, the SLURM profile sets check_local_cuda: false.)"
        )

RUN = config["run"]
STUDIES = list(config["studies"])
GRIDS = {study: S.grid(study, config) for study in STUDIES}
SCRIPTS = Path(workflow.basedir) / "workflow/scripts"
SCRIPT_HASH = {p.name: file_hash(p) for p in SCRIPTS.glob("*.py")}
MERGE_CODE = code_hash(["results.py", "metrics.py", "cells.py"])
PLOT_CODE = code_hash(["plots.py", "results.py", "memory_snapshot.py"])
REPORT_CODE = code_hash(["report.py", "findings.py", "results.py", "metrics.py", "flops.py", "profiling.py", "studies.py"])


wildcard_constraints:
    study="|".join(STUDIES) or "none",
    cell=r"[^/]+",


localrules:
    all,
    merge,
    plots,
    report,


# --- paths (the only place they are spelled) ---------------------------------------------------
def cell_csv(study):
    return f"results/{RUN}/{study}/cells/{{cell}}.csv"


def cell_log(study):
    return f"logs/{RUN}/{study}/{{cell}}.log"


def study_csv(study="{study}"):
    return f"results/{RUN}/{study}.csv"


def figure_dir(study="{study}"):
    return f"report/{RUN}/figures/{study}"


def report_md():
    return f"report/{RUN}/report.md"


def nsys_rep(cell="{cell}"):
    return f"results/{RUN}/profile/nsys/{cell}.nsys-rep"


NSYS = "profile" in STUDIES and config["profile"].get("nsys", False)
if NSYS and shutil.which("nsys") is None:
    raise WorkflowError("profile.nsys is true but no `nsys` binary is on PATH; set it to false (torch.profiler covers the study)")


def final_outputs():
    nsys = expand(nsys_rep(), cell=GRIDS["profile"]) if NSYS else []
    return [report_md()] + [study_csv(s) for s in STUDIES] + [figure_dir(s) for s in STUDIES] + nsys


# --- input and params functions -------------------------------------------------------------
def _axes(study, cell):
    try:
        return GRIDS[study][cell]
    except KeyError:
        raise WorkflowError(f"{study} cell {cell!r} is not in this config's grid") from None


def artifact_dir(study):
    return f"results/{RUN}/{study}/artifacts"


def cell_settings(study):
    def settings(wildcards):
        return S.cell_settings(study, _axes(study, wildcards.cell), config, artifact_dir(study))

    return settings


def cell_code(study):
    def code(wildcards):
        return S.cell_code_hash(study, _axes(study, wildcards.cell))

    return code


def cell_resource(study, key, default):
    return (config.get("resources") or {}).get(study, {}).get(key, default)


def study_cells(wildcards):
    return expand(cell_csv(wildcards.study), cell=GRIDS[wildcards.study])


def nsys_args(wildcards):
    """CLI flags that make `cs336sys e2e` run the same model and batch as a profile cell."""
    kw = S.cell_settings("profile", _axes("profile", wildcards.cell), config)["kwargs"]
    return (
        f"--model-size {kw['size']} --context-length {kw['context_length']} --precision {kw['precision']} "
        f"--attention {kw['attention']} --warmup-steps {kw['warmup_steps']} --measure-steps {kw['measure_steps']} "
        f"--batch-size {kw['batch_size']} --vocab-size {kw['vocab_size']} --device cuda"
    )
