"""One grid cell: settings from the rule's params → the warm worker (or this process) → one CSV (atomic); then,
every few cells, how long the sweep has left (to the console)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

from cs336sys.pipeline.eta import report
from cs336sys.pipeline.keeprows import RowsKept
from cs336sys.pipeline.warm import run_job  # no torch here: the warm worker has imported it

try:
    run_job(  # the job's log gets the summary
        snakemake.params.cell,
        snakemake.resources.timeout_s,
        snakemake.output[0],
        snakemake.log[0],
        warm=bool(snakemake.resources.warm),
        run=snakemake.config["run"],  # other runs' rows name it (pipeline.hostjobs)
        replace=bool(snakemake.resources.overwrite),
        passes=int(snakemake.resources.passes),  # a resource, not a param: adding a pass reruns only the new one
    )
except RowsKept as exc:  # the earlier ok rows stay: say why, and fail the job
    sys.exit(f"cs336sys: {exc}")
report(snakemake.params.plan)
