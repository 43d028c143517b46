"""Helpers for the workflow tests: copy the repository, run `python -m snakemake` in the copy,
parse a dry run's job list, and build configs the way Snakemake merges them.

Every run happens in a temporary copy (Snakefile, config.yaml, config/, profiles/, workflow/, src/),
so the checkout's results/, report/, logs/ and .snakemake/ are never touched, and edits to the
copy's sources are what count (the workflow puts the copy's src/ first on sys.path).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
COPIED = ("Snakefile", "config.yaml", "config", "profiles", "workflow", "src")
DEMO = "config/cpu-demo.yaml"
DEMO_RUN = "cpu-demo"  # the `run:` of config/cpu-demo.yaml: outputs go to results/cpu-demo/, report/cpu-demo/
FAULT_ENV = "CS336SYS_INJECT_FAULT"
IMPORT_LOG_ENV = "CS336SYS_TEST_IMPORT_LOG"
# Generous wall-clock limits: the machine is shared; these only stop a hung run.
RUN_TIMEOUT = int(os.environ.get("CS336SYS_WORKFLOW_TEST_TIMEOUT", "2400"))
DRY_TIMEOUT = 600

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")


def reference_runs() -> list[str]:
    """The committed runs with merged CSVs (results/<run>/), as git lists them: a checkout's own runs
    (the CPU demo, a user's sweeps: ignored by git) are not reference runs. Outside a git checkout
    (an unpacked archive), every run folder there."""
    try:
        out = subprocess.run(["git", "ls-files", "results/*/config.yaml"], cwd=REPO, capture_output=True, text=True, timeout=60)
        files = out.stdout.split() if out.returncode == 0 else []
    except OSError:
        files = []
    if files:
        return sorted({Path(f).parent.name for f in files})
    return sorted(p.parent.name for p in REPO.glob("results/*/config.yaml") if p.parent.name != DEMO_RUN)


def copy_repo(dest: Path) -> Path:
    """A fresh copy of the workflow (no outputs, no .snakemake) at ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=_IGNORE)
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


def clone_run(src: Path, dest: Path) -> Path:
    """Copy a finished run directory (outputs and .snakemake metadata, mtimes kept) to ``dest``."""
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "locks"))
    (dest / ".snakemake" / "locks").mkdir(parents=True, exist_ok=True)
    return dest


@dataclass
class Result:
    args: list[str]
    returncode: int
    output: str  # stdout and stderr together, in order
    seconds: float

    def describe(self, tail: int = 6000) -> str:
        return f"$ {' '.join(self.args)}\n(exit {self.returncode}, {self.seconds:.0f} s)\n...{self.output[-tail:]}"


def snakemake(cwd: Path, *args: str, env: Mapping[str, str] | None = None, timeout: int = RUN_TIMEOUT) -> Result:
    """``python -m snakemake ARGS`` with cwd = ``cwd`` (the copy's profiles/default applies)."""
    full_env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, IMPORT_LOG_ENV)}
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "snakemake", *args]
    t0 = time.monotonic()
    out = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, **out, stdin=subprocess.DEVNULL, timeout=timeout)
    return Result(cmd[1:], proc.returncode, proc.stdout, time.monotonic() - t0)


@dataclass
class FinishedDemo:
    """A directory holding a finished, up-to-date CPU demo, shared by the tests of one session (read only:
    a test that changes it works on a copy, :func:`clone_run`, or in its own tmp_path)."""

    root: Path
    result: Result | None  # the run that made it; None: the checkout's own demo was up to date and is read as it is


