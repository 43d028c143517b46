"""Tables and figures a reader can read: numbers, units, empty cells, size order, labels, titles, error bars."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from cs336sys.analysis import long_labels, plots
from cs336sys.analysis.findings import oom_frontier
from cs336sys.analysis.markdown import format_number, md_table, readable
from cs336sys.studies import cell_id
from cs336sys.studies.e2e import report as e2e_report
from cs336sys.studies.profile import report as profile_report
from cs336sys.studies.warmup import report as warmup_report

SIZES_IN_ORDER = ["tiny", "small", "medium", "large", "xl", "2.7B"]  # tiny: a config's extra size


def _cells(table: str) -> list[list[str]]:
    """The body of a markdown table as stripped cells (header first, separator dropped)."""
    rows = [line.strip("|").split("|") for line in table.splitlines()]
    return [[c.strip() for c in row] for i, row in enumerate(rows) if i != 1]


def _column(table: str, name: str) -> list[str]:
    header, *body = _cells(table)
    return [row[header.index(name)] for row in body]


# --- numbers ---------------------------------------------------------------------------------------


def test_whole_numbers_print_as_integers_and_large_ones_without_an_exponent():
    assert format_number(32768.0) == "32768"  # a float column because another cell is empty
    assert format_number(np.int64(7)) == "7"
    assert format_number(15360.4, ".4g") == "15360"  # not 1.536e+04
    assert format_number(1300.4, ".3g") == "1300"  # not 1.3e+03
    assert format_number(0.01234, ".3g") == "0.0123"
    assert format_number(1e-6, ".3g") == "1e-06"  # tiny errors keep their exponent


def test_oom_frontier_table_prints_lengths_as_integers_and_says_none_instead_of_nan():
    ran = [("eager", 16384, "ok"), ("eager", 32768, "oom"), ("triton", 16384, "ok"), ("triton", 32768, "ok")]
    rows = [dict(impl=impl, seq_len=L, status=status) for impl, L, status in ran]
    table = md_table(oom_frontier(pd.DataFrame(rows), ["impl"]), empty={"largest_ok": "none", "first_oom": "none"})
    assert _column(table, "first_oom") == ["32768", "none"]
    assert _column(table, "largest_ok") == ["16384", "32768"]
    assert "e+" not in table and "nan" not in table


# --- empty cells -----------------------------------------------------------------------------------


def test_an_empty_cell_says_oom_for_an_oom_row_and_n_a_otherwise():
    df = pd.DataFrame({"size": ["small", "xl", "large"], "train step ms": [12.5, np.nan, np.nan], "status": ["ok", "oom", "ok"]})
    table = md_table(df)
    assert _column(table, "train step ms") == ["12.5", "n/a", "OOM"]  # large: ran, no such phase; xl: out of memory
    assert "nan" not in table


def test_a_cell_empty_because_of_a_timeout_or_a_partial_failure_names_it():
    df = pd.DataFrame({"ms": [np.nan, np.nan, None], "status": ["timeout", "ok,oom", "skipped"]})
    assert _column(md_table(df), "ms") == ["timeout", "OOM", "skipped"]


# --- memory units ----------------------------------------------------------------------------------


def test_mib_reaching_a_gib_prints_as_gib_with_the_unit_in_the_header():
    table = md_table(pd.DataFrame({"size": ["small", "large"], "peak MiB": [2048.0, 15360.0]}))
    assert _cells(table)[0] == ["size", "peak GiB"]
    assert _column(table, "peak GiB") == ["2.00", "15.0"]


def test_mib_with_small_values_stays_mib_without_an_exponent():
    table = md_table(pd.DataFrame({"peak_mem_mib": [3.0, 15360.4]}), ".4g")
    assert _column(table, "peak_mem_mib") == ["3", "15360"]


def test_bytes_become_mib_in_the_header():
    text, _ = readable(pd.DataFrame({"output_bytes": [4 * 2**20, 6 * 2**20]}))
    assert list(text.columns) == ["output_mib"] and text["output_mib"].tolist() == ["4", "6"]


def test_numbers_align_right_and_text_left():
    table = md_table(pd.DataFrame({"impl": ["eager"], "median_ms": [1.5], "first_oom": [np.nan]}))
    text, numbers, empty = table.splitlines()[1].strip("|").split("|")
    assert text.startswith(":") and not text.endswith(":")
    assert numbers.endswith(":") and not numbers.startswith(":")
    assert empty.startswith(":")  # nothing but empty cells: text (n/a), not numbers


# --- model sizes -----------------------------------------------------------------------------------


def test_rows_follow_the_size_table_not_the_alphabet_and_keep_their_order_within_a_size():
    alphabetical = sorted(SIZES_IN_ORDER)  # 2.7B, large, medium, small, tiny, xl
    df = pd.DataFrame([dict(size=s, context_length=c) for s in alphabetical for c in (128, 512)])
    table = md_table(df)
    assert _column(table, "size") == [s for s in SIZES_IN_ORDER for _ in (128, 512)]
    assert _column(table, "context_length") == ["128", "512"] * len(SIZES_IN_ORDER)


def test_size_order_applies_within_the_columns_left_of_size():
    df = pd.DataFrame({"impl": ["sdpa", "sdpa", "eager", "eager"], "size": ["xl", "small", "xl", "small"]})
    assert _column(md_table(df), "size") == ["small", "xl", "small", "xl"]
    assert _column(md_table(df), "impl") == ["sdpa", "sdpa", "eager", "eager"]


def test_figure_legends_list_sizes_in_size_order():
    rows = [dict(size=s, context_length=c, median_ms=1.0 + i) for i, s in enumerate(sorted(SIZES_IN_ORDER)) for c in (128, 256)]
    fig, ax = plots.plt.subplots()
    plots.draw_lines(ax, pd.DataFrame(rows), "context_length", "median_ms", ["size"])
    labels = ax.get_legend_handles_labels()[1]
    plots.plt.close(fig)
    assert labels == [f"size={s}" for s in SIZES_IN_ORDER]


# --- long labels -----------------------------------------------------------------------------------

PREFIX = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "  # > 70 chars
KERNELS = [PREFIX + f"at::native::binary_internal::{op}Functor<float> >, std::array<char*, 3ul> >" for op in ("Mul", "Div")]


def test_labels_of_names_sharing_a_long_prefix_stay_distinct_and_short_with_a_legend():
    labels, legend = long_labels.short_labels(KERNELS, width=60)
    assert len(set(labels)) == 2 and all(len(label) <= 60 for label in labels)
    assert [full for _, full in legend] == KERNELS
    assert "Mul" in labels[0] and "Div" in labels[1]  # each shows where it parts from the other


def test_shorten_middle_keeps_both_ends():
    short = long_labels.shorten_middle("a" * 40 + "MIDDLE" + "z" * 40, 21)
    assert short == "a" * 10 + "…" + "z" * 10


def _capture(monkeypatch, module) -> list:
    figures = []
    monkeypatch.setattr(module, "save", lambda fig, path, **kw: figures.append(fig) or path)
    return figures


def test_kernel_chart_draws_one_bar_per_kernel_even_when_names_share_a_70_char_prefix(monkeypatch):
    axes = dict(size="tiny", context_length=32, precision="fp32", impl="eager")
    common = dict(cell_id=cell_id("profile", axes), status="ok", kind="kernel", mode="train", phase="forward", device_kind="cuda", **axes)
    df = pd.DataFrame([dict(kernel=k, total_us=us, share_of_phase=us / 100, calls=1, **common) for k, us in zip(KERNELS, (60.0, 40.0))])
    figures = _capture(monkeypatch, profile_report)
    profile_report.plot_kernel_shares(df, "unused.png", "t", common["cell_id"])
    (fig,) = figures
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ax.patches) == 2 and len(set(ticks)) == 2
    assert [p.get_width() for p in ax.patches] == [40.0, 60.0]  # the largest on top, in order
    legend = "".join(t.get_text() for t in fig.texts).replace("\n", "").replace(" ", "")
    assert all(k.replace(" ", "") in legend for k in KERNELS)  # full names, wrapped
    plots.plt.close(fig)


def test_profile_answers_table_is_headed_by_the_cells_not_0_and_1():
    rows = []
    for size in ("xl", "small", "2.7B"):
        axes = dict(size=size, context_length=512, precision="fp32", impl="eager")
        kernel = dict(kernel="gemm", calls=2, total_us=10.0, share_of_phase=1.0, profiled_steps=1, device_kind="cuda")
        rows.append(dict(cell_id=cell_id("profile", axes), status="ok", kind="kernel", mode="train", phase="forward", **kernel, **axes))
    df = pd.DataFrame(rows)
    table = profile_report.answers_by_cell(profile_report.profile_answers(df), df)
    assert list(table.columns) == ["answer", "size=small", "size=xl", "size=2.7B"]  # cells in size order


# --- titles and layout -----------------------------------------------------------------------------


def test_a_long_title_wraps_to_fit_a_narrow_figure():
    fig, _ = plots.plt.subplots(figsize=(3, 3))
    plots.title(fig, "cpu-demo", pd.DataFrame({"device_name": ["cpu (x86_64)"]}), "fused attention TFLOP/s, fp32, heads=1, causal")
    text = fig._suptitle
    width = text.get_window_extent(fig.canvas.get_renderer()).width
    plots.plt.close(fig)
    assert width <= fig.bbox.width and "\n" in text.get_text()


def _lm_rows(extra: dict | None = None) -> pd.DataFrame:
    rows = []
    for ctx in (128, 256):
        for mode, phase in e2e_report.PANELS:
            axes = dict(size="small", context_length=ctx, precision="fp32", impl="eager", cuda_graphs=0, compile=0, mode=mode, phase=phase)
            times = dict(median_ms=10.0, ci_low_ms=9.0, ci_high_ms=11.0, mean_ms=2.0, std_ms=5.0, max_ms=20.0)
            rows.append(dict(**axes, status="ok", **times, warmup_steps=ctx // 128, **(extra or {})))
    return pd.DataFrame(rows)


def test_the_five_panel_time_figure_is_two_panels_a_row_with_one_legend(monkeypatch):
    figures = _capture(monkeypatch, e2e_report)
    e2e_report.plot_times(_lm_rows(), "unused.png", "t", "eager")
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.axison]
    columns = {round(ax.get_position().x0, 3) for ax in panels}
    legends = [ax for ax in fig.axes if ax.get_legend() is not None]
    plots.plt.close(fig)
    assert len(panels) == 5 and len(columns) == 2 and fig.get_figwidth() <= 9.5
    assert len(legends) == 1


def test_warmup_error_bars_never_reach_below_zero(monkeypatch):
    figures = _capture(monkeypatch, warmup_report)
    warmup_report.plot_warmup(_lm_rows(), "unused.png", "t")  # mean 2 ms, std 5 ms: mean − std < 0
    (fig,) = figures
    lows = [seg[:, 1].min() for ax in fig.axes for c in ax.collections for seg in c.get_segments()]
    plots.plt.close(fig)
    assert lows and min(lows) == pytest.approx(0.0)  # drawn, and clipped at zero exactly


def test_error_bars_clip_the_lower_length_at_the_value():
    part = pd.DataFrame({"y": [2.0, 10.0, 3.0], "std": [5.0, 1.0, math.nan]})
    below, above = plots.error_bars(part, "y", "std")
    assert below.tolist() == [2.0, 1.0, 0.0] and above.tolist() == [5.0, 1.0, 0.0]
    part = pd.DataFrame({"y": [1.0], "lo": [3.0], "hi": [0.5]})
    below, above = plots.error_bars(part, "y", ("lo", "hi"))
    assert below.tolist() == [1.0] and above.tolist() == [0.5]
