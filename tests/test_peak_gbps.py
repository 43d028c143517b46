"""`peak_gbps`: the config gives a device's peak DRAM bandwidth where the built-in table lacks it (or overrides it).

Like `peak_tflops`: device-name substring → GB/s, validated before any job runs, and used wherever rows
are merged (the workflow's merge rule, a partial run's report, the CLI's one cell) for `peak_gbps`,
the bandwidth share `bw_frac` and the roofline's memory roof.
"""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from cs336sys.catalog import BUILT_IN
from cs336sys.cli import main
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import ConfigError, settings_snapshot, validate_config
from cs336sys.pipeline.merge import merge_cells
from cs336sys.rows import write_csv_atomic
from cs336sys.runs.partial import report_partial

CPU_NAME = "cpu (x86_64)"  # a device name no table knows
GRID = {"d_model": [16], "seq_len": [64], "activation": ["softmax"], "impl": ["eager"], "causal": [True], "precision": ["fp32"]}


def _config(**top) -> dict:
    return {"run": "bw", "device": "cpu", "studies": ["attention"], "attention": {"grid": GRID}, **top}


@pytest.mark.parametrize(
    "value, expected",
    [
        ({"X9": 0}, "'peak_gbps.X9': 0 is less than the minimum of 1"),
        ({"X9": -300.0}, "'peak_gbps.X9'"),
        ({"X9": 1e7}, "'peak_gbps.X9': 10000000.0 is greater than the maximum of 100000"),
        ({"X9": "fast"}, "'peak_gbps.X9': 'fast' is not of type 'number'"),
        ({"X9": True}, "'peak_gbps.X9': True is not of type 'number'"),
        ({"X9": {"bf16": 3000}}, "'peak_gbps.X9'"),  # one number per device, not one per precision
        ({" H100": 3000}, "'peak_gbps'"),  # a device-name substring: no leading space
        ([3000], "'peak_gbps': [3000] is not of type 'object'"),
    ],
    ids=["zero", "negative", "huge", "text", "bool", "per-precision", "name", "list"],
)
def test_a_bad_peak_gbps_is_refused_naming_the_key(value, expected):
    with pytest.raises(ConfigError) as info:
        validate_config(_config(peak_gbps=value))
    assert expected in str(info.value)


def test_peak_gbps_defaults_to_none_given():
    assert validate_config(_config())[0]["peak_gbps"] == {}
    assert validate_config(_config(peak_gbps={"X9": 1000}))[0]["peak_gbps"] == {"X9": 1000}


def _cell_csv(folder, config, device_name: str = CPU_NAME) -> str:
    cid, axes = next(iter(plan.grid("attention", config, BUILT_IN).items()))
    times = dict(median_ms=2.0, ci_low_ms=1.9, ci_high_ms=2.1, mean_ms=2.0, std_ms=0.1, min_ms=1.9, max_ms=2.1, n=3, trials=1)
    row = dict(study="attention", cell_id=cid, status="ok", error="", **axes, batch_size=8, mode="train", phase="forward", **times)
    row.update(trial_medians_ms="2.0", samples_ms="1.9;2.0;2.1", device="cpu", device_name=device_name, host="h")
    path = folder / f"{cid}.csv"
    write_csv_atomic(pd.DataFrame([row]), path)
    return str(path)


def test_the_merge_uses_the_configured_bandwidth(tmp_path):
    config, _ = validate_config(_config(peak_gbps={"cpu": 50.0}))
    path = _cell_csv(tmp_path, config)
    plain = merge_cells([path], "attention", config["peak_tflops"], config["flags"]).iloc[0]
    assert pd.isna(plain["peak_gbps"]) and "no peak bandwidth known for 'cpu (x86_64)'" in plain["roofline_note"]
    row = merge_cells([path], "attention", config["peak_tflops"], config["flags"], peak_gbps=config["peak_gbps"]).iloc[0]
    assert row["peak_gbps"] == 50.0
    assert row["bw_frac"] == pytest.approx(row["achieved_gbps"] / 50.0)
    assert "no peak bandwidth" not in row["roofline_note"]
    # a configured value overrides the table's (H100 SXM: 3350), as peak_tflops does
    (tmp_path / "h100").mkdir()
    h100 = _cell_csv(tmp_path / "h100", config, "NVIDIA H100 80GB HBM3")
    assert merge_cells([h100], "attention").iloc[0]["peak_gbps"] == 3350.0
    assert merge_cells([h100], "attention", peak_gbps={"H100": 3000.0}).iloc[0]["peak_gbps"] == 3000.0


def test_a_partial_report_uses_the_snapshots_bandwidth(tmp_path):
    results = tmp_path / "results" / "bw"
    (results / "attention" / "cells").mkdir(parents=True)
    config, _ = validate_config(_config(peak_gbps={"cpu": 50.0}))
    (results / "config.yaml").write_text(yaml.safe_dump(settings_snapshot(config)))
    _cell_csv(results / "attention" / "cells", config)
    report_partial(results, tmp_path / "report")
    assert pd.read_csv(results / "attention.csv")["peak_gbps"].tolist() == [50.0]


@pytest.mark.slow
def test_the_cli_applies_peak_gbps_from_its_config_file(tmp_path, capsys):
    cfg = tmp_path / "bw.yaml"
    quick = {"warmup_steps": 0, "measure_steps": 2, "trials": 1, "min_warmup_s": 0, "min_measure_s": 0}
    cfg.write_text(yaml.safe_dump({"peak_gbps": {"cpu": 50.0}, "attention": quick}))
    out = tmp_path / "cell.csv"
    code = main(["attention", "--config", str(cfg), "--device", "cpu", "--d-model", "16", "--seq-len", "32", "--csv", str(out)])
    assert code == 0, capsys.readouterr()
    assert set(pd.read_csv(out)["peak_gbps"]) == {50.0}
