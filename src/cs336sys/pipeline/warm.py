"""A warm worker: one process per host that has imported torch once and forks a fresh job per cell.

A cell job used to pay a Python start-up and ``import torch`` (4.5-7.7 s measured on the H100
hosts) before measuring for a few seconds. Here the job script is a thin client that
imports nothing heavy: it sends the cell to a long-lived server over a Unix socket and
waits. The server has imported torch and the cell runner but never initialised CUDA,
so it may fork; for each request it forks a handler that takes the job's working
directory, log and the environment variables a cell reads, and runs the one cell runner
exactly as a job would (``run_cell``: GPU lease, a measuring child forked from the
handler, every failure a row) and writes the cell's CSV. Each cell still gets a fresh
process and a fresh CUDA context; what it no longer pays is the interpreter and the
imports. The handler and its child watch the job's pid: a killed job stops its
measurement and writes nothing.

The first job starts the server (under a spawn lock, so concurrent jobs start one);
the server exits after ``CS336SYS_WARM_IDLE_S`` seconds (default 60) without requests.
A server serves one (Python, checkout, source tree, environment) only: the socket's name
is a hash of the interpreter, the source tree's path and every ``cs336sys`` source file,
and the environment, so an edited module or a changed variable gets a new server and
never stale code, and a second checkout gets its own server, whose rows carry that
checkout's commit (git itself runs from root-owned directories only: ``measure.env``).
Where the server cannot start, the job runs the cell itself (``run_job``), as before.

Nothing another account could have placed or sent is trusted (``pipeline.warmcheck``): the
warm directory must be ours and private, its files are never opened through a symlink,
both ends check the other's uid (``SO_PEERCRED``), and a server takes from a request only
what a cell needs. What fails a check is refused with a message naming the path or peer
and its owner, and the job runs the cell itself. Every wait is bounded: connecting
(``CONNECT_TIMEOUT_S``); the server's word that it took the job (``ACCEPT_TIMEOUT_S``,
else the job runs the cell itself); its reply after that (the cell's time limit, which
covers the wait for a GPU too, plus ``REPLY_MARGIN_S``; else the job fails, and the
handler, which watches its pid, stops too); the server reading a request
(``warmcheck.REQUEST_TIMEOUT_S``).
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

from cs336sys.pipeline.keeprows import RowsKept, replacing
from cs336sys.pipeline.warmcheck import (
    DIR_ENV,
    PER_JOB_ENV,
    Refused,
    check_platform,
    checked_request,
    open_private,
    passed_env,
    peer_credentials,
    user_name,
    warm_dir,
)

__all__ = ["DIR_ENV", "IDLE_ENV", "Refused", "request_cell", "run_job", "serve", "server_key", "socket_path", "warm_dir"]

PACKAGE = Path(__file__).resolve().parents[1]  # src/cs336sys
IDLE_ENV = "CS336SYS_WARM_IDLE_S"
START_TIMEOUT_S = 180.0  # a cold disk can take a minute to import torch
CONNECT_TIMEOUT_S = 10.0  # a live server accepts at once; a full backlog is a busy server
ACCEPT_TIMEOUT_S = 30.0  # the server's handler says it took the job as soon as it checked the request
REPLY_MARGIN_S = 60.0  # after the cell's time limit (GPU wait and measurement): the CSV written, the child reaped


def server_key(environ: dict[str, str] | None = None) -> str:
    """Hash of what a server runs: interpreter, the checkout (path and source files), environment."""
    h = hashlib.sha256(sys.executable.encode())
    h.update(str(PACKAGE).encode() + b"\0")  # another checkout: its own server, whose rows carry its commit
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
    """A connection to the server at ``path``; None where none listens; :class:`Refused` where it is not ours."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.connect(str(path))
        uid = peer_credentials(sock)[1]
    except OSError:
        sock.close()
        return None
    except Refused:
        sock.close()
        raise
    if uid != os.getuid():
        sock.close()
        raise Refused(f"the warm server at {path} runs as {user_name(uid)}, not as {user_name(os.getuid())}")
    return sock


