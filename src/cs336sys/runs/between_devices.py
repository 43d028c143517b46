"""What an interval covers on another machine of the same kind: the between-device component.

A row's 95% interval is built to cover a rerun on the same machine (report/h100-repeatability*). It
does not cover a rerun on another machine of the same kind: two H100 machines ran a GPU-bound mha
step 2.7% apart with ±1% intervals, and the same launch-bound step up to 45% apart, because the
host's CPU sets a launch-bound step's time (issue "intervals that hold on another machine"). The
difference between two devices is a component of its own, and it depends on how much of the step
the host sets. So it is measured per class of row:

- ``gpu-bound``, ``partly host-bound``, ``launch-bound``: eager rows by their GPU busy share
  (:func:`cs336sys.analysis.passes.drift_class`); ``unknown (<study>)`` where a study records no
  busy share (flash's do_bench rows, the profile study);
- ``gpu time``: the same phases replayed as CUDA graphs (GPU-bound by construction);
- ``paired ratio, <drift class>``: the e2e cell's interleaved comparisons.

A class's figure comes from repeat runs of one grid on different GPUs (``gpu_uuid``) of the same kind
(``device_name``): every such pair of runs contributes ``|log(b / a)|`` of each row measured in
both, and the figure is the largest of those, as a relative half-width ``exp(max) - 1``
(``MIN_ROWS`` rows at least, else no figure; the 95th percentile is kept beside it as ``q95_rel``).
The largest, not a percentile: a comparison report holds a hundred rows or more, and a 95th
percentile would call five of them slower on two machines that differ in nothing but the machine.
So "slower across machines" means slower than any row of its class moved between two machines.
But never one row alone: a row flagged ``shared`` in either run (another run's jobs beside it, or
no GPU lock: :func:`cs336sys.analysis.metrics.add_flags`) measured something besides the machine,
and a row that moved more than :data:`CORROBORATE` times as far as any other row of its class (in
log; in the committed H100 runs the largest move is at most 1.7 times the next) is an outlier;
both are set aside, counted (``set_aside``) and named on stderr. One such row would otherwise
widen every comparison of its class across two machines until nothing could be slower. A row
that breaks the row contract (an ``inf`` median) is refused, naming its file, when the run is
read. The figures live in ``between_devices.yaml`` beside
this module (package data), with the runs they came from, and are recomputed when runs arrive:

    python -m cs336sys.runs.between_devices results/<run-1> results/<run-2> [...] --write

Across machines, a row's interval is its own interval widened to at least
``median / (1 + c)`` .. ``median * (1 + c)`` (a floor, like ``interval_floor_rel``: the figure
already holds both runs' own noise); a paired ratio's likewise. ``runs.compare`` uses it when
two runs share no GPU, and :func:`coverage` checks it: the share of run b's values inside run a's
interval, within one machine and across machines. This module reads CSVs and YAML only.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from cs336sys.analysis.markdown import md_table
from cs336sys.analysis.metrics import FLAG_DEFAULTS, add_flags
from cs336sys.analysis.passes import drift_class, pair_busy
from cs336sys.fileio import write_text_atomic
from cs336sys.pipeline.merge import load_study
from cs336sys.rows import BadRowsError
from cs336sys.runs.compare_setup import config_diff, load_config
from cs336sys.runs.repeatability import EAGER, GPU_TIME, PAIRED, run_measures

FIGURES = Path(__file__).with_name("between_devices.yaml")
QUANTILE = 0.95
MIN_ROWS = 5
MIN_GPU_BUSY = FLAG_DEFAULTS["min_gpu_busy"]  # the host_bound flag's threshold
CORROBORATE = 2.0  # a class's largest move counts when another row of the class moved at least 1/CORROBORATE as far


def row_class(measure: str, study: str, busy: object) -> str:
    """The class whose between-device figure applies to a row (see the module doc)."""
    if measure == GPU_TIME:
        return "gpu time"
    drift = drift_class(busy, MIN_GPU_BUSY)
    drift = f"unknown ({study})" if drift == "unknown" else drift
    return f"paired ratio, {drift}" if measure == PAIRED else drift


def machines(df: pd.DataFrame, column: str | None = None) -> frozenset[str]:
    """The GPUs a run's rows were measured on (``gpu_uuid``, ``pass_gpu_uuid``); the hosts where no GPU is
    named (a CPU run, a GPU run without NVML). ``column`` "gpu" or "host" asks for one kind only."""
    kinds = {"gpu": ("gpu_uuid", "pass_gpu_uuid"), "host": ("host",)}
    for kind in [column] if column else ["gpu", "host"]:
        named = {u for c in kinds[kind] if c in df for v in df[c].dropna() for u in str(v).split(";") if u not in ("", "nan")}
        if named:
            return frozenset(named)
    return frozenset()


def device_names(df: pd.DataFrame) -> frozenset[str]:
    return frozenset(str(v) for v in df.get("device_name", pd.Series(dtype=str)).dropna() if str(v) not in ("", "nan"))


def _busy_by_step(eager: pd.DataFrame) -> dict[str, dict[tuple[str, str], float]]:
    """Study → (cell id, mode) → the whole step's GPU busy share."""
    if "gpu_busy_frac" not in eager or "step" not in eager.index.get_level_values("phase"):
        return {}
    out: dict[str, dict[tuple[str, str], float]] = {}
    for (study, cell, mode), v in eager.xs("step", level="phase")["gpu_busy_frac"].items():
        out.setdefault(study, {})[(cell, mode)] = pd.to_numeric(pd.Series([v]), errors="coerce").iloc[0]
    return out


