"""The warm worker (pipeline.warm, pipeline.warmcheck) against another account on the host, and against a confused job.

Run as root, a second account made here with ``useradd`` plays the other user (forked children
that drop to its uid), so that root's powers hide nothing.

a. A warm directory that is not ours and private (another account's, a plain file, a symlink, a
   directory others can reach or whose parent others can write) is refused with a message that
   names the path and its owner; the job runs the cell itself: nothing handed over, no forged
   reply believed, no wait on a server that never answers, no crash.
b. The lock and log files in the warm directory are never opened through a symlink.
c. The server serves its own uid only, and only the pid that connected; it takes from a request
   the environment a cell reads, paths inside the job's working directory and a registered
   study's measurement, nothing else; git runs through no one's PATH.
d. Every wait is bounded: a server that never answers, a client that never asks.
e. Two checkouts sharing one environment get a server each: each row carries its own commit.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from cs336sys.catalog import BUILT_IN
from cs336sys.pipeline import plan, warm, warmcheck
from cs336sys.pipeline.config import validate_config
from other_account import fork_as
from test_warm import FAULT_ENV, SRC, _servers, _stop_server
from workflow_helpers import DEMO, REPO, load_config

pytestmark = pytest.mark.slow  # every test: the warm server against a second account

FAKE_COMMIT = "fa4efa4efa4e"

# A job as the workflow's script runs it: the checkout's src/ put first on sys.path (run_cell.py does
# the same), so two checkouts share one environment; stdlib only on this side.
JOB = """
import json, sys
sys.path.insert(0, sys.argv[5])
from cs336sys.pipeline.warm import run_job
print(run_job(json.loads(sys.argv[1]), 60.0, sys.argv[2], sys.argv[3], warm=sys.argv[4] == "1"), flush=True)
"""


@pytest.fixture(scope="module")
def cell() -> dict:
    config, _ = validate_config(load_config(REPO, DEMO))
    return plan.plan_cell("precision", {"part": "accumulation"}, config, BUILT_IN).params()


def _short_dir(tag: str) -> Path:
    """A path under /tmp short enough for a Unix socket name (~107 bytes), not created."""
    return Path(tempfile.gettempdir()) / f"w{os.getpid()}-{tag}-{time.monotonic_ns() % 10**8}"


def _clean_env(**extra: str) -> dict[str, str]:
    drop = (FAULT_ENV, "CS336SYS_FAKE_GPUS", "CS336SYS_LOCK_DIR", "CS336SYS_GIT_COMMIT", "PYTHONPATH")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, warm.IDLE_ENV: "5", **extra}


@pytest.fixture
def private_dir():
    """A warm directory of ours (0700); its servers are stopped afterwards."""
    path = _short_dir("own")
    path.mkdir(mode=0o700)
    yield path
    for sock in path.glob("*.sock"):
        _stop_server(sock)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def foreign_dir():
    """A path for another account's warm directory: not created here; removed (and its servers stopped) afterwards."""
    path = _short_dir("evil")
    yield path
    for pid in _attackers:
        _kill(pid)
    _attackers.clear()
    _stop_server(path / "x.sock")  # any warm server a victim job started there
    shutil.rmtree(path, ignore_errors=True)


def _run_job(cell: dict, cwd: Path, env: dict, src: str = SRC, timeout: float = 120) -> tuple[int, str]:
    argv = [sys.executable, "-c", JOB, json.dumps(cell), "cell.csv", "cell.log", "1", src]
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the job hung for {timeout:g} s: {exc.stdout}{exc.stderr}")
    return done.returncode, done.stdout + done.stderr


def _key(env: dict, src: str = SRC) -> str:
    code = f"import sys; sys.path.insert(0, {src!r}); from cs336sys.pipeline.warm import server_key; print(server_key())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def _ok_csv(path: Path) -> pd.DataFrame:
    assert path.exists(), f"the job wrote no {path.name}"
    frame = pd.read_csv(path, dtype={"git_commit": str})
    assert set(frame["status"]) == {"ok"}, frame[["status", "error"]]
    return frame


# ---------------------------------------------------------------- the other account

_attackers: list[int] = []


def _as(user: pwd.struct_passwd, fn, *args) -> int:
    """Run ``fn(*args)`` as ``user`` in a forked child (:func:`other_account.fork_as`); its pid, reaped at teardown."""
    pid = fork_as(user, fn, *args)
    _attackers.append(pid)
    return pid


