"""Compare two runs (report/compare/<a>-vs-<b>/), or gate b against a: fail listing each failure."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

from cs336sys.pipeline.jobs import log_to
from cs336sys.errors import ConfigError
from cs336sys.rows import BadRowsError
from cs336sys.runs.compare import gate, write_comparison

failure = None
with log_to(snakemake.log[0]):
    runs, names = snakemake.params.runs, snakemake.params.names
    try:
        if "fail_above" in snakemake.params.keys():
            failure = gate(runs, names, snakemake.params.fail_above, Path(snakemake.output[0]))
            print(failure or Path(snakemake.output[0]).read_text())
        else:
            print(f"wrote {write_comparison(runs, names, Path(snakemake.output.md).parent).report_path} and report.html")
    except (BadRowsError, ConfigError) as err:  # a run's CSV or config.yaml, named: nothing is compared
        failure = f"refused: {err}"
        print(failure)
if failure:
    sys.exit(failure)  # exit 1, the failures on stderr: the job fails and Snakemake says why
