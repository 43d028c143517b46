"""The one cell runner: one grid cell's measurement → rows that always carry a status.

The measurement runs in a child process so that whatever happens to it becomes
data: ``torch.OutOfMemoryError`` (caught by type) → ``oom``; any other
exception → ``error``; the child dying (segfault, ``abort``, a fatal CUDA error)
→ ``error`` with its exit signal; running past the time limit → ``timeout``;
a cell that cannot run here (CUDA needed on a CPU machine) → ``skipped``; an
attention implementation that fails its check against a float64 reference
(``measure.correctness``) → ``wrong``, untimed.
Rows measured before a failure are kept, and the failure row names the part
(e.g. ``mode=train``) that failed.

A measurement is a generator function ``fn(device, context, **kwargs)``
yielding row dicts; it records what it is doing in ``context`` (a dict whose
keys are copied into a failure row; the child forwards each change to the job,
so a timeout or a crash names its part too; a failure before any part started
has ``mode`` ""). Test hook: ``CS336SYS_INJECT_FAULT`` =
``oom|error|abort|hang|sleep=<s>[:<cell-id substring>]`` makes matching cells fail
(or, for ``sleep``, last ``s`` seconds longer) inside the child, so the failure
paths are exercised without a real GPU (``pipeline.faults``).

Every row also says where its job's wall time went (``time_*_s``, ``cs336sys.columns``):
start-up until the measurement began (the job's process, the warm worker's hand-off, the
wait for a GPU, the child's fork, imports and CUDA context), the parts the measurement
marked (``measure.session``: check, warm-up, timed blocks, pairs, graph capture, energy
blocks, profiling) and the rest. A child that died mid-measurement leaves its parts empty.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cs336sys import plugins
from cs336sys import studies as S
from cs336sys.catalog import LM
from cs336sys.columns import TIME_PARTS
from cs336sys.pipeline.cell import Cell
from cs336sys.pipeline.faults import FAULT_ENV, inject_fault
from cs336sys.rows import Skip, Wrong

__all__ = ["FAULT_ENV", "Cell", "run_cell"]

PROGRESS_EVERY_S = 10.0
OutOfMemoryError = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


class _Context(dict):
    """The measurement's ``context``: each change is sent to the job, which knows the part even if the child dies."""

    def __init__(self, conn) -> None:
        super().__init__()
        self._conn = conn

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._conn.send(("context", dict(self)))

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._conn.send(("context", dict(self)))


