"""Layer 4, pipeline: the plumbing between a config and a CSV — config validation (schema
defaults, named errors), the one cell runner (a child process per cell; ok, oom, error, timeout,
skipped), the row schema and atomic CSVs, the rerun hashes derived from imports, the per-GPU lock
and the helpers of the workflow's job scripts.
"""
