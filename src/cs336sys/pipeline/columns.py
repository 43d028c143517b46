"""The names of the columns every row may carry, importable with nothing else (the registry checks axes against them)."""

HEAD_COLUMNS = ["study", "cell_id", "status", "error"]
ENV_COLUMNS = [
    "device", "device_name", "driver_version", "torch_version", "cuda_version",
    "python_version", "git_commit", "host", "started_at", "finished_at",
    "gpu_index", "gpu_uuid", "gpu_wait_s", "max_sm_clock_mhz", "gpu_state_note", "cpu_model", "cpu_count",
    "gpu_lock",  # held | none: <reason> (pipeline.gpulock)
    "concurrent_jobs", "concurrent_runs",  # jobs of other runs busy beside the measurement, and their runs
    "pass_index",  # which pass over the grid measured the row (analysis.passes)
]  # fmt: skip
WHERE_COLUMNS = ["mode", "phase"]  # where inside a cell a row was measured
# Columns every timed row carries (measure.timing): an axis of the same name would be overwritten.
TIMING_COLUMNS = [
    "median_ms", "ci_low_ms", "ci_high_ms", "mean_ms", "std_ms", "min_ms", "max_ms", "n", "trials",
    "trial_medians_ms", "samples_ms", "flops", "warmup_s", "timed_s", "warmup_steps_run", "first_step_s", "kind",
    "stop_reason",
    # the GPU's energy per step over the timed blocks (measure.energy): on the whole-step row, empty with the reason elsewhere
    "energy_j", "energy_ci_low_j", "energy_ci_high_j", "avg_power_w", "energy_samples_j", "energy_source", "energy_note",
]  # fmt: skip
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
