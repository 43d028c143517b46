"""Energy derived per row: tokens per joule for the language-model studies.

Rows store the GPU's joules per step (``energy_j`` with its interval, measure.energy); a step of
a study of kind ``lm`` (TransformerLM steps: the merge says so, ``lm``) processes ``batch_size ×
context_length`` tokens (the row's ``tokens`` where it has one), so ``tokens_per_j`` = tokens /
``energy_j``, and its interval the same tokens over the interval's high and low ends. Other
studies, rows without energy and rows whose energy was not measured stay empty. No torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from cs336sys.measure.stats import Interval, fmt_interval


def tokens_per_step(df: pd.DataFrame) -> pd.Series:
    """Tokens one step processes: the row's ``tokens``, else ``batch_size × context_length`` (NaN where neither)."""
    nan = pd.Series(float("nan"), index=df.index)
    product = pd.to_numeric(df.get("batch_size", nan), errors="coerce") * pd.to_numeric(df.get("context_length", nan), errors="coerce")
    return pd.to_numeric(df.get("tokens", nan), errors="coerce").fillna(product)


def add_energy(df: pd.DataFrame, lm: bool) -> pd.DataFrame:
    """Add ``tokens_per_j`` with ``tokens_per_j_ci_low``/``_high`` to rows that carry ``energy_j``: empty unless
    ``lm`` (the rows' study is of kind ``lm``: a step processes tokens)."""
    if df.empty or "energy_j" not in df:
        return df
    out = df.copy()
    tokens = tokens_per_step(out) if lm else pd.Series(float("nan"), index=out.index)
    nan = pd.Series(float("nan"), index=out.index)
    energy, low, high = (pd.to_numeric(out.get(c, nan), errors="coerce") for c in ("energy_j", "energy_ci_low_j", "energy_ci_high_j"))
    out["tokens_per_j"] = tokens / energy.where(energy > 0)
    out["tokens_per_j_ci_low"] = tokens / high.where(high > 0)
    out["tokens_per_j_ci_high"] = tokens / low.where(low > 0)
    return out


def _number(value: object) -> float:
    x = pd.to_numeric(pd.Series([value]), errors="coerce").iloc[0]
    return float(x) if pd.notna(x) else math.nan


def energy_interval(row: Mapping[str, Any] | pd.Series) -> Interval:
    """A row's J per step and its 95% interval (nan where not recorded)."""
    return Interval(*(_number(row.get(c)) for c in ("energy_j", "energy_ci_low_j", "energy_ci_high_j")), 0, 1)


def tokens_interval(row: Mapping[str, Any] | pd.Series) -> Interval:
    """A row's tokens per joule and its 95% interval (:func:`add_energy`; nan where not derived)."""
    return Interval(*(_number(row.get(c)) for c in ("tokens_per_j", "tokens_per_j_ci_low", "tokens_per_j_ci_high")), 0, 1)


def per_step_words(row: Mapping[str, Any] | pd.Series) -> str:
    """``312 J per step [300, 325]``, ``312 J per step (no interval)``, or "" where the row has no energy."""
    iv = energy_interval(row)
    if not math.isfinite(iv.median):
        return ""
    return fmt_interval(iv, 3).replace(" [", " J per step [", 1) if iv.bounded else f"{iv.median:.3g} J per step (no interval)"


MODE_WORDS = {"train": "training step", "inference": "inference forward"}


def power_capped(steps: pd.DataFrame) -> list[str]:
    """``the 2.7B bf16 training step (context 512, sdpa, compiled) is power-capped: 683 W, 312 J per step [300, 325]``
    for each whole-step row whose NVML reasons at the end of timing hold ``sw_power_cap``, in the rows' order.
    Watts: the metered blocks' average (``avg_power_w``), else NVML's reading at the end of timing; the joules
    where the row has them (runs before the energy columns, blocks too short: the watts alone)."""
    if steps.empty or "end_throttle_reasons" not in steps:
        return []
    capped = steps[steps["end_throttle_reasons"].fillna("").astype(str).str.contains("sw_power_cap")]
    out = []
    for _, r in capped.iterrows():
        watts = _number(r.get("avg_power_w"))
        watts = watts if math.isfinite(watts) else _number(r.get("end_power_w"))
        what = " ".join(str(r[c]) for c in ("size", "precision") if c in r and pd.notna(r[c]))
        extra = [f"context {r['context_length']}" if pd.notna(r.get("context_length")) else "", str(r.get("impl") or "")]
        extra += ["compiled" if _number(r.get("compile")) == 1 else "", "CUDA graphs" if _number(r.get("cuda_graphs")) == 1 else ""]
        extra = [e for e in extra if e and e != "nan"]
        step = MODE_WORDS.get(str(r.get("mode")), "step") + (f" ({', '.join(extra)})" if extra else "")
        power = f"{watts:.0f} W" if math.isfinite(watts) else "power not recorded"
        joules = per_step_words(r)
        out.append(f"the {what} {step} is power-capped: {power}" + (f", {joules}" if joules else ""))
    return out
