"""Config validation: the JSON schema (types, unknown keys) and the cross-key checks, before any job runs."""

from __future__ import annotations

import copy
import re

import jsonschema
import pytest
import yaml

from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN
from cs336sys.models.sizes import known_sizes
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import ConfigError, load_schema, validate_config
from workflow_helpers import DEMO, REPO, copy_repo, load_config, snakemake, write_yaml

SCHEMA = REPO / "src" / "cs336sys" / "pipeline" / "config.schema.yaml"  # package data, beside pipeline/config.py
PRESETS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "config").glob("*.yaml"))


def _error(config) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config, SCHEMA)
    return str(info.value)


def test_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(yaml.safe_load(SCHEMA.read_text()))
    jsonschema.Draft202012Validator.check_schema(load_schema(SCHEMA))  # with every study's section


def test_schema_studies_match_the_library_and_the_rules():
    schema = load_schema(SCHEMA)
    names = schema["properties"]["studies"]["items"]["enum"]
    assert set(names) == set(S.STUDIES), "the schema's study list and cs336sys.studies.STUDIES differ"
    assert "resources" not in schema["properties"], "resources live in each study's section now"
    for name in names:
        assert name in schema["properties"], f"the schema has no {name!r} section"
        section = schema["properties"][name]["properties"]
        assert "resources" in section, f"{name}.resources is not allowed by the schema"
        assert set(section["grid"]["properties"]) == set(S.study(name).axes), f"{name}.grid keys are not the study's axes"
    # one loop makes every study's cell rule from the registry: no per-study rule file
    rules = (REPO / "workflow" / "rules" / "cells.smk").read_text()
    assert re.search(r"^for (\w+) in STUDIES:", rules, re.M), "workflow/rules/cells.smk does not loop over the studies"
    assert 'f"{_study}_cell"' in rules, "workflow/rules/cells.smk does not name the rules <study>_cell"
    assert not [p.name for p in (REPO / "workflow" / "rules").glob("*.smk") if p.stem in names], "a per-study rule file is back"


def test_default_config_validates(monkeypatch):
    monkeypatch.setattr("cs336sys.pipeline.config.detected_gpu_name", lambda: None)  # run: auto (test_run_name asks a GPU)
    validate_config(load_config(REPO), SCHEMA)


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_validate_over_the_default(preset):
    validate_config(load_config(REPO, preset), SCHEMA)


def test_cpu_demo_preset_exists():
    assert DEMO in PRESETS


def test_unknown_top_level_key_is_named(cfg):
    cfg["studys"] = ["e2e"]
    assert "'studys'" in _error(cfg)


def test_unknown_nested_key_is_named(cfg):
    cfg["e2e"]["batchsize"] = 4
    assert "'e2e.batchsize'" in _error(cfg)


def test_unknown_key_in_an_extra_size_is_named(cfg):
    cfg["extra_sizes"]["tiny"]["d_modle"] = 64
    assert "extra_sizes.tiny.d_modle" in _error(cfg)


@pytest.mark.parametrize(
    "path, value",
    [
        ("e2e.batch_size", "four"),
        ("e2e.grid.context_length", [0]),
        ("attention.grid.seq_len", "64"),
        ("mha.grid.variant", ["exact"]),
        ("device", "tpu"),
        ("memory_fraction", 1.5),
    ],
)
def test_wrong_type_or_value_names_the_key(cfg, path, value):
    *parents, key = path.split(".")
    block = cfg
    for p in parents:
        block = block[p]
    block[key] = value
    message = _error(cfg)
    assert repr(path) in message or f"'{path}." in message, message  # 'e2e.grid.context_length.0' names the item


def test_every_problem_is_reported_at_once(cfg):
    cfg["e2e"]["batch_size"] = "four"
    cfg["mha"]["bogus"] = 1
    message = _error(cfg)
    assert "e2e.batch_size" in message and "mha.bogus" in message


def test_unknown_model_size_lists_the_known_sizes(cfg):
    cfg["e2e"]["grid"]["size"] = ["tiny", "huge"]
    message = _error(cfg)
    assert "'huge'" in message and "e2e.grid.size" in message
    for name in known_sizes(cfg["extra_sizes"]):
        assert name in message, f"known size {name!r} not listed: {message}"


def test_unknown_warmup_size_is_named(cfg):
    cfg["warmup"]["grid"]["size"] = ["huge"]
    message = _error(cfg)
    assert "warmup.grid.size" in message and "'huge'" in message


