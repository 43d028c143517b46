"""Derived metrics, computed in one place for the CLI and at merge time.

Rows store raw measurements (milliseconds, bytes, analytic FLOPs); this module
turns them into TFLOP/s, MFU and tokens/s. TFLOP/s and tokens/s use the
*median* time of a phase; MFU divides by the GPU's peak (:mod:`cs336sys.analysis.peaks`).
An attention core's FLOPs are counted again from its shape first
(:func:`cs336sys.analysis.roofline.recount_flops`), and tokens per joule
(:mod:`cs336sys.analysis.energy`) and the roofline columns follow.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from cs336sys.analysis.energy import add_energy
from cs336sys.analysis.peaks import peak_tflops
from cs336sys.analysis.roofline import CoreShape, add_roofline, recount_flops
from cs336sys.measure.gpu_state import throttled  # NVML's reasons decoded once; torch-free

FLAG_DEFAULTS = {"noisy_rel": 0.05, "min_gpu_busy": 0.9, "min_clock_frac": 0.9}


def add_flags(df: pd.DataFrame, flags: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Add the trust columns of timed rows: ``ci_rel``, ``noisy``, ``host_bound``, ``throttled``, ``below_clocks``, ``shared``.

    ``ci_rel`` is the 95% interval's half-width over the median; ``noisy`` where it
    exceeds ``noisy_rel``. ``host_bound`` where the GPU was busy for less than
    ``min_gpu_busy`` of the step (empty where that was not measured, e.g. on CPU).
    ``throttled`` where NVML reported a slowing reason (power, thermal) at the start
    or end of timing; ``below_clocks`` where the SM clock ended under
    ``min_clock_frac`` of its maximum. ``shared`` where the GPU was not locked
    (``gpu_lock`` "none: …") or jobs of another run were busy during the measurement
    (``concurrent_jobs`` > 0, pipeline.hostjobs): a number that may be contaminated.
    Thresholds: the config's ``flags``.
    """
    t = {**FLAG_DEFAULTS, **(flags or {})}
    out = df.copy()
    if "ci_low_ms" in out and "median_ms" in out:
        low, high, med = (pd.to_numeric(out[c], errors="coerce") for c in ("ci_low_ms", "ci_high_ms", "median_ms"))
        out["ci_rel"] = (high - low) / 2 / med
        out["noisy"] = (out["ci_rel"] > t["noisy_rel"]).where(out["ci_rel"].notna())
    if "gpu_busy_frac" in out:
        busy = pd.to_numeric(out["gpu_busy_frac"], errors="coerce")
        out["host_bound"] = (busy < t["min_gpu_busy"]).where(busy.notna())
    reasons = [c for c in ("start_throttle_reasons", "end_throttle_reasons") if c in out]
    if reasons:
        out["throttled"] = out[reasons].apply(lambda row: any(throttled(str(v)) for v in row if pd.notna(v)), axis=1)
    if "end_sm_clock_mhz" in out and "max_sm_clock_mhz" in out:
        sm, top = (pd.to_numeric(out[c], errors="coerce") for c in ("end_sm_clock_mhz", "max_sm_clock_mhz"))
        out["below_clocks"] = (sm < t["min_clock_frac"] * top).where(sm.notna() & top.notna())
    if "concurrent_jobs" in out or "gpu_lock" in out:
        others = pd.to_numeric(out.get("concurrent_jobs", pd.Series(index=out.index, dtype=float)), errors="coerce").fillna(0) > 0
        lock = out.get("gpu_lock", pd.Series("", index=out.index)).fillna("").astype(str)
        out["shared"] = others | (lock.str.startswith("none") & (lock != "none: cpu cell"))
    return out


def add_derived(
    df: pd.DataFrame,
    overrides: Mapping[str, Mapping[str, float]] | None = None,
    flags: Mapping[str, float] | None = None,
    gbps_overrides: Mapping[str, float] | None = None,
    *,
    shape: CoreShape | None = None,
    lm: bool = False,
) -> pd.DataFrame:
    """Add ``tflops``, ``mfu_pct`` (+ ``mfu_note``), ``tokens_per_s``, the trust flags, energy and roofline columns where the inputs exist.

    ``overrides`` and ``gbps_overrides``: the config's ``peak_tflops`` and ``peak_gbps``, ahead of the
    built-in tables. What the rows' study says of them (the analysis knows no study): ``shape``, the
    attention core a row timed (``Study.attention_shape``; its ``flops`` are counted again first,
    :func:`recount_flops`); ``lm``, whether a step processes batch × context tokens (tokens per joule).
    """
    out = add_flags(df, flags)
    if out.empty:
        return out
    out = recount_flops(out, shape)
    median_s = pd.to_numeric(out.get("median_ms"), errors="coerce") / 1e3
    if "flops" in out:
        out["tflops"] = pd.to_numeric(out["flops"], errors="coerce") / median_s / 1e12
        if "precision" in out and "device_name" in out:
            peaks = [peak_tflops(dev, prec, overrides) for dev, prec in zip(out["device_name"], out["precision"])]
            peak_arr = np.array([np.nan if p is None else p for p in peaks], dtype=float)
            out["mfu_pct"] = 100.0 * out["tflops"].to_numpy(dtype=float) / peak_arr
            out["mfu_note"] = [
                "" if p is not None else f"no peak TFLOP/s known for {dev!r} at {prec}"
                for p, dev, prec in zip(peaks, out["device_name"], out["precision"])
            ]
    if "tokens" in out:
        out["tokens_per_s"] = pd.to_numeric(out["tokens"], errors="coerce") / median_s
    out = add_energy(out, lm)  # tokens per joule (analysis.energy)
    out = add_roofline(out, overrides, gbps_overrides, shape)  # bytes moved, bandwidth and the roofline (analysis.roofline)
    return out
