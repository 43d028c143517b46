"""The package's layers keep their promises: the analysis side never imports torch, rerun hashes
cover every module a cell runs, modules stay small, and the study registry matches the schema.

The import checks run in fresh interpreters (``python -c``): the pytest process has imported
torch and most of the package already, so its ``sys.modules`` proves nothing.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import load_schema, validate_config
from workflow_helpers import DEMO, REPO, load_config, once_per_session

SRC = REPO / "src"
PACKAGE = SRC / "cs336sys"
SCHEMA = PACKAGE / "pipeline" / "config.schema.yaml"
MAX_LINES = 400
# the Triton kernels: one file on purpose; the tutorial copy keeps upstream's layout to diff against it
LONG_MODULES = {"models/triton_attention.py", "models/triton_tutorial_attention.py"}


def _python(code: str, pythonpath: Path = SRC, timeout: int = 300, **env_extra: str) -> str:
    """Run ``code`` in a fresh interpreter with ``pythonpath`` first on sys.path; return its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("CS336SYS_INJECT_FAULT", "CS336SYS_TEST_IMPORT_LOG")}
    env["PYTHONPATH"] = str(pythonpath) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, f"subprocess failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def _last_json(stdout: str):
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def demo_config():
    return validate_config(load_config(REPO, DEMO), SCHEMA)[0]


# ---------------------------------------------------------------- 1. the torch-free side


def _torch_free_modules() -> list[str]:
    # the toolkit below the studies and the two floors above the pipeline: the report, the answers, compare
    analysis = [
        f"cs336sys.{floor}.{m.name}"
        for floor in ("analysis", "handout", "runs")
        for m in pkgutil.iter_modules([str(PACKAGE / floor)])
        if m.name != "__main__"
    ]
    reports = [f"cs336sys.studies.{name}.report" for name in S.STUDIES]
    study_specs = [f"cs336sys.studies.{name}" for name in S.STUDIES]
    # documented as importable without torch: the workflow's parse time and the CLI's flag checks use them
    others = ["cs336sys", "cs336sys.catalog", "cs336sys.studies", "cs336sys.pipeline.config", "cs336sys.rows", "cs336sys.provenance"]
    others += ["cs336sys.models.sizes", "cs336sys.models.variants", "cs336sys.fileio", "cs336sys.cli", "cs336sys.pipeline.warm"]
    others += ["cs336sys.pipeline.merge", "cs336sys.plugins", "cs336sys.errors"]
    return ["cs336sys.analysis", "cs336sys.handout", "cs336sys.runs", *analysis, *study_specs, *reports, *others]


# A finder that lets every import through but remembers who asked for torch first.
_IMPORT_PROBE = r"""
import importlib, json, sys, traceback

first = []

class Probe:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not first:
            first.append([f"{f.filename}:{f.lineno}" for f in traceback.extract_stack() if "cs336sys" in f.filename])
        return None

sys.meta_path.insert(0, Probe())
for module in json.loads(sys.argv[1] if len(sys.argv) > 1 else MODULES):
    importlib.import_module(module)
    if "torch" in sys.modules:
        print(json.dumps({"module": module, "by": first[0] if first else []}))
        break
else:
    print(json.dumps(None))
"""


@pytest.mark.slow  # a fresh interpreter per module
def test_analysis_reports_cli_and_config_import_without_torch():
    modules = _torch_free_modules()
    assert {"cs336sys.analysis.tables", "cs336sys.runs.report", "cs336sys.handout.answers", "cs336sys.studies.e2e.report"} <= set(modules)
    code = f"MODULES = {json.dumps(json.dumps(modules))}\n" + _IMPORT_PROBE
    culprit = _last_json(_python(code))
    assert culprit is None, f"importing {culprit['module']} imported torch, via: {culprit['by']}"


