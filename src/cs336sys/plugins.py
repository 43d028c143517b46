"""A user's own code, benchmarked beside ours: the config's ``plugins`` section (docs/plugins.md).

```yaml
plugins:
  path: ../my-assignment                                    # put on sys.path (relative to the working directory)
  model: cs336_basics.model:BasicsTransformerLM             # the LM studies build this class instead of ours
  attention:                                                # name → import path; names join the `impl` axis
    my-flash: {function: tests.adapters:get_flashattention_autograd_function_pytorch, form: adapter}
    my-plain: {function: my_kernels:attention, form: callable}
```

Torch-free, so the workflow's parse can validate and register. :func:`activate` checks the section's
shape and names, then registers each attention implementation as a catalog line of family ``user``
whose entry is :func:`user_attention` with the user's import path bound as options: dispatch, the
schema's ``impl`` enums and the cell ids see the names at once. Every process that meets the names
activates the section: the workflow (``pipeline.config.validate_config``), the CLI and the measuring
child (a cell's ``plugins`` setting: the part of the section that the cell runs, so it is also part of
the job's params). :func:`check_imports` imports the user's code (in a subprocess from the workflow,
whose parse must not import torch) and reports a bad path, module, attribute or constructor by its key.
:func:`source_files` walks the user's imports under ``path``, so a cell's code hash follows the user's
files that it runs (``studies.cell_code_hash``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cs336sys import catalog
from cs336sys.errors import ConfigError
from cs336sys.provenance import imported_names

FORMS = ("adapter", "callable")  # adapter: a function returning an autograd.Function class (the course's tests/adapters.py)
ATTENTION_KINDS = (catalog.CORE, catalog.FUSED)  # the kinds of study that feed a core raw (batch, heads, L, d) tensors
# The course's BasicsTransformerLM constructor (cs336_basics/model.py), in its order
MODEL_PARAMETERS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta")
ROPE_THETA = 10000.0  # the course's value, as our TransformerLM's default
OURS = "cs336sys"  # the `model` column of rows measured on our TransformerLM

_ACTIVE: dict[str, Any] = {}  # the section activated last in this process (normalised)


def _problem(key: str, what: str) -> str:
    return f"config key {key!r}: {what}"


def _import_path(value: Any, key: str, problems: list[str]) -> None:
    module, sep, attr = value.partition(":") if isinstance(value, str) else ("", "", "")
    ok = sep and all(p.isidentifier() for p in module.split(".")) and attr.isidentifier()
    if not ok:
        problems.append(_problem(key, f"{value!r} is not an import path (allowed: 'package.module:attribute')"))


def normalise(section: Any) -> dict[str, Any]:
    """The section with its defaults (``form: adapter``), checked for shape and names; ConfigError names each bad key."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"invalid config:\n  {_problem('plugins', f'must be a mapping, not {type(section).__name__}')}")
    problems: list[str] = []
    known = ("path", "model", "attention")
    problems += [_problem(f"plugins.{k}", f"unknown key (allowed under plugins: {', '.join(known)})") for k in section if k not in known]
    out: dict[str, Any] = {}
    path = section.get("path")
    if path is not None:
        if not isinstance(path, str) or not path:
            problems.append(_problem("plugins.path", f"{path!r} is not a directory path"))
        elif not Path(path).is_dir():
            problems.append(
                _problem("plugins.path", f"{path!r} is not a directory (relative paths start at the working directory, {os.getcwd()})")
            )
        out["path"] = path
    if section.get("model") is not None:
        _import_path(section["model"], "plugins.model", problems)
        out["model"] = section["model"]
    attention = section.get("attention") or {}
    if not isinstance(attention, Mapping):
        problems.append(_problem("plugins.attention", "must be a mapping of name → {function, form}"))
        attention = {}
    out_attention = {}
    for name, spec in attention.items():
        key = f"plugins.attention.{name}"
        if not isinstance(name, str) or not catalog.NAME.fullmatch(name):
            problems.append(
                _problem(key, f"{name!r} is not a valid name (allowed: lower-case letters, digits and '-', pattern {catalog.NAME.pattern})")
            )
            continue
        if name in catalog.names() and catalog.lookup(name).family != "user":
            problems.append(_problem(key, f"{name!r} is a built-in implementation ({catalog.lookup(name).about}); give yours another name"))
            continue
        if not isinstance(spec, Mapping):
            problems.append(_problem(key, "must be a mapping {function: 'module:attribute', form: adapter|callable}"))
            continue
        extra = sorted(set(spec) - {"function", "form"})
        problems += [_problem(f"{key}.{k}", "unknown key (allowed: function, form)") for k in extra]
        _import_path(spec.get("function"), f"{key}.function", problems)
        form = spec.get("form", "adapter")
        if form not in FORMS:
            problems.append(_problem(f"{key}.form", f"{form!r} (allowed: {', '.join(FORMS)})"))
        out_attention[name] = {"function": spec.get("function"), "form": form}
    if out_attention:
        out["attention"] = out_attention
    if (out.get("model") or out_attention) and "path" not in out:
        problems.append(_problem("plugins.path", "missing: the directory to import plugins.model and plugins.attention from"))
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return out


