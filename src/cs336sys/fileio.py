"""Atomic file writes: every output is written under a temporary name beside it, then renamed.

A killed job (Snakemake, the OOM killer, SLURM) then leaves either the old file
or the new one, never a half-written CSV that looks complete to the next run.
Used by every layer, so it depends on nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; rename it over ``path`` on success.

    The temporary name keeps ``path``'s suffixes (torch picks gzip from ``.gz``)
    and starts with a dot, so globs such as ``*.csv`` never see it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)
