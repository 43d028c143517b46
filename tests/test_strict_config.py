"""Settings are never silently ignored or changed, and no config size can stall the parse.

Each bad input here is rejected before any cell runs (``nothing_runs`` fails a test whose cell would
start), with a message that names the key (or file and line, or flag) and what is allowed:

- YAML 1.1 surprises in a config file: octal ``01024`` (PyYAML reads 532), ``0o17``, binary, base-60
  ``1:30``, ``yes/no/on/off``; an alias bomb, a recursive alias, a document over 1 MB, deep nesting,
  bytes that are not UTF-8 (``LOADER_CASES``, through ``load_yaml``, the CLI and ``snakemake -n``);
- a float where an integer is meant, a bool where a number is meant (``TYPE_CASES``);
- a name that ends in a newline or whitespace, a peak table key that matches every device, an absurd
  peak (``NAME_CASES``, ``PEAK_CASES``);
- a study block that is present but empty, in a file or on the command line (``EMPTY_BLOCK_CASES``);
- a grid too large to plan, an object graph that expands past the node limit (``SIZE_CASES``);
- a run whose snapshot says another device, memory fraction or cache directory (``RUN_CASES``);
- keys of ``cs336sys <study> --config FILE`` that the CLI cannot apply (``CLI_REJECTED``).

``INPUTS_TRIED`` counts them: 76, all rejected before a cell runs. 68 of them were accepted (or not
refused within 5 s) by the tree before these checks; the 8 that passed are guards: a bool for a number
(5), trailing space in a run name, and two keys the CLI already called unknown. The keys the CLI used to ignore and now applies, and
``--config cache_dir=null`` (a string 'null' before), are checked by value.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import pytest
import yaml

from cs336sys.cli import main
from cs336sys.pipeline import cells as cells_module
from cs336sys.pipeline import config as C
from cs336sys.pipeline import config_file as F
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import ConfigError, load_yaml, validate_config
from workflow_helpers import DEMO, DEMO_RUN, REPO, copy_repo, deep_update, load_config, snakemake

TINY = {"d_model": 64, "d_ff": 256, "num_layers": 2, "num_heads": 4}


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch):
    """No test here may start a measurement: the CLI imports run_cell from this module at call time."""

    def refuse(*args, **kwargs):
        raise AssertionError("a cell started measuring although its input is bad")

    monkeypatch.setattr(cells_module, "run_cell", refuse)


def _assert_names(message: str, *expected: str) -> None:
    for text in expected:
        assert text in message, f"{text!r} not in the message:\n{message}"


def _config_error(config: dict) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config)
    return str(info.value)


def _set(config: dict, path: str, value) -> None:
    *parents, key = path.split(".")
    block = config
    for p in parents:
        block = block[p]
    block[key] = value


# ---------------------------------------------------------------- the loader: YAML 1.1 surprises and hostile sizes
def _bomb(levels: int = 9, width: int = 9) -> str:
    """The billion-laughs document: 468 bytes whose aliases expand to 9**9 scalars."""
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


LOADER_CASES = {
    # (YAML text, texts the error must hold)
    "octal": ("e2e:\n  batch_size: 01024\n", ["bad.yaml:2:", "01024 is a YAML 1.1 octal literal", "write 1024"]),
    "octal-in-a-list": ("e2e:\n  grid:\n    context_length: [128, 064]\n", ["bad.yaml:3:", "064 is a YAML 1.1 octal literal", "write 64"]),
    "leading-zero": ("e2e:\n  batch_size: 0128\n", ["bad.yaml:2:", "0128 is read as text here", "write 128"]),
    "exponent": ("flash:\n  rep_ms: 1e3\n", ["bad.yaml:2:", "1e3 is read as text here", "write 1000.0"]),
    "octal-0o": ("e2e:\n  measure_steps: 0o17\n", ["bad.yaml:2:", "0o17", "octal", "write 15"]),
    "binary": ("e2e:\n  measure_steps: 0b101\n", ["bad.yaml:2:", "0b101", "binary", "write 5"]),
    "base-60-int": ("e2e:\n  timeout_s: 1:30\n", ["bad.yaml:2:", "1:30 is a YAML 1.1 base-60 number", "write 90"]),
    "base-60-float": ("e2e:\n  min_measure_s: 1:30.5\n", ["bad.yaml:2:", "1:30.5 is a YAML 1.1 base-60 number", "write 90.5"]),
    "yes-for-a-bool": ("check_local_cuda: yes\n", ["bad.yaml:1:", "'yes' is a YAML 1.1 boolean", "write true or false"]),
    "on-for-a-name": ("run: on\n", ["bad.yaml:1:", "'on' is a YAML 1.1 boolean", "quote it"]),
    "off-in-a-grid": ("e2e:\n  grid:\n    compile: [off]\n", ["bad.yaml:3:", "'off' is a YAML 1.1 boolean"]),
    "no-as-a-key": ("peak_tflops:\n  NO: {bf16: 100}\n", ["bad.yaml:2:", "'NO' is a YAML 1.1 boolean"]),
    "alias-bomb": (_bomb(), ["bad.yaml", "aliases", "more than 100000"]),
    "recursive-alias": ("e2e: &a\n  grid: *a\n", ["bad.yaml", "recursive alias"]),
    "too-large": ("run: x\n" + "# padding\n" * 110_000, ["bad.yaml", "1100007 bytes", "at most 1000000"]),
    "too-deep": ("e2e: " + "[" * 2000 + "]" * 2000 + "\n", ["bad.yaml", "nested", "deep"]),
    "not-utf8": (b"run: caf\xe9\n", ["bad.yaml", "not UTF-8"]),
}


def _write(tmp_path: Path, text: str | bytes, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize("case", list(LOADER_CASES))
def test_loader_refuses_yaml_1_1_surprises_and_hostile_sizes(tmp_path, case):
    text, expected = LOADER_CASES[case]
    path = _write(tmp_path, text)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    assert time.monotonic() - t0 < 5, "the loader spent seconds on a hostile document"
    _assert_names(str(info.value), *expected)


def test_loader_keeps_what_yaml_1_1_and_1_2_read_alike(tmp_path):
    """Quoted text, true/false, null, decimal, hex, exponents and a few aliases load as before."""
    text = (
        "run: 'on'\nname: '01024'\nflag: true\nother: False\nnothing: null\nhex: 0x10\nzero: 0\nneg: -12\n"
        "ratio: 0.5\nsci: 1.0e+3\nnan: .nan\nlist: &l [1, 2]\ncopy: *l\nmerged: {<<: {a: 1}, b: 2}\ntime: '1:30'\n"
    )
    data = load_yaml(_write(tmp_path, text, "good.yaml"))
    assert data == {
        "run": "on",
        "name": "01024",
        "flag": True,
        "other": False,
        "nothing": None,
        "hex": 16,
        "zero": 0,
        "neg": -12,
        "ratio": 0.5,
        "sci": 1000.0,
        "nan": data["nan"],
        "list": [1, 2],
        "copy": [1, 2],
        "merged": {"a": 1, "b": 2},
        "time": "1:30",
    }
    assert math.isnan(data["nan"])


def test_every_shipped_config_and_snapshot_loads_with_the_strict_loader():
    files = [REPO / "config.yaml", *REPO.glob("config/**/*.yaml"), *REPO.glob("results/*/config.yaml")]
    for path in files:
        load_yaml(path)  # raises on anything the strict loader refuses


def test_the_snapshot_writer_quotes_what_the_strict_loader_refuses_plain(tmp_path, cfg):
    """A run or size may be named 1e3 or 0128 (valid names): PyYAML writes them plain, the strict loader refuses that."""
    cfg.update(run="1e3", extra_sizes={**cfg["extra_sizes"], "0128": TINY, "0o17": TINY})
    cfg["e2e"]["grid"]["size"] = ["0128"]
    snapshot = C.settings_snapshot(validate_config(cfg)[0])
    with pytest.raises(ConfigError):  # PyYAML's own dump: `run: 1e3`, plain
        load_yaml(_write(tmp_path, yaml.safe_dump(snapshot, sort_keys=False), "plain.yaml"))
    assert load_yaml(_write(tmp_path, F.dump_yaml(snapshot), "quoted.yaml")) == snapshot


# ---------------------------------------------------------------- strict types: no float for an integer, no bool for a number
TYPE_CASES = {
    "float-batch-size": ("e2e.batch_size", 2.0, ["'e2e.batch_size'", "2.0 is not of type 'integer'"]),
    "float-passes": ("e2e.passes", 2.0, ["'e2e.passes'", "not of type 'integer'"]),
    "float-trials": ("attention.trials", 3.0, ["'attention.trials'", "not of type 'integer'"]),
    "float-context-length": ("e2e.grid.context_length", [32.0], ["'e2e.grid.context_length.0'", "not of type 'integer'"]),
    "float-warmup-axis": ("warmup.grid.warmup_steps", [0, 1.0], ["'warmup.grid.warmup_steps.1'", "not of type 'integer'"]),
    "float-num-heads": ("extra_sizes.tiny", {**TINY, "num_heads": 4.0}, ["'extra_sizes.tiny.num_heads'", "not of type 'integer'"]),
    "float-leaderboard": (
        "flash.leaderboard",
        {"seq_len": 64.0, "head_dim": 16, "num_heads": 1, "precision": "fp32"},
        ["'flash.leaderboard.seq_len'", "not of type 'integer'"],
    ),
    "float-top-n": ("memory.top_n", 10.0, ["'memory.top_n'", "not of type 'integer'"]),
    "float-runtime": ("e2e.resources.runtime_min", 5.0, ["'e2e.resources.runtime_min'", "not of type 'integer'"]),
    "bool-memory-fraction": ("memory_fraction", True, ["'memory_fraction'", "True is not of type 'number', 'null'"]),
    "bool-timeout": ("e2e.timeout_s", True, ["'e2e.timeout_s'", "not of type 'number'"]),
    "bool-min-measure": ("e2e.min_measure_s", False, ["'e2e.min_measure_s'", "not of type 'number'"]),
    "bool-peak": ("peak_tflops", {"H100": {"bf16": True}}, ["'peak_tflops.H100.bf16'", "not of type 'number'"]),
    "bool-floor": ("interval_floor_rel", True, ["'interval_floor_rel'", "not of type 'number'"]),
}


@pytest.mark.parametrize("case", list(TYPE_CASES))
def test_float_for_an_integer_and_bool_for_a_number_are_rejected(cfg, case):
    path, value, expected = TYPE_CASES[case]
    _set(cfg, path, value)
    _assert_names(_config_error(cfg), *expected)


# ---------------------------------------------------------------- names: no trailing newline or whitespace
NAME_RULE = "letters, digits, '.', '+', '-', starting with a letter or digit"
NAME_CASES = {
    "run-newline": ("run", "cpu-demo\n", ["'run'", repr("cpu-demo\n"), NAME_RULE]),
    "run-trailing-space": ("run", "cpu-demo ", ["'run'", NAME_RULE]),
    "size-name-newline": ("extra_sizes", {"tiny\n": TINY}, ["'extra_sizes'", repr("tiny\n"), NAME_RULE]),
    "grid-size-newline": ("e2e.grid.size", ["tiny\n"], ["'e2e.grid.size.0'", NAME_RULE]),
    "peak-key-empty": ("peak_tflops", {"": {"bf16": 100}}, ["'peak_tflops'", "''", "no leading or trailing whitespace"]),
    "peak-key-trailing-space": ("peak_tflops", {"H100 ": {"bf16": 100}}, ["'peak_tflops'", "'H100 '", "no leading or trailing whitespace"]),
    "peak-key-newline": ("peak_tflops", {"H100\n": {"bf16": 100}}, ["'peak_tflops'", "no leading or trailing whitespace"]),
}


@pytest.mark.parametrize("case", list(NAME_CASES))
def test_names_with_trailing_newline_or_whitespace_are_rejected(cfg, case):
    path, value, expected = NAME_CASES[case]
    _set(cfg, path, value)
    _assert_names(_config_error(cfg), *expected)


def test_a_name_with_inner_space_still_names_a_device(cfg):
    cfg["peak_tflops"] = {"RTX 4090": {"bf16": 165.2}}
    validate_config(cfg)


# ---------------------------------------------------------------- peak tables: plausible values only
PEAK_CASES = {
    "peak-tiny": ({"H100": {"bf16": 1e-300}}, ["'peak_tflops.H100.bf16'", "1e-300", "minimum of 0.01"]),
    "peak-huge": ({"H100": {"fp32": 1e300}}, ["'peak_tflops.H100.fp32'", "maximum of 10000"]),
    "peak-zero": ({"A100": {"tf32": 0}}, ["'peak_tflops.A100.tf32'", "minimum of 0.01"]),
}


@pytest.mark.parametrize("case", list(PEAK_CASES))
def test_an_implausible_peak_is_rejected(cfg, case):
    peaks, expected = PEAK_CASES[case]
    cfg["peak_tflops"] = peaks
    _assert_names(_config_error(cfg), *expected)


def test_a_plausible_peak_is_accepted(cfg):
    cfg["peak_tflops"] = {"B200": {"bf16": 2250.0, "fp32": 80}, "cpu": {"fp32": 0.5}}
    validate_config(cfg)


# ---------------------------------------------------------------- empty study blocks: rejected in every layer
EMPTY_BLOCK_CASES = {
    "file-empty-mapping": ("file", "e2e: {}\n"),
    "file-null": ("file", "e2e:\n"),
    "file-tilde": ("file", "mha: ~\n"),
    "command-line-empty-value": ("command line", {"e2e": None}),
    "command-line-null": ("command line", {"e2e": "null"}),
    "command-line-empty-mapping": ("command line", {"attention": {}}),
}


@pytest.mark.parametrize("case", list(EMPTY_BLOCK_CASES))
def test_an_empty_study_block_is_rejected_in_a_file_or_on_the_command_line(tmp_path, case):
    where, data = EMPTY_BLOCK_CASES[case]
    with pytest.raises(ConfigError) as info:
        if where == "file":
            F.load_config_file(_write(tmp_path, data))
        else:
            F.check_layer(data, "--config")
    study = next(iter(yaml.safe_load(data) if where == "file" else data))
    _assert_names(str(info.value), f"config key {study!r}", "empty", "omit the key")
    if where == "file":
        _assert_names(str(info.value), "bad.yaml")


def test_a_complete_config_without_a_section_still_takes_the_schema_defaults(cfg):
    """The documented rule: omitting a section (or `null` in a complete dict) gives the schema's defaults."""
    cfg["mha"] = None
    validate_config(cfg)
    assert cfg["mha"]["grid"]["variant"] == ["exact-eager", "exact-sdpa", "performer"]