def activate(section: Any) -> dict[str, Any]:
    """Check ``section`` and register its attention implementations in the catalog, replacing the ones
    an earlier activation in this process registered; answers the normalised section."""
    found = normalise(section)
    for impl in catalog.impls():
        if impl.family == "user":
            catalog.unregister(impl.name)
    for name, spec in (found.get("attention") or {}).items():
        catalog.register(
            catalog.Impl(name, "user", __name__, {"softmax": "user_attention"}, ATTENTION_KINDS, f"the user's {spec['function']}",
                         options={"function": spec["function"], "form": spec["form"], "path": found["path"]})
        )  # fmt: skip
    _ACTIVE.clear()
    _ACTIVE.update(found)
    dispatch = sys.modules.get("cs336sys.models.attention")
    if dispatch is not None:  # its per-name cache would keep a replaced line's function
        dispatch._callable.cache_clear()
    return found


def check_lm_studies(config: Mapping[str, Any], kinds: Mapping[str, str]) -> None:
    """With ``plugins.model``, an LM study's ``impl`` axis must be ``[eager]``: the user's model runs its own
    attention, so another value would time the same model under a misleading name (rows say ``model``).
    ``kinds``: study → its kind (``Study.kind``)."""
    if not (config.get("plugins") or {}).get("model"):
        return
    problems = [
        _problem(f"{study}.grid.impl", f"{impls} with plugins.model: the user's model runs its own attention, which our "
                                       "impl axis does not reach; set it to [eager] (rows record model: the import path)")
        for study in config.get("studies") or []
        if kinds.get(study) == catalog.LM and (impls := ((config.get(study) or {}).get("grid") or {}).get("impl")) not in (None, ["eager"])
    ]  # fmt: skip
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def active_model() -> tuple[str, str] | None:
    """(path, import path) of the user's LM class activated in this process, None for ours."""
    return (_ACTIVE["path"], _ACTIVE["model"]) if _ACTIVE.get("model") else None


def model_name(section: Mapping[str, Any] | None) -> str:
    """The ``model`` column of an LM cell's rows: ``cs336sys`` or the user's import path."""
    return (section or {}).get("model") or OURS


def cell_plugins(kind: str, axes: Mapping[str, Any], section: Mapping[str, Any] | None) -> dict[str, Any]:
    """The part of ``section`` that one cell (of a study of ``kind``) runs: its selected user implementation, or the model for an LM cell.

    A cell's params carry this alone, so adding a plug-in reruns only the cells that run it.
    """
    section = section or {}
    if kind == catalog.LM and section.get("model"):
        return {"path": section["path"], "model": section["model"]}
    spec = (section.get("attention") or {}).get(axes.get("impl"))
    if kind in ATTENTION_KINDS and spec is not None:
        return {"path": section["path"], "attention": {axes["impl"]: dict(spec)}}
    return {}


# --- importing the user's code --------------------------------------------------------------
def _on_path(path: str) -> str:
    full = str(Path(path).resolve())
    if full not in sys.path:
        sys.path.insert(0, full)
    return full


def load(path: str, target: str) -> Any:
    """The attribute that ``target`` (``module:attribute``) names, imported from directory ``path``."""
    _on_path(path)
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@functools.cache  # one resolution per process: the course's adapter builds its class on each call
def _user_fn(path: str, function: str, form: str):
    found = load(path, function)
    if form == "adapter":
        found = found()  # the course's get_flashattention_autograd_function_*(): an autograd.Function class
        return found.apply
    return found


def user_attention(q, k, v, is_causal: bool = False, *, function: str, form: str, path: str):
    """The user's attention in our convention: ``(..., L, d)`` in and out, causal top-left.

    The course's adapter takes ``[batch, seq, d]`` and a positional ``is_causal``: the leading
    dims (batch, heads) fold into its batch and unfold after.
    """
    fn = _user_fn(path, function, form)
    lead, (seq, dim) = q.shape[:-2], q.shape[-2:]
    flat = [t.reshape(-1, seq, dim) for t in (q, k, v)]
    out = fn(*flat, bool(is_causal))
    return out.reshape(*lead, seq, out.shape[-1])


