"""Kills and contention: no orphaned measuring child, one measurement per GPU across runs, no stale temporaries.

a. A job SIGKILLed mid-measurement takes its measuring child with it (fork: PDEATHSIG; forkserver:
   the child watches the job's pid).
b. Two independent processes measuring on one (fake) GPU take turns, and the second says how long
   it queued; on two GPUs they run at once on distinct GPUs.
c. Two `snakemake` runs (different run names, one lock directory) never measure at the same time.
Plus the rough edges around a kill: `.tmp-<pid>-<name>` files a killed writer leaves are removed by
the next job that writes that output, and failure rows name their part (or "" before any part).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from cs336sys.catalog import BUILT_IN
from cs336sys.fileio import remove_stale_temps
from cs336sys.pipeline import plan
from cs336sys.pipeline.cells import FAULT_ENV, Cell, run_cell
from cs336sys.pipeline.config import validate_config
from workflow_helpers import DEMO, REPO, copy_repo, load_config

pytestmark = pytest.mark.slow  # every test: jobs and measuring children, killed

SRC = str(REPO / "src")
LOCK_ENVS = ("CS336SYS_FAKE_GPUS", "CS336SYS_LOCK_DIR", FAULT_ENV)

# A job: runs one cell through the library's cell runner and prints its rows as JSON.
# argv: cell settings (JSON), start method, time limit, and "wait" to start only on a line on stdin.
JOB = """
import json, sys
from cs336sys.pipeline.cells import Cell, run_cell
cell = Cell.from_params(json.loads(sys.argv[1]), timeout_s=float(sys.argv[3]))
if sys.argv[4:] == ["wait"]:
    print("ready", flush=True)
    sys.stdin.readline()
print(json.dumps(run_cell(cell, start_method=sys.argv[2]), default=str), flush=True)
"""


@pytest.fixture(scope="module")
def precision_cell() -> dict:
    """The settings of the CPU demo's smallest cell (precision, accumulation: well under a second)."""
    config, _ = validate_config(load_config(REPO, DEMO))
    return plan.plan_cell("precision", {"part": "accumulation"}, config, BUILT_IN).params()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LOCK_ENVS}
    return {**env, "PYTHONPATH": SRC, **extra}


def _start_job(settings: dict, method: str, env: dict, timeout_s: float = 120, wait: bool = False) -> subprocess.Popen:
    argv = [sys.executable, "-c", JOB, json.dumps(settings), method, str(timeout_s)] + (["wait"] if wait else [])
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


# ---------------------------------------------------------------- /proc helpers (no psutil)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid``, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]  # comm may hold spaces and ')'
    return state, int(ppid)


