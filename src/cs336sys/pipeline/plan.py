"""A run's cells, planned once from a validated config: each one's grid point, its typed :class:`Cell`, its code hash.

Everything here is asked with the implementations the config offers (``offered``: the catalog view
that ``pipeline.config.validate_config`` answers, its plug-ins included), never the process's catalog.
A cell's job carries its :class:`Cell` as params (``Cell.params``: any change reruns it) and the hash
of the code its measuring process runs (:func:`cell_code_hash`): the runner's and the measurement's
modules, the catalog lines it selects and the user's files where it runs a plug-in, so editing attention
code reruns attention cells and the e2e cells that use it, and nothing else. The workflow (common.smk),
the CLI and the code records plan through here; a study's own spec and the registry stay in
``cs336sys.studies``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cs336sys import catalog, plugins
from cs336sys.measure.session import Policy
from cs336sys.pipeline.cell import Cell
from cs336sys.studies import Axes, cell_id, format_value, study

# Section keys that shape the grid or the job, not the measurement (passes: how many jobs, not what one measures).
JOB_KEYS = ("grid", "timeout_s", "resources", "passes")
# Section keys of the timing policy: the runner gives them to the measurement as its Session's Policy.
POLICY_KEYS = tuple(f.name for f in dataclasses.fields(Policy) if f.name not in JOB_KEYS)  # passes: the Cell's, a job's


def cells(name: str, section: Mapping[str, Any], offered: catalog.Catalog) -> list[Axes]:
    """The valid cells of one study section, in grid order, without duplicates."""
    s = study(name)
    grid_ = section["grid"]
    product = [dict(zip(s.axes, combo)) for combo in itertools.product(*(grid_[a] for a in s.axes))]
    product += s.extra_cells(section) if s.extra_cells else []
    out: dict[str, Axes] = {}
    for axes in product:
        axes = {k: format_value(v) for k, v in axes.items()}
        axes = s.canonical(axes) if s.canonical else axes
        if s.valid is None or s.valid(axes, offered):
            out.setdefault(cell_id(name, axes), axes)
    return list(out.values())


def grid(name: str, config: Mapping[str, Any], offered: catalog.Catalog) -> dict[str, Axes]:
    """Cell id → axes for every valid cell of study ``name`` under ``config``."""
    return {cell_id(name, axes): axes for axes in cells(name, config[name], offered)}


def partners(name: str, axes: Axes, section: Mapping[str, Any], offered: catalog.Catalog) -> list[dict[str, Any]]:
    """The partner configurations (``{axis: other}``) that cell ``axes`` times beside itself (``studies.Pair``)."""
    s = study(name)
    out = []
    for pair in s.pairs:
        if pair.axis not in axes or axes[pair.axis] != format_value(pair.base) or (pair.when and not pair.when(axes)):
            continue
        partner = {**axes, pair.axis: format_value(pair.other)}
        partner = s.canonical(partner) if s.canonical else partner
        in_grid = pair.other in section["grid"].get(pair.axis, []) and (s.valid is None or s.valid(partner, offered))
        if pair.always or in_grid:
            out.append({pair.axis: pair.other})
    return out


def plan_cell(
    name: str, axes: Axes, config: Mapping[str, Any], offered: catalog.Catalog, pass_index: int = 0, artifact_dir: str | None = None
) -> Cell:
    """Cell ``axes`` of study ``name`` as ``config`` measures it: its settings (the section's but its job keys,
    timing policy and extra-cell keys; the config keys it names; its partners; where it writes artifacts), its
    policy, device and plug-ins. Its time limit is the job's: a resource, so changing it reruns nothing."""
    s = study(name)
    section = config[name]
    settings = {k: v for k, v in section.items() if k not in JOB_KEYS + POLICY_KEYS + s.cell_keys}
    settings.update({k: config.get(k) for k in s.config_keys})
    if s.pairs:
        settings["partners"] = partners(name, axes, section, offered)
    if s.artifacts:
        settings["artifact_dir"] = artifact_dir
    return Cell(
        study=name,
        cell_id=cell_id(name, axes),
        axes=dict(axes),
        target=s.measure,
        settings=settings,
        device=config["device"],
        policy=Policy(**{k: section[k] for k in POLICY_KEYS if k in section}),
        # the user's code this cell runs, only where it runs some: other cells' params (and so their reruns) stay as they were
        plugins=plugins.cell_plugins(s.kind, axes, config.get("plugins")),
        memory_fraction=config.get("memory_fraction"),
        cache_dir=config.get("cache_dir"),
        pass_index=pass_index,
        timeout_s=float(section["timeout_s"]),
        passes=int(section.get("passes", 1)),
    )


