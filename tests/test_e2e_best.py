"""The fastest configuration per size of study ``e2e``: the minimum whole step among ok cells, its runner-up,
"no significant difference" where their intervals overlap, sizes in model order, in the report and the answers."""

from __future__ import annotations

import re

import pandas as pd

from cs336sys.analysis.findings import NOT_SEPARATED, SEPARATED
from cs336sys.handout.answers import build, write_answers
from cs336sys.handout.answers_common import Run
from cs336sys.handout.answers_lm import fastest_configuration
from cs336sys.pipeline.merge import derive
from cs336sys.studies.e2e.report import describe_config, fastest_per_size, findings

H100 = "NVIDIA H100 80GB HBM3"


def _row(
    size="xl",
    ctx=512,
    mode="train",
    precision="bf16",
    impl="sdpa",
    compile=0,
    graphs=0,
    ms=100.0,
    low=None,
    high=None,
    status="ok",
    phase="step",
    device=H100,
):
    """One merged e2e row; the interval defaults to ±1% of the median."""
    low = ms * 0.99 if low is None else low
    high = ms * 1.01 if high is None else high
    failed, nan = status != "ok", float("nan")
    cell = f"size={size}_context_length={ctx}_precision={precision}_impl={impl}_compile={compile}_cuda_graphs={graphs}"
    error = "CUDA out of memory" if failed else ""
    axes = dict(size=size, context_length=ctx, precision=precision, impl=impl, compile=compile, cuda_graphs=graphs)
    interval = dict(median_ms=nan if failed else ms, ci_low_ms=nan if failed else low, ci_high_ms=nan if failed else high)
    rest = dict(mean_ms=ms, std_ms=0.1, n=30, trials=3, flops=4e13, tokens=2048, batch_size=4)
    optimizer = "fused-capturable" if graphs else "course"
    head = dict(study="e2e", cell_id=cell, status=status, error=error)
    return dict(head, **axes, mode=mode, phase=phase, **interval, **rest, optimizer=optimizer, device_name=device)


def _frame(*rows: dict) -> pd.DataFrame:
    return derive(pd.DataFrame(list(rows)), "e2e")


def test_picks_the_lowest_median_whole_step_and_names_the_runner_up():
    df = _frame(
        _row(precision="fp32", ms=300.0),
        _row(precision="bf16", compile=1, graphs=1, ms=120.0),
        _row(precision="bf16", ms=150.0),
        _row(precision="fp32", ms=1.0, phase="forward"),  # a faster part of a step is no step
    )
    best = fastest_per_size(df)
    assert len(best) == 1
    top = best.iloc[0]
    assert (top["precision"], top["impl"], top["compile"], top["cuda_graphs"]) == ("bf16", "sdpa", 1, 1)
    assert top["median_ms"] == 120.0 and top["ci_low_ms"] == 120.0 * 0.99 and top["ci_high_ms"] == 120.0 * 1.01
    assert top["configs_compared"] == 3
    assert top["runner_up"] == "bf16, sdpa, no compile, no CUDA graphs"
    assert (top["runner_up_ms"], top["runner_up_ci_low_ms"], top["runner_up_ci_high_ms"]) == (150.0, 150.0 * 0.99, 150.0 * 1.01)
    assert top["optimizer"] == "fused-capturable"
    # the metrics are the winner's, derived once by the merge's metrics module
    assert top["tflops"] == 4e13 / 0.120 / 1e12
    assert abs(top["mfu_pct"] - 100 * top["tflops"] / 989.4) < 1e-9
    assert top["tokens_per_s"] == 2048 / 0.120


def test_separated_only_where_the_intervals_do_not_overlap():
    df = _frame(
        # xl: the winner's interval reaches into the runner-up's
        _row(size="xl", graphs=1, ms=100.0, low=95.0, high=106.0),
        _row(size="xl", ms=104.0, low=101.0, high=110.0),
        # large: disjoint intervals
        _row(size="large", graphs=1, ms=100.0, low=99.0, high=101.0),
        _row(size="large", ms=104.0, low=102.0, high=106.0),
        # medium: no interval recorded (a run from before the intervals)
        _row(size="medium", graphs=1, ms=100.0, low=float("nan"), high=float("nan")),
        _row(size="medium", ms=104.0, low=float("nan"), high=float("nan")),
    )
    separated = fastest_per_size(df).set_index("size")["separated"]
    assert separated["xl"] == NOT_SEPARATED == "no significant difference"
    assert separated["large"] == SEPARATED == "yes"
    assert separated["medium"] == "no interval recorded"


def test_a_group_with_one_configuration_is_left_out():
    df = _frame(
        _row(size="xl", mode="train", ms=100.0),
        _row(size="xl", mode="train", precision="fp32", ms=200.0),
        _row(size="xl", mode="inference", ms=30.0),  # inference ran in one configuration only
        _row(size="large", mode="train", ms=50.0),  # one configuration at this size
        _row(size="xl", ctx=1024, mode="train", ms=80.0),  # and at this context
    )
    best = fastest_per_size(df)
    assert best[["size", "context_length", "mode"]].values.tolist() == [["xl", 512, "train"]]