def _start_server(path: Path, log: Path) -> socket.socket | None:
    """Connect to the server at ``path``, starting it first if none answers."""
    sock = _connect(path)
    if sock is not None:
        return sock
    lock = open_private(Path(f"{path}.lock"), os.O_RDWR)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S + CONNECT_TIMEOUT_S
        while True:  # one job starts the server; the others wait here (as long as a start may take), then connect
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    print(f"another job has been starting the warm server ({path}) for too long", file=sys.stderr)
                    return None
                time.sleep(0.05)
        sock = _connect(path)
        if sock is not None:
            return sock
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead server's socket
        out = open_private(log, os.O_WRONLY | os.O_APPEND)
        try:
            server = subprocess.Popen(
                [sys.executable, "-m", "cs336sys.pipeline.warm", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")]))},
            )
        finally:
            os.close(out)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and server.poll() is None:
            sock = _connect(path)
            if sock is not None:
                return sock
            time.sleep(0.05)
    finally:
        os.close(lock)  # and with it the flock
    print(f"the warm server ({path}) did not start; its log: {log}", file=sys.stderr)
    return None


class _Lines:
    """JSON lines from a socket, each wait bounded by a deadline (``time.monotonic()``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def next(self, deadline: float) -> dict[str, Any] | None:
        """The next message; None where the other end closed; TimeoutError past ``deadline``."""
        while b"\n" not in self.buf:
            self.sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)


def request_cell(request: dict[str, Any]) -> dict[str, Any] | None:
    """Have the warm server run one cell job; its reply, or None where no server could be had (or may be used)."""
    try:
        check_platform()
        path = socket_path()
        sock = _start_server(path, path.with_suffix(".log"))
    except (Refused, OSError) as exc:
        print(f"{exc}; the job runs the cell itself", file=sys.stderr)
        return None
    if sock is None:
        return None
    with sock:
        return _exchange(sock, path, request)


def _exchange(sock: socket.socket, path: Path, request: dict[str, Any]) -> dict[str, Any] | None:
    """Send the job, then wait: for the server to take it, then for its reply."""
    limit = float(request["timeout_s"]) + REPLY_MARGIN_S
    lines, taken = _Lines(sock), False
    itself = "; the job runs the cell itself"
    try:
        sock.sendall(json.dumps({**request, "env": passed_env(os.environ), "cwd": os.getcwd(), "pid": os.getpid()}).encode() + b"\n")
        deadline = time.monotonic() + ACCEPT_TIMEOUT_S
        while (reply := lines.next(deadline)) is not None:
            if "ok" in reply:
                if reply.get("refused"):
                    print(f"the warm server ({path}) refused the job: {reply['refused']}{itself}", file=sys.stderr)
                    return None
                return reply
            if reply.get("accepted"):
                taken, deadline = True, time.monotonic() + limit
    except TimeoutError:
        if not taken:  # nothing runs for us there: run it here
            print(f"the warm server ({path}) did not take the job within {ACCEPT_TIMEOUT_S:g} s{itself}", file=sys.stderr)
            return None
        # it took the job: measuring it here too could run it twice; failing ends the handler's measurement (it watches us)
        raise RuntimeError(
            f"the warm server ({path}) took the job but sent no reply within {limit:g} s (the cell's time limit, "
            f"which covers its wait for a GPU, plus {REPLY_MARGIN_S:g} s); its log: {path.with_suffix('.log')}"
        ) from None
    except (OSError, ValueError) as exc:
        print(f"the warm server ({path}) failed to answer: {exc}{itself}", file=sys.stderr)
        return None
    # a server that died, or shut down with our connection still queued
    print(f"the warm server ({path}) closed the connection without a reply{itself}", file=sys.stderr)
    return None


def run_job(
    cell: dict[str, Any], timeout_s: float, output: str, log: str, warm: bool = True, run: str = "", replace: bool = False, passes: int = 1
) -> str:
    """One cell job of run ``run``: the cell (its params, ``Cell.params``) measured into the CSV at ``output``, its log at
    ``log``; returns a one-line summary.

    With ``warm``, the warm server runs it; otherwise (or where no server starts, or the one found
    may not be used) this process does. RowsKept unless ``replace``: ``pipeline.keeprows``.
    """
    request = dict(cell=cell, timeout_s=timeout_s, passes=passes, output=str(output), log=str(log), run=run, replace=replace)
    reply = request_cell(request) if warm else None
    if reply is None:
        return _job(request)
    if reply.get("kept"):
        raise RowsKept(reply["kept"])
    if not reply.get("ok"):
        raise RuntimeError(f"the warm server failed to run the job:\n{reply.get('error')}")
    return reply["summary"]


# --- the server's side ----------------------------------------------------------------------
def _job(request: dict[str, Any], owner_pid: int | None = None) -> str:
    from cs336sys.fileio import remove_stale_temps
    from cs336sys.pipeline.cells import Cell, run_cell
    from cs336sys.pipeline.code_record import record_cell
    from cs336sys.pipeline.jobs import log_to
    from cs336sys.pipeline.lifeline import pid_alive, started_at
    from cs336sys.rows import rows_to_frame, write_csv_atomic

    with log_to(request["log"]):
        out = Path(request["output"])
        for stale in remove_stale_temps(out.parent, out.name):  # a half-written CSV of a killed earlier job
            print(f"removed {stale} (its writer is gone)")
        cell = Cell.from_params(request["cell"], timeout_s=request["timeout_s"], passes=int(request.get("passes", 1)))
        # nothing here has run torch; the rows' time_job_s counts from the job's process start
        job_started = started_at(owner_pid or os.getpid())
        rows = run_cell(cell, start_method="fork", owner_pid=owner_pid, job_started=job_started, run=request.get("run") or None)
        if owner_pid is not None and not pid_alive(owner_pid):
            raise RuntimeError("the job is gone; its cell's CSV is not written")
        with replacing(out, rows, request.get("replace") is True):  # RowsKept: nothing written
            write_csv_atomic(rows_to_frame(rows, cell.axes), out)
        record_cell(cell, out)
        summary = f"{cell.cell_id}: " + ", ".join(sorted({r["status"] for r in rows}))
        print(summary)
    return summary


def _send(conn: socket.socket, message: dict[str, Any]) -> bool:
    try:
        conn.settimeout(CONNECT_TIMEOUT_S)
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        return False
    return True


def _handle(conn: socket.socket) -> None:
    import traceback

    try:
        pid, request = checked_request(conn)
    except Refused as exc:
        print(f"refused a request: {exc}", flush=True)  # the server's log
        _send(conn, {"ok": False, "refused": str(exc)})
        return
    if not _send(conn, {"accepted": True}):
        return  # the job stopped waiting and runs the cell itself
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    from cs336sys.measure.env import git_commit

    git_commit.cache_clear()  # read now, for this job, never a value from before the fork
    try:
        reply = {"ok": True, "summary": _job(request, owner_pid=pid)}
    except RowsKept as exc:  # not a failure of the server: the job says it as its own
        reply = {"ok": False, "kept": str(exc)}
    except BaseException:  # the job must hear of it, whatever it was
        reply = {"ok": False, "error": traceback.format_exc()}
    _send(conn, reply)


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
    import cs336sys.rows  # noqa: F401  (pandas)

    for failure in preload():
        print(f"not preloaded: {failure}", flush=True)
    if torch.cuda.is_initialized():  # a forked child could not use the GPU: say so instead of failing every cell
        raise RuntimeError("CUDA was initialised while preloading; the warm server cannot fork measuring children")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o077)  # the socket ours alone; the CSVs and logs the handlers write keep the job's umask
    try:
        server.bind(str(path))
    finally:
        os.umask(umask)
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
