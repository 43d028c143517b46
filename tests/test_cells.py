"""The cell runner: every outcome of a measurement becomes rows with a status; CSVs are written atomically.

The measurement generators below are looked up by the child process as
``"<this module>:<function>"``; the child is forked from the pytest process,
so this module is already imported there.
"""

import dataclasses
import datetime as dt
import faulthandler
import os
import time

import pandas as pd
import pytest
import torch

from cs336sys import rows as row_schema
from cs336sys.columns import TIME_COLUMNS
from cs336sys.fileio import atomic_path, write_text_atomic
from cs336sys.measure.env import environment
from cs336sys.pipeline.cells import FAULT_ENV, Cell, run_cell
from cs336sys.rows import ENV_COLUMNS, Skip, order_columns, rows_to_frame, write_csv_atomic

# ---------------------------------------------------------------- measurements run in the child (module:function targets)


def measure_rows(device, context, session, n=2, tag="x", **axes):
    context["mode"] = "inference"
    for i in range(n):
        yield {"mode": "inference", "i": i, "tag": tag, "device_seen": str(device), "small_sum": int(torch.arange(5).sum())}


def measure_then_oom(device, context, session, **axes):
    context["mode"] = "inference"
    yield {"mode": "inference", "phase": "forward", "median_ms": 1.5}
    context["mode"] = "train"
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nsecond line of the message")


def measure_then_error(device, context, session, **axes):
    context["mode"] = "inference"
    yield {"mode": "inference", "phase": "forward", "median_ms": 1.5}
    context["mode"] = "train"
    raise ValueError("shapes do not match in train step")


def measure_oom_without_message(device, context, session, **axes):
    context["mode"] = "train"
    raise torch.OutOfMemoryError()
    yield  # pragma: no cover - makes this a generator


def measure_skip(device, context, session, **axes):
    raise Skip("needs a feature this machine lacks")
    yield  # pragma: no cover - makes this a generator


def measure_exit_silently(device, context, session, **axes):
    yield {"i": 0}
    os._exit(3)


def measure_threaded_torch(device, context, session, **axes):
    # big enough that ATen and BLAS use their thread pools
    x = torch.randn(256, 256)
    y = (x @ x).sum() + torch.ones(1 << 20).add(1).sum()
    yield {"value": float(y), "threads": torch.get_num_threads()}


def measure_with_parts(device, context, session, **axes):
    with session.part("check"):
        time.sleep(0.3)
    with session.part("timed"):
        time.sleep(0.2)
    yield {"mode": "inference"}


TARGET = __name__ + ":{}"


def make_cell(fn="measure_rows", cell_id="study=t_x=1", timeout_s=60, **kwargs):
    return Cell("unit", cell_id, {"x": 1, "precision": "fp32"}, TARGET.format(fn), kwargs, device="cpu", timeout_s=timeout_s)


@pytest.fixture(autouse=True)
def no_injected_fault(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)


@pytest.fixture
def quiet_faulthandler(request):
    """pytest's faulthandler, inherited by the forked child, would print a traceback dump on SIGABRT."""
    was_enabled = faulthandler.is_enabled()
    faulthandler.disable()
    yield
    if was_enabled:
        try:
            from _pytest.faulthandler import fault_handler_stderr_fd_key

            faulthandler.enable(file=request.config.stash[fault_handler_stderr_fd_key])
        except (ImportError, KeyError):
            faulthandler.enable()


# what every row carries wherever it ran; ENV_COLUMNS adds GPU/host state where there is one
BASE_ENV = [
    "device",
    "device_name",
    "driver_version",
    "torch_version",
    "cuda_version",
    "python_version",
    "git_commit",
    "host",
    "started_at",
]


def test_base_environment_is_what_the_measuring_process_reports():
    assert set(environment(torch.device("cpu"))) == set(BASE_ENV)
    assert [c for c in ENV_COLUMNS if c in BASE_ENV] == BASE_ENV  # the schema names them, in this order


def assert_env_columns(row, device="cpu"):
    for col in BASE_ENV:
        assert col in row, col
    assert row["device"] == device
    assert row["torch_version"] == torch.__version__
    assert row["host"]
    dt.datetime.fromisoformat(row["started_at"])


# ---------------------------------------------------------------- outcomes


