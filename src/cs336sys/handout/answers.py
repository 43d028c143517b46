"""report/<run>/answers.md: each benchmarking question of CS336 assignment 2, answered from the run's data.

Every number on the page is computed from the run's merged CSVs (with its 95% interval
where the rows carry one) by the studies' own report functions; a question whose study
or grid values the run lacks gets "not measured in this run" and the config key to set.

    python -m cs336sys.handout.answers results/h200 --out report/h200/answers.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cs336sys.fileio import write_text_atomic
from cs336sys.handout.answers_attention import answers_121, answers_mha
from cs336sys.handout.answers_common import Run, device
from cs336sys.handout.answers_flash import answers_13
from cs336sys.handout.answers_lm import answers_113
from cs336sys.handout.answers_precision import answers_115
from cs336sys.handout.answers_profile import answers_114, answers_116
from cs336sys.pipeline.config import load_yaml
from cs336sys.pipeline.merge import load_study
from cs336sys.studies import STUDIES

# (handout section, the function that answers its questions from a run)
SECTIONS: list[tuple[str, Callable[[Run], list[tuple[str, str]]]]] = [
    ("§1.1.3 End-to-end benchmarking", answers_113),
    ("§1.1.4 Profiling (nsys_profile)", answers_114),
    ("§1.1.5 Mixed precision", answers_115),
    ("§1.1.6 Memory profiling", answers_116),
    ("§1.2.1 Attention: time and memory vs sequence length", answers_121),
    ("§1.3 torch.compile, CUDA graphs and FlashAttention-2", answers_13),
    ("ReLU vs softmax, exact vs Performer attention (study `mha`)", answers_mha),
]

NOT_ANSWERED = "not answered: computing this section failed (a bug in cs336sys.handout.answers)"
ANSWER_RULES = """\
medians in ms with their 95% interval [low, high] where the run recorded one; the GPU time of a phase (the same
phase replayed as a CUDA graph) beside its eager wall time where the run measured it; ratios paired in one
process (interleaved blocks) where the run timed the two configurations together, else from the two cells'
intervals by interval arithmetic. A ratio whose interval excludes 1 is a finding; one that holds 1 reads
*no difference within ±x%* where it is tight, *unbounded* only where sampling ran out of its time budget,
otherwise *no significant difference*, with what widened it"""
INTRO = (
    """\
Each question of the handout's benchmarking sections, paraphrased in bold, then its answer computed from
this run's merged CSVs (`results/{run}/*.csv`) by `cs336sys.handout.answers`. Device: {device}. The tables,
the definitions and the figures are in [report.md](report.md).

How to read the numbers: """
    + ANSWER_RULES
    + "."
)


def section_answers(run: Run, heading: str, answers: Callable[[Run], list[tuple[str, str]]]) -> list[tuple[str, str]]:
    """One section's (question, answer) pairs; a section that fails says so instead of costing the page."""
    try:
        return answers(run)
    except Exception as exc:  # one section's bug must not cost the run its other answers
        print(f"answers: {heading} failed for run {run.name}: {exc!r}", file=sys.stderr)
        return [("(not answered)", f"_{NOT_ANSWERED}: {type(exc).__name__}: {exc}_")]


def build(run: Run) -> str:
    """The page's markdown."""
    lines = [f"# Answers to the CS336 assignment 2 benchmarking questions — run `{run.name}`", ""]
    lines += [INTRO.format(run=run.name, device=device(*run.frames.values())), ""]
    for heading, answers in SECTIONS:
        lines += [f"## {heading}", ""]
        for question, answer in section_answers(run, heading, answers):
            lines += [f"**{question}** {answer}", ""]
    return "\n".join(lines)


def write_answers(out: Path, run: str, csvs: Mapping[str, Path], config: Mapping[str, Any] | None = None) -> Path:
    """``answers.md`` of one run: study name → merged CSV; ``config`` is the run's own settings snapshot, if any.

    A study missing from ``csvs`` gets "not measured in this run" for each of its questions.
    """
    frames = {name: load_study(path, name) for name, path in csvs.items()}
    return write_text_atomic(out, build(Run(run, frames, dict(config or {}))))


def discover(results: Path) -> dict[str, Path]:
    """The merged study CSVs of ``results/<run>/``."""
    return {p.stem: p for p in sorted(results.glob("*.csv")) if p.stem in STUDIES}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cs336sys.handout.answers", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, metavar="RUN_DIR", help="results/<run>: its merged <study>.csv files")
    parser.add_argument("--out", type=Path, help="output file (default report/<run>/answers.md)")
    parser.add_argument("--run", help="run name (default: the directory name)")
    args = parser.parse_args(argv)
    run = args.run or args.results.resolve().name
    csvs = discover(args.results)
    if not csvs:
        parser.error(f"no merged study CSV (<study>.csv) in {args.results}")
    snapshot = args.results / "config.yaml"
    config = load_yaml(snapshot) if snapshot.is_file() else None
    out = write_answers(args.out or Path("report") / run / "answers.md", run, csvs, config)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
