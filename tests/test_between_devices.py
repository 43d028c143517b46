"""Two machines of one kind (runs.between_devices, runs.compare_machines): synthetic runs, known answers; CPU only.

A run is a directory of merged study CSVs. Rows: one (cell, mode, phase) each, a 95% interval of
``rel`` either side, the GPU busy share that sets the row's class, the GPU (``gpu_uuid``) and its kind.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cs336sys.runs import between_devices as bd
from cs336sys.runs import compare as cmp
from cs336sys.runs.compare_machines import HOST_DEPENDENT, machines_of

ROOT = Path(__file__).resolve().parents[1]
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
GPU1, GPU2 = "GPU-11111111-aaaa-bbbb-cccc-000000000001", "GPU-22222222-aaaa-bbbb-cccc-000000000002"
GPU_BOUND, PARTLY, LAUNCH = 0.97, 0.6, 0.3  # busy shares of the three eager classes (threshold 0.9)
FIG3 = {H100: {"classes": {"gpu-bound": {"rel": 0.03}, "launch-bound": {"rel": 0.5}}}}


def row(cell, median, busy, uuid, rel=0.005, device=H100, phase="step", mode="inference", study="mha", **extra):
    return {
        "study": study,
        "cell_id": cell,
        "status": "ok",
        "error": "",
        "kind": "",
        "mode": mode,
        "phase": phase,
        "median_ms": median,
        "ci_low_ms": median * (1 - rel),
        "ci_high_ms": median * (1 + rel),
        "gpu_busy_frac": busy,
        "gpu_uuid": uuid,
        "device_name": device,
        "host": "vm",
        **extra,
    }


def write_run(path: Path, rows) -> Path:
    """One merged CSV per study, as the workflow writes them."""
    path.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    for study, part in df.groupby("study"):
        part.to_csv(path / f"{study}.csv", index=False)
    return path


def grid(uuid, factors, busy, device=H100, prefix="c", **kw):
    """One step row per factor: cell ``<prefix><i>`` at 10 ms × factor."""
    return [row(f"{prefix}{i}", 10.0 * f, busy, uuid, device=device, **kw) for i, f in enumerate(factors)]


# ---------------------------------------------------------------- the figures: estimate


GPU_MOVES = [1.01, 0.98, 1.005, 1.0, 1.0123]  # the largest: 1/0.98 - 1 = 0.020408...
LAUNCH_MOVES = [1.3, 0.9, 1.1, 1.0, 1.05, 1.2]  # the largest: 0.3


def _two_kinds_of_rows(uuid, moved: bool, device=H100):
    f = (lambda xs: xs) if moved else (lambda xs: [1.0] * len(xs))
    return (
        grid(uuid, f(GPU_MOVES), GPU_BOUND, device, prefix="g")
        + grid(uuid, f(LAUNCH_MOVES), LAUNCH, device, prefix="l")
        + grid(uuid, f([1.2] * (bd.MIN_ROWS - 1)), PARTLY, device, prefix="p")  # one row short of a figure
    )


def test_the_figure_is_the_largest_move_between_two_gpus_rounded_up(tmp_path):
    a = write_run(tmp_path / "a", _two_kinds_of_rows(GPU1, moved=False))
    b = write_run(tmp_path / "b", _two_kinds_of_rows(GPU2, moved=True))
    out = bd.estimate([a, b])
    assert list(out) == [H100]
    entry = out[H100]
    assert entry["run_pairs"] == 1 and len(entry["runs"]) == 2
    classes = entry["classes"]
    assert set(classes) == {"gpu-bound", "launch-bound"}  # partly host-bound: MIN_ROWS - 1 rows, no figure
    gpu = classes["gpu-bound"]
    assert gpu["rows"] == len(GPU_MOVES)
    # 1/0.98 - 1 = 0.020408: rounded to the nearest it would be 0.0204 and leave that row outside
    assert gpu["rel"] == 0.0205
    assert 10.0 / (1 + gpu["rel"]) < 9.8 < 10.0 / (1 + 0.0204)
    assert 0 < gpu["q95_rel"] <= gpu["rel"]
    assert classes["launch-bound"]["rel"] == 0.3 and classes["launch-bound"]["rows"] == len(LAUNCH_MOVES)


def test_a_class_gets_its_figure_at_min_rows_and_not_one_below(tmp_path):
    rows = lambda uuid, f, n: grid(uuid, [f] * n, GPU_BOUND)  # noqa: E731
    for n, expected in ((bd.MIN_ROWS - 1, set()), (bd.MIN_ROWS, {"gpu-bound"})):
        a = write_run(tmp_path / f"a{n}", rows(GPU1, 1.0, n))
        b = write_run(tmp_path / f"b{n}", rows(GPU2, 1.02, n))
        assert set(bd.estimate([a, b]).get(H100, {}).get("classes", {})) == expected, n


def test_runs_on_the_same_gpu_or_of_different_kinds_give_no_figure(tmp_path):
    a = write_run(tmp_path / "a", _two_kinds_of_rows(GPU1, moved=False))
    same = write_run(tmp_path / "same", _two_kinds_of_rows(GPU1, moved=True))
    h200 = write_run(tmp_path / "h200", _two_kinds_of_rows(GPU2, moved=True, device=H200))
    assert bd.estimate([a, same]) == {}
    assert bd.estimate([a, h200]) == {}
    assert bd.main([str(a), str(same)]) == 2  # the CLI says there is nothing to write


def test_of_three_runs_only_the_pairs_on_different_gpus_contribute(tmp_path):
    a = write_run(tmp_path / "a", _two_kinds_of_rows(GPU1, moved=False))
    b = write_run(tmp_path / "b", _two_kinds_of_rows(GPU2, moved=True))
    # a's GPU again, b's values (its gpu-bound rows only): (b, c) adds rows that did not move, (a, c) must add none
    c = write_run(tmp_path / "c", grid(GPU1, GPU_MOVES, GPU_BOUND, prefix="g"))
    entry = bd.estimate([a, b, c])[H100]
    assert entry["run_pairs"] == 2  # (a, b) and (b, c)
    assert len(entry["runs"]) == 3
    gpu = entry["classes"]["gpu-bound"]
    assert gpu["rows"] == 2 * len(GPU_MOVES)
    assert gpu["rel"] == 0.0205


def test_the_figures_of_a_pair_of_runs_cover_every_row_of_a_class_with_a_figure(tmp_path):
    """coverage: with the figures estimated from two runs, b's values lie inside a's widened intervals."""
    a = write_run(tmp_path / "a", _two_kinds_of_rows(GPU1, moved=False))
    b = write_run(tmp_path / "b", _two_kinds_of_rows(GPU2, moved=True))
    figures = bd.estimate([a, b])
    cov = bd.coverage(a, b, figures)
    assert list(cov["study"]) == ["mha"] and cov.loc[0, "n"] == len(_two_kinds_of_rows(GPU1, False))
    assert cov.loc[0, "inside"] < 0.5  # the runs' own ±0.5% intervals miss most moves
    # every row with a figure is inside; the partly host-bound ones (no figure) moved 20%: outside
    n_partly = bd.MIN_ROWS - 1
    assert cov.loc[0, "inside_across"] == pytest.approx(1 - n_partly / cov.loc[0, "n"])
    assert cov.loc[0, "max_abs_diff"] == pytest.approx(0.3)


def test_paired_ratios_take_the_class_of_their_step_row(tmp_path):
    def run(uuid, ratios):
        rows = grid(uuid, [1.0] * len(ratios), GPU_BOUND)
        for i, r in enumerate(ratios):
            rows.append(
                {
                    **row(f"c{i}", float("nan"), "", uuid),
                    "kind": "pair",
                    "pair_with": "precision=bf16",
                    "ratio": r,
                    "ratio_ci_low": r * 0.99,
                    "ratio_ci_high": r * 1.01,
                }
            )
        return rows

    a = write_run(tmp_path / "a", run(GPU1, [0.5] * bd.MIN_ROWS))
    b = write_run(tmp_path / "b", run(GPU2, [0.5, 0.51, 0.5, 0.49, 0.5]))
    classes = bd.estimate([a, b])[H100]["classes"]
    assert classes["paired ratio, gpu-bound"]["rows"] == bd.MIN_ROWS
    assert classes["paired ratio, gpu-bound"]["rel"] == pytest.approx(0.0205)  # 0.5 / 0.49 - 1, rounded up
    assert classes["gpu-bound"]["rel"] == 0.0  # the step rows did not move


def test_write_keeps_other_kinds_and_load_reads_it_back(tmp_path):
    path = tmp_path / "figures.yaml"
    bd.write({H200: {"classes": {"gpu-bound": {"rel": 0.05, "q95_rel": 0.01, "rows": 9}}}}, path)
    bd.write({H100: {"classes": {"gpu-bound": {"rel": 0.02, "q95_rel": 0.01, "rows": 9}}}}, path, keep=[H200])
    assert set(bd.load(path)) == {H100, H200}
    assert bd.figure(bd.load(path), H100, "gpu-bound") == 0.02
    assert bd.figure(bd.load(path), H100, "launch-bound") is None
    assert bd.load(tmp_path / "none.yaml") == {}


def test_widen_is_a_floor_around_the_value():
    assert bd.widen(1.0, 0.99, 1.01, 0.03) == pytest.approx((1 / 1.03, 1.03))
    assert bd.widen(1.0, 0.5, 2.0, 0.03) == (0.5, 2.0)  # already wider: unchanged
    assert bd.widen(1.0, 0.99, 1.01, None) == (0.99, 1.01)
    assert bd.widen(float("nan"), 0.99, 1.01, 0.03) == (0.99, 1.01)


def test_the_committed_figures_load_and_hold_for_the_h100():
    figures = bd.load()
    assert H100 in figures
    classes = figures[H100]["classes"]
    assert {"gpu-bound", "launch-bound", "gpu time"} <= set(classes)
    for name, c in classes.items():
        assert c["rel"] >= c["q95_rel"] > 0, name
        assert c["rows"] >= bd.MIN_ROWS, name
    assert classes["gpu-bound"]["rel"] < classes["launch-bound"]["rel"]  # the host sets a launch-bound row's time
    assert len(figures[H100]["runs"]) >= 2


# ---------------------------------------------------------------- compare: one machine or two


def _load(*dirs):
    return tuple(cmp.load_run(d) for d in dirs)


def test_a_gpu_bound_move_inside_the_figure_is_same_on_two_machines_and_slower_on_one(tmp_path):
    # ±0.5% intervals, 2% apart: the runs' own intervals do not overlap (1.02 × 0.995 / 1.005 > 1)
    a = write_run(tmp_path / "a", [row("c", 10.0, GPU_BOUND, GPU1)])
    two = write_run(tmp_path / "two", [row("c", 10.2, GPU_BOUND, GPU2)])
    one = write_run(tmp_path / "one", [row("c", 10.2, GPU_BOUND, GPU1)])
    ra, r2, r1 = _load(a, two, one)

    m2 = machines_of(ra, r2, FIG3)
    assert m2.differ and m2.device_name == H100 and m2.figures["gpu-bound"] == 0.03
    t = cmp.compare_runs(ra, r2, machines=m2).iloc[0]
    assert t["verdict"] == "same" and t["figure"] == 0.03
    assert t["ratio_low"] == pytest.approx(1.02 / 1.03) and t["ratio_high"] == pytest.approx(1.02 * 1.03)

    m1 = machines_of(ra, r1, FIG3)
    assert not m1.differ  # the figures come along, but this row ran on one GPU in both runs
    t = cmp.compare_runs(ra, r1, machines=m1).iloc[0]
    assert t["verdict"] == "slower" and math.isnan(t["figure"])
    assert t["ratio_low"] == pytest.approx(10.2 * 0.995 / 10.05)
    assert len(cmp.regressions(cmp.compare_runs(ra, r1, machines=m1), 1.0)) == 1


def test_a_gpu_bound_move_beyond_the_figure_is_still_slower_on_two_machines(tmp_path):
    a = write_run(tmp_path / "a", [row("c", 10.0, GPU_BOUND, GPU1)])
    b = write_run(tmp_path / "b", [row("c", 10.4, GPU_BOUND, GPU2)])
    ra, rb = _load(a, b)
    table = cmp.compare_runs(ra, rb, machines=machines_of(ra, rb, FIG3))
    assert table.loc[0, "verdict"] == "slower"
    assert table.loc[0, "ratio_low"] == pytest.approx(1.04 / 1.03)  # the figure's bound, below its own interval's
    assert len(cmp.regressions(table, 1.0)) == 1


def test_two_machines_by_default_use_the_committed_figure(tmp_path):
    a = write_run(tmp_path / "a", [row("c", 10.0, GPU_BOUND, GPU1)])
    b = write_run(tmp_path / "b", [row("c", 10.2, GPU_BOUND, GPU2)])
    table = cmp.compare_runs(*_load(a, b))
    assert table.loc[0, "figure"] == bd.figure(bd.load(), H100, "gpu-bound")


def test_different_kinds_of_device_are_two_machines_without_a_figure(tmp_path):
    a = write_run(tmp_path / "a", [row("c", 10.0, GPU_BOUND, GPU1)])
    b = write_run(tmp_path / "b", [row("c", 10.2, GPU_BOUND, GPU2, device=H200)])
    ra, rb = _load(a, b)
    m = machines_of(ra, rb, {**FIG3, H200: FIG3[H100]})
    assert m.differ and not m.figures and " vs " in m.device_name
    assert cmp.compare_runs(ra, rb, machines=m).loc[0, "verdict"] == "slower"  # the comparison is the point


MHA = ROOT / "results" / "h100-b4f53bf" / "mha.csv"


def _mha_runs(tmp_path, scale_row: int, factor: float, uuid_b: str | None = None):
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    shutil.copy(MHA, a / "mha.csv")
    df = pd.read_csv(MHA, keep_default_na=False)
    for col in ("median_ms", "ci_low_ms", "ci_high_ms"):
        df.loc[scale_row, col] = float(df.loc[scale_row, col]) * factor
    if uuid_b is not None:
        df["gpu_uuid"] = uuid_b
    df.to_csv(b / "mha.csv", index=False)
    return _load(a, b)


def test_a_cell_made_5pct_slower_on_one_machine_is_slower_and_nothing_else(tmp_path):
    """Real intervals (the committed H100 run): one GPU-bound row 5% slower, the run otherwise the same."""
    ra, rb = _mha_runs(tmp_path, scale_row=0, factor=1.05)
    assert float(ra["mha"].loc[0, "gpu_busy_frac"]) >= 0.9  # GPU-bound
    table = cmp.compare_runs(ra, rb)
    assert len(table) == len(ra["mha"]) == 25
    assert (table["verdict"] == "slower").sum() == 1
    slow = table[table["verdict"] == "slower"].iloc[0]
    assert (slow["cell_id"], slow["mode"], slow["phase"]) == tuple(ra["mha"].loc[0, ["cell_id", "mode", "phase"]])
    assert slow["ratio"] == pytest.approx(1.05)
    assert (table.drop(index=slow.name)["verdict"] == "same").all()
    assert len(cmp.regressions(table, 1.0)) == 1


def test_the_5pct_slower_cell_stays_slower_across_two_machines_with_a_3pct_figure(tmp_path):
    ra, rb = _mha_runs(tmp_path, scale_row=0, factor=1.05, uuid_b=GPU2)
    m = machines_of(ra, rb, FIG3)
    assert m.differ
    table = cmp.compare_runs(ra, rb, machines=m)
    assert list(table.index[table["verdict"] == "slower"]) == [0]
    assert (table.drop(index=0)["verdict"] == "same").all()


# ---------------------------------------------------------------- host-bound rows on two machines


def _host_runs(tmp_path, factor, probe_b, uuid_b, busy=0.4):
    """One host-bound row (busy 0.4) and one GPU-bound row that did not move; host probe 5 µs in a."""
    a = write_run(
        tmp_path / "a",
        [
            row("host", 10.0, busy, GPU1, rel=0.01, host_launch_us=5.0, gpu_median_ms=3.0),
            row("gpu", 20.0, GPU_BOUND, GPU1, rel=0.01, host_launch_us=5.0, gpu_median_ms=19.0),
        ],
    )
    b = write_run(
        tmp_path / f"b{uuid_b[-1]}",
        [
            row("host", 10.0 * factor, busy, uuid_b, rel=0.01, host_launch_us=probe_b, gpu_median_ms=3.03),
            row("gpu", 20.0, GPU_BOUND, uuid_b, rel=0.01, host_launch_us=probe_b, gpu_median_ms=19.0),
        ],
    )
    return a, b


@pytest.mark.parametrize(("factor", "probe_b", "one_machine"), [(1.4, 7.0, "slower"), (0.6, 3.5, "faster")])
def test_a_host_bound_row_that_moved_on_two_machines_is_host_dependent(tmp_path, factor, probe_b, one_machine):
    a, b = _host_runs(tmp_path, factor, probe_b, GPU2)
    ra, rb = _load(a, b)
    table = cmp.compare_runs(ra, rb, machines=machines_of(ra, rb, FIG3))
    host = table[table["cell_id"] == "host"].iloc[0]
    assert host["verdict"] == HOST_DEPENDENT
    assert host["host_ratio"] == pytest.approx(probe_b / 5.0) and host["gpu_ratio"] == pytest.approx(1.01)
    assert f"{probe_b / 5.0:.2f}×" in host["note"] and "GPU time 1.010×" in host["note"]
    assert table.loc[table["cell_id"] == "gpu", "verdict"].item() == "same"
    assert cmp.regressions(table, 1.0).empty

    # the same two runs on one machine: the row's move is a finding again, and gated
    _, b1 = _host_runs(tmp_path, factor, probe_b, GPU1)
    rb1 = cmp.load_run(b1)
    table = cmp.compare_runs(ra, rb1, machines=machines_of(ra, rb1, FIG3))
    assert table.loc[table["cell_id"] == "host", "verdict"].item() == one_machine
    assert len(cmp.regressions(table, 1.0)) == (one_machine == "slower")


def test_a_host_bound_row_that_did_not_move_is_same_and_a_gpu_bound_one_that_did_is_slower(tmp_path):
    a = write_run(tmp_path / "a", [row("host", 10.0, 0.4, GPU1, rel=0.01), row("gpu", 10.0, GPU_BOUND, GPU1, rel=0.01)])
    b = write_run(tmp_path / "b", [row("host", 10.1, 0.4, GPU2, rel=0.01), row("gpu", 14.0, GPU_BOUND, GPU2, rel=0.01)])
    ra, rb = _load(a, b)
    table = cmp.compare_runs(ra, rb, machines=machines_of(ra, rb, FIG3)).set_index("cell_id")
    assert table.loc["host", "verdict"] == "same"
    assert table.loc["gpu", "verdict"] == "slower"  # host-dependent is for host-bound rows only
    assert list(cmp.regressions(table.reset_index(), 1.0)["cell_id"]) == ["gpu"]


def test_the_lower_busy_share_of_the_two_runs_decides(tmp_path):
    # GPU-bound in a, host-bound in b (a slower host starves the GPU): host-dependent
    a = write_run(tmp_path / "a", [row("c", 10.0, GPU_BOUND, GPU1, rel=0.01)])
    b = write_run(tmp_path / "b", [row("c", 14.0, 0.5, GPU2, rel=0.01)])
    ra, rb = _load(a, b)
    assert cmp.compare_runs(ra, rb, machines=machines_of(ra, rb, FIG3)).loc[0, "verdict"] == HOST_DEPENDENT


def test_a_host_dependent_row_without_a_probe_says_so(tmp_path):
    a = write_run(tmp_path / "a", [row("c", 10.0, 0.4, GPU1, rel=0.01)])
    b = write_run(tmp_path / "b", [row("c", 14.0, 0.4, GPU2, rel=0.01)])
    ra, rb = _load(a, b)
    r = cmp.compare_runs(ra, rb, machines=machines_of(ra, rb, FIG3)).iloc[0]
    assert r["verdict"] == HOST_DEPENDENT and "no host probe" in r["note"] and "GPU time" not in r["note"]


def test_the_report_says_two_machines_and_lists_host_dependent_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(bd, "load", lambda *a, **k: FIG3)
    a, b = _host_runs(tmp_path, 1.4, 7.0, GPU2)
    res = cmp.write_comparison([a, b], ["a", "b"], tmp_path / "two", fail_above=1.0)
    text = res.report_path.read_text()
    assert "**Two machines**" in text and "One machine" not in text
    assert "gpu-bound ±0.03" in text
    assert "a 5, b 7 (1.4× b/a)" in text  # the host probes of both runs
    section = text.split("### Host-dependent", 1)[1].split("###", 1)[0]
    assert "| host " in section and "1.40×" in section and "| gpu " not in section
    assert res.passed  # the host-dependent row is not gated
    saved = pd.read_csv(tmp_path / "two" / "compare.csv", keep_default_na=False)
    assert saved.loc[saved["cell_id"] == "host", "verdict"].item() == HOST_DEPENDENT

    _, b1 = _host_runs(tmp_path, 1.4, 7.0, GPU1)
    res = cmp.write_comparison([a, b1], ["a", "b"], tmp_path / "one", fail_above=1.0)
    text = res.report_path.read_text()
    assert "**One machine**" in text and "Two machines" not in text and "### Host-dependent" not in text
    assert not res.passed


def test_runs_without_gpus_are_told_apart_by_host():
    a = pd.DataFrame({"gpu_uuid": ["", np.nan], "host": ["n1", "n1"]})
    b = pd.DataFrame({"gpu_uuid": [np.nan], "host": ["n2"]})
    assert bd.machines(a) == {"n1"}
    assert bd.different_devices(a, b) and not bd.different_devices(a, a)
    assert not bd.different_devices(a, pd.DataFrame({"host": [""]}))  # one side names none: not known to differ


# ---------------------------------------------------------------- defects found while writing these tests (fixed)


def test_a_run_without_gpu_uuids_on_the_same_host_is_not_two_machines(tmp_path):
    a = write_run(tmp_path / "a", [row("c", 10.0, 0.4, GPU1, rel=0.01)])
    b = write_run(tmp_path / "b", [row("c", 14.0, 0.4, "", rel=0.01)])  # host "vm" as in a; no NVML, no uuid
    ra, rb = _load(a, b)
    assert not machines_of(ra, rb, FIG3).differ
    assert cmp.compare_runs(ra, rb).loc[0, "verdict"] == "slower"


def test_rounding_up_never_returns_less_than_its_input():
    x = math.expm1(math.log(1.0361 + 2e-11))
    assert bd._round(x, up=True) >= x


def test_the_committed_figures_are_what_the_committed_runs_give():
    """between_devices.yaml is recomputed from runs in results/: the figures must follow from them."""
    committed = bd.load()["NVIDIA H100 80GB HBM3"]
    runs = [Path(__file__).resolve().parents[1] / "results" / r.split(" ")[0] for r in committed["runs"]]
    assert all(r.is_dir() for r in runs), f"a run the figures name is not committed: {runs}"
    again = bd.estimate(runs)["NVIDIA H100 80GB HBM3"]
    assert {c: v["rel"] for c, v in again["classes"].items()} == {c: v["rel"] for c, v in committed["classes"].items()}


def _gpu(median, rel=0.005):
    return {"gpu_median_ms": median, "gpu_ci_low_ms": median * (1 - rel), "gpu_ci_high_ms": median * (1 + rel)}


@pytest.mark.parametrize("gpu_b, expected", [(5.5, "slower"), (4.5, "faster"), (5.02, HOST_DEPENDENT)])
def test_a_host_bound_row_whose_gpu_time_moved_is_judged_by_it(tmp_path, gpu_b, expected):
    """On two machines a host-bound row moves with the host; its GPU time does not, unless the GPU's work changed."""
    a = write_run(tmp_path / "a", [row("c", 10.0, 0.4, GPU1, rel=0.01, **_gpu(5.0))])
    b = write_run(tmp_path / "b", [row("c", 14.0, 0.4, GPU2, rel=0.01, **_gpu(gpu_b))])
    ra, rb = _load(a, b)
    figures = {H100: {"classes": {"launch-bound": {"rel": 0.05}, "gpu time": {"rel": 0.01}}}}
    table = cmp.compare_runs(ra, rb, machines=machines_of(ra, rb, figures))
    assert table.loc[0, "verdict"] == expected
    assert len(cmp.regressions(table, 1.0)) == (expected == "slower")


