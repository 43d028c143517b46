"""What every answer of ``answers.md`` shares: the run's tables, number formats, links, "not measured".

A number is written with its 95% interval where the row has one; an answer that shows
a number without one ends with "(no interval recorded)" (runs measured before the
intervals existed). Ratios go through :func:`cs336sys.analysis.findings.describe_ratio`,
as in the report: a finding where the interval excludes 1, "no difference within ±x%"
where it holds 1 and is tight, "unbounded" only where sampling ran out of its time
budget (with the reason), otherwise "no significant difference" with what widened it.
Every "not measured" answer starts with :data:`NOT_MEASURED`, so a page over several
runs (:mod:`cs336sys.handout.page`) can take each answer from a run that measured it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cs336sys.analysis.findings import MIB, describe_ratio, stopped_on_budget
from cs336sys.analysis.tables import OK
from cs336sys.measure.stats import Interval
from cs336sys.models.sizes import known_sizes, parameter_count
from cs336sys.studies import report_module

NO_INTERVAL = "(no interval recorded)"
NOT_MEASURED = "_not measured in this run"  # how every answer that the run could not give begins


@dataclass
class Run:
    """One run's merged tables (study → rows, every status kept) and its recorded settings."""

    name: str
    frames: Mapping[str, pd.DataFrame]
    config: Mapping[str, Any] = field(default_factory=dict)
    _facts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def facts(self, study: str) -> Any:
        """What the answers quote of ``study`` (its report's typed ``facts``) if any cell ran, else None; computed once."""
        if study not in self._facts:
            df = self.rows(study)
            self._facts[study] = report_module(study).facts(df) if df is not None else None
        return self._facts[study]

    def rows(self, study: str) -> pd.DataFrame | None:
        """The study's rows if any cell ran (status ok), else None."""
        df = self.frames.get(study)
        if df is None or df.empty or "status" not in df or not (df["status"] == OK).any():
            return None
        return df

    def absent(self, study: str, enable: str) -> str:
        """The "not measured" line for a question that needs ``study``: why, and what to set."""
        df = self.frames.get(study)
        if df is not None and not df.empty and "status" in df and not (df["status"] == OK).any():
            errors = sorted({str(e).splitlines()[0] for e in df.get("error", pd.Series(dtype=str)) if str(e).strip()})
            why = f"every `{study}` cell ended {'/'.join(sorted(set(df['status'])))}" + (f" ({errors[0]})" if errors else "")
            return f"{NOT_MEASURED}: {why}._"
        if df is not None and not df.empty:
            return not_measured(enable or f"`{study}`")
        return not_measured(f"`{study}` (`studies:`){', ' + enable if enable else ''}")

    def figure(self, study: str, prefix: str) -> str:
        """A markdown link to the first figure of ``study`` whose name starts with ``prefix`` ("" if none)."""
        df = self.rows(study)
        names = [name for name, _ in report_module(study).figures(df, self.name)] if df is not None else []
        hits = [n for n in names if n.startswith(prefix)]
        return f"[figure](figures/{study}/{hits[0]}.png)" if hits else ""

    def sizes(self) -> dict:
        return known_sizes(self.config.get("extra_sizes"))


def not_measured(what: str, why: str = "") -> str:
    return f"{NOT_MEASURED}: enable {what} in the config{f' ({why})' if why else ''}._"


def cannot_measure(why: str) -> str:
    """The "not measured" line for a question this run's device cannot answer (no setting would help)."""
    return f"{NOT_MEASURED}: {why}._"


def measured(answer: str) -> bool:
    """False for a "not measured in this run" answer."""
    return not answer.startswith(NOT_MEASURED)


def section(study: str) -> str:
    """A markdown link to the study's section of the run's report."""
    return f"[report](report.md#study-{study})"


def links(*parts: str) -> str:
    shown = [p for p in parts if p]
    return f" ({', '.join(shown)})" if shown else ""


def num(x: float, sig: int = 4) -> str:
    """``sig`` significant digits, without exponent notation for large values."""
    if not math.isfinite(x):
        return "—"
    return f"{x:.0f}" if abs(x) >= 10**sig else f"{x:.{sig}g}"


def mib(nbytes: float) -> str:
    return f"{num(nbytes / MIB)} MiB"


def times(ratio: float) -> str:
    """A ratio without an interval: ``1.19×``."""
    return f"{ratio:.3g}×" if math.isfinite(ratio) else "—"


def pct(share: float) -> str:
    return f"{100 * share:.3g}%" if math.isfinite(share) else "—"


def device(*frames: pd.DataFrame | None) -> str:
    """The device names in the rows, joined."""
    names = sorted({str(v) for df in frames if df is not None and "device_name" in df for v in df["device_name"].dropna() if str(v)})
    return " / ".join(names) or "an unrecorded device"


