"""Adding a study, an implementation or a column reruns no cell that exists already.

A cell's code hash (``studies.cell_code_hash``) covers what its measuring process runs: the registry
and its own study's package (not every study's), the catalog's machinery and its own implementations'
lines (not every line), the columns' machinery and the statistics the measurement computes (not the
merge's fold rules). Each test edits a copy of the package and compares every cell's hash, computed
in a fresh interpreter, before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cs336sys import studies as S
from cs336sys.catalog import BUILT_IN
from cs336sys.pipeline.code_record import cell_file_hashes
from workflow_helpers import REPO

SRC = REPO / "src"
PRESETS = ("config/full.yaml", "config/cpu-demo.yaml")

# every cell of the presets (and one per schema implementation of each impl study): id → hash
_HASHES = r"""
import json, sys
from cs336sys.catalog import BUILT_IN
from cs336sys.pipeline import plan
from workflow_helpers import REPO, load_config
out = {}
for preset in json.loads(sys.argv[1]):
    config = load_config(REPO, preset)
    for study in config["studies"]:
        for cell, axes in plan.grid(study, config, BUILT_IN).items():
            out[f"{study}/{cell}"] = [plan.cell_code_hash(study, axes, None, BUILT_IN), sorted(plan.cell_entries(study, axes, BUILT_IN))]
print(json.dumps(out))
"""

# an LM study with an attention core's shape: the facts that lived in shared tables (catalog, columns) live on its spec
TOY_INIT = """from cs336sys.catalog import LM
from cs336sys.studies import Study

STUDY = Study(name="toy", question="a study added in a test", axes=("width", "impl"), kind=LM, estimate_s=9.0,
              attention_shape=lambda row: (1, 1, row.get("width"), 8, True))
"""
TOY_SCHEMA = """\
description: a study added in a test
grid:
  width: {$ref: "#/$defs/posints", default: [2]}
  impl: {$ref: "#/$defs/impls", default: [eager]}
settings:
  timeout_s: {$ref: "#/$defs/timeout_s", default: 60}
  resources: {$ref: "#/$defs/resources"}