def test_a_study_without_timing_rows_compares_on_two_machines(tmp_path):
    """A study with no timed rows (memory, precision) beside GPU-time columns: an empty table, no error."""
    a = write_run(tmp_path / "a", [row("c", 10.0, 0.4, GPU1, **_gpu(5.0))])
    b = write_run(tmp_path / "b", [row("c", 10.0, 0.4, GPU2, **_gpu(5.0))])
    ra, rb = _load(a, b)
    empty = ra["mha"].iloc[0:0]
    table = cmp.compare_study(empty, rb["mha"].iloc[0:0], machines_of(ra, rb, FIG3), "mha")
    assert table.empty


def test_rows_a_two_gpu_run_measured_on_its_other_gpu_get_the_figure(tmp_path):
    """One run on GPU 1 alone, the other on GPUs 1 and 2 of one host: the runs share a GPU, but a row measured
    on GPU 2 compares two devices (the same 2% move: same there, slower where both rows ran on GPU 1)."""
    a = write_run(tmp_path / "a", [row("on1", 10.0, GPU_BOUND, GPU1), row("on2", 10.0, GPU_BOUND, GPU1)])
    b = write_run(tmp_path / "b", [row("on1", 10.2, GPU_BOUND, GPU1), row("on2", 10.2, GPU_BOUND, GPU2)])
    ra, rb = _load(a, b)
    machines = machines_of(ra, rb, FIG3)
    assert not machines.differ
    table = cmp.compare_runs(ra, rb, machines=machines).set_index("cell_id")
    assert table.loc["on1", "verdict"] == "slower" and math.isnan(table.loc["on1", "figure"])
    assert table.loc["on2", "verdict"] == "same" and table.loc["on2", "figure"] == 0.03


