"""Shared pytest setup: import cs336sys from src/, skip GPU tests without CUDA, keep the fast lane in-process."""

import _posixsubprocess
import contextlib
import multiprocessing.process
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

# One intra-op thread for torch here and in every process a test starts (they inherit the variable):
# the tests' shapes are tiny, and with two threads per process on a loaded two-core machine OpenMP's
# barriers made a tiny model's step 20-80x slower (xdist runs four workers).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Triton picks its interpreter when it decorates a kernel, so TRITON_INTERPRET must be set
# before anything imports triton (torch._dynamo does): on a machine without an NVIDIA driver,
# set it here, first, so the kernel tests run in this session rather than in a subprocess.
if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# run from a checkout without `pip install -e .`
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cs336sys.measure.env import git_commit  # noqa: E402
from other_account import other_user, shared_base  # noqa: E402, F401  (fixtures: the second account of the hostile-user tests)

# What every row carries is read once per process (git's commit, `uname -p` for the CPU's name): read
# here, before any test, so a test of rows in this process starts no git or uname of its own.
git_commit()
platform.processor()

# The fast lane, `pytest -m "not slow"`, leaves out every test that starts processes: a snakemake run or
# dry run, a measuring child, the warm server, a job that is killed, a subprocess; each file marks its own.
# A test not marked slow that starts one fails at once (its fixtures' set-up and tear-down included).
_SPAWNERS = (
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (subprocess, "_fork_exec"),
    (_posixsubprocess, "fork_exec"),  # Popen, and multiprocessing's spawn and forkserver
    (multiprocessing.process.BaseProcess, "start"),  # a forkserver started earlier would fork without us
)


@contextlib.contextmanager
def _no_process_starts(test: str):
    saved = [(owner, name, getattr(owner, name)) for owner, name in _SPAWNERS if hasattr(owner, name)]

    def refuse(what):
        def start(*args, **kwargs):
            pytest.fail(
                f"{test} starts a process ({what}), and the fast lane runs in its own process only: "
                "mark the test @pytest.mark.slow, or make it in-process",
                pytrace=True,
            )

        return start

    for owner, name, _ in saved:
        setattr(owner, name, refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # GPU tests run on the GPU machine only (`-m gpu`), never in the CPU fast lane; Triton's compiler
    # starts ptxas there
    if item.get_closest_marker("slow") is not None or item.get_closest_marker("gpu") is not None:
        yield
        return
    with _no_process_starts(item.nodeid):
        yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def finished_demo(tmp_path_factory):
    """One finished CPU demo for every workflow test of the session, xdist workers included (tests/workflow_helpers.py)."""
    from dataclasses import asdict

    from workflow_helpers import FinishedDemo, once_per_session, result_from
    from workflow_helpers import finished_demo as make

    def build(folder):
        demo = make(folder / "repo")
        return {"root": str(demo.root), "result": None if demo.result is None else asdict(demo.result)}

    shared = once_per_session(tmp_path_factory, "demo", build)
    return FinishedDemo(Path(shared["root"]), result_from(shared["result"]))


@pytest.fixture
def bf16_dot_in_the_interpreter(monkeypatch):
    """Triton's interpreter stores bf16 as uint16 and its tl.dot multiplies those bit patterns
    (its debugging guide: no bf16 arithmetic; triton-lang/triton#11584): upcast tl.dot's bf16
    operands to fp32 first, which is what a GPU's bf16 MMA computes too (exact products, fp32
    sums). Nothing to do where the kernels run compiled."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy as np
    import triton
    from triton.runtime import interpreter

    create_dot = interpreter.InterpreterBuilder.create_dot

    def upcast(x):
        if x.dtype.is_bf16():  # stored as the top 16 bits of an fp32
            return interpreter.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), triton.language.float32)
        return x

    monkeypatch.setattr(
        interpreter.InterpreterBuilder, "create_dot", lambda self, a, b, *rest: create_dot(self, upcast(a), upcast(b), *rest)
    )


@pytest.fixture(scope="module")
def demo_config():
    """The CPU demo's config as the workflow reads it (config.yaml, then the preset), not yet validated."""
    from workflow_helpers import DEMO, REPO, load_config

    return load_config(REPO, DEMO, validated=False)


@pytest.fixture
def cfg(demo_config):
    """A copy of the demo's config that a test may change."""
    import copy

    return copy.deepcopy(demo_config)