"""


def _python(code: str, src: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO / "tests")])}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]


def _hashes(src: Path) -> dict[str, str]:
    out = json.loads(_python(_HASHES, src, json.dumps(PRESETS)))
    return {cell: h for cell, (h, _) in out.items()}


@pytest.fixture
def src_copy(tmp_path):
    dest = tmp_path / "src"
    shutil.copytree(SRC, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return dest


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path}"
    path.write_text(text.replace(old, new))


@pytest.mark.slow
def test_adding_a_study_package_changes_no_cell_hash(src_copy):
    before = _hashes(src_copy)
    package = src_copy / "cs336sys" / "studies" / "toy"
    package.mkdir()
    (package / "__init__.py").write_text(TOY_INIT)
    (package / "schema.yaml").write_text(TOY_SCHEMA)
    (package / "measure.py").write_text("def measure(device, context, **kwargs):\n    yield {}\n")
    after = _hashes(src_copy)
    assert len(before) > 100
    assert {c for c in before if after[c] != before[c]} == set()


def _selects(cell: str, impl: str) -> bool:
    """Whether a cell (``study/id``) runs implementation ``impl``: as its ``impl`` or its ``impl`` partner."""
    study, _, cell_id = cell.partition("/")
    axes = dict(part.split("=", 1) for part in cell_id.split("_") if "=" in part)
    if axes.get("impl") == impl:
        return True
    return any(p.axis == "impl" and p.other == impl and axes.get("impl") == p.base for p in S.study(study).pairs)


@pytest.mark.slow
def test_a_new_catalog_line_changes_no_cell_hash_and_an_edited_one_only_its_cells(src_copy):
    catalog = src_copy / "cs336sys" / "catalog.py"
    before = _hashes(src_copy)
    toy = '    Impl("toy-line", "pytorch", _CORES, _SDPA, (FUSED,), "a toy line", traffic="fused"),\n'
    _edit(catalog, ")  # fmt: skip\n\n_IMPLS", toy + ")  # fmt: skip\n\n_IMPLS")
    assert _hashes(src_copy) == before
    _edit(catalog, '"our Triton FlashAttention-2 kernel"', '"our Triton FlashAttention-2 kernel (edited)"')
    after = _hashes(src_copy)
    changed = {c for c in before if after[c] != before[c]}
    expected = {c for c in before if _selects(c, "triton")}
    assert {c.partition("/")[0] for c in expected} >= {"attention", "flash", "e2e"}
    assert changed == expected
    _edit(catalog, "\n_IMPLS: dict[str, Impl] = {}", "\n_IMPLS: dict[str, Impl] = {}  # edited machinery")
    after = _hashes(src_copy)
    assert {c for c in before if after[c] == before[c]} == set(), "an edit outside the table reruns every cell"


@pytest.mark.slow
def test_a_new_fold_column_changes_no_cell_hash_but_a_new_statistic_changes_every_cell(src_copy):
    columns = src_copy / "cs336sys" / "columns.py"
    before = _hashes(src_copy)
    _edit(
        columns, '    Column("finished_at", "", "last"),\n', '    Column("finished_at", "", "last"),\n    Column("toy_note", "", "join"),\n'
    )
    _edit(columns, '        *("started_at", "gpu_index",', '        "toy_first",\n        *("started_at", "gpu_index",')  # a "first" column
    assert _hashes(src_copy) == before
    # a column with a `stat` is computed by every measuring child (measure.timing): every cell's rows change
    _edit(
        columns,
        '    Column("finished_at", "", "last"),\n',
        '    Column("finished_at", "", "last"),\n    Column("max2_ms", "ms", "pooled", stat=max),\n',
    )
    after = _hashes(src_copy)
    assert {c for c in before if after[c] == before[c]} == set()


def test_the_code_record_names_the_catalog_lines_a_cell_runs():
    axes = {"seq_len": 128, "head_dim": 64, "precision": "bf16", "impl": "triton", "num_heads": 1}
    files = cell_file_hashes("flash", axes, None, BUILT_IN)
    assert "catalog.py:triton" in files and "catalog.py" in files
    assert not [f for f in files if f.startswith("catalog.py:") and f != "catalog.py:triton"]
    e2e = {"size": "tiny", "context_length": 32, "precision": "fp32", "impl": "eager", "compile": 0, "cuda_graphs": 0}
    e2e = {a: e2e.get(a, 0) for a in S.study("e2e").axes}
    assert {f for f in cell_file_hashes("e2e", e2e, None, BUILT_IN) if f.startswith("catalog.py:")} == {
        "catalog.py:eager",
        "catalog.py:sdpa",
    }  # + its pair
    assert not [
        f for f in files if f.startswith("studies/") and not f.startswith(("studies/flash/", "studies/attention/", "studies/__init__"))
    ]


_CHILD = r"""
import json, sys
import cs336sys.pipeline.cells  # the runner, as the measuring child imports it
from cs336sys import studies as S
module = S.study(sys.argv[1]).measure.partition(":")[0]
__import__(module)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("cs336sys.studies."))))
"""


@pytest.mark.slow
@pytest.mark.parametrize("study", list(S.STUDIES))
def test_a_measuring_child_loads_no_other_study_than_its_measurement_imports(study):
    from cs336sys.provenance import module_closure

    measure = S.study(study).measure.partition(":")[0]
    loaded = {m.split(".")[2] for m in json.loads(_python(_CHILD, SRC, study))}
    imported = {m.split(".")[2] for m in module_closure([measure]) if m.startswith("cs336sys.studies.")}
    assert study in loaded
    assert loaded <= imported, f"the {study} child imported other studies' packages: {sorted(loaded - imported)}"
    if study in ("e2e", "mha", "attention"):
        assert loaded == {study}
