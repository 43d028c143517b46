"""Ground floor: content hashes of the source files a job runs, so reruns follow content, not mtimes.

The files are derived, not listed by hand: :func:`module_closure` walks the
``cs336sys`` imports (top-level and inside functions) of a cell's measurement
and of the cell runner, with the package ``__init__`` files they pass through.
An attention implementation's module, which dispatch imports by name, is a
root only of the cells whose ``impl`` selects it (``cs336sys.catalog``,
``studies.cell_modules``), so editing the Triton file reruns the Triton cells
only; ``Study.optional_modules`` leaves other modules out of cells that never
run them. The study registry imports a study's package only when asked for it,
so a cell's closure holds the registry and its own study's package, and adding
a study reruns no cell. A test records the modules that each demo
cell's measuring process really loaded and checks that all of them are hashed.

Two modules are tables of named entries (:data:`TABLES`): the catalog, one line
per attention implementation, and the row columns. A cell's hash covers such a
module's machinery (every line outside the table) and only the entries its
measuring process reads (:func:`code_units`): the catalog lines of the
implementations it selects (``studies.cell_entries``), and the columns that
declare a ``stat``, which every timed row's measurement computes
(``measure.timing`` → ``columns.sample_stats``: the child has every step time,
a row keeps them only up to ``measure.timing.MAX_STORED_SAMPLES``, so the merge
could not recompute them; a new statistic does rerun every cell, whose rows gain
it). The other columns' lines say how the merge folds passes: no measuring
process reads them. So a new catalog line or fold rule reruns no cell, an edited
line reruns the cells that read it, and an edit to the machinery (a function
defined beside the table included) reruns every cell that imports the module.
Jobs that read a whole table (the merge, the report) hash the file whole.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "cs336sys"
PACKAGE_DIR = Path(__file__).resolve().parent
RUNNER = "cs336sys.pipeline.cells"  # the measuring process runs this for every cell
# module → the names of its top-level assignments that hold its table of entries (module docstring)
TABLES = {"cs336sys.catalog": ("_BUILT_IN",), "cs336sys.columns": ("_first", "COLUMNS")}


@functools.cache  # one parse of the workflow asks for the same few dozen files thousands of times
def module_file(module: str) -> Path | None:
    """The source file of a ``cs336sys`` module or package, or None if there is none."""
    parts = module.split(".")[1:]
    base = PACKAGE_DIR.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def _imports(module: str) -> tuple[str, ...]:
    """The ``cs336sys`` modules that ``module``'s source imports anywhere in its body."""
    path = module_file(module)
    if path is None:
        return ()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found = []
    if path.name == "__init__.py":
        # a package's lazy `__getattr__` (cs336sys.TransformerLM) runs only when that name is asked for
        tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == "__getattr__")]
    found += imported_names(tree, package)
    return tuple(sorted({m for m in found if m.split(".")[0] == PACKAGE and module_file(m) is not None}))


