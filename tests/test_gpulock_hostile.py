"""The host-wide GPU lock against another account on the host, and what the rows say about it.

Run as root, a second account made here with ``useradd`` plays the other user (forked children
that drop to its uid), so that root's powers hide nothing.

a. A shared lock directory or lock file that is not safe (another user's directory, one others can
   write without the sticky bit, a symlink, FIFO, directory or hard link at the lock path) is refused
   with a message naming the path and its owner; no file we did not create is ever chmodded,
   truncated or written through a link. This account's own lock still holds the GPU, and the rows
   say that it kept this account's runs apart only, and why.
b. The wait for a busy GPU names the holder in the log every few seconds, and counts against the
   cell's time limit: a wait past it is a ``timeout`` row that names the holder.
c. Every row says whether its cell held a GPU lock (``gpu_lock``: held / none: <reason>).
d. Rows count the jobs of other runs that ran beside their measurement (``concurrent_jobs``,
   ``concurrent_runs``).
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cs336sys.pipeline import gpulock, gpus, lockdirs
from cs336sys.pipeline.cells import FAULT_ENV, Cell, run_cell
from cs336sys.pipeline.gpulock import GpuId
from other_account import fork_as

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = str(Path(__file__).resolve().parent)
TARGET = __name__ + ":{}"
PRECIOUS = "precious contents\n"


# ---------------------------------------------------------------- the measurement the cells run (in the child)


def measure_sleep(device, context, session, s=0.0, marker=None, **axes):
    context["mode"] = "inference"
    if marker:
        Path(marker).touch()  # tells the test the measurement is under way
    time.sleep(s)
    yield {"mode": "inference", "slept_s": s}


def make_cell(s=0.0, timeout_s=60.0, device="cpu", marker=None):
    return Cell("unit", "x=1", {"x": 1}, TARGET.format("measure_sleep"), {"s": s, "marker": marker}, device=device, timeout_s=timeout_s)


# ---------------------------------------------------------------- the other account, and files to attack


def as_user(user: pwd.struct_passwd, fn, *args) -> None:
    """Run ``fn(*args)`` as ``user`` (:func:`other_account.fork_as`) and fail if it raises."""
    _, status = os.waitpid(fork_as(user, fn, *args), 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"{fn.__name__} as {user.pw_name} failed"


@pytest.fixture
def victim(tmp_path):
    """A file of root's that no one else can read or write."""
    path = tmp_path / "victim.txt"
    path.write_text(PRECIOUS)
    path.chmod(0o600)
    return path


def assert_untouched(victim: Path) -> None:
    st = victim.stat()
    assert victim.read_text() == PRECIOUS, "the victim file was written through the lock"
    assert stat.S_IMODE(st.st_mode) == 0o600, f"the victim file was chmodded to {oct(stat.S_IMODE(st.st_mode))}"
    assert st.st_uid == 0


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0")
    monkeypatch.delenv(FAULT_ENV, raising=False)


def use_locks(monkeypatch, path: Path) -> Path:
    monkeypatch.setenv("CS336SYS_LOCK_DIR", str(path))
    return path


def shared_locks(monkeypatch, path: Path) -> Path:
    """:func:`use_locks`, the directory made as a job makes it (root's here, sticky and world-writable)."""
    use_locks(monkeypatch, path)
    made, fd = lockdirs.open_shared_dir()
    os.close(fd)
    return made


def try_acquire(**kwargs) -> BaseException | None:
    try:
        with gpulock.acquire_gpu(timeout_s=1.0, poll_s=0.05, **kwargs):
            pass
    except Exception as exc:  # noqa: BLE001 - the test looks at what came out
        return exc
    return None


def assert_refused(outcome: BaseException | None, *words: str) -> None:
    refused = getattr(gpulock, "LockRefused", None)
    assert refused is not None and isinstance(outcome, refused), f"not refused: {outcome!r}"
    for word in words:
        assert word in str(outcome), (word, str(outcome))


def held_alone(*words: str) -> None:
    """The GPU is held by this account's own lock alone, and the lease says why the shared one is not."""
    with gpulock.acquire_gpu(timeout_s=1.0, poll_s=0.05) as lease:
        assert lease.note.startswith("held: this account's runs only ("), lease.note
        for word in words:
            assert word in lease.note, (word, lease.note)


# ---------------------------------------------------------------- a. nothing another user can turn against you


