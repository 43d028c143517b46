"""Sweep efficiency per GPU, on synthetic rows of a two-GPU sweep with known spans, gaps and tail.

The sweep (seconds after its first cell start):
  GPU 0: a pass 0 [0, 40], b [41, 80], c [90, 120]   busy 109 s, one idle gap of 10 s, ends at 120
  GPU 1: d [0, 50], a pass 1 [52, 97]                 busy 95 s, a 2 s gap (start-up, not idle), ends at 97
Span 120 s; GPU 1 idle for the last 23 s. Cell a's two passes ran on different GPUs: its merged row
names the first pass's GPU only, so pass 1's GPU comes from its own cell file.
"""

import pandas as pd
import pytest

from cs336sys.runs.efficiency import sweep_efficiency, sweep_summary
from cs336sys.runs.gpu_use import per_gpu_line, per_gpu_table
from cs336sys.runs.report import write_report

T0 = pd.Timestamp("2026-01-01T00:00:00+00:00")
UUID = {0: "GPU-aaaa", 1: "GPU-bbbb"}


def _at(seconds: float) -> str:
    return (T0 + pd.Timedelta(seconds=seconds)).isoformat(timespec="milliseconds")


def _row(cell, start, end, gpu, **extra):
    span = {"started_at": _at(start), "finished_at": _at(end), "gpu_index": gpu, "gpu_uuid": UUID[gpu]}
    return {"study": "e2e", "cell_id": cell, "status": "ok", **span, "pass_index": 0, **extra}


def _merged_rows() -> pd.DataFrame:
    """The merged CSV's rows: a's passes folded into one row (passes.py keeps the first pass's GPU)."""
    a = _row("a", 0, 97, 0, pass_started_at=f"{_at(0)};{_at(52)}", pass_finished_at=f"{_at(40)};{_at(97)}")
    return pd.DataFrame([a, _row("b", 41, 80, 0), _row("c", 90, 120, 0), _row("d", 0, 50, 1)])


def _cell_files(tmp_path, study="e2e"):
    """results/<run>/<study>/cells/: each pass's own file with the GPU it ran on."""
    cells = tmp_path / study / "cells"
    (cells / "pass1").mkdir(parents=True)
    pd.DataFrame([_row("a", 0, 40, 0)]).to_csv(cells / "a.csv", index=False)
    pd.DataFrame([_row("a", 52, 97, 1, pass_index=1)]).to_csv(cells / "pass1" / "a.csv", index=False)
    for cell, start, end, gpu in (("b", 41, 80, 0), ("c", 90, 120, 0), ("d", 0, 50, 1)):
        pd.DataFrame([_row(cell, start, end, gpu)]).to_csv(cells / f"{cell}.csv", index=False)
    return {study: cells}


def test_busy_share_gaps_and_tail_per_gpu(tmp_path):
    summary = sweep_summary({"e2e": _merged_rows()}, _cell_files(tmp_path))
    assert summary.span_s == pytest.approx(120.0)
    assert summary.unattributed == 0
    gpu0, gpu1 = summary.gpus
    assert (gpu0.index, gpu0.uuid, gpu0.jobs) == (0, "GPU-aaaa", 3)
    assert (gpu1.index, gpu1.uuid, gpu1.jobs) == (1, "GPU-bbbb", 2)
    assert gpu0.busy_s == pytest.approx(109.0) and gpu1.busy_s == pytest.approx(95.0)
    assert (gpu0.idle_gaps, gpu0.idle_gap_s) == (1, pytest.approx(10.0))
    assert (gpu1.idle_gaps, gpu1.idle_gap_s) == (0, 0.0)  # 2 s: a job's start-up, not idle
    assert gpu0.last_end_s == pytest.approx(120.0) and gpu1.last_end_s == pytest.approx(97.0)
    assert summary.tail_s == pytest.approx(23.0)
    assert per_gpu_line(summary) == "2 GPUs: busy 91% and 79% of the 120 s span; GPU 1 idle for the last 23 s"


def test_per_gpu_table(tmp_path):
    table = per_gpu_table(sweep_summary({"e2e": _merged_rows()}, _cell_files(tmp_path)))
    assert list(table["GPU"]) == [0, 1]
    assert list(table["UUID"]) == ["GPU-aaaa", "GPU-bbbb"]
    assert list(table["cell jobs"]) == [3, 2]
    assert list(table["busy (% of span)"]) == ["91%", "79%"]
    assert list(table["last cell end (s)"]) == ["120.0", "97.0"]
    assert list(table["idle at the end (s)"]) == ["0.0", "23.0"]


def test_the_sweep_table_counts_measuring_time_against_every_gpu(tmp_path):
    table = dict(sweep_efficiency({"e2e": _merged_rows()}, cells=_cell_files(tmp_path)).itertuples(index=False))
    # 204 s of measuring over 2 GPUs × 120 s, not "170% of the span"
    assert table["time inside measuring processes"] == "204.0 s on 2 GPUs (85% of 2 × the span)"
    gap = next(v for k, v in table.items() if k.startswith("gap between"))
    assert gap == "median 2.00 s, max 10.00 s"  # gaps on the same GPU: 1, 10 and 2 s


def test_without_cell_files_a_later_pass_on_an_unrecorded_gpu_is_left_out():
    summary = sweep_summary({"e2e": _merged_rows()})
    assert summary.unattributed == 1
    assert [g.jobs for g in summary.gpus] == [3, 1]
    line = per_gpu_line(summary)
    assert line.startswith("2 GPUs: busy at least 91% and 42% of the 120 s span; 1 cell job left out")
    assert "idle for the last" not in line  # GPU 1 may have run cell a's pass 1 until 97 s


