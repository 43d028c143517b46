"""Floor 2, measure: the measuring primitives every study uses — the one timing harness
(trials, CUDA events, intervals), the one memory routine, analytic FLOPs, the profiler's kernel
tables, allocator snapshots, the GPU and host state, the environment columns, and the LM
workload (``lm_steps``) that the LM studies time. No knowledge of studies or the workflow.
"""

# Every cell draws its weights and inputs from this seed, so two runs time the same numbers. Not a
# setting: the schema has no key for it, and a measurement takes no argument for it.
SEED = 0
# The run's cache folder (a cell's ``cache_dir``), set by the measuring child for the measurement's own
# caches: the correctness check's verdicts (measure.checkcache) live under it.
CACHE_DIR_ENV = "CS336SYS_CACHE_DIR"
