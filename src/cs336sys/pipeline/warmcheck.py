"""What the warm worker (``pipeline.warm``) checks before it trusts a directory, a file, a peer or a request.

GPU boxes are shared (a lab server, a course cluster's login node, a cloud VM with several
accounts), and a warm server runs as its user, often root, with that user's environment. So:

- The warm directory (``$CS336SYS_WARM_DIR`` or /tmp/cs336sys-warm-<uid>) must be a real
  directory (not a symlink), owned by us, that no one else can write (it is then made
  0700), in a parent that only its owner (us or root) can write or that is sticky.
  Otherwise another account could read our requests, answer them ("ok" with no CSV, or
  never), or point our lock and log files at files of ours.
- The lock and log files in it are opened without following symlinks, created 0600, and
  must be regular files of ours.
- Both ends ask the kernel who is at the other end (``SO_PEERCRED``): a job talks only to
  a server of its own uid; a server serves only its own uid, and only the pid that
  connected (the pid it watches). Without ``SO_PEERCRED`` (not Linux) jobs measure themselves.
- A server takes from a request only what a cell needs: the environment variables that
  cells read (``PASSED_ENV``; PATH, LD_PRELOAD, PYTHON*, HOME... stay the server's own,
  which its key covers), output, log and artifact paths inside the job's working directory
  (no ``..``, no symlink out), a cell whose every field has its type (``Cell.from_params``) and
  whose target is a registered study's measurement, a finite time limit; the request itself within
  ``REQUEST_TIMEOUT_S`` and ``MAX_REQUEST_BYTES``.

Anything else raises :class:`Refused`, whose message names the path or the peer and its
owner; the job then runs the cell itself.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import pwd
import socket
import stat
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cs336sys.pipeline.hostjobs import run_name

DIR_ENV = "CS336SYS_WARM_DIR"
REQUEST_TIMEOUT_S = 5.0  # a job sends its request as soon as it connects
MAX_REQUEST_BYTES = 1 << 20
# Variables that differ from job to job but not what the server imports: one server serves them all.
PER_JOB_ENV = ("SLURM_", "SNAKEMAKE_", "OLDPWD", "PWD", "SHLVL", "_")
# What a cell reads from its job's environment (our switches, the GPU pinning, the compilers'
# caches and logs, the allocator, threads, the cluster's job), matched as prefixes. Everything
# else (PATH, LD_PRELOAD, PYTHON*, HOME, ...) the handler keeps from the server's own environment.
PASSED_ENV = (
    "CS336SYS_",
    "CUDA_",
    "TRITON_",
    "TORCHINDUCTOR_",
    "TORCH_",
    "PYTORCH_",
    "NCCL_",
    "SLURM_",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Refused(RuntimeError):
    """The warm worker is not safe to use as found; the job runs its cell itself."""


# --- both sides: the directory, its files, the peer -------------------------------------------
def user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def warm_dir() -> Path:
    """This user's directory of warm servers: created 0700, or checked to be ours and private (else :class:`Refused`)."""
    path = Path(os.environ.get(DIR_ENV) or f"/tmp/cs336sys-warm-{os.getuid()}").absolute()
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    _check_private_dir(path)
    return path


def _check_private_dir(path: Path) -> None:
    me = os.getuid()
    parent = os.stat(path.parent)
    open_to_others = parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not parent.st_mode & stat.S_ISVTX
    if parent.st_uid not in (me, 0) or open_to_others:  # its writer could swap our directory for theirs
        raise Refused(
            f"the warm worker's directory {path} sits in {path.parent} (owner {user_name(parent.st_uid)}, mode "
            f"{stat.S_IMODE(parent.st_mode):04o}), which another account can write; set {DIR_ENV} to a directory of yours"
        )
    st = os.lstat(path)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != me:
        problem = f"belongs to another account (not {user_name(me)})"
    elif mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"has mode {mode:04o}: other accounts can write in it (it must be 0700)"
    else:
        if mode & 0o077:  # ours, and no one else could write in it: make it private (a plain mkdir gives 0755)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                if os.fstat(fd).st_ino == st.st_ino:
                    os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        return
    raise Refused(f"the warm worker's directory {path} {problem}; its owner: {user_name(st.st_uid)}; remove it or set {DIR_ENV}")


def passed_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that a job hands to the server (``PASSED_ENV``)."""
    return {k: v for k, v in environ.items() if k.startswith(PASSED_ENV)}


def check_platform() -> None:
    if not hasattr(socket, "SO_PEERCRED"):
        raise Refused("the warm worker checks who is at the other end of its socket with SO_PEERCRED, which this platform lacks")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket, from the kernel."""
    check_platform()
    return _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))


