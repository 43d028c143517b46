"""Sweep efficiency from rows and Snakemake benchmark files, on synthetic timestamps with known answers."""

import pandas as pd

from cs336sys.runs.efficiency import sweep_efficiency


def _rows():
    # three cells: 10 s, 10 s, 20 s of measuring, with 2 s and 4 s gaps between them
    starts = ["2026-01-01T00:00:00.000+00:00", "2026-01-01T00:00:12.000+00:00", "2026-01-01T00:00:26.000+00:00"]
    ends = ["2026-01-01T00:00:10.000+00:00", "2026-01-01T00:00:22.000+00:00", "2026-01-01T00:00:46.000+00:00"]
    return pd.DataFrame({"cell_id": ["a", "b", "c"], "started_at": starts, "finished_at": ends, "first_step_s": [1.0, 2.0, 3.0]})


def test_span_measuring_share_gaps_and_first_steps():
    table = dict(sweep_efficiency({"e2e": _rows()}).itertuples(index=False))
    assert table["span: first cell start to last cell end"] == "46.0 s"
    assert table["time inside measuring processes"] == "40.0 s (87% of the span)"
    gap = next(v for k, v in table.items() if k.startswith("gap between"))
    assert gap == "median 3.00 s, max 4.00 s"
    first = next(v for k, v in table.items() if k.startswith("first step"))
    assert first == "median 2.00 s, max 3.00 s, total 6.0 s"
    assert "not measured" in next(v for k, v in table.items() if k.startswith("per-job start-up"))


def test_job_start_up_from_benchmark_files(tmp_path):
    for cell, seconds in (("a", 13.0), ("b", 11.0), ("c", 21.5)):
        (tmp_path / "e2e").mkdir(exist_ok=True)
        (tmp_path / "e2e" / f"{cell}.tsv").write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:{int(seconds):02d}\t100\n")
    table = dict(sweep_efficiency({"e2e": _rows()}, tmp_path).itertuples(index=False))
    startup = next(v for k, v in table.items() if k.startswith("per-job start-up"))
    assert startup == "median 1.50 s, max 3.00 s over 3 jobs"


def test_no_timestamps_no_table():
    assert sweep_efficiency({"e2e": pd.DataFrame({"cell_id": ["a"]})}).empty


def test_warm_up_and_timed_steps_counted_once_per_mode():
    # rows of one mode (its phases) share the mode's warm-up and timed seconds: counted once
    rows = _rows().loc[[0, 0, 0, 1]].reset_index(drop=True)
    rows = rows.assign(
        mode=["inference", "train", "train", "train"],
        phase=["step", "step", "forward", "step"],
        warmup_s=[1.0, 2.0, 2.0, 0.5],
        timed_s=[3.0, 4.0, 4.0, 1.5],
    )
    table = dict(sweep_efficiency({"e2e": rows}).itertuples(index=False))
    assert table[next(k for k in table if k.startswith("of which warm-up"))] == "12.0 s (55% of the span)"  # span 22 s
