"""Floor 5, pipeline: the plumbing between a config and a study table — config validation (schema
defaults, named errors), the one cell runner (a child process per cell; ok, oom, error, timeout,
skipped), the code records of the rerun hashes, the per-GPU lock, the helpers of the workflow's job
scripts, and the merge of a study's cell CSVs into one table (``merge``, checked by ``cellcheck``).
"""
