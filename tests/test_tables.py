"""Result tables: merging cell CSVs; the small runs of tests/fixtures/cpu-demo/ (cut from a CPU demo: every
study the handout's answers read, and any other that has one) and every committed reference run, old column names included, load with today's axes and cell ids."""

from __future__ import annotations

import math
import subprocess
import typing

import pandas as pd
import pytest

from cs336sys import studies as S
from cs336sys.analysis.tables import failures, of_kind, ok_rows
from cs336sys.catalog import BUILT_IN
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import validate_config
from cs336sys.pipeline.merge import load_study, merge_cells, upgrade
from cs336sys.rows import HEAD_COLUMNS, write_csv_atomic
from workflow_helpers import DEMO, REPO, load_config

FIXTURE = REPO / "tests" / "fixtures" / "cpu-demo"  # tests/fixtures/make_demo_fixture.py rebuilds it


def _fixture_csvs() -> list[str]:
    return sorted(p.relative_to(REPO).as_posix() for p in FIXTURE.glob("*.csv"))


def _committed_csvs() -> list[str]:
    """The reference runs' merged CSVs (docs/results.md); none outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "results/*.csv", "results/*/*.csv"], cwd=REPO, capture_output=True, text=True, timeout=60)
        return sorted(out.stdout.split()) if out.returncode == 0 else []
    except OSError:
        return []


@pytest.fixture(scope="module")
def demo_config():
    return validate_config(load_config(REPO, DEMO))[0]


def _old_frame(study: str, axes: dict) -> pd.DataFrame:
    """One row as a run from before the axes' renaming wrote it: old column names, old cell id."""
    old = {new: old for old, new in S.study(study).renamed.items()}
    row = {"study": study, "cell_id": "old-style-id", "status": "ok", "error": ""}
    row.update({old.get(axis, axis): value for axis, value in axes.items()})
    row.update(mode="train", phase="step", median_ms=2.0)
    return pd.DataFrame([row])


@pytest.mark.parametrize("study", sorted(name for name in S.STUDIES if S.study(name).renamed))
def test_upgrade_renames_old_axis_columns_and_rebuilds_cell_ids(demo_config, study):
    spec = S.study(study)
    axes = {**plan.cells(study, demo_config[study], BUILT_IN)[0], **spec.added_axes}  # an axis added since has its old runs' value
    old = _old_frame(study, axes)
    old = old.drop(columns=[{v: k for k, v in spec.renamed.items()}.get(a, a) for a in spec.added_axes])  # not a column then
    assert set(spec.renamed) & set(old.columns), "the old frame should carry old names"
    new = upgrade(old, study)
    assert set(spec.axes) <= set(new.columns)
    assert not set(spec.renamed) & set(new.columns), f"old names left: {set(spec.renamed) & set(new.columns)}"
    assert new["cell_id"].tolist() == [S.cell_id(study, {a: new[a].iloc[0] for a in S.study(study).axes})]
    for axis, value in axes.items():
        assert new[axis].iloc[0] == value, axis
    assert list(new.columns[: len(HEAD_COLUMNS)]) == HEAD_COLUMNS
    assert new["median_ms"].iloc[0] == 2.0


def test_upgrade_prefers_the_old_axis_over_a_setting_of_the_same_new_name():
    # flash runs wrote the axis `heads` and the setting `num_heads` side by side
    axes = {"seq_len": 64, "head_dim": 16, "precision": "fp32", "impl": "eager", "num_heads": 4}
    old = _old_frame("flash", axes).assign(num_heads=1)
    new = upgrade(old, "flash")
    assert list(new.columns).count("num_heads") == 1 and new["num_heads"].iloc[0] == 4
    assert new["cell_id"].iloc[0] == S.cell_id("flash", axes)


def test_upgrade_is_a_no_op_on_current_frames(demo_config):
    for study in S.STUDIES:
        axes = plan.cells(study, demo_config[study], BUILT_IN)[0]
        current = pd.DataFrame([{"study": study, "cell_id": S.cell_id(study, axes), "status": "ok", "error": "", **axes}])
        assert upgrade(current, study) is current


