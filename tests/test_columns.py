"""Every column of a timed row folds across passes by a declared rule (cs336sys.columns); an undeclared one fails the merge."""

from __future__ import annotations

import pandas as pd
import pytest

from cs336sys import columns as C
from cs336sys.analysis.passes import UndeclaredColumnError, combine_passes

SAME = {"study": "e2e", "cell_id": "c", "status": "ok", "mode": "train", "phase": "step", "n": 3, "size": "small"}
# the columns whose two passes differ: (pass 0's value, pass 1's value)
DIFFER = {
    "median_ms": (10.0, 12.0),
    "samples_ms": ("9;10;11", "11;12;13"),
    "stop_reason": ("budget", "target"),
    "peak_mem_bytes": (100, 120),
    "gpu_wait_s": (1.0, 2.0),
    "end_sm_clock_mhz": (1980, 1700),
    "finished_at": ("t0", "t1"),
}


def _passes(**extra) -> pd.DataFrame:
    rows = [{**SAME, **{c: v[k] for c, v in DIFFER.items()}, "pass_index": k} for k in (0, 1)]
    return pd.DataFrame([{**r, **extra} for r in rows])


def test_each_column_folds_by_its_rule():
    row = combine_passes(_passes(), axes=["size"]).iloc[0]
    assert row["median_ms"] == 11.0 and row["passes"] == 2  # pooled over both passes' steps
    assert row["stop_reason"] == "budget;target"  # join
    assert row["peak_mem_bytes"] == 120  # max
    assert row["gpu_wait_s"] == 3.0  # sum
    assert row["end_sm_clock_mhz"] == 1700  # min
    assert row["finished_at"] == "t1"  # last
    assert row["size"] == "small"  # an axis: the same in every pass


def test_a_column_without_a_rule_fails_the_merge_naming_it():
    with pytest.raises(UndeclaredColumnError, match=r"no_rule_ms.*cs336sys\.columns\.COLUMNS"):
        combine_passes(_passes(no_rule_ms=12.0), axes=["size"])
    with pytest.raises(UndeclaredColumnError, match="size"):  # an axis only folds when the study declares it
        combine_passes(_passes())


def test_a_declared_statistic_is_computed_per_pass_and_pooled(monkeypatch):
    monkeypatch.setitem(C.COLUMNS, "max2_ms", C.Column("max2_ms", "ms", "pooled", stat=lambda x: max(x) * 2))
    assert C.sample_stats([1.0, 3.0])["max2_ms"] == 6.0  # beside any statistic COLUMNS declares
    row = combine_passes(_passes(max2_ms=0.0), axes=["size"]).iloc[0]
    assert row["max2_ms"] == 26.0  # of the pooled steps 9…13, not pass 0's value


def test_a_declared_statistic_of_passes_that_kept_no_steps_is_their_median_not_pass_0s(monkeypatch):
    """Passes of over 500 steps (do_bench's) keep no step times: the statistic cannot be pooled, so it folds
    as the centre does there (the median of the per-pass values), never as pass 0's value alone."""
    monkeypatch.setitem(C.COLUMNS, "max2_ms", C.Column("max2_ms", "ms", "pooled", stat=lambda x: max(x) * 2))
    third = _passes().iloc[[1]].assign(pass_index=2, median_ms=14.0)
    passes = pd.concat([_passes(), third], ignore_index=True).assign(
        samples_ms="", max2_ms=[22.0, 26.0, 30.0], mean_ms=12.0, std_ms=1.0, min_ms=9.0, max_ms=15.0
    )
    row = combine_passes(passes, axes=["size"]).iloc[0]
    assert row["median_ms"] == 12.0 and row["max2_ms"] == 26.0


def test_family_rules_cover_state_and_gpu_time_columns():
    assert C.fold_of("start_power_w") == "first" and C.fold_of("end_power_w") == "last"
    assert C.fold_of("start_throttle_reasons") == "join" and C.fold_of("gpu_median_ms") == "pooled"
    assert C.fold_of("pass_gpu_uuid") == "derived" and C.fold_of("no_such_column") is None
    assert all(c.fold in C.FOLDS for c in C.COLUMNS.values())
