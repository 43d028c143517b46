"""The warm worker (pipeline.warm): cell jobs handed to one process that imported torch once.

a. A job run through the server writes the same rows as one run in-process, and a second job
   reuses the server (no second torch import).
b. The server's name follows the checkout, the sources and the environment: an edited module,
   a changed variable or another checkout never reaches an old server.
c. A job SIGKILLed mid-measurement stops its measurement, and its cell's CSV is not written.
d. A job asked not to use the server runs the cell itself.
(What another account, or a confused job, can do to the server: test_warm_hostile.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cell_kwargs import cell_kwargs
from cs336sys.catalog import BUILT_IN
from cs336sys.pipeline import plan, warm
from cs336sys.pipeline.config import validate_config
from workflow_helpers import DEMO, REPO, load_config

pytestmark = pytest.mark.slow  # every test: the warm server and its jobs

SRC = str(REPO / "src")
FAULT_ENV = "CS336SYS_INJECT_FAULT"

# A job as the workflow's script runs it: the library's run_job, stdlib only on this side.
JOB = """
import json, sys
from cs336sys.pipeline.warm import run_job
print(run_job(json.loads(sys.argv[1]), 60.0, sys.argv[2], sys.argv[3], warm=sys.argv[4] == "1"), flush=True)
"""


@pytest.fixture(scope="module")
def precision_cell() -> dict:
    config, _ = validate_config(load_config(REPO, DEMO))
    return plan.plan_cell("precision", {"part": "accumulation"}, config, BUILT_IN).params()


@pytest.fixture
def env(tmp_path_factory):
    """A private server directory (short: a Unix socket path has ~107 bytes); its servers are stopped afterwards.

    The idle limit outlasts a slow start of the next job on a busy machine (a job that comes after
    it finds no server and starts a second one); the servers are killed at teardown anyway.
    """
    short = Path(tempfile_dir()) / f"w{os.getpid()}-{time.monotonic_ns() % 10**8}"
    short.mkdir()
    keep = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, "CS336SYS_FAKE_GPUS", "CS336SYS_LOCK_DIR")}
    yield {**keep, "PYTHONPATH": SRC, warm.DIR_ENV: str(short), warm.IDLE_ENV: "30"}
    for sock in short.glob("*.sock"):
        _stop_server(sock)
    shutil.rmtree(short, ignore_errors=True)


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


def _servers(directory: str) -> list[int]:
    """Pids of the warm servers (not their forked handlers) serving sockets in ``directory``."""
    pids = _warm_processes(directory)
    return [p for p in pids if _ppid(p) not in pids]  # a handler's parent is a server


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _warm_processes(directory: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cs336sys.pipeline.warm" in cmd and any(directory.encode() in c for c in cmd):
            pids.append(int(entry.name))
    return pids


def _stop_server(sock: Path) -> None:
    for pid in _warm_processes(str(sock.parent)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _job(settings: dict, out: Path, log: Path, env: dict, use_warm: bool = True) -> subprocess.Popen:
    # run where its outputs are, as Snakemake runs a job in its working directory: the server writes inside it only
    argv = [sys.executable, "-c", JOB, json.dumps(settings), str(out), str(log), "1" if use_warm else "0"]
    return subprocess.Popen(argv, cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_jobs_through_the_server_write_the_cell_and_share_one_server(precision_cell, env, tmp_path):
    for i in range(2):
        job = _job(precision_cell, tmp_path / f"cell{i}.csv", tmp_path / f"cell{i}.log", env)
        out, _ = job.communicate(timeout=300)
        assert job.returncode == 0, out
        assert "part=accumulation: ok" in out
    servers = _servers(env[warm.DIR_ENV])
    assert len(servers) == 1, "the second job started a second server"
    logs = list(Path(env[warm.DIR_ENV]).glob("*.log"))
    assert len(logs) == 1 and logs[0].read_text().count("warm server") == 1
    a, b = (pd.read_csv(tmp_path / f"cell{i}.csv") for i in range(2))
    assert set(a["status"]) == {"ok"} and len(a) == len(b) > 0
    assert list(a.columns) == list(b.columns)
    assert "part=accumulation: ok" in (tmp_path / "cell0.log").read_text()  # the handler logs into the job's log


def test_the_server_name_follows_sources_and_environment(tmp_path, monkeypatch):
    base = {"PATH": "/bin"}
    key = warm.server_key(base)
    assert warm.server_key(dict(base)) == key
    assert warm.server_key({**base, "TORCH_LOGS": "+dynamo"}) != key
    assert warm.server_key({**base, "SLURM_JOB_ID": "17", "PWD": "/x"}) == key  # per-job: one server for all
    copy = tmp_path / "cs336sys"
    copy.mkdir()
    (copy / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(warm, "PACKAGE", copy)
    before = warm.server_key(base)
    (copy / "a.py").write_text("x = 2\n")
    edited = warm.server_key(base)
    assert edited != before
    twin = tmp_path / "another-checkout" / "cs336sys"
    shutil.copytree(copy, twin)
    monkeypatch.setattr(warm, "PACKAGE", twin)
    assert warm.server_key(base) != edited  # the same sources in another checkout: its own server, its own commit


def _descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] not in ("Z", "X"):
                kids.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        for kid in kids.get(todo.pop(), []):
            out.add(kid)
            todo.append(kid)
    return out


def test_a_killed_job_stops_its_measurement_and_writes_no_csv(precision_cell, env, tmp_path):
    env = {**env, FAULT_ENV: "sleep=60"}
    out = tmp_path / "cell.csv"
    job = _job(precision_cell, out, tmp_path / "cell.log", env)
    deadline = time.monotonic() + 240
    measuring: set[int] = set()
    while time.monotonic() < deadline and not measuring:  # the server, its handler and the measuring child
        servers = _servers(env[warm.DIR_ENV])
        measuring = set().union(*(_descendants(s) for s in servers)) if servers else set()
        measuring = {p for p in measuring if len(_descendants(p)) == 0 and p not in servers}
        time.sleep(0.1)
    assert measuring, "no measuring process appeared"
    job.kill()
    job.wait()
    stop = time.monotonic() + 10
    while time.monotonic() < stop and any(Path(f"/proc/{p}").exists() and _state(p) not in ("Z", "X") for p in measuring):
        time.sleep(0.1)
    assert not [p for p in measuring if Path(f"/proc/{p}").exists() and _state(p) not in ("Z", "X")]
    time.sleep(1.5)  # the handler would have written by now
    assert not out.exists()


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat[stat.rindex(")") + 2 :].split()[0]


def test_a_job_told_not_to_use_the_server_runs_the_cell_itself(precision_cell, env, tmp_path):
    job = _job(precision_cell, tmp_path / "cell.csv", tmp_path / "cell.log", env, use_warm=False)
    out, _ = job.communicate(timeout=300)
    assert job.returncode == 0, out
    assert set(pd.read_csv(tmp_path / "cell.csv")["status"]) == {"ok"}
    assert not _servers(env[warm.DIR_ENV])


PRELOADED_CHILD = """
import gc, json, os, sys
import torch
from cs336sys.pipeline import warm
failed = warm.preload()
before, frozen = set(sys.modules), gc.get_freeze_count()
if os.fork() == 0:  # a measuring child: one small e2e training step on the CPU
    from cs336sys.measure.session import Session
    from cs336sys.studies.e2e.measure import measure
    list(measure(torch.device("cpu"), {}, Session(), **json.loads(KWARGS)))
    print(json.dumps({"new": sorted(set(sys.modules) - before), "failed": failed, "frozen": frozen,
                      "cuda": torch.cuda.is_initialized()}), flush=True)
    os._exit(0)
os.wait()
"""


def test_preload_leaves_a_measuring_child_little_to_import():
    # torch imports torch._dynamo (sympy: ~900 modules) at a first backward; a child that does it
    # itself pays seconds per cell. After preload() it imports next to nothing, CUDA untouched.
    kwargs = cell_kwargs(
        "e2e",
        size="small",
        context_length=8,
        precision="fp32",
        batch_size=1,
        vocab_size=50,
        warmup_steps=1,
        measure_steps=1,
        modes=["train"],
    )
    out = subprocess.run(
        [sys.executable, "-c", f"KWARGS = {json.dumps(json.dumps(kwargs))}\n" + PRELOADED_CHILD],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert not got["failed"] and not got["cuda"] and got["frozen"] > 0
    assert not [m for m in got["new"] if m.startswith(("torch._dynamo", "sympy", "triton"))]
    assert len(got["new"]) < 20, got["new"]
