"""A cell CSV that is deleted (or lost with a killed job) is measured again on the next run, and only it."""

import pytest

from workflow_helpers import DEMO, copy_repo, dry_run, snakemake


@pytest.mark.slow
def test_a_deleted_cell_is_measured_again_with_its_merge_and_report(tmp_path):
    root = copy_repo(tmp_path / "repo")
    extra = ("--config", "studies=[precision]")
    first = snakemake(root, "--configfile", DEMO, *extra, timeout=600)
    assert first.returncode == 0, first.describe()
    cells = sorted((root / "results/cpu-demo/precision/cells").glob("*.csv"))
    assert len(cells) == 2
    cells[0].unlink()
    again = dry_run(root, DEMO, extra=extra)
    assert again.stats.get("precision_cell") == 1, again.describe()  # the deleted one, not the other
    assert {"merge", "plots", "report"} <= set(again.stats)