def test_a_layer_that_changes_a_study_passes(tmp_path):
    assert F.load_config_file(_write(tmp_path, "e2e:\n  batch_size: 2\nextra_sizes: {}\n")) == {"e2e": {"batch_size": 2}, "extra_sizes": {}}
    F.check_layer({"e2e": {"batch_size": 2}, "run": "x"}, "--config")


# ---------------------------------------------------------------- the command line: null is null
def test_command_line_null_is_none_for_a_key_that_allows_null(cfg):
    cfg.update(cache_dir="null", memory_fraction="null", overwrite="true")
    validate_config(cfg)
    assert cfg["cache_dir"] is None and cfg["memory_fraction"] is None and cfg["overwrite"] is True


def test_the_string_null_stays_a_string_where_null_is_not_allowed(cfg):
    cfg["run"] = "null"  # a valid name: stays a name
    validate_config(cfg)
    assert cfg["run"] == "null"


# ---------------------------------------------------------------- sizes: grids and expanded objects
def _big_grid(cfg: dict, n: int = 10) -> dict:
    cfg["studies"] = ["attention"]
    cfg["attention"]["grid"] = {
        "d_model": [16 * (i + 1) for i in range(n)],
        "seq_len": [64 * (i + 1) for i in range(n)],
        "activation": ["softmax", "relu"],
        "impl": ["eager", "compiled"],
        "causal": [True, False],
        "precision": ["fp32", "bf16", "tf32"],
    }
    return cfg


