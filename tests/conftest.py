"""Shared pytest setup: import cs336sys from src/, skip GPU tests without CUDA."""

import os
import shutil
import sys
from pathlib import Path

# Triton picks its interpreter when it decorates a kernel, so TRITON_INTERPRET must be set
# before anything imports triton (torch._dynamo does): on a machine without an NVIDIA driver,
# set it here, first, so the kernel tests run in this session rather than in a subprocess.
if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# run from a checkout without `pip install -e .`
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