def check_imports(section: Mapping[str, Any]) -> None:
    """Import each plug-in and check it (the class's constructor, the adapter's answer); ConfigError names each bad key."""
    problems = []
    path = section.get("path")
    targets = [("plugins.model", section["model"])] if section.get("model") else []
    targets += [(f"plugins.attention.{n}.function", s["function"]) for n, s in (section.get("attention") or {}).items()]
    for key, target in targets:
        module, _, attr = target.partition(":")
        try:
            _on_path(path)
            found = getattr(importlib.import_module(module), attr, None)
        except Exception as exc:  # noqa: BLE001 - whatever the user's import raises is the message
            problems.append(_problem(key, f"cannot import {module!r} from {path!r}: {type(exc).__name__}: {exc}"))
            continue
        if found is None:
            problems.append(_problem(key, f"module {module!r} has no attribute {attr!r}"))
        elif key == "plugins.model":
            problems += _check_model(key, found)
        elif not callable(found):
            problems.append(_problem(key, f"{target} is a {type(found).__name__}, not callable"))
        elif section["attention"][key.split(".")[2]]["form"] == "adapter":
            try:
                cls = found()
            except Exception as exc:  # noqa: BLE001
                problems.append(_problem(key, f"calling the adapter {target}() raised {type(exc).__name__}: {exc}"))
                continue
            if not callable(getattr(cls, "apply", None)):
                problems.append(_problem(key, f"the adapter {target}() returned {cls!r}, not an autograd.Function class "
                                              "(form: adapter; a plain (q, k, v, causal) -> o function is form: callable)"))  # fmt: skip
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _check_model(key: str, cls: Any) -> list[str]:
    if not isinstance(cls, type):
        return [_problem(key, f"{cls!r} is not a class")]
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError) as exc:
        return [_problem(key, f"cannot read the constructor's signature: {exc}")]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    missing = [p for p in MODEL_PARAMETERS if p not in params]
    if missing:
        return [_problem(key, f"{cls.__name__}.__init__ lacks the course's parameters {', '.join(missing)} "
                              f"(it needs ({', '.join(MODEL_PARAMETERS)}))")]  # fmt: skip
    return []


def check_imports_in_subprocess(section: Mapping[str, Any]) -> None:
    """:func:`check_imports` in a fresh interpreter: the workflow's parse imports neither torch nor the user's code."""
    if not (section.get("model") or section.get("attention")):
        return
    code = "import json, sys; from cs336sys import plugins; plugins.main(json.loads(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(dict(section))], capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise ConfigError(out.stdout.strip() or f"checking plugins failed: {out.stderr.strip()[-2000:]}")


def main(section: Mapping[str, Any]) -> None:
    try:
        check_imports(section)
    except ConfigError as exc:
        print(exc)
        sys.exit(1)


# --- the user's files a cell runs -----------------------------------------------------------
def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(module: str, path: Path) -> list[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imported_names(ast.parse(path.read_bytes(), str(path)), package)


def source_files(path: str, modules: Iterable[str]) -> list[Path]:
    """The files under directory ``path`` of ``modules`` and of every module they import from it (and their packages)."""
    root = Path(path).resolve()
    seen: set[str] = set()
    files: set[Path] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for i in range(1, len(parts) + 1):  # a module's packages run their __init__ first
            name = ".".join(parts[:i])
            if name in seen:
                continue
            seen.add(name)
            file = _module_file(root, name)
            if file is not None:
                files.add(file)
                todo += _imports(name, file)
    return sorted(files)


def cell_files(section: Mapping[str, Any]) -> list[Path]:
    """The user's files that a cell with plug-in settings ``section`` (:func:`cell_plugins`) runs."""
    if not section:
        return []
    targets = [section["model"]] if section.get("model") else []
    targets += [s["function"] for s in (section.get("attention") or {}).values()]
    return source_files(section["path"], [t.partition(":")[0] for t in targets])


def files_hash(files: Iterable[Path], root: str) -> str:
    """One hash over the contents and ``root``-relative names of the user's ``files``."""
    digest = hashlib.sha256()
    base = Path(root).resolve()
    for file in sorted(files):
        digest.update(file.relative_to(base).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]