def _alive(pid: int) -> bool:
    """Running, not merely an unreaped zombie (an orphan's reaper may be slow or absent)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pid and stat[0] not in ("Z", "X"):
                out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _measuring_child(job: subprocess.Popen, method: str, within_s: float = 90) -> tuple[int, list[int]]:
    """The pid of the job's measuring child, and every descendant of the job seen (for clean-up).

    fork: the job's only child. forkserver: the server is the job's child, the measuring child
    is the server's (the job's other child, the resource tracker, has none).
    """
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert job.poll() is None, "the job ended before its child started"
        kids = _children(job.pid)
        grandkids = [g for k in kids for g in _children(k)]
        if method == "fork" and kids:
            return kids[0], kids
        if method == "forkserver":
            servers = [k for k in kids if "forkserver" in _cmdline(k)]
            found = [g for s in servers for g in _children(s)]
            if found:
                return found[0], kids + grandkids
        time.sleep(0.05)
    raise AssertionError(f"no measuring child of the job ({method}) within {within_s} s")


def _gone_within(pid: int, seconds: float, since: float) -> float | None:
    """Seconds from ``since`` until ``pid`` stopped running, or None if it still ran after ``seconds``."""
    while time.monotonic() - since < seconds:
        if not _alive(pid):
            return time.monotonic() - since
        time.sleep(0.01)
    return None if _alive(pid) else time.monotonic() - since


def _kill_leftovers(pids) -> None:
    for pid in pids:  # only processes this test started, one by one
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- a. no orphan


@pytest.mark.parametrize("method, within_s", [("fork", 1.0), ("forkserver", 1.5)])
def test_sigkilled_job_takes_its_measuring_child_with_it(precision_cell, method, within_s):
    job = _start_job(precision_cell, method, _env(**{FAULT_ENV: "hang"}))
    seen: list[int] = []
    try:
        child, seen = _measuring_child(job, method)
        time.sleep(0.3)  # let it reach the injected hang (its lifeline is armed first)
        assert _alive(child), "the measuring child died before the kill"
        t0 = time.monotonic()
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=10)  # reap it: a zombie job still answers kill(pid, 0)
        took = _gone_within(child, within_s, t0)
        assert took is not None, f"{method}: the measuring child {child} outlived its SIGKILLed job by more than {within_s} s"
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        _kill_leftovers(seen)


# ---------------------------------------------------------------- b. one measurement per GPU across processes


def _run_together(settings: dict, env: dict, n: int = 2) -> list[dict]:
    """Start ``n`` jobs, let them import torch, then release them at once; the first row of each."""
    jobs = [_start_job(settings, "fork", env, wait=True) for _ in range(n)]
    try:
        for job in jobs:
            assert job.stdout.readline().strip() == "ready"
        for job in jobs:
            job.stdin.write("go\n")
            job.stdin.flush()
        outs = [job.communicate(timeout=120)[0] for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
    assert all(job.returncode == 0 for job in jobs), outs
    rows = [json.loads(out.strip().splitlines()[-1])[0] for out in outs]
    assert all(r["status"] == "ok" for r in rows), rows
    return rows


def _interval(row: dict) -> tuple[dt.datetime, dt.datetime]:
    return dt.datetime.fromisoformat(row["started_at"]), dt.datetime.fromisoformat(row["finished_at"])


def test_one_fake_gpu_two_processes_measure_in_turn(precision_cell, tmp_path):
    env = _env(CS336SYS_FAKE_GPUS="fake-0", CS336SYS_LOCK_DIR=str(tmp_path / "locks"), **{FAULT_ENV: "sleep=1.0"})
    first, second = sorted(_run_together(precision_cell, env), key=lambda r: r["started_at"])
    (s1, f1), (s2, f2) = _interval(first), _interval(second)
    assert f1 <= s2, f"the measurements overlapped: {s1}–{f1} and {s2}–{f2}"
    assert first["gpu_uuid"] == second["gpu_uuid"] == "fake-0"
    duration = (f1 - s1).total_seconds()
    assert duration >= 1.0, duration  # the injected sleep is inside the measured interval
    assert second["gpu_wait_s"] > 0.5 * duration, (second["gpu_wait_s"], duration)


def test_two_fake_gpus_two_processes_measure_at_once(precision_cell, tmp_path):
    env = _env(CS336SYS_FAKE_GPUS="fake-0,fake-1", CS336SYS_LOCK_DIR=str(tmp_path / "locks"), **{FAULT_ENV: "sleep=1.0"})
    a, b = _run_together(precision_cell, env)
    (s1, f1), (s2, f2) = _interval(a), _interval(b)
    assert max(s1, s2) < min(f1, f2), f"two GPUs, yet no overlap: {s1}–{f1} and {s2}–{f2}"
    assert {a["gpu_uuid"], b["gpu_uuid"]} == {"fake-0", "fake-1"}
    assert a["gpu_wait_s"] < 0.5 and b["gpu_wait_s"] < 0.5, (a["gpu_wait_s"], b["gpu_wait_s"])


# ---------------------------------------------------------------- c. two workflow runs on one GPU


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.slow
def test_two_workflow_runs_never_measure_at_once(tmp_path):
    root = copy_repo(tmp_path / "repo")
    config, _ = validate_config(load_config(root, DEMO) | {"studies": ["precision"]})
    cells = list(plan.grid("precision", config, BUILT_IN))
    env = {"CS336SYS_FAKE_GPUS": "fake-0", "CS336SYS_LOCK_DIR": str(tmp_path / "locks"), FAULT_ENV: "sleep=0.5"}
    # a temporary a killed job left, and one whose writer (this process) still runs
    cell_dir = root / "results" / "x" / "precision" / "cells"
    cell_dir.mkdir(parents=True)
    stale = cell_dir / f".tmp-{_dead_pid()}-{cells[0]}.csv"
    live = cell_dir / f".tmp-{os.getpid()}-{cells[0]}.csv"
    stale.write_text("half a csv")
    live.write_text("being written")

    def start(run: str) -> subprocess.Popen:
        targets = [f"results/{run}/precision/cells/{cell}.csv" for cell in cells]
        args = ["-m", "snakemake", "--configfile", DEMO, "--config", f"run={run}", "studies=[precision]", "--", *targets]
        full_env = {**{k: v for k, v in os.environ.items() if k not in LOCK_ENVS}, **env}
        return subprocess.Popen(
            [sys.executable, *args], cwd=root, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    runs = [start("x"), start("y")]
    outs = [run.communicate(timeout=600)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs), "\n\n".join(o[-4000:] for o in outs)

    frames = [pd.read_csv(root / "results" / run / "precision" / "cells" / f"{cell}.csv") for run in "xy" for cell in cells]
    assert all((f["status"] == "ok").all() for f in frames)
    intervals = sorted(_interval(f.iloc[0]) for f in frames)
    for (s1, f1), (s2, f2) in zip(intervals, intervals[1:]):
        assert f1 <= s2, f"two cells measured at once: {s1}–{f1} and {s2}–{f2}"
    assert {f["gpu_uuid"].iloc[0] for f in frames} == {"fake-0"}
    assert not stale.exists(), "the job did not remove the temporary its killed predecessor left"
    assert live.exists(), "the job removed a temporary whose writer still runs"


# ---------------------------------------------------------------- the rough edges: temporaries and failure rows

WRITER = """
import sys, time
from cs336sys.fileio import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    tmp.write_text("half")
    print(tmp, flush=True)
    time.sleep(60)
