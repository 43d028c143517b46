"""Importing the user's plug-ins (``cs336sys.plugins``): safely, within a time limit, and recording what they load.

A plug-in's import runs the user's code, which may hang, call ``sys.exit``, change the working
directory or import helpers no static walk sees (``importlib`` at import time, a module outside
``plugins.path``). So every import here goes through :func:`guarded`: whatever it raises
(``SystemExit`` and ``KeyboardInterrupt`` included) becomes a problem naming the ``plugins.…`` key,
and the working directory is put back. :func:`check_imports_in_subprocess` checks the plug-ins of
a config in a child (the workflow's parse imports no torch, nor the user's code) that imports each
in a fork of its own and stops one that runs past ``plugins.import_timeout_s``; the fork records
the files its import loaded (:func:`loaded_since`: every module file neither of the standard library
nor of an installed package, wherever it lives, and our modules that those import), which a cell's
code hash then covers (``plugins.cell_files``). One fork per plug-in: each records exactly what its
own import loads, however many plug-ins share a helper.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import json
import os
import select
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cs336sys.errors import ConfigError
from cs336sys.provenance import PACKAGE, PACKAGE_DIR, imported_names, module_closure, module_file

# The course's BasicsTransformerLM constructor (cs336_basics/model.py), in its order
MODEL_PARAMETERS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta")
_EXIT = os._exit  # bound before any user code runs: a plug-in that replaces os._exit cannot keep a fork alive
START_S = 120.0  # the checking child's own start (python, torch), however loaded the machine: not the user's code
_CODE = "import sys; from cs336sys import plugin_imports; plugin_imports.main(sys.argv[1:])"
# (resolved plugins.path, 'module:attribute') → {file: label} that importing it loaded (this process's record)
_RECORD: dict[tuple[str, str], dict[str, str]] = {}


def problem(key: str, what: str) -> str:
    return f"config key {key!r}: {what}"


def targets(section: Mapping[str, Any]) -> list[tuple[str, str, str | None]]:
    """(config key, 'module:attribute', form; None for the model) of each plug-in in a normalised section."""
    found = [("plugins.model", section["model"], None)] if section.get("model") else []
    found += [(f"plugins.attention.{n}.function", s["function"], s["form"]) for n, s in (section.get("attention") or {}).items()]
    return found


def on_path(path: str) -> str:
    full = str(Path(path).resolve())
    if full not in sys.path:
        sys.path.insert(0, full)
    return full


def describe(exc: BaseException) -> str:
    try:
        if isinstance(exc, SystemExit):
            return f"SystemExit: sys.exit({exc.code!r}) (a plug-in's import must not end the process)"
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose text itself raises
        return f"{type(exc).__name__} (its message cannot be printed)"


def guarded(key: str, call: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """(``call()``, None), or (None, what it raised); the working directory as it was before, whatever ``call`` did."""
    cwd = os.getcwd()
    try:
        return call(), None
    except BaseException as exc:  # noqa: BLE001 - sys.exit or ^C raised by the user's import must not end the CLI or the check
        return None, exc
    finally:
        with contextlib.suppress(OSError):
            moved = os.getcwd()
            if moved != cwd:
                print(f"cs336sys: config key {key!r}: the plug-in changed the working directory to {moved}; back to {cwd}", file=sys.stderr)
        os.chdir(cwd)


# --- which files a process has loaded -------------------------------------------------------------
@functools.cache
def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(getattr(site, "getsitepackages", list)())
    roots.add(getattr(site, "getusersitepackages", str)())
    return tuple(sorted({os.path.join(os.path.realpath(r), "") for r in roots if r}))


def installed(file: str) -> bool:
    """Whether ``file`` belongs to the standard library or an installed package (site- or dist-packages)."""
    real = os.path.realpath(file)
    return real.startswith(_installed_roots()) or any(p in ("site-packages", "dist-packages") for p in Path(real).parts)


def _label(name: str, file: str) -> str:
    """A module's file named from its module name (``pkg/mod.py``, ``pkg/__init__.py``): the same in every checkout."""
    parts, base = name.split("."), os.path.basename(file)
    if base.startswith("__init__."):
        return "/".join([*parts, base])
    return "/".join([*parts[:-1], base]) if base.startswith(parts[-1] + ".") else f"{name}:{base}"


