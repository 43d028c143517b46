"""The CI and GPU-machine scripts refuse a folder another account could have made first.

ci/local-slurm.sh runs as root and writes pid files, logs and state into SLURM_LOCAL_DIR; it used to
default to /tmp/slurm-local, where another account could plant symlinks for root to follow.
ci/gpu-run.sh installed the wheelhouse into /tmp/site and kept bytecode in /tmp/pycache.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _slurm_status(folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_LOCAL_DIR": str(folder)}
    return subprocess.run(["bash", str(REPO / "ci" / "local-slurm.sh"), "status"], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true", reason="ci/local-slurm.sh runs as root only")
@pytest.mark.parametrize("make", ["writable", "symlink"])
def test_local_slurm_refuses_a_state_folder_others_could_have_made(tmp_path, make):
    target = tmp_path / "slurm-local"
    if make == "writable":
        target.mkdir()
        target.chmod(0o777)
    else:
        target.symlink_to("/etc")
    out = _slurm_status(target)
    assert out.returncode == 1 and f"{target} is not root's own private folder" in out.stderr, out.stderr


@pytest.mark.slow
def test_gpu_run_keeps_its_packages_and_bytecode_out_of_tmp(tmp_path):
    (tmp_path / ".whl").mkdir()
    # an install already done for this (empty) wheel set: the script's stamp, so no pip runs here
    stamp = hashlib.md5(b"").hexdigest()[:12]
    site = tmp_path / "cache" / "cs336sys-gpu" / "site"
    site.mkdir(parents=True)
    (site / f".installed-{stamp}").touch()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"} | {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    script = REPO / "ci" / "gpu-run.sh"
    show = ["bash", str(script), "bash", "-c", 'echo "$PYTHONPATH|$PYTHONPYCACHEPREFIX"']
    out = subprocess.run(show, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    site, cache = out.stdout.strip().split("|")
    assert site.startswith(f"{tmp_path}/cache/cs336sys-gpu/site:") and cache == f"{tmp_path}/cache/cs336sys-gpu/pycache"
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o777)
    (tmp_path / "cache2").mkdir()
    (tmp_path / "cache2" / "cs336sys-gpu").symlink_to(planted)
    env = {**env, "XDG_CACHE_HOME": str(tmp_path / "cache2")}
    refused = subprocess.run(["bash", str(script), "true"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "is not this account's own folder" in refused.stderr
