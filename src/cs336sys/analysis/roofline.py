"""Bytes moved, achieved bandwidth and the roofline: which roof binds a row. Torch-free.

A row's ``bytes_moved`` are counted from its shape as its FLOPs are
(:mod:`cs336sys.measure.bytes_moved`; an attention core from its shape, which its study's
``attention_shape`` reads off the row and the caller passes in as ``shape``; the optimizer step
from ``params``), never measured; ``bytes_note`` says why a row has none. The FLOPs of an
attention core's rows are counted again from the same shape (:func:`recount_flops`).
From them and the median time:

- ``achieved_gbps`` = bytes_moved / median time (GB/s, 10⁹ B/s);
- ``peak_gbps``, ``bw_frac`` = achieved / peak DRAM bandwidth (:data:`cs336sys.analysis.peaks.PEAK_GBPS`);
- ``arith_intensity`` = flops / bytes_moved (FLOP/byte);
- ``roof_tflops`` = min(peak TFLOP/s, intensity × peak bandwidth): the most the roofline
  model allows at that intensity, and ``bound``: ``memory`` where the bandwidth roof is the
  lower one (intensity below the ridge, peak TFLOP/s / peak bandwidth), else ``compute``.

``roofline_note`` says why a column is empty: bytes not counted, no time, no FLOPs (the
optimizer step counts no matmul FLOPs), or a device or precision without a known peak.
A fused kernel's bytes are a lower bound, so its ``bw_frac`` is too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from cs336sys.analysis.peaks import peak_gbps, peak_tflops
from cs336sys.columns import TIMED_KINDS
from cs336sys.measure.bytes_moved import attention_row_bytes, optimizer_row_bytes
from cs336sys.measure.flops import attention_row_flops

# A study's rule for the attention core a row timed: (batch, heads, seq_len, head_dim, causal) from its columns
CoreShape = Callable[[Mapping[str, Any]], tuple[Any, ...]]

COLUMNS = ("bytes_moved", "bytes_note", "achieved_gbps", "peak_gbps", "bw_frac", "arith_intensity", "roof_tflops", "bound", "roofline_note")


def recount_flops(df: pd.DataFrame, shape: CoreShape | None) -> pd.DataFrame:
    """``flops`` of an attention core's rows counted from their ``shape`` by today's convention
    (:mod:`cs336sys.measure.flops`), so a run measured under an older one (backward 2× before the
    FlashAttention papers' 2.5×) reads right when merged again; a row that cannot say keeps its own."""
    if shape is None or not {"phase", "flops"} <= set(df.columns) or df.empty:
        return df
    counted = [attention_row_flops(row.get("phase"), shape(row)) for row in df.to_dict("records")]
    flops = pd.to_numeric(df["flops"], errors="coerce")
    return df.assign(flops=pd.Series(counted, index=df.index, dtype=float).fillna(flops))


def row_bytes(row: Mapping[str, object], shape: CoreShape | None = None) -> tuple[float | None, str]:
    """(bytes moved, why empty) of one result row: an attention core's phase (its study's ``shape``) or an optimizer step."""
    kind = row.get("kind")
    if isinstance(kind, str) and kind not in TIMED_KINDS:
        return None, f"a row of kind {kind!r} (a paired ratio, no time of its own)"
    if shape is not None:
        return attention_row_bytes(row, shape(row))
    if row.get("phase") == "optimizer_step":
        return optimizer_row_bytes(row)
    return None, f"study {row.get('study')!r}, phase {row.get('phase')!r}: bytes not counted (attention cores and the optimizer step are)"


def _number(value: object) -> float:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return out


def _roofline(row: Mapping[str, object], shape: CoreShape | None, tflops_overrides, gbps_overrides) -> dict[str, object]:
    counted, bytes_note = row_bytes(row, shape)
    moved = math.nan if counted is None else counted
    seconds, flops = _number(row.get("median_ms")) / 1e3, _number(row.get("flops"))
    device, precision = str(row.get("device_name") or ""), str(row.get("precision") or "")
    bw, tf = peak_gbps(device, gbps_overrides), peak_tflops(device, precision, tflops_overrides)
    achieved = moved / seconds / 1e9 if seconds > 0 else math.nan
    intensity = flops / moved if moved > 0 else math.nan
    why = []
    if counted is None:
        why.append(f"bytes not counted: {bytes_note}")
    elif not seconds > 0:
        why.append(f"no median time (status {row.get('status')!r})")
    if counted is not None and not flops > 0:
        why.append(f"no FLOPs counted for phase {row.get('phase')!r} (matmul FLOPs only)")
    if bw is None:
        why.append(f"no peak bandwidth known for {device!r}")
    if tf is None and flops > 0:
        why.append(f"no peak TFLOP/s known for {device!r} at {precision}")
    roof, bound = math.nan, None
    if bw is not None and tf is not None and intensity > 0:
        slope = intensity * bw / 1e3  # FLOP/byte × GB/s = GFLOP/s
        roof, bound = min(tf, slope), ("memory" if slope < tf else "compute")
    return {
        "bytes_moved": moved,
        "bytes_note": bytes_note,
        "achieved_gbps": achieved,
        "peak_gbps": math.nan if bw is None else bw,
        "bw_frac": achieved / bw if bw else math.nan,
        "arith_intensity": intensity,
        "roof_tflops": roof,
        "bound": bound,
        "roofline_note": "; ".join(why),
    }


def add_roofline(
    df: pd.DataFrame,
    tflops_overrides: Mapping[str, Mapping[str, float]] | None = None,
    gbps_overrides: Mapping[str, float] | None = None,
    shape: CoreShape | None = None,
) -> pd.DataFrame:
    """``df`` with :data:`COLUMNS` (module doc); overrides as for ``peak_tflops`` and ``peak_gbps``; ``shape``: the attention core's."""
    if df.empty:
        return df
    derived = pd.DataFrame([_roofline(row, shape, tflops_overrides, gbps_overrides) for row in df.to_dict("records")], index=df.index)
    return df.drop(columns=[c for c in COLUMNS if c in df]).join(derived)


def with_roofline(df: pd.DataFrame, shape: CoreShape | None = None) -> pd.DataFrame:
    """``df`` as merged, with the roofline columns derived where a run merged before they existed lacks them.

    Such a run's FLOPs (and TFLOP/s) are counted again first, as a merge today would: its backward may
    still be counted at 2× its forward, and intensities of two runs must follow one convention.
    ``shape``: the study's attention core (``Study.attention_shape``).
    """
    if df.empty or "bytes_moved" in df:
        return df
    out = recount_flops(df, shape)
    if "tflops" in out:
        out = out.assign(
            tflops=pd.to_numeric(out["flops"], errors="coerce") / (pd.to_numeric(out["median_ms"], errors="coerce") / 1e3) / 1e12
        )
    return add_roofline(out, shape=shape)


def has_points(df: pd.DataFrame, shape: CoreShape | None = None) -> bool:
    """Whether any ok row has both an arithmetic intensity and a TFLOP/s to plot (``shape``: as for :func:`with_roofline`)."""
    return not _points(df, shape).empty


def _points(df: pd.DataFrame, shape: CoreShape | None = None) -> pd.DataFrame:
    if df.empty or "tflops" not in df:
        return df.iloc[0:0]
    df = with_roofline(df, shape)
    ok = df[df["status"] == "ok"] if "status" in df else df
    x, y = pd.to_numeric(ok["arith_intensity"], errors="coerce"), pd.to_numeric(ok["tflops"], errors="coerce")
    return ok[(x > 0) & (y > 0)]


def roofline_plot(df: pd.DataFrame, path: Path, run: str, what: str, shape: CoreShape | None = None) -> Path:
    """Log–log achieved TFLOP/s against arithmetic intensity, one point per row coloured by ``impl``, under
    the device's roofs: its DRAM bandwidth (the slope) and its peak TFLOP/s per precision (flat, from the ridge)."""
    from matplotlib.ticker import FuncFormatter

    from cs336sys.analysis.plots import device_of, empty_panel, plt, save, style_of, title  # matplotlib: only when drawing

    points = _points(df, shape)
    device = device_of(points)
    points = points[points["device_name"] == device] if "device_name" in points else points
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    if points.empty:
        empty_panel(ax, "no row with both counted bytes and TFLOP/s")
        title(fig, run, df, f"roofline, {what}")
        return save(fig, path)
    x = points["arith_intensity"].astype(float)
    bw = peak_gbps(device)
    bw = float(points["peak_gbps"].dropna().iloc[0]) if points["peak_gbps"].notna().any() else bw  # the rows' own roof
    peaks = {p: peak_tflops(device, p) for p in sorted(points["precision"].dropna().unique())}
    peaks = {p: v for p, v in peaks.items() if v is not None}
    ridges = [v * 1e3 / bw for v in peaks.values()] if bw else []  # FLOP/byte where each flat roof starts
    lo, hi = min([x.min(), *ridges]) / 3, max([x.max(), *ridges]) * 3
    if bw:
        top = max(peaks.values(), default=points["tflops"].max() * 2)
        ax.plot([lo, top * 1e3 / bw], [lo * bw / 1e3, top], color="0.4", linestyle="--", label=f"DRAM bandwidth {bw:g} GB/s")
        for (prec, peak), ridge in zip(peaks.items(), ridges):
            ax.plot([ridge, hi], [peak, peak], color="0.2", linestyle="-", linewidth=1)
            ax.annotate(f"{prec} peak {peak:g} TFLOP/s", (hi, peak), ha="right", va="bottom", fontsize=7)
    else:
        ax.text(0.02, 0.02, f"no peak bandwidth known for {device!r}: no roofs drawn", transform=ax.transAxes, fontsize=7)
    for impl, part in sorted(points.groupby("impl"), key=lambda kv: str(kv[0])):
        style = {**style_of(fig, str(impl)), "linestyle": "none"}
        ax.plot(part["arith_intensity"].astype(float), part["tflops"].astype(float), ms=5, label=str(impl), **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    y = points["tflops"].astype(float)
    ax.set_ylim(min([y.min(), *([lo * bw / 1e3] if bw else [])]) / 1.5, max([y.max(), *peaks.values()]) * 1.8)
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers: 0.5, 20, 1000, not 5×10⁻¹
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("arithmetic intensity (FLOP/byte, counted)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    title(fig, run, points, f"roofline, {what}: one point per row and phase")
    return save(fig, path)


def roofline_summary(df: pd.DataFrame, shape: CoreShape | None = None) -> str:
    """The roofline figure explained in one paragraph, with where each implementation's rows sit ('' without points)."""
    points = _points(df, shape)
    if points.empty:
        return ""
    text = (
        "**Roofline** (figure `roofline`): each point is one timed row (a phase of a cell), at its arithmetic "
        "intensity (counted FLOPs / counted bytes moved) and its achieved TFLOP/s, log–log. The dashed line is the "
        "GPU's DRAM bandwidth roof (TFLOP/s = intensity × peak GB/s), the flat lines its peak TFLOP/s per precision; "
        "they meet at the ridge. A point left of the ridge is memory-bound: no kernel can beat the slope above it, "
        "and its height under the slope is the bandwidth it leaves unused; right of it, compute-bound. Fused "
        "kernels' bytes are a lower bound (K and V re-read per tile are not counted), so their points sit at most "
        "this far right."
    )
    parts = []
    for impl, part in sorted(points.groupby("impl"), key=lambda kv: str(kv[0])):
        x = part["arith_intensity"].astype(float)
        share = (part["tflops"].astype(float) / pd.to_numeric(part["roof_tflops"], errors="coerce")).max()
        bounds = "/".join(sorted(set(part["bound"].dropna())))
        where = "–".join(dict.fromkeys(f"{v:.2g}" if v < 100 else f"{v:.0f}" for v in (x.min(), x.max())))
        parts.append(f"`{impl}` {where} FLOP/byte" + (f", {bounds}-bound, at most {100 * share:.0f}% of its roof" if bounds else ""))
    return f"{text} Here: {'; '.join(parts)}."