def imported_names(tree: ast.AST, package: str) -> list[str]:
    """Every module ``tree`` imports anywhere in its body (relative ones resolved against ``package``), and
    each ``from pkg import name`` as ``pkg.name`` too: that name may be a module."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found += [base] + [f"{base}.{a.name}" for a in node.names]
    return found


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def module_closure(roots: Iterable[str], exclude: Iterable[str] = ()) -> list[str]:
    """Every ``cs336sys`` module reachable from ``roots`` through imports, skipping ``exclude``."""
    skip = set(exclude)
    seen: set[str] = set()
    todo = [m for root in roots for m in _with_parents(root)]
    while todo:
        module = todo.pop()
        if module in seen or module in skip:
            continue
        seen.add(module)
        todo += [m for dep in _imports(module) for m in _with_parents(dep)]
    return sorted(seen)


def content_hash(data: bytes) -> str:
    """The short content hash every code record and rerun hash uses."""
    return hashlib.sha256(data).hexdigest()[:16]


def file_hash(path: str | Path) -> str:
    return content_hash(Path(path).read_bytes())


def _unit_name(path: Path) -> str:
    return path.relative_to(PACKAGE_DIR).as_posix() if path.is_relative_to(PACKAGE_DIR) else path.name


def _units_hash(units: Iterable[tuple[str, bytes]]) -> str:
    """One hash over (name, content) units, in the order given."""
    digest = hashlib.sha256()
    for name, data in units:
        digest.update(name.encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def code_hash(files: Iterable[str | Path]) -> str:
    """One hash over the contents and package-relative names of ``files``."""
    return _units_hash((_unit_name(path), path.read_bytes()) for path in sorted({Path(f).resolve() for f in files}))


def modules_hash(modules: Iterable[str], entries: Iterable[str] | None = None) -> str:
    """The hash of ``modules``' files; with ``entries`` (a cell's), of their :func:`code_units` instead."""
    if entries is None:
        return code_hash(f for f in map(module_file, modules) if f is not None)
    return _units_hash((name, text.encode()) for name, text in sorted(code_units(modules, entries).items()))


def code_units(modules: Iterable[str], entries: Iterable[str] = ()) -> dict[str, str]:
    """What a cell running ``modules`` runs of them, by unit: ``{package-relative path: source}``, except
    for a table module (:data:`TABLES`): its machinery under its path, and each entry the cell reads under
    ``<path>:<entry>`` -- those named in ``entries`` and those that declare a ``stat`` (module docstring)."""
    wanted = set(entries)
    units: dict[str, str] = {}
    for module in modules:
        path = module_file(module)
        if path is None:
            continue
        name, text = _unit_name(path), path.read_text()
        if module not in TABLES:
            units[name] = text
            continue
        machinery, table = split_table(text, TABLES[module])
        units[name] = machinery
        units.update({f"{name}:{key}": line for key, (line, stat) in table.items() if key in wanted or stat})
    return units


@functools.cache  # by source text: an edited file is parsed again
def split_table(source: str, tables: tuple[str, ...]) -> tuple[str, dict[str, tuple[str, bool]]]:
    """``source`` without the lines of the entries of its assignments named ``tables`` (its machinery), and
    each entry by name: (its whole lines, comments included; whether it declares a ``stat``).

    An entry is an element of the assigned tuple or list (of the list a dict comprehension iterates:
    ``COLUMNS``), or the whole value where it is neither (``_first``, one list comprehension); it is named
    by its first argument (``Impl("triton", …)``), by the names a generator makes it for
    (``*(Column(c, …) for c in ("a", "b"))`` → ``a,b``), or by the assignment."""
    lines = source.splitlines(keepends=True)
    table: dict[str, tuple[str, bool]] = {}
    taken: set[int] = set()
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if not isinstance(target, ast.Name) or target.id not in tables or node.value is None:
            continue
        for key, first, entry in _entries(node.value) or [("", node.value, node.value)]:
            span = range(first.lineno - 1, entry.end_lineno)  # type: ignore[arg-type]
            key = key or target.id
            stat = any(isinstance(n, ast.keyword) and n.arg == "stat" for n in ast.walk(entry))
            text, had = table.get(key, ("", False))  # two entries of one name: both under it
            table[key] = (text + "".join(lines[i] for i in span), had or stat)
            taken.update(span)
    return "".join(line for i, line in enumerate(lines) if i not in taken), table


def _entries(value: ast.expr) -> list[tuple[str, ast.expr, ast.expr]]:
    """(name, first node, last node) of each entry of a table's value; [] where it is not a display."""
    if isinstance(value, ast.DictComp) and isinstance(value.generators[0].iter, (ast.List, ast.Tuple)):
        value = value.generators[0].iter
    return [(_entry_name(e), e, e) for e in value.elts] if isinstance(value, (ast.List, ast.Tuple)) else []


def _entry_name(entry: ast.expr) -> str:
    node = entry.value if isinstance(entry, ast.Starred) else entry
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    if isinstance(node, (ast.GeneratorExp, ast.ListComp)) and isinstance(node.generators[0].iter, ast.Tuple):
        return ",".join(str(e.value) for e in node.generators[0].iter.elts if isinstance(e, ast.Constant))
    return ""
