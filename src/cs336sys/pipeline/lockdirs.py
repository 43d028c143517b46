"""Where GPU locks and job records live: a directory every account shares, and one of this account's own.

The shared directory (``$CS336SYS_LOCK_DIR`` or /tmp/cs336sys-gpu-locks) holds one lock file per
GPU that the jobs of every account lock, so that two accounts never measure on one GPU at once.
Anyone can make it first after a reboot, and GPU UUIDs are public, so nothing in it is trusted
(``check_shared``): it is refused where another account (not root) owns it, where others may
write it without the sticky bit, or where it is not a directory. Such a refusal would switch the
lock off for everyone, so each account also locks in a directory of its own (``open_own_dir``):
``<shared directory>-<uid>`` (made 0700; its parent must be one that no other account can swap it
in), else, where another account took that name first, ``~/.cache/cs336sys/gpu-locks-<host>``.
Every job of an account finds the same one, since the choice depends on the files alone. Its job
records (``pipeline.hostjobs``) live there too, unreadable to other accounts. Every open here is
relative to a checked directory fd, never through a symlink (``SAFE_FLAGS``). No torch import.
"""

from __future__ import annotations

import os
import pwd
import socket
import stat
import sys
from pathlib import Path

DEFAULT_LOCK_DIR = "/tmp/cs336sys-gpu-locks"
# every open here: never through a symlink, never kept by an exec'd child, never a controlling terminal
SAFE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


class LockRefused(RuntimeError):
    """The lock directory or a lock file is not safe to use; the message names the path and its owner."""


def say(message: str) -> None:
    # the job's stdout and stderr are its log (pipeline.jobs.log_to)
    print(f"cs336sys gpu lock: {message}", file=sys.stderr, flush=True)


def owner(st: os.stat_result) -> str:
    try:
        return f"{pwd.getpwuid(st.st_uid).pw_name} (uid {st.st_uid})"
    except KeyError:
        return f"uid {st.st_uid}"


def kind(st: os.stat_result) -> str:
    mode = st.st_mode
    kinds = {stat.S_ISLNK: "a symbolic link", stat.S_ISFIFO: "a fifo (named pipe)", stat.S_ISDIR: "a directory", stat.S_ISSOCK: "a socket"}
    for test, name in kinds.items():
        if test(mode):
            return name
    if not stat.S_ISREG(mode):
        return "a device node"
    return f"a regular file with {st.st_nlink} hard links" if st.st_nlink != 1 else "a regular file"


def what(name: str | Path, dir_fd: int | None = None) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    return f"{kind(st)} owned by {owner(st)}"


def shared_path() -> Path:
    return Path(os.environ.get("CS336SYS_LOCK_DIR") or DEFAULT_LOCK_DIR)


def check_shared(path: Path, st: os.stat_result) -> None:
    if st.st_uid not in (os.geteuid(), 0):
        raise LockRefused(
            f"lock directory {path} is owned by {owner(st)}, neither you nor root: its owner could swap the lock files; "
            "have it removed, or set CS336SYS_LOCK_DIR to a directory of yours"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise LockRefused(
            f"lock directory {path} (owned by {owner(st)}, mode {stat.S_IMODE(st.st_mode):o}) is writable by others "
            "without the sticky bit: anyone could replace its lock files; chmod +t or go-w it, or set CS336SYS_LOCK_DIR"
        )


def _open_dir(path: Path, mode: int) -> tuple[int, bool]:
    """``path`` made (``mode``) if missing and opened without following a symlink; the fd and whether we made it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        made = True
        try:
            os.mkdir(path, 0o700)  # private until we hold it open and know it is ours
        except FileExistsError:
            made = False
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | SAFE_FLAGS)
    except OSError as exc:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise LockRefused(f"lock directory {path} is {what(path)}, not a directory: refused, not followed") from None
        raise LockRefused(f"cannot use lock directory {path}: {exc.strerror}") from None
    if made and os.fstat(fd).st_uid == os.geteuid():
        os.fchmod(fd, mode)
    return fd, made


def open_shared_dir() -> tuple[Path, int]:
    """The shared lock directory, made if missing (0o1777, like /tmp), checked; its path and an fd for every later open."""
    path = shared_path()
    fd, _ = _open_dir(path, 0o1777)  # every account's runs share it, and nobody deletes another's files
    try:
        check_shared(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return path, fd


def own_dir_candidates() -> list[Path]:
    """This account's lock directories, in the order every job of the account tries them."""
    home = Path(os.path.expanduser("~")) / ".cache" / "cs336sys" / f"gpu-locks-{socket.gethostname().replace('/', '_')}"
    return [Path(f"{shared_path()}-{os.geteuid()}"), home]


def _check_own(path: Path, st: os.stat_result) -> None:
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
        raise LockRefused(f"lock directory {path} is {kind(st)} owned by {owner(st)}, not one of yours")
    parent = os.stat(path.parent)  # followed: a link to another account's directory shows that owner
    if parent.st_uid not in (me, 0) or (parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX):
        raise LockRefused(
            f"lock directory {path} lies in {path.parent} (owned by {owner(parent)}, mode {stat.S_IMODE(parent.st_mode):o}), "
            "where another account could swap it for its own"
        )


def open_own_dir() -> tuple[Path, int]:
    """This account's private lock directory (0700): the first candidate that is, or can be made, ours; LockRefused naming each."""
    reasons = []
    for path in own_dir_candidates():
        try:
            fd, _ = _open_dir(path, 0o700)
        except LockRefused as exc:
            reasons.append(str(exc))
            continue
        try:
            st = os.fstat(fd)
            _check_own(path, st)
            if stat.S_IMODE(st.st_mode) != 0o700:  # ours: its records and locks are no one else's business
                os.fchmod(fd, 0o700)
        except (LockRefused, OSError) as exc:
            os.close(fd)
            reasons.append(str(exc) if isinstance(exc, LockRefused) else f"cannot use lock directory {path}: {exc.strerror}")
            continue
        return path, fd
    raise LockRefused("no lock directory of this account's own: " + "; ".join(reasons))
