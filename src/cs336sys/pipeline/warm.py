"""A warm worker: one process per host that has imported torch once and forks a fresh job per cell.

A cell job used to pay a Python start-up and ``import torch`` (4.5-7.7 s measured on the H100
hosts) before measuring for a few seconds. Here the job script is a thin client that
imports nothing heavy: it sends the cell to a long-lived server over a Unix socket and
waits. The server has imported torch and the cell runner but never initialised CUDA,
so it may fork; for each request it forks a handler that takes the job's environment,
working directory and log, and runs the one cell runner exactly as a job would
(``run_cell``: GPU lease, a measuring child forked from the handler, every failure a
row) and writes the cell's CSV. Each cell still gets a fresh process and a fresh CUDA
context; what it no longer pays is the interpreter and the imports. The handler and
its child watch the job's pid: a killed job stops its measurement and writes nothing.

The first job starts the server (under a spawn lock, so concurrent jobs start one);
the server exits after ``CS336SYS_WARM_IDLE_S`` seconds (default 60) without requests.
A server serves one (Python, source tree, environment) only: the socket's name is a
hash of the interpreter, every ``cs336sys`` source file and the environment, so an
edited module or a changed variable gets a new server and never stale code. Where the
server cannot start, the job runs the cell itself (``run_job``), as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1]  # src/cs336sys
IDLE_ENV = "CS336SYS_WARM_IDLE_S"
DIR_ENV = "CS336SYS_WARM_DIR"
START_TIMEOUT_S = 180.0
# Variables that differ from job to job but not what the server imports: one server serves them all.
PER_JOB_ENV = ("SLURM_", "SNAKEMAKE_", "OLDPWD", "PWD", "SHLVL", "_")  # a cold disk can take a minute to import torch


def warm_dir() -> Path:
    path = Path(os.environ.get(DIR_ENV) or f"/tmp/cs336sys-warm-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def server_key(environ: dict[str, str] | None = None) -> str:
    """Hash of what the server's imports depend on: interpreter, source files, environment."""
    h = hashlib.sha256(sys.executable.encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(str(path.relative_to(PACKAGE)).encode())
        h.update(path.read_bytes())
    env = os.environ if environ is None else environ
    for name in sorted(env):
        if not name.startswith(PER_JOB_ENV):  # the handler takes each job's own anyway
            h.update(f"{name}={env[name]}\0".encode())
    return h.hexdigest()[:16]


def socket_path(key: str | None = None) -> Path:
    return warm_dir() / f"{key or server_key()}.sock"


# --- the job's side: no torch, no pandas ----------------------------------------------------
def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def _start_server(path: Path, log: Path) -> socket.socket | None:
    """Connect to the server at ``path``, starting it first if none answers."""
    sock = _connect(path)
    if sock is not None:
        return sock
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one job starts the server; the others wait here, then connect
        sock = _connect(path)
        if sock is not None:
            return sock
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead server's socket
        with open(log, "a") as out:
            server = subprocess.Popen(
                [sys.executable, "-m", "cs336sys.pipeline.warm", str(path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")]))},
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and server.poll() is None:
            sock = _connect(path)
            if sock is not None:
                return sock
            time.sleep(0.05)
    return None


def request_cell(request: dict[str, Any]) -> dict[str, Any] | None:
    """Have the warm server run one cell job; its reply, or None where no server could be had."""
    path = socket_path()
    sock = _start_server(path, path.with_suffix(".log"))
    if sock is None:
        return None
    with sock:
        sock.sendall(json.dumps({**request, "env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid()}).encode() + b"\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    if not reply:  # a server that died, or shut down with our connection still queued
        print(f"the warm server ({path}) closed the connection without a reply; the job runs the cell itself", file=sys.stderr)
        return None
    return json.loads(reply)


def run_job(cell: dict[str, Any], timeout_s: float, output: str, log: str, warm: bool = True) -> str:
    """One cell job: the cell's CSV at ``output``, its log at ``log``; returns a one-line summary.

    With ``warm``, the warm server runs it; otherwise (or where no server starts) this
    process does, paying the imports itself.
    """
    request = {"cell": cell, "timeout_s": timeout_s, "output": str(output), "log": str(log)}
    reply = request_cell(request) if warm else None
    if reply is None:
        return _job(request)
    if not reply.get("ok"):
        raise RuntimeError(f"the warm server failed to run the job:\n{reply.get('error')}")
    return reply["summary"]


# --- the server's side ----------------------------------------------------------------------
def _job(request: dict[str, Any], owner_pid: int | None = None) -> str:
    from cs336sys.fileio import remove_stale_temps
    from cs336sys.pipeline.cells import Cell, run_cell
    from cs336sys.pipeline.jobs import log_to
    from cs336sys.pipeline.lifeline import pid_alive
    from cs336sys.pipeline.rows import rows_to_frame, write_csv_atomic

    with log_to(request["log"]):
        out = Path(request["output"])
        for stale in remove_stale_temps(out.parent, out.name):  # a half-written CSV of a killed earlier job
            print(f"removed {stale} (its writer is gone)")
        cell = Cell(**request["cell"], timeout_s=request["timeout_s"])
        rows = run_cell(cell, start_method="fork", owner_pid=owner_pid)  # nothing here has run torch
        if owner_pid is not None and not pid_alive(owner_pid):
            raise RuntimeError("the job is gone; its cell's CSV is not written")
        write_csv_atomic(rows_to_frame(rows, cell.axes), out)
        summary = f"{cell.cell_id}: " + ", ".join(sorted({r["status"] for r in rows}))
        print(summary)
    return summary


def _handle(conn: socket.socket) -> None:
    import traceback

    conn.setblocking(True)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    request = json.loads(data)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    try:
        reply = {"ok": True, "summary": _job(request, owner_pid=int(request["pid"]))}
    except BaseException:  # the job must hear of it, whatever it was
        reply = {"ok": False, "error": traceback.format_exc()}
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(reply).encode())


# What a measuring child would otherwise import on first use, in every cell: torch imports
# torch._dynamo (with sympy: about 900 modules) lazily at a first backward or optimizer step, the
# busy share needs the profiler, the Triton studies triton. Measured on the H100 host, whose
# torch has no bytecode cache, that was 3-9 s of every cell. None of them initialises CUDA.
PRELOAD = ("torch._dynamo", "torch.profiler", "triton")


def preload() -> list[str]:
    """Import, once and before any fork, what every measuring child would import itself; the failures."""
    import gc
    import importlib

    from cs336sys.studies import STUDIES

    failed = []
    for name in (*PRELOAD, *sorted({s.measure.partition(":")[0] for s in STUDIES.values()})):
        try:
            importlib.import_module(name)
        except Exception as exc:  # e.g. no triton on this platform: the cell that needs it says so
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    from cs336sys.measure.env import driver_version

    driver_version()  # nvidia-smi once (no CUDA), not once per cell: the children inherit its cache
    gc.collect()
    gc.freeze()  # the children's collections skip all of it (gc.collect was 0.3 s a call over it)
    return failed


def serve(path: Path, idle_s: float) -> None:
    """Accept cell jobs on ``path`` and run each in a forked handler until idle for ``idle_s``."""
    import torch  # the import every cell used to pay; CUDA stays uninitialised

    import cs336sys.pipeline.cells  # noqa: F401
    import cs336sys.pipeline.rows  # noqa: F401  (pandas)

    for failure in preload():
        print(f"not preloaded: {failure}", flush=True)
    if torch.cuda.is_initialized():  # a forked child could not use the GPU: say so instead of failing every cell
        raise RuntimeError("CUDA was initialised while preloading; the warm server cannot fork measuring children")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    inode = os.stat(path).st_ino
    server.listen(64)
    server.settimeout(1.0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"warm server {os.getpid()} on {path}, idle limit {idle_s:g} s", flush=True)
    handlers: set[int] = set()
    last = time.monotonic()
    try:
        while handlers or time.monotonic() - last < idle_s:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                conn = None
            for pid in list(handlers):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    handlers.discard(pid)
                    last = time.monotonic()
            if conn is not None:
                handlers.add(_fork_handler(server, conn))
                last = time.monotonic()
    finally:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == inode:  # not a newer server's socket
                path.unlink()  # first: no new job connects to a server that is going
        server.setblocking(False)
        while True:  # jobs that connected just before: serve them, do not drop them
            try:
                conn, _ = server.accept()
            except OSError:
                break
            _fork_handler(server, conn)
        server.close()


def _fork_handler(server: socket.socket, conn: socket.socket) -> int:
    pid = os.fork()
    if pid == 0:
        server.close()
        try:
            _handle(conn)
        finally:
            os._exit(0)
    conn.close()
    return pid


if __name__ == "__main__":
    serve(Path(sys.argv[1]), float(os.environ.get(IDLE_ENV, "60")))
