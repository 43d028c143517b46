"""The package's import graph is strictly layered: every import points to the same floor or one below.

Read from the source with ``ast`` (nothing is imported, so no torch): imports at module level and
inside functions alike, relative ones resolved. A module's floor follows from where it lives: a
module at the package root is ground, a subpackage is one floor (:data:`FLOORS`), so the folder
tree shows the layers that docs/architecture.md lists.
"""

from __future__ import annotations

import ast
from pathlib import Path

from workflow_helpers import REPO

PACKAGE = REPO / "src" / "cs336sys"

# bottom to top; a module imports its own floor and the ones listed before it
FLOORS = ("ground", "models", "measure", "analysis", "studies", "pipeline", "handout", "runs", "entry")
# the command line on top: it builds a cell like the workflow does and prints its derived metrics
ENTRY_POINTS = {"cs336sys.cli", "cs336sys.__main__"}
# the package's own __init__ re-exports the model API (TransformerLM, the size table)
ROOT = "models"


def _module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


MODULES = _module_names()


def floor(module: str) -> str:
    """The floor of ``cs336sys.<...>``: ground for a root module, its subpackage's name otherwise."""
    if module in ENTRY_POINTS:
        return "entry"
    parts = module.split(".")
    if len(parts) == 1:
        return ROOT
    if parts[1] in FLOORS:
        return parts[1]
    if (PACKAGE / parts[1]).is_dir():
        raise AssertionError(f"package cs336sys.{parts[1]} has no floor: add it to FLOORS in {Path(__file__).name}")
    return "ground"


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported ``cs336sys`` module) for every import anywhere in ``path``; ``from pkg import name``
    counts as ``pkg.name`` where that is a module, as ``pkg`` otherwise."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found += [(node.lineno, f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target) for a in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "cs336sys"]


def arrows_of(module: str, path: Path) -> list[str]:
    """The imports of ``module`` (source ``path``) that break the floors, one line each."""
    arrows = []
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    mine = FLOORS.index(floor(module))
    for line, target in imports(module, path):
        if FLOORS.index(floor(target)) > mine:
            arrows.append(f"{where}:{line}: {module} ({floor(module)}) -> {target} ({floor(target)})")
        elif floor(target) == "studies" and target != "cs336sys.studies" and floor(module) != "studies":
            # above the studies, a study is reached through the registry (studies.report_module), never by path
            arrows.append(f"{where}:{line}: {module} reaches into a study by path: {target}")
    return arrows


def upward_arrows() -> list[str]:
    return sorted({arrow for module, path in MODULES.items() for arrow in arrows_of(module, path)})


def test_every_import_points_to_the_same_floor_or_below():
    arrows = upward_arrows()
    assert not arrows, f"{len(arrows)} imports run back up the floors {' < '.join(FLOORS)}:\n  " + "\n  ".join(arrows)


def test_the_walker_sees_function_level_and_relative_imports(tmp_path):
    source = "import os\nfrom . import sibling\ndef f():\n    from ..pipeline import cells\n    import cs336sys.runs.report\n"
    path = tmp_path / "mod.py"
    path.write_text(source)
    found = dict((name, line) for line, name in imports("cs336sys.measure.mod", path))
    assert found == {"cs336sys.measure": 2, "cs336sys.pipeline.cells": 4, "cs336sys.runs.report": 5}
    assert [floor(m) for m in found] == ["measure", "pipeline", "runs"]


def test_every_module_has_a_floor_and_the_floors_exist():
    assert {floor(m) for m in MODULES} == set(FLOORS)
    assert floor("cs336sys.catalog") == "ground" and floor("cs336sys.analysis.metrics") == "analysis"


def test_a_study_is_reached_through_the_registry_not_by_path(tmp_path):
    path = tmp_path / "answers.py"
    path.write_text("from cs336sys.studies import report_module\nfrom cs336sys.studies.e2e.report import PANELS\n")
    assert [a.split(": ", 1)[1] for a in arrows_of("cs336sys.handout.answers", path)] == [
        "cs336sys.handout.answers reaches into a study by path: cs336sys.studies.e2e.report"
    ]
    assert arrows_of("cs336sys.studies.warmup.report", path) == []  # one study may use another's report
    down = tmp_path / "metrics.py"
    down.write_text("def f():\n    from cs336sys.studies import STUDIES\n")
    assert len(arrows_of("cs336sys.analysis.metrics", down)) == 1  # below the studies, not even the registry
