"""Write the run's validated config (every default filled in) to results/<run>/config.yaml."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

import yaml

from cs336sys.fileio import write_text_atomic
from cs336sys.pipeline.jobs import log_to

with log_to(snakemake.log[0]):
    write_text_atomic(snakemake.output[0], yaml.safe_dump(dict(snakemake.params.config), sort_keys=False))
