"""Answers, report, repeatability, handout page and CLI table from runs that time pairs and GPU time.

A synthetic merged e2e run in the new format (pair rows, ``gpu_*`` columns) holds one case of
each kind of answer: a finding (the interval excludes 1), a tight "no difference within ±x%",
a budget-limited "unbounded" with its reason, and a pair that could not share a process
(``pair_note``) whose answer falls back to the two cells' intervals and says why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from cs336sys.analysis.findings import describe_ratio, percent_up
from cs336sys.handout.answers import write_answers
from cs336sys.handout.answers_common import measured
from cs336sys.handout.page import main as handout_main
from cs336sys.handout.page import rebase
from cs336sys.measure.stats import Interval
from cs336sys.pipeline.merge import derive
from cs336sys.runs import repeatability
from cs336sys.runs.report import cell_table
from cs336sys.studies import cell_id, study
from cs336sys.studies.e2e.paired import comparison, gpu_table, pair_labels, pair_spec, pair_table
from cs336sys.studies.e2e.report import findings

DEVICE = "NVIDIA H100 80GB HBM3"
OOM_NOTE = "the two arms do not fit in one process (out of memory): compare the two cells' own intervals"
# eager ms, GPU ms per training-step phase (PHASE_NAMES), per (size, precision); GPU busy share of the eager step
PHASE_NAMES = ("forward", "backward", "optimizer_step", "step")
PHASES = {
    ("small", "fp32"): ((25.0, 42.5, 15.0, 82.0), (8.6, 17.3, 3.67, 29.8), 0.26),
    ("small", "bf16"): ((26.5, 59.4, 13.1, 103.0), (3.0, 5.2, 3.67, 12.0), 0.085),
    ("large", "fp32"): ((61.3, 115.0, 30.0, 206.0), (40.0, 80.0, 20.0, 140.0), 0.6),
    ("large", "bf16"): ((60.0, 116.0, 30.0, 206.0), (13.0, 24.5, 20.0, 57.5), 0.3),
    ("xl", "fp32"): ((100.0, 200.0, 50.0, 350.0), (90.0, 180.0, 45.0, 315.0), 0.95),
    ("xl", "bf16"): ((50.0, 100.0, 50.0, 200.0), (30.0, 60.0, 45.0, 135.0), 0.95),
}
# fp32 / bf16 paired ratio of the training step per size: a finding, a tight no-difference, an out-of-memory pair
BF16_PAIRS = {
    "small": dict(ratio=0.893, ratio_ci_low=0.842, ratio_ci_high=0.946, pairs=15, stop_reason="target"),
    "large": dict(ratio=1.004, ratio_ci_low=0.981, ratio_ci_high=1.029, pairs=20, stop_reason="target"),
    "xl": dict(pair_note=OOM_NOTE),
}
# eager / CUDA-graph paired ratio of the training step: small's ran out of its budget with a wide interval
GRAPH_PAIRS = {
    ("small", "fp32"): dict(ratio=1.05, ratio_ci_low=0.7, ratio_ci_high=1.4, pairs=3, stop_reason="target;budget"),
    ("small", "bf16"): dict(ratio=8.38, ratio_ci_low=7.98, ratio_ci_high=8.81, pairs=20, stop_reason="target"),
}


def _axes(size: str, precision: str) -> dict:
    return dict(size=size, context_length=256, precision=precision, impl="sdpa", compile=0, cuda_graphs=0)


def _base(size: str, precision: str, **more) -> dict:
    axes = _axes(size, precision)
    return dict(study="e2e", cell_id=cell_id("e2e", axes), status="ok", error="", **axes, device_name=DEVICE, device="cuda", **more)


def new_format_e2e() -> pd.DataFrame:
    """A merged e2e table as the new measurement writes it: timed rows with GPU time, and pair rows."""
    rows = []
    for (size, precision), (eager, gpu, busy) in PHASES.items():
        for phase, ms, g in zip(PHASE_NAMES, eager, gpu):
            wide = 0.10 if busy < 0.5 else 0.01  # launch-bound rows: wide eager intervals, as on the H100
            times = dict(median_ms=ms, ci_low_ms=ms * (1 - wide), ci_high_ms=ms * (1 + wide), mean_ms=ms, std_ms=ms * 0.1, n=40)
            passes = dict(trials=16 if busy < 0.5 else 9, passes=2, pass_medians_ms=f"{ms:.4f};{ms * 1.04:.4f}")
            stop = "budget" if size == "large" else "target"
            graph = dict(gpu_median_ms=g, gpu_ci_low_ms=g * 0.995, gpu_ci_high_ms=g * 1.005, gpu_n=30, gpu_trials=15, gpu_note="")
            more = dict(stop_reason=stop, gpu_busy_frac=busy, batch_size=4, **graph, kind=float("nan"))
            rows.append(_base(size, precision, mode="train", phase=phase, **times, **passes, **more))
        graph = GRAPH_PAIRS.get((size, precision), dict(ratio=3.0, ratio_ci_low=2.9, ratio_ci_high=3.1, pairs=12, stop_reason="target"))
        rows.append(_base(size, precision, kind="pair", mode="train", phase="step", pair_with="cuda_graphs=1", pair_note="", **graph))
        if precision == "fp32":
            pair = {"pair_note": "", **BF16_PAIRS[size]}
            rows.append(_base(size, precision, kind="pair", mode="train", phase="step", pair_with="precision=bf16", **pair))
    return derive(pd.DataFrame(rows), "e2e")


def _answers(page: str) -> dict[str, str]:
    found = {}
    for paragraph in page.split("\n\n"):
        m = re.match(r"\*\*(.+?)\*\* (.+)", paragraph, re.S)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def _answer(page: str, start: str) -> str:
    return next(a for q, a in _answers(page).items() if q.startswith(start))


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("paired")
    new_format_e2e().to_csv(tmp / "e2e.csv", index=False)  # through a CSV, as the page reads a run
    return write_answers(tmp / "answers.md", "synthetic", {"e2e": tmp / "e2e.csv"}).read_text()


# ---------------------------------------------------------------- wording


def test_ratio_words_a_finding_a_tight_no_difference_and_an_unbounded_one_with_its_reason():
    assert describe_ratio(Interval(1.32, 1.25, 1.40, 0, 1), faster="bf16 is faster") == "1.32× [1.25, 1.4]: bf16 is faster"
    assert describe_ratio(Interval(0.9, 0.85, 0.95, 0, 1), faster="x", slower="bf16 is slower") == "0.9× [0.85, 0.95]: bf16 is slower"
    assert describe_ratio(Interval(1.004, 0.981, 1.029, 0, 1)) == "no difference within ±2.9% (1× [0.981, 1.03])"
    wide = Interval(1.05, 0.7, 1.4, 0, 1)
    assert (
        describe_ratio(wide, budget=True, why="launch-bound")
        == "unbounded (1.05× [0.7, 1.4]: ±40% when the time budget ran out; launch-bound)"
    )
    assert describe_ratio(wide) == "no significant difference (1.05× [0.7, 1.4])"  # no budget: never "unbounded"
    assert percent_up(0.0312) == "3.2%" and percent_up(0.1) == "10%"


def test_pairs_come_from_the_study_spec():
    assert pair_spec("precision").partner == "precision=bf16"
    labels = pair_labels()
    assert set(labels) == {p.partner for p in study("e2e").pairs}
    assert labels["cuda_graphs=1"] == pair_spec("cuda_graphs").label


# ---------------------------------------------------------------- answers.md


def test_timing_gives_gpu_time_beside_eager_and_the_backward_forward_ratio_from_gpu_time(page):
    a = _answer(page, "(a) How long do a forward and a backward pass take")
    assert "small: forward 25 ms [22.5, 27.5] (GPU 8.6 ms [8.557, 8.643]), backward 42.5 ms [38.25, 46.75] (GPU 17.3 ms" in a
    assert "Backward / forward, GPU time: small 2.01× [1.99, 2.03]" in a  # 17.3 / 8.6, tight
    assert "eager wall time: small 1.7× [1.39, 2.08]" in a
    assert "launch-bound: the GPU was busy 26% of the step" in a  # why small's eager interval is wide, in words
    assert "Host overhead (eager − GPU" in a and "small 16.4 ms of the forward and 25.2 ms of the backward" in a
    assert "unbounded" not in a and "nan" not in a.lower()


def test_variability_says_how_many_trials_each_row_took_and_why_it_stopped(page):
    b = _answer(page, "(b) With warm-up, how variable")
    assert "by why sampling stopped" in b
    assert "large forward 9 and large backward 9 (the time budget, `max_measure_s`, ran out first)" in b
    assert "(the interval met its target, `target_rel`)" in b
    assert "The same phases replayed as CUDA graphs (GPU time) have intervals within ±0.5% of their median" in b


def test_bf16_from_pairs_finding_tight_and_out_of_memory_fallback_and_gpu_time(page):
    c = _answer(page, "(c) How much faster is a bf16")
    assert "paired in one process" not in c  # xl's pair did not run: not every ratio is paired
    assert "small at context 256: 0.893× [0.842, 0.946]: bf16 is slower" in c
    assert "large at context 256: no difference within ±2.9% (1× [0.981, 1.03])" in c
    # xl: the two arms did not fit together; the two cells' intervals answer, saying why
    assert "xl at context 256: 1.75× [1.72, 1.79]: bf16 is faster (from the two cells' intervals; not paired: " + OOM_NOTE + ")" in c
    assert (
        "GPU time (the same steps replayed as CUDA graphs; the two cells' intervals): small at context 256: 2.48× [2.46, 2.51]: bf16 is faster"
        in c
    )
    assert "interval unbounded" not in c


def test_cuda_graph_answer_from_pair_rows_and_unbounded_only_where_the_budget_ran_out(page):
    g = _answer(page, "(CUDA graphs)")
    assert "paired in one process" in g
    assert "train step of small (context 256, bf16, sdpa): 8.38× [7.98, 8.81]: the graph is faster" in g
    assert "train step of small (context 256, fp32, sdpa): unbounded (1.05× [0.7, 1.4]: ±40% when the time budget ran out)" in g
    assert g.count("unbounded") == 1
    assert "the graph replays the same optimizer" in g


def test_the_page_never_says_a_bare_unbounded(page):
    for paragraph in _answers(page).values():
        for m in re.finditer(r"unbounded", paragraph):
            assert "time budget ran out" in paragraph[m.start() : m.start() + 120], paragraph


# ---------------------------------------------------------------- report.md


def test_report_has_the_pair_table_and_eager_vs_gpu_time_with_host_overhead():
    df = new_format_e2e()
    pairs = pair_table(df)
    assert {"comparison", "size", "context_length", "mode", "phase", "ratio [95% interval]", "pairs", "stop_reason"} <= set(pairs)
    assert set(pairs["comparison"]) == {pair_spec("cuda_graphs").label, pair_spec("precision").label}
    oom = pairs[pairs["size"] == "xl"]
    assert (oom[oom["comparison"] == pair_spec("precision").label]["ratio [95% interval]"] == f"not paired: {OOM_NOTE}").all()
    gpu = gpu_table(df).set_index(["size", "precision", "phase"])
    assert gpu.loc[("small", "fp32", "forward"), "host overhead ms"] == pytest.approx(25.0 - 8.6)
    assert gpu.loc[("small", "fp32", "forward"), "GPU ms [95%]"] == "8.6 [8.557, 8.643]"
    text = findings(df)
    assert "**Paired comparisons**" in text and "**Eager time and GPU time per phase**" in text
    assert "**Backward / forward ratio, GPU time**" in text


def test_report_cell_table_keeps_the_timings_of_a_run_with_pair_rows():
    table = cell_table(new_format_e2e(), list(study("e2e").axes))
    assert "train step ms" in table.columns  # pair rows (kind=pair) must not hide the timed rows (kind empty)
    assert table["train step ms"].notna().all()


def test_comparison_prefers_the_pair_and_falls_back_to_two_cells_with_the_note():
    comp = comparison(new_format_e2e(), "precision").set_index("size")
    assert comp.loc["small", "source"] == "paired" and comp.loc["small", "ratio"] == 0.893
    assert comp.loc["xl", "source"] == "two cells" and comp.loc["xl", "pair_note"] == OOM_NOTE
    assert comp.loc["xl", "ratio"] == pytest.approx(350 / 200)


def test_old_format_runs_still_compare_two_cells():
    df = new_format_e2e()
    old = df[df["kind"].isna()].drop(columns=[c for c in df if c.startswith("gpu_") or c in ("kind", "pair_with")])
    comp = comparison(old, "precision")
    assert set(comp["source"]) == {"two cells"} and len(comp) == 3
    assert gpu_table(old).empty


# ---------------------------------------------------------------- repeatability


def _run(tmp: Path, name: str, scale: float, ratio_shift: float) -> Path:
    df = new_format_e2e()
    timed = df["kind"].isna()
    df.loc[timed, "median_ms"] *= scale  # eager moves with the host
    df.loc[timed, "gpu_median_ms"] *= 1.001  # GPU time barely
    df.loc[~timed, "ratio"] *= ratio_shift
    out = tmp / name
    out.mkdir()
    df.to_csv(out / "e2e.csv", index=False)
    return out


def test_repeatability_reports_eager_gpu_time_and_paired_ratios_separately(tmp_path):
    a, b = _run(tmp_path, "a", 1.0, 1.0), _run(tmp_path, "b", 1.2, 1.01)
    measures = repeatability.pair_measures(a, b)
    summary = repeatability.summarize_measures(measures).set_index("measure")
    assert summary.loc["eager", "second_inside_first_95pct"] == 0  # moved 20%, out of every interval
    assert summary.loc["GPU time", "second_inside_first_95pct"] == 1
    assert summary.loc["paired ratio", "n"] == 8 and (summary["study"] == "e2e").all()
    out = repeatability.write({"a → b": repeatability.pair_runs(a, b)}, tmp_path / "rep", "GPU", {"a → b": measures})
    text = out.read_text()
    assert "## Per study: eager rows, GPU time and paired ratios" in text
    assert (tmp_path / "rep" / "measures.csv").is_file()


@pytest.mark.parametrize("name", ["h100-repeatability", "h100-repeatability-passes"])
def test_the_committed_repeatability_reports_rebuild_from_their_pairs(tmp_path, name):
    """The runs these reports pair are in git history only (docs/results.md); every pair is in pairs.csv."""
    committed = Path(__file__).resolve().parents[1] / "report" / name
    device = committed.joinpath("report.md").read_text().splitlines()[0].removeprefix("# Repeatability on ")
    every = pd.read_csv(committed / "pairs.csv")
    pairs = {pair: part.drop(columns="pair").reset_index(drop=True) for pair, part in every.groupby("pair", sort=False)}
    assert len(pairs) >= 1 and not every.empty
    repeatability.write(pairs, tmp_path, device)
    assert (tmp_path / "report.md").read_text() == (committed / "report.md").read_text()
    assert not (tmp_path / "measures.csv").exists()


# ---------------------------------------------------------------- one page over runs


def _precision_run(path: Path) -> Path:
    path.mkdir(parents=True)
    cell = dict(study="precision", cell_id="part=accumulation", status="ok", error="", part="accumulation", kind="accumulation")
    sums = (("float32", "float32", 10.0001, 1e-4), ("float16", "float16", 9.95, 0.05))
    rows = [dict(cell, accumulator=a, summand=s, result=r, abs_error=e, device_name="cpu (x86_64)") for a, s, r, e in sums]
    pd.DataFrame(rows).to_csv(path / "precision.csv", index=False)
    return path


def test_handout_page_answers_each_question_from_the_first_run_that_measured_it(tmp_path):
    e2e = tmp_path / "results" / "gpu-e2e"
    e2e.mkdir(parents=True)
    new_format_e2e().to_csv(e2e / "e2e.csv", index=False)
    prec = _precision_run(tmp_path / "results" / "cpu-precision")
    out = tmp_path / "report" / "handout" / "all.md"
    assert handout_main(["--out", str(out), "--reports", str(tmp_path / "report"), str(e2e), str(prec)]) == 0
    page = out.read_text()
    answers = _answers(page)
    fwd = next(a for q, a in answers.items() if q.startswith("(a) How long do a forward"))
    assert fwd.startswith("_(from run [`gpu-e2e`](../gpu-e2e/report.md))_ On " + DEVICE)
    assert "[report](../gpu-e2e/report.md#study-e2e)" in fwd  # the answer's own links point into its run's report
    acc = next(a for q, a in answers.items() if q.startswith("(a) What do the accumulation loops give"))
    assert acc.startswith("_(from run [`cpu-precision`](../cpu-precision/report.md))_ The handout's accumulation loop")
    mem = next(a for q, a in answers.items() if q.startswith("(a) How does memory evolve"))
    assert mem.startswith("_(in none of the runs; run `gpu-e2e` says)_ _not measured in this run")
    assert page.count("**(a) How long do a forward") == 1
    assert "| `gpu-e2e` | " + DEVICE + " | [report](../gpu-e2e/report.md)" in page


def test_rebase_moves_relative_links_only():
    text = "x ([report](report.md#study-e2e), [figure](figures/e2e/a.png), [web](https://a.b/c), [here](#q))"
    assert (
        rebase(text, "../r") == "x ([report](../r/report.md#study-e2e), [figure](../r/figures/e2e/a.png), [web](https://a.b/c), [here](#q))"
    )
    assert not measured("_not measured in this run: enable x in the config._") and measured("On a GPU …")


# ---------------------------------------------------------------- the CLI's table


def test_cli_table_shows_interval_flags_gpu_time_and_pairs():
    from cs336sys.cli import result_tables

    df = new_format_e2e()
    cell = df[df["cell_id"] == df["cell_id"].iloc[0]]
    text = result_tables(cell, "e2e")
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header[:4] == ["status", "mode", "phase", "median_ms"] and {"95% interval", "flags", "GPU ms [95%]"} <= set(header)
    forward = next(line for line in text.splitlines() if "| forward " in line)
    assert "[22.5, 27.5]" in forward and "noisy, host-bound" in forward and "8.6 [8.557, 8.643]" in forward
    assert "Paired ratios" in text and pair_spec("cuda_graphs").label in text
    assert "noisy: the 95% interval is wider than ±5% of the median" in text
    assert "one trial" not in text  # 16 trials
    one = cell.assign(trials=1)  # a CLI cell of one trial: its interval cannot see the host's drift between blocks
    assert "noisy, host-bound, one trial" in result_tables(one, "e2e") and "one trial: the interval sees" in result_tables(one, "e2e")