def _mkdir_open(path: str) -> None:
    os.mkdir(path)
    os.chmod(path, 0o777)


def _plant_symlink(target: str, link: str) -> None:
    os.symlink(target, link)


@pytest.mark.slow
def test_lock_dir_made_first_by_another_user_is_refused(other_user, shared_base, victim, fake_gpu, monkeypatch):
    # After a reboot the attacker creates the lock directory first and points <uuid>.lock at a root file.
    locks = use_locks(monkeypatch, shared_base / "locks")
    as_user(other_user, _mkdir_open, str(locks))
    as_user(other_user, _plant_symlink, str(victim), str(locks / "fake-0.lock"))
    held_alone(str(locks), other_user.pw_name)
    assert_untouched(victim)


@pytest.mark.slow
def test_lock_dir_that_is_a_symlink_is_refused(other_user, shared_base, tmp_path, fake_gpu, monkeypatch):
    # ... or points the lock directory itself at a directory of root's
    target = tmp_path / "roots-dir"
    target.mkdir()
    locks = use_locks(monkeypatch, shared_base / "locks")
    as_user(other_user, _plant_symlink, str(target), str(locks))
    held_alone(str(locks), "symbolic link", other_user.pw_name)
    assert list(target.iterdir()) == [], "a lock file was made in the directory the symlink points to"


@pytest.mark.slow
def test_symlink_in_the_shared_sticky_dir_is_refused(other_user, shared_base, victim, fake_gpu, monkeypatch):
    # The directory is root's and sticky (as we make it), but fs.protected_symlinks may be 0 (it is here).
    locks = shared_locks(monkeypatch, shared_base / "locks")
    assert locks.stat().st_uid == 0 and stat.S_IMODE(locks.stat().st_mode) == 0o1777
    as_user(other_user, _plant_symlink, str(victim), str(locks / "fake-0.lock"))
    held_alone(str(locks / "fake-0.lock"), "symbolic link", other_user.pw_name)
    assert_untouched(victim)


def _plant_fifo(path: str) -> None:
    os.mkfifo(path, 0o666)


def _plant_dir(path: str) -> None:
    os.mkdir(path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "directory", "hard link"])
def test_a_lock_path_that_is_no_plain_file_is_refused(kind, other_user, shared_base, victim, fake_gpu, monkeypatch):
    locks = shared_locks(monkeypatch, shared_base / "locks")
    path = locks / "fake-0.lock"
    if kind == "fifo":
        as_user(other_user, _plant_fifo, str(path))
    elif kind == "directory":
        as_user(other_user, _plant_dir, str(path))
    else:  # what an attacker could do where fs.protected_hardlinks is 0: a second name for a root file
        os.link(victim, path)
    t0 = time.monotonic()
    held_alone(str(path), kind)
    assert time.monotonic() - t0 < 5
    assert_untouched(victim)


def _make_private_lock_file(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)


@pytest.mark.slow
def test_another_users_lock_file_is_locked_but_never_chmodded(other_user, shared_base, fake_gpu, monkeypatch):
    locks = shared_locks(monkeypatch, shared_base / "locks")
    path = locks / "fake-0.lock"
    as_user(other_user, _make_private_lock_file, str(path))
    with gpulock.acquire_gpu(timeout_s=1.0) as lease:
        assert lease.uuid == "fake-0"
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o644, oct(stat.S_IMODE(st.st_mode))
    assert st.st_uid == other_user.pw_uid


def _acquire_as_other(locks: str, holder_pid: int, out: str) -> None:
    os.environ["CS336SYS_LOCK_DIR"] = locks
    try:
        with gpulock.acquire_gpu(timeout_s=0.3, poll_s=0.05):
            raise AssertionError("acquired a GPU that root holds")
    except TimeoutError as exc:
        assert f"pid {holder_pid}" in str(exc), str(exc)
    Path(out).write_text("waited")


def _acquire_free_as_other(locks: str) -> None:
    os.environ["CS336SYS_LOCK_DIR"] = locks
    with gpulock.acquire_gpu(timeout_s=1.0) as lease:
        assert json.loads(lease.path.read_text())["pid"] == os.getpid()  # the holder record is ours


