"""How well a run's intervals predict a repeat of the same cells: the evidence behind every interval.

Two runs of the same grid on the same device (same session or not) are paired
cell by cell (cell id, mode, phase, ok rows only). For each pair it records
whether the second run's median falls inside the first run's 95% interval,
the relative difference, and whether either run flagged the row ``noisy`` or
``host_bound``. The summary states the share inside, the spread of rows that
were not host-bound, and whether every row that moved by more than 5% was
flagged in both runs — the checks a reader needs before trusting a finding.

Runs that time more than eager steps are checked per study and per measure too:
the eager rows, their GPU time (the same phase replayed as CUDA graphs: the
``gpu_*`` columns) and the paired ratios (``kind=pair`` rows: run 2's ratio inside
run 1's interval), each a population with its own noise (``measures.csv``).

    python -m cs336sys.runs.repeatability results/<run-a> results/<run-b> --out report/<name>

(report/h100-repeatability paired runs h100-e2e-a, -b and -c, in git at 506a3f9; docs/results.md.)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.metrics import add_flags
from cs336sys.analysis.tables import OK
from cs336sys.columns import GPU_TIME_PREFIX as GPU
from cs336sys.columns import PAIR_KIND, timed_kind
from cs336sys.fileio import write_text_atomic
from cs336sys.pipeline.merge import load_study

KEYS = ["study", "cell_id", "mode", "phase"]
MOVED = 0.05  # a repeat that differs by more than this share must be flagged in both runs


EAGER, GPU_TIME, PAIRED = "eager", "GPU time", "paired ratio"  # the measures of measures.csv
PAIR_KEYS = KEYS + ["pair_with"]


def _rows(run_dir: Path) -> pd.DataFrame:
    """Every ok row of the run's merged study CSVs that carry timings."""
    frames = [load_study(p) for p in sorted(run_dir.glob("*.csv")) if not p.name.startswith(".")]
    frames = [f for f in frames if {"median_ms", "study"} <= set(f.columns)]
    if not frames:
        raise FileNotFoundError(f"{run_dir}: no merged study CSV with timings")
    df = pd.concat(frames, ignore_index=True)
    return df[df["status"] == OK]


def _timed(run_dir: Path, flags: dict | None) -> pd.DataFrame:
    df = add_flags(_rows(run_dir), flags)
    df = df[df["median_ms"].notna()]
    if "kind" in df:
        df = df[timed_kind(df["kind"])]
    return df.drop_duplicates(KEYS).set_index(KEYS)


def run_measures(run_dir: Path) -> dict[str, pd.DataFrame]:
    """Measure → rows indexed by their key, with ``value``, ``low``, ``high``: eager medians, GPU-time medians, paired ratios."""
    df = _rows(run_dir)
    timed = df[df["median_ms"].notna()]
    if "kind" in timed:
        timed = timed[timed_kind(timed["kind"])]
    out = {EAGER: timed.assign(value=timed["median_ms"], low=timed.get("ci_low_ms"), high=timed.get("ci_high_ms"))}
    if GPU + "median_ms" in timed:
        gpu = timed[pd.to_numeric(timed[GPU + "median_ms"], errors="coerce").notna()]
        out[GPU_TIME] = gpu.assign(value=gpu[GPU + "median_ms"], low=gpu.get(GPU + "ci_low_ms"), high=gpu.get(GPU + "ci_high_ms"))
    if "kind" in df and {"ratio", "pair_with"} <= set(df.columns):
        pairs = df[(df["kind"] == PAIR_KIND) & pd.to_numeric(df["ratio"], errors="coerce").notna()]
        out[PAIRED] = pairs.assign(value=pairs["ratio"], low=pairs.get("ratio_ci_low"), high=pairs.get("ratio_ci_high"))
    keys = {EAGER: KEYS, GPU_TIME: KEYS, PAIRED: PAIR_KEYS}
    return {m: rows.drop_duplicates(keys[m]).set_index(keys[m]) for m, rows in out.items() if not rows.empty}


