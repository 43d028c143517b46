"""The workflow on a real single-node SLURM cluster, through `--profile profiles/slurm`.

ci/local-slurm.sh installs (Debian packages) and starts slurmctld + slurmd + munge (+ slurmdbd and
MariaDB, so `sacct` works) with two fake GPUs advertised as gres/gpu, so the cells' `gpu=1` ->
`sbatch --gpus=1` schedules. Studies of the CPU demo preset then run once through SLURM and once
locally, side by side in two copies of the workflow, and the outputs must be the same set of files
with the same cells.

By default two cheap studies: warmup (2 cells x 2 passes: the `_cell` and the `_pass1` rules) and
precision (2 cells), 6 SLURM jobs on the node's 2 fake GPUs. Every SLURM job costs ~9 CPU-s (the
plugin starts Snakemake twice in it) against ~5 for a local cell, and the whole preset (~50 jobs)
took 6-8 min on 2 cores, nearly all of it those jobs; the preset's other studies add more cells of
the same two rule kinds, not another path through the plugin.

Needs root and apt-get, and runs only in CI (CI=true) or with CS336SYS_SLURM_TEST=1; skipped elsewhere. Deselect with `-m "not slurm"`.
Knobs: SLURM_TEST_STUDIES=warmup,flash runs those studies of the preset in both runs, `all` the
whole preset; SLURM_LOCAL_ACCOUNTING=0 runs the cluster without slurmdbd and the plugin with
`--slurm-status-command squeue`; SLURM_TEST_TIMEOUT (s, default 900) bounds each snakemake run.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from workflow_helpers import DEMO as PRESET
from workflow_helpers import DEMO_RUN as RUN
from workflow_helpers import REPO, copy_repo

# slow as well: it starts a cluster and a Snakemake run, which the fast lane's guard refuses
pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCRIPT = REPO / "ci" / "local-slurm.sh"
ACCOUNTING = os.environ.get("SLURM_LOCAL_ACCOUNTING", "1") != "0"
TIMEOUT = int(os.environ.get("SLURM_TEST_TIMEOUT", "900"))
_studies = os.environ.get("SLURM_TEST_STUDIES", "warmup,precision").strip()
STUDIES = [] if _studies == "all" else [s.strip() for s in _studies.split(",") if s.strip()]
# a --config on the command line replaces the profile's `config:` block, hence check_local_cuda again
SUBSET = ["--config", f"studies=[{','.join(STUDIES)}]", "check_local_cuda=false"] if STUDIES else []
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")


def _skip_reason() -> str | None:
    # It installs Debian packages and starts system daemons: only where that is asked for.
    if os.environ.get("CI", "").lower() != "true" and os.environ.get("CS336SYS_SLURM_TEST") != "1":
        return "starts a local SLURM cluster (installs packages, runs daemons): runs in CI (CI=true) or with CS336SYS_SLURM_TEST=1"
    if not sys.platform.startswith("linux"):
        return "the local SLURM cluster needs Linux"
    if os.geteuid() != 0:
        return "needs root: ci/local-slurm.sh installs Debian packages and starts system daemons (CI runs as root)"
    if shutil.which("apt-get") is None or shutil.which("dpkg-query") is None:
        return "needs Debian/Ubuntu (apt-get) to install slurmctld, slurmd and munge"
    return None


def _sh(args, timeout=600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)


@pytest.fixture(scope="module")
def slurm_cluster():
    """Start the cluster (idempotent); stop it afterwards only if this test started it."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        pytest.fail(f"snakemake-executor-plugin-slurm is not installed for {sys.executable}: pip install it")
    env = {**os.environ, "SLURM_LOCAL_GPUS": os.environ.get("SLURM_LOCAL_GPUS", "2")}
    was_up = _sh(["bash", str(SCRIPT), "status"], env=env).returncode == 0
    t0 = time.monotonic()
    r = _sh(["bash", str(SCRIPT), "start"], env=env)
    print(f"local-slurm.sh start: {time.monotonic() - t0:.1f} s (cluster was {'up' if was_up else 'down'})")
    if r.returncode != 0:
        pytest.fail(f"ci/local-slurm.sh start failed (rc {r.returncode}):\n{r.stdout}\n{r.stderr}")
    try:
        yield {"was_up": was_up}
    finally:
        if not was_up:
            s = _sh(["bash", str(SCRIPT), "stop"], env=env)
            print(f"local-slurm.sh stop: rc {s.returncode}\n{s.stderr[-2000:]}")


