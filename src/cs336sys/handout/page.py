"""One answers page over several runs: each handout question answered from the first listed run that measured it.

A run answers its own slice of the handout (the default sweep, the e2e grid, the profiles…);
this page puts the slices together. Runs are tried in the order given; a question takes the
answer of the first run whose answer is not "not measured in this run" (or a failed section),
names that run and links its report. The answers are :mod:`cs336sys.handout.answers`' own,
computed by the same per-section functions; their links are rewritten to point into the
run's report folder.

    python -m cs336sys.handout --out report/handout/h100.md results/h100 results/h100-e2e results/h100-profile
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from cs336sys.errors import ConfigError
from cs336sys.fileio import write_text_atomic
from cs336sys.handout.answers import ANSWER_RULES, NOT_ANSWERED, SECTIONS, discover, section_answers
from cs336sys.handout.answers_common import Run, device, measured
from cs336sys.pipeline.config import load_yaml
from cs336sys.pipeline.merge import load_study
from cs336sys.rows import BadRowsError

# a markdown link whose target is relative to the run's report folder (not a URL, an anchor or an absolute path)
_RELATIVE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#|/)([^)\s]+)\)", re.I)


def load_run(results: Path, name: str | None = None) -> Run:
    """A run from ``results/<run>/``: its merged study CSVs and its config snapshot, if any."""
    csvs = discover(results)
    if not csvs:
        raise FileNotFoundError(f"no merged study CSV (<study>.csv) in {results}")
    snapshot = results / "config.yaml"
    config = load_yaml(snapshot) if snapshot.is_file() else {}
    frames = {study: load_study(path, study, check=True) for study, path in csvs.items()}
    return Run(name or results.resolve().name, frames, dict(config or {}))


def rebase(answer: str, prefix: str) -> str:
    """``answer`` with each relative link (``report.md#…``, ``figures/…``) moved under ``prefix``."""
    return _RELATIVE_LINK.sub(lambda m: f"]({prefix}/{m.group(1)})", answer)


def answered(answer: str) -> bool:
    """True where the run measured the question and its section did not fail."""
    return measured(answer) and NOT_ANSWERED not in answer


def build(runs: Sequence[Run], report_links: dict[str, str]) -> str:
    """The page's markdown; ``report_links``: run name → its report folder relative to the page."""
    if not runs:
        raise ValueError("a handout page needs at least one run")
    names = ", ".join(f"`{r.name}`" for r in runs)
    lines = [f"# Answers to the CS336 assignment 2 benchmarking questions — runs {names}", ""]
    lines += [
        "Each question of the handout's benchmarking sections, paraphrased in bold, answered from the first of these runs "
        "that measured it (tried in this order; the run is named before its answer) by `cs336sys.handout.page`.",
        "",
        f"How to read the numbers: {ANSWER_RULES}.",
        "",
        "| run | device | report | answers |",
        "|:--|:--|:--|:--|",
    ]
    for run in runs:
        where = report_links[run.name]
        lines.append(f"| `{run.name}` | {device(*run.frames.values())} | [report]({where}/report.md) | [answers]({where}/answers.md) |")
    lines.append("")
    for heading, answers in SECTIONS:
        lines += [f"## {heading}", ""]
        per_run = [(run, dict(section_answers(run, heading, answers))) for run in runs]
        questions = list(dict.fromkeys(q for _, qa in per_run for q in qa))
        for question in questions:
            have = [(run, qa[question]) for run, qa in per_run if question in qa]
            run, answer = next(((r, a) for r, a in have if answered(a)), have[0])
            where = report_links[run.name]
            source = f"from run [`{run.name}`]({where}/report.md)" if answered(answer) else f"in none of the runs; run `{run.name}` says"
            lines += [f"**{question}** _({source})_ {rebase(answer, where)}", ""]
    return "\n".join(lines)


def write_handout(out: Path, results: Sequence[Path], reports: Path = Path("report")) -> Path:
    """The handout page at ``out`` from the runs ``results`` (in order); their reports under ``reports/<run>/``."""
    runs = [load_run(r) for r in results]
    if len({r.name for r in runs}) < len(runs):
        raise ValueError(f"two runs share a name: {', '.join(r.name for r in runs)}")
    links = {r.name: Path(os.path.relpath(reports / r.name, out.parent)).as_posix() for r in runs}
    return write_text_atomic(out, build(runs, links))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cs336sys.handout", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, metavar="RUN_DIR", help="results/<run> directories, in the order to try them")
    parser.add_argument("--out", type=Path, required=True, help="the page to write, e.g. report/handout/h100.md")
    parser.add_argument(
        "--reports", type=Path, default=Path("report"), help="where each run's report.md lives, as <REPORTS>/<run>/ (default: report)"
    )
    args = parser.parse_args(argv)
    for path in args.results:
        if not path.is_dir():
            parser.error(f"no run folder {path} (a results/<run> directory)")
        if not discover(path):
            parser.error(f"no merged study CSV (<study>.csv) in {path}")
    names = [path.resolve().name for path in args.results]
    if len(set(names)) < len(names):
        parser.error(f"two runs share a name: {', '.join(names)} (each run's answers link to report/<run>/)")
    if args.out.is_dir() or any(p.exists() and not p.is_dir() for p in args.out.parents):
        parser.error(f"--out {args.out} cannot be a file: name the page's file in a folder, e.g. report/handout/h100.md")
    try:
        print(write_handout(args.out, args.results, args.reports))
    except (BadRowsError, ConfigError) as exc:  # a run's CSV or config.yaml, not this page: named, nothing written
        print(f"{parser.prog}: refused: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
