"""A user's own code, benchmarked beside ours: the config's ``plugins`` section (docs/plugins.md).

```yaml
plugins:
  path: ../my-assignment                                    # put on sys.path (relative to the working directory)
  model: cs336_basics.model:BasicsTransformerLM             # the LM studies build this class instead of ours
  attention:                                                # name → import path; names join the `impl` axis
    my-flash: {function: tests.adapters:get_flashattention_autograd_function_pytorch, form: adapter}
    my-plain: {function: my_kernels:attention, form: callable}
```

Torch-free, so the workflow's parse can validate. :func:`normalise` checks the section's shape and
names; each attention implementation is a catalog line of family ``user`` (:func:`user_lines`) whose
entry is :func:`user_attention` with the user's import path bound as options. Validation answers the
config with :func:`offered`, the built-in lines plus these, and what plans cells, builds the schema's
``impl`` enums or the CLI's choices asks that view: nothing is registered to let them see the names.
Only the measuring child, a fresh process per cell, registers its cell's part of the section in its
own process (:func:`activate`: a cell's ``plugins`` setting, so it is also part of the job's params),
for dispatch and the model to find. :func:`check_imports_in_subprocess` (``plugin_imports``) imports the user's code in
a child with a time limit and reports a bad path, module, attribute or constructor, an import that
hangs or ends its process, by its key; the measuring child imports it again (:func:`preload`).
A cell's code hash follows the user's files that it runs (``pipeline.plan.cell_code_hash``):
:func:`source_files` walks the user's imports under ``path``, and :func:`cell_files` adds every file
the imports loaded where they were checked; :func:`unhashed_note` names the ones loaded later.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cs336sys import catalog
from cs336sys.errors import ConfigError
from cs336sys.plugin_imports import describe, file_label, guarded, loaded_since, on_path, problem, record, recorded, targets, user_modules
from cs336sys.provenance import imported_names

FORMS = ("adapter", "callable")  # adapter: a function returning an autograd.Function class (the course's tests/adapters.py)
ATTENTION_KINDS = (catalog.CORE, catalog.FUSED)  # the kinds of study that feed a core raw (batch, heads, L, d) tensors
# The course's BasicsTransformerLM constructor (cs336_basics/model.py), in its order
MODEL_PARAMETERS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta")
ROPE_THETA = 10000.0  # the course's value, as our TransformerLM's default
OURS = "cs336sys"  # the `model` column of rows measured on our TransformerLM

_ACTIVE: dict[str, Any] = {}  # the section a measuring child activated (normalised)


_problem = problem


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
    known = ("path", "model", "attention", "import_timeout_s")
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
    if "import_timeout_s" in section:  # its range and default: the schema's
        out["import_timeout_s"] = section["import_timeout_s"]
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
        if name in catalog.BUILT_IN.names():
            problems.append(
                _problem(key, f"{name!r} is a built-in implementation ({catalog.BUILT_IN.lookup(name).about}); give yours another name")
            )
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


def user_lines(section: Mapping[str, Any]) -> list[catalog.Impl]:
    """The catalog lines of a normalised section's attention implementations (family ``user``)."""
    return [
        catalog.Impl(
            name,
            "user",
            __name__,
            {"softmax": "user_attention"},
            ATTENTION_KINDS,
            f"the user's {spec['function']}",
            options={"function": spec["function"], "form": spec["form"], "path": section["path"]},
        )
        for name, spec in (section.get("attention") or {}).items()
    ]


def offered(section: Any) -> catalog.Catalog:
    """The implementations a config with plug-in section ``section`` offers: the built-in lines and the user's
    (the section is checked first: ConfigError names each bad key)."""
    return catalog.BUILT_IN.plus(user_lines(normalise(section)))


def activate(section: Any) -> dict[str, Any]:
    """In a measuring child (or a test standing for one): check ``section`` and register its attention
    implementations and model in this process, replacing what an earlier activation registered; answers the
    normalised section. Validation and planning never call it: they ask :func:`offered`."""
    found = normalise(section)
    for impl in catalog.impls():
        if impl.family == "user":
            catalog.unregister(impl.name)
    for line in user_lines(found):
        catalog.register(line)
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
        _problem(
            f"{study}.grid.impl",
            f"{impls} with plugins.model: the user's model runs its own attention, which our "
            "impl axis does not reach; set it to [eager] (rows record model: the import path)",
        )
        for study in config.get("studies") or []
        if kinds.get(study) == catalog.LM and (impls := ((config.get(study) or {}).get("grid") or {}).get("impl")) not in (None, ["eager"])
    ]
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def active_model() -> tuple[str, str] | None:
    """(path, import path) of the user's LM class activated in this process, None for ours."""
    return (_ACTIVE["path"], _ACTIVE["model"]) if _ACTIVE.get("model") else None