def pair_measures(first: Path, second: Path) -> pd.DataFrame:
    """Per measure (eager, GPU time, paired ratio): one row per key measured in both runs, run 2's value inside run 1's interval or not."""
    a, b = run_measures(first), run_measures(second)
    rows = []
    for measure in a.keys() & b.keys():
        ra, rb = a[measure], b[measure]
        for key in ra.index.intersection(rb.index):
            x, y = ra.loc[key], rb.loc[key]
            low, high = float(x["low"]), float(x["high"])
            rows.append(
                {
                    "measure": measure,
                    **dict(zip(ra.index.names, key)),
                    "value_a": x["value"],
                    "low_a": low,
                    "high_a": high,
                    "value_b": y["value"],
                    "b_inside_a": bool(low <= float(y["value"]) <= high),
                    "rel_diff": float(y["value"]) / float(x["value"]) - 1,
                }
            )
    order = {EAGER: 0, GPU_TIME: 1, PAIRED: 2}
    out = pd.DataFrame(rows)
    return out.sort_values("measure", key=lambda m: m.map(order), kind="stable").reset_index(drop=True) if not out.empty else out


def summarize_measures(measures: pd.DataFrame) -> pd.DataFrame:
    """Per study and measure: how many rows, the share of run 2's values inside run 1's intervals, how far they moved."""
    if measures.empty:
        return pd.DataFrame()
    out = []
    for (study, measure), part in measures.groupby(["study", "measure"], sort=False):
        diff = part["rel_diff"].abs()
        out.append(
            {
                "study": study,
                "measure": measure,
                "n": len(part),
                "second_inside_first_95pct": part["b_inside_a"].mean(),
                "median_abs_diff": diff.median(),
                "max_abs_diff": diff.max(),
                "within_2pct": (diff <= 0.02).mean(),
            }
        )
    return pd.DataFrame(out)


def _flag(row: pd.Series, name: str) -> bool:
    value = row.get(name)
    return bool(value) if value is not None and not pd.isna(value) else False


def pair_runs(first: Path, second: Path, flags: dict | None = None) -> pd.DataFrame:
    """One row per (cell, mode, phase) measured ok in both runs."""
    a, b = _timed(first, flags), _timed(second, flags)
    rows = []
    for key in a.index.intersection(b.index):
        ra, rb = a.loc[key], b.loc[key]
        marked = lambda r: _flag(r, "noisy") or _flag(r, "host_bound")  # noqa: E731
        rows.append(
            {
                **dict(zip(KEYS, key)),
                "median_a_ms": ra["median_ms"],
                "ci_low_a_ms": ra.get("ci_low_ms"),
                "ci_high_a_ms": ra.get("ci_high_ms"),
                "median_b_ms": rb["median_ms"],
                "ci_low_b_ms": rb.get("ci_low_ms"),
                "ci_high_b_ms": rb.get("ci_high_ms"),
                "b_inside_a": bool(ra.get("ci_low_ms") <= rb["median_ms"] <= ra.get("ci_high_ms")),
                "rel_diff": rb["median_ms"] / ra["median_ms"] - 1,
                "gpu_busy_a": ra.get("gpu_busy_frac"),
                "gpu_busy_b": rb.get("gpu_busy_frac"),
                "host_bound": _flag(ra, "host_bound") or _flag(rb, "host_bound"),
                "flagged_in_both": marked(ra) and marked(rb),
            }
        )
    return pd.DataFrame(rows)


def summarize(pairs: pd.DataFrame) -> pd.DataFrame:
    """The acceptance numbers, for all rows and for rows that were not host-bound."""
    if pairs.empty:
        return pd.DataFrame()
    out = []
    for label, part in (("all rows", pairs), ("not host-bound", pairs[~pairs["host_bound"]]), ("host-bound", pairs[pairs["host_bound"]])):
        moved = part[part["rel_diff"].abs() > MOVED]
        out.append(
            {
                "rows": label,
                "n": len(part),
                "second_inside_first_95pct": part["b_inside_a"].mean() if len(part) else np.nan,
                "median_abs_diff": part["rel_diff"].abs().median() if len(part) else np.nan,
                "max_abs_diff": part["rel_diff"].abs().max() if len(part) else np.nan,
                "within_2pct": (part["rel_diff"].abs() <= 0.02).mean() if len(part) else np.nan,
                "moved_over_5pct": len(moved),
                "moved_and_flagged_in_both": moved["flagged_in_both"].mean() if len(moved) else np.nan,
            }
        )
    return pd.DataFrame(out)


