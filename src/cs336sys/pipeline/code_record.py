"""Which source files a cell was measured with, so that a rerun names the edit that caused it.

A cell's job carries one hash over the modules its measuring process runs
(``pipeline.plan.cell_code_hash``); Snakemake reruns the cell when it changes, but its
reason only says "params have changed". Next to each cell's CSV the job leaves
the hash of every one of those files (``<cell>.csv.code.json``); when the
workflow is parsed again it compares them with the files as they are now and
prints which files changed for how many cells. Not a Snakemake output: a run
measured before these records existed (or a record lost) only loses the
explanation, never a cell. Not imported by the measuring process either, so
editing this module reruns nothing. The record holds the units the hash covers
(``provenance.code_units``): of the catalog, its machinery as ``catalog.py``
and each implementation line the cell runs as ``catalog.py:<impl>``, so a
note names the implementation whose line changed, and a line added for
another implementation (which reruns nothing) is no change.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cs336sys import catalog
from cs336sys.fileio import write_text_atomic
from cs336sys.provenance import PACKAGE_DIR, code_units, content_hash, file_hash, module_file

SUFFIX = ".code.json"


def record_path(output: str | Path) -> Path:
    """Where the record of the cell CSV ``output`` lives: beside it, with :data:`SUFFIX` appended."""
    return Path(f"{output}{SUFFIX}")


def file_hashes(modules: Iterable[str], entries: Iterable[str] | None = None) -> dict[str, str]:
    """``{package-relative path: content hash}`` of the source files of ``modules``; with ``entries`` (a
    cell's catalog lines), ``{unit: content hash}`` of the units its code hash covers (module docstring)."""
    if entries is not None:
        return {name: content_hash(text.encode()) for name, text in sorted(code_units(modules, entries).items())}
    files = {module_file(m) for m in modules} - {None}
    return {path.relative_to(PACKAGE_DIR).as_posix(): file_hash(path) for path in sorted(files)}  # type: ignore[union-attr]


def user_file_hashes(files: Iterable[Path], root: str) -> dict[str, str]:
    """``{<root>/<path under root>: content hash}`` of a plug-in's files (cs336sys.plugins), named as the config's ``plugins.path``;
    a file its import loaded from elsewhere by its real path ("" where it is gone)."""
    base = Path(root).resolve()

    def name(f: Path) -> str:
        real = Path(f).resolve()
        return f"{root.rstrip('/')}/{real.relative_to(base).as_posix()}" if real.is_relative_to(base) else real.as_posix()

    return {name(f): file_hash(f) if Path(f).is_file() else "" for f in files}


def cell_file_hashes(
    study: str,
    axes: Mapping[str, Any],
    plugins: Mapping[str, Any] | None,
    offered: catalog.Catalog,
    cache: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[str, str]] | None = None,
) -> dict[str, str]:
    """The files a cell runs, hashed: our modules (``pipeline.plan.cell_modules``) and its plug-in's files, if any
    (``plugins``: the config's section, ``offered`` the implementations it offers). ``cache``: one parse of the
    workflow hashes each module set once (not a long-lived process: files change)."""
    from cs336sys.pipeline import plan

    modules = tuple(plan.cell_modules(study, dict(axes), offered))
    entries = plan.cell_entries(study, dict(axes), offered)
    ours = cache.get((modules, entries)) if cache is not None else None
    if ours is None:
        ours = file_hashes(modules, entries)
        if cache is not None:
            cache[(modules, entries)] = ours
    user = plan.user_files(study, dict(axes), plugins)
    return {**ours, **user_file_hashes(user, plugins["path"])} if user and plugins else ours


def write_record(output: str | Path, files: Mapping[str, str]) -> Path:
    return write_text_atomic(record_path(output), json.dumps(dict(sorted(files.items())), indent=0) + "\n")


def read_record(output: str | Path) -> dict[str, str] | None:
    """The record beside ``output``; None where there is none or it does not parse (never raises)."""
    try:
        record = json.loads(record_path(output).read_text())
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in record.items()} if isinstance(record, dict) else None


def changed_files(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Files edited, added or no longer run since ``recorded``, sorted."""
    return sorted(f for f in set(recorded) | set(current) if recorded.get(f) != current.get(f))


def rerun_notes(cells: Iterable[tuple[str, str | Path, Mapping[str, str]]]) -> list[str]:
    """One line per set of changed files: which files, and how many cell jobs of which studies they rerun.

    ``cells`` holds (study, cell CSV, the cell's files as they are now) for every cell job of the
    run; a cell without a record (not measured yet, or measured before records existed) says nothing.
    """
    jobs: dict[tuple[str, ...], Counter[str]] = defaultdict(Counter)
    for study, output, current in cells:
        recorded = read_record(output)
        if recorded is None:
            continue
        changed = tuple(changed_files(recorded, current))
        if changed:
            jobs[changed][study] += 1
    return [
        f"code changed since these cells were measured: {', '.join(files)} → "
        + ", ".join(f"{n} {study} cell job{'s' * (n > 1)}" for study, n in sorted(counts.items()))
        + " rerun"
        for files, counts in sorted(jobs.items())
    ]


def invocation_triggers(argv: Sequence[str]) -> list[object] | None:
    """The rerun triggers of the ``snakemake`` command line ``argv``, its profiles applied as Snakemake applies them.

    Snakemake tells a workflow its triggers only after the parse; this reads them with its own parser. None where
    ``argv`` is no snakemake command line (a caller of Snakemake's API) or the parser has changed.
    """
    from snakemake.cli import parse_args

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # it says which profile again
            _, args = parse_args(list(argv))
    except BaseException:  # noqa: BLE001 - argparse's SystemExit, or whatever a newer Snakemake raises: no warning, no harm
        return None
    triggers = getattr(args, "rerun_triggers", None)
    return list(triggers) if triggers is not None else None


def rerun_trigger_warning(triggers: Iterable[object] | None) -> str | None:
    """Why ``--rerun-triggers`` without ``params`` (Snakemake's names or its RerunTrigger members) is not safe; None where
    it is, or where the triggers are unknown (None).

    Each cell's params carry the hash of the code it runs and its settings: without that trigger an edit
    to the measured code, or a changed setting, reruns nothing, and the run's rows stay those of the old code.
    """
    names = {str(getattr(t, "name", t)).lower().replace("_", "-") for t in (("params",) if triggers is None else triggers)}
    if "params" in names:
        return None
    return (
        f"warning: --rerun-triggers {' '.join(sorted(names))} is without `params`, which carries each cell's code hash and "
        "settings: editing the code a cell measures, or a setting, reruns nothing, and its rows stay those of the old code. "
        f"Add it: --rerun-triggers {' '.join([*sorted(names), 'params'])} (profiles/default: mtime params input software-env)"
    )


def record_cell(cell: Any, out: Path) -> None:
    """Leave the hashes of the files ``cell`` (a ``pipeline.cell.Cell``) ran beside its CSV ``out``; never fails the job."""
    from cs336sys.plugins import offered

    try:
        write_record(out, cell_file_hashes(cell.study, cell.axes, cell.plugins, offered(cell.plugins)))
    except Exception as err:  # noqa: BLE001 - the record only explains a later rerun; the cell is measured
        print(f"no code record for {out.name}: {err}")