def test_a_row_judged_by_gpu_time_carries_that_ratio_and_is_gated_by_it(tmp_path):
    """Eager 0.7× (the host got faster), GPU time 1.10×: slower, shown and gated as 1.10×, not 0.7×."""
    a = write_run(tmp_path / "a", [row("c", 10.0, 0.4, GPU1, rel=0.01, **_gpu(5.0))])
    b = write_run(tmp_path / "b", [row("c", 7.0, 0.4, GPU2, rel=0.01, **_gpu(5.5))])
    ra, rb = _load(a, b)
    figures = {H100: {"classes": {"launch-bound": {"rel": 0.05}, "gpu time": {"rel": 0.0155}}}}
    table = cmp.compare_runs(ra, rb, machines=machines_of(ra, rb, figures))
    got = table.iloc[0]
    assert got["verdict"] == "slower" and got["ratio"] == pytest.approx(1.1) and got["ratio_low"] > 1
    assert "eager ratio 0.7" in got["note"]
    assert len(cmp.regressions(table, 1.05)) == 1


def test_the_gpu_time_figure_widens_the_ratio_once(tmp_path):
    """A 1.55% figure and ±0.5% intervals: GPU time 2.5% slower is beyond it (widening each side would need ~3.1%)."""
    a = write_run(tmp_path / "a", [row("c", 10.0, 0.4, GPU1, rel=0.01, **_gpu(5.0))])
    b = write_run(tmp_path / "b", [row("c", 14.0, 0.4, GPU2, rel=0.01, **_gpu(5.125))])
    ra, rb = _load(a, b)
    figures = {H100: {"classes": {"launch-bound": {"rel": 0.05}, "gpu time": {"rel": 0.0155}}}}
    assert cmp.compare_runs(ra, rb, machines=machines_of(ra, rb, figures)).iloc[0]["verdict"] == "slower"


