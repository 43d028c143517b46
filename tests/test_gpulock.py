"""The host-wide GPU lock, with fake GPUs: exclusion, concurrency, no stale locks."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cs336sys.pipeline import gpulock, gpus, lockdirs
from cs336sys.pipeline.gpulock import GpuId, GpuLease

SRC = str(Path(__file__).resolve().parents[1] / "src")

# A holder: waits for the go file (so all start together), acquires, records when it held
# the GPU, holds it HOLD seconds, releases.
HOLDER = """
import json, os, sys, time
from cs336sys.pipeline.gpulock import acquire_gpu
go, out, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
while not os.path.exists(go):
    time.sleep(0.005)
asked = time.monotonic()
with acquire_gpu(poll_s=0.02) as lease:
    start = time.monotonic()
    time.sleep(hold)
    end = time.monotonic()
    row = dict(pid=os.getpid(), uuid=lease.uuid, waited_s=lease.waited_s, asked=asked, start=start, end=end)
with open(out, "w") as f:
    json.dump(row, f)
"""


def _env(tmp_path, fake):
    return {**os.environ, "PYTHONPATH": SRC, "CS336SYS_LOCK_DIR": str(tmp_path / "locks"), "CS336SYS_FAKE_GPUS": fake}


def _run_holders(tmp_path, fake, n, hold=0.5):
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", HOLDER, str(go), str(tmp_path / f"out{i}.json"), str(hold)], env=_env(tmp_path, fake))
        for i in range(n)
    ]
    time.sleep(1.0)  # let every interpreter start and reach the go loop
    go.touch()
    for p in procs:
        assert p.wait(timeout=30) == 0
    return sorted((json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(n)), key=lambda r: r["start"])


def _max_overlap(rows):
    events = sorted([(r["start"], 1) for r in rows] + [(r["end"], -1) for r in rows])
    held = peak = 0
    for _, step in events:
        held += step
        peak = max(peak, held)
    return peak


@pytest.fixture
def lock_env(tmp_path, monkeypatch):
    monkeypatch.setenv("CS336SYS_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0")
    return tmp_path


@pytest.mark.slow
def test_one_gpu_two_processes_take_turns(tmp_path):
    first, second = _run_holders(tmp_path, "fake-0", 2)
    assert first["end"] <= second["start"]
    assert first["uuid"] == second["uuid"] == "fake-0"
    # the second waited for the rest of the first's hold, no more
    assert second["waited_s"] > 0.3
    assert second["waited_s"] == pytest.approx(first["end"] - second["asked"], abs=0.15)
    assert first["waited_s"] < 0.15


@pytest.mark.slow
def test_two_gpus_two_processes_run_at_once(tmp_path):
    a, b = _run_holders(tmp_path, "fake-0,fake-1", 2)
    assert {a["uuid"], b["uuid"]} == {"fake-0", "fake-1"}
    assert b["start"] < a["end"]  # overlapping intervals
    assert a["waited_s"] < 0.2 and b["waited_s"] < 0.2


@pytest.mark.slow
def test_three_processes_two_gpus(tmp_path):
    rows = _run_holders(tmp_path, "fake-0,fake-1", 3)
    assert _max_overlap(rows) == 2  # both GPUs used at once, never a third holder
    for uuid in ("fake-0", "fake-1"):
        assert _max_overlap([r for r in rows if r["uuid"] == uuid]) <= 1
    # the last to start waited for one of the first two to finish and says how long; not a wall-time bound
    # (under load the third interpreter may reach the go line late and wait less than the hold)
    third, freed = rows[2], min(rows[0]["end"], rows[1]["end"])
    assert third["start"] >= freed
    assert third["waited_s"] == pytest.approx(third["start"] - third["asked"], abs=0.05)


def _start_holder_forever(tmp_path):
    ready = tmp_path / "held"
    code = (
        "import sys, time, pathlib\nfrom cs336sys.pipeline.gpulock import acquire_gpu\n"
        "with acquire_gpu():\n    pathlib.Path(sys.argv[1]).touch()\n    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(ready)], env=_env(tmp_path, "fake-0"))
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    return proc


@pytest.mark.slow
def test_timeout_names_holder_and_sigkilled_holder_leaves_no_stale_lock(lock_env):
    proc = _start_holder_forever(lock_env)
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=rf"fake-0.*pid {proc.pid}\b"):
            with gpulock.acquire_gpu(timeout_s=0.3, poll_s=0.05):
                pass
        assert time.monotonic() - t0 < 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        with gpulock.acquire_gpu(timeout_s=1.0, poll_s=0.05) as lease:
            assert lease.uuid == "fake-0"
            assert lease.waited_s < 0.2
            # the record now names us, not the dead holder
            assert json.loads(lease.path.read_text())["pid"] == os.getpid()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_same_process_second_acquire_waits(lock_env):
    # flock conflicts between two open files even in one process: a lease is exclusive
    with gpulock.acquire_gpu() as lease:
        with pytest.raises(TimeoutError):
            with gpulock.acquire_gpu(timeout_s=0.1, poll_s=0.02):
                pass
    assert lease.path.read_text() == ""  # the record is cleared on release
    with gpulock.acquire_gpu(timeout_s=0.1):
        pass


def _shared_dir() -> Path:
    path, fd = lockdirs.open_shared_dir()
    os.close(fd)
    return path


def test_lock_dir_is_created_shared(tmp_path, monkeypatch):
    target = tmp_path / "a" / "locks"
    monkeypatch.setenv("CS336SYS_LOCK_DIR", str(target))
    assert _shared_dir() == target
    assert target.stat().st_mode & 0o7777 == 0o1777
    monkeypatch.delenv("CS336SYS_LOCK_DIR")
    assert str(_shared_dir()) == lockdirs.DEFAULT_LOCK_DIR


def test_no_gpus_is_an_error(lock_env):
    with pytest.raises(RuntimeError, match="no visible GPU"):
        with gpulock.acquire_gpu([]):
            pass


def test_visible_gpus_fake(monkeypatch):
    monkeypatch.setenv("CS336SYS_FAKE_GPUS", "fake-0, fake-1")
    assert gpulock.visible_gpus() == [GpuId(0, "fake-0"), GpuId(1, "fake-1")]


def test_cuda_visible_devices_selection():
    host = [GpuId(0, "GPU-aaaa-1111"), GpuId(1, "GPU-bbbb-2222"), GpuId(2, "GPU-abcd-3333")]
    sel = gpus._select_visible
    assert sel(host, None) == host
    assert sel(host, "") == []
    assert sel(host, "-1") == []
    assert sel(host, "2,0") == [host[2], host[0]]
    assert sel(host, "GPU-bbbb-2222") == [host[1]]
    assert sel(host, "bbbb,GPU-abc") == [host[1], host[2]]
    assert sel(host, "1,7,0") == [host[1]]  # like CUDA: the list ends at the first unknown entry
    assert sel(host, "GPU-a") == []  # ambiguous prefix
    assert sel(host, "0,0") == [host[0]]


def test_pin_environment_and_columns(tmp_path):
    fake = GpuLease(1, "fake-1", 0.25, tmp_path / "fake-1.lock")
    assert gpulock.pin_environment(fake) == {"CUDA_VISIBLE_DEVICES": "1", "CS336SYS_GPU_INDEX": "1", "CS336SYS_GPU_UUID": "fake-1"}
    real = GpuLease(3, "GPU-0b5c1e7a-1234", 0.0, tmp_path / "x.lock")
    env = gpulock.pin_environment(real)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0b5c1e7a-1234"
    assert env["CS336SYS_GPU_INDEX"] == "3"
    assert gpulock.lease_columns(fake) == {"gpu_index": 1, "gpu_uuid": "fake-1", "gpu_wait_s": 0.25}


def test_a_cell_holds_its_gpus_share_of_the_cores():
    from cs336sys.pipeline.jobs import cell_threads

    assert cell_threads(4, 1) == 4  # one GPU: every core, nothing beside a measurement
    assert cell_threads(8, 2) == 4 and cell_threads(2, 4) == 1  # N GPUs: N cells at once
    assert cell_threads(4, None) == 1 and cell_threads(None, 1) == 1  # no limit given: one
    assert cell_threads(16, 1, local=False) == 1  # a cluster job holds one
