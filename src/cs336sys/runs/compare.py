"""Compare two benchmark runs cell by cell (like ``asv compare`` or ``pytest-benchmark --benchmark-compare``).

The questions are "is the H200 faster than the H100 on my grid, and where?" and "did my kernel change
make any cell slower?". Two runs' merged study CSVs (``results/<run>/<study>.csv``) are matched by
(cell_id, mode, phase); each pair gets the ratio b/a of median times with a conservative interval
(b.low/a.high, b.high/a.low from the runs' 95 % intervals) and a verdict that calls a cell slower or
faster only when the two intervals do not overlap, so noise is not reported as change. A gate
(``--fail-above``) turns the table into a CI check. Runs measured before the axes' renaming load through
:func:`cs336sys.pipeline.merge.load_study`, so an old run and a new one match cell by cell. This is the
analysis layer: it reads CSVs and YAML only and never imports torch or the measurement code.

Verdicts: ``slower`` when b's interval lies entirely above a's, ``faster`` entirely below, ``same``
when they overlap, ``n/a`` when an interval is unknown (older runs recorded none) or a status is not ok.
The gate fails on more than slower rows: a row ok in a and not in b (or missing there), a study or a
cell missing in b, a setting that shapes a measurement and differs (:mod:`cs336sys.runs.gate`). A CSV
that breaks the row contract is refused, named, before anything is compared (``load_study``).

Two runs that share no GPU: intervals widened by the between-device figures, host-bound rows that
moved ``host-dependent`` (not gated); see :mod:`cs336sys.runs.compare_machines`.
Exactly two runs are compared (baseline a, candidate b); compare more by calling this once per pair.
Read compare.csv with ``keep_default_na=False``: pandas otherwise reads the verdict "n/a" as NaN.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cs336sys.analysis.passes import HOST_PROBE
from cs336sys.columns import GPU_TIME_PREFIX, timed_kind
from cs336sys.fileio import atomic_path, write_text_atomic
from cs336sys.pipeline.merge import load_study
from cs336sys.rows import BadRowsError, problems
from cs336sys.runs import compare_machines, compare_plot, compare_section
from cs336sys.runs.compare_machines import HOST_DEPENDENT, Machines, evidence, machines_of, machines_text, row_gpus
from cs336sys.runs.compare_plot import cell_text, cells_md, listed, md, texts_where
from cs336sys.runs.compare_setup import config_diff, environment_diff, load_config
from cs336sys.runs.gate import GATE_RULES, GateResult, evaluate, regressions, threshold
from cs336sys.runs.html import report_page

KEYS = ("cell_id", "mode", "phase")
COLUMNS = [
    *"cell_id mode phase status_a status_b median_a_ms median_b_ms ratio ratio_low ratio_high verdict status_change only_in flags figure host_ratio gpu_ratio note b_lacks".split(),
    *compare_machines.ENERGY_COLUMNS,
]


@dataclass
class ComparisonResult:
    table: pd.DataFrame  # compare_study's columns for every study, with a leading ``study`` column
    regressions: pd.DataFrame  # the rows of ``table`` that fail the gate (threshold 1.0 when ungated)
    passed: bool  # nothing fails the gate (gate.GateResult), or no gate (fail_above None)
    report_path: Path
    gate: GateResult | None = None  # what the gate found, when there is one


def load_run(results_dir: Path) -> dict[str, pd.DataFrame]:
    """Study name → merged frame, from every ``<results_dir>/*.csv`` that has a ``study`` column.

    Each file loads through ``pipeline.merge.load_study``, checked against the row contract (a bad file is
    refused, named): an old run's columns (``ctx``, ``attn``, …) get the current names and its cell ids
    are rebuilt; the environment columns come back as text (a commit ``1234567`` or CUDA ``12.10`` must
    not turn into a number: ``rows.TEXT_COLUMNS``). A study whose CSV holds no row is not in the result."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"no run directory {results_dir}")
    parts: dict[str, list[pd.DataFrame]] = {}
    sources: dict[str, list[Path]] = {}
    for path in sorted(results_dir.glob("*.csv")):
        if path.name.startswith("."):
            continue
        df = load_study(path, check=True)
        if "study" not in df.columns:
            continue
        df["study"] = df["study"].fillna(path.stem).astype(str)
        for name, group in df.groupby("study", sort=False):
            parts.setdefault(str(name), []).append(group)
            sources.setdefault(str(name), []).append(path)
    runs = {name: pd.concat(frames, ignore_index=True) for name, frames in parts.items()}
    for name, paths in sources.items():  # two files, one study: a row in both would be compared once, unseen
        if len(paths) > 1 and (twice := problems(runs[name])):
            raise BadRowsError(f"rows of study {name} in {' and '.join(map(str, paths))} repeat each other: {twice[0]}")
    return runs


def _truthy(value: Any) -> bool:
    return (
        value is True
        or (isinstance(value, (int, float, np.bool_)) and not pd.isna(value) and bool(value))
        or (isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"))
    )


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Timing rows only, string keys ('' where absent), numeric times, one row per key."""
    if "kind" in df.columns:
        df = df[timed_kind(df["kind"])]
    out = pd.DataFrame(index=df.index)
    for key in KEYS:
        out[key] = df[key].fillna("").astype(str) if key in df.columns else ""
    out["status"] = df["status"].fillna("").astype(str) if "status" in df.columns else ""
    for col in (
        "median_ms",
        "ci_low_ms",
        "ci_high_ms",
        "gpu_busy_frac",
        *(GPU_TIME_PREFIX + c for c in ("median_ms", "ci_low_ms", "ci_high_ms")),
        HOST_PROBE,
        *("energy_j", "energy_ci_low_j", "energy_ci_high_j"),
    ):
        out[col] = pd.to_numeric(df[col], errors="coerce") if col in df.columns else np.nan
    out["has_ci"] = "ci_low_ms" in df.columns and "ci_high_ms" in df.columns
    out["gpus"] = row_gpus(df)
    marks = [df[c].map(_truthy).map({True: c, False: ""}) for c in ("noisy", "host_bound") if c in df.columns]
    out["flags"] = [",".join(f for f in fl if f) for fl in zip(*marks)] if marks else ""
    return out.drop_duplicates(list(KEYS), keep="first").reset_index(drop=True)


def _expand_failures(side: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """A failed row without a phase (or mode) stands for every key of the other run it covers.

    A cell that ran out of memory in training records one row (mode=train, no phase); the
    other run has its forward/backward/... rows. Without this they would not match at all.
    Joined, not looped: a candidate whose every cell was skipped is as fast to compare as any.
    """
    wide = ((side["status"] != "ok") & ((side["mode"] == "") | (side["phase"] == ""))).to_numpy()
    if not wide.any():
        return side
    src = side.assign(_src=np.arange(len(side)), _sub=-1)
    w = src[wide]
    targets = other[list(KEYS)].drop_duplicates()
    targets = targets.assign(_sub=np.arange(len(targets)))
    cand = w.drop(columns=["mode", "phase", "_sub"]).merge(targets, on="cell_id")
    own = w.set_index("_src")[["mode", "phase"]].reindex(cand["_src"]).to_numpy()
    covers = ((own[:, 0] == "") | (own[:, 0] == cand["mode"].to_numpy())) & ((own[:, 1] == "") | (own[:, 1] == cand["phase"].to_numpy()))
    cand = cand[covers].merge(side[list(KEYS)].drop_duplicates(), on=list(KEYS), how="left", indicator=True)
    cand = cand[cand["_merge"] == "left_only"].drop(columns="_merge")  # keys this run has rows of keep their own
    kept = src[~wide | ~src["_src"].isin(cand["_src"]).to_numpy()]
    out = pd.concat([kept, cand[src.columns]], ignore_index=True).sort_values(["_src", "_sub"], kind="stable")
    return out.drop(columns=["_src", "_sub"]).drop_duplicates(list(KEYS), keep="first").reset_index(drop=True)


def compare_study(a: pd.DataFrame, b: pd.DataFrame, machines: Machines | None = None, study: str = "") -> pd.DataFrame:
    """One row per (cell_id, mode, phase) of either run; see the module docstring for the verdicts."""
    machines = machines or Machines()
    study = study or next((str(s) for df in (a, b) if "study" in df for s in df["study"].dropna()), "")
    pa, pb = _prepare(a), _prepare(b)
    pa, pb = _expand_failures(pa, pb), _expand_failures(pb, pa)
    pa["pos"], pb["pos"] = np.arange(len(pa)), np.arange(len(pb))
    m = pa.merge(pb, on=list(KEYS), how="outer", suffixes=("_a", "_b"), indicator=True)
    m = m.sort_values(["pos_a", "pos_b"], na_position="last", kind="stable").reset_index(drop=True)
    both_ok = (m["status_a"] == "ok") & (m["status_b"] == "ok")
    med_a, med_b = m["median_ms_a"].where(both_ok), m["median_ms_b"].where(both_ok)
    ratio = med_b / med_a
    known = both_ok & ratio.notna() & (m["ci_high_ms_a"] > 0) & m[["ci_low_ms_a", "ci_low_ms_b", "ci_high_ms_b"]].notna().all(axis=1)
    r_low = (m["ci_low_ms_b"] / m["ci_high_ms_a"]).where(known)
    # an interval of a that reaches 0 (a host-bound cell's two passes) bounds the ratio from below only
    r_high = (m["ci_high_ms_b"] / m["ci_low_ms_a"].where(m["ci_low_ms_a"] > 0)).fillna(np.inf).where(known)
    moved = known & ((r_low > 1) | (r_high < 1))  # the runs' own intervals do not overlap
    busy = np.fmin(m["gpu_busy_frac_a"].to_numpy(dtype=float), m["gpu_busy_frac_b"].to_numpy(dtype=float))
    differ = machines.rows_differ(m["gpus_a"], m["gpus_b"])  # a two-GPU run's cells ran on either GPU
    figure, low, high, host_bound = machines.across(study, busy, ratio, r_low, r_high, differ)
    r_low, r_high = pd.Series(low, index=m.index).where(known), pd.Series(high, index=m.index).where(known)
    verdict = np.select([~known, host_bound & moved, r_low > 1, r_high < 1], ["n/a", HOST_DEPENDENT, "slower", "faster"], "same")
    host_ratio = m[HOST_PROBE + "_b"] / m[HOST_PROBE + "_a"]
    gpu_ratio = m[GPU_TIME_PREFIX + "median_ms_b"] / m[GPU_TIME_PREFIX + "median_ms_a"]
    # a host-bound row whose GPU time moved: the GPU's work changed; judged (and gated) by that ratio
    by_gpu, gpu_low, gpu_high = machines.gpu_verdicts(m, differ)
    by_gpu_row = (verdict == HOST_DEPENDENT) & (by_gpu != "")
    verdict = np.where(by_gpu_row, by_gpu, verdict)
    eager_ratio = ratio
    ratio, r_low, r_high = (
        x.where(~by_gpu_row, pd.Series(y, index=m.index)) for x, y in ((ratio, gpu_ratio), (r_low, gpu_low), (r_high, gpu_high))
    )
    only_in = np.select([m["_merge"] == "left_only", m["_merge"] == "right_only"], ["a", "b"], "")
    # what b, ok where a is ok, lacks to be judged: today's code records both (the gate fails on it)
    b_lacks = np.select(
        [both_ok & med_b.isna(), both_ok & ~(m["has_ci_b"].eq(True) & m[["ci_low_ms_b", "ci_high_ms_b"]].notna().all(axis=1))],
        ["median", "interval"],
        "",
    )
    present = m["_merge"] == "both"
    change = np.where(present & (m["status_a"] != m["status_b"]), m["status_a"].fillna("") + " → " + m["status_b"].fillna(""), "")
    flags = [
        ", ".join(f"{f}({s})" for s, fl in (("a", fa), ("b", fb)) if isinstance(fl, str) for f in fl.split(",") if f)
        for fa, fb in zip(m["flags_a"], m["flags_b"])
    ]
    note = np.select(
        [
            only_in == "a",
            only_in == "b",
            m["status_a"] != "ok",
            m["status_b"] != "ok",
            ratio.isna(),
            ~(m["has_ci_a"].eq(True) & m["has_ci_b"].eq(True)),
            ~known,
            verdict == HOST_DEPENDENT,
            by_gpu_row,
        ],
        [
            "only in a",
            "only in b",
            m["status_a"].fillna("") + " in a",
            m["status_b"].fillna("") + " in b",
            "no median recorded",
            "no interval recorded",
            "interval incomplete",
            texts_where(verdict == HOST_DEPENDENT, evidence, host_ratio, gpu_ratio),
            texts_where(by_gpu_row, lambda e: f"host-bound on two devices: judged by its GPU time (eager ratio {e:.3g})", eager_ratio),
        ],
        "",
    )
    out = pd.DataFrame(
        {
            "cell_id": m["cell_id"],
            "mode": m["mode"],
            "phase": m["phase"],
            "status_a": m["status_a"],
            "status_b": m["status_b"],
            "median_a_ms": m["median_ms_a"],
            "median_b_ms": m["median_ms_b"],
            "ratio": ratio,
            "ratio_low": r_low,
            "ratio_high": r_high,
            "verdict": verdict,
            "status_change": change,
            "only_in": only_in,
            "flags": flags,
            "figure": figure,
            "host_ratio": host_ratio,
            "gpu_ratio": gpu_ratio,
            "note": note,
            "b_lacks": b_lacks,
            **compare_machines.energy_ratios(m),
        }
    )
    return out[COLUMNS]


def compare_runs(a: Mapping[str, pd.DataFrame], b: Mapping[str, pd.DataFrame], machines: Machines | None = None) -> pd.DataFrame:
    """:func:`compare_study` for every study of either run (as :func:`load_run` returns them), stacked
    with a leading ``study`` column. ``machines`` defaults to :func:`machines_of` the two runs."""
    machines = machines_of(a, b) if machines is None else machines
    empty = pd.DataFrame(columns=["study", "cell_id", "status"])
    tables = [compare_study(a.get(s, empty), b.get(s, empty), machines, s).assign(study=s) for s in sorted(set(a) | set(b))]
    return pd.concat([t[["study", *COLUMNS]] for t in tables], ignore_index=True) if tables else pd.DataFrame(columns=["study", *COLUMNS])


def _two(run_dirs: Sequence[Path], names: Sequence[str]) -> tuple[Path, Path]:
    if len(run_dirs) != 2 or len(names) != 2:
        raise ValueError(f"compare exactly 2 runs (baseline, candidate) with 2 names; got {len(run_dirs)} runs and {len(names)} names")
    return Path(run_dirs[0]), Path(run_dirs[1])


def write_comparison(run_dirs: Sequence[Path], names: Sequence[str], out_dir: Path, fail_above: float | None = None) -> ComparisonResult:
    """Compare run b = ``run_dirs[1]`` against baseline a = ``run_dirs[0]``; write report.md,
    report.html (the same, one page, figures inside), compare.csv and figures/<study>_ratio.png under
    ``out_dir``. Exactly two runs are allowed."""
    a_dir, b_dir = _two(run_dirs, names)
    out_dir = Path(out_dir)
    a_name, b_name = names
    runs = load_run(a_dir), load_run(b_dir)
    machines = machines_of(*runs)
    table = compare_runs(*runs, machines=machines)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)  # a directory output of the workflow, empty or not
    sections = []
    for study in sorted(set(runs[0]) | set(runs[1])):  # a study without timing rows still gets its section
        t = table[table["study"] == study].drop(columns="study").reset_index(drop=True)
        figure = None
        if np.isfinite(t["ratio"].astype(float)).any():
            fig = compare_plot.ratio_figure(t, f"{study}: {b_name} vs {a_name} (baseline)")
            with atomic_path(out_dir / "figures" / f"{study}_ratio.png") as tmp:
                fig.savefig(tmp, format="png", dpi=120)
            compare_plot.close(fig)
            figure = f"figures/{study}_ratio.png"
        sections += compare_section.study_section(study, t, figure)
    verdict = None if fail_above is None else evaluate((a_dir, b_dir), *runs, table, fail_above)
    regs = regressions(table, 1.0) if verdict is None else verdict.rows
    passed = verdict is None or verdict.passed

    lines = [
        f"# `{a_name}` vs `{b_name}`",
        "",
        f"Baseline **a** = `{a_name}` (`{a_dir}`); candidate **b** = `{b_name}` (`{b_dir}`). "
        "Ratio = median time b / a: above 1, b is slower. A cell is slower or faster only when the runs' "
        "95 % intervals do not overlap (ratio interval = [b.low / a.high, b.high / a.low]); otherwise "
        "`same`, or `n/a` when an interval is unknown or a status is not ok. An interval of a that reaches 0 "
        "leaves the ratio unbounded above: [x, ∞].",
        "",
        *machines_text(machines, runs),
        "## Gate",
        "",
    ]
    if verdict is None:
        lines += [f"Not gated (no fail-above threshold). {len(regs)} row(s) slower beyond noise, missing or no longer ok in b.", ""]
        lines += [listed(regs, lambda r: cells_md(r, ["reason"])), ""] if len(regs) else []
    else:
        lines += [
            f"Fail above {fail_above:g}: **{'passed' if passed else 'FAILED'}** — {verdict.failures()} regression(s). {GATE_RULES}",
            "",
        ]
        lines += verdict.text() + [f"Not checked: {n}." for n in verdict.notes] + ([""] if verdict.notes else [])
    lines += ["## Environment", "", md(environment_diff(*runs)), "", "## Config", ""]
    cfgs = load_config(a_dir), load_config(b_dir)
    if None in cfgs:
        missing = " and ".join(n for n, c in zip(names, cfgs) if c is None)
        lines += [f"Not compared: no config.yaml in {missing}.", ""]
    else:
        diff = config_diff(*cfgs)
        lines += [f"- `{r.key}`: {cell_text(r.a)} → {cell_text(r.b)}" for r in diff.itertuples()] or ["No differences."]
        lines += [""]
    report = write_text_atomic(out_dir / "report.md", "\n".join(lines + sections).rstrip() + "\n")
    write_text_atomic(out_dir / "report.html", report_page([report], f"cs336sys comparison — {a_name} vs {b_name}"))
    with atomic_path(out_dir / "compare.csv") as tmp:
        table.to_csv(tmp, index=False)
    return ComparisonResult(table=table, regressions=regs, passed=passed, report_path=report, gate=verdict)


def gate(run_dirs: Sequence[Path], names: Sequence[str], fail_above: float, out: Path) -> str | None:
    """The gate alone (the workflow's ``compare_gate``): None, with a one-line pass written to ``out``, when
    nothing fails it (:mod:`cs336sys.runs.gate`); otherwise the failure text listing each failure, and
    ``out`` not written. A CSV that breaks the row contract raises :class:`cs336sys.rows.BadRowsError`."""
    dirs = _two(run_dirs, names)
    runs = load_run(dirs[0]), load_run(dirs[1])
    table = compare_runs(*runs)
    result = evaluate(dirs, *runs, table, fail_above)
    head = f"`{names[1]}` vs `{names[0]}` (baseline), fail above {fail_above:g}"
    if result.passed:
        notes = "".join(f"; not checked: {n}" for n in result.notes)
        judged = int((table["verdict"] != "n/a").sum())
        write_text_atomic(out, f"passed: {head}: {len(table)} row(s) compared, {judged} judged, no regression{notes}\n")
        return None
    return "\n".join([f"FAILED: {head}: {result.failures()} regression(s). {GATE_RULES}", "", *result.text()]).rstrip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cs336sys.runs.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs=2, type=Path, metavar="RUN_DIR", help="baseline, then candidate: results/<run>")
    parser.add_argument("--out", type=Path, help="output directory (default report/compare/<a>-vs-<b>)")
    parser.add_argument("--names", nargs=2, metavar=("A", "B"), help="run names (default: the directory names)")
    parser.add_argument("--fail-above", type=threshold, help=f"exit 1 when the gate fails at this ratio threshold: {GATE_RULES}")
    args = parser.parse_args(argv)
    names = args.names or [d.resolve().name for d in args.runs]
    out = args.out or Path("report/compare") / f"{names[0]}-vs-{names[1]}"
    try:
        result = write_comparison(args.runs, names, out, args.fail_above)
    except (FileNotFoundError, ValueError) as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    print(f"wrote {result.report_path}")
    if result.gate is not None and not result.passed:
        print("\n".join(result.gate.text()).rstrip())
        print(f"FAILED: {result.gate.failures()} regression(s) (fail above {args.fail_above:g})", file=sys.stderr)
        return 1
    if result.regressions.empty:
        print("no regressions" if args.fail_above is not None else "no cell slower beyond noise, missing or newly failing")
    else:
        print(listed(result.regressions, lambda r: cells_md(r, ["reason"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
