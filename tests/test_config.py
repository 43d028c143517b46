"""Config validation: the JSON schema (types, unknown keys) and the cross-key checks, before any job runs."""

from __future__ import annotations

import copy
import re

import jsonschema
import pytest
import yaml
from workflow_helpers import DEMO, REPO, copy_repo, load_config, snakemake, write_yaml

from cs336sys import studies as S
from cs336sys.config import ConfigError, validate_config
from cs336sys.sizes import known_sizes

SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
PRESETS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "config").glob("*.yaml"))


@pytest.fixture(scope="module")
def demo_config():
    return load_config(REPO, DEMO)


@pytest.fixture
def cfg(demo_config):
    return copy.deepcopy(demo_config)


def _error(config) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config, SCHEMA)
    return str(info.value)


def test_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(yaml.safe_load(SCHEMA.read_text()))


def test_schema_studies_match_the_library_and_the_rules():
    schema = yaml.safe_load(SCHEMA.read_text())
    names = schema["properties"]["studies"]["items"]["enum"]
    assert set(names) == set(S.STUDIES), "the schema's study list and cs336sys.studies.STUDIES differ"
    (pattern,) = schema["properties"]["resources"]["patternProperties"]
    for name in names:
        assert name in schema["properties"], f"the schema has no {name!r} section"
        assert re.match(pattern, name), f"resources.{name} is not allowed by the schema"
        rules = (REPO / "workflow" / "rules" / f"{name}.smk").read_text()
        assert re.search(rf"^rule {name}_cell:", rules, re.M), f"workflow/rules/{name}.smk has no rule {name}_cell"


def test_default_config_validates():
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
        ("e2e.context_lengths", [0]),
        ("attention.seq_len", "64"),
        ("mha.variants", ["exact"]),
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
    assert repr(path) in message or f"'{path}." in message, message  # 'e2e.context_lengths.0' names the item


def test_every_problem_is_reported_at_once(cfg):
    cfg["e2e"]["batch_size"] = "four"
    cfg["mha"]["bogus"] = 1
    message = _error(cfg)
    assert "e2e.batch_size" in message and "mha.bogus" in message


def test_unknown_model_size_lists_the_known_sizes(cfg):
    cfg["e2e"]["sizes"] = ["tiny", "huge"]
    message = _error(cfg)
    assert "'huge'" in message and "e2e.sizes" in message
    for name in known_sizes(cfg["extra_sizes"]):
        assert name in message, f"known size {name!r} not listed: {message}"


def test_unknown_warmup_size_is_named(cfg):
    cfg["warmup"]["size"] = "huge"
    message = _error(cfg)
    assert "warmup.size" in message and "'huge'" in message


def test_study_without_its_section_is_named(cfg):
    cfg["studies"] = ["e2e", "flash"]
    del cfg["flash"]
    assert "flash" in _error(cfg)


def test_snakemake_rejects_a_bad_config_before_any_job(tmp_path):
    root = copy_repo(tmp_path / "repo")
    write_yaml(root / "config" / "test-bad.yaml", {"e2e": {"batchsize": 4}})
    r = snakemake(root, "-n", "--configfile", DEMO, "config/test-bad.yaml", timeout=600)
    assert r.returncode != 0, r.describe()
    assert "e2e.batchsize" in r.output, r.describe()
    assert not (root / "results").exists() and not (root / "logs").exists()
