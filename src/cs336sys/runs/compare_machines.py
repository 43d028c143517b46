"""Whether the rows of two compared runs were measured on one device or two, and what that does.

A run's interval covers a rerun on its own device, not on another one. :mod:`cs336sys.runs.compare`
asks this module per row (its ``gpu_uuid``/``pass_gpu_uuid``; the host for CPU runs): on two devices
the ratio's interval is widened by the between-device figure of the row's class
(:mod:`cs336sys.runs.between_devices`), and a host-bound row (GPU busy < 90% of the step in either
run) whose own intervals do not overlap is ``host-dependent``, not slower or faster, with the host
probe (``host_launch_us``) and the GPU time as evidence; the gate ignores it. Unless both runs
replayed its phases as CUDA graphs and that GPU time moved beyond its interval widened by the
``gpu time`` figure: then the GPU's work changed, and the row is slower or faster (and gated).
Reads frames only; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from cs336sys.analysis.passes import HOST_PROBE
from cs336sys.columns import GPU_TIME_PREFIX
from cs336sys.measure.stats import Interval, fmt_interval
from cs336sys.runs import between_devices
from cs336sys.runs.between_devices import MIN_GPU_BUSY, different_devices, row_class, widen
from cs336sys.runs.repeatability import EAGER

HOST_DEPENDENT = "host-dependent"


@dataclass(frozen=True)
class Machines:
    """Whether two runs ran on different devices, and the between-device figures (class → relative
    half-width) of their common device kind; empty when the kinds differ or none was measured."""

    differ: bool = False
    figures: Mapping[str, float] = field(default_factory=dict)
    device_name: str = ""

    def rows_differ(self, gpus_a: pd.Series, gpus_b: pd.Series) -> np.ndarray:
        """Per row: measured on different GPUs in the two runs (each row's own GPUs, :func:`row_gpus`), else as the runs are."""
        ga, gb = gpus_a.fillna("").astype(str).to_numpy(), gpus_b.fillna("").astype(str).to_numpy()
        out = np.where((ga == "") | (gb == ""), self.differ, ga != gb)  # one GPU each, the usual case: compared as text
        for i in np.flatnonzero((np.char.find(ga.astype(str), ";") >= 0) | (np.char.find(gb.astype(str), ";") >= 0)):
            sa, sb = set(ga[i].split(";")) - {""}, set(gb[i].split(";")) - {""}
            out[i] = not (sa & sb) if sa and sb else self.differ
        return out.astype(bool)

    def across(self, study: str, busy: np.ndarray, ratio, low, high, differ: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per row of a study: the between-device figure applied (nan: none), the ratio's interval widened by
        it, and whether the row is host-bound on two devices (GPU busy share ``busy``, the lower of the runs')."""
        # a class without a figure (no busy share: a mode measured before an OOM, an old run) takes the kind's widest
        widest = max(self.figures.values(), default=np.nan)
        figure = np.array(
            [self.figures.get(row_class(EAGER, study, x), widest) if d else np.nan for x, d in zip(busy, differ)], dtype=float
        )
        wide = [widen(r, lo, hi, None if np.isnan(f) else f) for r, lo, hi, f in zip(ratio, low, high, figure)]
        lows, highs = (np.array([w[i] for w in wide], dtype=float).reshape(-1) for i in (0, 1))
        return figure, lows, highs, (np.asarray(busy) < MIN_GPU_BUSY) & differ

    def gpu_verdicts(self, m: pd.DataFrame, differ: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row of a merged comparison: the GPU-time ratio b/a's interval ([b.low / a.high, b.high / a.low],
        widened once by the ``gpu time`` figure where the row's devices differ) and the verdict it gives where
        both runs replayed the row's phases as CUDA graphs: ``slower``/``faster`` where it excludes 1, else ""."""
        names = [f"{GPU_TIME_PREFIX}{c}_{side}" for side in "ab" for c in ("median_ms", "ci_low_ms", "ci_high_ms")]
        if not all(n in m for n in names):
            nan = np.full(len(m), np.nan)
            return np.full(len(m), "", dtype=object), nan, nan
        med_a, lo_a, hi_a, med_b, lo_b, hi_b = (pd.to_numeric(m[n], errors="coerce").to_numpy(dtype=float) for n in names)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio, low, high = med_b / med_a, lo_b / hi_a, hi_b / lo_a
        wide = [widen(r, lo, hi, self.figures.get("gpu time") if d else None) for r, lo, hi, d in zip(ratio, low, high, differ)]
        low, high = (np.array([w[i] for w in wide], dtype=float).reshape(-1) for i in (0, 1))
        verdict = np.select([low > 1, high < 1], ["slower", "faster"], "").astype(object)  # nan compares False: ""
        return verdict, low, high


def machines_of(a: Mapping[str, pd.DataFrame], b: Mapping[str, pd.DataFrame], figures: Mapping[str, dict] | None = None) -> Machines:
    """:class:`Machines` for two runs' frames (as :func:`load_run` returns them). The figures of their common
    device kind come along even when the runs share a GPU: a row one run measured on another GPU of the
    host (``--resources gpu=2``) is a row of two devices."""
    rows_a, rows_b = (pd.concat(list(f.values()), ignore_index=True) if f else pd.DataFrame() for f in (a, b))
    differ = different_devices(rows_a, rows_b)
    names = between_devices.device_names(rows_a) | between_devices.device_names(rows_b)
    if len(names) != 1:  # different kinds of device: the comparison is the point, there is no figure to add
        return Machines(differ=differ, device_name=" vs ".join(sorted(names)))
    name = next(iter(names))
    figures = between_devices.load() if figures is None else figures
    classes = figures.get(name, {}).get("classes", {})
    return Machines(differ=differ, figures={c: float(v["rel"]) for c, v in classes.items()}, device_name=name)


def row_gpus(df: pd.DataFrame) -> pd.Series:
    """Each row's GPUs, ``;``-joined: its own (``gpu_uuid``) and its passes' (``pass_gpu_uuid``); "" where unnamed."""
    parts = [df[c].fillna("").astype(str) for c in ("gpu_uuid", "pass_gpu_uuid") if c in df]
    if not parts:
        return pd.Series("", index=df.index)
    return pd.Series(
        [";".join(sorted({g for v in vals for g in v.split(";") if g and g != "nan"})) for vals in zip(*parts)], index=df.index
    )


def evidence(host_ratio: float, gpu_ratio: float) -> str:
    """The note of a host-dependent row: how the host probe and the GPU time moved (b/a)."""
    parts = [f"host µs per launch {host_ratio:.2f}× b/a" if np.isfinite(host_ratio) else "no host probe in both runs"]
    if np.isfinite(gpu_ratio):
        parts.append(f"GPU time {gpu_ratio:.3f}×")
    return "host-bound on two machines: " + ", ".join(parts)


def _run_probe(frames: Mapping[str, pd.DataFrame]) -> float:
    """The run's host probe: the median of its rows' µs per launch (nan when it recorded none)."""
    values = [pd.to_numeric(df[HOST_PROBE], errors="coerce").to_numpy(dtype=float) for df in frames.values() if HOST_PROBE in df]
    x = np.concatenate(values) if values else np.empty(0)
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def machines_text(machines: Machines, runs: tuple[Mapping[str, pd.DataFrame], ...]) -> list[str]:
    """The paragraph saying whether the runs share a machine, what that does to the intervals, and how fast each host launched."""
    probes = [_run_probe(frames) for frames in runs]
    host = (
        f"Host probe (µs per launch, median over rows): a {probes[0]:.3g}, b {probes[1]:.3g} ({probes[1] / probes[0]:.3g}× b/a)."
        if all(np.isfinite(probes))
        else "Host probe: not recorded in both runs (runs before it)."
    )
    if not machines.differ:
        others = (
            ", except rows the two runs measured on different GPUs (a two-GPU run's other GPU): those compare two devices"
            + (
                ", widened by their class's between-device figure"
                if machines.figures
                else f" (no between-device figure for {machines.device_name})"
            )
            + f" and, host-bound, are `{HOST_DEPENDENT}` where they moved"
        )
        return [f"**One machine** (the runs share a GPU): intervals as measured{others}. {host}", ""]
    if not machines.figures:
        why = (
            f"no between-device figure is measured for {machines.device_name}"
            if " vs " not in machines.device_name
            else f"different kinds of device ({machines.device_name})"
        )
        return [
            f"**Two machines** (no GPU in common); {why}, so intervals are as measured. Host-bound rows whose intervals "
            f"do not overlap are `{HOST_DEPENDENT}`. {host}",
            "",
        ]
    figures = ", ".join(f"{c} ±{v:.3g}" for c, v in sorted(machines.figures.items()))
    return [
        f"**Two machines** of one kind ({machines.device_name}; no GPU in common): each ratio's interval is widened by the "
        f"between-device figure of its class ({figures}; `cs336sys/runs/between_devices.yaml`), and host-bound rows "
        f"whose own intervals do not overlap are `{HOST_DEPENDENT}`, not slower or faster. {host}",
        "",
    ]


ENERGY_COLUMNS = [
    "energy_a_j",
    "energy_a_low_j",
    "energy_a_high_j",
    "energy_b_j",
    "energy_b_low_j",
    "energy_b_high_j",
    "energy_ratio",
    "energy_ratio_low",
    "energy_ratio_high",
]
ENERGY_TEXT = (
    "The GPU's joules per step in each run (NVML's energy counter over the timed blocks, whole-step rows; "
    "`measure/energy.py`) and their ratio b/a with the interval [b.low / a.high, b.high / a.low], as measured: "
    "on two kinds of GPU the difference is the point, so no between-device figure widens it."
)


def energy_ratios(m: pd.DataFrame) -> dict[str, pd.Series]:
    """Per row of a merged comparison (``_a``/``_b`` columns): each run's J per step [95%] and the ratio b/a with its
    interval by interval arithmetic; nan where either run has no energy or no interval."""

    def col(name: str) -> pd.Series:
        return pd.to_numeric(m[name], errors="coerce") if name in m else pd.Series(np.nan, index=m.index, dtype=float)

    (a, a_low, a_high), (b, b_low, b_high) = ([col(f"{c}_{s}") for c in ("energy_j", "energy_ci_low_j", "energy_ci_high_j")] for s in "ab")
    ratio = (b / a.where(a > 0), b_low / a_high.where(a_high > 0), b_high / a_low.where(a_low > 0))
    return dict(zip(ENERGY_COLUMNS, (a, a_low, a_high, b, b_low, b_high, *ratio)))


def energy_table(t: pd.DataFrame) -> pd.DataFrame:
    """The rows of a comparison table with energy in both runs: J per step of a and of b [95%], ratio b/a [95%]."""
    if "energy_ratio" not in t:
        return pd.DataFrame()
    rows = t[pd.to_numeric(t["energy_ratio"], errors="coerce").notna()]

    def iv(names: list[str]) -> list[str]:
        return [fmt_interval(Interval(*(float(x) for x in v), 0, 1), 3) for v in zip(*(rows[n] for n in names))]

    out = {k: rows[k] for k in ("cell_id", "mode", "phase")}
    out |= {f"J/step {s} [95%]": iv([f"energy_{s}_j", f"energy_{s}_low_j", f"energy_{s}_high_j"]) for s in "ab"}
    out["ratio b/a [95%]"] = iv(["energy_ratio", "energy_ratio_low", "energy_ratio_high"])
    return pd.DataFrame(out)