def test_unknown_study_is_named(cfg):
    cfg["studies"] = ["e2e", "flsh"]
    assert "'flsh'" in _error(cfg)


def test_study_without_its_section_takes_the_schema_defaults(cfg):
    """A study's section may be omitted: validation fills it from the schema's defaults."""
    cfg["studies"] = ["e2e", "flash"]
    del cfg["flash"]
    validate_config(cfg, SCHEMA)
    flash = load_schema(SCHEMA)["properties"]["flash"]["properties"]
    for axis in S.study("flash").axes:
        assert cfg["flash"]["grid"][axis] == flash["grid"]["properties"][axis]["default"], axis
    assert cfg["flash"]["timeout_s"] == flash["timeout_s"]["default"]
    assert set(cfg["flash"]["resources"]) == {"runtime_min", "mem_mb"}
    assert plan.grid("flash", cfg, BUILT_IN), "the default flash grid has no cell"


def test_validation_fills_every_default_into_the_sections_it_checks(cfg):
    del cfg["e2e"]["batch_size"], cfg["e2e"]["resources"]
    assert "compile" not in cfg["e2e"]["grid"] and "peak_tflops" not in cfg  # the presets leave them to their defaults
    validate_config(cfg, SCHEMA)
    schema = load_schema(SCHEMA)
    assert cfg["e2e"]["batch_size"] == schema["properties"]["e2e"]["properties"]["batch_size"]["default"]
    assert cfg["e2e"]["grid"]["compile"] == [False]
    assert cfg["e2e"]["resources"] == {"runtime_min": 30, "mem_mb": 16000}
    assert cfg["peak_tflops"] == {}
    # a study listed with `null` for its section gets the defaults too
    nulled = copy.deepcopy(cfg)
    nulled["mha"] = None
    validate_config(nulled, SCHEMA)
    assert nulled["mha"]["grid"]["variant"] == ["exact-eager", "exact-sdpa", "performer"]


def test_top_level_resources_are_gone(cfg):
    cfg["resources"] = {"e2e": {"runtime_min": 5, "mem_mb": 2000}}
    assert "'resources'" in _error(cfg)


def test_time_limit_is_not_a_cell_setting(cfg):
    """timeout_s travels as a job resource: changing it must not change what a cell measures (its params)."""
    validate_config(cfg, SCHEMA)
    for study in cfg["studies"]:
        axes = next(iter(plan.grid(study, cfg, BUILT_IN).values()))
        before = plan.plan_cell(study, axes, cfg, BUILT_IN).params()
        assert "timeout_s" not in before["settings"] and "timeout_s" not in before
        assert "resources" not in before["settings"] and "grid" not in before["settings"]
        changed = copy.deepcopy(cfg)
        changed[study]["timeout_s"] = cfg[study]["timeout_s"] * 2
        changed[study]["resources"]["runtime_min"] += 1
        assert plan.plan_cell(study, axes, changed, BUILT_IN).params() == before, study


def test_passes_are_the_jobs_not_the_cells_params(cfg):
    """Adding a pass reruns only the new pass: the passes reach a cell as a job field (its Session's Policy.passes)."""
    validate_config(cfg, SCHEMA)
    axes = next(iter(plan.grid("e2e", cfg, BUILT_IN).values()))
    before = plan.plan_cell("e2e", axes, cfg, BUILT_IN)
    changed = copy.deepcopy(cfg)
    changed["e2e"]["passes"] = cfg["e2e"]["passes"] + 1
    after = plan.plan_cell("e2e", axes, changed, BUILT_IN)
    assert after.params() == before.params() and "passes" not in before.params()["policy"]
    assert (before.passes, after.passes) == (cfg["e2e"]["passes"], cfg["e2e"]["passes"] + 1)


@pytest.mark.slow
def test_snakemake_rejects_a_bad_config_before_any_job(tmp_path):
    root = copy_repo(tmp_path / "repo")
    write_yaml(root / "config" / "test-bad.yaml", {"e2e": {"batchsize": 4}})
    r = snakemake(root, "-n", "--configfile", DEMO, "config/test-bad.yaml", timeout=600)
    assert r.returncode != 0, r.describe()
    assert "e2e.batchsize" in r.output, r.describe()
    assert not (root / "results").exists() and not (root / "logs").exists()