def open_private(path: Path, flags: int) -> int:
    """Open (or create, 0600) a file of ours in the warm directory: never through a symlink, never a FIFO or a device."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(f"{path} is a symbolic link; the warm worker never follows one (remove it)") from exc
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise Refused(f"{path} is not a regular file of {user_name(os.getuid())} (its owner: {user_name(st.st_uid)}); remove it")
    return fd


# --- the server's side: a request ------------------------------------------------------------
def _read_request(conn: socket.socket) -> dict[str, Any]:
    deadline, data = time.monotonic() + REQUEST_TIMEOUT_S, b""
    while not data.endswith(b"\n"):
        conn.settimeout(max(deadline - time.monotonic(), 1e-3))
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            raise Refused(f"no complete request within {REQUEST_TIMEOUT_S:g} s") from None
        if not chunk:
            raise Refused("the job closed the connection before its request was complete")
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            raise Refused(f"a request of more than {MAX_REQUEST_BYTES} bytes")
    try:
        request = json.loads(data)
    except ValueError as exc:
        raise Refused(f"a request that is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise Refused("a request that is not a JSON object")
    return request


def _inside(root: Path, given: str, what: str) -> str:
    """``given`` (relative to ``root`` or absolute) as it is, where it stays inside ``root`` once resolved; else :class:`Refused`.

    Kept as given: the rows record artifact paths as the job named them, and a job run in-process names them alike.
    """
    path = Path(given)
    if ".." in path.parts:
        raise Refused(f"the job's {what} path {given!r} contains '..'")
    full = (root / path).resolve()
    if not full.is_relative_to(root):
        raise Refused(f"the job's {what} path {given!r} is outside its working directory {root} (symlinks followed: {full})")
    return given


def _checked_cell(params: Any, root: Path) -> dict[str, Any]:
    """The request's cell params, each field checked (``Cell.from_params``), its target a study's measurement, its artifacts
    inside the job's directory."""
    from cs336sys.pipeline.cell import Cell
    from cs336sys.studies import STUDIES

    try:
        cell = Cell.from_params(params)
    except ValueError as exc:
        raise Refused(f"the request's cell: {exc}") from None
    study = STUDIES.get(cell.study)
    if study is None or cell.target != study.measure:
        raise Refused(f"the cell's target {cell.target!r} is not the measurement of a study (study {cell.study!r})")
    artifacts = cell.settings.get("artifact_dir")
    if artifacts is not None:  # the measuring child writes its traces there
        if not isinstance(artifacts, str):
            raise Refused(f"the cell's artifact_dir {artifacts!r} is not a path")
        params = {**params, "settings": {**cell.settings, "artifact_dir": _inside(root, artifacts, "artifact")}}
    return dict(params)


def job_environ(own: Mapping[str, str], requested: Mapping[str, Any]) -> dict[str, str]:
    """A handler's environment: the server's own, but the variables a cell reads (``PASSED_ENV``) as the job has them."""
    env = {k: v for k, v in own.items() if not k.startswith(PASSED_ENV) and not k.startswith(PER_JOB_ENV)}
    for name, value in requested.items():
        if name.startswith(PASSED_ENV) and isinstance(value, str) and "=" not in name and "\0" not in name + value:
            env[name] = value
    return env


def checked_request(conn: socket.socket) -> tuple[int, dict[str, Any]]:
    """The connecting job's pid and its request, reduced to what a cell needs; :class:`Refused` otherwise."""
    pid, uid, _ = peer_credentials(conn)
    request = _read_request(conn)  # first, bounded: closing on an unread request would reset the connection
    if uid != os.getuid():
        raise Refused(f"the connecting process runs as {user_name(uid)}; this server serves {user_name(os.getuid())} only")
    try:
        if int(request["pid"]) != pid:
            raise Refused(f"the request names pid {request['pid']} but comes from pid {pid}")
        cwd = Path(request["cwd"])
        if not cwd.is_absolute() or not cwd.is_dir():
            raise Refused(f"the job's working directory {request['cwd']!r} is not an absolute path of a directory")
        root = cwd.resolve()
        timeout_s = float(request["timeout_s"])
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise Refused(f"the cell's time limit {request['timeout_s']!r} is not a positive number of seconds")
        env = request["env"]
        if not isinstance(env, dict):
            raise Refused("the request's env is not a mapping")
        passes = request.get("passes", 1)
        if not (isinstance(passes, int) and not isinstance(passes, bool) and 1 <= passes <= 20):
            raise Refused(f"the study's passes {passes!r} are not a whole number from 1 to 20")
        return pid, {
            "cell": _checked_cell(request["cell"], root),
            "timeout_s": timeout_s,
            "passes": passes,
            "output": _inside(root, request["output"], "output"),
            "log": _inside(root, request["log"], "log"),
            "cwd": str(root),
            "env": {**job_environ(os.environ, env), "PWD": str(root)},
            "run": run_name(request.get("run")),  # it names the job's run in other jobs' rows
            "replace": request.get("replace") is True,
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused(f"a malformed request ({type(exc).__name__}: {exc})") from None