def _shared_bomb(levels: int = 9):
    node = ["x"] * 9
    for _ in range(levels):
        node = [node] * 9
    return node


SIZE_CASES = {
    "grid-too-large": (
        lambda c: _big_grid(c, 40),
        ["'max_cell_jobs'", "38400 cell jobs", "attention: 40 × 40 × 2 × 2 × 2 × 3", "at most 10000"],
    ),
    "grid-too-large-with-passes": (
        lambda c: {**_big_grid(c, 15), "attention": {**c["attention"], "passes": 2}},
        ["'max_cell_jobs'", "10800 cell jobs", "= 5400 cells × 2 passes"],
    ),
    "shared-object-bomb": (lambda c: {**c, "peak_tflops": {"H100": _shared_bomb()}}, ["more than 100000", "nodes"]),
}


@pytest.mark.parametrize("case", list(SIZE_CASES))
def test_oversized_configs_are_rejected_before_planning(cfg, monkeypatch, case):
    make, expected = SIZE_CASES[case]

    def no_planning(*args, **kwargs):
        raise AssertionError("the grid was planned before its size was checked")

    monkeypatch.setattr(plan, "cells", no_planning)
    config = make(cfg)
    t0 = time.monotonic()
    message = _config_error(config)
    assert time.monotonic() - t0 < 5
    _assert_names(message, *expected)


