"""What the workflow tells its user when a run ends, and when `snakemake --report` has no run to package.

Called from workflow/rules/report.smk (Snakemake's lint keeps functions out of rule files). Torch-free.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import yaml


def run_command(run: str, configfiles: Sequence[str | os.PathLike], overrides: Mapping, *head: str) -> str:
    """``snakemake HEAD…`` with this invocation's settings: its --configfile files, once and in order (of two
    --configfile flags Snakemake keeps the last), and every --config override, the run's name as resolved."""
    words = ["snakemake", *head]
    if configfiles:
        words += ["--configfile", *(os.path.relpath(p) if os.path.isabs(p) else str(p) for p in configfiles)]
    settings = {**overrides, "run": run} if "run" in overrides else dict(overrides)
    if settings:
        words += ["--config", *(f"{key}={_config_value(value)}" for key, value in settings.items())]
    return " ".join(shlex.quote(word) for word in words)


def _config_value(value: object) -> str:
    """``value`` as ``--config key=VALUE`` spells it: Snakemake reads int, float, True/False, then YAML, else text."""
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
    return str(value)


def finished_message(run: str, report_md: str, answers_md: str, configfiles: Sequence, overrides: Mapping) -> str:
    """Where a finished run's outputs are; empty where this invocation made no run's report (a comparison)."""
    if not Path(report_md).is_file():
        return ""
    return (
        f"\nRun `{run}` finished:\n"
        f"  report   {report_md}\n"
        f"  answers  {answers_md}\n"
        f"  CSVs     results/{run}/<study>.csv\n"
        f"  one HTML file:  {run_command(run, configfiles, overrides, '--report', 'report.html')}\n"
    )


def asks_for_report(argv: Sequence[str]) -> bool:
    return any(a == "--report" or a.startswith("--report=") for a in argv)


def missing_report_message(
    argv: Sequence[str],
    run: str,
    report_md: str,
    gpu_sweep_without_gpu: Callable[[], bool],
    configfiles: Sequence = (),
    overrides: Mapping | None = None,
) -> str | None:
    """Why ``snakemake --report`` cannot package this run, or None where it can (or packages something else).

    Snakemake tells a workflow neither that it builds a report nor its targets, so ``argv`` (the command
    line) is read with Snakemake's own parser, and only when it names --report. ``gpu_sweep_without_gpu``:
    whether this config is a GPU sweep on a machine without a GPU (asked only when the report is missing).
    """
    if not asks_for_report(argv) or Path(report_md).is_file():
        return None
    from snakemake.cli import get_argument_parser

    args, _ = get_argument_parser().parse_known_args(list(argv))
    if args.targets:  # e.g. a comparison: report/compare/<a>-vs-<b>/report.md --report compare.html
        return None
    if gpu_sweep_without_gpu():
        return (
            f"There is no run to package: this machine has no GPU, so config.yaml's GPU sweep (run `{run}`) "
            f"never ran here and {report_md} does not exist.\n"
            "The CPU demo's report, after the demo ran (./run snakemake runs it):\n"
            "    snakemake --report report.html --configfile config/cpu-demo.yaml"
        )
    return (
        f"There is no run to package: {report_md} does not exist. `--report` packages a finished run: run "
        f"`{run_command(run, configfiles, overrides or {})}` first, or name the finished run "
        "(--configfile, --config run=<name>) as when it ran."
    )