def user_modules() -> dict[str, str]:
    """{real path: label} of the loaded modules' files that are neither of the standard library, nor of an installed package
    (judged by the module's top-level package too: torch's generated modules are torch's), nor ours."""
    found = {}
    for name, module in list(sys.modules.items()):
        try:  # a module's own __getattr__ answers these: it may raise anything
            file = getattr(module, "__file__", None)
            top = getattr(sys.modules.get(name.partition(".")[0]), "__file__", None)
        except Exception:  # noqa: BLE001
            continue
        if not isinstance(file, str) or name == "__main__" or not os.path.isfile(file):
            continue
        if installed(file) or (isinstance(top, str) and installed(top)):
            continue
        real = os.path.realpath(file)
        if not Path(real).is_relative_to(PACKAGE_DIR):
            found[real] = _label(name, file)
    return found


def loaded_since(before: Iterable[str]) -> dict[str, str]:
    """The user's files loaded since :func:`user_modules` answered ``before``, with our modules that they import (and
    what those import: ``provenance.module_closure``), found from the source, since another process may have loaded
    ours before the plug-in: each process then names the same files."""
    known = set(before)
    files = {f: label for f, label in user_modules().items() if f not in known}
    ours = []
    for file in files:
        try:
            tree = ast.parse(Path(file).read_bytes(), file)
        except (OSError, SyntaxError, ValueError):  # an extension module, or a file gone since
            continue
        ours += [m for m in imported_names(tree, "") if m.split(".")[0] == PACKAGE]
    for module in module_closure(ours):
        path = module_file(module)
        if path is not None:
            files[str(path.resolve())] = f"{PACKAGE}/{path.relative_to(PACKAGE_DIR).as_posix()}"
    return files


def record(path: str, target: str, files: Mapping[str, str]) -> None:
    """Add ``files`` ({real path: label}) to what importing ``target`` from ``path`` loads."""
    _RECORD.setdefault((str(Path(path).resolve()), target), {}).update(files)


def recorded(path: str, target: str) -> dict[str, str]:
    return dict(_RECORD.get((str(Path(path).resolve()), target), {}))


def file_label(file: str | Path, root: str) -> str:
    """How a hash names one of a plug-in's files: its path under ``root``, else its module's label, else its real path."""
    real = Path(file).resolve()
    base = Path(root).resolve()
    if real.is_relative_to(base):
        return real.relative_to(base).as_posix()
    return next((files[str(real)] for files in _RECORD.values() if str(real) in files), real.as_posix())


# --- checking: one plug-in ---------------------------------------------------------------------------
def _check_target(section: Mapping[str, Any], key: str, target: str, form: str | None) -> list[str]:
    path = section.get("path")
    module, _, attr = target.partition(":")

    def get() -> Any:
        on_path(path)
        return getattr(importlib.import_module(module), attr, None)

    found, exc = guarded(key, get)
    if exc is not None:
        return [problem(key, f"cannot import {module!r} from {path!r}: {describe(exc)}")]
    if found is None:
        return [problem(key, f"module {module!r} has no attribute {attr!r}")]
    if form is None:
        return _check_model(key, found)
    if not callable(found):
        return [problem(key, f"{target} is a {type(found).__name__}, not callable")]
    if form != "adapter":
        return []
    cls, exc = guarded(key, found)
    if exc is not None:
        return [problem(key, f"calling the adapter {target}() raised {describe(exc)}")]
    if not callable(getattr(cls, "apply", None)):
        hint = "form: adapter; a plain (q, k, v, causal) -> o function is form: callable"
        return [problem(key, f"the adapter {target}() returned {cls!r}, not an autograd.Function class ({hint})")]
    return []


def _check_model(key: str, cls: Any) -> list[str]:
    if not isinstance(cls, type):
        return [problem(key, f"{cls!r} is not a class")]
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError) as exc:
        return [problem(key, f"cannot read the constructor's signature: {exc}")]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    missing = [p for p in MODEL_PARAMETERS if p not in params]
    if missing:
        needs = ", ".join(MODEL_PARAMETERS)
        return [problem(key, f"{cls.__name__}.__init__ lacks the course's parameters {', '.join(missing)} (it needs ({needs}))")]
    return []


def _checked(section: Mapping[str, Any], key: str, target: str, form: str | None) -> dict[str, Any]:
    """The problems of one plug-in, and the files its import and check loaded (in this process)."""
    before = set(user_modules())
    problems = _check_target(section, key, target, form)
    return {"problems": problems, "files": loaded_since(before)}


def check_imports(section: Mapping[str, Any]) -> None:
    """Import each plug-in here and check it (the class's constructor, the adapter's answer), recording the files it
    loaded (a module imported before is not loaded again: its earlier record stays); ConfigError names each bad key."""
    problems = []
    for key, target, form in targets(section):
        found = _checked(section, key, target, form)
        record(section["path"], target, found["files"])
        problems += found["problems"]
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