@pytest.mark.slow
def test_two_users_share_one_lock(other_user, shared_base, fake_gpu, monkeypatch):
    locks = use_locks(monkeypatch, shared_base / "locks")
    out = shared_base / "out"
    with gpulock.acquire_gpu() as lease:
        assert stat.S_IMODE(lease.path.stat().st_mode) == 0o666  # created by us, so others can record after us
        as_user(other_user, _acquire_as_other, str(locks), os.getpid(), str(out))
    assert out.read_text() == "waited"
    as_user(other_user, _acquire_free_as_other, str(locks))


def test_our_dir_writable_by_others_without_sticky_bit_is_refused(tmp_path, fake_gpu, monkeypatch):
    locks = use_locks(monkeypatch, tmp_path / "locks")
    locks.mkdir()
    locks.chmod(0o777)  # anyone could rename our lock file away and put another in its place
    held_alone(str(locks), "sticky")


def test_lock_path_with_a_slash_is_refused(tmp_path, monkeypatch):
    use_locks(monkeypatch, tmp_path / "locks")
    assert_refused(try_acquire(gpus=[GpuId(0, "../escape")]), "../escape")


@pytest.mark.slow
def test_a_refused_shared_lock_leaves_the_cell_this_accounts_lock_and_says_so(
    other_user, shared_base, victim, fake_gpu, monkeypatch, capfd
):
    locks = use_locks(monkeypatch, shared_base / "locks")
    as_user(other_user, _mkdir_open, str(locks))
    as_user(other_user, _plant_symlink, str(victim), str(locks / "fake-0.lock"))
    (row,) = run_cell(make_cell(), run="mine")
    assert_untouched(victim)
    assert row["status"] == "ok" and row["gpu_uuid"] == "fake-0", row
    note = row["gpu_lock"]
    assert note.startswith("held: this account's runs only (") and str(locks) in note and other_user.pw_name in note, note
    assert str(locks) in capfd.readouterr().err  # and the job's log says so too


# ---------------------------------------------------------------- b. a bounded wait that names the holder