def write(
    pairs_by_name: dict[str, pd.DataFrame], out_dir: Path, device: str, measures_by_name: dict[str, pd.DataFrame] | None = None
) -> Path:
    """``pairs.csv`` (every pair) and ``report.md`` (the summary per pair of runs and overall).

    ``measures_by_name`` (:func:`pair_measures` per pair of runs): where the runs have GPU-time
    or paired-ratio rows, ``measures.csv`` and a section per study and measure as well.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    every = pd.concat([p.assign(pair=name) for name, p in pairs_by_name.items()], ignore_index=True)
    with_pair = every[["pair"] + [c for c in every.columns if c != "pair"]]
    write_text_atomic(out_dir / "pairs.csv", with_pair.to_csv(index=False))
    lines = [
        f"# Repeatability on {device}",
        "",
        "Each pair: the same cells measured in two runs. `second_inside_first_95pct`: share of rows whose second-run "
        "median lies inside the first run's 95% interval. `host_bound`: the GPU was busy for less than 90% of the step "
        "in either run. Every row that moved by more than 5% should be flagged noisy or host-bound in both runs.",
        "",
        "## All pairs",
        "",
        md_table(summarize(every), ".3g"),
        "",
    ]
    for name, pairs in pairs_by_name.items():
        lines += [f"## {name}", "", md_table(summarize(pairs), ".3g"), ""]
    steps = every[every["phase"] == "step"]
    cols = [
        "pair",
        "cell_id",
        "mode",
        "median_a_ms",
        "ci_low_a_ms",
        "ci_high_a_ms",
        "median_b_ms",
        "b_inside_a",
        "rel_diff",
        "gpu_busy_a",
        "gpu_busy_b",
    ]
    lines += _measure_sections(measures_by_name or {}, out_dir)
    lines += ["## Whole steps", "", md_table(steps[cols], ".4g"), ""]
    return write_text_atomic(out_dir / "report.md", "\n".join(lines))


def _measure_sections(measures_by_name: dict[str, pd.DataFrame], out_dir: Path) -> list[str]:
    """The per-study, per-measure section: only where a run timed more than eager rows (older runs keep their report)."""
    frames = [m.assign(pair=name) for name, m in measures_by_name.items() if not m.empty]
    every = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if every.empty or set(every["measure"]) == {EAGER}:
        return []
    write_text_atomic(out_dir / "measures.csv", every[["pair"] + [c for c in every.columns if c != "pair"]].to_csv(index=False))
    lines = [
        "## Per study: eager rows, GPU time and paired ratios",
        "",
        "`eager`: the rows above; `GPU time`: the same phases replayed as CUDA graphs (run 2's GPU-time median inside run "
        "1's GPU-time interval); `paired ratio`: each comparison timed as interleaved blocks in one process (run 2's ratio "
        "inside run 1's interval). Every row in `measures.csv`.",
        "",
    ]
    for name, part in [("All pairs", every), *[(n, m) for n, m in measures_by_name.items() if len(measures_by_name) > 1]]:
        lines += [f"### {name}", "", md_table(summarize_measures(part), ".3g"), ""]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="results/<run> directories; each later one is paired with the first")
    parser.add_argument("--out", type=Path, required=True, help="directory for pairs.csv and report.md")
    parser.add_argument("--device", default="the device named in the rows")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two runs")
    first, *rest = args.runs
    pairs = {f"{first.name} → {r.name}": pair_runs(first, r) for r in rest}
    measures = {f"{first.name} → {r.name}": pair_measures(first, r) for r in rest}
    print(write(pairs, args.out, args.device, measures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
