"""Every bad input is rejected before anything runs, naming its key (or flag) and what is allowed.

Inputs tried: 139 — 73 config dicts, 10 preset files (9 broken + 1 missing), 8 fault specs, 44
command lines (42 argv + 2 fault kinds through the environment) and 4 through `snakemake -n`.
All 139 are rejected before any cell runs. 24 of them needed a fix in src (found by running this
file against a checkout of HEAD before the fixes):
  - non-finite numbers (12: 7 config, 2 preset, 2 CLI, 1 snakemake): NaN passed every JSON-schema
    bound (NaN compares False) and was caught by the later finiteness check, whose message named no bound;
    inf passed `exclusiveMinimum`. The schema now rejects them with the bound:
    "nan is not a finite number (allowed: a number > 0)". (Counted here: e2e.timeout_s nan/inf,
    memory_fraction nan, flash.rep_ms nan, peak_tflops nan, min_measure_s nan, flags nan; preset
    .nan timeout_s/rep_ms; --rep-ms nan, --min-measure-s nan; the snakemake .nan preset.)
  - duplicate keys in a preset named "<unicode string>", not the file (4: 2 preset, CLI, snakemake).
  - the CLI (7): a key from the --config file was reported as a flag ("unknown flag '--batchsize'",
    and its NaN likewise); an unknown top-level key in the --config file was IGNORED (not rejected);
    `e2e: [1]` in it CRASHED with a TypeError; "these flags make no valid cell" named no flag (3).
  - extra_sizes shadowing a built-in did not list the built-in names (1).
14 more were rejected cleanly but now read better (run/size names: the rule in words, not only the
regex; `studies: []` lists the studies; a grid with no valid cell shows the grid; inf against a
maximum gives both bounds). The 8 fault specs are new checks (the `sleep=<s>` kind is new).
Not fixable here: a YAML syntax error in a `--configfile` is reported by Snakemake's own loader
("Config file is not valid JSON or YAML", no file, no line) before the workflow is read; see
test_snakemake_yaml_syntax_error_is_reported_without_the_file. `cs336sys <study> --config FILE`
and `load_yaml` name the file and line.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from cs336sys import catalog
from cs336sys import studies as S
from cs336sys.cli import main
from cs336sys.pipeline import cells as cells_module
from cs336sys.pipeline.config import ConfigError, load_yaml, validate_config
from cs336sys.pipeline.faults import FAULT_ENV, check_fault_spec
from workflow_helpers import DEMO, REPO, copy_repo, deep_update, load_config, snakemake

NAN, INF = math.nan, math.inf
TINY = {"d_model": 64, "d_ff": 256, "num_layers": 2, "num_heads": 4}
STUDIES = "choose from " + ", ".join(S.STUDIES)  # the registry's order: a new study needs no edit here
# the attention study's impls that offer softmax only, as its invalid-combination message groups them
# ("sdpa × softmax"): from the catalog, so that a new implementation needs no edit here
SOFTMAX_ONLY = ", ".join(i.name for i in catalog.impls(catalog.CORE) if i.activations == ("softmax",)) + " × softmax"
NAME_RULE = "letters, digits, '.', '+', '-', starting with a letter or digit"


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch):
    """No test here may start a measurement: the CLI imports run_cell from this module at call time."""

    def refuse(*args, **kwargs):
        raise AssertionError("a cell started measuring although its input is bad")

    monkeypatch.setattr(cells_module, "run_cell", refuse)
    monkeypatch.delenv(FAULT_ENV, raising=False)


def _set(config: dict, path: str, value) -> None:
    *parents, key = path.split(".")
    block = config
    for p in parents:
        block = block[p]
    block[key] = value


def _config_error(config: dict) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config)
    return str(info.value)


def _assert_names(message: str, *expected: str) -> None:
    for text in expected:
        assert text in message, f"{text!r} not in the message:\n{message}"


# ---------------------------------------------------------------- config dicts: (path, value, texts the message must hold)
# Each starts from the CPU demo (config.yaml + config/cpu-demo.yaml) and breaks one thing. The first text
# names the key; the others name what is allowed (the bound, the choices, the rule).
# One case a line, a table to scan (hence `fmt: skip` on its last line), as PRESET_CASES and CLI_CASES.
CONFIG_CASES = {
    # non-finite numbers: JSON-schema bounds are False for NaN, so the schema needs its own check
    "timeout-nan": ("e2e.timeout_s", NAN, ["'e2e.timeout_s'", "not a finite number", "a number > 0"]),
    "timeout-inf": ("e2e.timeout_s", INF, ["'e2e.timeout_s'", "not a finite number", "a number > 0"]),
    "timeout-negative": ("precision.timeout_s", -5, ["'precision.timeout_s'", "less than or equal to the minimum of 0"]),
    "memory-fraction-nan": ("memory_fraction", NAN, ["'memory_fraction'", "a number > 0 and <= 1"]),
    "memory-fraction-zero": ("memory_fraction", 0, ["'memory_fraction'", "less than or equal to the minimum of 0"]),
    "memory-fraction-1.5": ("memory_fraction", 1.5, ["'memory_fraction'", "greater than the maximum of 1"]),
    "rep-ms-nan": ("flash.rep_ms", NAN, ["'flash.rep_ms'", "a number > 0"]),
    "peak-tflops-nan": ("peak_tflops", {"H100": {"bf16": NAN}}, ["'peak_tflops.H100.bf16'", "a number >= 0.01 and <= 10000"]),
    "peak-tflops-negative": ("peak_tflops", {"H100": {"fp32": -1.0}}, ["'peak_tflops.H100.fp32'", "minimum of 0"]),
    "peak-tflops-unknown-precision": ("peak_tflops", {"H100": {"fp8": 1.0}}, ["'peak_tflops.H100.fp8'", "fp32, tf32, bf16"]),
    "peak-gbps-nan": ("peak_gbps", {"H100": NAN}, ["'peak_gbps.H100'", "a number >= 1 and <= 100000"]),
    "min-measure-nan": ("e2e.min_measure_s", NAN, ["'e2e.min_measure_s'", "a number >= 0 and <= 3600"]),
    "min-warmup-inf": ("attention.min_warmup_s", INF, ["'attention.min_warmup_s'", "a number >= 0 and <= 3600"]),
    "min-measure-negative": ("mha.min_measure_s", -0.5, ["'mha.min_measure_s'", "minimum of 0"]),
    "flags-nan": ("flags", {"noisy_rel": NAN}, ["'flags.noisy_rel'", "a number > 0 and <= 1"]),
    # run names become results/<run>/: nothing that climbs, hides or splits a path
    "run-dotdot": ("run", "..", ["'run'", "'..'", NAME_RULE]),
    "run-dot": ("run", ".", ["'run'", "'.'", NAME_RULE]),
    "run-slash": ("run", "a/b", ["'run'", "'a/b'", NAME_RULE]),
    "run-space": ("run", "my run", ["'run'", "'my run'", NAME_RULE]),
    "run-empty": ("run", "", ["'run'", NAME_RULE]),
    "run-leading-dash": ("run", "-x", ["'run'", NAME_RULE]),
    "run-too-long": ("run", "x" * 65, ["'run'", "is too long"]),
    "run-not-a-string": ("run", 5, ["'run'", "not of type 'string'"]),
    # model sizes: names that escape, shadow a built-in, or shapes that cannot run
    "size-name-escapes": ("extra_sizes", {"../x": TINY}, ["'extra_sizes'", "'../x'", NAME_RULE]),
    "size-name-space": ("extra_sizes", {"my size": TINY}, ["'extra_sizes'", "'my size'", NAME_RULE]),
    "size-shadows-built-in": ("extra_sizes", {"small": TINY}, ["'extra_sizes.small'", "built-in: small, medium, large, xl, 2.7B"]),
    "odd-head-dim": ("extra_sizes.tiny", {**TINY, "d_model": 12}, ["'extra_sizes.tiny'", "= 3 is odd", "even"]),
    "d-model-not-divisible": ("extra_sizes.tiny", {**TINY, "d_model": 10}, ["'extra_sizes.tiny'", "not divisible by num_heads 4"]),
    "size-missing-key": ("extra_sizes.tiny", {"d_model": 64, "d_ff": 256, "num_layers": 2}, ["'extra_sizes.tiny'", "'num_heads' is a required"]),
    "size-unknown-key": ("extra_sizes.tiny", {**TINY, "d_modle": 64}, ["'extra_sizes.tiny.d_modle'", "d_model, d_ff, num_layers, num_heads"]),
    "size-zero-layers": ("extra_sizes.tiny", {**TINY, "num_layers": 0}, ["'extra_sizes.tiny.num_layers'", "minimum of 1"]),
    "unknown-size": ("e2e.grid.size", ["tiny", "huge"], ["'e2e.grid.size'", "'huge'", "known sizes: small, medium, large, xl, 2.7B, tiny"]),
    # studies and grids that make nothing to run
    "studies-empty": ("studies", [], ["'studies'", "should be non-empty", STUDIES]),
    "unknown-study": ("studies", ["e2e", "flsh"], ["'studies.1'", "'flsh'", "['attention', 'e2e', 'flash'"]),
    "studies-duplicate": ("studies", ["e2e", "e2e"], ["'studies'", "non-unique"]),
    "studies-a-string": ("studies", "e2e", ["'studies'", "not of type 'array'"]),
    "mha-no-divisible-embed-dim": ("mha.grid.embed_dim", [30, 50], ["'mha.grid'", "no valid cell", "embed_dim must be divisible by num_heads", "embed_dim [30, 50]"]),
    "attention-sdpa-relu-only": ("attention.grid", {"d_model": [16], "seq_len": [64], "activation": ["relu"], "impl": ["sdpa"]},
                                 ["'attention.grid'", "no valid cell", SOFTMAX_ONLY]),
    "mha-exact-sdpa-relu-only": ("mha.grid", {"variant": ["exact-sdpa"], "kernel": ["relu"]}, ["'mha.grid'", "no valid cell", "softmax only"]),
    # unknown keys at every level
    "unknown-top-level-key": ("studys", ["e2e"], ["'studys'", "allowed under <top level>: run, device"]),
    "unknown-section-key": ("e2e.batchsize", 4, ["'e2e.batchsize'", "allowed under e2e: grid, batch_size"]),
    "unknown-grid-key": ("e2e.grid.seq_len", [64], ["'e2e.grid.seq_len'", "allowed under e2e.grid: size, context_length"]),
    "top-level-resources": ("resources", {"e2e": {"mem_mb": 1}}, ["'resources'", "allowed under <top level>"]),
    "unknown-resource": ("e2e.resources.gpus", 2, ["'e2e.resources.gpus'", "runtime_min, mem_mb"]),
    # wrong types
    "string-for-int": ("e2e.batch_size", "4", ["'e2e.batch_size'", "not of type 'integer'"]),
    "float-for-int": ("e2e.batch_size", 2.5, ["'e2e.batch_size'", "not of type 'integer'"]),
    "bool-for-int": ("e2e.batch_size", True, ["'e2e.batch_size'", "not of type 'integer'"]),
    "int-for-list": ("e2e.grid.context_length", 32, ["'e2e.grid.context_length'", "not of type 'array'"]),
    "string-for-bool": ("e2e.grid.compile", ["yes"], ["'e2e.grid.compile.0'", "not of type 'boolean'"]),
    "string-for-check-local-cuda": ("check_local_cuda", "maybe", ["'check_local_cuda'", "not of type 'boolean'"]),
    "int-for-cache-dir": ("cache_dir", 5, ["'cache_dir'", "not of type 'string', 'null'"]),
    "list-for-section": ("e2e", [1], ["'e2e'", "not of type 'object'"]),
    "leaderboard-incomplete": ("flash.leaderboard", {"seq_len": 1024}, ["'flash.leaderboard'", "'head_dim' is a required property"]),
    # empty lists, duplicates, out-of-range integers
    "empty-grid-list": ("e2e.grid.context_length", [], ["'e2e.grid.context_length'", "should be non-empty"]),
    "duplicate-grid-items": ("attention.grid.seq_len", [64, 64], ["'attention.grid.seq_len'", "non-unique"]),
    "negative-int": ("e2e.batch_size", -1, ["'e2e.batch_size'", "minimum of 1"]),
    "zero-measure-steps": ("e2e.measure_steps", 0, ["'e2e.measure_steps'", "minimum of 1"]),
    "zero-context-length": ("e2e.grid.context_length", [0], ["'e2e.grid.context_length.0'", "minimum of 1"]),
    "negative-warmup-steps": ("warmup.grid.warmup_steps", [-1], ["'warmup.grid.warmup_steps.0'", "minimum of 0"]),
    "too-many-trials": ("e2e.trials", 1000, ["'e2e.trials'", "maximum of 100"]),
    "zero-runtime": ("e2e.resources", {"runtime_min": 0, "mem_mb": 2000}, ["'e2e.resources.runtime_min'", "minimum of 1"]),
    # unknown names of things
    "unknown-precision": ("e2e.grid.precision", ["fp16"], ["'e2e.grid.precision.0'", "['fp32', 'tf32', 'bf16']"]),
    "unknown-flash-precision": ("flash.grid.precision", ["tf32"], ["'flash.grid.precision.0'", "['fp32', 'bf16']"]),
    "unknown-mha-precision": ("mha.precision", "fp16", ["'mha.precision'", "['fp32', 'tf32', 'bf16']"]),
    "unknown-lm-impl": ("e2e.grid.impl", ["cuda"], ["'e2e.grid.impl.0'", str(list(catalog.names(catalog.LM)))]),
    "unknown-attention-impl": ("attention.grid.impl", ["flash"], ["'attention.grid.impl.0'", str(list(catalog.names(catalog.CORE)))]),
    "unknown-flash-impl": ("flash.grid.impl", ["sdpa-magic"], ["'flash.grid.impl.0'", "'sdpa-flash', 'sdpa-cudnn'"]),
    "unknown-variant": ("mha.grid.variant", ["exact"], ["'mha.grid.variant.0'", "['exact-eager', 'exact-sdpa', 'performer']"]),
    "unknown-kernel": ("mha.grid.kernel", ["tanh"], ["'mha.grid.kernel.0'", "['softmax', 'relu']"]),
    "unknown-optimizer": ("e2e.optimizer", "adam", ["'e2e.optimizer'", "['course', 'fused']"]),
    "unknown-mode": ("e2e.modes", ["eval"], ["'e2e.modes.0'", "['inference', 'train']"]),
    "unknown-memory-mode": ("memory.grid.mode", ["eval"], ["'memory.grid.mode.0'", "['inference', 'train']"]),
    "unknown-precision-part": ("precision.grid.part", ["fp8"], ["'precision.grid.part.0'", "'accumulation', 'autocast-bf16'"]),
    "unknown-device": ("device", "tpu", ["'device'", "['cuda', 'cpu']"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config_is_rejected_naming_key_and_what_is_allowed(demo_config, case):
    path, value, expected = CONFIG_CASES[case]
    config = copy.deepcopy(demo_config)
    _set(config, path, value)
    _assert_names(_config_error(config), *expected)


# ---------------------------------------------------------------- preset files: (YAML text, texts the message must hold)
# one case a line, a table to scan
PRESET_CASES = {
    "duplicate-top-level-block": ("e2e:\n  batch_size: 2\nmha:\n  batch_size: 1\ne2e:\n  measure_steps: 3\n",
                                  ["bad.yaml:5:", "'e2e' is given twice", "first on line 1"]),
    "duplicate-nested-key": ("e2e:\n  batch_size: 2\n  batch_size: 4\n", ["bad.yaml:3:", "'batch_size' is given twice"]),
    "unclosed-bracket": ("e2e:\n  grid:\n    context_length: [32, 64\n", ["bad.yaml:4:", "not valid YAML"]),
    "bad-indentation": ("e2e:\n  batch_size: 2\n measure_steps: 3\n", ["bad.yaml:3:", "not valid YAML"]),
    "tab-indentation": ("e2e:\n\tbatch_size: 2\n", ["bad.yaml:2:", "not valid YAML"]),
    "nan-timeout": ("e2e:\n  timeout_s: .nan\n", ["'e2e.timeout_s'", "a number > 0"]),
    "inf-memory-fraction": ("memory_fraction: .inf\n", ["'memory_fraction'", "a number > 0 and <= 1"]),
    "nan-rep-ms": ("flash:\n  rep_ms: .nan\n", ["'flash.rep_ms'", "a number > 0"]),
    "run-dotdot": ("run: ..\n", ["'run'", NAME_RULE]),
}  # fmt: skip


def _load_preset(tmp_path: Path, text: str) -> dict:
    """The config a run with `--configfile config/cpu-demo.yaml bad.yaml` sees, read as common.smk reads it."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return deep_update(load_config(REPO, DEMO), load_yaml(path) or {})


