"""Content hashes of the source files a job runs, so reruns follow content, not mtimes.

A cell's Snakemake params carry ``code_hash(files)`` of exactly the modules
its measurement executes (see ``studies.Study.sources``); a fresh checkout or
a ``touch`` leaves the hash, and so the cell, alone.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

PACKAGE_DIR = Path(__file__).resolve().parent

# Modules every measuring process runs, whatever the study.
CELL_RUNTIME = ("cells.py", "env.py", "timing.py", "memory.py", "dtypes.py", "flops.py", "annotate.py", "sizes.py")


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def code_hash(files: Iterable[str | Path]) -> str:
    """One hash over the contents (and names) of ``files``; bare names are modules of cs336sys/."""
    digest = hashlib.sha256()
    for name in sorted(set(map(str, files))):
        path = Path(name) if Path(name).is_absolute() else PACKAGE_DIR / name
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
