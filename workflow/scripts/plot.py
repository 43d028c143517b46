"""Draw one study's figures from its merged CSV into a directory of PNGs."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

from cs336sys.pipeline.jobs import log_to
from cs336sys.pipeline.merge import load_study
from cs336sys.runs.figures import plot_study

with log_to(snakemake.log[0]):
    study = snakemake.wildcards.study
    written = plot_study(study, load_study(snakemake.input[0], study), Path(snakemake.output[0]), run=snakemake.params.run)
    print("\n".join(str(p) for p in written))