def test_failed_cells_are_never_chosen_nor_counted():
    df = _frame(
        _row(size="xl", precision="fp32", status="oom"),
        _row(size="xl", impl="eager", status="error"),
        _row(size="xl", compile=1, ms=90.0),
        _row(size="xl", ms=100.0),
        _row(size="large", status="oom"),  # one ok configuration beside a failed one: nothing to compare
        _row(size="large", precision="fp32", ms=60.0),
    )
    df.loc[df["status"] != "ok", "median_ms"] = 1.0  # even a failed row that kept a time must not win
    best = fastest_per_size(df)
    assert best["size"].tolist() == ["xl"]
    top = best.iloc[0]
    assert (top["precision"], top["impl"], top["compile"], top["median_ms"]) == ("bf16", "sdpa", 1, 90.0)
    assert top["configs_compared"] == 2
    assert top["runner_up"] == "bf16, sdpa, no compile, no CUDA graphs"


def test_sizes_in_model_order_then_context_then_mode():
    rows = []
    for size in ("2.7B", "xl", "small", "large", "medium"):  # neither model nor alphabetical order
        for ctx in (1024, 256):
            for mode in ("train", "inference"):
                rows += [_row(size=size, ctx=ctx, mode=mode, ms=10.0), _row(size=size, ctx=ctx, mode=mode, precision="fp32", ms=20.0)]
    best = fastest_per_size(_frame(*rows))
    assert list(dict.fromkeys(best["size"])) == ["small", "medium", "large", "xl", "2.7B"]
    assert best[best["size"] == "xl"][["context_length", "mode"]].values.tolist() == [
        [256, "inference"],
        [256, "train"],
        [1024, "inference"],
        [1024, "train"],
    ]


def test_no_step_rows_or_no_rows_give_an_empty_table():
    assert fastest_per_size(pd.DataFrame()).empty
    assert fastest_per_size(_frame(_row(phase="forward"), _row(phase="forward", precision="fp32"))).empty


def test_describe_config_in_words():
    assert describe_config(_row(precision="bf16", impl="triton", compile=1, graphs=1)) == "bf16, triton, compile, CUDA graphs"
    assert describe_config(_row(precision="fp32", impl="eager")) == "fp32, eager, no compile, no CUDA graphs"
    assert describe_config({"precision": "fp32", "impl": "sdpa"}) == "fp32, sdpa"  # an old run without the newer axes


def _two_configs() -> pd.DataFrame:
    return _frame(
        _row(size="small", ms=20.0),
        _row(size="small", precision="fp32", ms=60.0),
        _row(size="xl", compile=1, graphs=1, ms=123.0, low=121.0, high=125.0),
        _row(size="xl", ms=140.0, low=124.0, high=150.0),
    )


def test_report_findings_carry_the_table_only_with_two_configurations():
    text = findings(_two_configs())
    assert "**Fastest configuration per size**" in text
    table = text[text.index("**Fastest configuration per size**") :]
    assert "| xl " in table and "| small " in table
    assert table.index("| small ") < table.index("| xl ")
    assert "no significant difference" in table and "| yes " in table
    assert "mfu_note" not in table  # every MFU known here: no empty column of reasons
    one = _frame(_row(size="small", ms=20.0), _row(size="xl", ms=123.0), _row(size="xl", mode="inference", ms=40.0))
    assert "Fastest configuration" not in findings(one)


def test_answer_names_the_winner_of_the_largest_size_with_its_mfu():
    df = _two_configs()
    text = fastest_configuration(Run("synthetic", {"e2e": df}))
    mfu = fastest_per_size(df).set_index("size").loc["xl", "mfu_pct"]
    assert (
        f"the fastest training step for the xl model at context 512: bf16, sdpa, compile, CUDA graphs, fused-capturable AdamW, "
        f"123 ms [121, 125], MFU {mfu:.3g}%; no significant difference from the runner-up "
        f"(bf16, sdpa, no compile, no CUDA graphs, 140 ms [124, 150])."
    ) in text
    assert H100 in text and "report.md#study-e2e" in text
    assert "| small " in text and "separated from" not in text  # the table of both sizes follows
    assert not re.search(r"\bnan\b", text, re.I)


def test_answer_says_why_mfu_is_missing():
    df = _frame(_row(size="xl", ms=100.0, device="Test GPU"), _row(size="xl", precision="fp32", ms=300.0, device="Test GPU"))
    text = fastest_configuration(Run("synthetic", {"e2e": df}))
    assert "MFU unknown (no peak TFLOP/s known for 'Test GPU' at bf16); separated from the runner-up" in text
    assert "| small" not in text and "\n\n|" not in text  # one group: the sentence says it all


def test_answer_without_two_configurations_says_not_measured():
    df = _frame(_row(size="xl", ms=100.0), _row(size="small", ms=20.0))
    text = fastest_configuration(Run("synthetic", {"e2e": df}))
    assert text.startswith("_not measured in this run: enable two or more values of `e2e.grid.precision`")
    assert "each size and context ran in one configuration" in text


def test_the_answers_page_carries_the_question_from_a_merged_csv(tmp_path):
    csv = tmp_path / "e2e.csv"
    _two_configs().to_csv(csv, index=False)  # through the CSV: empty notes come back as NaN
    page = write_answers(tmp_path / "answers.md", "synthetic", {"e2e": csv}).read_text()
    assert page.count("**(fastest configuration)") == 1
    section = page[page.index("## §1.1.3") : page.index("## §1.1.4")]
    assert "the fastest training step for the xl model at context 512: bf16, sdpa, compile, CUDA graphs" in section
    assert not re.search(r"\bnan\b", page, re.I)
    single = build(Run("synthetic", {"e2e": _frame(_row(size="xl", ms=100.0))}))
    answer = single.split("**(fastest configuration)", 1)[1].split("\n\n", 1)[0]
    assert "not measured in this run" in answer
