"""What a new user sees first: figures told apart at a glance (a colour and marker per series, a dot chart
where every series has one point), small palette PNGs, a CPU report that says its numbers only exercise
the pipeline, and one name for the demo's model size. (The end of a run and `--report` without a GPU:
tests/test_workflow.py.)"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import yaml
from PIL import Image

from cs336sys.analysis import figure_style, plots
from cs336sys.cli import CPU_SIZES, main
from cs336sys.pipeline.finish import finished_message, missing_report_message
from cs336sys.runs.report import CPU_NOTE, on_cpu, write_report
from workflow_helpers import DEMO, REPO


def test_the_first_70_series_differ_in_colour_or_marker_and_the_first_10_in_colour():
    styles = [figure_style.series_style(k) for k in range(70)]
    assert len({(s["color"], s["marker"]) for s in styles}) == 70
    assert len({s["color"] for s in styles[:10]}) == 10


def test_a_series_keeps_its_style_in_every_panel_of_a_figure():
    rows = [dict(group=g, x=x, y=x * (i + 1)) for i, g in enumerate("abcd") for x in (1, 2)]
    df = pd.DataFrame(rows)
    fig, (left, right) = plt.subplots(1, 2)
    plots.draw_lines(left, df, "x", "y", ["group"], legend=False)
    plots.draw_lines(right, df[df["group"].isin(["c", "d"])], "x", "y", ["group"], legend=False)  # c, d only
    colours = [{c.get_label(): (c.lines[0].get_color(), c.lines[0].get_marker()) for c in ax.containers} for ax in (left, right)]
    plt.close(fig)
    assert colours[1]["group=c"] == colours[0]["group=c"] and colours[1]["group=d"] == colours[0]["group=d"]
    assert len(set(colours[0].values())) == 4


def test_series_with_one_point_each_on_a_single_x_become_a_dot_chart():
    points = [("small", "fp32", 10.0), ("small", "bf16", 6.0), ("large", "fp32", 40.0)]
    df = pd.DataFrame([dict(size=s, precision=p, context_length=256, median_ms=m) for s, p, m in points])
    failed = pd.DataFrame([dict(size="large", precision="bf16", context_length=256, status="oom", cell_id="x")])
    fig, ax = plt.subplots()
    plots.draw_lines(ax, df, "context_length", "median_ms", ["size", "precision"], failed=failed, logx=True)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    label = ax.get_xlabel()
    plt.close(fig)
    assert ticks == ["small, bf16", "small, fp32", "large, bf16", "large, fp32"]  # size order, every group named once
    assert label == "size, precision   (context_length = 256)"
    assert ax.get_xscale() == "linear"  # positions, not a log axis of one value


def test_several_x_values_still_draw_lines():
    df = pd.DataFrame([dict(size="small", context_length=c, median_ms=c / 10) for c in (128, 256)])
    fig, ax = plt.subplots()
    plots.draw_lines(ax, df, "context_length", "median_ms", ["size"], logx=True)
    assert ax.get_xscale() == "log" and len(ax.get_lines()[0].get_xdata()) == 2
    plt.close(fig)


def test_figures_are_written_as_palette_pngs(tmp_path):
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in range(16):
        ax.plot([0, 1, 2], [k, k + 1, k * 0.5], label=f"series {k}", **figure_style.series_style(k))
    ax.legend()
    path = plots.save(fig, tmp_path / "figure.png")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.mode == "P"
        assert len(image.getcolors(maxcolors=256) or []) <= 256
    assert not list(tmp_path.glob(".tmp-*"))  # written atomically, nothing left behind


def _one_cell(device: str) -> pd.DataFrame:
    cell = dict(study="precision", cell_id="part=accumulation", status="ok", error="", part="accumulation")
    return pd.DataFrame([dict(cell, device=device, device_name=device)])


@pytest.mark.parametrize(("device", "noted"), [("cpu", True), ("cuda", False)])
def test_a_cpu_run_says_its_numbers_only_exercise_the_pipeline(tmp_path, device, noted):
    csv = tmp_path / "precision.csv"
    _one_cell(device).to_csv(csv, index=False)
    text = write_report(tmp_path / "report.md", "r", ["precision"], [csv], [tmp_path / "figures"]).read_text()
    assert (CPU_NOTE.strip() in text) is noted
    if noted:
        assert text.index("CPU numbers only exercise the pipeline") < text.index("## Environment")


def test_without_rows_the_runs_settings_say_where_it_ran():
    empty = {"precision": _one_cell("cpu").iloc[0:0]}
    assert on_cpu(empty, {"device": "cpu"}) and not on_cpu(empty, {"device": "cuda"}) and not on_cpu(empty, None)
    assert not on_cpu({"precision": _one_cell("cpu"), "e2e": _one_cell("cuda")}, {"device": "cpu"})  # the rows decide


def test_the_cli_and_the_demo_call_their_tiny_model_by_one_name():
    demo = yaml.safe_load((REPO / DEMO).read_text())
    assert CPU_SIZES == {"tiny": demo["extra_sizes"]["tiny"]}


def test_the_old_cpu_size_name_is_refused_naming_tiny(capsys):
    with pytest.raises(SystemExit):
        main(["e2e", "--size", "tiny-cpu", "--device", "cpu"])
    err = capsys.readouterr().err
    assert "tiny-cpu" in err and "tiny" in err.replace("tiny-cpu", "")


def test_the_docs_use_the_demos_name():
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "src" / "cs336sys" / "cli.py"]:
        assert "tiny-cpu" not in Path(page).read_text(), page


# --- the end of a run, and --report without a run (workflow/rules/report.smk) -------------------------


def test_a_finished_run_names_its_report_answers_and_the_html_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert finished_message("r", "report/r/report.md", "report/r/answers.md", [], {}) == ""  # no report: a comparison
    (tmp_path / "report" / "r").mkdir(parents=True)
    (tmp_path / "report" / "r" / "report.md").write_text("# r\n")
    text = finished_message("r", "report/r/report.md", "report/r/answers.md", [Path("config/cpu-demo.yaml")], {"run": "r"})
    assert "report/r/report.md" in text and "report/r/answers.md" in text and "results/r/<study>.csv" in text
    assert "snakemake --report report.html --configfile config/cpu-demo.yaml --config run=r" in text


@pytest.mark.slow
def test_report_without_a_run_points_to_the_demo_only_where_the_gpu_sweep_cannot_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    no_gpu, has_gpu = (lambda: True), (lambda: False)
    assert missing_report_message(["--cores", "1"], "cpu", "report/cpu/report.md", no_gpu) is None  # not a report
    assert missing_report_message(["report/compare/a-vs-b/report.md", "--report", "c.html"], "cpu", "report/cpu/report.md", no_gpu) is None
    demo = missing_report_message(["--report", "report.html"], "cpu", "report/cpu/report.md", no_gpu)
    assert "no GPU" in demo and "snakemake --report report.html --configfile config/cpu-demo.yaml" in demo
    other = missing_report_message(["--report=x.html"], "h100", "report/h100/report.md", has_gpu, [], {"run": "h100"})
    assert "report/h100/report.md does not exist" in other and "`snakemake --config run=h100` first" in other
    (tmp_path / "report" / "h100").mkdir(parents=True)
    (tmp_path / "report" / "h100" / "report.md").write_text("# h100\n")
    assert missing_report_message(["--report", "x.html"], "h100", "report/h100/report.md", has_gpu) is None