@pytest.mark.slow  # a fresh interpreter
def test_the_torch_probe_itself_sees_torch():
    """The check above must fail when a module imports torch: a measurement module does."""
    code = f"MODULES = {json.dumps(json.dumps(['cs336sys.rows', 'cs336sys.measure.timing']))}\n" + _IMPORT_PROBE
    culprit = _last_json(_python(code))
    assert culprit is not None and culprit["module"] == "cs336sys.measure.timing"
    assert any("measure/timing.py" in frame for frame in culprit["by"]), culprit


# ---------------------------------------------------------------- 2. rerun hashes are complete

# Runs each cell's measurement the way the measuring child does (runner imported, then the target) on
# the CPU, and prints the cs336sys modules each loaded. One interpreter imports torch and the runner once
# and forks a child per cell (as the warm worker does): each child starts where a fresh measuring process
# would, and the cells pay one torch import between them instead of one each.
_RUN_CELLS = r"""
import importlib, json, os, sys
import torch
import cs336sys.pipeline.cells  # the runner: the measuring child is this module's process
from cs336sys.measure.session import Session
from cs336sys.pipeline.cell import Cell
from cs336sys.rows import Skip

def run(params):
    cell = Cell.from_params(params)
    module, _, name = cell.target.partition(":")
    measure = getattr(importlib.import_module(module), name)
    status = "ok"
    try:
        rows = list(measure(device=torch.device("cpu"), context={}, session=Session(cell.policy), **cell.kwargs()))
        assert rows, "the measurement yielded no row"
    except Skip as exc:  # a cell that cannot run on a CPU still loaded what it loaded
        status = f"skipped: {exc}"
    return {"status": status, "modules": sorted(m for m in sys.modules if m.split(".")[0] == "cs336sys")}

found = {}
for key, settings in json.loads(SETTINGS).items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            text = json.dumps(run(settings))
        except BaseException as exc:
            text = json.dumps({"error": repr(exc)})
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        found[key] = json.loads(pipe.read() or b'{"error": "the child died"}')
    os.waitpid(pid, 0)
print(json.dumps(found))
"""

CHOICE_AXES = ("impl", "variant", "part")  # one cell per value: they select different code


def _demo_cells(config) -> list[tuple[str, dict]]:
    """One cell of each study of the demo, and one per distinct impl / variant / part value."""
    picked = []
    for study in config["studies"]:
        seen = set()
        for axes in plan.cells(study, config[study], BUILT_IN):
            key = tuple(axes.get(a) for a in CHOICE_AXES)
            if key not in seen:
                seen.add(key)
                picked.append((study, axes))
    return picked


def _demo_cell_params():
    config, _ = validate_config(load_config(REPO, DEMO), SCHEMA)
    return [pytest.param(study, axes, id=f"{study}-{S.cell_id(study, axes)}") for study, axes in _demo_cells(config)]


@pytest.fixture(scope="module")
def loaded_modules(demo_config, tmp_path_factory) -> dict[str, dict]:
    """Cell id → what its measurement loaded (``_RUN_CELLS``), for every cell of :func:`_demo_cells`, once a session."""

    def build(folder: Path) -> dict:
        cells = {
            S.cell_id(study, axes): plan.plan_cell(
                study, axes, demo_config, BUILT_IN, artifact_dir=str(folder / S.cell_id(study, axes))
            ).params()
            for study, axes in _demo_cells(demo_config)
        }
        return _last_json(_python(f"SETTINGS = {json.dumps(json.dumps(cells))}\n" + _RUN_CELLS, timeout=1800))

    return once_per_session(tmp_path_factory, "cell-modules", build)


@pytest.mark.slow  # a measuring child per cell
@pytest.mark.parametrize("study, axes", _demo_cell_params())
def test_every_module_a_cell_loads_is_in_its_code_hash(demo_config, loaded_modules, study, axes):
    assert plan.plan_cell(study, axes, demo_config, BUILT_IN).params()["target"] == f"cs336sys.studies.{study}.measure:measure"
    result = loaded_modules[S.cell_id(study, axes)]
    assert "error" not in result, result
    hashed = set(plan.cell_modules(study, axes, BUILT_IN))
    loaded = set(result["modules"])
    assert f"cs336sys.studies.{study}.measure" in loaded, result
    missing = sorted(loaded - hashed)
    assert not missing, (
        f"{study} cell {S.cell_id(study, axes)} ({result['status']}) loaded modules that its rerun hash leaves out: "
        f"{missing}\n(an edit to them would not rerun the cell)"
    )