HOLDER = """
import pathlib, sys, time
from cs336sys.pipeline.gpulock import acquire_gpu
with acquire_gpu():
    pathlib.Path(sys.argv[1]).touch()
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def holder(tmp_path, fake_gpu, monkeypatch):
    """Start a process that holds fake-0 for ``hold_s`` seconds; returns it once it holds."""
    use_locks(monkeypatch, tmp_path / "locks")
    procs = []

    def start(hold_s: float) -> subprocess.Popen:
        ready = tmp_path / f"held{len(procs)}"
        env = {**os.environ, "PYTHONPATH": SRC}
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(ready), str(hold_s)], env=env)
        procs.append(proc)
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.slow
def test_the_wait_names_the_holder_in_the_log_every_few_seconds(holder, monkeypatch, capfd):
    monkeypatch.setattr(gpulock, "WAIT_LOG_EVERY_S", 0.5, raising=False)
    proc = holder(30)
    with pytest.raises(TimeoutError, match=rf"pid {proc.pid}\b"):
        with gpulock.acquire_gpu(timeout_s=1.7, poll_s=0.05):
            pass
    lines = [line for line in capfd.readouterr().err.splitlines() if f"pid {proc.pid}" in line]
    assert len(lines) >= 3, lines  # at 0, 0.5, 1.0 and 1.5 s
    assert all("fake-0" in line and "waiting" in line for line in lines), lines


@pytest.mark.slow
def test_the_cells_time_limit_bounds_the_wait_for_the_gpu(holder):
    proc = holder(8)
    t0 = time.monotonic()
    (row,) = run_cell(make_cell(timeout_s=2.0))
    took = time.monotonic() - t0
    assert row["status"] == "timeout", row
    assert f"pid {proc.pid}" in row["error"] and "fake-0" in row["error"], row["error"]
    assert row["gpu_wait_s"] >= 1.9 and took < 6, (row["gpu_wait_s"], took)
    assert row["gpu_lock"].startswith("none: "), row["gpu_lock"]
    assert row["mode"] == ""  # no part started: the whole cell's failure


@pytest.mark.slow
def test_the_wait_counts_against_the_time_limit(holder):
    holder(1.5)
    t0 = time.monotonic()
    rows = run_cell(make_cell(s=2.5, timeout_s=3.0))  # 1.5 s queued + 2.5 s measuring > 3 s
    took = time.monotonic() - t0
    assert rows[-1]["status"] == "timeout", rows
    assert "waiting" in rows[-1]["error"], rows[-1]["error"]
    assert rows[-1]["gpu_wait_s"] >= 1.0 and rows[-1]["gpu_lock"] == "held"
    # the cell alone fits its limit, so a timeout says the wait was counted; how soon the kill came after the
    # limit is the machine's load (10.8 s on a loaded 2-core runner), not a behaviour to assert
    assert took >= 3.0, took


# ---------------------------------------------------------------- c. rows say whether they held a lock


@pytest.fixture
def real_gpus(monkeypatch, tmp_path):
    """No fake GPUs; NVML and nvidia-smi answer what the test says."""
    monkeypatch.delenv("CS336SYS_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(FAULT_ENV, raising=False)
    use_locks(monkeypatch, tmp_path / "locks")

    def answer(nvml, smi=None):
        monkeypatch.setattr(gpus, "_nvml_gpus", lambda: nvml)
        monkeypatch.setattr(gpus, "_smi_gpus", lambda: smi)

    return answer


@pytest.mark.slow
def test_rows_say_when_no_gpu_could_be_listed(real_gpus):
    real_gpus(None, None)
    rows = run_cell(make_cell(device="cuda"))  # skipped on a machine without CUDA, measured on one with
    assert {r["gpu_lock"] for r in rows} == {"none: no GPU could be listed (NVML and nvidia-smi failed)"}


@pytest.mark.slow
def test_rows_say_when_the_gpu_is_a_mig_slice(real_gpus, monkeypatch):
    real_gpus([GpuId(0, "GPU-aaaa-1111")])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5c1d-2222")
    rows = run_cell(make_cell(device="cuda"))
    assert all(r["gpu_lock"].startswith("none: MIG device") for r in rows), rows[0]["gpu_lock"]


def test_find_gpus_gives_the_reason_for_an_empty_list(real_gpus, monkeypatch):
    real_gpus([GpuId(0, "GPU-aaaa-1111")])
    assert gpus.find_gpus() == ([GpuId(0, "GPU-aaaa-1111")], "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    found, reason = gpus.find_gpus()
    assert found == [] and "CUDA_VISIBLE_DEVICES" in reason and "'7'" in reason
    real_gpus(None, [])
    assert gpus.find_gpus()[1].startswith("no GPU on this host")
    assert gpulock.visible_gpus() == []


@pytest.mark.slow
def test_rows_say_held_or_cpu_cell(real_gpus, monkeypatch):
    real_gpus(None, None)
    (row,) = run_cell(make_cell(device="cpu"))
    assert row["gpu_lock"] == "none: cpu cell"
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0")
    (row,) = run_cell(make_cell(device="cpu"))
    assert row["gpu_lock"] == "held" and row["gpu_uuid"] == "fake-0"


# ---------------------------------------------------------------- d. jobs of other runs beside a measurement

OTHER_RUN = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from cs336sys.pipeline.cells import run_cell
from test_gpulock_hostile import make_cell
rows = run_cell(make_cell(s=float(sys.argv[3]), marker=sys.argv[4]), start_method="fork")
print(json.dumps(rows, default=str))
"""

# A job that only registers (another run's merge, say), or that waits for a GPU the whole time.
BARE_JOB = """
import pathlib, sys, time
from cs336sys.pipeline import hostjobs
while len(sys.argv) > 4 and not pathlib.Path(sys.argv[4]).exists():  # start only once that file is there
    time.sleep(0.01)
with hostjobs.register_job() as job:
    job.state(sys.argv[2])
    pathlib.Path(sys.argv[1]).touch()
    time.sleep(float(sys.argv[3]))
"""