def model_name(section: Mapping[str, Any] | None) -> str:
    """The ``model`` column of an LM cell's rows (``section``: its plug-ins): ``cs336sys`` or the user's import path."""
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
def load(path: str, target: str) -> Any:
    """The attribute that ``target`` (``module:attribute``) names, imported from directory ``path``."""
    on_path(path)
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
    batch = flat[0].shape[0]
    if getattr(out, "ndim", 0) < 1 or out.shape[0] != batch:
        return out  # not a batch of outputs: the correctness check names what came back
    return out.reshape(*lead, *out.shape[1:])  # the rest as the user's code shaped it, for the check to see


def preload(section: Mapping[str, Any]) -> set[str]:
    """Import the plug-ins of a cell's ``section`` in this process (the measuring child) before its measurement, each
    failure (``sys.exit`` included) a ConfigError naming its key, recording what each import loaded; answers the
    user files loaded before (:func:`unhashed_note`)."""
    before = set(user_modules())
    problems = []
    for key, target, form in targets(section):
        loaded = set(user_modules())
        call = (
            functools.partial(load, section["path"], target) if form is None else functools.partial(_user_fn, section["path"], target, form)
        )
        _, exc = guarded(key, call)
        record(section["path"], target, loaded_since(loaded))
        if exc is not None:
            problems.append(_problem(key, f"importing {target} from {section['path']!r} raised {describe(exc)}"))
    if problems:
        raise ConfigError("; ".join(problems))
    return before


def loaded_by_import(section: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """{'module:attribute': {file: label}} that importing each plug-in of ``section`` loaded in this process."""
    return {target: recorded(section["path"], target) for _, target, _ in targets(section)}


def record_loaded(section: Mapping[str, Any], loaded: Mapping[str, Mapping[str, str]]) -> None:
    """Add what another process's import loaded (:func:`loaded_by_import`) to this process's record."""
    for target, files in loaded.items():
        record(section["path"], target, files)


def unhashed_note(section: Mapping[str, Any], before: set[str]) -> str:
    """What this process loaded since ``before`` (:func:`preload`) of the user's files that the cell's code hash does not
    cover (a helper imported only when called): editing one reruns nothing. "" where there is none."""
    covered = {str(f.resolve()) for f in cell_files(section)}
    missed = sorted(f for f in user_modules() if f not in before and f not in covered)
    if not missed:
        return ""
    return (
        f"the plug-in loaded {', '.join(missed)} while it ran, after its import: this cell's code hash does not cover "
        f"{'them' if len(missed) > 1 else 'it'}, so editing {'them' if len(missed) > 1 else 'it'} reruns nothing (import it at the "
        "plug-in's module level to have it hashed)"
    )


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
    """The user's files that a cell with plug-in settings ``section`` (:func:`cell_plugins`) runs: the static walk of
    :func:`source_files` and every file that importing its plug-ins loaded where this process checked or imported them
    (``plugin_imports``: helpers imported dynamically or from outside ``path`` included)."""
    if not section:
        return []
    found = [target for _, target, _ in targets(section)]
    files = set(source_files(section["path"], [t.partition(":")[0] for t in found]))
    files.update(Path(f) for target in found for f in recorded(section["path"], target))
    return sorted(files)


def files_hash(files: Iterable[Path], root: str) -> str:
    """One hash over the contents and names of the user's ``files`` (:func:`plugin_imports.file_label`: under ``root``
    by their path there, elsewhere by their module's name, so that another checkout's hash is the same)."""
    digest = hashlib.sha256()
    for label, file in sorted((file_label(f, root), Path(f)) for f in files):
        digest.update(label.encode())
        try:
            digest.update(file.read_bytes())
        except OSError:  # gone since it was loaded: a change all the same
            digest.update(b"\0missing")
    return digest.hexdigest()[:16]