def test_a_row_without_a_busy_share_on_two_machines_gets_the_widest_figure(tmp_path):
    """No busy share (a mode measured before an OOM, an old run): its class has no figure; it must not be called
    slower on two machines by a move the widest class (launch-bound, ±50% here) allows."""
    a = write_run(tmp_path / "a", [row("c", 10.0, float("nan"), GPU1)])
    b = write_run(tmp_path / "b", [row("c", 12.0, float("nan"), GPU2)])
    ra, rb = _load(a, b)
    got = cmp.compare_runs(ra, rb, machines=machines_of(ra, rb, FIG3)).iloc[0]
    assert got["verdict"] == "same" and got["figure"] == 0.5


# ---------------------------------------------------------------- one contaminated row, a value that is no number


def test_one_row_that_moved_alone_does_not_set_its_classs_figure(tmp_path, capsys):
    """GPU-bound rows moved at most 2% between two GPUs; one moved 40% (a job beside it, a bad moment): it is
    set aside, named, and the figure stays what the other rows say (0.0205), not 0.4."""
    a = write_run(tmp_path / "a", _two_kinds_of_rows(GPU1, moved=False) + [row("odd", 10.0, GPU_BOUND, GPU1)])
    b = write_run(tmp_path / "b", _two_kinds_of_rows(GPU2, moved=True) + [row("odd", 14.0, GPU_BOUND, GPU2)])
    gpu = bd.estimate([a, b])[H100]["classes"]["gpu-bound"]
    assert gpu["rel"] == 0.0205 and gpu["rows"] == len(GPU_MOVES) and gpu["set_aside"] == 1
    assert "set aside mha|odd|inference|step (a vs b): moved 0.4" in capsys.readouterr().err