def _wait_for(path: Path, proc: subprocess.Popen, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.slow
def test_rows_count_the_jobs_of_another_run_beside_them(tmp_path, monkeypatch):
    # two runs in two directories on one host with two (fake) GPUs: both measure at once
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0,fake-1")
    monkeypatch.delenv(FAULT_ENV, raising=False)
    use_locks(monkeypatch, tmp_path / "locks")
    run_a, run_b = tmp_path / "run-a", tmp_path / "run-b"
    run_a.mkdir()
    run_b.mkdir()
    marker = tmp_path / "b-measuring"
    env = {**os.environ, "PYTHONPATH": SRC}
    cmd = [sys.executable, "-c", OTHER_RUN, SRC, TESTS, "4.0", str(marker)]
    other = subprocess.Popen(cmd, cwd=run_b, env=env, stdout=subprocess.PIPE, text=True)
    try:
        _wait_for(marker, other)
        monkeypatch.chdir(run_a)
        (a,) = run_cell(make_cell(s=1.0))
        out, _ = other.communicate(timeout=60)
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
    (b,) = json.loads(out.strip().splitlines()[-1])
    assert a["status"] == b["status"] == "ok"
    assert {a["gpu_uuid"], b["gpu_uuid"]} == {"fake-0", "fake-1"} and a["gpu_lock"] == b["gpu_lock"] == "held"
    assert a["concurrent_jobs"] == 1 and str(run_b) in a["concurrent_runs"], a
    assert b["concurrent_jobs"] == 1 and str(run_a) in b["concurrent_runs"], b


@pytest.mark.slow
def test_jobs_of_the_same_run_or_only_waiting_are_not_counted(tmp_path, fake_gpu, monkeypatch):
    use_locks(monkeypatch, tmp_path / "locks")
    run_a, run_b = tmp_path / "run-a", tmp_path / "run-b"
    run_a.mkdir()
    run_b.mkdir()
    env = {**os.environ, "PYTHONPATH": SRC}
    procs = []
    try:
        # a job of this run (same directory), busy; a job of another run that waits for a GPU throughout
        for cwd, state in ((run_a, "running"), (run_b, "waiting")):
            ready = tmp_path / f"ready-{state}"
            procs.append(subprocess.Popen([sys.executable, "-c", BARE_JOB, str(ready), state, "30"], cwd=cwd, env=env))
            _wait_for(ready, procs[-1])
        monkeypatch.chdir(run_a)
        (alone,) = run_cell(make_cell(s=1.2))
        assert alone["concurrent_jobs"] == 0, alone
        # and a job of the other run that starts while we measure is counted, even if it then waits
        late, measuring = tmp_path / "ready-late", tmp_path / "a-measuring"
        args = [sys.executable, "-c", BARE_JOB, str(late), "waiting", "30", str(measuring)]
        procs.append(subprocess.Popen(args, cwd=run_b, env=env))
        (beside,) = run_cell(make_cell(s=3.0, marker=str(measuring)))
        assert late.exists()
        assert beside["concurrent_jobs"] == 1 and str(run_b) in beside["concurrent_runs"], beside
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _plant_registry_traps(locks: str, victim: str) -> None:
    os.mkfifo(os.path.join(locks, "job-evil-1.json"), 0o666)
    os.symlink(victim, os.path.join(locks, "job-evil-2.json"))
    os.mkdir(os.path.join(locks, "job-evil-3.json"))


@pytest.mark.slow
def test_planted_job_records_are_ignored(other_user, shared_base, victim, fake_gpu, monkeypatch):
    locks = shared_locks(monkeypatch, shared_base / "locks")
    as_user(other_user, _plant_registry_traps, str(locks), str(victim))
    t0 = time.monotonic()
    (row,) = run_cell(make_cell(s=0.5))
    assert time.monotonic() - t0 < 15
    assert_untouched(victim)
    assert row["status"] == "ok" and row["gpu_lock"] == "held" and row["concurrent_jobs"] == 0, row


@pytest.mark.slow
def test_a_killed_jobs_record_is_not_counted_and_is_cleaned_up(tmp_path, monkeypatch):
    from cs336sys.pipeline import hostjobs

    locks = use_locks(monkeypatch, tmp_path / "locks")
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": SRC}
    job = subprocess.Popen([sys.executable, "-c", BARE_JOB, str(ready), "running", "30"], cwd=tmp_path, env=env)
    try:
        _wait_for(ready, job)
        own = Path(f"{locks}-{os.geteuid()}")  # this account's own lock directory (pipeline.lockdirs)
        (record,) = own.glob("job-*.json")
        watch = hostjobs.ConcurrencyWatch(run="elsewhere")
        assert watch.columns()["concurrent_jobs"] == 1  # alive and busy: counted
    finally:
        job.kill()  # SIGKILL: no chance to remove its record
        job.wait()
    assert record.exists()
    watch = hostjobs.ConcurrencyWatch(run="elsewhere")
    assert watch.columns() == {"concurrent_jobs": 0, "concurrent_runs": ""}  # nobody holds its flock: a dead job's
    with hostjobs.register_job() as mine:
        assert not record.exists()  # our own user's stale record, removed when we register
        assert [p.name for p in own.glob("job-*.json")] == [mine.name]
    assert list(own.glob("job-*")) == [] and list(own.glob(".job-*")) == []
