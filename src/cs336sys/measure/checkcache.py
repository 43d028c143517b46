"""The correctness check's verdicts, kept so that the cells of one shape class check their implementation once.

A verdict (``ok``, or ``wrong`` with its message) is keyed by what decides it: the implementation's
code -- its catalog line and the modules it runs, with the checker's own (``provenance``), and a
plug-in's files (``plugins.cell_files``), as a cell's rerun hash covers them -- the shape class
(the check's shape, causal flag, activation, whether the backward is checked), the precision, and
the device kind and library versions it ran on. An edited kernel changes the key: it is checked
again, as its cells are measured again. Only the small-shape check is kept; the check of each
cell's timed output runs every time.

The verdicts live in ``<cache_dir>/checks`` (the run's ``cache_dir``, which the measuring child
names in :data:`cs336sys.measure.CACHE_DIR_ENV`), one JSON file per key, written atomically
(``fileio``). The folder must be a directory of this account that no one else may write to, never
a link: another account that made it first could plant an ``ok`` for a wrong kernel. A refused
folder, a missing or unreadable verdict only means the check runs again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import torch

from cs336sys import catalog, plugins
from cs336sys.fileio import write_text_atomic
from cs336sys.measure import CACHE_DIR_ENV
from cs336sys.provenance import module_closure, modules_hash

CHECKER = "cs336sys.measure.correctness"
MAX_BYTES = 1 << 16  # a verdict is a few hundred bytes; anything larger is not one of ours


def implementation_hash(impl: str) -> str:
    """The hash of the code that answers for ``impl``: its catalog line, its module and what that imports, the
    checker and its reference, and a plug-in's files."""
    line = catalog.lookup(impl)
    ours = modules_hash(module_closure([line.module, CHECKER]), (impl,))
    if line.family != "user":
        return ours
    options = dict(line.options)
    section = {"path": options["path"], "attention": {impl: {"function": options["function"], "form": options["form"]}}}
    return f"{ours}+{plugins.files_hash(plugins.cell_files(section), options['path'])}"


def _device_kind(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}{' (TRITON_INTERPRET=1)' if os.environ.get('TRITON_INTERPRET') == '1' else ''}"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def verdict_key(
    impl: str, shape: tuple[int, ...], precision: str, causal: bool, activation: str, backward: bool, device: torch.device
) -> dict[str, Any]:
    return {
        "impl": impl,
        "code": implementation_hash(impl),
        "shape": list(shape),
        "precision": precision,
        "causal": bool(causal),
        "activation": activation,
        "backward": bool(backward),
        "device": _device_kind(device),
        "torch": torch.__version__,
        "triton": _version("triton"),
    }


def _warn(message: str) -> None:
    print(f"cs336sys: {message}; the correctness check runs again for every cell", file=sys.stderr, flush=True)


def folder() -> Path | None:
    """``<cache_dir>/checks``, made if missing; None where no cache_dir is set or the folder is not safely ours."""
    root = os.environ.get(CACHE_DIR_ENV)
    if not root:
        return None
    path = Path(root) / "checks"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = os.lstat(path)
    except OSError as exc:
        _warn(f"cannot make the verdict folder {path}: {exc.strerror or exc}")
        return None
    problem = _unsafe(st)
    if problem:
        _warn(f"the verdict folder {path} {problem}: its verdicts are neither read nor written")
        return None
    return path


def _unsafe(st: os.stat_result) -> str:
    """Why a folder with this ``lstat`` is not safely ours; "" where it is."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to this account (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by other accounts (mode {stat.filemode(st.st_mode)})"
    return ""


def _name(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32] + ".json"


def read(where: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The verdict stored for ``key``; None where there is none or it is not a regular file of ours holding that key."""
    try:
        fd = os.open(where / _name(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        try:
            data = f.read(MAX_BYTES + 1)
            found = json.loads(data) if len(data) <= MAX_BYTES else None
        except (OSError, ValueError):
            return None
    ok = isinstance(found, dict) and found.get("key") == key and found.get("verdict") in ("ok", "wrong")
    return found if ok and isinstance(found.get("message", ""), str) else None


def write(where: Path, key: dict[str, Any], verdict: str, message: str = "") -> None:
    try:
        write_text_atomic(where / _name(key), json.dumps({"key": key, "verdict": verdict, "message": message}, indent=1) + "\n")
    except OSError as exc:
        _warn(f"cannot keep the verdict in {where}: {exc}")