@pytest.mark.slow
def test_normal_cell_gives_ok_rows_with_axes_and_environment():
    rows = run_cell(make_cell(n=3, tag="hello"))
    assert len(rows) == 3
    for i, row in enumerate(rows):
        assert row["status"] == "ok" and row["error"] == ""
        assert row["study"] == "unit" and row["cell_id"] == "study=t_x=1" and row["x"] == 1
        assert row["i"] == i and row["tag"] == "hello" and row["device_seen"] == "cpu" and row["small_sum"] == 10
        assert_env_columns(row)
        assert row["device_name"].startswith("cpu")  # measured in the child, not left empty


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault,status,message",
    [
        ("oom", "oom", "out of memory"),
        ("error", "error", "RuntimeError: injected error"),
        ("abort", "error", "signal SIGABRT"),
    ],
)
def test_injected_faults_become_rows(monkeypatch, quiet_faulthandler, fault, status, message):
    monkeypatch.setenv(FAULT_ENV, fault)
    rows = run_cell(make_cell())
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == status
    assert message in row["error"]
    assert row["study"] == "unit" and row["cell_id"] == "study=t_x=1" and row["x"] == 1
    assert_env_columns(row)


@pytest.mark.slow
def test_injected_hang_becomes_timeout(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "hang")
    rows = run_cell(make_cell(timeout_s=2))
    assert [r["status"] for r in rows] == ["timeout"]
    assert "time limit" in rows[0]["error"] and "2" in rows[0]["error"]
    assert_env_columns(rows[0])


@pytest.mark.slow
def test_fault_injection_only_hits_cells_matching_the_substring(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "error:context_length=512")
    hit = run_cell(make_cell(cell_id="size=small_context_length=512_precision=bf16"))
    miss = run_cell(make_cell(cell_id="size=small_context_length=128_precision=bf16"))
    assert [r["status"] for r in hit] == ["error"]
    assert [r["status"] for r in miss] == ["ok", "ok"]


@pytest.mark.slow
def test_skip_raised_by_measurement_becomes_skipped():
    rows = run_cell(make_cell("measure_skip"))
    assert [r["status"] for r in rows] == ["skipped"]
    assert rows[0]["error"] == "needs a feature this machine lacks"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_cuda_cell_on_a_machine_without_cuda_is_skipped_with_the_reason():
    rows = run_cell(dataclasses.replace(make_cell(), device="cuda"))
    assert [r["status"] for r in rows] == ["skipped"]
    assert "CUDA" in rows[0]["error"]
    assert rows[0]["device"] == "cuda"


@pytest.mark.slow
def test_rows_measured_before_an_oom_are_kept_and_the_failure_names_its_part():
    rows = run_cell(make_cell("measure_then_oom"))
    assert [r["status"] for r in rows] == ["ok", "oom"]
    assert rows[0]["median_ms"] == 1.5 and rows[0]["mode"] == "inference"
    assert rows[1]["mode"] == "train"  # copied from the measurement's context
    assert rows[1]["error"] == "CUDA out of memory. Tried to allocate 2.00 GiB"  # first line only
    for row in rows:
        assert row["cell_id"] == "study=t_x=1"
        assert_env_columns(row)


@pytest.mark.slow
def test_oom_without_a_message_is_still_an_oom_row():
    rows = run_cell(make_cell("measure_oom_without_message"))
    assert [r["status"] for r in rows] == ["oom"], rows[-1]["error"]
    assert rows[0]["mode"] == "train"


@pytest.mark.slow
def test_rows_measured_before_an_error_are_kept():
    rows = run_cell(make_cell("measure_then_error"))
    assert [r["status"] for r in rows] == ["ok", "error"]
    assert rows[1]["mode"] == "train"
    assert rows[1]["error"] == "ValueError: shapes do not match in train step"


@pytest.mark.slow
def test_child_exiting_without_reporting_is_an_error_with_its_exit_code():
    rows = run_cell(make_cell("measure_exit_silently"))
    assert [r["status"] for r in rows] == ["ok", "error"]
    assert "exited with code 3" in rows[1]["error"]


@pytest.mark.slow
def test_unimportable_target_is_an_error_row():
    rows = run_cell(dataclasses.replace(make_cell(), target="cs336sys.no_such_module:measure"))
    assert [r["status"] for r in rows] == ["error"]
    assert "no_such_module" in rows[0]["error"]


@pytest.mark.slow
def test_cpu_cell_runs_threaded_torch_work_after_the_parent_used_its_thread_pools():
    """Regression: forking after the parent ran OpenMP-parallel ops deadlocks the child's first parallel op.

    The pytest process (like any parent that touched torch) has used ATen's OpenMP pool;
    the cell must still measure, not hang into a timeout.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the tests run with one thread (conftest): give the parent a pool to break
    try:
        torch.ones(1 << 20).add(1).sum()  # make sure the parent's OpenMP pool exists
        (torch.randn(256, 256) @ torch.randn(256, 256)).sum()
        rows = run_cell(dataclasses.replace(make_cell("measure_threaded_torch", timeout_s=8), threads=2))
    finally:
        torch.set_num_threads(threads)
    assert [r["status"] for r in rows] == ["ok"], rows[-1]["error"]
    assert rows[0]["value"] > 0 and rows[0]["threads"] == 2


@pytest.mark.slow
def test_a_cpu_cell_measures_with_one_thread_unless_told(monkeypatch):
    """Two threads on a loaded two-core machine made a tiny step 20-80x slower: a CPU cell takes one by default."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # what the measuring process would take by itself
    (row,) = run_cell(make_cell("measure_threaded_torch"), start_method="spawn")
    assert row["threads"] == 1
    (row,) = run_cell(dataclasses.replace(make_cell("measure_threaded_torch"), threads=2), start_method="spawn")
    assert row["threads"] == 2


