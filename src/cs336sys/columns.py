"""Ground floor: the columns a row may carry, and how the merge folds a timed row's passes into one.

Importable with nothing else: the study registry checks axes against the names, the
measurement computes the pooled statistics declared here, and the merge
(``analysis.passes``) folds every column of a timed row by its :class:`Column` line, so a
column without one fails the merge loudly instead of keeping pass 0's value unseen.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

HEAD_COLUMNS = ["study", "cell_id", "status", "error"]
# Where a cell job's wall time went (``time_job_s``), split into parts that add up to it: start-up
# (the job's process, the warm worker's hand-off, the wait for a GPU, the measuring child's fork and
# CUDA context), the parts the measurement marks (measure.session) and ``other`` (models and inputs
# built, rows assembled, the child's exit). Written by the cell runner on every row of the job.
TIME_PARTS = ("startup", "check", "warmup", "timed", "pairs", "graph", "energy", "profile", "other")
TIME_COLUMNS = ["time_job_s", *(f"time_{p}_s" for p in TIME_PARTS)]
ENV_COLUMNS = [
    *("device", "device_name", "driver_version", "torch_version", "cuda_version", "python_version", "git_commit", "host"),
    *("started_at", "finished_at"),
    *("gpu_index", "gpu_uuid", "gpu_wait_s", "max_sm_clock_mhz", "gpu_state_note", "cpu_model", "cpu_count"),
    "gpu_lock",  # held | held: <which lock only> (<why>) | none: <reason> (pipeline.gpulock)
    *("concurrent_jobs", "concurrent_runs"),  # jobs of other runs busy beside the measurement, and their runs
    "pass_index",  # which pass over the grid measured the row (analysis.passes)
    *TIME_COLUMNS,
]
WHERE_COLUMNS = ["mode", "phase"]  # where inside a cell a row was measured
# Columns every timed row carries (measure.timing): an axis of the same name would be overwritten.
TIMING_COLUMNS = [
    *("median_ms", "ci_low_ms", "ci_high_ms", "mean_ms", "std_ms", "min_ms", "max_ms", "n", "trials", "trial_medians_ms", "samples_ms"),
    *("flops", "warmup_s", "timed_s", "warmup_steps_run", "first_step_s", "kind", "stop_reason"),
    # the GPU's energy per step over the timed blocks (measure.energy): on the whole-step row, empty with the reason elsewhere
    *("energy_j", "energy_ci_low_j", "energy_ci_high_j", "avg_power_w", "energy_samples_j", "energy_source", "energy_note"),
    "energy_read_ms",  # what one read of NVML's counter cost in the measuring process, outside every timed block
]
PASS_COLUMNS = ["passes", "pass_medians_ms"]
# A paired comparison's row (studies' ``Study.pairs``, measure.interleave) is this ``kind``.
PAIR_KIND = "pair"
# A timed row's ``kind``: empty (e2e beside its pair rows, most studies) or "timing" (the profile
# study, beside its kernel rows). Every timed row is folded across passes and gets the interval floor.
TIMED_KINDS = ("", "timing")


def timed_kind(kind):  # a pandas Series of ``kind`` → a boolean Series (no pandas import here)
    """Which rows are timed rows by their ``kind`` (NaN counts as empty)."""
    return kind.isna() | kind.astype(str).isin(TIMED_KINDS)


# The same step replayed as CUDA graphs, beside an eager row: these statistics under this prefix.
GPU_TIME_PREFIX = "gpu_"
GPU_TIME_STATS = (
    "median_ms",
    "ci_low_ms",
    "ci_high_ms",
    "n",
    "trials",
    "trial_medians_ms",
    "samples_ms",
)  # the merge's fold of a cell's passes
RESERVED_COLUMNS = frozenset(HEAD_COLUMNS + ENV_COLUMNS + TIMING_COLUMNS + PASS_COLUMNS + ["phase"])


# --- how the merge folds a timed row's passes ------------------------------------------------
# pooled: recomputed from every pass's samples (median and interval: analysis.passes; a column with a
# `stat` is that function of the pooled step times, or the median of the passes' values where they
# kept no steps, as the centre then is); sum, min, max: of the passes' values; first: the
# same in every pass (a setting, an axis, the environment); last: the latest pass's; join: each
# distinct value once, ";"-joined; derived: written by the fold itself from all passes.
FOLDS = ("pooled", "sum", "min", "max", "first", "last", "join", "derived")


@dataclass(frozen=True)
class Column:
    name: str
    unit: str  # "" for text and counts
    fold: str  # one of FOLDS
    stat: Callable[[Sequence[float]], float] | None = None  # a pooled statistic of the step times (ms)


_first = [
    Column(c, "", "first")
    for c in (
        *("study", "cell_id", "status", "error", "mode", "phase", "kind"),
        *("device", "device_name", "driver_version", "torch_version", "cuda_version", "python_version", "git_commit", "host"),
        *("started_at", "gpu_index", "gpu_uuid", "max_sm_clock_mhz", "gpu_state_note", "cpu_model", "cpu_count", "pass_index"),
        *("flops", "warmup_steps_run", "first_step_s", "gpu_busy_note", "gpu_note", "memory_note", "batch_size", "tokens", "params"),
        *("optimizer", "precision", "causal", "output_bytes", "score_matrix_bytes", "profiled_steps", "device_kind", "model"),
    )
]
COLUMNS: dict[str, Column] = {
    c.name: c
    for c in [
        *_first,
        *(Column(c, "ms", "pooled") for c in ("median_ms", "ci_low_ms", "ci_high_ms", "mean_ms", "std_ms", "min_ms", "max_ms")),
        *(Column(c, "", "pooled") for c in ("n", "trials", "trial_medians_ms", "samples_ms")),
        *(Column(c, "J", "pooled") for c in ("energy_j", "energy_ci_low_j", "energy_ci_high_j", "energy_samples_j")),
        Column("avg_power_w", "W", "pooled"),
        Column("host_launch_us", "us", "pooled"),
        Column("warmup_s", "s", "sum"),
        Column("timed_s", "s", "sum"),
        Column("gpu_wait_s", "s", "sum"),
        *(Column(c, "s", "sum") for c in TIME_COLUMNS),  # a cell's time over all its passes
        Column("gpu_busy_frac", "", "min"),  # the most host-bound pass speaks for the cell
        Column("end_sm_clock_mhz", "MHz", "min"),  # the slowest clock any pass ended at
        Column("energy_read_ms", "ms", "max"),  # the dearest read any pass's process measured
        Column("concurrent_jobs", "", "max"),  # contamination seen in any pass stays visible
        *(Column(c, "B", "max") for c in ("peak_mem_bytes", "mem_before_fwd_bytes", "mem_before_bwd_bytes")),
        Column("finished_at", "", "last"),
        *(Column(c, "", "join") for c in ("stop_reason", "energy_source", "energy_note", "concurrent_runs", "gpu_lock", "plugin_note")),
        *(Column(c, "", "derived") for c in ("passes", "pass_medians_ms")),
    ]
}
# Column families by name: the GPU/host state around the timed blocks (measure.gpu_state), the CUDA-graph
# replay's statistics (GPU_TIME_PREFIX, folded as the eager ones) and every pass's own span and GPU.
PREFIX_FOLDS = (("start_", "first"), ("end_", "last"), ("pass_", "derived"))
SUFFIX_FOLDS = (("throttle_reasons", "join"),)


def fold_of(name: str, axes: Iterable[str] = ()) -> str | None:
    """How the merge folds column ``name`` (an axis of the study: ``first``); None where nothing says."""
    if name in COLUMNS:
        return COLUMNS[name].fold
    if name in axes:
        return "first"
    for suffix, fold in SUFFIX_FOLDS:
        if name.endswith(suffix):
            return fold
    if name.startswith(GPU_TIME_PREFIX) and name[len(GPU_TIME_PREFIX) :] in GPU_TIME_STATS:
        return "pooled"
    for prefix, fold in PREFIX_FOLDS:
        if name.startswith(prefix):
            return fold
    return None


def undeclared(names: Iterable[str], axes: Iterable[str] = ()) -> list[str]:
    """The columns of ``names`` that no :class:`Column` line, axis or family rule folds."""
    axes = set(axes)
    return [n for n in names if fold_of(n, axes) is None]


def stat_columns() -> list[str]:
    """The columns declared with a ``stat``: pooled statistics of the step times."""
    return [c.name for c in COLUMNS.values() if c.stat]


def sample_stats(samples_ms: Sequence[float]) -> dict[str, float]:
    """Every pooled statistic declared with a ``stat``, of these step times."""
    return {c.name: float(c.stat(samples_ms)) for c in COLUMNS.values() if c.stat and len(samples_ms)}