def test_demo_cells_cover_every_impl_and_variant(demo_config):
    picked = _demo_cells(demo_config)
    assert {s for s, _ in picked} == set(demo_config["studies"])
    mha = {axes["variant"] for s, axes in picked if s == "mha"}
    assert {"performer", "exact-eager"} <= mha


def test_optional_backends_stay_out_of_the_cells_that_do_not_run_them():
    performer = {"embed_dim": 32, "num_heads": 4, "seq_len": 64, "variant": "performer", "kernel": "relu", "num_features": 16}
    exact = {**performer, "variant": "exact-eager", "num_features": 0}
    assert "cs336sys.models.attention" not in plan.cell_modules("mha", performer, BUILT_IN)
    assert "cs336sys.models.performer" in plan.cell_modules("mha", performer, BUILT_IN)
    assert "cs336sys.models.attention" in plan.cell_modules("mha", exact, BUILT_IN)

    lm = {"size": "tiny", "context_length": 32, "precision": "fp32", "impl": "eager", "mode": "train"}
    for study in ("e2e", "warmup", "profile", "memory"):
        axes = {a: lm.get(a, 0) for a in S.study(study).axes}  # other axes (compile, warmup_steps, …) 0 / off
        eager, triton = plan.cell_modules(study, axes, BUILT_IN), plan.cell_modules(study, {**axes, "impl": "triton"}, BUILT_IN)
        assert "cs336sys.models.triton_attention" not in eager, study
        assert "cs336sys.models.triton_attention" in triton, study
        assert "cs336sys.models.attention" in eager and "cs336sys.models.model" in eager, study
    attention = {"d_model": 16, "seq_len": 64, "activation": "softmax", "impl": "eager", "causal": 1, "precision": "fp32"}
    flash = {"seq_len": 64, "head_dim": 16, "precision": "fp32", "impl": "eager", "num_heads": 1}
    for study, axes in (("attention", attention), ("flash", flash)):
        assert "cs336sys.models.triton_attention" not in plan.cell_modules(study, axes, BUILT_IN), study
        assert "cs336sys.models.triton_attention" in plan.cell_modules(study, {**axes, "impl": "triton"}, BUILT_IN), study
    # every cell runs the runner and its measurement; no cell hashes the analysis side
    for study in S.STUDIES:
        axes = next(iter(plan.grid(study, validate_config(load_config(REPO, DEMO), SCHEMA)[0], BUILT_IN).values()))
        modules = plan.cell_modules(study, axes, BUILT_IN)
        assert "cs336sys.pipeline.cells" in modules and f"cs336sys.studies.{study}.measure" in modules, study
        assert not [
            m for m in modules if m.startswith(("cs336sys.analysis", "cs336sys.runs", "cs336sys.handout")) or m.endswith(".report")
        ], (study, modules)


# The cells whose hashes the edit test compares: name → (study, axes), one a line (a table: fmt: skip).
HASH_CELLS = {
    "mha-performer": ("mha", {"embed_dim": 32, "num_heads": 4, "seq_len": 64, "variant": "performer", "kernel": "relu", "num_features": 16}),
    "mha-exact": ("mha", {"embed_dim": 32, "num_heads": 4, "seq_len": 64, "variant": "exact-eager", "kernel": "relu", "num_features": 0}),
    "e2e-eager": ("e2e", {"size": "tiny", "context_length": 32, "precision": "fp32", "impl": "eager"}),
    "e2e-triton": ("e2e", {"size": "tiny", "context_length": 32, "precision": "fp32", "impl": "triton"}),
    "warmup-eager": ("warmup", {"size": "tiny", "context_length": 32, "precision": "fp32", "impl": "eager", "warmup_steps": 0}),
    "attention-eager": ("attention", {"d_model": 16, "seq_len": 64, "activation": "softmax", "impl": "eager", "causal": 1, "precision": "fp32"}),
    "precision": ("precision", {"part": "accumulation"}),
}  # fmt: skip

