"""The schema is assembled: the run-wide keys from pipeline/config.schema.yaml, each study's section from its own package.

A study's settings and defaults live once, with the study (studies/<name>/schema.yaml). A study added
under studies/ with its fragment joins the schema, the `studies` list, validation and the CLI with no
edit to the top-level file: a toy study in a temporary folder shows it.
"""

from __future__ import annotations

import sys
import textwrap
from fnmatch import fnmatch

import pytest
import tomllib
import yaml

from cs336sys import cli
from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN
from cs336sys.pipeline import plan
from cs336sys.pipeline import schema as schema_module
from cs336sys.pipeline.config import ConfigError, load_schema, validate_config
from workflow_helpers import REPO

PACKAGE = REPO / "src" / "cs336sys"
TOP = PACKAGE / "pipeline" / "config.schema.yaml"

TOY_INIT = """from cs336sys.studies import Study

STUDY = Study(name="toy", question="a study added in a test", axes=("width", "depth"), kind="toy")
"""
TOY_SCHEMA = """\
description: a study added in a test
grid:
  width: {$ref: "#/$defs/posints", default: [2, 4]}
  depth: {$ref: "#/$defs/posints", default: [1]}
settings:
  repeats: {$ref: "#/$defs/posint", default: 3, description: how often}
  timeout_s: {$ref: "#/$defs/timeout_s", default: 60}
  resources: {$ref: "#/$defs/resources"}
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A study package `toy` beside the registered ones, found by the registry's own discovery."""
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text(TOY_INIT)
    (package / "schema.yaml").write_text(TOY_SCHEMA)
    monkeypatch.setattr(S, "__path__", [*S.__path__, str(tmp_path)])
    monkeypatch.setattr(S, "STUDIES", S._discover())
    yield package
    sys.modules.pop("cs336sys.studies.toy", None)


def test_the_top_level_file_holds_no_study_section():
    top = yaml.safe_load(TOP.read_text())["properties"]
    assert not set(top) & set(S.STUDIES), "a study's section lives in studies/<name>/schema.yaml"
    assert "items" not in top["studies"], "the studies list is the registry's"


def test_each_study_section_comes_from_its_own_fragment():
    schema = load_schema()
    for name, spec in S.STUDIES.items():
        fragment = yaml.safe_load((PACKAGE / "studies" / name / "schema.yaml").read_text())
        section = schema["properties"][name]
        assert list(section["properties"]["grid"]["properties"]) == list(spec.axes) == list(fragment["grid"])
        assert list(section["properties"])[1:] == list(fragment["settings"]), name
        assert section["additionalProperties"] is False and section["properties"]["grid"]["additionalProperties"] is False


def test_the_fragments_ship_as_package_data():
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["cs336sys"]
    for path in [TOP, *(PACKAGE / "studies").glob("*/schema.yaml")]:
        rel = path.relative_to(PACKAGE).as_posix()
        assert any(fnmatch(rel, g) for g in globs), f"{rel} is not package data (pyproject.toml)"


def test_a_new_study_joins_the_schema_with_no_edit_to_the_top_level_file(toy):
    assert "toy" not in TOP.read_text()
    schema = load_schema()
    assert "toy" in schema["properties"]["studies"]["items"]["enum"]
    config, _ = validate_config({"run": "t", "device": "cpu", "studies": ["toy"]})
    assert config["toy"] == {
        "grid": {"width": [2, 4], "depth": [1]},
        "repeats": 3,
        "timeout_s": 60,
        "resources": {"runtime_min": 30, "mem_mb": 16000},
    }
    assert len(plan.grid("toy", config, BUILT_IN)) == 2
    with pytest.raises(ConfigError, match=r"'toy\.repeat' \(allowed under toy: grid, repeats, timeout_s, resources\)"):
        validate_config({"run": "t", "device": "cpu", "studies": ["toy"], "toy": {"repeat": 2}})
    # the CLI's subcommand and flags come from the same section
    args = cli.build_parser().parse_args(["toy", "--width", "8", "--repeats", "5"])
    assert (args.study, args.width, args.repeats) == ("toy", 8, 5)


def test_a_study_without_its_fragment_is_named(toy):
    (toy / "schema.yaml").unlink()
    with pytest.raises(RuntimeError, match=r"study 'toy' has no config schema: add .*toy/schema\.yaml"):
        load_schema()


@pytest.mark.parametrize(
    "fragment, expected",
    [
        (TOY_SCHEMA.replace("  depth:", "  height:"), r"grid keys \['width', 'height'\] are not study 'toy''s axes \['width', 'depth'\]"),
        (TOY_SCHEMA.replace("  timeout_s: {$ref", "  time_s: {$ref"), r"settings must hold timeout_s, resources .*missing: timeout_s"),
        (TOY_SCHEMA + "defaults: {}\n", r"a study's schema is a mapping of description, grid, settings"),
    ],
    ids=["axes", "timeout", "unknown-key"],
)
def test_a_fragment_that_does_not_fit_its_study_is_named(toy, fragment, expected):
    (toy / "schema.yaml").write_text(textwrap.dedent(fragment))
    with pytest.raises(RuntimeError, match=expected) as info:
        load_schema()
    assert str(toy / "schema.yaml") in str(info.value)


def test_the_top_level_file_may_not_define_a_study_section(tmp_path):
    top = yaml.safe_load(TOP.read_text())
    top["properties"]["e2e"] = {"type": "object"}
    path = tmp_path / "config.schema.yaml"
    path.write_text(yaml.safe_dump(top))
    with pytest.raises(RuntimeError, match=r"\['e2e'\] are studies; a study's section lives in studies/<name>/schema\.yaml"):
        load_schema(path)
    assert schema_module.SCHEMA_PATH == TOP
