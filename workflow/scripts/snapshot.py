"""Write the run's validated config (every default filled in) to results/<run>/config.yaml."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

from cs336sys.fileio import write_text_atomic
from cs336sys.pipeline.config_file import dump_yaml
from cs336sys.pipeline.jobs import log_to

with log_to(snakemake.log[0]):  # read back by load_yaml (report, answers, the next parse): what it refuses is quoted
    write_text_atomic(snakemake.output[0], dump_yaml(dict(snakemake.params.config)))