# --- checking in a child, each plug-in in a fork with a time limit ---------------------------------
def check_imports_in_subprocess(section: Mapping[str, Any]) -> None:
    """:func:`check_imports` in a fresh interpreter, each plug-in within ``plugins.import_timeout_s``, recording here the
    files each loaded; ConfigError names each bad key (one that hangs, exits or kills its process included)."""
    found = targets(section)
    if not found:
        return
    timeout_s = float(section["import_timeout_s"])  # the schema's default, written by validation
    limit = timeout_s * len(found) + START_S  # each plug-in's own limit, and the child's start
    src = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        args = [sys.executable, "-c", _CODE, json.dumps(dict(section)), repr(timeout_s)]
        # a session of its own: whatever the user's code starts is stopped with it, and cannot hold our pipes open
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, start_new_session=True)
        finished = _exited(proc, time.monotonic() + limit)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # before the wait reaps the child: its group id is still ours
        proc.wait()
        out.seek(0)
        err.seek(0)
        report, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    problems, running, ended = [], None, False
    for line in report.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        running = item.get("start", running)
        ended = ended or bool(item.get("end"))
        if "key" in item:
            running = None
            problems += [str(p) for p in item.get("problems") or []]
            record(section["path"], str(item.get("target")), {str(f): str(label) for f, label in (item.get("files") or {}).items()})
    if not ended:
        where = running or "plugins"
        if not finished:
            problems.append(
                problem(
                    where,
                    f"checking the plug-ins did not finish within {limit:g} s (plugins.import_timeout_s: {timeout_s:g} s "
                    f"per plug-in, and {START_S:g} s for the checking process to start)",
                )
            )
        else:
            tail = stderr.strip()[-2000:]
            problems.append(
                problem(
                    where,
                    f"the process checking the plug-ins ended with exit status {proc.returncode} before it had "
                    f"checked them all{': ' + tail if tail else ''}",
                )
            )
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _exited(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until ``proc`` exits, without reaping it where the platform allows (its process group id stays ours until
    then), or until ``deadline``; whether it exited."""
    if not hasattr(os, "waitid"):  # macOS: reaped here; its group is then killed by a number no one else can have taken yet
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
        return proc.returncode is not None
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def main(argv: Iterable[str]) -> None:
    """The checking child: ``argv`` = (the section as JSON, the time limit per plug-in in seconds). Reports one JSON line
    per plug-in on stdout (``{"start": key}`` before it, ``{"key": …, "problems": […], "files": {…}}`` after), then ``{"end": true}``."""
    section_json, timeout = list(argv)
    section, timeout_s = json.loads(section_json), float(timeout)
    report = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the user's code prints goes to stderr: stdout carries the report alone
    with contextlib.suppress(Exception):
        import torch  # noqa: F401 - once, before the forks: each then imports the user's code alone
    for key, target, form in targets(section):
        print(json.dumps({"start": key}), file=report)
        print(json.dumps({"key": key, "target": target, **_in_fork(section, key, target, form, timeout_s)}), file=report)
    print(json.dumps({"end": True}), file=report)


def _in_fork(section: Mapping[str, Any], key: str, target: str, form: str | None, timeout_s: float) -> dict[str, Any]:
    """:func:`_checked` in a fork of this process, stopped after ``timeout_s``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork: never returns
        try:
            os.close(read_end)
            try:
                found = _checked(section, key, target, form)
            except BaseException as exc:  # noqa: BLE001
                found = {"problems": [problem(key, f"checking it raised {describe(exc)}")], "files": {}}
            data = (json.dumps(found) + "\n").encode()
            while data:
                data = data[os.write(write_end, data) :]
        finally:
            _EXIT(0)
    os.close(write_end)
    deadline, data = time.monotonic() + timeout_s, b""
    try:
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {
                    "problems": [
                        problem(
                            key,
                            f"importing and checking {target} did not finish within {timeout_s:g} s "
                            "(plugins.import_timeout_s): an import must not wait or loop",
                        )
                    ],
                    "files": {},
                }
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if not data.endswith(b"\n"):
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.waitstatus_to_exitcode(status)}"
        return {
            "problems": [
                problem(
                    key,
                    f"the process importing {target} ended during the import ({how}) without a word: "
                    "a plug-in's import must not end its process (os._exit, a signal)",
                )
            ],
            "files": {},
        }
    return json.loads(data)
