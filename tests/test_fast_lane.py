"""The fast lane runs in its own process: a test not marked slow that starts one fails, naming itself (conftest.py)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
from types import SimpleNamespace

import pytest

import conftest


@pytest.mark.parametrize(
    "start",
    [
        lambda: subprocess.run(["true"]),
        lambda: os.fork(),
        lambda: os.posix_spawn("/bin/true", ["true"], {}),
        lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    ],
    ids=["subprocess", "fork", "posix_spawn", "multiprocessing"],
)
def test_a_process_start_fails_the_test_and_says_what_to_do(start):
    before = os.fork  # (this test is itself guarded: the guard restores what it found)
    with conftest._no_process_starts("tests/test_x.py::test_y"):
        with pytest.raises(pytest.fail.Exception, match=r"test_y starts a process .*mark the test @pytest.mark.slow"):
            start()
    assert os.fork is before


def _protocol(marker, name_of_marker="slow"):
    item = SimpleNamespace(nodeid="t", get_closest_marker=lambda name: marker if name == name_of_marker else None)
    hook = conftest.pytest_runtest_protocol(item, None)
    next(hook)  # the test runs here
    return hook


def test_only_tests_not_marked_slow_are_guarded():
    before = os.fork
    fast = _protocol(None)
    assert os.fork is not before  # refused while a fast test runs
    with pytest.raises(StopIteration):
        next(fast)
    assert os.fork is before
    slow = _protocol(pytest.mark.slow)
    assert os.fork is before
    with pytest.raises(StopIteration):
        next(slow)


def test_gpu_tests_are_not_guarded_they_run_on_the_gpu_machine_only():
    before = os.fork  # Triton's compiler starts ptxas there: a guarded GPU test failed on the H200
    gpu = _protocol(pytest.mark.gpu, "gpu")
    assert os.fork is before
    with pytest.raises(StopIteration):
        next(gpu)