@pytest.mark.parametrize("case", list(PRESET_CASES))
def test_bad_preset_file_is_rejected_naming_file_line_or_key(tmp_path, case):
    text, expected = PRESET_CASES[case]
    with pytest.raises(ConfigError) as info:
        validate_config(_load_preset(tmp_path, text))
    _assert_names(str(info.value), *expected)


def test_missing_preset_file_is_named(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_yaml(tmp_path / "nope.yaml")
    _assert_names(str(info.value), "cannot read config file", "nope.yaml", "No such file")


# ---------------------------------------------------------------- fault specs: a typo would inject nothing and pass a test
FAULT_CASES = {
    "typo": ("hnag", ["'hnag'", "known: oom, error, abort, hang, sleep"]),
    "typo-with-cell": ("om:size=small", ["'om'", "known: oom, error, abort, hang, sleep"]),
    "upper-case": ("OOM", ["'OOM'", "known: oom"]),
    "sleep-without-seconds": ("sleep", ["sleep needs a finite number of seconds >= 0", "sleep=1.5"]),
    "sleep-not-a-number": ("sleep=abc", ["sleep needs a finite number of seconds >= 0"]),
    "sleep-negative": ("sleep=-1", ["sleep needs a finite number of seconds >= 0"]),
    "sleep-nan": ("sleep=nan:part=x", ["sleep needs a finite number of seconds >= 0"]),
    "value-for-hang": ("hang=5", ["'hang' takes no '=' value"]),
}


@pytest.mark.parametrize("case", list(FAULT_CASES))
def test_bad_fault_spec_is_rejected(case):
    spec, expected = FAULT_CASES[case]
    with pytest.raises(ValueError) as info:
        check_fault_spec(spec)
    _assert_names(str(info.value), FAULT_ENV, *expected)


def test_good_fault_specs_pass():
    for spec in ("", "oom", "error:size=small", "abort", "hang:part=accumulation", "sleep=0.5", "sleep=2:part=x"):
        check_fault_spec(spec)


# ---------------------------------------------------------------- command lines: (argv, texts argparse's error must hold)
BROKEN_YAML = "e2e:\n  batch_size: [1\n"


@pytest.fixture
def files(tmp_path):
    """Config files for --config, and a directory for --csv."""
    out = {"dir": tmp_path / "a-dir", "missing": tmp_path / "missing.yaml"}
    out["dir"].mkdir()
    texts = {
        "broken": BROKEN_YAML,
        "unknown-key": "e2e:\n  batchsize: 4\n",
        "unknown-top": "extra_size:\n  tiny: {d_model: 64, d_ff: 256, num_layers: 2, num_heads: 4}\n",
        "dup": "e2e:\n  batch_size: 2\ne2e:\n  batch_size: 4\n",
        "list-section": "e2e: [1]\n",
        "nan-in-file": "e2e:\n  min_measure_s: .nan\n",
        "list-file": "- e2e\n",
    }
    for name, text in texts.items():
        out[name] = tmp_path / f"{name}.yaml"
        out[name].write_text(text)
    return out


# (argv, texts the message must hold), one case a line, a table to scan
CLI_CASES = {
    "timeout-nan": (["e2e", "--timeout", "nan"], ["--timeout", "positive number of seconds", "got nan"]),
    "timeout-negative": (["e2e", "--timeout", "-5"], ["--timeout", "positive number of seconds", "got -5"]),
    "timeout-inf": (["e2e", "--timeout", "inf"], ["--timeout", "positive number of seconds", "got inf"]),
    "timeout-zero": (["e2e", "--timeout", "0"], ["--timeout", "positive number of seconds"]),
    "timeout-not-a-number": (["e2e", "--timeout", "soon"], ["--timeout", "invalid float value: 'soon'"]),
    "csv-is-a-directory": (["e2e", "--csv", "{dir}"], ["--csv", "a-dir is a directory; name a file"]),
    "config-broken-yaml": (["e2e", "--config", "{broken}"], ["--config", "broken.yaml:3:", "not valid YAML"]),
    "config-unknown-key": (["e2e", "--config", "{unknown-key}"], ["'e2e.batchsize' (in --config", "allowed under e2e: grid, batch_size"]),
    "config-unknown-top-level-key": (["e2e", "--config", "{unknown-top}"], ["--config", "'extra_size'", "allowed at the top level: run, device"]),
    "config-duplicate-key": (["e2e", "--config", "{dup}"], ["--config", "dup.yaml:3:", "'e2e' is given twice"]),
    "config-missing": (["e2e", "--config", "{missing}"], ["--config", "missing.yaml", "No such file"]),
    "config-section-not-a-mapping": (["e2e", "--config", "{list-section}"], ["--config", "'e2e' must be a mapping"]),
    "config-nan-setting": (["e2e", "--config", "{nan-in-file}"], ["'e2e.min_measure_s' (in --config", "a number >= 0 and <= 3600"]),
    "config-not-a-mapping": (["e2e", "--config", "{list-file}"], ["--config", "does not hold a mapping"]),
    "memory-fraction-zero": (["e2e", "--memory-fraction", "0"], ["--memory-fraction", "must be in (0, 1]"]),
    "memory-fraction-1.5": (["e2e", "--memory-fraction", "1.5"], ["--memory-fraction", "must be in (0, 1]"]),
    "memory-fraction-nan": (["e2e", "--memory-fraction", "nan"], ["--memory-fraction", "must be in (0, 1]", "got nan"]),
    "num-features-zero": (["mha", "--variant", "performer", "--num-features", "0"], ["'--num-features'", "minimum of 1"]),
    "embed-dim-not-divisible": (["mha", "--embed-dim", "30", "--num-heads", "4"],
                                ["no valid cell", "--embed-dim 30", "--num-heads 4", "embed_dim must be divisible by num_heads"]),
    "exact-sdpa-relu": (["mha", "--variant", "exact-sdpa", "--kernel", "relu"], ["no valid cell", "--variant exact-sdpa", "--kernel relu", "softmax only"]),
    "sdpa-relu": (["attention", "--impl", "sdpa", "--activation", "relu"], ["no valid cell", "--impl sdpa", "--activation relu", SOFTMAX_ONLY]),
    "context-length-zero": (["e2e", "--context-length", "0"], ["'--context-length'", "minimum of 1"]),
    "context-length-text": (["e2e", "--context-length", "abc"], ["--context-length", "invalid int value: 'abc'"]),
    "batch-size-negative": (["e2e", "--batch-size", "-3"], ["'--batch-size'", "minimum of 1"]),
    "trials-zero": (["e2e", "--trials", "0"], ["'--trials'", "minimum of 1"]),
    "warmup-steps-negative": (["e2e", "--warmup-steps", "-1"], ["'--warmup-steps'", "minimum of 0"]),
    "d-model-zero": (["attention", "--d-model", "0"], ["'--d-model'", "minimum of 1"]),
    "rep-ms-nan": (["flash", "--rep-ms", "nan"], ["'--rep-ms'", "a number > 0"]),
    "rep-ms-zero": (["flash", "--rep-ms", "0"], ["'--rep-ms'", "minimum of 0"]),
    "min-measure-nan": (["e2e", "--min-measure-s", "nan"], ["'--min-measure-s'", "a number >= 0 and <= 3600"]),
    "min-warmup-negative": (["e2e", "--min-warmup-s", "-1"], ["'--min-warmup-s'", "minimum of 0"]),
    "unknown-size": (["e2e", "--size", "huge"], ["'--size'", "'huge'", "known sizes: small, medium"]),
    "size-escapes": (["e2e", "--size", "../x"], ["'--size'", "'../x'", NAME_RULE]),
    "unknown-precision": (["e2e", "--precision", "fp16"], ["--precision", "invalid choice: 'fp16'", "'fp32', 'tf32', 'bf16'"]),
    "unknown-impl": (["e2e", "--impl", "cuda"], ["--impl", "'eager', 'sdpa', 'triton'"]),
    "unknown-variant": (["mha", "--variant", "exact"], ["--variant", "'exact-eager', 'exact-sdpa', 'performer'"]),
    "unknown-kernel": (["mha", "--kernel", "tanh"], ["--kernel", "'softmax', 'relu'"]),
    "unknown-optimizer": (["e2e", "--optimizer", "adam"], ["--optimizer", "'course', 'fused'"]),
    "unknown-mode": (["e2e", "--modes", "eval"], ["--modes", "'inference', 'train'"]),
    "duplicate-modes": (["e2e", "--modes", "train", "train"], ["'--modes'", "non-unique"]),
    "unknown-device": (["e2e", "--device", "tpu"], ["--device", "'auto', 'cuda', 'cpu'"]),
    "unknown-study": (["e2f"], ["invalid choice: 'e2f'", "'e2e'"]),
}  # fmt: skip


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2, f"exit code {exc.value.code}, not argparse's 2"
    return capsys.readouterr().err


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_command_line_is_rejected_naming_flag_and_what_is_allowed(capsys, files, case):
    argv, expected = CLI_CASES[case]
    argv = [str(files[a[1:-1]]) if a.startswith("{") else a for a in argv]
    _assert_names(_usage_error(argv, capsys), *expected)


@pytest.mark.parametrize("spec", ["hnag", "sleep=soon"])
def test_cli_rejects_an_unknown_fault_kind_before_measuring(monkeypatch, capsys, spec):
    monkeypatch.setenv(FAULT_ENV, spec)
    _assert_names(_usage_error(["e2e", "--device", "cpu"], capsys), FAULT_ENV, repr(spec))


def test_exact_variant_ignores_num_features_in_its_cell_id(monkeypatch):
    """--num-features means nothing to an exact layer: the cell is the one with num_features=0."""
    seen = []

    def capture(cell, start_method=None, **_):
        seen.append(cell)
        raise KeyboardInterrupt  # stop before anything measures

    monkeypatch.setattr(cells_module, "run_cell", capture)
    with pytest.raises(KeyboardInterrupt):
        main(["mha", "--variant", "exact-eager", "--num-features", "64", "--device", "cpu"])
    (cell,) = seen
    assert cell.cell_id.endswith("_num_features=0") and cell.axes["num_features"] == 0, cell.cell_id
    assert cell.kwargs()["num_features"] == 0


def test_the_table_holds_at_least_60_bad_inputs():
    counted = len(CONFIG_CASES) + len(PRESET_CASES) + 1 + len(FAULT_CASES) + len(CLI_CASES) + 2
    assert counted >= 60, counted


# ---------------------------------------------------------------- end to end: snakemake stops at parse time and creates nothing
@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    return copy_repo(tmp_path_factory.mktemp("bad-inputs") / "repo")


def _assert_stopped_before_anything(root: Path, result) -> None:
    assert result.returncode != 0, result.describe()
    assert not (root / "results").exists() and not (root / "logs").exists(), "a bad input left outputs"


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("dup.yaml", "e2e:\n  timeout_s: 60\ne2e:\n  batch_size: 2\n", ["config/dup.yaml:3:", "'e2e' is given twice"]),
        ("nan.yaml", "e2e:\n  timeout_s: .nan\n", ["'e2e.timeout_s'", "a number > 0"]),
    ],
)
@pytest.mark.slow
def test_snakemake_dry_run_rejects_a_bad_preset(repo_copy, name, text, expected):
    (repo_copy / "config" / name).write_text(text)
    result = snakemake(repo_copy, "-n", "--configfile", DEMO, f"config/{name}", timeout=300)
    _assert_stopped_before_anything(repo_copy, result)
    _assert_names(result.output, *expected)


