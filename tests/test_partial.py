"""A sweep cut short still gets a report: merged from the cells it has, naming the missing ones."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from cs336sys.catalog import BUILT_IN
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import settings_snapshot, validate_config
from cs336sys.rows import write_csv_atomic
from cs336sys.runs.partial import main, report_partial

GRID = {"d_model": [16], "seq_len": [64, 128], "activation": ["softmax"], "impl": ["eager"], "causal": [True], "precision": ["fp32"]}


def _run(tmp_path, cells: int):
    """results/<run>/ with the config snapshot of a two-cell attention grid and the first ``cells`` cell CSVs."""
    results = tmp_path / "results" / "slice"
    (results / "attention" / "cells").mkdir(parents=True)
    config, _ = validate_config({"run": "slice", "device": "cpu", "studies": ["attention"], "attention": {"grid": GRID}})
    (results / "config.yaml").write_text(yaml.safe_dump(settings_snapshot(config)))
    ids = list(plan.grid("attention", config, BUILT_IN))
    for cid in ids[:cells]:
        axes = plan.grid("attention", config, BUILT_IN)[cid]
        times = dict(median_ms=2.0, ci_low_ms=1.9, ci_high_ms=2.1, mean_ms=2.0, std_ms=0.1, min_ms=1.9, max_ms=2.1, n=3, trials=1)
        row = dict(study="attention", cell_id=cid, status="ok", error="", **axes, mode="train", phase="forward", **times)
        row.update(trial_medians_ms="2.0", samples_ms="1.9;2.0;2.1", device="cpu", device_name="cpu (x86_64)", host="h")
        write_csv_atomic(pd.DataFrame([row]), results / "attention" / "cells" / f"{cid}.csv")
    return results, ids


def test_a_partial_run_is_merged_reported_and_its_missing_cells_named(tmp_path):
    results, ids = _run(tmp_path, cells=1)
    missing = report_partial(results, tmp_path / "report")
    assert missing == {"attention": [ids[1]]}
    merged = pd.read_csv(results / "attention.csv")
    assert merged["cell_id"].unique().tolist() == [ids[0]]
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Study `attention`" in report
    assert "## Cells not measured (the sweep stopped before them)" in report and ids[1] in report
    assert "every cell ran" not in report
    assert "run `slice`" in (tmp_path / "report" / "answers.md").read_text()


def test_the_command_prints_the_count_and_refuses_a_run_without_its_snapshot(tmp_path, capsys, monkeypatch):
    results, ids = _run(tmp_path, cells=2)
    monkeypatch.chdir(tmp_path)
    assert main([str(results)]) == 0
    assert capsys.readouterr().out.strip() == "attention: 2 of 2 cells"
    (results / "config.yaml").unlink()
    with pytest.raises(SystemExit):
        main([str(results)])
    assert "config.yaml: no config snapshot" in capsys.readouterr().err


def test_a_cell_missing_one_of_its_passes_is_left_out_not_merged(tmp_path):
    results, ids = _run(tmp_path, cells=2)
    config = yaml.safe_load((results / "config.yaml").read_text())
    config["attention"]["passes"] = 2
    (results / "config.yaml").write_text(yaml.safe_dump(config))
    (results / "attention" / "cells" / "pass1").mkdir()
    first = results / "attention" / "cells" / f"{ids[0]}.csv"
    (results / "attention" / "cells" / "pass1" / first.name).write_bytes(first.read_bytes())
    assert report_partial(results, tmp_path / "report") == {"attention": [ids[1]]}
    assert pd.read_csv(results / "attention.csv")["cell_id"].unique().tolist() == [ids[0]]