def _reap(pid: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _attackers.remove(pid)
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    raise AssertionError(f"the other account's process {pid} did not finish within {timeout:g} s")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.lexists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _fake_server(directory: Path, key: str, reply: bytes | None) -> None:
    """The other account: a world-open warm directory with a 'server' that keeps what it hears."""
    directory.mkdir()
    directory.chmod(0o777)
    path = directory / f"{key}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen(8)
    while True:
        conn, _ = server.accept()
        data = b""
        while not data.endswith(b"\n"):
            data += conn.recv(65536) or b"\n"
        (directory / "heard.json").write_bytes(data)
        if reply is None:
            time.sleep(600)  # a job that believes this waits forever
        conn.sendall(reply)
        conn.close()


@pytest.mark.parametrize("reply", [b'{"ok": true, "summary": "forged"}', None], ids=["forged-ok", "never-answers"])
def test_a_warm_dir_another_account_made_is_refused_and_the_job_measures_itself(cell, other_user, foreign_dir, tmp_path, reply):
    env = _clean_env(**{warm.DIR_ENV: str(foreign_dir), "AWS_SECRET_ACCESS_KEY": "hunter2"})
    key = _key(env)
    _as(other_user, _fake_server, foreign_dir, key, reply)
    _wait_for(foreign_dir / f"{key}.sock")
    code, out = _run_job(cell, tmp_path, env, timeout=90)
    assert code == 0, out
    assert "forged" not in out
    _ok_csv(tmp_path / "cell.csv")
    assert not (foreign_dir / "heard.json").exists(), "the job told another account its request (and environment)"
    assert str(foreign_dir) in out and other_user.pw_name in out, out  # the message names the path and its owner


def _plant_links(directory: Path, key: str, lock_target: Path, log_target: Path) -> None:
    """The other account: a world-open warm directory whose lock and log files point at the victim's files."""
    directory.mkdir()
    directory.chmod(0o777)
    (directory / f"{key}.sock.lock").symlink_to(lock_target)
    (directory / f"{key}.log").symlink_to(log_target)


def test_symlinks_in_a_warm_dir_another_account_made_touch_none_of_our_files(cell, other_user, foreign_dir, tmp_path):
    env = _clean_env(**{warm.DIR_ENV: str(foreign_dir)})
    mine = {name: tmp_path / name for name in ("precious.txt", "diary.txt")}
    for path in mine.values():
        path.write_text("keep me\n")
    assert _reap(_as(other_user, _plant_links, foreign_dir, _key(env), mine["precious.txt"], mine["diary.txt"])) == 0
    code, out = _run_job(cell, tmp_path, env)
    assert code == 0, out
    _ok_csv(tmp_path / "cell.csv")
    assert {name: p.read_text() for name, p in mine.items()} == {name: "keep me\n" for name in mine}


@pytest.mark.parametrize("which", ["lock", "log"])
def test_a_symlink_in_our_own_warm_dir_is_never_followed(cell, private_dir, tmp_path, which):
    env = _clean_env(**{warm.DIR_ENV: str(private_dir)})
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    name = f"{_key(env)}.sock.lock" if which == "lock" else f"{_key(env)}.log"
    (private_dir / name).symlink_to(target)
    code, out = _run_job(cell, tmp_path, env)
    assert code == 0, out
    _ok_csv(tmp_path / "cell.csv")
    assert target.read_text() == "keep me\n"
    assert str(private_dir / name) in out, out


def test_a_plain_file_at_the_warm_dir_path_and_the_job_still_measures(cell, tmp_path):
    blocker = _short_dir("file")
    blocker.write_text("not a directory\n")
    try:
        code, out = _run_job(cell, tmp_path, _clean_env(**{warm.DIR_ENV: str(blocker)}))
    finally:
        blocker.unlink()
    assert code == 0, out
    _ok_csv(tmp_path / "cell.csv")
    assert str(blocker) in out and "not a directory" in out, out


@pytest.mark.parametrize("case", ["absent", "readable", "file", "symlink", "open-mode", "other-owner", "open-parent"])
def test_a_warm_dir_that_is_not_ours_and_private_is_refused(case, tmp_path, monkeypatch, request):
    path, owner = tmp_path / "w", pwd.getpwuid(os.getuid()).pw_name
    if case == "file":
        path.write_text("")
    elif case == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "real")
    elif case == "readable":  # ours, and no one else can write in it (a plain mkdir): made private
        path.mkdir(mode=0o755)
    elif case == "open-mode":
        path.mkdir()
        path.chmod(0o777)
    elif case == "other-owner":
        other = request.getfixturevalue("other_user")
        path.mkdir(mode=0o700)
        os.chown(path, other.pw_uid, other.pw_gid)
        owner = other.pw_name
    elif case == "open-parent":  # whoever can write the parent can swap our directory for theirs
        other = request.getfixturevalue("other_user")
        parent = tmp_path / "shared"
        parent.mkdir()
        parent.chmod(0o777)  # not sticky
        os.chown(parent, other.pw_uid, other.pw_gid)
        path = parent / "w"
        path.mkdir(mode=0o700)
        owner = other.pw_name
    monkeypatch.setenv(warm.DIR_ENV, str(path))
    if case in ("absent", "readable"):
        assert warm.warm_dir() == path and stat.S_IMODE(path.lstat().st_mode) == 0o700
        return
    with pytest.raises(warm.Refused) as refused:
        warm.warm_dir()
    assert str(path.parent if case == "open-parent" else path) in str(refused.value)
    assert owner in str(refused.value)


