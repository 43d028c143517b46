"""The ``cs336sys`` command line: bad values fail early naming the valid ones; a tiny run prints a table."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from cs336sys import studies as S
from cs336sys.cli import main
from cs336sys.models.sizes import MODEL_SIZES, ModelSize, parameter_count
from cs336sys.pipeline.cells import FAULT_ENV

TINY_CONFIG = """\
extra_sizes:
  tiny: {d_model: 32, d_ff: 64, num_layers: 1, num_heads: 2}
e2e:
  vocab_size: 100
"""
TINY = ModelSize(d_model=32, d_ff=64, num_layers=1, num_heads=2)


@pytest.fixture(autouse=True)
def no_injected_fault(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CONFIG)
    return path


def usage_error(argv, capsys):
    """Run main(argv) expecting argparse's usage error; return its message."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


# ---------------------------------------------------------------- bad flags


def test_unknown_model_size_lists_the_sizes(capsys):
    err = usage_error(["e2e", "--size", "huge", "--device", "cpu"], capsys)
    assert "huge" in err and "'--size'" in err
    for name in MODEL_SIZES:
        assert name in err


def test_unknown_model_size_lists_the_configs_extra_sizes_too(capsys, tiny_config):
    err = usage_error(["e2e", "--config", str(tiny_config), "--size", "huge"], capsys)
    assert "tiny" in err and "2.7B" in err


def test_sdpa_with_relu_is_rejected_naming_the_valid_combinations(capsys):
    err = usage_error(["attention", "--impl", "sdpa", "--activation", "relu"], capsys)
    assert "sdpa" in err and "relu" in err
    assert "eager" in err and "softmax" in err


@pytest.mark.parametrize("study", ["e2e", "attention", "mha"])
def test_bad_precision_lists_the_precisions(capsys, study):
    err = usage_error([study, "--precision", "fp8"], capsys)
    assert "fp8" in err
    for p in ("fp32", "tf32", "bf16"):
        assert p in err


def test_bad_choices_list_the_valid_ones(capsys):
    err = usage_error(["attention", "--impl", "cuda-magic"], capsys)
    for impl in ("eager", "compiled", "sdpa", "triton"):
        assert impl in err
    err = usage_error(["nonsense"], capsys)
    for study in ("e2e", "attention", "mha", "flash"):
        assert study in err


def test_mha_invalid_combinations(capsys):
    err = usage_error(["mha", "--variant", "exact-sdpa", "--kernel", "relu"], capsys)
    assert "exact-sdpa" in err and "softmax" in err
    # a performer cell takes the schema's default num_features now; a bad one is named by its flag
    err = usage_error(["mha", "--variant", "performer", "--kernel", "relu", "--num-features", "0"], capsys)
    assert "'--num-features'" in err
    err = usage_error(["mha", "--embed-dim", "30", "--num-heads", "4"], capsys)
    assert "divisible" in err


def test_non_positive_and_out_of_range_numbers_are_rejected(capsys):
    err = usage_error(["e2e", "--context-length", "0"], capsys)
    assert "'--context-length'" in err and "minimum of 1" in err  # the schema's posint: must be positive
    err = usage_error(["e2e", "--memory-fraction", "1.5"], capsys)
    assert "memory-fraction" in err


# ---------------------------------------------------------------- runs


@pytest.mark.slow
def test_failed_cell_prints_its_row_writes_the_csv_and_exits_non_zero(monkeypatch, capsys, tiny_config, tmp_path):
    monkeypatch.setenv(FAULT_ENV, "oom")
    out_csv = tmp_path / "out" / "cell.csv"
    code = main(["e2e", "--config", str(tiny_config), "--size", "tiny", "--context-length", "8", "--device", "cpu", "--csv", str(out_csv)])
    assert code == 1
    out = capsys.readouterr().out
    assert "| status" in out and "oom" in out
    frame = pd.read_csv(out_csv)
    assert list(frame["status"]) == ["oom"]
    assert frame["size"].iloc[0] == "tiny" and frame["context_length"].iloc[0] == 8