def test_max_cell_jobs_is_the_limit(cfg):
    """A limit of exactly the CPU demo's cell jobs passes it, one fewer does not."""
    full, _ = validate_config(copy.deepcopy(cfg))
    jobs = sum(math.prod(map(len, full[s]["grid"].values())) * full[s].get("passes", 1) for s in full["studies"])
    validate_config({**copy.deepcopy(cfg), "max_cell_jobs": jobs})
    _assert_names(_config_error({**cfg, "max_cell_jobs": jobs - 1}), "'max_cell_jobs'", f"{jobs} cell jobs", f"at most {jobs - 1}")


# ---------------------------------------------------------------- a run name whose snapshot says another device
def _snapshot(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "results" / config["run"] / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(C.settings_snapshot(config), sort_keys=False))
    return path


RUN_CASES = {
    "device": ("device", "cuda", ["'device'", "run 'cpu-demo'", "device: cpu", "device: cuda", "--config run=", "overwrite=true"]),
    "memory-fraction": ("memory_fraction", 0.5, ["'memory_fraction'", "run 'cpu-demo'", "memory_fraction: null", "memory_fraction: 0.5"]),
    "cache-dir": ("cache_dir", "/tmp/elsewhere", ["'cache_dir'", "cache_dir: .cache/cs336sys", "cache_dir: /tmp/elsewhere"]),
}


