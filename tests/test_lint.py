"""The code stays formatted and lint-clean: ruff (check and format) and snakefmt, as configured in pyproject.toml."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("args", [("check", "src", "tests"), ("format", "--check", "src", "tests")], ids=["check", "format"])
def test_ruff(args):
    proc = _run(sys.executable, "-m", "ruff", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_snakefmt():
    exe = shutil.which("snakefmt") or str(Path(sys.executable).with_name("snakefmt"))
    proc = _run(exe, "--check", "Snakefile", "workflow/rules")
    assert proc.returncode == 0, proc.stdout + proc.stderr