@pytest.mark.slow
def test_auto_device_without_cuda_says_it_runs_on_cpu(monkeypatch, capsys, tiny_config):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(FAULT_ENV, "error")  # stop the cell before it measures: this test is about the device choice
    code = main(["e2e", "--config", str(tiny_config), "--size", "tiny", "--context-length", "8"])
    captured = capsys.readouterr()
    assert code == 1
    assert "no CUDA device found; ran on CPU" in captured.err
    header = captured.out.splitlines()[0]
    assert header.startswith("# e2e ") and " on cpu" in header
    assert "RuntimeError: injected error" in captured.out


@pytest.mark.slow  # a fresh interpreter that measures a cell
def test_tiny_e2e_run_via_python_dash_m(tmp_path, tiny_config):
    out_csv = tmp_path / "e2e.csv"
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    env["CUDA_VISIBLE_DEVICES"] = ""  # "auto" must pick the CPU, also on a GPU machine
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cs336sys",
            "e2e",
            "--config",
            str(tiny_config),
            "--size",
            "tiny",
            "--context-length",
            "8",
            "--batch-size",
            "2",
            "--warmup-steps",
            "1",
            "--measure-steps",
            "2",
            "--trials",
            "1",
            "--min-warmup-s",
            "0",
            "--min-measure-s",
            "0",  # exactly 2 timed steps per phase
            "--csv",
            str(out_csv),
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no CUDA device found; ran on CPU" in proc.stderr

    lines = proc.stdout.splitlines()
    frame = pd.read_csv(out_csv)
    axes = {a: frame[a].iloc[0].item() if hasattr(frame[a].iloc[0], "item") else frame[a].iloc[0] for a in S.study("e2e").axes}
    cell = S.cell_id("e2e", axes)  # the workflow's cell id for the same cell
    assert cell.startswith("size=tiny_context_length=8_precision=fp32_impl=eager_compile=0")
    assert lines[0].startswith(f"# e2e {cell} ") and " on cpu" in lines[0]
    assert (frame["cell_id"] == cell).all()
    table = [line for line in lines if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header[:3] == ["status", "mode", "phase"] and "median_ms" in header and "tflops" in header
    assert set(table[1].replace("|", "").replace(":", "").strip()) <= {"-", " "}  # the markdown separator
    body = [[c.strip() for c in row.strip("|").split("|")] for row in table[2:]]
    phases = {(r[1], r[2]) for r in body}
    assert len(body) == len(phases) == 6
    assert {("inference", "forward"), ("inference", "step"), ("train", "forward"), ("train", "backward"), ("train", "step")} < phases
    assert [p for m, p in phases - {("train", "forward"), ("train", "backward"), ("train", "step")} if m == "train"][0].startswith(
        "optimizer"
    )
    assert all(r[0] == "ok" for r in body)

    assert (frame["status"] == "ok").all()
    assert (frame["device"] == "cpu").all()
    assert (frame["params"] == parameter_count(TINY, vocab_size=100)).all()  # the config's e2e.vocab_size was used
    assert (frame["tokens"] == 16).all() and (frame["batch_size"] == 2).all()
    assert (frame["n"] == 2).all() and (frame["median_ms"] > 0).all()
    assert frame["tflops"].notna().sum() == 5  # every phase but the optimizer has FLOPs
    assert frame["mfu_pct"].isna().all()  # no peak is known for a CPU


@pytest.mark.gpu
def test_cli_measures_on_the_gpu_with_device_auto(tmp_path):
    """The CLI forks its measuring child: asking torch for CUDA first would make that child fail."""
    out = tmp_path / "cell.csv"
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")  # no install needed
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cs336sys",
            "attention",
            "--d-model",
            "32",
            "--seq-len",
            "256",
            "--measure-steps",
            "3",
            "--warmup-steps",
            "1",
            "--csv",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = pd.read_csv(out)
    assert (rows["status"] == "ok").all() and (rows["device"] == "cuda").all()
    assert rows["peak_mem_bytes"].notna().all()


@pytest.mark.parametrize("study", S.STUDIES)
def test_the_timeout_help_names_the_schemas_default(capsys, study):
    # the cell runs with the schema's timeout_s when neither the flag nor a --config file gives one
    from cs336sys.pipeline.config import load_schema

    default = load_schema()["properties"][study]["properties"]["timeout_s"]["default"]
    with pytest.raises(SystemExit):
        main([study, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"--config file's {study}.timeout_s, else {default:g})" in help_text