@pytest.mark.slow
def test_snakemake_stops_at_parse_time_on_an_unknown_fault_kind(repo_copy):
    result = snakemake(repo_copy, "-n", "--configfile", DEMO, env={FAULT_ENV: "hnag"}, timeout=300)
    _assert_stopped_before_anything(repo_copy, result)
    _assert_names(result.output, "common.smk", f"{FAULT_ENV}='hnag'", "unknown fault kind", "known: oom")


@pytest.mark.slow
def test_snakemake_yaml_syntax_error_is_reported_without_the_file(repo_copy):
    """A known limit: Snakemake parses --configfile files itself, before the workflow's own checks.

    Its message names neither file nor line; `cs336sys e2e --config FILE` does (see above).
    """
    (repo_copy / "config" / "broken.yaml").write_text(BROKEN_YAML)
    result = snakemake(repo_copy, "-n", "--configfile", DEMO, "config/broken.yaml", timeout=300)
    _assert_stopped_before_anything(repo_copy, result)
    assert "not valid JSON or YAML" in result.output, result.describe()


@pytest.mark.slow
def test_a_gpu_sweep_without_a_gpu_stops_before_its_first_cell(repo_copy):
    # the check runs when cell jobs are about to run (a compare or a report alone needs no GPU)
    result = snakemake(repo_copy, "--config", "run=no-gpu-here", env={"CUDA_VISIBLE_DEVICES": ""}, timeout=300)  # none, here too
    assert result.returncode != 0 and "No CUDA device on this machine" in result.output, result.describe()
    assert "config/cpu-demo.yaml" in result.output
    assert not (repo_copy / "results" / "no-gpu-here").exists()