def test_overlapping_spans_on_one_gpu_count_once():
    rows = pd.DataFrame([_row("a", 0, 10, 0), _row("b", 5, 20, 0), _row("c", 0, 20, 1)])
    gpu0, _ = sweep_summary({"e2e": rows}).gpus
    assert gpu0.busy_s == pytest.approx(20.0)


def test_one_gpu_or_none_has_no_per_gpu_section():
    rows = pd.DataFrame([_row("a", 0, 10, 0), _row("b", 12, 20, 0)])
    cpu = rows.drop(columns=["gpu_index", "gpu_uuid"])
    for frame in (rows, cpu):
        summary = sweep_summary({"e2e": frame})
        assert per_gpu_table(summary).empty and per_gpu_line(summary) == ""
    one = dict(sweep_efficiency({"e2e": rows}).itertuples(index=False))
    assert one == dict(sweep_efficiency({"e2e": cpu}).itertuples(index=False))
    assert one["time inside measuring processes"] == "18.0 s (90% of the span)"


def test_a_run_that_went_on_on_another_gpu_is_a_one_gpu_run():
    # a sweep resumed in another machine session: two GPUs, one after the other, never side by side
    rows = pd.DataFrame([_row("a", 0, 10, 0), _row("b", 100, 120, 1)])
    summary = sweep_summary({"e2e": rows})
    assert len(summary.gpus) == 2 and summary.at_once == 1
    assert per_gpu_table(summary).empty and per_gpu_line(summary) == ""
    table = dict(sweep_efficiency({"e2e": rows}).itertuples(index=False))
    assert table["time inside measuring processes"] == "30.0 s (25% of the span)"


def test_a_failed_pass_is_its_own_job():
    # passes.py keeps each pass's failure row with its own pass_index and span; the ok rows fold
    ok = _row("a", 0, 100, 0, pass_started_at=f"{_at(0)};{_at(90)}", pass_finished_at=f"{_at(10)};{_at(100)}")
    failed = [_row("a", 0, 10, 0, status="oom"), _row("a", 90, 100, 0, status="oom", pass_index=1)]
    table = dict(sweep_efficiency({"e2e": pd.DataFrame([ok, *failed])}).itertuples(index=False))
    assert table["time inside measuring processes"] == "20.0 s (20% of the span)"  # not 10 + 100 s


# the report: a study whose report module needs no timing columns (the precision study's rows)
def _write(tmp_path, rows: pd.DataFrame):
    results = tmp_path / "results" / "r"
    results.mkdir(parents=True)
    rows.assign(study="precision", part="accumulation").to_csv(results / "precision.csv", index=False)
    return results / "precision.csv"


def test_the_report_shows_the_per_gpu_section(tmp_path):
    csv = _write(tmp_path, _merged_rows())
    _cell_files(csv.parent, "precision")  # results/r/precision/cells/, beside the merged CSV
    text = write_report(tmp_path / "report.md", "r", ["precision"], [csv], [tmp_path / "figures"]).read_text()
    assert "2 GPUs: busy 91% and 79% of the 120 s span; GPU 1 idle for the last 23 s" in text
    assert "204.0 s on 2 GPUs (85% of 2 × the span)" in text
    assert "GPU-bbbb" in text.split("## Sweep efficiency")[1]


def test_a_one_gpu_report_has_no_per_gpu_section(tmp_path):
    csv = _write(tmp_path, pd.DataFrame([_row("a", 0, 10, 0), _row("b", 12, 20, 0)]))
    text = write_report(tmp_path / "report.md", "r", ["precision"], [csv], [tmp_path / "figures"]).read_text()
    section = text.split("## Sweep efficiency")[1].split("\n## ")[0]
    assert "18.0 s (90% of the span)" in section
    assert "GPU-aaaa" not in section and "idle for the last" not in section


def test_a_merged_row_names_each_pass_gpu_so_no_cell_file_is_needed():
    """passes.py writes pass_gpu_index/pass_gpu_uuid: the committed CSV alone gives each pass its GPU."""
    rows = _merged_rows()
    rows.loc[rows["cell_id"] == "a", ["pass_gpu_index", "pass_gpu_uuid"]] = ["0;1", f"{UUID[0]};{UUID[1]}"]
    summary = sweep_summary({"e2e": rows}, {})
    assert summary.unattributed == 0
    assert [(g.index, g.jobs) for g in summary.gpus] == [(0, 3), (1, 2)]
    assert summary.tail_s == pytest.approx(23.0)


def test_the_merge_keeps_each_pass_gpu():
    from cs336sys.analysis.passes import combine_passes

    times = {"median_ms": 1.0, "ci_low_ms": 0.9, "ci_high_ms": 1.1, "mean_ms": 1.0, "min_ms": 0.9, "max_ms": 1.1, "std_ms": 0.1, "n": 5}
    step = {"study": "e2e", "cell_id": "a", "status": "ok", "mode": "train", "phase": "step", **times}
    rows = pd.DataFrame([{**step, **_row("a", 0, 40, 0)}, {**step, **_row("a", 52, 97, 1, pass_index=1)}])
    merged = combine_passes(rows).iloc[0]
    assert merged["pass_gpu_uuid"] == f"{UUID[0]};{UUID[1]}" and merged["pass_gpu_index"] == "0;1"
