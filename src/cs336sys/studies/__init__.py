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
This module finds the packages, so adding a study is its package
(docs/adding-a-study.md); the workflow's rule loop, the config schema, the CLI,
the cell ids, the rerun hashes, the merge and the report all come from the
registry. It lists the packages without importing them and imports a study's
spec only when that study is asked for: a cell's measuring process loads the
registry and its own study's package, and so its rerun hash covers those and
no other study's (adding a study reruns no cell). Importing it does not import
torch.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from cs336sys import catalog
from cs336sys.columns import RESERVED_COLUMNS

Axes = dict[str, Any]
# Section keys that shape the grid or the job, not the measurement.
JOB_KEYS = ("grid", "timeout_s", "resources", "passes")  # passes: how many jobs, not what one measures
# Section keys of the timing policy: the cell runner sets them for measure.timing (not measure kwargs).
TIMING_KEYS = ("trials", "min_warmup_s", "min_measure_s", "target_rel", "max_measure_s")


@dataclass(frozen=True)
class Pair:
    """A comparison the handout asks for, timed as interleaved blocks in one process (``measure.timing.time_arms``).

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
    valid: Callable[[Axes], bool] | None = None  # False: the combination is not a cell
    why_invalid: str = ""  # what makes a combination invalid, for error messages
    canonical: Callable[[Axes], Axes] | None = None  # settle axes that do not apply (mha: m=0 for exact)
    extra_cells: Callable[[Mapping[str, Any]], list[Axes]] | None = None  # cells beyond the product
    cell_keys: tuple[str, ...] = ()  # section keys used by extra_cells, not passed to the measurement
    config_keys: tuple[str, ...] = ()  # top-level config keys passed to the measurement (extra_sizes)
    # module → runs in this cell? (for modules the measurement imports but some cells never run; an attention
    # implementation's module is hashed from the catalog where the cell's `impl` selects it: cell_modules)
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


def cells(name: str, section: Mapping[str, Any]) -> list[Axes]:
    """The valid cells of one study section, in grid order, without duplicates."""
    s = study(name)
    grid = section["grid"]
    product = [dict(zip(s.axes, combo)) for combo in itertools.product(*(grid[a] for a in s.axes))]
    product += s.extra_cells(section) if s.extra_cells else []
    out: dict[str, Axes] = {}
    for axes in product:
        axes = {k: format_value(v) for k, v in axes.items()}
        axes = s.canonical(axes) if s.canonical else axes
        if s.valid is None or s.valid(axes):
            out.setdefault(cell_id(name, axes), axes)
    return list(out.values())


def grid(name: str, config: Mapping[str, Any]) -> dict[str, Axes]:
    """Cell id → axes for every valid cell of study ``name`` under ``config``."""
    return {cell_id(name, axes): axes for axes in cells(name, config[name])}


def partners(name: str, axes: Axes, section: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The partner configurations (``{axis: other}``) that cell ``axes`` times beside itself (:class:`Pair`)."""
    s = study(name)
    out = []
    for pair in s.pairs:
        if pair.axis not in axes or axes[pair.axis] != format_value(pair.base) or (pair.when and not pair.when(axes)):
            continue
        partner = {**axes, pair.axis: format_value(pair.other)}
        partner = s.canonical(partner) if s.canonical else partner
        in_grid = pair.other in section["grid"].get(pair.axis, []) and (s.valid is None or s.valid(partner))
        if pair.always or in_grid:
            out.append({pair.axis: pair.other})
    return out


def measure_kwargs(name: str, axes: Axes, config: Mapping[str, Any]) -> dict[str, Any]:
    """The measurement's keyword arguments: the cell's axes, its section's settings, named config keys, its partners."""
    s = study(name)
    section = config[name]
    settings = {k: v for k, v in section.items() if k not in JOB_KEYS + TIMING_KEYS + s.cell_keys}
    extra = {"partners": partners(name, axes, section)} if s.pairs else {}
    return {**settings, **axes, **{k: config.get(k) for k in s.config_keys}, **extra}


