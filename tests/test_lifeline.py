"""The measuring child dies with its job."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cs336sys.pipeline import lifeline

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC}

# A job: forks a child that arms the lifeline (ARM is the call) and sleeps, writes the
# child's pid, then sleeps itself until it is killed.
JOB = """
import os, sys, time
from cs336sys.pipeline import lifeline
parent = os.getpid()
pid = os.fork()
if pid == 0:
    {arm}
    time.sleep(60)
    os._exit(0)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(pid))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    """Running, not merely an unreaped zombie (an orphan's reaper may be slow or absent)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))
    return state not in ("Z", "X")


def _wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return not _alive(pid)


def _wait_file(path: Path, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 20
    while not path.exists():
        assert proc.poll() is None, "the job died early"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return int(path.read_text())


def _orphan_dies_with_job(tmp_path, arm: str, within_s: float) -> bool:
    pidfile = tmp_path / "child.pid"
    job = subprocess.Popen([sys.executable, "-c", JOB.format(arm=arm), str(pidfile)], env=ENV)
    child = _wait_file(pidfile, job)
    try:
        time.sleep(0.2)  # let the child arm itself
        assert _alive(child)
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=10)
        return _wait_gone(child, within_s)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_child_dies_when_job_is_sigkilled(tmp_path):
    assert _orphan_dies_with_job(tmp_path, "lifeline.die_with_parent(parent)", within_s=1.0)


@pytest.mark.slow
def test_without_lifeline_the_orphan_survives(tmp_path):
    # the control: what the test above would see without die_with_parent
    assert not _orphan_dies_with_job(tmp_path, "pass", within_s=1.0)


@pytest.mark.slow
def test_watchdog_fallback(tmp_path):
    # the non-Linux path (polls getppid every 0.5 s), exercised here
    assert _orphan_dies_with_job(tmp_path, "lifeline._start_watchdog(parent)", within_s=1.5)


@pytest.mark.slow
def test_parent_already_gone_exits_at_once():
    # parent_pid is not our parent: as if it died between fork and prctl
    code = "from cs336sys.pipeline import lifeline; lifeline.die_with_parent(1); import time; time.sleep(30)"
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], env=ENV, timeout=20)
    assert done.returncode == 1
    assert time.monotonic() - t0 < 10


@pytest.mark.slow
def test_started_at_is_when_the_process_started_on_the_monotonic_clock():
    before = time.monotonic()
    proc = subprocess.Popen(["sleep", "5"])
    after = time.monotonic()
    try:
        started = lifeline.started_at(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert started is not None and before - 0.05 <= started <= after + 0.05  # /proc counts in 10 ms ticks
    assert lifeline.started_at(os.getpid()) < before
    assert lifeline.started_at(2**22 + 12345) is None  # no such process