_HASHES = r"""
import json, sys
from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN
from cs336sys.pipeline import plan
cells = json.loads(sys.argv[1] if len(sys.argv) > 1 else CELLS)
out = {}
for name, (study, axes) in cells.items():
    axes = {a: axes.get(a, 0) for a in S.study(study).axes}  # axes not named: 0 / off
    out[name] = plan.cell_code_hash(study, axes, None, BUILT_IN)
print(json.dumps(out))
"""


def _hashes(src: Path) -> dict[str, str]:
    return _last_json(_python(f"CELLS = {json.dumps(json.dumps(HASH_CELLS))}\n" + _HASHES, pythonpath=src))


@pytest.fixture(scope="module")
def src_copy(tmp_path_factory):
    dest = tmp_path_factory.mktemp("src") / "src"
    shutil.copytree(SRC, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return dest


@pytest.mark.parametrize(
    "edited, changed",
    [
        ("models/attention.py", {"mha-exact", "e2e-eager", "e2e-triton", "warmup-eager", "attention-eager"}),
        ("models/triton_attention.py", {"e2e-triton"}),
        ("models/model.py", {"e2e-eager", "e2e-triton", "warmup-eager"}),  # only the LM studies build the model
        ("models/performer.py", {"mha-performer"}),  # exact mha cells never run Performer (models.mha imports it lazily)
        ("studies/e2e/measure.py", {"e2e-eager", "e2e-triton", "warmup-eager"}),  # warmup's measurement is e2e's
        ("measure/flops.py", {"mha-performer", "mha-exact", "e2e-eager", "e2e-triton", "warmup-eager", "attention-eager"}),
        ("measure/timing.py", set(HASH_CELLS) - {"precision"}),  # every cell that times (precision's tables are not timed)
        ("measure/session.py", set(HASH_CELLS)),  # the runner makes every cell's session
        ("pipeline/cells.py", set(HASH_CELLS)),  # the runner: every cell
        ("studies/mha/report.py", set()),  # figures and findings never rerun a measurement
        ("runs/report.py", set()),
    ],
)
@pytest.mark.slow
def test_an_edit_to_a_module_changes_exactly_the_hashes_of_the_cells_that_run_it(src_copy, edited, changed):
    path = src_copy / "cs336sys" / edited
    original = path.read_text()
    before = _hashes(src_copy)
    try:
        path.write_text(original + "\n# edited by tests/test_layers.py\n")
        after = _hashes(src_copy)
    finally:
        path.write_text(original)
    assert {name for name in HASH_CELLS if before[name] != after[name]} == changed
    assert _hashes(src_copy) == before  # content, not mtimes: restoring the file restores every hash


@pytest.mark.slow
def test_hashes_do_not_depend_on_where_the_checkout_lives(src_copy):
    assert _hashes(src_copy) == _hashes(SRC)


# ---------------------------------------------------------------- 3. small modules


def test_no_module_is_over_400_lines():
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and rel not in LONG_MODULES:
            long[rel] = lines
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"
    for rel in LONG_MODULES:
        assert (PACKAGE / rel).is_file(), f"{rel} is listed as allowed to be long but does not exist"


# ---------------------------------------------------------------- 4. the study registry


def test_every_study_package_is_registered_with_its_schema_section():
    schema = load_schema(SCHEMA)
    enum = schema["properties"]["studies"]["items"]["enum"]
    packages = sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE / "studies")]) if m.ispkg)
    assert sorted(enum) == packages == sorted(S.STUDIES), "schema studies, study packages and the registry differ"
    for name in enum:
        spec = S.study(name)
        assert spec.name == name
        grid = schema["properties"][name]["properties"]["grid"]["properties"]
        assert len(set(spec.axes)) == len(spec.axes), f"{name}: repeated axis"
        assert set(spec.axes) == set(grid), f"{name}: STUDY.axes {spec.axes} vs schema grid keys {list(grid)}"
        settings = set(schema["properties"][name]["properties"]) - {"grid"}
        assert not set(spec.axes) & settings, f"{name}: an axis is also a setting"
        assert set(spec.cell_keys) <= settings, f"{name}: cell_keys not in the schema"
        for module in spec.optional_modules:
            assert importlib.util.find_spec(module) is not None, f"{name}: optional module {module} does not exist"
        for part in ("measure", "report"):
            assert (PACKAGE / "studies" / name / f"{part}.py").is_file(), f"studies/{name}/{part}.py is missing"
        measure = importlib.import_module(f"cs336sys.studies.{name}.measure")
        assert callable(measure.measure), f"cs336sys.studies.{name}.measure has no measure()"
        report = S.report_module(name)
        assert callable(report.figures) and callable(report.findings), f"{name}.report lacks figures/findings"
        returns = typing.get_type_hints(report.facts)["return"]  # what the handout's answers quote: one typed interface
        assert dataclasses.is_dataclass(returns) and all(f.type for f in dataclasses.fields(returns)), f"{name}.report.facts"
    with pytest.raises(ValueError, match="unknown study"):
        S.study("nonsense")


