"""Every dotted ``cs336sys.<module>`` that the code, the workflow and the docs cite names a module that exists.

A report that tells its reader to look in ``cs336sys.metrics`` after the module moved sends them
nowhere. Names are resolved against the source tree, without importing anything (no torch): the
longest prefix that is a module or package counts; the next part must be a name that module defines
or imports at top level or lists in ``__all__`` (``cs336sys.analysis.peaks.PEAK_TFLOPS``), and any
further parts (``Class.method``) must appear in its source. A word of a docstring is no attribute.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from workflow_helpers import REPO

PACKAGE = REPO / "src" / "cs336sys"
# a dotted name starting at cs336sys; not part of a longer word (`xcs336sys.`) or a path (`src/cs336sys`)
CITED = re.compile(r"(?<![\w/.-])cs336sys(?:\.[A-Za-z_]\w*)+")
# dotted names that are labels, not modules: the profiler range measure/busy.py opens and looks up
LABELS = {"cs336sys.busy_window"}


def _cited_in() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    files += sorted(p for p in (REPO / "workflow").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    files += sorted((REPO / "docs").rglob("*.md"))
    files += sorted((REPO / "report").rglob("*.md"))  # committed reports name the modules that wrote them
    return files + [REPO / "README.md", REPO / "Snakefile"]


def _module_source(parts: list[str]) -> Path | None:
    """The source file of module ``cs336sys.<parts...>``, or None when there is no such module."""
    base = PACKAGE.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _top_level_names(source: Path) -> set[str]:
    """Names a module defines or imports at top level (inside `if`/`try` too), plus its ``__all__``."""
    names: set[str] = set()
    body = list(ast.parse(source.read_text(encoding="utf-8")).body)
    while body:
        node = body.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str))
        for field in ("body", "orelse", "finalbody", "handlers"):  # if / try / with blocks at top level
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                body.extend(getattr(node, field, []))
    return names


def unresolved(name: str) -> str | None:
    """Why ``name`` does not resolve, or None when it does."""
    parts = name.split(".")[1:]
    for cut in range(len(parts), -1, -1):  # the longest prefix that is a module
        source = _module_source(parts[:cut])
        if source is None:
            continue
        if cut == len(parts):
            return None
        module = ".".join(["cs336sys", *parts[:cut]])
        where = f"{source.relative_to(REPO)}"
        first, *rest = parts[cut:]
        if first not in _top_level_names(source):
            return f"no module {module}.{first}, and {module} ({where}) defines no {first!r}"
        text = source.read_text(encoding="utf-8")  # Class.method: the rest only has to appear in the source
        missing = [a for a in rest if not re.search(rf"\b{re.escape(a)}\b", text)]
        return f"{where} never mentions {', '.join(missing)}" if missing else None
    return "no module cs336sys"


def test_resolver_tells_modules_attributes_and_neither_apart():
    assert unresolved("cs336sys.analysis.metrics") is None
    assert unresolved("cs336sys.analysis") is None  # a package
    assert unresolved("cs336sys.analysis.peaks.PEAK_TFLOPS") is None  # module + attribute
    assert unresolved("cs336sys.TransformerLM") is None  # a lazy attribute, listed in __all__
    assert unresolved("cs336sys.rows.STATUSES") is None
    assert unresolved("cs336sys.metrics").startswith("no module cs336sys.metrics")
    assert unresolved("cs336sys.models") is None
    assert unresolved("cs336sys.attention").startswith("no module cs336sys.attention")  # a word of the docstring is no attribute
    assert unresolved("cs336sys.analysis.metrics.NO_SUCH_NAME_HERE").startswith("no module")
    assert CITED.findall("see `cs336sys.analysis.peaks.PEAK_TFLOPS`. Or src/cs336sys.x") == ["cs336sys.analysis.peaks.PEAK_TFLOPS"]


def test_every_cited_module_exists():
    bad = []
    for path in _cited_in():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file under workflow/ cites nothing
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for name in CITED.findall(line):
                if name not in LABELS and (why := unresolved(name)) is not None:
                    bad.append(f"{path.relative_to(REPO)}:{lineno}: {name}: {why}")
    assert not bad, "cited modules that do not exist:\n  " + "\n  ".join(bad)
