"""One grid cell: settings from the rule's params → the library's cell runner → one CSV (atomic)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

from cs336sys.fileio import remove_stale_temps
from cs336sys.pipeline.cells import Cell, run_cell
from cs336sys.pipeline.jobs import log_to
from cs336sys.pipeline.rows import rows_to_frame, write_csv_atomic

with log_to(snakemake.log[0]):
    out = Path(snakemake.output[0])
    for stale in remove_stale_temps(out.parent, out.name):  # a half-written CSV of a killed earlier job
        print(f"removed {stale} (its writer is gone)")
    cell = Cell(**snakemake.params.cell, timeout_s=snakemake.resources.timeout_s)
    rows = run_cell(cell, start_method="fork")  # this job has run no torch computation
    write_csv_atomic(rows_to_frame(rows, cell.axes), out)
    print(f"{cell.cell_id}: " + ", ".join(sorted({r["status"] for r in rows})))
