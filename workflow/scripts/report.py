"""Write report/<run>/report.md from the merged CSVs and figure directories."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

from cs336sys.pipeline.config import load_yaml
from cs336sys.pipeline.jobs import log_to
from cs336sys.runs.report import write_report

with log_to(snakemake.log[0]):
    write_report(
        out=Path(snakemake.output[0]),
        run=snakemake.params.run,
        studies=snakemake.params.studies,
        csvs=[Path(p) for p in snakemake.input.csvs],
        figure_dirs=[Path(p) for p in snakemake.input.figures],
        config=load_yaml(snakemake.input.snapshot),
        benchmarks=Path(snakemake.params.benchmarks),
    )
