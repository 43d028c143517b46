"""A plug-in's import cannot hang, end or move the process that checks it, and a cell's code hash covers the
files it really loads (cs336sys.plugin_imports, cs336sys.plugins).

Each test writes its own plug-in under tmp_path, with module names of its own: the checks that run in this
process import them here.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cs336sys import catalog, plugins
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import validate_config
from cs336sys.pipeline.config_file import ConfigError

REPO = Path(__file__).resolve().parents[1]
KEY = "config key 'plugins.attention.mine.function'"
ATTENTION = "def attention(q, k, v, is_causal=False):\n    return q\n"
_names = itertools.count()


@pytest.fixture(autouse=True)
def _no_user_lines():
    yield
    plugins.activate({})


def module_name(stem: str) -> str:
    return f"{stem}_{os.getpid()}_{next(_names)}"  # unique in this process: each test imports its own


def write_plugin(root: Path, source: str, stem: str = "kern") -> str:
    """A plug-in module under ``root`` (made if missing): its 'module:attention' import path."""
    root.mkdir(parents=True, exist_ok=True)
    name = module_name(stem)
    (root / f"{name}.py").write_text(source)
    return f"{name}:attention"


def config_with(root: Path, *functions: str, **extra) -> dict:
    names = ["mine"] + [f"other{i}" for i in range(1, len(functions))]
    section = {"path": str(root), "attention": {n: {"function": f, "form": "callable"} for n, f in zip(names, functions)}, **extra}
    grid = {"impl": names, "d_model": [16], "seq_len": [64], "activation": ["softmax"], "causal": [True], "precision": ["fp32"]}
    return {"run": "t", "device": "cpu", "studies": ["attention"], "plugins": section, "attention": {"grid": grid}}


def refused(config: dict, check_imports: str) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(config, check_imports=check_imports)
    return str(info.value)


# --- in this process (the library's check_imports="here") --------------------------------------------------
def test_sys_exit_at_import_is_a_problem_naming_the_key(tmp_path):
    message = refused(config_with(tmp_path, write_plugin(tmp_path, "import sys\nsys.exit(0)\n")), "here")
    assert KEY in message and "SystemExit: sys.exit(0)" in message, message


def test_a_plugin_that_changes_directory_at_import_leaves_the_working_directory(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plug = write_plugin(tmp_path / "plug", f"import os\nos.chdir({str(elsewhere)!r})\n{ATTENTION}")
    validate_config(config_with(tmp_path / "plug", plug), check_imports="here")
    assert Path.cwd() == tmp_path
    assert "changed the working directory" in capfd.readouterr().err


def _hashes(config: dict) -> dict[str, str]:
    offered = plugins.offered(config["plugins"])
    grid = plan.grid("attention", config, offered)
    return {cell: plan.cell_code_hash("attention", axes, config["plugins"], offered) for cell, axes in grid.items()}


def _dynamic_plugin(tmp_path: Path) -> tuple[dict, Path, Path]:
    """A kernel that imports one helper through importlib and another from outside plugins.path, both at import time."""
    plug, outside = tmp_path / "plug", tmp_path / "outside"
    dynamic, external = module_name("dynhelp"), module_name("outhelp")
    plug.mkdir()
    outside.mkdir()
    (plug / f"{dynamic}.py").write_text("SCALE = 1\n")
    (outside / f"{external}.py").write_text("SHIFT = 0\n")
    source = (
        f"import importlib, sys\nsys.path.append({str(outside)!r})\nimport {external}\n"
        f"_helper = importlib.import_module({dynamic!r})\n{ATTENTION}"
    )
    config = config_with(plug, write_plugin(plug, source), write_plugin(plug, ATTENTION))
    return config, plug / f"{dynamic}.py", outside / f"{external}.py"


@pytest.mark.parametrize("which", ["dynamic", "outside"])
def test_editing_a_helper_the_import_loaded_changes_exactly_its_cells_hash(tmp_path, which):
    config, dynamic, external = _dynamic_plugin(tmp_path)
    validate_config(config, check_imports="here")
    before = _hashes(config)
    helper = dynamic if which == "dynamic" else external
    helper.write_text(helper.read_text() + "# edited\n")
    after = _hashes(config)
    assert {cell for cell in before if before[cell] != after[cell]} == {c for c in before if "impl=mine" in c}


def test_the_code_record_names_a_helper_from_outside_the_plugin_path(tmp_path):
    from cs336sys.pipeline.code_record import cell_file_hashes

    config, dynamic, external = _dynamic_plugin(tmp_path)
    config, offered = validate_config(config, check_imports="here")
    axes = next(a for a in plan.grid("attention", config, offered).values() if a["impl"] == "mine")
    files = cell_file_hashes("attention", axes, config["plugins"], offered)
    assert f"{config['plugins']['path']}/{dynamic.name}" in files and str(external.resolve()) in files


def test_a_helper_imported_only_when_called_is_named_on_the_rows(tmp_path):
    from cs336sys.columns import fold_of

    late = module_name("latehelp")
    (tmp_path / f"{late}.py").write_text("SCALE = 1\n")
    source = f"import importlib\n\ndef attention(q, k, v, is_causal=False):\n    importlib.import_module({late!r})\n    return q\n"
    section = plugins.activate(config_with(tmp_path, write_plugin(tmp_path, source))["plugins"])
    cell = plugins.cell_plugins(catalog.CORE, {"impl": "mine"}, section)
    before = plugins.preload(cell)
    assert plugins.unhashed_note(cell, before) == ""
    q = torch.zeros(1, 4, 2)
    plugins.user_attention(q, q, q, function=cell["attention"]["mine"]["function"], form="callable", path=str(tmp_path))
    note = plugins.unhashed_note(cell, before)
    assert str((tmp_path / f"{late}.py").resolve()) in note and "reruns nothing" in note
    assert fold_of("plugin_note") == "join"  # the merge keeps it


def test_the_measuring_child_refuses_a_plugin_that_exits_at_import_by_its_key(tmp_path):
    section = plugins.activate(config_with(tmp_path, write_plugin(tmp_path, "raise SystemExit(3)\n"))["plugins"])
    with pytest.raises(ConfigError, match=r"plugins\.attention\.mine\.function.*SystemExit: sys.exit\(3\)"):
        plugins.preload(plugins.cell_plugins(catalog.CORE, {"impl": "mine"}, section))


def test_the_time_limit_is_a_setting_with_a_default_that_changes_no_measurement(tmp_path):
    from cs336sys.pipeline.config import settings_snapshot

    config, offered = validate_config(config_with(tmp_path, write_plugin(tmp_path, ATTENTION)))
    assert config["plugins"]["import_timeout_s"] == 60
    assert settings_snapshot(config)["plugins"] == {"path": str(tmp_path), "attention": config["plugins"]["attention"]}
    (axes,) = plan.grid("attention", config, offered).values()
    assert "import_timeout_s" not in plan.plan_cell("attention", axes, config, offered).params()["plugins"]  # no cell reruns for it
    for bad in (0, -1, "soon", 1e9):
        message = refused(config_with(tmp_path, write_plugin(tmp_path, ATTENTION), import_timeout_s=bad), "")
        assert "config key 'plugins.import_timeout_s'" in message, message


# --- in a child, as the workflow and the CLI check them --------------------------------------------------------
@pytest.mark.slow
def test_sys_exit_at_import_in_the_checking_child_names_the_key(tmp_path):
    message = refused(config_with(tmp_path, write_plugin(tmp_path, "import sys\nsys.exit(0)\n")), "subprocess")
    assert KEY in message and "SystemExit: sys.exit(0)" in message, message


@pytest.mark.slow
def test_a_plugin_that_sleeps_at_import_is_refused_after_its_time_limit(tmp_path):
    config = config_with(tmp_path, write_plugin(tmp_path, f"import time\ntime.sleep(600)\n{ATTENTION}"), import_timeout_s=2)
    t0 = time.monotonic()
    message = refused(config, "subprocess")
    assert KEY in message and "did not finish within 2 s (plugins.import_timeout_s)" in message, message
    assert time.monotonic() - t0 < 60


HOSTILE = {  # import-time source → what the refusal says (None: the plug-in is fine)
    "import sys\nsys.exit(0)\n": "SystemExit: sys.exit(0)",
    "import sys\nsys.exit('bye')\n": "SystemExit: sys.exit('bye')",
    "raise KeyboardInterrupt\n": "KeyboardInterrupt",
    "import os\nos._exit(0)\n": "ended during the import (exit status 0) without a word",
    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n": "ended during the import (signal 9)",
    "import time\nwhile True:\n    time.sleep(0.1)\n": "did not finish within 3 s",
    "import os, time\nif os.fork() == 0:\n    time.sleep(600)\n": None,  # a child left behind holds our pipes: not waited for
    "print('{\"end\": true}')\nprint('not json')\n": None,  # its prints cannot pose as the check's report
    "import os\nos.chdir('/')\n": None,
    "import sys\nsys.stdout.close()\n": None,
    "raise MemoryError('at import')\n": "MemoryError: at import",
    "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError\nraise Odd()\n": "Odd (its message cannot be printed)",
    "import os\nos._exit = lambda code: None\n": None,  # the fork still ends: the next plug-ins are checked once
    "import sys\nsys.modules['odd'] = type(sys)('odd')\nsys.modules['odd'].__getattr__ = lambda name: 1 / 0\n": None,
}


@pytest.mark.slow
def test_hostile_imports_are_refused_each_by_its_own_key_in_one_check(tmp_path):
    functions = [write_plugin(tmp_path, source + ATTENTION) for source in HOSTILE]
    config = config_with(tmp_path, *functions, import_timeout_s=3)
    t0 = time.monotonic()
    message = refused(config, "subprocess")
    assert time.monotonic() - t0 < 120
    lines = message.splitlines()[1:]
    names = ["mine"] + [f"other{i}" for i in range(1, len(functions))]
    for name, says in zip(names, HOSTILE.values()):
        mine = [line for line in lines if f"'plugins.attention.{name}.function'" in line]
        assert (len(mine) == 1 and says in mine[0]) if says else not mine, (name, says, message)


@pytest.mark.slow
def test_the_checking_child_records_a_dynamically_imported_helper(tmp_path):
    config, dynamic, _ = _dynamic_plugin(tmp_path)
    validate_config(config, check_imports="subprocess")  # as the workflow's parse: nothing imported here
    before = _hashes(config)
    dynamic.write_text(dynamic.read_text() + "# edited\n")
    after = _hashes(config)
    assert {cell for cell in before if before[cell] != after[cell]} == {c for c in before if "impl=mine" in c}


def _cli(cwd: Path, plug_root: Path, function: str, *extra: str) -> subprocess.CompletedProcess:
    from workflow_helpers import write_yaml

    write_yaml(cwd / "plug.yaml", {"plugins": {"path": str(plug_root), "attention": {"mine": {"function": function, "form": "callable"}}}})
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [
        sys.executable,
        "-m",
        "cs336sys",
        "attention",
        "--config",
        "plug.yaml",
        "--impl",
        "mine",
        "--d-model",
        "16",
        "--seq-len",
        "64",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "2",
        "--device",
        "cpu",
        "--timeout",
        "120",
        *extra,
    ]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_the_cli_refuses_a_plugin_that_exits_at_import_naming_the_key(tmp_path):
    done = _cli(tmp_path, tmp_path, write_plugin(tmp_path, "import sys\nsys.exit(0)\n"))
    assert done.returncode == 2 and KEY in done.stderr and "SystemExit" in done.stderr, done.stdout + done.stderr


@pytest.mark.slow
def test_a_plugin_that_changes_directory_at_import_does_not_move_the_clis_output(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    source = f"import os\nos.chdir({str(elsewhere)!r})\nimport torch\n\ndef attention(q, k, v, is_causal=False):\n"
    source += "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)\n"
    done = _cli(tmp_path, tmp_path / "plug", write_plugin(tmp_path / "plug", source), "--csv", "rows.csv")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "rows.csv").is_file() and not (elsewhere / "rows.csv").exists()


@pytest.mark.slow
def test_a_dry_run_stops_at_a_plugin_that_sleeps_at_import(tmp_path):
    from workflow_helpers import DEMO, copy_repo, snakemake, write_yaml

    root = copy_repo(tmp_path / "repo")
    function = write_plugin(tmp_path / "plug", f"import time\ntime.sleep(600)\n{ATTENTION}")
    overlay = config_with(tmp_path / "plug", function, import_timeout_s=2)
    write_yaml(root / "config/plug.yaml", {k: overlay[k] for k in ("plugins", "studies", "attention")})
    result = snakemake(root, "-n", "--configfile", DEMO, "config/plug.yaml", timeout=300)
    assert result.returncode != 0 and KEY in result.output and "did not finish within 2 s" in result.output, result.describe()
    assert result.seconds < 120, result.describe()


@pytest.mark.slow
def test_the_measuring_child_turns_an_exit_at_import_and_a_late_helper_into_rows(tmp_path):
    from cs336sys.pipeline.cells import run_cell

    late = module_name("latehelp")
    (tmp_path / f"{late}.py").write_text("SCALE = 1\n")
    source = f"import importlib\nimport torch\n\ndef attention(q, k, v, is_causal=False):\n    importlib.import_module({late!r})\n"
    source += "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)\n"
    exiting = write_plugin(tmp_path, "import sys\nsys.exit(0)\n" + ATTENTION)
    config, offered = validate_config(config_with(tmp_path, write_plugin(tmp_path, source), exiting))
    rows = {}
    for axes in plan.grid("attention", config, offered).values():  # the child registers the names from the cell's settings alone
        rows[axes["impl"]] = run_cell(dataclasses.replace(plan.plan_cell("attention", axes, config, offered), timeout_s=300))
    (failed,) = rows["other1"]
    assert failed["status"] == "error" and "plugins.attention.other1.function" in failed["error"] and "SystemExit" in failed["error"]
    assert {r["status"] for r in rows["mine"]} == {"ok"}, rows["mine"]
    assert all(late in r["plugin_note"] and "reruns nothing" in r["plugin_note"] for r in rows["mine"])


@pytest.mark.slow
def test_the_jobs_code_record_names_what_the_measuring_childs_import_loaded(tmp_path):
    from cs336sys.pipeline.cells import run_cell
    from cs336sys.pipeline.code_record import cell_file_hashes

    config, dynamic, external = _dynamic_plugin(tmp_path)
    config, offered = validate_config(config)  # nothing imported in this process, as in a cell's job
    axes = next(a for a in plan.grid("attention", config, offered).values() if a["impl"] == "mine")
    cell = dataclasses.replace(plan.plan_cell("attention", axes, config, offered), timeout_s=300)
    assert str(external.resolve()) not in cell_file_hashes("attention", axes, config["plugins"], offered)
    (row,) = run_cell(cell)
    assert row["status"] == "error"  # its kernel returns q (the check finds k, v unused); its import ran all the same
    files = cell_file_hashes("attention", axes, config["plugins"], offered)  # what the job writes beside the cell's CSV
    assert str(external.resolve()) in files and f"{config['plugins']['path']}/{dynamic.name}" in files


@pytest.mark.slow
def test_a_plugin_that_runs_our_kernels_is_hashed_with_them(tmp_path):
    # the course repository's Triton adapter calls our kernels: editing them reruns its cells too
    fixture = REPO / "tests/fixtures/course_repo"
    config = config_with(fixture, "tests.adapters:get_flashattention_autograd_function_triton")
    config["plugins"]["attention"]["mine"]["form"] = "adapter"
    config, offered = validate_config(config, check_imports="subprocess")
    labels = set(plugins.recorded(str(fixture), "tests.adapters:get_flashattention_autograd_function_triton").values())
    assert {"cs336_systems/flash_triton.py", "cs336sys/models/triton_attention.py"} <= labels, labels
    axes = next(iter(plan.grid("attention", config, offered).values()))
    assert (REPO / "src/cs336sys/models/triton_attention.py").resolve() in plugins.cell_files(
        plan.plan_cell("attention", axes, config, offered).plugins
    )
