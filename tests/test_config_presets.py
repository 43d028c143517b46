"""The presets resolve to the settings they always did: a preset names only what it changes.

``fixtures/resolved_presets.json`` holds the validated config (``validate_config``'s output: every
default filled in) of config.yaml alone and of each preset overlaid on it as the workflow reads them
(``snakemake --configfile <preset>``: config.yaml first, the preset merged over it key by key). It was
taken before the presets dropped the keys that restated a default, so trimming a preset, or moving a
default between schema files, must leave these equal. A deliberate change of what a preset runs
regenerates it: ``python tests/test_config_presets.py``.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import yaml

from cs336sys import plugins
from cs336sys.pipeline import config as C
from workflow_helpers import REPO, deep_update, load_config

FIXTURE = Path(__file__).with_name("fixtures") / "resolved_presets.json"
OVERLAYS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "config").rglob("*.yaml"))
GPU = "NVIDIA H100 80GB HBM3"  # `run: auto` names the run after the GPU: the same on every machine here


def resolved(preset: str | None) -> dict:
    """The validated config of config.yaml, with ``preset`` over it (None: config.yaml alone)."""
    return _validated(load_config(REPO, *([preset] if preset else [])))


def _validated(config: dict) -> dict:
    try:
        C.validate_config(config)
    finally:
        plugins.activate({})  # the catalog is per process: leave no plug-in's name to the next test
    return json.loads(json.dumps(config))


def _snapshot() -> dict[str, dict]:
    return {preset or "config.yaml": resolved(preset) for preset in [None, *OVERLAYS]}


@pytest.fixture
def fixed_gpu(monkeypatch):
    monkeypatch.setattr(C, "detected_gpu_name", lambda: GPU)
    monkeypatch.chdir(REPO)  # plug-in paths are relative to the working directory


def test_every_preset_is_in_the_snapshot():
    assert sorted(json.loads(FIXTURE.read_text())) == sorted(["config.yaml", *OVERLAYS])


@pytest.mark.parametrize("preset", [None, *OVERLAYS], ids=lambda p: p or "config.yaml")
def test_a_preset_resolves_to_its_snapshot(fixed_gpu, preset):
    expected = json.loads(FIXTURE.read_text())[preset or "config.yaml"]
    assert resolved(preset) == expected


def _keys(mapping: dict, prefix: tuple = ()):
    """Every key path of a config file, nested mappings' keys too (merged key by key, so each may be left out alone)."""
    for key, value in mapping.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from _keys(value, prefix + (key,))


def _without(mapping: dict, path: tuple) -> dict:
    out = copy.deepcopy(mapping)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return out


@pytest.mark.parametrize("preset", [None, *OVERLAYS], ids=lambda p: p or "config.yaml")
def test_a_preset_names_only_what_it_changes(fixed_gpu, preset):
    """Each key of config.yaml differs from its default; each key of a preset differs from what config.yaml gives it."""
    base = yaml.safe_load((REPO / "config.yaml").read_text())
    doc = yaml.safe_load((REPO / (preset or "config.yaml")).read_text())
    whole = resolved(preset)

    def with_doc(doc: dict) -> dict:
        return copy.deepcopy(doc) if preset is None else deep_update(copy.deepcopy(base), copy.deepcopy(doc))

    restated = []
    for path in _keys(doc):
        trial = with_doc(_without(doc, path))
        try:
            same = _validated(trial) == whole
        except C.ConfigError:  # a required key, or a study section left empty
            same = False
        if same:
            restated.append(".".join(map(str, path)))
    assert not restated, f"{preset or 'config.yaml'} restates {restated}: leave them out (a comment may say the value)"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    import os

    os.chdir(REPO)
    C.detected_gpu_name = lambda: GPU
    FIXTURE.write_text(json.dumps(_snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
