"""Write report/<run>/answers.md: each handout question answered from the run's merged CSVs."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

from cs336sys.handout.answers import write_answers
from cs336sys.pipeline.config import load_yaml
from cs336sys.pipeline.jobs import log_to

with log_to(snakemake.log[0]):
    write_answers(
        out=Path(snakemake.output[0]),
        run=snakemake.params.run,
        csvs=dict(zip(snakemake.params.studies, (Path(p) for p in snakemake.input.csvs))),
        config=load_yaml(snakemake.input.snapshot),
    )