def once_per_session(tmp_path_factory, name: str, build: Callable[[Path], Any]) -> Any:
    """What ``build(folder)`` returns (JSON), built once for the whole session, every xdist worker included.

    A session fixture is per worker: four workers that each need the reduced run would each run the
    workflow, four at a time on two cores. The first worker to ask builds it in a folder the workers
    share; the others wait on a lock and read what it returned. A build that fails is tried again.
    """
    base = tmp_path_factory.getbasetemp()
    base = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
    folder, done = base / f"shared-{name}", base / f"shared-{name}.json"
    with open(base / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(json.dumps(build(folder)))
    return json.loads(done.read_text())


def result_from(fields: Mapping[str, Any] | None) -> Result | None:
    """A :class:`Result` from its ``asdict`` (what :func:`once_per_session` keeps)."""
    return None if fields is None else Result(**fields)


def finished_demo(dest: Path) -> FinishedDemo:
    """The checkout's own demo where a dry run there has nothing to do (CI runs the demo just before the
    tests, with this code), else a fresh run of the demo in a copy at ``dest``."""
    check = snakemake(REPO, "-n", "--nolock", "--configfile", DEMO, timeout=DRY_TIMEOUT)
    if check.returncode == 0 and _NOTHING.search(check.output) and (REPO / "report" / DEMO_RUN / "report.md").is_file():
        return FinishedDemo(REPO, None)
    root = copy_repo(dest)
    return FinishedDemo(root, snakemake(root, "--configfile", DEMO))


def configfile_args(*configfiles: str) -> list[str]:
    return ["--configfile", *configfiles] if configfiles else []


# --- dry runs ----------------------------------------------------------------------------------

_RULE = re.compile(r"^\s*(?:local)?rule (\w+):\s*$")
_FIELD = re.compile(r"^\s+(\w+): ?(.*)$")
_NOTHING = re.compile(r"Nothing to be done", re.I)


@dataclass
class Job:
    rule: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def wildcards(self) -> dict[str, str]:
        text = self.fields.get("wildcards", "")
        out = {}
        for part in text.split(", ") if text else []:
            key, _, value = part.partition("=")  # values (cell ids) contain '=' themselves
            out[key.strip()] = value.strip()
        return out

    @property
    def reason(self) -> str:
        return self.fields.get("reason", "")


@dataclass
class DryRun:
    result: Result
    jobs: list[Job]
    stats: dict[str, int]  # the "Job stats" table: rule → count (without "total")

    @property
    def nothing_to_do(self) -> bool:
        return not self.jobs and not self.stats and bool(_NOTHING.search(self.result.output))

    def counts(self) -> Counter:
        return Counter(job.rule for job in self.jobs)

    def rules(self) -> set[str]:
        return set(self.counts())

    def cells(self, rule: str | None = None) -> set[tuple[str, str]]:
        """(rule, cell id) of every job with a ``cell`` wildcard (optionally of one rule)."""
        return {(j.rule, j.wildcards["cell"]) for j in self.jobs if "cell" in j.wildcards and rule in (None, j.rule)}

    def studies(self, rule: str) -> set[str]:
        """The ``study`` wildcard of every job of ``rule`` (merge, plots)."""
        return {j.wildcards.get("study", "") for j in self.jobs if j.rule == rule}

    def describe(self) -> str:
        lines = [f"{j.rule} {j.wildcards} reason: {j.reason[:200]}" for j in self.jobs]
        return f"jobs ({len(self.jobs)}):\n  " + "\n  ".join(lines) + f"\nstats: {self.stats}\n" + self.result.describe(3000)


def parse_dry_run(output: str) -> tuple[list[Job], dict[str, int]]:
    jobs: list[Job] = []
    stats: dict[str, int] = {}
    current: Job | None = None
    lines = output.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == "Job stats:":
            current = None
            if not stats:  # the table is printed twice (before and after the jobs); read the first
                j = i + 1
                while j < len(lines) and lines[j].strip():
                    parts = lines[j].split()
                    if len(parts) == 2 and parts[1].isdigit() and parts[0] not in ("job", "total"):
                        stats[parts[0]] = int(parts[1])
                    j += 1
            i += 1
            continue
        m = _RULE.match(line)
        if m:
            current = Job(m.group(1))
            jobs.append(current)
        elif current is not None:
            f = _FIELD.match(line)
            if f:
                current.fields[f.group(1)] = f.group(2)
            elif not line.strip() or not line.startswith(" "):
                current = None
        i += 1
    return jobs, stats


def dry_run(cwd: Path, *configfiles: str, extra: Iterable[str] = (), env: Mapping[str, str] | None = None) -> DryRun:
    result = snakemake(cwd, "-n", *configfile_args(*configfiles), *extra, env=env, timeout=DRY_TIMEOUT)
    assert result.returncode == 0, f"dry run failed:\n{result.describe()}"
    jobs, stats = parse_dry_run(result.output)
    run = DryRun(result, jobs, stats)
    # the job list and the "Job stats" table must agree, or the parse is not to be trusted
    assert dict(run.counts()) == stats, f"job headers and 'Job stats' disagree:\n{run.describe()}"
    return run


# --- configs -----------------------------------------------------------------------------------


def deep_update(base: dict, override: Mapping) -> dict:
    """Snakemake's merge of --configfile files: nested mappings merge key by key, the rest is replaced."""
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            deep_update(base[key], value)
        else:
            base[key] = value
    return base


def load_config(root: Path, *configfiles: str, validated: bool = True) -> dict[str, Any]:
    """The config a run in ``root`` sees: config.yaml, then each --configfile over it, validated.

    Validation writes every default in, as the workflow's does: presets name only what they
    change, so a setting a test reads (``passes``, a grid axis) may be in no file.
    ``validated=False``: the files' keys alone, for tests of validation itself.
    """
    from cs336sys.pipeline.config import validate_config

    config = yaml.safe_load((root / "config.yaml").read_text()) or {}
    for name in configfiles:
        deep_update(config, yaml.safe_load((root / name).read_text()) or {})
    return validate_config(config)[0] if validated else config


def write_yaml(path: Path, data: Mapping[str, Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return str(path)


def grid(config: Mapping[str, Any], study: str) -> dict[str, dict]:
    """Cell id → axes of ``study`` under ``config`` (the library's own grid, as the workflow plans it)."""
    from cs336sys.pipeline.plan import grid as plan_grid
    from cs336sys.plugins import offered

    return plan_grid(study, config, offered(config.get("plugins")))


# --- reading outputs ---------------------------------------------------------------------------


def markdown_section(text: str, heading_re: str) -> str:
    """The body of the first level-2 section whose heading matches ``heading_re`` (up to the next '## ')."""
    m = re.search(rf"^## [^\n]*{heading_re}[^\n]*$", text, re.M | re.I)
    if not m:
        return ""
    rest = text[m.end() :]
    nxt = re.search(r"^## ", rest, re.M)
    return rest[: nxt.start()] if nxt else rest


IMPORT_HOOK = """

# --- added by tests/test_workflow.py in a temporary copy: record which checkout each process imports
import os as _os

if _os.environ.get("CS336SYS_TEST_IMPORT_LOG"):
    with open(_os.environ["CS336SYS_TEST_IMPORT_LOG"], "a") as _f:
        _f.write(f"{_os.getpid()} {__file__}\\n")
"""


def add_import_hook(root: Path) -> None:
    """Make the copy's cs336sys append "<pid> <its __init__ path>" to $CS336SYS_TEST_IMPORT_LOG on import."""
    init = root / "src" / "cs336sys" / "__init__.py"
    init.write_text(init.read_text() + IMPORT_HOOK)
