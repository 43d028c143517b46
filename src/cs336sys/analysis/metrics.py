"""Derived metrics, computed in one place for the CLI and at merge time.

Rows store raw measurements (milliseconds, bytes, analytic FLOPs); this module
turns them into TFLOP/s, MFU and tokens/s. TFLOP/s and tokens/s use the
*median* time of a phase.

Peak dense TFLOP/s per GPU and precision, from NVIDIA's datasheets (dense, i.e.
without 2:4 sparsity): H100 SXM5 / H200 SXM: FP32 66.9, TF32 494.7, BF16 989.4;
H100 PCIe: 51.2 / 378 / 756; H100 NVL: 60 / 417.5 / 835; A100: 19.5 / 156 / 312.
``fp32`` means strict FP32 (TF32 off); ``tf32`` FP32 storage with TF32 matmuls.
A device not in the table gets no MFU (empty, with the reason), never a guess.
A config's ``peak_tflops`` mapping (device-name substring → precision → TFLOP/s)
overrides or extends the table. Peak DRAM bandwidth (``PEAK_GBPS``) sits beside it, for
the bytes-moved and roofline columns (:mod:`cs336sys.analysis.roofline`), and a config's
``peak_gbps`` mapping (device-name substring → GB/s) overrides or extends that one.

FLOPs are the one raw column that is counted again here: rows of an attention core
(``columns.ATTENTION_SHAPES``: studies ``attention`` and ``flash``) get theirs from their
shape by today's convention (:mod:`cs336sys.measure.flops`), so a run measured under
an older one (backward 2× before the FlashAttention papers' 2.5×) reads right when it
is merged again; its times do not change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pandas as pd

from cs336sys.analysis.energy import add_energy
from cs336sys.analysis.roofline import add_roofline
from cs336sys.columns import ATTENTION_SHAPES
from cs336sys.measure.flops import attention_row_flops
from cs336sys.measure.gpu_state import throttled  # NVML's reasons decoded once; torch-free

# Matched as peak_gbps matches (whole words of torch.cuda.get_device_name(), longest key first).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
}


def peak_tflops(device_name: str, precision: str, overrides: Mapping[str, Mapping[str, float]] | None = None) -> float | None:
    """Dense peak TFLOP/s for ``precision`` on ``device_name``, or ``None`` if unknown."""
    for table in (overrides or {}, PEAK_TFLOPS):
        if (key := _device_key(table, device_name)) is not None and precision in table[key]:
            return float(table[key][precision])
    return None


def _device_key(table: Mapping[str, object], device_name: str) -> str | None:
    """The longest key of ``table`` found as whole words in ``device_name`` ("GH200" is not "H200")."""
    for pattern in sorted(table, key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(pattern)}(?![A-Za-z0-9])", str(device_name)):
            return pattern
    return None


# Peak DRAM (HBM, GDDR) bandwidth in GB/s (10⁹ bytes/s), from NVIDIA's datasheets: H100 SXM5 3350,
# H100 PCIe 2000, H100 NVL 3900 (H100 Tensor Core GPU datasheet); H200 SXM and NVL 4800 (H200
# datasheet); A100 80GB SXM 2039, 80GB PCIe 1935, 40GB 1555 (A100 datasheet); A10G 600 (A10: 600);
# L4 300; T4 320; V100 SXM2 and PCIe 900 (V100 datasheet); GeForce RTX 4090 1008 (its spec page).
# Matched as whole words of torch.cuda.get_device_name(), longest key first: "NVIDIA H100 PCIe" is
# the PCIe card, "NVIDIA H100 80GB HBM3" the SXM one, and "GH200" or "V100S" match nothing (not a guess).
PEAK_GBPS: dict[str, float] = {
    "H100 PCIe": 2000.0,
    "H100 NVL": 3900.0,
    "H100": 3350.0,
    "H200": 4800.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "A100-SXM4-40GB": 1555.0,
    "A100-PCIE-40GB": 1555.0,
    "A10G": 600.0,
    "L4": 300.0,
    "T4": 320.0,
    "V100": 900.0,
    "RTX 4090": 1008.0,
}


def peak_gbps(device_name: str, overrides: Mapping[str, float] | None = None) -> float | None:
    """Peak DRAM bandwidth (GB/s) of ``device_name``, or ``None`` if unknown; ``overrides`` (name → GB/s) first."""
    for table in (overrides or {}, PEAK_GBPS):
        if (key := _device_key(table, device_name)) is not None:
            return float(table[key])
    return None


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


def recount_flops(df: pd.DataFrame) -> pd.DataFrame:
    """``flops`` of the attention cores' rows counted from their shape (module doc); a row that cannot say keeps its own."""
    if not {"study", "phase", "flops"} <= set(df.columns):
        return df
    shapes = {name: ATTENTION_SHAPES[name] for name in df["study"].dropna().unique() if name in ATTENTION_SHAPES}
    if not shapes:
        return df
    out = df.assign(flops=pd.to_numeric(df["flops"], errors="coerce"))
    for name, shape in shapes.items():
        rows = out.index[out["study"] == name]
        counted = [attention_row_flops(row.get("phase"), shape(row)) for row in out.loc[rows].to_dict("records")]
        out.loc[rows, "flops"] = pd.Series(counted, index=rows, dtype=float).fillna(out.loc[rows, "flops"])
    return out


def add_derived(
    df: pd.DataFrame,
    overrides: Mapping[str, Mapping[str, float]] | None = None,
    flags: Mapping[str, float] | None = None,
    gbps_overrides: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Add ``tflops``, ``mfu_pct`` (+ ``mfu_note``), ``tokens_per_s``, the trust flags, energy and roofline columns where the inputs exist.

    An attention core's ``flops`` are counted again first (:func:`recount_flops`). ``overrides`` and
    ``gbps_overrides``: the config's ``peak_tflops`` and ``peak_gbps``, ahead of the built-in tables.
    """
    out = add_flags(df, flags)
    if out.empty:
        return out
    out = recount_flops(out)
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
    out = add_energy(out)  # tokens per joule (analysis.energy)
    out = add_roofline(out, overrides, gbps_overrides)  # bytes moved, bandwidth and the roofline (analysis.roofline)
    return out
