"""No module state steers a measurement: what a cell times with travels as arguments (``measure.session``).

A setting written into a module at run time (a policy set by a ``configure()``, a flag the runner flips, an
accumulator reset per cell) reaches every later measurement of the process unseen, and tests have to put it
back by hand. So no function of a measuring module declares ``global``, assigns to a module-level name's
attribute or item (its own, or an imported module's: ``busy.ENABLED = False``), or calls a mutating method on
one (``_spent.update(...)``). Read with ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cs336sys"
MODULES = sorted([*SRC.glob("measure/*.py"), *SRC.glob("studies/*/measure.py")])
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add", "discard", "__setitem__"}


def _module_names(tree: ast.Module) -> set[str]:
    """Names bound at a module's top level: its imports, assignments, functions and classes."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).partition(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """A function's parameters and the names it binds itself (shadowing a module's)."""
    args = fn.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).partition(".")[0] for a in node.names}
    return names


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def module_state_writes(source: str) -> list[str]:
    """``line: what`` for each write of module state at run time in ``source`` (module doc)."""
    tree = ast.parse(source)
    module = _module_names(tree)
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        shared = module - _local_names(fn)
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                found.append(f"{node.lineno}: global {', '.join(node.names)}")
            targets = (
                node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            )
            targets += node.targets if isinstance(node, ast.Delete) else []
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)) and _root(target) in shared:
                    found.append(f"{node.lineno}: assigns {ast.unparse(target)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                if _root(node.func.value) in shared:
                    found.append(f"{node.lineno}: calls {ast.unparse(node.func)}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(SRC).as_posix())
def test_no_measuring_module_writes_module_state_at_run_time(path):
    assert module_state_writes(path.read_text()) == [], path.relative_to(SRC).as_posix()


def test_the_check_sees_each_way_a_module_setting_was_written():
    source = """
import busy
POLICY = {"trials": 1}
_spent = {}
_at = None

def configure(trials, rows):
    global _at
    POLICY["trials"] = trials
    busy.ENABLED = False
    _spent.update(timed=0.0)
    rows.append(1)  # a parameter: the caller's
    local = {}
    local.update(x=1)

def shadow():
    POLICY = {}
    POLICY.update(x=1)  # a local of the same name
"""
    assert module_state_writes(source) == [
        "8: global _at",
        "9: assigns POLICY['trials']",
        "10: assigns busy.ENABLED",
        "11: calls _spent.update",
    ]
