"""A non-editable install works on its own: no file it reads may live outside the package.

An editable install (what ``./run`` makes) reads the checkout, so a library that opens
``<checkout>/workflow/...`` passes every other test and fails for a user who ran ``pip install .``.
Here a wheel is built from a copy of the sources, installed into a fresh venv, and the CLI run from
an unrelated directory, so that neither the checkout's ``src/`` nor the editable install's path
can stand in for the installed copy.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from workflow_helpers import REPO

pytestmark = pytest.mark.slow

# what pyproject.toml needs to build: the package, its readme and its licence
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "src")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")


def _run(args: list, cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _install(root: Path) -> tuple[Path, dict[str, str], Path]:
    """A venv holding a non-editable cs336sys: (its bin/, the environment to run it in, a neutral cwd)."""
    tree, venv, cwd = root / "tree", root / "venv", root / "elsewhere"
    cwd.mkdir()
    tree.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, tree / name, ignore=IGNORE)
        else:
            shutil.copy2(REPO / name, tree / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_NO_INDEX"] = "1"  # offline: the build uses this interpreter's setuptools, the venv gets no dependencies
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    # Build with this interpreter (it has setuptools), as `pip install --no-build-isolation .` would.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", root / "dist", tree], cwd, env)
    (wheel,) = (root / "dist").glob("cs336sys-*.whl")
    _run([sys.executable, "-m", "venv", venv], cwd, env)  # its pip comes from ensurepip: offline
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    _run([bin_dir / "python", "-m", "pip", "install", "--no-deps", wheel], cwd, env)

    # The dependencies (torch, snakemake, ...) from this interpreter's site-packages, added AFTER the install
    # so that pip never sees the editable cs336sys there. A plain path line in a .pth does not run the .pth
    # files of that directory, so the editable install's path to the checkout's src/ is not added.
    purelib = _run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd, env).stdout.strip()
    (Path(purelib) / "zz_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return bin_dir, env, cwd


# one test, not three: under xdist each worker would build and install its own copy
def test_pip_install_runs_the_cli_from_its_own_copy(tmp_path):
    bin_dir, env, cwd = _install(tmp_path)
    where = _run([bin_dir / "python", "-c", "import cs336sys; print(cs336sys.__file__)"], cwd, env).stdout.strip()
    assert Path(where).is_relative_to(bin_dir.parent), f"imported {where}, not the venv's copy"

    assert "usage" in _run([bin_dir / "cs336sys", "--help"], cwd, env).stdout
    assert "usage" in _run([bin_dir / "cs336sys", "e2e", "--help"], cwd, env).stdout
    code = "from cs336sys.pipeline.config import load_schema; print(sorted(load_schema()['properties']))"
    assert "'e2e'" in _run([bin_dir / "python", "-c", code], cwd, env).stdout
    # the HTML report's captions of a study's figures ship with the study (package data, like schema.yaml)
    code = (
        "from cs336sys.runs.captions import caption_file, figure_caption; print(caption_file('e2e')); print(figure_caption('e2e', 'mfu'))"
    )
    path, caption = _run([bin_dir / "python", "-c", code], cwd, env).stdout.split("\n", 1)
    assert Path(path).is_relative_to(bin_dir.parent) and "Look at" in caption, f"{path}: {caption!r}"
