"""The workflow's config schema, assembled: the run-wide keys, then one section per registered study.

``config.schema.yaml`` beside this module holds the run-wide keys (``device``, ``run``, ``peak_tflops``…)
and the shared types (``$defs``). Each study's section lives with the study, in
``studies/<name>/schema.yaml`` (package data, like the top-level file): its description, its ``grid``
(one entry per axis) and its ``settings``, each with its default. So a study's settings and defaults
are written once, in its own folder, and a study added under ``studies/`` joins the schema, the
``studies`` list and the CLI with no edit here. The ``impl`` axes' names come from the implementation
catalog view they are given (``cs336sys.catalog``: a config's plug-ins included, ``plugins.offered``).
"""

from __future__ import annotations

import copy
import functools
import importlib
from pathlib import Path
from typing import Any

import yaml

from cs336sys import catalog

# package data (pyproject.toml) beside this module, so that a non-editable install finds it; the workflow
# (common.smk) validates against the same file
SCHEMA_PATH = Path(__file__).resolve().with_name("config.schema.yaml")
FRAGMENT = "schema.yaml"  # a study's section, in its package beside __init__.py
FRAGMENT_KEYS = ("description", "grid", "settings")
# every study's jobs need them: cells.smk reads each study's time limit and resources
REQUIRED_SETTINGS = ("timeout_s", "resources")


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> Any:
    return yaml.safe_load(text)


def _read(path: Path) -> Any:
    """The YAML file's data, parsed once per content: validation reads the schema twice, each workflow job's parse again."""
    return copy.deepcopy(_parsed(path.read_text()))


def fragment_path(name: str) -> Path:
    """The schema fragment of study ``name``: ``schema.yaml`` in its package."""
    package = importlib.import_module(f"cs336sys.studies.{name}")
    return Path(package.__file__).resolve().with_name(FRAGMENT)


def study_section(name: str, axes: tuple[str, ...]) -> dict[str, Any]:
    """Study ``name``'s section of the schema, from its fragment; ``axes`` are its registered axes.

    The frame is the same for every study, so the fragment does not repeat it: unknown keys are
    errors, and a section (or its grid) left out takes every default.
    """
    path = fragment_path(name)
    if not path.is_file():
        raise RuntimeError(f"study {name!r} has no config schema: add {path} (docs/adding-a-study.md)")
    fragment = _read(path)
    if not isinstance(fragment, dict) or set(fragment) - set(FRAGMENT_KEYS) or not isinstance(fragment.get("grid"), dict):
        raise RuntimeError(f"{path}: a study's schema is a mapping of {', '.join(FRAGMENT_KEYS)} (grid: one entry per axis)")
    grid, settings = fragment["grid"], fragment.get("settings") or {}
    if tuple(grid) != tuple(axes):
        raise RuntimeError(f"{path}: grid keys {list(grid)} are not study {name!r}'s axes {list(axes)}, in that order")
    missing = [key for key in REQUIRED_SETTINGS if key not in settings]
    if missing or "grid" in settings:
        raise RuntimeError(
            f"{path}: settings must hold {', '.join(REQUIRED_SETTINGS)} and not grid (missing: {', '.join(missing) or 'none'})"
        )
    section = {"type": "object", "additionalProperties": False, "default": {}}
    grid_schema = {"type": "object", "additionalProperties": False, "default": {}, "properties": grid}
    return {
        **section,
        **({"description": fragment["description"]} if "description" in fragment else {}),
        "properties": {"grid": grid_schema, **settings},
    }


def load_schema(schema_path: str | Path = SCHEMA_PATH, offered: catalog.Catalog = catalog.BUILT_IN) -> dict:
    """The whole schema: ``schema_path``'s run-wide keys, each registered study's section, the ``impl`` names
    that ``offered`` holds (a config's, with its plug-ins, where it validates one)."""
    from cs336sys import studies as S  # the registry imports each study's package; none imports torch

    schema = _read(Path(schema_path))
    props = schema.setdefault("properties", {})
    clash = sorted(set(props) & set(S.STUDIES))
    if clash:
        raise RuntimeError(f"{schema_path}: {clash} are studies; a study's section lives in studies/<name>/{FRAGMENT}")
    if "studies" in props:
        props["studies"]["items"] = {"enum": list(S.STUDIES)}
    for name, spec in S.STUDIES.items():
        props[name] = study_section(name, spec.axes)
    for name, spec in S.STUDIES.items():
        impl = props[name]["properties"]["grid"]["properties"].get("impl")
        if impl is not None:  # the implementations of the study's kind (a study with an impl axis has one: S.check_axes)
            impl["items"] = {"enum": list(offered.names(spec.kind))}
    return schema
