"""Tie a measuring child's life to its job's, so no orphan keeps a GPU busy.

A job measures in a forked child. When the job itself dies without a chance to clean up
(SIGKILL, the OOM killer, a SLURM or snakemake kill), the child is reparented to PID 1
(or a subreaper) and goes on running, holding GPU memory and compute and spoiling the
next cell's timings. ``die_with_parent`` makes the kernel kill the child when its parent
dies (Linux ``PR_SET_PDEATHSIG``), ``own_process_group`` plus ``kill_process_group`` let a
job that does exit normally take down everything it started, grandchildren included
(Triton compile workers, dataloader workers), which PDEATHSIG alone does not reach
because it is not inherited across fork.
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


def _prctl_pdeathsig(sig: int) -> bool:
    # CDLL(None): the symbols already loaded (libc's among them); no ldconfig subprocess
    for name in (None, "libc.so.6"):
        try:
            return ctypes.CDLL(name, use_errno=True).prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0) == 0
        except (OSError, AttributeError):
            continue
    return False


def _start_watchdog(parent_pid: int, sig: int, poll_s: float = 0.5) -> threading.Thread:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), sig)
        os._exit(1)  # for a sig the process catches or ignores

    thread = threading.Thread(target=watch, name="cs336sys-lifeline", daemon=True)
    thread.start()
    return thread


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Call in the child right after fork: deliver ``sig`` to it when ``parent_pid`` dies.

    Linux: prctl(PR_SET_PDEATHSIG), delivered by the kernel, so it works even when the
    child is stuck in a CUDA call. The parent may die between the fork and the prctl, in
    which case no signal ever comes: hence the getppid() check after it, and an immediate
    exit if the parent is already gone. Elsewhere (or if prctl fails) a daemon thread
    polls getppid() every 0.5 s instead; it cannot interrupt a thread blocked in C
    without releasing the GIL, which is why prctl comes first.

    Caveats of PDEATHSIG: it fires when the parent *thread* that forked exits, so fork
    from the job's main thread; it is cleared in the child of a fork and on exec of a
    set-uid binary, so it protects this process only (see ``kill_process_group``).
    """
    armed = sys.platform.startswith("linux") and _prctl_pdeathsig(sig)
    if os.getppid() != parent_pid:
        os._exit(1)
    if not armed:
        _start_watchdog(parent_pid, sig)


def watch_pid(pid: int, sig: int = signal.SIGKILL, poll_s: float = 0.5) -> threading.Thread:
    """Deliver ``sig`` to this process once ``pid`` (not our parent) is gone.

    For a child whose parent is not its job, e.g. one started by a forkserver:
    PDEATHSIG would follow the server, so a daemon thread polls the job instead.
    """

    def watch() -> None:
        while pid_alive(pid):
            time.sleep(poll_s)
        os.kill(os.getpid(), sig)
        os._exit(1)

    thread = threading.Thread(target=watch, name="cs336sys-watch-job", daemon=True)
    thread.start()
    return thread


def own_process_group() -> None:
    """Make this process the leader of a new process group, if it is not one already.

    Call in the job script before it starts the measuring child, so the child and all
    its descendants share a group of their own that the job can kill on exit with
    ``kill_process_group(os.getpgrp())`` without touching snakemake. The job then no
    longer receives the terminal's Ctrl-C itself; it relies on snakemake to stop it.
    Session leaders cannot move (EPERM) and are already group leaders.
    """
    if os.getpgrp() == os.getpid():
        return
    try:
        os.setpgid(0, 0)
    except PermissionError:
        pass


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, on the clock of ``time.monotonic()``; None without /proc (or the process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime: clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.monotonic() - max(age, 0.0)


def _group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) pids of the group from /proc; None where there is no /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # fields after "(comm)": state ppid pgrp ...; comm may contain spaces and ')'
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group (but never to the caller); False when none is left."""
    me = os.getpid()
    members = _group_members(pgid)
    if members is None:  # no /proc: killpg, which also counts unreaped zombies
        if os.getpgrp() == pgid:
            raise ValueError("cannot kill the caller's own process group without /proc")
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        return True
    others = [pid for pid in members if pid != me]
    for pid in others:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return bool(others)


def kill_process_group(pgid: int, grace_s: float = 2.0) -> None:
    """SIGTERM every process of group ``pgid``, then SIGKILL what is left after ``grace_s``.

    The caller may belong to the group (a job cleaning up its own group on exit): it is
    spared. Zombies count as gone and are not reaped here, so the caller keeps its
    children's exit statuses. A group that no longer exists is not an error; nor is a
    process that outlives SIGKILL by more than a second (stuck in the driver, state D:
    it dies when the kernel call returns, and nothing more can be done from here).
    """
    if pgid <= 1:
        raise ValueError(f"refusing to signal process group {pgid}")
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if not _signal_group(pgid, 0):
            return
    # loop: a member may fork between the scan and the kill
    for _ in range(50):
        if not _signal_group(pgid, signal.SIGKILL):
            return
        time.sleep(0.02)
