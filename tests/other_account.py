"""A second account on this machine, for the tests of what another user can do (root only).

``other_user`` makes a throwaway account for a test module (skipped without root or
``useradd``, except under ``CI=true``, where it must run); :func:`fork_as` runs a
function in a forked child that has dropped to that account's uid and gid;
``shared_base`` is a directory like /tmp that both accounts reach.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import traceback
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def other_user():
    """A throwaway second account: the other user of a shared GPU box."""
    if os.getuid() != 0 or shutil.which("useradd") is None:
        reason = "a second account needs root and useradd (CI runs these as root)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    name = f"cs336x{os.getpid() % 100000}"
    add = ["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "--user-group", name]
    made = subprocess.run(add, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def shared_base():
    """A directory like /tmp (root's, world-writable, sticky) that the other user can reach."""
    base = Path(tempfile.mkdtemp(prefix="cs336g-", dir="/tmp"))
    base.chmod(0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def fork_as(user: pwd.struct_passwd, fn, *args) -> int:
    """Run ``fn(*args)`` in a forked child with ``user``'s uid and gid only; the child's pid (exit 0: it returned)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 1
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            fn(*args)
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    return pid
