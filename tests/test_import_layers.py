"""The package's import graph is strictly layered: every import points to the same floor or one below.

Read from the source with ``ast`` (nothing is imported, so no torch): imports at module level and
inside functions alike, relative ones resolved. A module's floor follows from where it lives: a
module at the package root is ground, a subpackage is one floor (:data:`FLOORS`), so the folder
tree shows the layers that docs/architecture.md lists. No two modules import each other, however
indirectly (an import inside a function counts). Above the studies, what a study's report module
offers is read through the registry, and only its ``figures``, ``findings`` and ``facts``; outside
the studies' folders no module lists studies by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

from workflow_helpers import REPO

PACKAGE = REPO / "src" / "cs336sys"

# bottom to top; a module imports its own floor and the ones listed before it
FLOORS = ("ground", "models", "measure", "analysis", "studies", "pipeline", "handout", "runs", "entry")
# the command line on top: it builds a cell like the workflow does and prints its derived metrics
ENTRY_POINTS = {"cs336sys.cli", "cs336sys.cli_result", "cs336sys.__main__"}
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


# what a study's report module offers the floors above (the run report, the handout): its figures, its findings and
# the typed facts its answers quote, nothing else (a constant or helper read there would be a study's fact kept elsewhere)
REPORT_API = {"figures", "findings", "facts"}


def _is_report_module(node: ast.AST) -> bool:
    """Whether ``node`` calls the registry's ``report_module`` (``report_module(s)``, ``S.report_module(s)``)."""
    func = node.func if isinstance(node, ast.Call) else None
    return isinstance(func, ast.Name | ast.Attribute) and getattr(func, "id", getattr(func, "attr", "")) == "report_module"


def _names(target: ast.expr) -> list[ast.Name]:
    """The names an assignment's target binds: ``x``, ``a, b`` (not ``self.x`` or ``d[k]``)."""
    if isinstance(target, ast.Tuple | ast.List):
        return [n for t in target.elts for n in _names(t.value if isinstance(t, ast.Starred) else t)]
    return [target] if isinstance(target, ast.Name) else []


def registry_reads(path: Path) -> list[tuple[int, str]]:
    """(line, attribute) of every attribute read from a study's report module that ``path`` gets through the registry:
    on the call itself, or on a name bound to it (``E2E = report_module("e2e")``, ``A, B = (report_module(s) for …)``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(_is_report_module(n) for n in ast.walk(node.value)):
            bound |= {n.id for t in node.targets for n in _names(t)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (_is_report_module(node.value) or getattr(node.value, "id", None) in bound):
            found.append((node.lineno, node.attr))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (module → the modules it imports): each strongly connected set of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph() -> dict[str, set[str]]:
    return {m: {t for _, t in imports(m, path) if t in MODULES and t != m} for m, path in MODULES.items()}


def study_lists(path: Path, names: set[str]) -> list[str]:
    """``line: names`` of each tuple, list or set display (or dict display's keys) spelling two or more study ``names``
    that make up at least half of its strings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else []
        strings = [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        named = [v for v in strings if v in names]
        # a list of studies is mostly study names; a list of other things may share a word or two with them
        # (the time parts `warmup` and `profile` of a job)
        if len(named) >= 2 and 2 * len(named) >= len(strings):
            found.append(f"{node.lineno}: {named}")
    return found


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


def test_above_the_studies_a_report_module_offers_only_figures_findings_and_facts():
    above = [path for module, path in MODULES.items() if FLOORS.index(floor(module)) > FLOORS.index("studies")]
    reads = [f"{path.relative_to(REPO)}:{line}: .{attr}" for path in above for line, attr in registry_reads(path) if attr not in REPORT_API]
    assert not reads, (
        "read through studies.report_module beyond figures/findings/facts (give the study's facts a field):\n  " + "\n  ".join(reads)
    )
    assert any(attr == "facts" for path in PACKAGE.glob("handout/*.py") for _, attr in registry_reads(path))  # the walker sees them


def test_the_registry_reads_walker_follows_names_bound_to_a_report_module(tmp_path):
    path = tmp_path / "answers.py"
    path.write_text(
        "from cs336sys import studies as S\nfrom cs336sys.studies import report_module\n"
        "E2E, WARM = (report_module(s) for s in ('e2e', 'warmup'))\nx = E2E.PAIRED\ny = S.report_module('mha').facts(df).slopes\n"
        "def f(run):\n    mod = report_module(run)\n    self.cache[run] = report_module(run).facts(df)\n"
        "    return mod.findings(df), WARM.warmup_effect, self.rows\n"
    )
    assert sorted(attr for _, attr in registry_reads(path)) == ["PAIRED", "facts", "facts", "findings", "warmup_effect"]


def test_no_import_circle_not_even_through_a_function_level_import():
    circles = cycles(import_graph())
    assert not circles, f"modules that import each other (move the shared piece down a module): {circles}"


def test_the_circle_finder_sees_a_circle_through_a_function_level_import(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    path = tmp_path / "metrics.py"  # roofline imported metrics inside its functions, metrics roofline at the top
    path.write_text("from cs336sys.analysis.roofline import add_roofline\ndef f():\n    from cs336sys.analysis import metrics\n")
    graph = {**import_graph(), "cs336sys.analysis.roofline": {t for _, t in imports("cs336sys.analysis.roofline", path)}}
    graph["cs336sys.analysis.metrics"] |= {"cs336sys.analysis.roofline"}
    assert ["cs336sys.analysis.metrics", "cs336sys.analysis.roofline"] in cycles(graph)


def test_no_module_outside_a_studys_folder_lists_studies():
    from cs336sys.studies import STUDIES

    outside = [path for module, path in MODULES.items() if not module.startswith("cs336sys.studies.")]
    lists = [f"{path.relative_to(REPO)}:{where}" for path in outside for where in study_lists(path, set(STUDIES))]
    assert not lists, "study names listed outside the studies' folders (ask each study's spec, e.g. its kind):\n  " + "\n  ".join(lists)


def test_the_study_list_walker_sees_tuples_lists_sets_and_dict_keys(tmp_path):
    path = tmp_path / "energy.py"
    path.write_text(
        'LM = ("e2e", "warmup")\nX = {"e2e": 1, "flash": 2}\nY = ["mha"]\nZ = {"attention", "x", "flash"}\nT = ("a", "b", "warmup", "c", "profile")\n'
    )
    assert study_lists(path, {"e2e", "warmup", "flash", "mha", "attention"}) == [
        "1: ['e2e', 'warmup']",
        "2: ['e2e', 'flash']",
        "4: ['attention', 'flash']",
    ]