class Note:
    """Formats one answer's numbers and remembers whether any of them lacked an interval.

    ``frames``: the tables the answer reads; where they carry intervals, a ratio without
    one (an interval reaching 0 ms leaves it unbounded) is no finding, not an old run.
    """

    def __init__(self, *frames: pd.DataFrame | None) -> None:
        self.bare = False
        self.recorded = any(df is not None and "ci_low_ms" in df and df["ci_low_ms"].notna().any() for df in frames)

    def ms(self, row: Mapping | pd.Series) -> str:
        """A row's median with its 95% interval: ``18.24 ms [18.1, 18.4]``."""
        low, high = row.get("ci_low_ms", np.nan), row.get("ci_high_ms", np.nan)
        if pd.isna(low) or pd.isna(high):
            self.bare = True
            return f"{num(float(row['median_ms']))} ms"
        return f"{num(float(row['median_ms']))} ms [{num(float(low))}, {num(float(high))}]"

    def ratio(self, row: Mapping | pd.Series, *, faster: str = "", slower: str = "", budget: bool = False, why: str = "") -> str:
        """A row of ``paired_ratios``: ``1.66× [1.60, 1.72]``, "no difference within ±x% (…)" or why it is no finding.

        ``faster``/``slower``: the words after a finding above/below 1; ``budget``: sampling ran
        out of its time budget; ``why``: what widened the interval (:func:`describe_ratio`).
        """
        interval = Interval(float(row["ratio"]), float(row["ratio_low"]), float(row["ratio_high"]), 0, 1)
        text = describe_ratio(interval, faster=faster, slower=slower, budget=budget, why=why)
        if text.endswith("(no interval)"):
            bare = text.removesuffix(" (no interval)")
            if self.recorded:  # an interval reaching 0 ms leaves the ratio without one: say so, and why
                reason = f"; {why}" if why else ""
                return f"no significant difference ({bare}; no interval: one of the two medians' intervals reaches 0 ms{reason})"
            self.bare = True
            return bare
        return text

    def compared(self, row: Mapping | pd.Series, *, faster: str = "", slower: str = "", why: str = "") -> str:
        """A row of an e2e comparison (its facts' ``compared``): the paired ratio, or the two cells' ratio and why they were not paired."""
        note = row.get("pair_note")
        note = "" if note is None or (isinstance(note, float) and math.isnan(note)) else str(note)
        if row.get("source") == "paired" and not math.isfinite(float(row.get("ratio", math.nan))):
            return f"not paired ({note})" if note else "—"
        budget = stopped_on_budget(row.get("stop_reason"))
        moved = _pass_ratios_moved(row.get("pass_ratios"))
        if moved:  # the width is the ratio's own move between passes, not a shortage of samples
            why, budget = (f"{why}; {moved}" if why else moved), False
        text = self.ratio(row, faster=faster, slower=slower, budget=budget, why=why)
        return f"{text} (from the two cells' intervals; not paired: {note})" if note else text

    def end(self, text: str) -> str:
        return f"{text} {NO_INTERVAL}" if self.bare else text


def _pass_ratios_moved(value: object, beyond: float = 0.05) -> str:
    """Words for a paired ratio that moved between passes by more than ``beyond`` ("" otherwise)."""
    ratios = [float(x) for x in str(value).split(";") if x and x != "nan"] if isinstance(value, (str, float)) else []
    ratios = [r for r in ratios if math.isfinite(r) and r > 0]
    if len(ratios) < 2 or max(ratios) / min(ratios) - 1 <= beyond:
        return ""
    listed = ", ".join(f"{r:.3g}" for r in ratios)
    return f"the ratio itself moved between passes ({listed}×): on this host it depends on how fast the CPU was at the time"


def size_order(run: Run, names: Iterable[str]) -> list[str]:
    """Model sizes from smallest to largest (by parameter count; unknown names first, by name)."""
    table = run.sizes()
    return sorted(set(names), key=lambda s: (parameter_count(table[s]) if s in table else -1, str(s)))


_NAMESPACES = re.compile(r"\(anonymous namespace\)::|\b(?:at_cuda_detail|at|c10|std|cutlass|cublasLt|cub|detail|native|binary_internal)::")
_OPS = re.compile(r"[A-Za-z_]\w*(?:Functor\w*|_kernel\w*|Ops|_functor)\b")
_TYPES = {"float", "double", "half", "int", "long", "bool", "char", "short", "unsigned"}
_GENERIC = {
    "gpu_kernel_impl_nocast",
    "gpu_kernel_impl",
    "AUnaryFunctor",
    "BUnaryFunctor",
    "BinaryFunctor",
    "func_wrapper_t",
    "gpu_index_kernel",
}


def kernel_name(name: str, width: int = 160) -> str:
    """A kernel's name for a sentence, in backticks: a C++ template kernel as ``kernel<its operation>``."""
    name = str(name)
    if not name.startswith("void "):  # cuBLAS/cuDNN names, memcpy, memset: already a plain name
        return f"`{name[:width]}{'…' if len(name) > width else ''}`"
    text = _NAMESPACES.sub("", name.removeprefix("void "))
    base = re.match(r"[A-Za-z_]\w*", text)
    if base is None:
        return f"`{text[:width]}`"
    rest = text[base.end() :]
    ops = [op for op in _OPS.findall(rest) if op not in _GENERIC and op != base.group(0)]
    arg = re.match(r"<([A-Za-z_]\w*)", rest)
    inner = ops[0] if ops else (arg.group(1) if arg and arg.group(1) not in _TYPES else "")
    return f"`{base.group(0)}<{inner}>`" if inner else f"`{base.group(0)}`"


def listing(items: Iterable[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""


def first(df: pd.DataFrame, **where) -> pd.Series | None:
    """The first row with column == value for each keyword, or None."""
    mask = np.ones(len(df), dtype=bool)
    for col, value in where.items():
        if col not in df:
            return None
        mask &= (df[col] == value).to_numpy()
    hits = mask.nonzero()[0]
    return df.iloc[hits[0]] if len(hits) else None  # one row taken, not every matching one (wide frames)
