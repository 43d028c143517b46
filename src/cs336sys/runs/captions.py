"""Each study's figure captions for the HTML report (``snakemake --report``), read from the study's folder.

A study's ``figures.rst`` (beside its ``schema.yaml``, shipped as package data) is a Jinja template of
reStructuredText: given ``name`` (a figure's file name without ``.png``) and ``study``, it renders that
figure's caption, or nothing for a figure it does not describe. workflow/report/figures.rst, the
caption of rule ``plots``' figures, puts the run's lines above it and a general line where the study
has no file or says nothing: adding a study touches no file outside its folder.
"""

from __future__ import annotations

import importlib
from pathlib import Path

FILE = "figures.rst"  # in the study's package, beside __init__.py and schema.yaml


def caption_file(study: str) -> Path:
    """Where study ``study``'s captions live (the file may not exist: the study then has none)."""
    package = importlib.import_module(f"cs336sys.studies.{study}")  # by name: the registry's studies only
    return Path(package.__file__).resolve().with_name(FILE)


def figure_caption(study: str, name: str) -> str:
    """The caption study ``study`` gives its figure ``name``; "" without a file or a caption for that figure."""
    path = caption_file(study)
    if not path.is_file():
        return ""
    import jinja2  # Snakemake's own dependency, which renders the report; only a report needs it

    # as Snakemake renders a caption; StrictUndefined: a template that names anything but `name` and
    # `study` fails the report, naming the file, instead of losing a caption's words in silence
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    try:
        return env.from_string(path.read_text(encoding="utf-8")).render(name=name, study=study).strip()
    except jinja2.TemplateError as exc:
        raise ValueError(f"{path}: figure {name!r}: {exc}") from exc


class FigureCaptions:
    """One study's captions, a parameter of rule ``plots`` that its report caption template calls:
    ``snakemake.params.captions.text(name)``.

    Not a str, so Snakemake leaves it out of the parameters whose change reruns a job: editing a
    caption reruns no plot. Pickled (into the plot script's preamble) it is the study's name: the
    script unpickles its parameters before it puts the checkout's ``src/`` on ``sys.path``, and has no
    use for captions.
    """

    def __init__(self, study: str) -> None:
        self.study = study

    def text(self, name: str) -> str:
        return figure_caption(self.study, name)

    def __repr__(self) -> str:
        return f"FigureCaptions({self.study!r})"

    def __reduce__(self) -> tuple:
        return (str, (self.study,))