@pytest.mark.parametrize("case", list(RUN_CASES))
def test_a_run_measured_with_another_device_is_refused(tmp_path, cfg, case):
    key, value, expected = RUN_CASES[case]
    validate_config(cfg)
    snapshot = _snapshot(tmp_path, cfg)
    changed = copy.deepcopy(cfg)
    changed[key] = value
    with pytest.raises(ConfigError) as info:
        C.check_run_snapshot(validate_config(changed)[0], snapshot)
    _assert_names(str(info.value), *expected, str(snapshot))


def test_overwrite_another_run_name_or_the_same_device_pass(tmp_path, cfg):
    validate_config(cfg)
    snapshot = _snapshot(tmp_path, cfg)
    C.check_run_snapshot(copy.deepcopy(cfg), snapshot)  # same settings
    C.check_run_snapshot({**copy.deepcopy(cfg), "batch": 1}, tmp_path / "results" / "other" / "config.yaml")  # no snapshot yet
    forced = {**copy.deepcopy(cfg), "device": "cuda", "overwrite": True}
    C.check_run_snapshot(validate_config(forced)[0], snapshot)


def test_the_snapshot_leaves_out_overwrite_and_max_cell_jobs(cfg):
    validate_config(cfg)
    snapshot = C.settings_snapshot({**cfg, "overwrite": True, "max_cell_jobs": 5})
    assert "overwrite" not in snapshot and "max_cell_jobs" not in snapshot
    assert snapshot == C.settings_snapshot(cfg)


# ---------------------------------------------------------------- cs336sys <study> --config FILE: applied or rejected by name
def _cell_of(monkeypatch, argv: list[str]):
    """The Cell that ``main(argv)`` would measure (stopped before it measures)."""
    seen = []

    def capture(cell, start_method=None, **_):
        seen.append(cell)
        raise KeyboardInterrupt

    monkeypatch.setattr(cells_module, "run_cell", capture)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    (cell,) = seen
    return cell


def _tiny_file(tmp_path: Path, extra: str = "") -> Path:
    return _write(tmp_path, "extra_sizes:\n  tiny: {d_model: 64, d_ff: 256, num_layers: 2, num_heads: 4}\n" + extra, "cli.yaml")


