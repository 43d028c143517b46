"""The presets resolve to the settings they always did: a preset names only what it changes.

``fixtures/resolved_presets.json`` holds the validated config (``validate_config``'s output: every
default filled in) of config.yaml alone and of each preset overlaid on it as the workflow reads them
(``snakemake --configfile <preset>``: config.yaml first, the preset merged over it key by key). It was
taken before the presets dropped the keys that restated a default, so trimming a preset, or moving a
default between schema files, must leave these equal. A deliberate change of what a preset runs
regenerates it: ``python tests/test_config_presets.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cs336sys import plugins
from cs336sys.pipeline import config as C
from workflow_helpers import REPO, load_config

FIXTURE = Path(__file__).with_name("fixtures") / "resolved_presets.json"
OVERLAYS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "config").rglob("*.yaml"))
GPU = "NVIDIA H100 80GB HBM3"  # `run: auto` names the run after the GPU: the same on every machine here


def resolved(preset: str | None) -> dict:
    """The validated config of config.yaml, with ``preset`` over it (None: config.yaml alone)."""
    config = load_config(REPO, *([preset] if preset else []))
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


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    import os

    os.chdir(REPO)
    C.detected_gpu_name = lambda: GPU
    FIXTURE.write_text(json.dumps(_snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
