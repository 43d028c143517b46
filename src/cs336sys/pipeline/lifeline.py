"""Tie a measuring child's life to its job's, so no orphan keeps a GPU busy.

A job measures in a forked child. When the job itself dies without a chance to clean up
(SIGKILL, the OOM killer, a SLURM or snakemake kill), the child is reparented to PID 1
(or a subreaper) and goes on running, holding GPU memory and compute and spoiling the
next cell's timings. ``die_with_parent`` makes the kernel kill the child when its parent
dies (Linux ``PR_SET_PDEATHSIG``); ``watch_pid`` does the same from a thread where the
parent to watch is not the child's own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

from cs336sys.fileio import pid_alive  # the one liveness check: a zombie counts as gone

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _prctl_pdeathsig() -> bool:
    # CDLL(None): the symbols already loaded (libc's among them); no ldconfig subprocess
    for name in (None, "libc.so.6"):
        try:
            return ctypes.CDLL(name, use_errno=True).prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            continue
    return False


def _start_watchdog(parent_pid: int, poll_s: float = 0.5) -> threading.Thread:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="cs336sys-lifeline", daemon=True)
    thread.start()
    return thread


def die_with_parent(parent_pid: int) -> None:
    """Call in the child right after fork: SIGKILL it when ``parent_pid`` dies.

    Linux: prctl(PR_SET_PDEATHSIG), delivered by the kernel, so it works even when the
    child is stuck in a CUDA call. The parent may die between the fork and the prctl, in
    which case no signal ever comes: hence the getppid() check after it, and an immediate
    exit if the parent is already gone. Elsewhere (or if prctl fails) a daemon thread
    polls getppid() every 0.5 s instead; it cannot interrupt a thread blocked in C
    without releasing the GIL, which is why prctl comes first.

    Caveats of PDEATHSIG: it fires when the parent *thread* that forked exits, so fork
    from the job's main thread; it is cleared in the child of a fork and on exec of a
    set-uid binary, so it protects this process only, not what it starts.
    """
    armed = sys.platform.startswith("linux") and _prctl_pdeathsig()
    if os.getppid() != parent_pid:
        os._exit(1)
    if not armed:
        _start_watchdog(parent_pid)


def watch_pid(pid: int, poll_s: float = 0.5) -> threading.Thread:
    """SIGKILL this process once ``pid`` (not our parent) is gone.

    For a child whose parent is not its job, e.g. one started by a forkserver:
    PDEATHSIG would follow the server, so a daemon thread polls the job instead.
    """

    def watch() -> None:
        while pid_alive(pid):
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="cs336sys-watch-job", daemon=True)
    thread.start()
    return thread


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, on the clock of ``time.monotonic()``; None without /proc (or the process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime: clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.monotonic() - max(age, 0.0)
