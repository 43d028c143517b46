"""Long labels in figures (kernel names of hundreds of characters): shortened in the middle on the
figure, each tagged ``[k]``, and spelled in full in a band below the panels."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence


def shorten_middle(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` characters in the middle: kernel names differ at the end as often as at the start."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def _around(text: str, at: int, width: int) -> str:
    """``text`` cut to about ``width`` characters: its start, the part around index ``at``, its end."""
    third = (width - 2) // 3
    start = min(max(at - third // 2, third), len(text) - 2 * third)
    return text[:third] + "…" + text[start : start + third] + "…" + text[len(text) - third :]


def short_labels(names: Sequence[str], width: int = 60) -> tuple[list[str], list[tuple[str, str]]]:
    """Labels for ``names``, and the legend (tag, full name) of those shortened.

    A name longer than ``width`` is shortened in the middle and tagged ``[k]`` so that two
    names stay two labels even where they share all but a few characters (cuBLAS kernels
    differ in a tile size halfway along); where two shortened names would read the same,
    each shows the part where it parts from the other instead of its middle.
    """
    unique = list(dict.fromkeys(names))
    long = [n for n in unique if len(n) > width]
    plain = {n: shorten_middle(n, width - 5) for n in long}  # 5: room for the tag
    short = dict(plain)
    for name in long:
        twins = [o for o in long if o != name and plain[o] == plain[name]]
        if twins:
            short[name] = _around(name, max(len(os.path.commonprefix([name, o])) for o in twins), width - 5)
    tags = {n: f"[{k}]" for k, n in enumerate(long, start=1)}
    labels = [f"{tags[n]} {short[n]}" if n in tags else n for n in names]
    return labels, [(tags[n], n) for n in long]


def name_legend_lines(legend: Sequence[tuple[str, str]], width_in: float, fontsize: float = 6.0) -> list[str]:
    """``[k] full name`` lines in monospace, wrapped to ``width_in`` inches (a character is 0.6 em wide)."""
    if not legend:
        return []
    chars = max(40, int(width_in * 72 / (0.6 * fontsize)))
    indent = " " * (max(len(tag) for tag, _ in legend) + 1)
    lines = []
    for tag, name in legend:
        lines += textwrap.wrap(name, chars, initial_indent=f"{tag:<{len(indent) - 1}} ", subsequent_indent=indent, break_on_hyphens=False)
    return lines


def draw_name_legend(fig, lines: Sequence[str], fontsize: float = 6.0) -> float:
    """``lines`` in a band added below the figure's panels, as tall as the text measures.

    Returns the band's share of the new height: pass it to :func:`save` as ``bottom``.
    Call it before :func:`title`, which places the title for the final height.
    """
    if not lines:
        return 0.0
    text = fig.text(0.02, 0, "Full names:\n" + "\n".join(lines), va="bottom", ha="left", family="monospace", fontsize=fontsize)
    text.set_in_layout(False)  # the band is its own
    band_in = text.get_window_extent(fig.canvas.get_renderer()).height / fig.dpi + 0.2
    fig.set_figheight(fig.get_figheight() + band_in)
    text.set_y(0.1 / fig.get_figheight())
    return band_in / fig.get_figheight()
