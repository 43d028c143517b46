"""Write report/<run>/report.html (report.md, then answers.md, figures embedded) and one HTML table per merged CSV."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).resolve().parents[1] / "src"))  # scriptdir is workflow/rules/../scripts

from cs336sys.pipeline.jobs import log_to
from cs336sys.runs.html import write_report_page, write_table_pages

with log_to(snakemake.log[0]):
    write_report_page(Path(snakemake.output.page), [Path(snakemake.input.md), Path(snakemake.input.answers)], snakemake.params.run)
    write_table_pages(
        Path(snakemake.output.tables),
        {study: Path(csv) for study, csv in zip(snakemake.params.studies, snakemake.input.csvs)},
        snakemake.params.run,
    )
