"""A study's measure() takes its settings keyword-only, without defaults: the schema is their one source.

Defaults restated in measure() signatures drifted from the schema (the profile study's warm-up and
measured steps said 5 and 10 where the schema, and so every cell, said 3 and 5). Every caller passes a
cell's complete settings from a validated config (``studies.measure_kwargs``); the LM studies take
the settings they share as one ``LMCell``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pandas as pd
import pytest

from cell_kwargs import cell_kwargs
from cs336sys import studies as S
from cs336sys.catalog import LM

P = inspect.Parameter


def _measure(name: str):
    return importlib.import_module(f"cs336sys.studies.{name}.measure").measure


def _lm_fields() -> set[str]:
    from cs336sys.measure.lm_steps import LMCell

    return {f.name for f in dataclasses.fields(LMCell)}


@pytest.mark.parametrize("name", sorted(S.STUDIES))
def test_measure_takes_its_settings_keyword_only_without_defaults(name):
    params = list(inspect.signature(_measure(name)).parameters.values())
    assert [p.name for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)] == ["device", "context", "session"]
    restated = {p.name: p.default for p in params if p.default is not P.empty}
    assert not restated, f"{name}: measure() restates defaults {restated}; the schema holds them"


@pytest.mark.parametrize("name", sorted(S.STUDIES))
def test_measure_takes_exactly_the_settings_a_cell_gets(name):
    params = inspect.signature(_measure(name)).parameters.values()
    named = {p.name for p in params if p.kind is P.KEYWORD_ONLY}
    rest = [p.name for p in params if p.kind is P.VAR_KEYWORD]
    if S.study(name).kind == LM:  # the shared LM settings arrive as **lm and become one LMCell
        assert rest, f"{name}: an LM study takes its LM settings as **lm (an LMCell)"
        assert not named & _lm_fields(), f"{name}: {sorted(named & _lm_fields())} are LMCell fields"
        named |= _lm_fields()
    else:
        assert not rest, f"{name}: measure() takes **{rest[0]}: a misspelt setting would pass unseen"
    assert named == set(cell_kwargs(name)), name


def test_the_lm_cell_has_no_defaults_either():
    from cs336sys.measure.lm_steps import LMCell

    defaulted = [f.name for f in dataclasses.fields(LMCell) if f.default is not dataclasses.MISSING]
    assert not defaulted and dataclasses.fields(LMCell)
    lm = {k: v for k, v in cell_kwargs("profile").items() if k in _lm_fields()}
    assert LMCell(**lm).spec.d_model > 0
    with pytest.raises(TypeError, match="vocab_size"):
        LMCell(**{k: v for k, v in lm.items() if k != "vocab_size"})


# one tiny CPU cell of each study, as flags of `cs336sys <study>`; a study without a line here runs its
# schema's defaults (each axis's first value), so one whose defaults are already a small CPU cell needs none
TINY_LM = ["--size", "tiny", "--context-length", "8", "--batch-size", "1", "--vocab-size", "64", "--measure-steps", "2"]
QUICK = ["--trials", "1", "--min-warmup-s", "0", "--min-measure-s", "0"]
CLI_CELLS = {
    "e2e": [*TINY_LM, *QUICK, "--warmup-steps", "1", "--target-rel", "0"],
    "warmup": [*TINY_LM, *QUICK, "--warmup-steps", "1"],
    "profile": [*TINY_LM, *QUICK, "--warmup-steps", "1", "--profile-steps", "1"],
    "memory": [*TINY_LM, "--mode", "train"],
    "attention": ["--d-model", "8", "--seq-len", "16", "--batch-size", "1", "--warmup-steps", "1", "--measure-steps", "2", *QUICK],
    "mha": [
        "--embed-dim",
        "16",
        "--num-heads",
        "2",
        "--seq-len",
        "8",
        "--variant",
        "exact-eager",
        "--kernel",
        "softmax",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "2",
        *QUICK,
    ],
    "flash": ["--seq-len", "64", "--head-dim", "16", "--precision", "fp32", "--impl", "eager", "--rep-ms", "1", "--trials", "1"],
    "precision": ["--part", "accumulation"],
}


def test_the_cli_cells_are_of_registered_studies():
    assert set(CLI_CELLS) <= set(S.STUDIES), f"no such study: {sorted(set(CLI_CELLS) - set(S.STUDIES))}"


@pytest.mark.slow  # one measuring child per study
@pytest.mark.parametrize("name", sorted(S.STUDIES))
def test_the_cli_and_the_cell_runner_measure_a_cpu_cell_of_every_study(name, tmp_path, monkeypatch, capsys):
    from cs336sys.cli import main
    from cs336sys.pipeline.cells import FAULT_ENV

    monkeypatch.delenv(FAULT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # the profile study's traces land under ./cs336sys-artifacts
    csv = tmp_path / "rows.csv"
    code = main([name, *CLI_CELLS.get(name, []), "--device", "cpu", "--csv", str(csv)])
    rows = pd.read_csv(csv)
    expected = {"skipped"} if name == "memory" else {"ok"}  # the memory study records CUDA allocator history
    assert set(rows["status"]) == expected, rows[["status", "error"]].to_string()
    assert code == (0 if expected == {"ok"} else 1)