def _snakemake(workdir: Path, *args: str) -> tuple[int, str]:
    """Run snakemake in workdir; kill its whole process group after TIMEOUT (SIGTERM is not enough:
    on SIGTERM snakemake waits for running jobs, which with a broken status query is forever)."""
    cmd = [sys.executable, "-m", "snakemake", *args]
    logfile = workdir / "snakemake-test.log"
    t0 = time.monotonic()
    with open(logfile, "w") as out:
        p = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = -9
    print(f"snakemake in {workdir.name}: rc {rc}, {time.monotonic() - t0:.0f} s")
    return rc, logfile.read_text()


def _outputs(workdir: Path) -> dict:
    """What must agree between the two runs: file names, and per merged CSV its rows and cell ids."""
    merged = {}
    for f in sorted((workdir / "results" / RUN).glob("*.csv")):
        with open(f, newline="") as fh:
            rows = list(csv.DictReader(fh))
        merged[f.name] = {
            "rows": len(rows),
            "cells": sorted({r.get("cell_id", "") for r in rows}),
            "columns": sorted(rows[0].keys()) if rows else [],
        }
    report_dir = workdir / "report" / RUN
    report = sorted(str(p.relative_to(report_dir)) for p in report_dir.rglob("*") if p.is_file())
    # one CSV per cell and pass: pass 0 in cells/, pass k in cells/pass<k>/
    results = workdir / "results" / RUN
    cells = sorted(str(p.relative_to(workdir)) for p in [*results.glob("*/cells/*.csv"), *results.glob("*/cells/pass*/*.csv")])
    return {"merged": merged, "report": report, "cells": cells}


def _tail(text: str, n: int = 60) -> str:
    return "\n".join(text.splitlines()[-n:])


def _slurm_diagnostics() -> str:
    parts = []
    for cmd in (["sinfo", "-N", "-o", "%N %T %G %E"], ["squeue", "-t", "all"]):
        try:
            parts.append(_sh(cmd, timeout=30).stdout)
        except Exception as e:  # noqa: BLE001 - diagnostics only
            parts.append(f"{cmd}: {e}")
    log = Path(os.environ.get("SLURM_LOCAL_DIR", "/var/lib/cs336sys-slurm-local")) / "log" / "slurmctld.log"
    if log.exists():
        parts.append(_tail(log.read_text(errors="replace"), 30))
    return "\n".join(parts)


def _cell_rules(cells: list[str]) -> list[str]:
    """The plugin's log folder name (rule_<rule>) of each rule that wrote these cell CSVs:
    results/<run>/<study>/cells/<cell>.csv is <study>_cell, .../cells/pass<k>/<cell>.csv <study>_pass<k>."""
    rules = set()
    for path in cells:
        parts = Path(path).parts
        study, kind = parts[2], parts[4] if len(parts) == 6 else "cell"
        rules.add(f"rule_{study}_{kind}")
    return sorted(rules)


