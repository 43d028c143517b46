"""The environment every row carries: what ran where, and when."""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path

import torch

# Where git is looked for: root-owned directories only, never a job's PATH (a warm worker's handler,
# running as its server's user, computes the rows' commit: a `git` found through PATH runs as that user).
GIT_PATH = "/usr/bin:/bin:/usr/local/bin"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The checkout's commit (``+dirty`` when the tree has changes), or '' outside git.

    ``CS336SYS_GIT_COMMIT`` names it where the tree was copied without ``.git``
    (e.g. to a GPU machine). git comes from ``GIT_PATH``, and ``GIT_*`` variables are
    dropped, so the commit is always that of the checkout this module lives in.
    """
    if os.environ.get("CS336SYS_GIT_COMMIT"):
        return os.environ["CS336SYS_GIT_COMMIT"]
    root = Path(__file__).resolve().parent
    git = shutil.which("git", path=GIT_PATH)
    if git is None:
        return ""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | {"PATH": GIT_PATH}
    try:
        sha = subprocess.run([git, "rev-parse", "--short=12", "HEAD"], cwd=root, env=env, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return ""
        # --no-optional-locks: never take the index lock from under the user's own git
        status = [git, "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"]
        dirty = subprocess.run(status, cwd=root, env=env, capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.lru_cache(maxsize=1)
def driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def environment(device: torch.device) -> dict[str, str]:
    """Columns describing the machine and software; read in the measuring process."""
    return {
        "device": device.type,
        "device_name": device_name(device),
        "driver_version": driver_version() if device.type == "cuda" else "",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "python_version": platform.python_version(),
        "git_commit": git_commit(),
        "host": socket.gethostname(),
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
    }


def pick_device(requested: str) -> torch.device:
    """``cuda`` / ``cpu`` / ``auto`` → a device; asking for CUDA without one raises."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA was requested but no CUDA device is available")
    return torch.device(requested)