# ---------------------------------------------------------------- the server: what it takes from a request


@pytest.fixture(scope="module")
def server(cell, tmp_path_factory):
    """A live warm server of ours, started by an ordinary job; its socket path."""
    directory = _short_dir("srv")
    directory.mkdir(mode=0o700)
    work = tmp_path_factory.mktemp("first-job")
    code, out = _run_job(cell, work, _clean_env(**{warm.DIR_ENV: str(directory), warm.IDLE_ENV: "600"}), timeout=300)
    assert code == 0, out
    (sock,) = directory.glob("*.sock")
    yield sock
    _stop_server(sock)
    shutil.rmtree(directory, ignore_errors=True)


def _request(cell: dict, cwd: Path, **over) -> dict:
    return {
        "cell": cell,
        "timeout_s": 60.0,
        "output": "cell.csv",
        "log": "cell.log",
        "env": {},
        "cwd": str(cwd),
        "pid": os.getpid(),
        **over,
    }


def _ask(sock: Path, request: dict | None, timeout: float = 120) -> list[dict]:
    """Send ``request`` (None: nothing) to the server at ``sock``; every message it answers, until it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(sock))
        if request is not None:
            conn.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def _refusal(replies: list[dict]) -> str:
    assert replies and not replies[-1].get("ok"), replies
    assert not any(r.get("accepted") for r in replies), replies
    return replies[-1].get("refused", "")


def _attack_over_the_socket(sock: Path, request: dict, answer: int) -> None:
    request = {**request, "pid": os.getpid()}  # its own pid: only its uid differs
    os.write(answer, json.dumps(_ask(sock, request)).encode())


def test_another_account_that_reaches_the_socket_is_refused(cell, server, other_user, tmp_path):
    # The directory keeps others out; a mistake (a chmod) must not hand them a server running as us.
    target = tmp_path / "written-by-root.csv"  # where the other account cannot write, but we can
    request = _request(cell, Path("/tmp"), output=str(target), log=str(tmp_path / "log"), env={"PATH": "/tmp"})
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in (server.parent, server)}
    server.parent.chmod(0o711)
    server.chmod(0o777)
    read, write = os.pipe()
    try:
        pid = _as(other_user, _attack_over_the_socket, server, request, write)
        os.close(write)
        assert _reap(pid, timeout=120) == 0
        with os.fdopen(read, "rb") as answer:
            replies = json.loads(answer.read() or b"[]")
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
    assert not target.exists(), "the server wrote where the other account chose"
    assert str(other_user.pw_uid) in _refusal(replies)


def test_a_request_that_names_another_pid_is_refused(cell, server, tmp_path):
    replies = _ask(server, _request(cell, tmp_path, pid=os.getppid()))  # the pid it watches and owns the job
    assert str(os.getppid()) in _refusal(replies)
    assert not (tmp_path / "cell.csv").exists()


@pytest.mark.parametrize("case", ["dotdot", "absolute-outside", "symlink-escape", "log-outside"])
def test_output_and_log_stay_inside_the_jobs_directory(cell, server, tmp_path, case):
    job, elsewhere = tmp_path / "job", tmp_path / "elsewhere"
    job.mkdir()
    elsewhere.mkdir()
    over = {
        "dotdot": {"output": "../elsewhere/cell.csv"},
        "absolute-outside": {"output": str(elsewhere / "cell.csv")},
        "symlink-escape": {"output": "results/cell.csv"},
        "log-outside": {"log": str(elsewhere / "cell.log")},
    }[case]
    (job / "results").symlink_to(elsewhere)
    reason = _refusal(_ask(server, _request(cell, job, **over)))
    assert "outside" in reason or ".." in reason, reason
    assert not list(elsewhere.iterdir()) and not (job / "cell.csv").exists()


def _fake_git(directory: Path) -> Path:
    """A `git` that says a made-up commit and leaves a mark where it ran."""
    directory.mkdir()
    git = directory / "git"
    git.write_text(f"#!/bin/sh\ntouch {directory / 'ran'}\necho {FAKE_COMMIT}\n")
    git.chmod(0o755)
    return directory


def test_the_server_takes_from_the_request_only_the_environment_a_cell_reads(cell, server, tmp_path):
    fake = _fake_git(tmp_path / "bin")
    env = {"PATH": str(fake), "LD_PRELOAD": "/nonexistent/evil.so", FAULT_ENV: "error"}  # the fault: a variable that is taken
    replies = _ask(server, _request(cell, tmp_path, env=env))
    assert replies[-1].get("ok"), replies
    rows = pd.read_csv(tmp_path / "cell.csv", dtype={"git_commit": str}, keep_default_na=False)
    assert set(rows["status"]) == {"error"} and rows["error"].str.contains("injected").all()
    assert not (fake / "ran").exists(), "the server ran a git found through the request's PATH"
    assert not rows["git_commit"].str.startswith(FAKE_COMMIT).any()


def test_a_cell_target_that_is_no_studys_measurement_is_refused(cell, server, tmp_path):
    replies = _ask(server, _request({**cell, "target": "os:getcwd"}, tmp_path))
    assert "os:getcwd" in _refusal(replies)
    assert not (tmp_path / "cell.csv").exists()


def test_the_server_drops_a_client_that_never_sends_its_request(server):
    limit = warmcheck.REQUEST_TIMEOUT_S
    start = time.monotonic()
    try:
        replies = _ask(server, None, timeout=limit + 10)
    except TimeoutError:
        pytest.fail("the server waited on a silent client past its request limit")
    assert time.monotonic() - start < limit + 5
    assert not any(r.get("accepted") for r in replies)


# ---------------------------------------------------------------- the job's waits


@pytest.mark.parametrize("after", ["connect", "accepted"])
def test_the_job_gives_up_on_a_server_that_stops_answering(after, private_dir, monkeypatch):
    monkeypatch.setenv(warm.DIR_ENV, str(private_dir))
    monkeypatch.setattr(warm, "ACCEPT_TIMEOUT_S", 1.0, raising=False)
    monkeypatch.setattr(warm, "REPLY_MARGIN_S", 1.0, raising=False)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(warm.socket_path()))
    listener.listen(1)
    listener.settimeout(30)

    def silent_server() -> None:
        conn, _ = listener.accept()
        while not conn.recv(65536).endswith(b"\n"):
            pass
        if after == "accepted":
            conn.sendall(b'{"accepted": true}\n')
        time.sleep(30)
        conn.close()

    threading.Thread(target=silent_server, daemon=True).start()
    got: dict = {}

    def job() -> None:
        try:
            got["reply"] = warm.request_cell({"cell": {}, "timeout_s": 1.0, "output": "x.csv", "log": "x.log"})
        except Exception as exc:
            got["error"] = exc

    client = threading.Thread(target=job, daemon=True)
    client.start()
    client.join(15)
    listener.close()
    assert not client.is_alive(), "the job waited on a silent server"
    if after == "connect":  # nothing taken: the job runs the cell itself
        assert got == {"reply": None}
    else:  # the server took it: past the time limit and margin the job fails (not measure twice); its handler stops with it
        assert isinstance(got.get("error"), RuntimeError) and "no reply within 2 s" in str(got["error"]), got


# ---------------------------------------------------------------- provenance


def test_git_commit_runs_no_git_from_the_path_and_reads_this_checkout(tmp_path):
    fake = _fake_git(tmp_path / "bin")
    other = tmp_path / "other"
    other.mkdir()
    _git(other, "init", "-q")
    _git(other, "commit", "-q", "--allow-empty", "-m", "elsewhere")
    code = "from cs336sys.measure.env import git_commit; print(git_commit())"
    env = {**_clean_env(), "PATH": f"{fake}:{os.environ['PATH']}", "PYTHONPATH": SRC, "GIT_DIR": str(other / ".git")}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert not (fake / "ran").exists() and FAKE_COMMIT not in got.stdout
    assert got.stdout.strip().startswith(_git(REPO, "rev-parse", "--short=12", "HEAD"))


def _git(repo: Path, *args: str) -> str:
    argv = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def _checkout(root: Path, note: str) -> str:
    """A git checkout holding this tree's cs336sys sources; its commit."""
    shutil.copytree(REPO / "src" / "cs336sys", root / "src" / "cs336sys", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "README.md").write_text(note)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", note)
    return _git(root, "rev-parse", "--short=12", "HEAD")


def test_two_checkouts_sharing_one_environment_each_record_their_own_commit(cell, private_dir, tmp_path):
    env = _clean_env(**{warm.DIR_ENV: str(private_dir), warm.IDLE_ENV: "60"})  # one environment: same variables, same warm directory
    commits = {}
    for name in ("a", "b"):
        root = tmp_path / name
        commits[name] = _checkout(root, f"checkout {name}\n")
        code, out = _run_job(cell, root, env, src=str(root / "src"), timeout=300)
        assert code == 0, out
        assert set(_ok_csv(root / "cell.csv")["git_commit"]) == {commits[name]}, f"checkout {name}: {out}"
    assert commits["a"] != commits["b"]
    assert len(_servers(str(private_dir))) == 2