"""


def test_a_write_killed_midway_leaves_a_temporary_the_next_writer_removes(tmp_path):
    target = tmp_path / "cells" / "cell.csv"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        tmp = Path(writer.stdout.readline().strip())
        assert tmp.exists() and tmp.name.startswith(".tmp-") and remove_stale_temps(tmp.parent) == [], "a live writer's file was removed"
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert tmp.exists() and not target.exists()  # the rename never happened: no half CSV under the real name
    assert remove_stale_temps(tmp.parent, "other.csv") == [] and tmp.exists(), "a temporary of another output was removed"
    assert remove_stale_temps(tmp.parent, "cell.csv") == [tmp] and not tmp.exists()


def test_remove_stale_temps_keeps_live_writers_and_other_files(tmp_path):
    dead = _dead_pid()
    files = {
        "stale-a": tmp_path / f".tmp-{dead}-a.csv",
        "stale-b": tmp_path / f".tmp-{dead}-b.csv.gz",
        "mine": tmp_path / f".tmp-{os.getpid()}-a.csv",
        "init": tmp_path / ".tmp-1-a.csv",  # pid 1 always runs
        "not-a-pid": tmp_path / ".tmp-abc-a.csv",
        "output": tmp_path / "a.csv",
    }
    for path in files.values():
        path.write_text("x")
    assert remove_stale_temps(tmp_path, "a.csv") == [files["stale-a"]]
    assert remove_stale_temps(tmp_path) == [files["stale-b"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for k, p in files.items() if not k.startswith("stale"))
    assert remove_stale_temps(tmp_path / "no-such-folder") == []


# measurements run in the (forkserver) child, found there as "test_kill:<name>"
def measure_part_then_hang(device, context, session, **axes):
    context["mode"] = "train"
    time.sleep(60)
    yield {}  # pragma: no cover


def measure_error_at_once(device, context, session, **axes):
    raise RuntimeError("broken before any part")
    yield {}  # pragma: no cover


def _unit_cell(fn: str, axes: dict, timeout_s: float = 60) -> Cell:
    return Cell("unit", "unit=1", axes, f"{__name__}:{fn}", device="cpu", timeout_s=timeout_s)


@pytest.fixture
def no_fault(monkeypatch):
    for name in LOCK_ENVS:
        monkeypatch.delenv(name, raising=False)


def test_failure_before_any_part_has_an_empty_mode_not_nan(no_fault):
    (row,) = run_cell(_unit_cell("measure_error_at_once", {"x": 1}))
    assert row["status"] == "error" and row["mode"] == ""
    frame = pd.DataFrame([row])
    assert frame["mode"].iloc[0] == "" and not frame["mode"].isna().any()


def test_failure_keeps_a_mode_that_is_an_axis(no_fault):
    (row,) = run_cell(_unit_cell("measure_error_at_once", {"mode": "train"}))
    assert row["status"] == "error" and row["mode"] == "train"


def test_timeout_names_the_part_the_child_was_in(no_fault):
    """The child forwards its context as it changes, so a hang or a crash is placed in its part too."""
    (row,) = run_cell(_unit_cell("measure_part_then_hang", {"x": 1}, timeout_s=4))
    assert row["status"] == "timeout" and row["mode"] == "train", row


def test_a_long_part_reports_progress_until_its_time_limit(no_fault):
    heard: list[tuple[dict, float]] = []
    (row,) = run_cell(_unit_cell("measure_part_then_hang", {"x": 1}, timeout_s=12), progress=lambda c, s: heard.append((dict(c), s)))
    assert row["status"] == "timeout" and row["mode"] == "train"
    assert heard and heard[0][0] == {"mode": "train"}  # the part, as soon as it starts
    assert any(s >= 10 for c, s in heard if c == {"mode": "train"}), heard  # and again while it runs