def cell_settings(name: str, axes: Axes, config: Mapping[str, Any], artifact_dir: str | None = None) -> dict[str, Any]:
    """What a cell measures (the fields of ``pipeline.cells.Cell`` but its time limit).

    These are the cell job's Snakemake params, so any change reruns the cell; the
    time limit travels as a resource instead, and changing it reruns nothing.
    """
    from cs336sys.plugins import cell_plugins

    s = study(name)
    kwargs = measure_kwargs(name, axes, config)
    if s.artifacts:
        kwargs.update(artifact_dir=artifact_dir, cell_id=cell_id(name, axes))
    # the user's code this cell runs, only where it runs some: other cells' params (and so their reruns) stay as they were
    user = cell_plugins(s.kind, axes, config.get("plugins"))
    return {
        **({"plugins": user} if user else {}),
        "study": name,
        "cell_id": cell_id(name, axes),
        "axes": dict(axes),
        "target": s.measure,
        "kwargs": kwargs,
        "device": config["device"],
        "memory_fraction": config.get("memory_fraction"),
        "timing": {k: config[name][k] for k in TIMING_KEYS if k in config[name]},
        "cache_dir": config.get("cache_dir"),
    }


def cell_modules(name: str, axes: Axes) -> list[str]:
    """The ``cs336sys`` modules a cell's measuring process runs: the runner's and the measurement's imports,
    and the modules of the attention implementations the cell selects."""
    return list(_modules(name, _unused(name, axes), _selected(name, axes)))


def cell_entries(name: str, axes: Axes) -> tuple[str, ...]:
    """The catalog lines a cell runs, by implementation name: its ``impl``, an ``impl`` partner it times
    (:class:`Pair`) and the ``runs_impls`` of its study. Its hash covers these lines of the catalog and
    not the others (``provenance.code_units``): a new implementation's line reruns no cell."""
    s = study(name)
    chosen = set(s.runs_impls(axes)) if s.runs_impls else set()
    if "impl" in s.axes:
        chosen |= {axes["impl"]} | {p.other for p in s.pairs if p.axis == "impl" and axes["impl"] == format_value(p.base)}
    return tuple(sorted(impl for impl in chosen if impl in catalog.names()))


def cell_code_hash(name: str, axes: Axes, plugins: Mapping[str, Any] | None = None) -> str:
    """The hash of the code a cell runs: our modules (of a table module, the lines it reads:
    :func:`cell_entries`), and the user's files where the cell runs a plug-in
    (``plugins``: the config's section; ``cs336sys.plugins.cell_plugins`` picks the cell's part)."""
    ours = _code_hash(name, _unused(name, axes), _selected(name, axes), cell_entries(name, axes))
    files = user_files(name, axes, plugins)
    if not files:
        return ours
    from cs336sys.plugins import files_hash

    return f"{ours}+{files_hash(files, (plugins or {})['path'])}"


def user_files(name: str, axes: Axes, plugins: Mapping[str, Any] | None) -> list:
    """The user's source files (``pathlib.Path``) that the cell imports: its plug-in's module and what that imports from ``plugins.path``."""
    from cs336sys.plugins import cell_files, cell_plugins

    return cell_files(cell_plugins(study(name).kind, axes, plugins))


def _unused(name: str, axes: Axes) -> tuple[str, ...]:
    return tuple(sorted(module for module, used in study(name).optional_modules.items() if not used(axes)))


def _selected(name: str, axes: Axes) -> tuple[str, ...]:
    """The catalog modules of the implementations the cell runs (:func:`cell_entries`).

    Dispatch imports them by name (``models.attention.resolve``), out of the import graph's sight:
    a Triton kernel's module is hashed into the cells that select it and no other.
    """
    return tuple(sorted({catalog.lookup(impl).module for impl in cell_entries(name, axes)}))


@functools.cache  # a study's cells share a few module sets: one parse of the workflow hashes each once
def _modules(name: str, unused: tuple[str, ...], selected: tuple[str, ...]) -> tuple[str, ...]:
    from cs336sys.provenance import RUNNER, module_closure

    return tuple(module_closure([RUNNER, study(name).measure.partition(":")[0], *selected], exclude=unused))


@functools.cache
def _code_hash(name: str, unused: tuple[str, ...], selected: tuple[str, ...], entries: tuple[str, ...]) -> str:
    from cs336sys.provenance import modules_hash

    return modules_hash(_modules(name, unused, selected), entries)