def test_a_shared_row_does_not_set_its_classs_figure(tmp_path, capsys):
    """A row measured while another run's job ran beside it (concurrent_jobs > 0: flagged shared) measured that job too."""
    shared = {"concurrent_jobs": 1, "gpu_lock": "held"}
    a = write_run(
        tmp_path / "a",
        [{**r, "concurrent_jobs": 0, "gpu_lock": "held"} for r in _two_kinds_of_rows(GPU1, moved=False)]
        + [row("busy", 10.0, GPU_BOUND, GPU1, concurrent_jobs=0, gpu_lock="held")],
    )
    b = write_run(
        tmp_path / "b",
        [{**r, "concurrent_jobs": 0, "gpu_lock": "held"} for r in _two_kinds_of_rows(GPU2, moved=True)]
        + [row("busy", 10.3, GPU_BOUND, GPU2, **shared)],
    )
    gpu = bd.estimate([a, b])[H100]["classes"]["gpu-bound"]
    assert gpu["rel"] == 0.0205 and gpu["set_aside"] == 1
    err = capsys.readouterr().err
    assert "set aside mha|busy|inference|step (a vs b): shared in either run" in err


@pytest.mark.parametrize(
    "column, value",
    [
        ("median_ms", float("inf")),
        ("median_ms", float("nan")),
        ("median_ms", -10.0),
        ("ci_high_ms", float("inf")),
        ("gpu_median_ms", float("inf")),
    ],
)
def test_write_refuses_a_value_that_is_no_time_naming_the_file_and_row(tmp_path, capsys, monkeypatch, column, value):
    written = []
    monkeypatch.setattr(bd, "write", lambda *args, **kwargs: written.append(args))
    a = write_run(tmp_path / "a", _two_kinds_of_rows(GPU1, moved=False))
    rows = _two_kinds_of_rows(GPU2, moved=True)
    rows[2] = {**rows[2], "gpu_median_ms": 5.0, "gpu_ci_low_ms": 4.9, "gpu_ci_high_ms": 5.1, column: value}
    b = write_run(tmp_path / "b", rows)
    assert bd.main([str(a), str(b), "--write"]) == 2
    err = capsys.readouterr().err
    assert str(b / "mha.csv") in err and "row 3 (g2" in err and "Traceback" not in err
    assert not written
