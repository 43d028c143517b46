"""How well a run's intervals predict a repeat of the same cells: the evidence behind every interval.

Two runs of the same grid on the same device (same session or not) are paired
cell by cell (cell id, mode, phase, ok rows only). For each pair it records
whether the second run's median falls inside the first run's 95% interval,
the relative difference, and whether either run flagged the row ``noisy`` or
``host_bound``. The summary states the share inside, the spread of rows that
were not host-bound, and whether every row that moved by more than 5% was
flagged in both runs — the checks a reader needs before trusting a finding.

    python -m cs336sys.analysis.repeatability results/h100-e2e-a results/h100-e2e-b --out report/h100-repeatability
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.metrics import add_flags
from cs336sys.analysis.tables import OK, load_study
from cs336sys.fileio import write_text_atomic

KEYS = ["study", "cell_id", "mode", "phase"]
MOVED = 0.05  # a repeat that differs by more than this share must be flagged in both runs


def _timed(run_dir: Path, flags: dict | None) -> pd.DataFrame:
    frames = [load_study(p) for p in sorted(run_dir.glob("*.csv")) if not p.name.startswith(".")]
    frames = [f for f in frames if {"median_ms", "study"} <= set(f.columns)]
    if not frames:
        raise FileNotFoundError(f"{run_dir}: no merged study CSV with timings")
    df = add_flags(pd.concat(frames, ignore_index=True), flags)
    df = df[(df["status"] == OK) & df["median_ms"].notna()]
    if "kind" in df:
        df = df[df["kind"].isna() | (df["kind"] == "timing")]
    return df.drop_duplicates(KEYS).set_index(KEYS)


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
        rows.append({
            **dict(zip(KEYS, key)),
            "median_a_ms": ra["median_ms"], "ci_low_a_ms": ra.get("ci_low_ms"), "ci_high_a_ms": ra.get("ci_high_ms"),
            "median_b_ms": rb["median_ms"], "ci_low_b_ms": rb.get("ci_low_ms"), "ci_high_b_ms": rb.get("ci_high_ms"),
            "b_inside_a": bool(ra.get("ci_low_ms") <= rb["median_ms"] <= ra.get("ci_high_ms")),
            "rel_diff": rb["median_ms"] / ra["median_ms"] - 1,
            "gpu_busy_a": ra.get("gpu_busy_frac"), "gpu_busy_b": rb.get("gpu_busy_frac"),
            "host_bound": _flag(ra, "host_bound") or _flag(rb, "host_bound"),
            "flagged_in_both": marked(ra) and marked(rb),
        })  # fmt: skip
    return pd.DataFrame(rows)


def summarize(pairs: pd.DataFrame) -> pd.DataFrame:
    """The acceptance numbers, for all rows and for rows that were not host-bound."""
    if pairs.empty:
        return pd.DataFrame()
    out = []
    for label, part in (("all rows", pairs), ("not host-bound", pairs[~pairs["host_bound"]]), ("host-bound", pairs[pairs["host_bound"]])):
        moved = part[part["rel_diff"].abs() > MOVED]
        out.append({
            "rows": label, "n": len(part),
            "second_inside_first_95pct": part["b_inside_a"].mean() if len(part) else np.nan,
            "median_abs_diff": part["rel_diff"].abs().median() if len(part) else np.nan,
            "max_abs_diff": part["rel_diff"].abs().max() if len(part) else np.nan,
            "within_2pct": (part["rel_diff"].abs() <= 0.02).mean() if len(part) else np.nan,
            "moved_over_5pct": len(moved),
            "moved_and_flagged_in_both": moved["flagged_in_both"].mean() if len(moved) else np.nan,
        })  # fmt: skip
    return pd.DataFrame(out)


def write(pairs_by_name: dict[str, pd.DataFrame], out_dir: Path, device: str) -> Path:
    """``pairs.csv`` (every pair) and ``report.md`` (the summary per pair of runs and overall)."""
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
    lines += ["## Whole steps", "", md_table(steps[cols], ".4g"), ""]
    return write_text_atomic(out_dir / "report.md", "\n".join(lines))


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
    print(write(pairs, args.out, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
