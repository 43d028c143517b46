"""How a figure looks and is written: one style per series, the same in every panel, and PNGs with a
256-colour palette (a third of the bytes, the same picture: a figure is flat colours and anti-aliased
text). Used by :mod:`cs336sys.analysis.plots`.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib
from PIL import Image  # matplotlib's own dependency

from cs336sys.fileio import atomic_path

# Series k: colour k mod 10, marker k mod 7, and a new line style every 10 series. 10 and 7 are
# coprime, so no two of the first 70 series share colour and marker (the attention figure has 16).
COLORS = tuple(matplotlib.colormaps["tab10"].colors)
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", ":", "-.")


def series_style(k: int) -> dict[str, object]:
    """Colour, marker and line style of the ``k``-th series of a figure (0-based)."""
    return {
        "color": COLORS[k % len(COLORS)],
        "marker": MARKERS[k % len(MARKERS)],
        "linestyle": LINESTYLES[k // len(COLORS) % len(LINESTYLES)],
    }


def style_of(fig, label: str) -> dict[str, object]:
    """The style of the series ``label`` in ``fig``: a new one the first time, the same in every later panel
    (a shared legend shows each label once, so one label must look the same everywhere)."""
    styles = fig.__dict__.setdefault("_cs336sys_series", {})
    if label not in styles:
        styles[label] = series_style(len(styles))
    return styles[label]


def write_png(fig, path: Path, **savefig) -> Path:
    """``fig`` as a PNG with a 256-colour palette, written atomically.

    Octree quantization without dithering: a figure's few flat colours stay exact, and dithering
    would only add noise (and bytes) to the anti-aliased edges of text and lines.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **savefig)
    buffer.seek(0)
    with atomic_path(path) as tmp:
        compact_png(Image.open(buffer), tmp)
    return Path(path)


def compact_png(image: Image.Image, path: Path) -> None:
    """``image`` saved at ``path`` as a palette PNG (see :func:`write_png`)."""
    palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    palette.save(path, format="PNG", optimize=True)
