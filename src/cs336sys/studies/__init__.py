"""Floor 4, studies: one package per study, found here by name.

A study package holds everything that makes the study: its spec in
``__init__.py`` (a :class:`Study`: axes, valid combinations, which settings
reach the measurement, its kind, its cost estimate, the attention core a row
timed, how its older runs named their columns), its config section with every default in
``schema.yaml`` (``pipeline.schema`` assembles the workflow's schema from them),
its measurement in ``measure.py`` (torch, run in the measuring child) and its
figures, findings and facts (what the handout's answers quote) in ``report.py``
(pandas and matplotlib, never torch). Code outside the folder asks the spec,
never a list of study names.
This module is the spec (:class:`Study`, :class:`Pair`) and the registry that finds the packages,
so adding a study is its package (docs/adding-a-study.md); the workflow's rule loop, the config
schema, the CLI, the cell ids, the merge and the report all come from the registry, and
``pipeline.plan`` plans a study's cells and hashes their code from its spec. It lists the packages
without importing them and imports a study's spec only when that study is asked for: a cell's
measuring process loads the registry and its own study's package, and so its rerun hash covers
those and no other study's (adding a study reruns no cell). Importing it does not import torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from cs336sys import catalog
from cs336sys.columns import RESERVED_COLUMNS

Axes = dict[str, Any]


@dataclass(frozen=True)
class Pair:
    """A comparison the handout asks for, timed as interleaved blocks in one process (``measure.interleave.time_arms``).

    A cell whose ``axis`` is ``base`` also times the configuration with ``axis`` = ``other``
    (its *partner*), when that is a cell of the grid too or ``always``; the cell's
    ``kind=pair`` rows hold the paired ratio base time / other time. Slow host drift
    cancels in the ratio, where two cells measured minutes apart carry all of it.
    """

    axis: str
    base: Any
    other: Any
    label: str  # how the report names the comparison, e.g. "fp32 / bf16"
    always: bool = False  # timed even where the partner is not a cell (the CUDA-graph replay of an eager step)
    when: Callable[[Axes], bool] | None = None  # only cells for which this holds time the partner

    @property
    def partner(self) -> str:
        """The ``pair_with`` value of this comparison's rows: ``cuda_graphs=1``, ``precision=bf16``…"""
        return partner_name(self.axis, self.other)


def partner_name(axis: str, value: Any) -> str:
    """How rows name a partner configuration: ``<axis>=<value>``, booleans as 0/1 as in cell ids."""
    return f"{axis}={format_value(value)}"


@dataclass(frozen=True)
class Study:
    name: str
    question: str  # what it answers, with the handout's section
    axes: tuple[str, ...]  # cell-id order; also CSV columns, config grid keys and CLI flags
    # what its cells run: a catalog kind (catalog.KINDS: its `impl` axis offers every implementation of that
    # kind; catalog.LM: TransformerLM steps, so rows get tokens per joule and plugins.model), else free words
    kind: str
    # False: the combination is not a cell; it is asked with the implementations the config offers (a catalog view)
    valid: Callable[[Axes, catalog.Catalog], bool] | None = None
    why_invalid: str = ""  # what makes a combination invalid, for error messages
    canonical: Callable[[Axes], Axes] | None = None  # settle axes that do not apply (mha: m=0 for exact)
    extra_cells: Callable[[Mapping[str, Any]], list[Axes]] | None = None  # cells beyond the product
    cell_keys: tuple[str, ...] = ()  # section keys used by extra_cells, not passed to the measurement
    config_keys: tuple[str, ...] = ()  # top-level config keys passed to the measurement (extra_sizes)
    # module → runs in this cell? (for modules the measurement imports but some cells never run; an attention
    # implementation's module is hashed from the catalog where the cell's `impl` selects it: pipeline.plan.cell_modules)
    optional_modules: Mapping[str, Callable[[Axes], bool]] = field(default_factory=dict)
    artifacts: bool = False  # measurement writes traces/snapshots: gets artifact_dir and cell_id
    cell_table: bool = True  # the report shows the per-cell timing table
    pairs: tuple[Pair, ...] = ()  # comparisons timed inside the base cell (its measure takes ``partners``)
    # the catalog implementations a cell runs without an `impl` axis naming them (mha's exact variants run
    # the eager or SDPA core): their catalog lines are hashed into the cell (cell_entries)
    runs_impls: Callable[[Axes], Iterable[str]] | None = None
    estimate_s: float = 5.0  # seconds of one cell's measuring process, to order jobs before a run has its own (pipeline.priorities)
    # (batch, heads, seq_len, head_dim, causal) of the attention core a row timed, from its columns: the merge counts
    # the row's FLOPs and bytes from it (analysis.roofline)
    attention_shape: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
    renamed: Mapping[str, str] = field(default_factory=dict)  # column in older runs → axis (pipeline.merge.upgrade)
    added_axes: Mapping[str, Any] = field(default_factory=dict)  # axis → its value in older runs, which lack it

    @property
    def measure(self) -> str:
        return f"cs336sys.studies.{self.name}.measure:measure"

    @property
    def report_module(self) -> str:
        return f"cs336sys.studies.{self.name}.report"


def check_axes(spec: Study) -> Study:
    """Refuse an axis named like a column every row carries (``n``, ``median_ms``…): the measurement would overwrite
    it; and an ``impl`` axis without a catalog kind, or a catalog kind without one (its values are the kind's)."""
    clash = sorted(set(spec.axes) & RESERVED_COLUMNS)
    if clash:
        raise RuntimeError(f"study {spec.name!r}: axis names {clash} are row columns already; rename them")
    if ("impl" in spec.axes) != (spec.kind in catalog.KINDS):
        kinds = ", ".join(catalog.KINDS)
        raise RuntimeError(f"study {spec.name!r}: an `impl` axis goes with a kind of the catalog's ({kinds}), and such a kind with one")
    return spec


class Registry(Mapping[str, Study]):
    """Study name → :class:`Study`, for the packages under ``paths``: the names are the folders, listed
    without importing them; a study's package is imported when its entry is first read."""

    def __init__(self, paths: Iterable[str]) -> None:
        self._names = tuple(sorted(i.name for i in pkgutil.iter_modules(list(paths)) if i.ispkg))
        self._specs: dict[str, Study] = {}

    def __getitem__(self, name: str) -> Study:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._specs:
            spec = importlib.import_module(f"{__name__}.{name}").STUDY
            if spec.name != name:
                raise RuntimeError(f"study package {name!r} declares the name {spec.name!r}")
            self._specs[name] = check_axes(spec)
        return self._specs[name]

    def __contains__(self, name: object) -> bool:  # by name: asking imports nothing
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _discover() -> Registry:
    return Registry(__path__)


STUDIES: Mapping[str, Study] = _discover()


def study(name: str) -> Study:
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; known: {', '.join(STUDIES)}")
    return STUDIES[name]


def report_module(name: str):
    """The study's ``report`` module: ``figures(df, run)`` and ``findings(df)`` (pandas, no torch)."""
    return importlib.import_module(study(name).report_module)


def format_value(value: Any) -> Any:
    """Axis values as cell ids and CSV columns hold them: booleans as 0/1."""
    return int(value) if isinstance(value, bool) else value


def cell_id(name: str, axes: Axes) -> str:
    return "_".join(f"{key}={format_value(axes[key])}" for key in study(name).axes)


def pass_dir(k: int) -> str:
    """The folder of pass ``k``'s cell files under a study's cells/ (logs, benchmarks): pass 0 where runs of one pass always kept them."""
    return "" if k == 0 else f"pass{k}/"