@pytest.mark.slow
def test_rows_split_the_job_wall_time_into_start_up_and_what_the_measurement_did(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "sleep=0.5")  # half a second more start-up, before the measurement begins
    (row,) = run_cell(make_cell("measure_with_parts"), job_started=time.monotonic() - 1.0)  # the job began 1 s before
    assert row["time_check_s"] >= 0.3 and row["time_timed_s"] >= 0.2 and row["time_pairs_s"] == 0.0
    assert row["time_startup_s"] >= 1.5
    assert sum(row[c] for c in TIME_COLUMNS if c != "time_job_s") == pytest.approx(row["time_job_s"], abs=0.01)


# ---------------------------------------------------------------- frames and CSVs


@pytest.mark.slow
def test_rows_to_frame_orders_head_axes_where_measurements_environment():
    rows = run_cell(make_cell(n=1))
    frame = rows_to_frame(rows, axes=["x", "precision"])
    cols = list(frame.columns)
    assert cols[:6] == ["study", "cell_id", "status", "error", "x", "precision"]
    assert cols[6] == "mode"
    env = [c for c in ENV_COLUMNS if c in cols]
    assert set(BASE_ENV) <= set(env)
    assert cols[-len(env) :] == env
    assert set(cols[7 : -len(env)]) == {"i", "tag", "device_seen", "small_sum"}
    assert order_columns(["b", "status", "a", "host", "phase"], axes=["a"]) == ["status", "a", "phase", "b", "host"]


@pytest.mark.slow
def test_frames_with_mixed_statuses_keep_every_row():
    frame = rows_to_frame(run_cell(make_cell("measure_then_oom")), axes=["x"])
    assert list(frame["status"]) == ["ok", "oom"]
    assert pd.isna(frame["median_ms"].iloc[1])


def test_write_csv_atomic_writes_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "deep" / "dir" / "cell.csv"
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    write_csv_atomic(frame, target)
    pd.testing.assert_frame_equal(pd.read_csv(target), frame)
    assert os.listdir(target.parent) == ["cell.csv"]
    write_csv_atomic(frame.assign(a=[3, 4]), target)  # replaces
    assert list(pd.read_csv(target)["a"]) == [3, 4]
    assert os.listdir(target.parent) == ["cell.csv"]


def _failing_to_csv(self, path, *args, **kwargs):
    with open(path, "w") as fh:
        fh.write("a,b\n1,x\n")  # half a CSV that parses fine
    raise OSError("disk full (simulated)")


def test_write_csv_atomic_failure_leaves_no_file_when_there_was_none(tmp_path, monkeypatch):
    monkeypatch.setattr(pd.DataFrame, "to_csv", _failing_to_csv)
    target = tmp_path / "cell.csv"
    with pytest.raises(OSError, match="disk full"):
        write_csv_atomic(pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}), target)
    assert not target.exists()
    assert os.listdir(tmp_path) == []


def test_write_csv_atomic_failure_keeps_the_old_content(tmp_path, monkeypatch):
    target = tmp_path / "cell.csv"
    target.write_text("a,b\n7,old\n8,old\n")
    monkeypatch.setattr(pd.DataFrame, "to_csv", _failing_to_csv)
    with pytest.raises(OSError):
        write_csv_atomic(pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}), target)
    assert target.read_text() == "a,b\n7,old\n8,old\n"
    assert os.listdir(tmp_path) == ["cell.csv"]


def test_statuses_are_the_documented_six():
    assert row_schema.STATUSES == ("ok", "oom", "error", "timeout", "skipped", "wrong")
    assert [str(s) for s in row_schema.Status] == list(row_schema.STATUSES)


def test_write_text_atomic_keeps_the_suffix_of_its_temporary_and_leaves_none(tmp_path):
    seen = []
    with atomic_path(tmp_path / "sub" / "trace.json.gz") as tmp:
        seen.append(tmp)
        tmp.write_bytes(b"x")
        assert tmp.name.startswith(".") and tmp.name.endswith(".json.gz")  # hidden from globs; torch picks gzip by suffix
    assert (tmp_path / "sub" / "trace.json.gz").read_bytes() == b"x" and not seen[0].exists()
    assert write_text_atomic(tmp_path / "a.md", "hello") == tmp_path / "a.md"
    assert (tmp_path / "a.md").read_text() == "hello"
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "a.md") as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert (tmp_path / "a.md").read_text() == "hello"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "sub"]