def test_cpu_demo_on_slurm_matches_local_run(slurm_cluster, tmp_path):
    # no dry run first: a workflow that does not parse fails the local run at once, with the same message
    cluster_dir = copy_repo(tmp_path / "on-slurm")
    local_dir = copy_repo(tmp_path / "local")
    print(f"studies: {', '.join(STUDIES) or 'all of ' + PRESET}")

    slurm_args = [
        "--profile",
        "profiles/slurm",
        # profiles/default (auto-loaded workflow profile) would impose `resources: gpu=1`
        "--workflow-profile",
        "none",
        "--configfile",
        PRESET,
        *SUBSET,
        # CI speed: first status check after 2 s (profile: 20 s); outputs are on a local disk
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--latency-wait",
        "5",
    ]
    if not ACCOUNTING:
        slurm_args += ["--slurm-status-command", "squeue"]

    # the two runs are independent: run them side by side
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        on_slurm = pool.submit(_snakemake, cluster_dir, *slurm_args)
        local = pool.submit(_snakemake, local_dir, "--cores", "1", "--configfile", PRESET, *SUBSET)
        (rc_s, log_s), (rc_l, log_l) = on_slurm.result(), local.result()
    print(f"slurm + local runs side by side: {time.monotonic() - t0:.0f} s")
    assert rc_l == 0, f"local run failed (rc {rc_l}):\n{_tail(log_l)}"
    assert rc_s == 0, f"SLURM run failed (rc {rc_s}):\n{_tail(log_s)}\n--- cluster ---\n{_slurm_diagnostics()}"
    assert "Provided resources: gpu" not in log_s, "a global gpu limit leaked into the SLURM run"

    # the same outputs
    out_s, out_l = _outputs(cluster_dir), _outputs(local_dir)
    assert out_l["merged"], "the local run wrote no merged CSVs"
    assert "report.md" in out_l["report"]
    assert sorted(out_s["merged"]) == sorted(out_l["merged"])
    for name in out_l["merged"]:
        assert out_s["merged"][name] == out_l["merged"][name], f"{name} differs between SLURM and local run"
    assert out_s["report"] == out_l["report"]
    assert out_s["cells"] == out_l["cells"]

    if STUDIES:  # the subset, and only it, ran
        assert sorted(out_l["merged"]) == sorted(f"{s}.csv" for s in STUDIES), sorted(out_l["merged"])

    # every cell ran as a SLURM job (and nothing else did: merge/plots/report are localrules)
    submitted = SUBMITTED.findall(log_s)
    rules = sorted({Path(logpath).parts[-3] for _, logpath in submitted})
    assert len(submitted) == len(out_s["cells"]), f"{len(submitted)} SLURM jobs for {len(out_s['cells'])} cell CSVs"
    assert all(re.fullmatch(r"rule_\w+_(cell|pass\d+)", r) for r in rules), rules
    # each kind of cell rule the local run used (a study's pass 0 and its later passes) went through SLURM
    assert rules == _cell_rules(out_l["cells"]), f"SLURM ran {rules}, the local run {_cell_rules(out_l['cells'])}"
    job_ids = {jobid for jobid, _ in submitted}
    # the plugin's per-job logs are kept (slurm-keep-successful-logs) and named <jobid>.log
    slurm_logs = {p.stem for p in (cluster_dir / ".snakemake" / "slurm_logs").rglob("*.log")}
    assert job_ids <= slurm_logs, f"no SLURM log for jobs {sorted(job_ids - slurm_logs)}"

    # and SLURM itself knows them, as completed jobs that got one (fake) GPU each
    if ACCOUNTING:
        q = _sh(
            ["sacct", "-X", "-n", "--parsable2", "-S", "now-1days", "--format=JobIDRaw,State,AllocTRES", "-j", ",".join(sorted(job_ids))],
            timeout=60,
        )
        assert q.returncode == 0, q.stderr
        seen = {row.split("|")[0]: row.split("|") for row in q.stdout.split()}
        assert set(seen) == job_ids
        assert all(row[1] == "COMPLETED" for row in seen.values()), q.stdout
        assert all("gres/gpu=1" in row[2] for row in seen.values()), q.stdout
    else:
        q = _sh(["squeue", "-t", "all", "-h", "-o", "%i|%T", "-j", ",".join(sorted(job_ids))], timeout=60)
        assert q.returncode == 0, q.stderr
        seen = {row.split("|")[0]: row.split("|") for row in q.stdout.split()}
        assert set(seen) == job_ids
        assert all(row[1] == "COMPLETED" for row in seen.values()), q.stdout