def cell_entries(name: str, axes: Axes, offered: catalog.Catalog) -> tuple[str, ...]:
    """The catalog lines a cell runs, by implementation name: its ``impl``, an ``impl`` partner it times
    (``studies.Pair``) and the ``runs_impls`` of its study. Its hash covers these lines of the catalog and
    not the others (``provenance.code_units``): a new implementation's line reruns no cell."""
    s = study(name)
    chosen = set(s.runs_impls(axes)) if s.runs_impls else set()
    if "impl" in s.axes:
        chosen |= {axes["impl"]} | {p.other for p in s.pairs if p.axis == "impl" and axes["impl"] == format_value(p.base)}
    return tuple(sorted(impl for impl in chosen if impl in offered.names()))


def cell_modules(name: str, axes: Axes, offered: catalog.Catalog) -> list[str]:
    """The ``cs336sys`` modules a cell's measuring process runs: the runner's and the measurement's imports,
    and the modules of the attention implementations the cell selects."""
    return list(_modules(name, _unused(name, axes), _selected(name, axes, offered)))


def cell_code_hash(name: str, axes: Axes, section: Mapping[str, Any] | None, offered: catalog.Catalog) -> str:
    """The hash of the code a cell runs: our modules (of a table module, the lines it reads:
    :func:`cell_entries`), and the user's files where the cell runs a plug-in (``section``: the config's
    ``plugins``; ``plugins.cell_plugins`` picks the cell's part)."""
    ours = _code_hash(name, _unused(name, axes), _selected(name, axes, offered), cell_entries(name, axes, offered))
    files = user_files(name, axes, section)
    if not files:
        return ours
    return f"{ours}+{plugins.files_hash(files, (section or {})['path'])}"


def user_files(name: str, axes: Axes, section: Mapping[str, Any] | None) -> list[Path]:
    """The user's source files that the cell imports: its plug-in's module and what that imports from ``plugins.path``."""
    return plugins.cell_files(plugins.cell_plugins(study(name).kind, axes, section))


def _unused(name: str, axes: Axes) -> tuple[str, ...]:
    return tuple(sorted(module for module, used in study(name).optional_modules.items() if not used(axes)))


def _selected(name: str, axes: Axes, offered: catalog.Catalog) -> tuple[str, ...]:
    """The catalog modules of the implementations the cell runs (:func:`cell_entries`).

    Dispatch imports them by name (``models.attention.resolve``), out of the import graph's sight:
    a Triton kernel's module is hashed into the cells that select it and no other.
    """
    return tuple(sorted({offered.lookup(impl).module for impl in cell_entries(name, axes, offered)}))


@functools.cache  # a study's cells share a few module sets: one parse of the workflow hashes each once
def _modules(name: str, unused: tuple[str, ...], selected: tuple[str, ...]) -> tuple[str, ...]:
    from cs336sys.provenance import RUNNER, module_closure

    return tuple(module_closure([RUNNER, study(name).measure.partition(":")[0], *selected], exclude=unused))


@functools.cache
def _code_hash(name: str, unused: tuple[str, ...], selected: tuple[str, ...], entries: tuple[str, ...]) -> str:
    from cs336sys.provenance import modules_hash

    return modules_hash(_modules(name, unused, selected), entries)
