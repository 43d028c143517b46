"""Ground floor: content hashes of the source files a job runs, so reruns follow content, not mtimes.

The files are derived, not listed by hand: :func:`module_closure` walks the
``cs336sys`` imports (top-level and inside functions) of a cell's measurement
and of the cell runner, with the package ``__init__`` files they pass through.
An attention implementation's module, which dispatch imports by name, is a
root only of the cells whose ``impl`` selects it (``cs336sys.catalog``,
``studies.cell_modules``), so editing the Triton file reruns the Triton cells
only; ``Study.optional_modules`` leaves other modules out of cells that never
run them. A test records the modules that each demo
cell's measuring process really loaded and checks that all of them are hashed.
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
        # a registry that imports every subpackage it finds (cs336sys.studies) imports them all
        if "pkgutil.iter_modules(__path__)" in path.read_text():
            found += [f"{module}.{p.name}" for p in path.parent.iterdir() if (p / "__init__.py").is_file()]
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


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def code_hash(files: Iterable[str | Path]) -> str:
    """One hash over the contents and package-relative names of ``files``."""
    digest = hashlib.sha256()
    for path in sorted({Path(f).resolve() for f in files}):
        name = path.relative_to(PACKAGE_DIR).as_posix() if path.is_relative_to(PACKAGE_DIR) else path.name
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def modules_hash(modules: Iterable[str]) -> str:
    return code_hash(f for f in map(module_file, modules) if f is not None)