def test_cli_config_applies_device_memory_fraction_cache_dir_grid_and_timeout(monkeypatch, tmp_path):
    path = _tiny_file(
        tmp_path,
        "device: cpu\nmemory_fraction: 0.5\ncache_dir: /tmp/cs336sys-cache\n"
        "e2e:\n  grid: {size: [tiny], context_length: [16]}\n  timeout_s: 7\n  vocab_size: 100\n",
    )
    cell = _cell_of(monkeypatch, ["e2e", "--config", str(path)])
    assert cell.device == "cpu" and cell.memory_fraction == 0.5 and cell.cache_dir == "/tmp/cs336sys-cache"
    assert cell.axes["size"] == "tiny" and cell.axes["context_length"] == 16 and cell.kwargs()["vocab_size"] == 100
    assert cell.timeout_s == 7
    # flags on the command line win over the file
    cell = _cell_of(
        monkeypatch,
        ["e2e", "--config", str(path), "--device", "auto", "--memory-fraction", "0.25", "--context-length", "8", "--timeout", "9"],
    )
    assert cell.device == "auto" and cell.memory_fraction == 0.25 and cell.axes["context_length"] == 8 and cell.timeout_s == 9


def test_cli_config_applies_flags_to_the_derived_columns(monkeypatch, tmp_path):
    import pandas as pd

    from cs336sys import rows
    from cs336sys.pipeline import merge

    seen = {}

    def derived(frame, study, overrides=None, flags=None, gbps_overrides=None):
        seen.update(study=study, overrides=overrides, flags=flags, gbps=gbps_overrides)
        raise KeyboardInterrupt

    monkeypatch.setattr(cells_module, "run_cell", lambda *a, **k: [])
    monkeypatch.setattr(rows, "rows_to_frame", lambda *a, **k: pd.DataFrame())
    monkeypatch.setattr(merge, "derive", derived)
    path = _tiny_file(tmp_path, "flags: {noisy_rel: 0.2}\npeak_tflops: {cpu: {fp32: 0.5}}\npeak_gbps: {cpu: 50}\n")
    with pytest.raises(KeyboardInterrupt):
        main(["e2e", "--config", str(path), "--size", "tiny", "--device", "cpu"])
    assert seen["flags"]["noisy_rel"] == 0.2 and seen["overrides"] == {"cpu": {"fp32": 0.5}} and seen["gbps"] == {"cpu": 50}
    assert seen["study"] == "e2e"  # what the study says of its rows (its kind, its attention core) reaches the analysis


CLI_REJECTED = {
    # (text added to the file, texts the usage error must hold)
    "run": ("run: mine\n", ["'run'", "a workflow setting"]),
    "studies": ("studies: [e2e]\n", ["'studies'", "a workflow setting"]),
    "check-local-cuda": ("check_local_cuda: false\n", ["'check_local_cuda'"]),
    "warm-worker": ("warm_worker: false\n", ["'warm_worker'"]),
    "overwrite": ("overwrite: true\n", ["'overwrite'"]),
    "max-cell-jobs": ("max_cell_jobs: 5\n", ["'max_cell_jobs'"]),
    "interval-floor": ("interval_floor_rel: 0.1\n", ["'interval_floor_rel'", "merged"]),
    "other-study": ("mha:\n  batch_size: 2\n", ["'mha'", "measures one e2e cell"]),
    "passes": ("e2e:\n  passes: 3\n", ["'e2e.passes'", "one pass"]),
    "resources": ("e2e:\n  resources: {mem_mb: 100}\n", ["'e2e.resources'"]),
    "grid-of-two": ("e2e:\n  grid: {context_length: [8, 16]}\n", ["'e2e.grid.context_length'", "2 values", "--context-length"]),
    "octal": ("e2e:\n  batch_size: 010\n", ["--config", "010 is a YAML 1.1 octal literal"]),
    "empty-block": ("e2e: {}\n", ["--config", "config key 'e2e'", "empty"]),
    "float-for-int": ("e2e:\n  batch_size: 2.0\n", ["'e2e.batch_size' (in --config", "not of type 'integer'"]),
    "alias-bomb": (_bomb(), ["--config", "more than 100000"]),
    "peak-absurd": ("peak_tflops: {cpu: {fp32: 1.0e-300}}\n", ["'peak_tflops.cpu.fp32'", "minimum of 0.01"]),
}