@pytest.mark.parametrize("path", _fixture_csvs() + [pytest.param(p, marks=pytest.mark.slow) for p in _committed_csvs()])
def test_runs_load_with_the_current_axes_and_cell_ids(path):
    df = load_study(REPO / path)
    study = str(df["study"].iloc[0])
    axes = S.study(study).axes
    assert set(axes) <= set(df.columns), f"{path}: missing axes {set(axes) - set(df.columns)}"
    assert not set(S.study(study).renamed) & set(df.columns), f"{path}: old column names left"
    expected = [S.cell_id(study, dict(zip(axes, values))) for values in df[list(axes)].itertuples(index=False)]
    assert df["cell_id"].tolist() == expected
    assert not df["error"].isna().any()  # read as text, empty for ok rows
    assert (df.loc[df["status"] != "ok", "error"] != "").all(), f"{path}: a failure row without its error"
    findings = S.report_module(study).findings(df)
    assert isinstance(findings, str) and findings.strip(), f"{path}: no findings"
    assert isinstance(S.report_module(study).figures(df, "test"), list)
    facts = S.report_module(study).facts(df)  # the typed facts the answers quote, of a real run
    assert isinstance(facts, typing.get_type_hints(S.report_module(study).facts)["return"]), f"{path}: facts"


def test_each_fixture_is_a_run_of_the_registered_study_it_is_named_after():
    """A fixture is optional for a study (the handout's studies need theirs: test_answers says so); one left
    behind by a renamed or removed study, or holding another study's rows, is an error."""
    assert _fixture_csvs(), "no fixture CSV: run tests/fixtures/make_demo_fixture.py"
    for f in _fixture_csvs():
        studies = set(pd.read_csv(REPO / f, usecols=["study"], dtype=str)["study"])
        name = f.rpartition("/")[2].removesuffix(".csv")
        assert name in S.STUDIES, f"{f}: no study {name!r} (registered: {', '.join(S.STUDIES)})"
        assert studies == {name}, f"{f}: rows of {sorted(studies)}"


@pytest.mark.slow
def test_no_committed_run_is_the_cpu_demo():
    assert not [f for f in _committed_csvs() if "/cpu-demo/" in f]


def test_merge_cells_keeps_every_status_orders_columns_and_adds_metrics(tmp_path):
    axes = {"d_model": 16, "seq_len": 64, "activation": "softmax", "impl": "eager", "causal": 1, "precision": "fp32"}
    base = {"study": "attention", **axes, "device": "cpu", "device_name": "cpu (x86_64)", "host": "h"}
    ok = dict(base, cell_id=S.cell_id("attention", {**base}), status="ok", error="", mode="train", phase="step", median_ms=2.0, flops=4e9)
    oom_axes = {**base, "seq_len": 128}
    oom = dict(oom_axes, cell_id=S.cell_id("attention", oom_axes), status="oom", error="CUDA out of memory", mode="train")
    paths = []
    for row in [ok, oom]:
        paths.append(tmp_path / f"{row['cell_id']}.csv")  # named as the workflow names a cell's file
        write_csv_atomic(pd.DataFrame([row]), paths[-1])
    merged = merge_cells(paths, "attention")  # a header-only file is an error now (test_bad_cells), not dropped
    assert merged["status"].tolist() == ["ok", "oom"]
    cols = list(merged.columns)
    assert cols[:4] == HEAD_COLUMNS
    assert cols[4:10] == list(S.study("attention").axes)
    assert cols.index("mode") == 10
    assert merged["tflops"].iloc[0] == pytest.approx(2.0)  # 4e9 FLOP in 2 ms
    assert math.isnan(merged["tflops"].iloc[1])
    empty = merge_cells([], "attention")
    assert empty.empty and list(empty.columns) == HEAD_COLUMNS

    assert failures(merged)[["cell_id", "status"]].values.tolist() == [[oom["cell_id"], "oom"]]
    assert ok_rows(merged, mode="train")["cell_id"].tolist() == [ok["cell_id"]]
    assert ok_rows(merged, no_such_column=1).empty
    assert of_kind(merged, "kernel").empty  # no `kind` column: no typed rows