def _child(conn, cell: Cell, fault: str, job_pid: int, pins: dict[str, str]) -> None:
    from cs336sys.pipeline.lifeline import die_with_parent, watch_pid

    # An orphan would keep the GPU busy while the resumed run measures the next cell.
    die_with_parent(os.getppid())  # the job, a forkserver or a warm worker's handler (pipeline.warm)
    if os.getppid() != job_pid:  # then the job is not our parent: watch it too
        watch_pid(job_pid)
    os.environ.update(pins)  # CUDA_VISIBLE_DEVICES of the leased GPU, before CUDA initialises
    from cs336sys.measure import CACHE_DIR_ENV

    os.environ.pop(CACHE_DIR_ENV, None)
    if cell.cache_dir:  # read by Triton and inductor when they first compile, after this point
        cache = Path(cell.cache_dir).resolve()
        os.environ.setdefault("TRITON_CACHE_DIR", str(cache / "triton"))
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
        os.environ[CACHE_DIR_ENV] = str(cache)  # the correctness check's verdicts (measure.checkcache)

    from cs336sys.measure import gpu_state, host_probe
    from cs336sys.measure.env import environment, pick_device
    from cs336sys.measure.memory import cap_memory, release
    from cs336sys.measure.session import Session

    context = _Context(conn)
    device = None
    try:
        try:
            device = pick_device(cell.device)
        except RuntimeError as exc:
            raise Skip(str(exc)) from exc
        if device.type == "cpu":
            torch.set_num_threads(cell.threads or 1)
        env = environment(device)
        if device.type == "cuda":
            static = gpu_state.gpu_state()
            env.update({k: static[k] for k in ("gpu_index", "gpu_uuid", "max_sm_clock_mhz", "gpu_state_note")})
            env.update({k: v for k, v in gpu_state.host_state().items() if k != "load_avg_1m"})
        sampler = gpu_state.sample if device.type == "cuda" else gpu_state.host_load
        # the busy share in a cell's first pass only: whether it is launch-bound does not change between passes;
        # energy in every pass (its interval pools the passes' blocks); the warm-up stops waiting once the clocks are up
        clocks_up = gpu_state.clocks_up() if device.type == "cuda" else None
        policy = dataclasses.replace(cell.policy, passes=cell.passes)
        session = Session(policy, host_probe.with_probe(sampler, device), busy_share=cell.pass_index == 0, clocks_up=clocks_up)
        conn.send(("env", env))
        cap_memory(cell.memory_fraction, device)
        inject_fault(cell.cell_id, fault, OutOfMemoryError)
        if cell.plugins:  # the user's implementation names and model, registered in this process alone
            plugins.activate(cell.plugins)
            user_files = plugins.preload(cell.plugins)  # imported here: a failure (sys.exit too) names its key
            conn.send(("plugin_files", plugins.loaded_by_import(cell.plugins)))  # the job's code record names them too
        module, _, name = cell.target.partition(":")
        measure = getattr(importlib.import_module(module), name)
        conn.send(("begun", time.monotonic()))  # the end of start-up (CLOCK_MONOTONIC: the job's clock too)
        try:
            for row in measure(device=device, context=context, session=session, **cell.kwargs()):
                conn.send(("row", row))
        finally:  # before the outcome: the job stops listening once it has one
            conn.send(("spent", session.spent()))
            if cell.plugins and (note := plugins.unhashed_note(cell.plugins, user_files)):
                print(f"cs336sys: warning: {note}", file=sys.stderr, flush=True)
                conn.send(("env", {"plugin_note": note}))  # on every row, the failure's too
        conn.send(("done", None))
    except OutOfMemoryError as exc:
        if device is not None:
            release(device)
        conn.send(("oom", (str(exc).partition("\n")[0][:500] or "CUDA out of memory", dict(context))))
    except Skip as exc:
        conn.send(("skipped", (str(exc), dict(context))))
    except Wrong as exc:
        conn.send(("wrong", (str(exc)[:1000], dict(context))))
    except Exception as exc:  # any measured failure becomes a row, never a crash of the workflow
        traceback.print_exc()
        conn.send(("error", (f"{type(exc).__name__}: {exc}"[:1000], dict(context))))
    finally:
        conn.close()


def _context(start_method: str | None):
    """``forkserver`` (default) is safe whatever this process has done; ``fork`` is faster.

    fork is only safe while this process has neither touched CUDA (even
    ``torch.cuda.is_available()`` marks a process so that a forked child cannot
    initialise CUDA) nor run a multi-threaded torch op (GNU OpenMP's pool does
    not survive a fork: the child hangs). That holds for the workflow's job
    scripts and the CLI, so they ask for it; library callers (notebooks, tests)
    get the safe default.
    """
    method = start_method or "forkserver"
    if method == "fork" and torch.cuda.is_initialized():
        method = "forkserver"
    if method not in mp.get_all_start_methods():
        method = "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "cs336sys.pipeline.cells"])
    return ctx