def _section(study: str, **grid) -> dict:
    """A validated section of ``study``: the schema's defaults with ``grid`` axes replaced."""
    config = {"run": "t", "device": "cpu", "studies": [study], study: {"grid": grid}}
    return validate_config(config, SCHEMA)[0][study]


def test_cell_ids_follow_the_axes_with_booleans_as_integers():
    axes = {"d_model": 16, "seq_len": 64, "activation": "relu", "impl": "eager", "causal": True, "precision": "fp32"}
    assert S.cell_id("attention", axes) == "d_model=16_seq_len=64_activation=relu_impl=eager_causal=1_precision=fp32"
    grid = dict(d_model=[16], seq_len=[64], activation=["relu"], impl=["eager"], causal=[True, False], precision=["fp32"])
    cells = plan.cells("attention", _section("attention", **grid), BUILT_IN)
    assert [c["causal"] for c in cells] == [1, 0]
    assert plan.grid("attention", {"attention": _section("attention", causal=[False])}, BUILT_IN)  # the other axes take defaults


def test_cells_drop_sdpa_with_relu():
    grid = dict(d_model=[16], seq_len=[64], activation=["softmax", "relu"], impl=["eager", "sdpa"], causal=[True], precision=["fp32"])
    section = _section("attention", **grid)
    cells = plan.cells("attention", section, BUILT_IN)
    assert sorted((c["impl"], c["activation"]) for c in cells) == [("eager", "relu"), ("eager", "softmax"), ("sdpa", "softmax")]
    assert not plan.cells("attention", {**section, "grid": {**section["grid"], "impl": ["sdpa"], "activation": ["relu"]}}, BUILT_IN)


def test_mha_cells_drop_indivisible_heads_and_exact_cells_carry_no_features_once():
    variants = ["exact-eager", "exact-sdpa", "performer"]
    grid = dict(embed_dim=[30, 32], num_heads=[4], seq_len=[64], variant=variants, kernel=["softmax", "relu"], num_features=[16, 32])
    section = _section("mha", **grid)
    cells = plan.cells("mha", section, BUILT_IN)
    assert {c["embed_dim"] for c in cells} == {32}  # 30 is not divisible by 4 heads
    exact = [c for c in cells if c["variant"] != "performer"]
    assert sorted((c["variant"], c["kernel"]) for c in exact) == [
        ("exact-eager", "relu"),
        ("exact-eager", "softmax"),
        ("exact-sdpa", "softmax"),
    ]
    assert all(c["num_features"] == 0 for c in exact)  # not one cell per m
    performer = [c for c in cells if c["variant"] == "performer"]
    assert sorted((c["kernel"], c["num_features"]) for c in performer) == [("relu", 16), ("relu", 32), ("softmax", 16), ("softmax", 32)]
    ids = [S.cell_id("mha", c) for c in cells]
    assert len(ids) == len(set(ids)) == 7
    assert not plan.cells("mha", {**section, "grid": {**section["grid"], "embed_dim": [30]}}, BUILT_IN)


