"""Figure captions of the HTML report: workflow/report/figures.rst above each study's own figures.rst.

The report's caption of a figure is workflow/report/figures.rst rendered as Snakemake renders it (Jinja,
then reStructuredText), with ``snakemake.params.captions`` the study's captions (rule plots); here it is
rendered the same way without a workflow run. `snakemake --report` itself is test_html_report's.
"""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import jinja2
import pytest

from cs336sys import studies as S
from cs336sys.pipeline.merge import load_study
from cs336sys.runs import captions
from cs336sys.runs.captions import FigureCaptions
from workflow_helpers import REPO

TEMPLATE = REPO / "workflow" / "report" / "figures.rst"
FIXTURE = REPO / "tests" / "fixtures" / "cpu-demo"
GENERAL = "Times are medians (with their 95 % interval) or means, as the axis says."


def caption(study: str, name: str) -> str:
    """Figure ``name`` of ``study``'s caption in the report, before reStructuredText."""
    snakemake = SimpleNamespace(
        wildcards=SimpleNamespace(study=study, name=name), config={"run": "t"}, params=SimpleNamespace(captions=FigureCaptions(study))
    )
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # Snakemake's (snakemake.report)
    return env.from_string(TEMPLATE.read_text(encoding="utf-8")).render(snakemake=snakemake)


def _drawn() -> list[tuple[str, str]]:
    """(study, figure name) of every figure each study's report draws from its CPU-demo fixture."""
    out = []
    for csv in sorted(FIXTURE.glob("*.csv")):
        df = load_study(csv, csv.stem)
        out += [(csv.stem, name) for name, _ in S.report_module(csv.stem).figures(df, "t")]
    return out


@pytest.mark.parametrize("study, name", _drawn())
def test_each_figure_the_fixtures_draw_has_a_caption_of_its_kind(study, name):
    text = caption(study, name)
    assert f"Figure ``{name}`` of study **{study}**" in text
    assert "Look at" in text and GENERAL not in text, f"{study}/{name}: no caption of its kind\n{text}"


def test_the_studies_captions_live_in_their_folders_and_each_renders():
    files = {name: captions.caption_file(name) for name in S.STUDIES}
    assert all(path.parent.name == name and path.parent.parent == REPO / "src/cs336sys/studies" for name, path in files.items())
    with_file = [name for name, path in files.items() if path.is_file()]
    assert with_file, "no study has a figures.rst"
    for name in with_file:
        assert captions.figure_caption(name, "no-such-figure") == ""  # a figure it does not describe


def test_a_study_with_no_caption_file_gets_the_general_line(monkeypatch, tmp_path):
    monkeypatch.setattr(captions, "caption_file", lambda study: tmp_path / "figures.rst")
    text = caption("toy", "time")
    assert "Figure ``time`` of study **toy**" in text and GENERAL in text


def test_a_studys_own_file_captions_its_figures_and_no_cell_ran_stays_general(monkeypatch, tmp_path):
    (tmp_path / "figures.rst").write_text('{% if name.startswith("time_") %}**Time** of {{ study }}. Look at: the slope.\n{% endif %}\n')
    monkeypatch.setattr(captions, "caption_file", lambda study: tmp_path / "figures.rst")
    assert "**Time** of toy. Look at: the slope." in caption("toy", "time_fp32")
    assert GENERAL in caption("toy", "other")
    assert "No cell of this study ran" in caption("toy", "no_cell_ran")


def test_a_caption_naming_what_it_is_not_given_fails_naming_its_file(monkeypatch, tmp_path):
    (tmp_path / "figures.rst").write_text("{{ snakemake.config.run }}\n")
    monkeypatch.setattr(captions, "caption_file", lambda study: tmp_path / "figures.rst")
    with pytest.raises(ValueError, match=r"figures\.rst: figure 'x'.*snakemake"):
        captions.figure_caption("toy", "x")


def test_the_plot_script_unpickles_the_captions_as_the_study_name():
    """The script's preamble unpickles its params before its sys.path holds the checkout's src/: no cs336sys there."""
    data = pickle.dumps(FigureCaptions("e2e"), protocol=4)  # as Snakemake's script preamble
    assert b"cs336sys" not in data and pickle.loads(data) == "e2e"


def test_the_rule_passes_the_study_captions_that_the_template_calls():
    rules = (REPO / "workflow" / "rules" / "report.smk").read_text()
    assert "captions=lambda wildcards: FigureCaptions(wildcards.study)" in rules
    assert "snakemake.params.captions.text(name)" in TEMPLATE.read_text()