@pytest.mark.parametrize("case", list(CLI_REJECTED))
def test_cli_config_rejects_by_name_what_it_cannot_apply(capsys, tmp_path, case):
    extra, expected = CLI_REJECTED[case]
    path = _tiny_file(tmp_path, extra)
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        main(["e2e", "--config", str(path), "--size", "tiny", "--device", "cpu"])
    assert exc.value.code == 2 and time.monotonic() - t0 < 5
    _assert_names(capsys.readouterr().err, *expected)


# ---------------------------------------------------------------- the workflow: the same loader, limits and checks at parse time
@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    return copy_repo(tmp_path_factory.mktemp("strict-config") / "repo")


def _stopped(root: Path, result) -> str:
    assert result.returncode != 0, result.describe()
    assert not (root / "results").exists() and not (root / "logs").exists(), "a bad input left outputs"
    return result.output


SNAKEMAKE_CASES = {
    # (file text or None, --config entries, texts the output must hold)
    "octal": ("e2e:\n  measure_steps: 010\n", [], ["bad.yaml:2:", "010 is a YAML 1.1 octal literal"]),
    "alias-bomb": (_bomb(), [], ["bad.yaml", "more than 100000"]),
    "empty-block": ("e2e:\n", [], ["bad.yaml", "config key 'e2e'", "empty"]),
    "empty-on-command-line": (None, ["e2e="], ["--config", "config key 'e2e'", "empty"]),
    "float-on-command-line": (None, ["max_cell_jobs=2.0"], ["'max_cell_jobs'", "not of type 'integer'"]),
    "grid-too-large": (
        "attention:\n  grid: {d_model: " + str(list(range(2, 400, 2))) + ", seq_len: " + str(list(range(8, 800, 8))) + "}\n",
        [],
        ["'max_cell_jobs'", "cell jobs"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SNAKEMAKE_CASES))
def test_snakemake_dry_run_refuses_at_parse_time(repo_copy, case):
    text, entries, expected = SNAKEMAKE_CASES[case]
    files = [DEMO]
    if text is not None:
        (repo_copy / "config" / "bad.yaml").write_text(text)
        files.append("config/bad.yaml")
    extra = ["--config", *entries] if entries else []
    result = snakemake(repo_copy, "-n", "--configfile", *files, *extra, timeout=120)
    _assert_names(_stopped(repo_copy, result), *expected)


@pytest.mark.slow
def test_snakemake_cache_dir_null_on_the_command_line_is_null_and_a_device_change_is_refused(tmp_path):
    root = copy_repo(tmp_path / "repo")
    snapshot = root / "results" / DEMO_RUN / "config.yaml"
    r = snakemake(
        root, "--cores", "1", "--configfile", DEMO, "--config", "cache_dir=null", "--", str(snapshot.relative_to(root)), timeout=300
    )
    assert r.returncode == 0, r.describe()
    assert yaml.safe_load(snapshot.read_text())["cache_dir"] is None  # not the string 'null'
    # the same run name with another device: refused at parse time, before any job
    r = snakemake(root, "-n", "--configfile", DEMO, "--config", "cache_dir=null", "device=cuda", timeout=300)
    assert r.returncode != 0, r.describe()
    _assert_names(r.output, f"run {DEMO_RUN!r}", "device: cpu", "device: cuda", "overwrite=true")
    assert not (root / "logs" / DEMO_RUN / "e2e").exists()
    # asked for: planned
    r = snakemake(root, "-n", "--configfile", DEMO, "--config", "cache_dir=null", "device=cuda", "overwrite=true", timeout=300)
    assert r.returncode == 0, r.describe()


# ---------------------------------------------------------------- the count the closing note quotes
INPUTS_TRIED = (
    len(LOADER_CASES)
    + len(TYPE_CASES)
    + len(NAME_CASES)
    + len(PEAK_CASES)
    + len(EMPTY_BLOCK_CASES)
    + len(SIZE_CASES)
    + len(RUN_CASES)
    + len(CLI_REJECTED)
    + len(SNAKEMAKE_CASES)
    + 1
)


def test_the_count_of_bad_inputs():
    assert INPUTS_TRIED == 76, f"{INPUTS_TRIED}: update the count here and in the closing note"


def test_preset_merge_keeps_the_demo_valid():
    """A control: the demo merged with a layer that changes one setting validates."""
    validate_config(deep_update(load_config(REPO, DEMO), {"e2e": {"batch_size": 3}}))
