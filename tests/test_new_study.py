"""A new study is its folder and a config entry: one of kind ``lm`` gets what the LM studies get with no other edit.

Each fact that code outside a study's folder needs is on its ``Study`` (its kind, its cost estimate, its
attention core's shape), so a study added under studies/ (here a toy package in a temporary folder, found by
the registry's own discovery) is offered every LM implementation, gets tokens per joule at the merge, takes
its place in the job order and runs the user's model, as the four LM studies do.
"""

from __future__ import annotations

import sys

import pandas as pd
import pytest

from cs336sys import catalog
from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN
from cs336sys.errors import ConfigError
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import load_schema
from cs336sys.pipeline.merge import derive
from cs336sys.pipeline.priorities import expected_seconds
from cs336sys.plugins import check_lm_studies

TOY_INIT = """from cs336sys.catalog import LM
from cs336sys.studies import Study

STUDY = Study(name="toylm", question="a study added in a test", axes=("size", "context_length", "impl"), kind=LM, estimate_s=42.0)
"""
TOY_SCHEMA = """\
description: a study added in a test
grid:
  size: {$ref: "#/$defs/sizes", default: [small]}
  context_length: {$ref: "#/$defs/posints", default: [64]}
  impl: {$ref: "#/$defs/impls", default: [eager]}
settings:
  batch_size: {$ref: "#/$defs/posint", default: 2}
  timeout_s: {$ref: "#/$defs/timeout_s", default: 60}
  resources: {$ref: "#/$defs/resources"}
"""


@pytest.fixture
def toylm(tmp_path, monkeypatch):
    package = tmp_path / "toylm"
    package.mkdir()
    (package / "__init__.py").write_text(TOY_INIT)
    (package / "schema.yaml").write_text(TOY_SCHEMA)
    monkeypatch.setattr(S, "__path__", [*S.__path__, str(tmp_path)])
    monkeypatch.setattr(S, "STUDIES", S._discover())
    yield S.study("toylm")
    sys.modules.pop("cs336sys.studies.toylm", None)


def test_a_new_lm_study_is_offered_every_lm_implementation(toylm):
    impl = load_schema()["properties"]["toylm"]["properties"]["grid"]["properties"]["impl"]
    assert impl["items"]["enum"] == list(catalog.names(catalog.LM)) and {"eager", "sdpa", "triton"} <= set(impl["items"]["enum"])


def test_a_new_lm_study_gets_tokens_per_joule_at_the_merge(toylm):
    row = {
        "study": "toylm",
        "cell_id": "c",
        "status": "ok",
        "error": "",
        "size": "small",
        "context_length": 64,
        "impl": "eager",
        "batch_size": 2,
        "mode": "train",
        "phase": "step",
        "median_ms": 1.0,
        "energy_j": 0.5,
        "energy_ci_low_j": 0.4,
        "energy_ci_high_j": 0.64,
    }
    out = derive(pd.DataFrame([row]), "toylm").iloc[0]
    assert (out["tokens_per_j"], out["tokens_per_j_ci_low"], out["tokens_per_j_ci_high"]) == pytest.approx((256.0, 200.0, 320.0))


def test_a_new_study_takes_its_place_in_the_job_order_by_its_own_estimate(toylm):
    estimates = {name: S.study(name).estimate_s for name in ("toylm", "e2e")}
    expected = expected_seconds({"toylm": ["c"], "e2e": ["d"]}, {"toylm": 1, "e2e": 1}, lambda s, c, k: f"/nonexistent/{c}.csv", estimates)
    assert expected == {("toylm", "c"): 42.0, ("e2e", "d"): S.study("e2e").estimate_s}


def test_a_new_lm_study_runs_the_users_model_and_keeps_its_impl_axis_eager(toylm):
    config = {
        "device": "cpu",
        "studies": ["toylm"],
        "toylm": {"grid": {}, "batch_size": 2, "timeout_s": 60},
        "plugins": {"path": ".", "model": "my_lm:Model"},
    }
    settings = plan.plan_cell("toylm", {"size": "small", "context_length": 64, "impl": "eager"}, config, BUILT_IN).params()
    assert settings["plugins"] == {"path": ".", "model": "my_lm:Model"}
    config["toylm"]["grid"] = {"impl": ["eager", "sdpa"]}
    with pytest.raises(ConfigError, match=r"'toylm.grid.impl': \['eager', 'sdpa'\] with plugins.model"):
        check_lm_studies(config, {"toylm": toylm.kind})


def test_a_new_lm_studys_rows_say_which_model_ran(toylm):
    from cs336sys.pipeline.cells import Cell, _finish

    cell = Cell("toylm", "c", {"impl": "eager"}, "cs336sys.studies.toylm.measure:measure")
    assert _finish(cell, {}, [{"phase": "step"}], None, {}, {"job": 0.0})[0]["model"] == "cs336sys"
