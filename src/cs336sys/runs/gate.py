"""What fails the regression gate (``gate-<threshold>.txt``, ``compare --fail-above``): every way a candidate
run b can be worse than its baseline a, or not comparable with it, not only a cell slower than the threshold.

The gate fails on:

- a row of a slower beyond noise in b, its ratio above the threshold (``verdict`` slower);
- a row ok in a and not ok in b: any other status, ``skipped`` included (a run whose every cell was
  skipped measured nothing: it cannot pass), or missing from b (a cell, a mode, a phase);
- a row ok in both that b gives no median or no interval for: a candidate is measured by today's code,
  which records both, so one without them is a candidate that cannot be judged;
- a study of a that b does not have (no ``<study>.csv``, or one without rows), and a cell with an ok row
  in a and none in b in any study (those without timed rows too: memory, precision); a baseline
  without any ok row (nothing to gate against);
- a setting outside the cell id that shapes a measurement and differs between the runs: a section's
  settings (``batch_size``, ``trials``, ``measure_steps``…, not its grid or its jobs' keys), the run-wide
  keys that reach a cell or its interval (:data:`RUN_SETTINGS`) and the study's ``config_keys``, from each
  run's ``config.yaml`` where both record them; and a section's setting that the rows carry as a column
  (``batch_size``, ``causal``…) where both runs' rows have it, so a config.yaml edited after the run is
  no way around it. Named with both values.

Rows that break the row contract never get here: :func:`cs336sys.pipeline.merge.load_study` refuses
their file. A baseline without intervals (a run from before them) is compared but not judged (``n/a``).
Reads frames and YAML only; no torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cs336sys import studies as S
from cs336sys.pipeline import plan
from cs336sys.pipeline.schema import study_section
from cs336sys.runs.compare_plot import cells_md, listed, md
from cs336sys.runs.compare_setup import flatten, load_config

GATE_RULES = (
    "It fails on a row slower beyond noise with a ratio above the threshold, a row ok in a and not ok (or missing) in b, "
    "a row b gives no median or interval for, a study or cell of a missing in b, and a setting that shapes a "
    "measurement and differs"
)
# run-wide keys that reach a cell's measurement (studies.cell_settings) or the interval the gate judges by
RUN_SETTINGS = ("device", "memory_fraction", "interval_floor_rel")


def threshold(text: str) -> float:
    """A gate's ratio threshold from the command line: a finite number above 0 (``nan`` would pass every slower row)."""
    value = float(text)
    if not (np.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite ratio above 0, e.g. 1.05")
    return value


@dataclass
class GateResult:
    rows: pd.DataFrame  # the comparison's rows that fail it, with a ``reason``
    studies: list[str] = field(default_factory=list)  # studies of a that b does not have
    cells: pd.DataFrame = field(default_factory=pd.DataFrame)  # (study, cell_id, a, b): ok in a, no ok row in b
    settings: pd.DataFrame = field(default_factory=pd.DataFrame)  # (setting, a, b, source) that differ
    notes: list[str] = field(default_factory=list)  # what was not checked, and why
    baseline: str = ""  # why a cannot serve as a baseline: it measured nothing

    @property
    def passed(self) -> bool:
        return self.rows.empty and not self.studies and self.cells.empty and self.settings.empty and not self.baseline

    def failures(self) -> int:
        return len(self.rows) + len(self.studies) + len(self.cells) + len(self.settings) + bool(self.baseline)

    def text(self) -> list[str]:
        """The failures, section by section, each listed up to :data:`LISTED` rows."""
        out = [f"Baseline: {self.baseline}", ""] if self.baseline else []
        if self.studies:
            out += [f"Studies of a missing in b: {', '.join(f'`{s}`' for s in self.studies)}", ""]
        if len(self.settings):
            out += ["Settings that shape a measurement and differ (a → b):", ""]
            out += [f"- `{r.setting}` ({r.source}): {r.a} → {r.b}" for r in self.settings.itertuples()] + [""]
        if len(self.cells):
            out += ["Cells ok in a with no ok row in b:", "", listed(self.cells, md), ""]
        if len(self.rows):
            out += ["Rows:", "", listed(self.rows, lambda rows: cells_md(rows, ["reason"])), ""]
        return out


def regressions(table: pd.DataFrame, fail_above: float) -> pd.DataFrame:
    """The rows of a comparison (``compare.compare_runs``) that fail the gate, with the ``reason``: slower beyond
    noise with median ratio > ``fail_above``, missing in b, ok in a and not in b, or ok in both and not judged
    for want of b's median or interval."""
    present = table["only_in"] == ""
    a_ok, b_ok = table["status_a"] == "ok", table["status_b"] == "ok"
    lacks = table["b_lacks"].fillna("").astype(str)
    reason = np.select(
        [
            (table["verdict"] == "slower") & (table["ratio"] > fail_above),
            table["only_in"] == "a",
            present & a_ok & ~b_ok,
            present & a_ok & b_ok & (lacks != ""),
        ],
        [
            f"slower beyond noise, above {fail_above:g}×",
            "missing in b",
            "ok → " + table["status_b"].fillna("").astype(str),
            "no " + lacks + " in b: not judged",
        ],
        "",
    )
    return table[reason != ""].assign(reason=reason[reason != ""])


def _ok_cells(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    parts = [df.loc[df["status"] == "ok", ["cell_id"]].assign(study=s) for s, df in frames.items() if len(df)]
    return pd.concat(parts, ignore_index=True).drop_duplicates() if parts else pd.DataFrame(columns=["cell_id", "study"])


def lost_cells(a: Mapping[str, pd.DataFrame], b: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """(study, cell_id, a, b): the cells of studies in both runs with an ok row in a and none in b, and b's statuses."""
    ok_a, ok_b = _ok_cells({s: a[s] for s in a if s in b}), _ok_cells(b)
    lost = ok_a.merge(ok_b, on=["study", "cell_id"], how="left", indicator=True)
    lost = lost.loc[lost["_merge"] == "left_only", ["study", "cell_id"]].reset_index(drop=True)
    seen: dict[tuple[str, str], set[str]] = {}
    for s, df in b.items():
        rows = df[df["cell_id"].isin(lost.loc[lost["study"] == s, "cell_id"])]
        for cell, status in zip(rows["cell_id"], rows["status"]):
            seen.setdefault((s, cell), set()).add(str(status))
    return lost.assign(a="ok", b=["/".join(sorted(seen.get(k, {"missing"}))) for k in zip(lost["study"], lost["cell_id"])])


def _setting_keys(study: str) -> tuple[set[str], set[str]]:
    """A study's section keys that shape no measurement (grid, the jobs', extra cells'), and the timing policy's."""
    spec = S.STUDIES.get(study)
    return set(plan.JOB_KEYS) | set(spec.cell_keys if spec else ()), set(plan.POLICY_KEYS)


def config_settings(config: Mapping[str, Any], studies: list[str]) -> dict[str, Any]:
    """The settings of ``config`` (a run's config.yaml) that shape a measurement of ``studies``, by dotted key:
    each one's section but its grid and job keys, the run-wide keys of :data:`RUN_SETTINGS` and its ``config_keys``."""
    chosen: dict[str, Any] = {}
    for study in studies:
        skip, _ = _setting_keys(study)
        section = config.get(study)
        spec = S.STUDIES.get(study)
        if isinstance(section, Mapping):
            chosen[study] = {k: v for k, v in section.items() if k not in skip}
        chosen |= {k: config[k] for k in spec.config_keys if k in config} if spec else {}
    chosen |= {k: config[k] for k in RUN_SETTINGS if k in config}
    return flatten(chosen)


def _row_settings(study: str) -> list[str]:
    """A study's section settings that its rows may carry as columns (the timing policy's are counts there)."""
    spec = S.STUDIES.get(study)
    if spec is None:
        return []
    skip, timing = _setting_keys(study)
    return [k for k in study_section(study, spec.axes)["properties"] if k != "grid" and k not in skip | timing]


def _equal(x: pd.Series, y: pd.Series) -> np.ndarray:
    xn, yn = pd.to_numeric(x, errors="coerce"), pd.to_numeric(y, errors="coerce")
    numeric = (xn.notna() & yn.notna()).to_numpy()
    return np.where(numeric, (xn == yn).to_numpy(), (x.astype(str) == y.astype(str)).to_numpy())


def row_settings(a: pd.DataFrame, b: pd.DataFrame, study: str) -> list[tuple[str, Any, Any, int]]:
    """(setting, a's value, b's value, cells) for each section setting whose column differs in a cell of both runs."""
    out = []
    for col in _row_settings(study):
        if col not in a or col not in b:
            continue
        va, vb = (df[["cell_id", col]].dropna().drop_duplicates("cell_id") for df in (a, b))
        m = va.merge(vb, on="cell_id", suffixes=("_a", "_b"))
        diff = m[~_equal(m[f"{col}_a"], m[f"{col}_b"])]
        for (x, y), part in list(diff.groupby([f"{col}_a", f"{col}_b"], sort=True))[:3]:
            out.append((col, x, y, part["cell_id"].nunique()))
    return out


def value_text(value: Any) -> str:
    """A setting's value as a config spells it (0.01, not 0.01000)."""
    if isinstance(value, np.generic):
        value = value.item()
    return f"{value:g}" if isinstance(value, float) else str(value)


def setting_changes(
    dirs: tuple[Path, Path], a: Mapping[str, pd.DataFrame], b: Mapping[str, pd.DataFrame]
) -> tuple[pd.DataFrame, list[str]]:
    """(setting, a, b, source) for the settings that differ between two runs (module doc), and notes on what
    could not be compared. Keys recorded by one run only (a key added since) are not compared."""
    studies = sorted(set(a) & set(b))
    configs = [load_config(d) for d in dirs]
    rows, named = [], set()
    if configs[0] is not None and configs[1] is None:  # the candidate's settings cannot be known: fail closed
        rows.append(("config.yaml", "recorded", "missing: the candidate's settings cannot be compared", str(dirs[1])))
    if None in configs:
        notes = [
            f"no config.yaml in {' and '.join(str(d) for d, c in zip(dirs, configs) if c is None)}: settings compared from the rows only"
        ]
    else:
        notes = []
        sa, sb = (config_settings(c, studies) for c in configs)
        for key in sorted(sa.keys() & sb.keys()):
            if sa[key] != sb[key]:
                rows.append((key, value_text(sa[key]), value_text(sb[key]), "config.yaml"))
                named.add(key)
    for study in studies:
        for col, x, y, n in row_settings(a[study], b[study], study):
            if f"{study}.{col}" not in named:
                rows.append((f"{study}.{col}", value_text(x), value_text(y), f"rows of {n} cell(s)"))
    return pd.DataFrame(rows, columns=["setting", "a", "b", "source"]), notes


def evaluate(
    dirs: tuple[Path, Path], a: Mapping[str, pd.DataFrame], b: Mapping[str, pd.DataFrame], table: pd.DataFrame, fail_above: float
) -> GateResult:
    """Everything that fails the gate for candidate b (frames ``b``, from ``dirs[1]``) against baseline a."""
    missing = sorted(s for s in a if s not in b or b[s].empty)
    cells = lost_cells(a, b)
    rows = regressions(table, fail_above)
    if len(rows) and len(cells):  # a cell whose rows already fail is not listed twice
        failed = set(zip(rows["study"], rows["cell_id"])) if "study" in rows else set()
        cells = cells[[(s, c) not in failed for s, c in zip(cells["study"], cells["cell_id"])]].reset_index(drop=True)
    settings, notes = setting_changes(dirs, a, b)
    both_ok = (table["status_a"] == "ok") & (table["status_b"] == "ok") & (table["only_in"] == "")
    unjudged = int((both_ok & (table["verdict"] == "n/a") & (table["b_lacks"] == "")).sum())
    if unjudged:
        notes.append(f"{unjudged} row(s) ok in both not judged: the baseline recorded no median or interval (a run before them)")
    nothing = "" if any((df["status"] == "ok").any() for df in a.values()) else "no ok row in a: nothing to gate b against"
    return GateResult(rows=rows, studies=missing, cells=cells, settings=settings, notes=notes, baseline=nothing)
