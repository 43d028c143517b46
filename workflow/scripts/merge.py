"""Merge one study's cell CSVs (all statuses kept) and add the derived metrics."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

from cs336sys.pipeline.jobs import log_to
from cs336sys.pipeline.merge import merge_cells
from cs336sys.rows import write_csv_atomic

with log_to(snakemake.log[0]):
    params = snakemake.params
    merged = merge_cells(
        snakemake.input, snakemake.wildcards.study, params.peak_tflops, params.flags, params.floor_rel, params.peak_gbps
    )
    write_csv_atomic(merged, snakemake.output[0])