def test_flash_leaderboard_cells_appear_once():
    grid = dict(seq_len=[64], head_dim=[16], precision=["fp32"], impl=["eager", "sdpa-flash"], num_heads=[1])
    plain = plan.cells("flash", {**_section("flash", **grid), "leaderboard": None}, BUILT_IN)
    assert len(plain) == 2
    inside = {"seq_len": 64, "head_dim": 16, "num_heads": 1, "precision": "fp32"}  # a point of the grid already
    assert plan.cells("flash", {**_section("flash", **grid), "leaderboard": inside}, BUILT_IN) == plain
    outside = {"seq_len": 128, "head_dim": 16, "num_heads": 4, "precision": "fp32"}
    cells = plan.cells("flash", {**_section("flash", **grid), "leaderboard": outside}, BUILT_IN)
    assert cells[:2] == plain and len(cells) == 4
    assert {(c["impl"], c["seq_len"], c["num_heads"]) for c in cells[2:]} == {("eager", 128, 4), ("sdpa-flash", 128, 4)}
    ids = [S.cell_id("flash", c) for c in cells]
    assert len(ids) == len(set(ids))
    # the leaderboard shapes cells; it is not a setting of the measurement
    kwargs = plan.plan_cell(
        "flash", cells[-1], {"device": "cpu", "flash": {**_section("flash", **grid), "leaderboard": outside}}, BUILT_IN
    ).kwargs()
    assert "leaderboard" not in kwargs and kwargs["seq_len"] == 128


def test_every_study_section_of_the_presets_makes_cells(monkeypatch):
    monkeypatch.setattr("cs336sys.pipeline.config.detected_gpu_name", lambda: None)  # run: auto, without asking nvidia-smi
    for preset in [None, *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "config").glob("*.yaml"))]:
        config, _ = validate_config(load_config(REPO, *([preset] if preset else [])), SCHEMA)
        for study in config["studies"]:
            cells = plan.cells(study, config[study], BUILT_IN)
            assert cells, f"{preset or 'config.yaml'}: {study} has no cell"
            assert len({S.cell_id(study, c) for c in cells}) == len(cells)
            for axes in cells:
                kwargs = plan.plan_cell(study, axes, config, BUILT_IN).kwargs()
                assert {k: kwargs[k] for k in axes} == axes  # the cell's axes reach the measurement as they are
                assert not set(kwargs) & set(plan.JOB_KEYS), (study, sorted(kwargs))


def test_an_axis_named_like_a_row_column_is_refused():
    # found by adding a toy study with an axis `n`: every row's sample count overwrote it
    from cs336sys.studies import Study, check_axes

    with pytest.raises(RuntimeError, match=r"\['n'\]"):
        check_axes(Study(name="toy", question="", axes=("n", "precision"), kind="toy"))
    check_axes(Study(name="toy", question="", axes=("dim", "precision"), kind="toy"))


def test_an_impl_axis_goes_with_a_kind_of_the_catalogs():
    # the axis's values are the implementations of the study's kind (catalog lines name kinds, not studies)
    from cs336sys.studies import Study, check_axes

    for axes, kind in ((("impl", "seq_len"), "toy"), (("seq_len",), "lm")):
        with pytest.raises(RuntimeError, match="an `impl` axis goes with a kind of the catalog's .lm, attention-core, fused-attention."):
            check_axes(Study(name="toy", question="", axes=axes, kind=kind))
    assert check_axes(Study(name="toy", question="", axes=("impl", "seq_len"), kind="lm")).kind == "lm"
