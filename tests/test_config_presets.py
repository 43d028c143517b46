"""The presets resolve to the settings they always did: a preset names only what it changes.

``fixtures/resolved_presets.json`` holds the validated config (``validate_config``'s output: every
default filled in) of config.yaml alone and of each preset overlaid on it as the workflow reads them
(``snakemake --configfile <preset>``: config.yaml first, the preset merged over it key by key). It was
taken before the presets dropped the keys that restated a default, so trimming a preset, or moving a
default between schema files, must leave these equal. A deliberate change of what a preset runs
regenerates it: ``python tests/test_config_presets.py``.

The comparison is additive (:func:`drift`): what the snapshot does not know may be added, what it
knows may not change.
  - every key the snapshot has must resolve to the same value: a changed default, grid list or
    setting fails, and so does a key that is gone;
  - a key it lacks is new, and passes where the schema declares it (a new study's section, a new
    setting with its default); an entry of a free-form table (``peak_tflops``, ``extra_sizes``)
    is a value, and a new one fails;
  - ``studies`` keeps the snapshot's studies in the snapshot's order; a study the snapshot has no
    section for (a new study, joining config.yaml's ``studies`` and so every preset's) may be added
    to it, while a study dropped from a preset, or an old one added to it, fails.
So adding a study or a setting needs no new snapshot; changing what a preset runs does.
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


def _declared(schema: dict, node: dict) -> dict:
    """The keys ``node`` (a schema node, ``$ref`` followed) declares as properties: none for a free-form table."""
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rpartition("/")[2]]
    return node.get("properties", {})


def drift(expected: dict, actual: dict, schema: dict, node: dict | None = None, path: tuple = ()) -> list[str]:
    """How ``actual`` departs from the snapshot ``expected`` (one line each; none: it holds), as the docstring's rule says.

    ``schema`` is the config schema; ``node`` the part of it at ``path`` (the top level when None).
    """
    node = schema if node is None else node
    declared = _declared(schema, node)
    where = ".".join(map(str, path)) or "<top level>"
    lines = [f"{where}.{key}: gone (snapshot: {expected[key]!r})" for key in expected if key not in actual]
    lines += [f"{where}.{key}: {actual[key]!r} is not in the snapshot" for key in actual if key not in expected and key not in declared]
    for key in expected.keys() & actual.keys():
        want, got, at = expected[key], actual[key], ".".join(map(str, (*path, key)))
        if not path and key == "studies" and isinstance(got, list):
            got = [name for name in got if name in expected]  # a study with no section in the snapshot is new: it may join
        if isinstance(want, dict) and isinstance(got, dict):
            lines += drift(want, got, schema, declared.get(key, {}), (*path, key))
        elif want != got:
            lines.append(f"{at}: {got!r} (snapshot: {want!r})")
    return sorted(lines)


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
    changed = drift(expected, resolved(preset), C.load_schema())
    assert not changed, "\n".join(changed) + "\n(a deliberate change: python tests/test_config_presets.py)"


# drift() on a small schema: an e2e section with a grid and resources, a free-form peak table, and a
# study `toy` that the snapshot below predates
SCHEMA = {
    "$defs": {"resources": {"type": "object", "properties": {"runtime_min": {}, "mem_mb": {}}}},
    "properties": {
        "studies": {"type": "array"},
        "peak_tflops": {"type": "object", "additionalProperties": {"type": "object"}},
        "e2e": {
            "properties": {
                "grid": {"properties": {"size": {}, "precision": {}}},
                "batch_size": {},
                "trials": {},
                "resources": {"$ref": "#/$defs/resources"},
            }
        },
        "toy": {"properties": {"grid": {"properties": {"width": {}}}}},
    },
}
SNAPSHOT = {
    "studies": ["e2e"],
    "peak_tflops": {"H100": {"bf16": 989}},
    "e2e": {"grid": {"size": ["small"], "precision": ["fp32", "bf16"]}, "batch_size": 4, "resources": {"runtime_min": 5}},
}


def _changed(**edits) -> dict:
    out = copy.deepcopy(SNAPSHOT)
    for path, value in edits.items():
        *parents, last = path.split("__")
        parent = out
        for key in parents:
            parent = parent[key]
        parent[last] = value
    return out


@pytest.mark.parametrize(
    "edits",
    [
        {"studies": ["e2e", "toy"], "toy": {"grid": {"width": [8]}}},  # a new study: its section and its name
        {"e2e__trials": 3},  # a new setting, with its default
        {"e2e__resources__mem_mb": 2000},  # a new key of a shared type ($ref)
        {},
    ],
    ids=["new-study", "new-setting", "new-ref-key", "same"],
)
def test_drift_passes_what_the_snapshot_does_not_know(edits):
    assert drift(SNAPSHOT, _changed(**edits), SCHEMA) == []


@pytest.mark.parametrize(
    "edits, line",
    [
        ({"e2e__batch_size": 8}, "e2e.batch_size: 8 (snapshot: 4)"),  # a changed default or setting
        ({"e2e__grid__precision": ["fp32"]}, "e2e.grid.precision: ['fp32'] (snapshot: ['fp32', 'bf16'])"),  # a changed grid
        ({"studies": ["toy"], "toy": {}}, "studies: [] (snapshot: ['e2e'])"),  # a study dropped from the list
        ({"e2e__resources": {}}, "e2e.resources.runtime_min: gone (snapshot: 5)"),  # a key gone
        ({"peak_tflops__A100": {"bf16": 312}}, "peak_tflops.A100: {'bf16': 312} is not in the snapshot"),  # a table's new entry
        ({"e2e__grid__seq_len": [64]}, "e2e.grid.seq_len: [64] is not in the snapshot"),  # a key no schema declares
    ],
    ids=["default", "grid", "study-dropped", "key-gone", "table-entry", "undeclared-key"],
)
def test_drift_fails_on_a_changed_value_of_what_it_knows(edits, line):
    assert line in drift(SNAPSHOT, _changed(**edits), SCHEMA)


def test_drift_fails_when_an_old_study_joins_a_preset_or_the_order_changes():
    both = {**copy.deepcopy(SNAPSHOT), "studies": ["e2e", "memory"], "memory": {"steps": 1}}
    snapshot = {**both, "studies": ["e2e"]}  # the snapshot knows memory (its section) but did not run it
    assert drift(snapshot, both, SCHEMA) == ["studies: ['e2e', 'memory'] (snapshot: ['e2e'])"]
    snapshot = {**both, "studies": ["memory", "e2e"]}
    assert drift(snapshot, both, SCHEMA) == ["studies: ['e2e', 'memory'] (snapshot: ['memory', 'e2e'])"]


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