def classified(run_dir: Path) -> pd.DataFrame:
    """Every value of the run (eager median, GPU-time median, paired ratio) with its key, interval, busy share and class."""
    frames = []
    measured = run_measures(Path(run_dir))
    step_busy = _busy_by_step(measured[EAGER]) if EAGER in measured else {}
    for measure, rows in measured.items():
        rows = rows.reset_index()
        if measure == PAIRED:  # the more host-bound side's class, as the merge pools it
            sides = [pair_busy(r.cell_id, r.mode, r.pair_with, step_busy.get(r.study, {})) for r in rows.itertuples()]
            busy = [np.nan if b is None else b for b in sides]
        else:
            busy = pd.to_numeric(rows.get("gpu_busy_frac", pd.Series(np.nan, index=rows.index)), errors="coerce").tolist()
        key = rows[["study", "cell_id", "mode", "phase"]].astype(str).agg("|".join, axis=1)
        if measure == PAIRED:
            key = key + "|" + rows["pair_with"].astype(str)
        shared = add_flags(rows).get("shared", pd.Series(False, index=rows.index)).fillna(False).astype(bool)
        frames.append(
            pd.DataFrame(
                {
                    "measure": measure,
                    "study": rows["study"],
                    "key": key,
                    "value": pd.to_numeric(rows["value"], errors="coerce"),
                    "low": pd.to_numeric(rows["low"], errors="coerce"),
                    "high": pd.to_numeric(rows["high"], errors="coerce"),
                    "busy": busy,
                    "shared": shared,
                    "machine": ";".join(sorted(machines(rows, "gpu"))),
                    "host": ";".join(sorted(machines(rows, "host"))),
                    "device_name": ";".join(sorted(device_names(rows))),
                }
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def paired_values(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """The values measured in both runs (``classified`` frames), with the class of the more host-bound side."""
    m = a.merge(b, on=["measure", "study", "key"], suffixes=("_a", "_b"))
    m = m[(m["value_a"] > 0) & (m["value_b"] > 0)]
    busy = np.fmin(m["busy_a"].to_numpy(dtype=float), m["busy_b"].to_numpy(dtype=float))
    m = m.assign(busy=busy, log_ratio=np.log(m["value_b"] / m["value_a"]))
    m["class"] = [row_class(x.measure, x.study, x.busy) for x in m.itertuples()]
    return m.reset_index(drop=True)


def different_devices(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """True when two runs (``classified`` frames or rows) share no GPU (host, for CPU runs) and both name theirs."""
    a, b = _machine_rows(a), _machine_rows(b)
    for kind in ("gpu", "host"):  # like with like: a GPU's id never matches a host name
        ma, mb = machines(a, kind), machines(b, kind)
        if ma and mb:
            return not (ma & mb)
    return False


def _machine_rows(df: pd.DataFrame) -> pd.DataFrame:
    if "machine" in df:  # a classified frame: the run's GPUs and hosts
        return pd.DataFrame(
            {"gpu_uuid": [";".join(sorted(set(df["machine"].dropna())))], "host": [";".join(sorted(set(df["host"].dropna())))]}
        )
    return df


def check_run(run_dir: Path) -> None:
    """Refuse a run whose study CSVs break the row contract (an ``inf`` median), naming the file and row."""
    for path in sorted(Path(run_dir).glob("*.csv")):
        if not path.name.startswith("."):
            load_study(path, check=True)


def estimate(runs: Sequence[Path]) -> dict[str, dict]:
    """Device name → its figures: every pair of ``runs`` on different devices of that name contributes."""
    for run in runs:
        check_run(Path(run))
    frames = {Path(r): classified(Path(r)) for r in runs}
    by_device: dict[str, list[pd.DataFrame]] = {}
    used: dict[str, set[Path]] = {}
    for (ra, a), (rb, b) in itertools.combinations(frames.items(), 2):
        names = set(a["device_name"]) | set(b["device_name"])
        if a.empty or b.empty or len(names) != 1 or not different_devices(a, b):
            continue
        if not same_grid(ra, rb):  # a setting outside the cell ids (batch size, steps) would pass for device spread
            print(f"between_devices: {ra.name} and {rb.name} ran different configs; not paired", file=sys.stderr)
            continue
        name = names.pop()
        by_device.setdefault(name, []).append(paired_values(a, b).assign(pair=f"{ra.name} vs {rb.name}"))
        used.setdefault(name, set()).update((ra, rb))
    out = {}
    for name, parts in by_device.items():
        diffs = pd.concat(parts, ignore_index=True)
        classes = {}
        for cls, part in diffs.groupby("class", sort=True):
            kept, aside = set_aside(part)
            for why, row in aside:
                print(f"between_devices: {name}, {cls}: set aside {row.key} ({row.pair}): {why}", file=sys.stderr)
            q = np.abs(kept["log_ratio"].to_numpy())
            if len(q) >= MIN_ROWS:
                classes[str(cls)] = {
                    "rel": _round(math.expm1(float(q.max())), up=True),
                    "q95_rel": _round(math.expm1(float(np.quantile(q, QUANTILE)))),
                    "rows": int(len(q)),
                }
                classes[str(cls)] |= {"set_aside": len(aside)} if aside else {}
        run_names = sorted(used[name], key=str)
        out[name] = {
            "runs": [f"{r.name} ({';'.join(sorted(machines(_machine_rows(frames[r]))))})" for r in run_names],
            "run_pairs": len(parts),
            "measured": date.today().isoformat(),
            "classes": classes,
        }
    return out


def set_aside(part: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[str, object]]]:
    """One class's rows (``paired_values``) without those that must not set its figure, and those, with why:
    rows ``shared`` in either run, then while the largest move is more than :data:`CORROBORATE` times the
    next, the largest (module doc)."""
    shared = part["shared_a"].fillna(False).astype(bool) | part["shared_b"].fillna(False).astype(bool)
    aside = [("shared in either run: another run's jobs beside it, or no GPU lock", r) for r in part[shared].itertuples()]
    kept = part[~shared].assign(_move=np.abs(part.loc[~shared, "log_ratio"])).sort_values("_move", kind="stable")
    while len(kept) >= 2 and kept["_move"].iloc[-1] > CORROBORATE * kept["_move"].iloc[-2]:
        top = kept.iloc[-1]
        aside.append(
            (
                f"moved {math.expm1(top['_move']):.3g}, more than {CORROBORATE:g}× any other row of its class "
                f"({math.expm1(kept['_move'].iloc[-2]):.3g})",
                next(kept.iloc[[-1]].itertuples()),
            )
        )
        kept = kept.iloc[:-1]
    return kept.drop(columns="_move"), aside


def _round(x: float, up: bool = False) -> float:
    """Three significant digits; ``up``: never below ``x`` (the row that set a figure stays inside it)."""
    if not up or x <= 0:
        return float(f"{x:.3g}")
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    up_to = float(f"{math.ceil(round(x / step, 6)) * step:.3g}")
    return up_to if up_to >= x else float(f"{up_to + step:.3g}")


def load(path: Path = FIGURES) -> dict[str, dict]:
    """Device name → its figures, from the committed file (empty when there is none)."""
    if not Path(path).is_file():
        return {}
    data = yaml.safe_load(Path(path).read_text()) or {}
    return data.get("devices", {}) or {}


def figure(figures: Mapping[str, dict], device_name: str, cls: str) -> float | None:
    """The relative half-width for ``cls`` on ``device_name``; None when no figure was measured."""
    entry = figures.get(device_name, {}).get("classes", {}).get(cls)
    return float(entry["rel"]) if entry else None


def widen(value: float, low: float, high: float, rel: float | None) -> tuple[float, float]:
    """(low, high) widened to at least ``value / (1 + rel)`` .. ``value * (1 + rel)``; unchanged when ``rel`` is None."""
    if rel is None or not (math.isfinite(value) and value > 0):
        return low, high
    return min(low, value / (1 + rel)), max(high, value * (1 + rel))


def same_grid(a_dir: Path, b_dir: Path) -> bool:
    """Whether two runs' config.yaml agree on everything that shapes a measurement (not the run's name or caches)."""
    diff = config_diff(load_config(Path(a_dir)), load_config(Path(b_dir)))
    return not any(not str(k).startswith(("run", "cache_dir")) for k in diff["key"])


def coverage(a_dir: Path, b_dir: Path, figures: Mapping[str, dict] | None = None) -> pd.DataFrame:
    """Per study and measure: the share of run b's values inside run a's interval as it stands (``inside``) and
    widened by the between-device figure of a's device (``inside_across``; the same when a figure is missing)."""
    figures = load() if figures is None else figures
    a, b = classified(Path(a_dir)), classified(Path(b_dir))
    m = paired_values(a, b)
    if m.empty:
        return pd.DataFrame()
    name = ";".join(sorted(set(a["device_name"]) | set(b["device_name"])))
    if not different_devices(a, b):  # one device, or two kinds: no between-device figure applies
        figures = {}
    rels = [figure(figures, name, c) for c in m["class"]]
    across = [widen(v, lo, hi, r) for v, lo, hi, r in zip(m["value_a"], m["low_a"], m["high_a"], rels)]
    m = m.assign(
        inside=(m["low_a"] <= m["value_b"]) & (m["value_b"] <= m["high_a"]),
        inside_across=[lo <= v <= hi for (lo, hi), v in zip(across, m["value_b"])],
        figure=rels,
        abs_diff=np.abs(np.expm1(m["log_ratio"])),
    )
    rows = []
    for (study, measure), part in m.groupby(["study", "measure"], sort=True):
        rows.append(
            {
                "study": study,
                "measure": measure,
                "n": len(part),
                "inside": part["inside"].mean(),
                "inside_across": part["inside_across"].mean(),
                "median_abs_diff": part["abs_diff"].median(),
                "max_abs_diff": part["abs_diff"].max(),
            }
        )
    return pd.DataFrame(rows)


def write(figures: Mapping[str, dict], path: Path = FIGURES, keep: Iterable[str] = ()) -> Path:
    """Write ``figures`` to the committed file, keeping the entries of other device kinds named in ``keep``."""
    old = load(path)
    devices = {k: old[k] for k in keep if k in old and k not in figures} | dict(figures)
    header = (
        "# Between-device component of an interval, per device kind and class of row (runs/between_devices.py).\n"
        "# rel: the largest |b/a - 1| (in log) among rows measured on two different GPUs of this kind (q95_rel: 95th percentile);\n"
        "# recompute with: python -m cs336sys.runs.between_devices results/<run> results/<run> ... --write\n"
    )
    body = yaml.safe_dump({"quantile": QUANTILE, "devices": devices}, sort_keys=False, allow_unicode=True)
    return write_text_atomic(Path(path), header + body)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cs336sys.runs.between_devices", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="results/<run> directories of one grid, on two or more GPUs of one kind")
    parser.add_argument("--write", action="store_true", help=f"replace the figures of these runs' device kinds in {FIGURES.name}")
    parser.add_argument(
        "--check",
        nargs=2,
        type=Path,
        metavar=("RUN_A", "RUN_B"),
        help="instead: the share of RUN_B's values inside RUN_A's intervals and vice versa, within and across machines",
    )
    parser.add_argument(
        "--figures", type=Path, default=FIGURES, help="with --check: the figures file to check (default: the committed one)"
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            figures = load(args.figures)
            for a, b in (args.check, args.check[::-1]):
                print(f"## {b.name} inside {a.name}'s intervals (figures: {args.figures.name})\n")
                print(md_table(coverage(a, b, figures), ".3g"), "\n")
            return 0
        figures = estimate(args.runs)
    except (FileNotFoundError, BadRowsError) as err:  # BadRowsError: a run's CSV breaks the row contract, named
        print(f"between_devices: {err}", file=sys.stderr)
        return 2
    if not figures:
        print("between_devices: no two of these runs measured the same device kind on different GPUs", file=sys.stderr)
        return 2
    empty = [name for name, entry in figures.items() if not entry["classes"]]
    if args.write and empty:  # writing would wipe the kind's committed figures
        print(
            f"between_devices: no class has {MIN_ROWS} rows measured in two runs for {', '.join(empty)}; nothing written", file=sys.stderr
        )
        return 2
    print(yaml.safe_dump(figures, sort_keys=False, allow_unicode=True))
    if args.write:
        print(f"wrote {write(figures, keep=load().keys())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