@contextlib.contextmanager
def _main_not_reimported():
    """Keep a spawned child from re-running the parent's script.

    Spawn re-imports ``__main__`` by path when it has no module spec; a
    Snakemake ``script:`` is such a file, and re-running it in the child would
    start the cell again. Without ``__file__`` the child imports nothing.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) if main is not None and getattr(main, "__spec__", None) is None else None
    if path is None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"measuring process died with signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"measuring process died with signal {-exitcode}"
    return f"measuring process exited with code {exitcode} before reporting"


def _base_env(cell: Cell) -> dict[str, Any]:
    from cs336sys.measure.env import environment

    env = environment(torch.device("cpu"))  # parent never touches CUDA; the child overrides these
    env.update(device=cell.device, device_name="", driver_version="")
    return env


def _needs_lease(cell: Cell) -> bool:
    # CPU cells on a GPU host leave the GPUs alone; fake GPUs (tests) lock any cell
    return cell.device != "cpu" or bool(os.environ.get("CS336SYS_FAKE_GPUS"))


def run_cell(
    cell: Cell,
    start_method: str | None = None,
    owner_pid: int | None = None,
    progress: Callable[[dict[str, Any], float], None] | None = None,
    job_started: float | None = None,
    run: str | None = None,
) -> list[dict[str, Any]]:
    """Run ``cell`` in a child process and return its rows (at least one), each with a status.

    One cell at a time per GPU, across every run on the host: the job holds a
    lock on a GPU (``pipeline.gpulock``) from before the child starts until it
    is gone, and pins the child to that GPU; a cell that waited says how long
    (``gpu_wait_s``), and the wait counts against ``cell.timeout_s``: a cell still
    queued at its limit is a ``timeout`` row naming the holder. Every row says
    whether it held a lock (``gpu_lock``: ``held``, ``held: <which lock only> (<why>)``,
    or ``none: <reason>``: a CPU cell, no GPU listed, a MIG slice, every lock file
    refused as unsafe -- such a cell still runs, since its measurement is most likely
    fine, and says so) and how many jobs of other runs (``run``: this job's run name)
    were busy beside its measurement (``concurrent_jobs``, ``concurrent_runs``;
    ``pipeline.hostjobs``).
    ``start_method``: see :func:`_context`; pass ``"fork"`` only from a process
    that has run no torch computation. ``owner_pid``: the job this runs for, when
    that is not this process (the warm worker, ``pipeline.warm``): the measurement
    stops when it dies. ``progress(context, elapsed_s)`` hears each part the child
    starts (e.g. ``{"mode": "train"}``), and every 10 s while a part runs. ``job_started``: when
    the job began (``time.monotonic()``; default: now), the start of its rows' ``time_job_s``.
    """
    from cs336sys.pipeline import gpulock, hostjobs
    from cs336sys.pipeline.gpus import find_gpus

    clock = {"job": time.monotonic() if job_started is None else job_started}
    deadline = time.monotonic() + cell.timeout_s  # the time limit covers the wait for a GPU too
    with hostjobs.register_job(run) as job, contextlib.ExitStack() as stack:
        gpus, reason = find_gpus() if _needs_lease(cell) else ([], "cpu cell")
        lease, lock = None, {"gpu_lock": f"none: {reason}"}
        if gpus:
            if job is not None:
                job.state("waiting")
            t0 = time.monotonic()
            try:
                lease = stack.enter_context(gpulock.acquire_gpu(gpus, timeout_s=max(0.0, deadline - t0)))
                lock = {"gpu_lock": lease.note, **gpulock.lease_columns(lease)}
            except gpulock.LockRefused as exc:
                print(f"cs336sys: {exc}; the cell runs without a GPU lock", file=sys.stderr, flush=True)
                lock = {"gpu_lock": f"none: {exc}"}
            except TimeoutError as exc:
                waited = round(time.monotonic() - t0, 3)
                lock = {"gpu_lock": f"none: not free within the time limit of {cell.timeout_s:g} s", "gpu_wait_s": waited}
                error = f"cell exceeded its time limit of {cell.timeout_s:g} s waiting for a GPU; {exc}"
                return _finish(cell, _base_env(cell), [], ("timeout", error, {}), lock, clock)
        if job is not None:
            job.state("holding" if lease is not None else "running")
        beside = hostjobs.ConcurrencyWatch(run, gpus, lease.uuid if lease is not None else None)
        return _run_child(cell, start_method, lease, owner_pid, progress, deadline, lock, beside, clock)


def _gone(pid: int | None) -> bool:
    from cs336sys.pipeline.lifeline import pid_alive

    return pid is not None and not pid_alive(pid)


def _run_child(
    cell: Cell, start_method: str | None, lease, owner_pid: int | None, progress, deadline, lock, beside, clock
) -> list[dict[str, Any]]:
    """``beside``: the watch of other runs' jobs busy while this one measures (``hostjobs.ConcurrencyWatch``)."""
    from cs336sys.pipeline import gpulock

    ctx = _context(start_method)
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    pins = gpulock.pin_environment(lease) if lease is not None else {}
    # The fault spec is read here: a forkserver child has the server's environment, not ours.
    args = (child_conn, cell, os.environ.get(FAULT_ENV, ""), owner_pid or os.getpid(), pins)
    proc = ctx.Process(target=_child, args=args, daemon=True)
    with _main_not_reimported():
        proc.start()
    child_conn.close()

    env, rows, failure, context = _base_env(cell), [], None, {}
    clock = clock if clock is not None else {"job": time.monotonic()}
    started = time.monotonic()
    deadline, next_note = deadline or started + cell.timeout_s, started + PROGRESS_EVERY_S
    while failure is None:
        beside.look()
        remaining = deadline - time.monotonic()
        if _gone(owner_pid):
            failure = ("error", f"the job (pid {owner_pid}) is gone", context)
            break
        if remaining <= 0:
            waited = (lock or {}).get("gpu_wait_s") or 0
            of_it = f" ({waited:.1f} s of it waiting for a GPU)" if waited >= 0.05 else ""
            failure = ("timeout", f"cell exceeded its time limit of {cell.timeout_s:g} s{of_it}", context)
            break
        try:
            if not parent_conn.poll(min(remaining, 1.0)):
                if not proc.is_alive() and not parent_conn.poll(0):
                    failure = ("error", _exit_reason(proc.exitcode), context)
                elif progress is not None and time.monotonic() >= next_note:
                    next_note += PROGRESS_EVERY_S
                    progress(context, time.monotonic() - started)
                continue
            kind, payload = parent_conn.recv()
        except (EOFError, OSError):
            proc.join(5)
            failure = ("error", _exit_reason(proc.exitcode), context)
            break
        if kind == "env":
            env.update(payload)
        elif kind == "context":
            context = payload
            if progress is not None:
                progress(context, time.monotonic() - started)
        elif kind == "row":
            rows.append({**payload, "status": "ok", "error": ""})
        elif kind in ("begun", "spent"):
            clock[kind] = payload
        elif kind == "plugin_files":
            plugins.record_loaded(cell.plugins, payload)
        elif kind == "done":
            break
        else:
            failure = (kind, payload[0], payload[1])
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return _finish(cell, env, rows, failure, {**(lock or {}), **beside.columns()}, clock)


def _time_columns(clock: dict[str, Any]) -> dict[str, float | None]:
    """The job's wall time so far and its parts (module doc); ``clock``: the job's start, the child's reports."""
    job = time.monotonic() - clock["job"]
    begun = clock.get("begun")
    startup = job if begun is None else min(max(begun - clock["job"], 0.0), job)
    parts = clock.get("spent")  # None: the child died before it could say
    cols: dict[str, float | None] = {f"time_{p}_s": None for p in TIME_PARTS}
    cols.update({f"time_{p}_s": s for p, s in (parts or {}).items()}, time_job_s=job, time_startup_s=startup)
    cols["time_other_s"] = max(job - startup - sum((parts or {}).values()), 0.0)
    return {k: None if v is None else round(v, 3) for k, v in cols.items()}


def _finish(
    cell: Cell, env: dict[str, Any], rows: list[dict[str, Any]], failure, lock: dict[str, Any], clock: dict[str, Any]
) -> list[dict[str, Any]]:
    if failure is not None:
        status, error, where = failure
        # no part started yet: the failure is the whole cell's, and says so with an empty mode (not NaN)
        before_any_part = {} if "mode" in cell.axes else {"mode": ""}
        rows.append({**before_any_part, **where, "status": status, "error": error})
    env.update(lock, **_time_columns(clock), finished_at=_now())
    head = {"study": cell.study, "cell_id": cell.cell_id, **cell.axes}
    spec = S.STUDIES.get(cell.study)  # None: a cell of no registered study (a test's)
    if spec is not None and spec.kind == LM:  # which LM ran: ours or the user's class (plugins.model)
        head["model"] = plugins.model_name(cell.plugins)
    return [{**head, **row, "pass_index": cell.pass_index, **env} for row in rows]


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
