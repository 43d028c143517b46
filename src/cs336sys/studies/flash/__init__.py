"""Study ``flash``: fused attention kernels vs SDPA's backends and eager PyTorch (handout §1.3 flash_benchmarking)."""

from collections.abc import Mapping
from typing import Any

from cs336sys import catalog
from cs336sys.catalog import TUTORIAL_HEAD_DIMS, TUTORIAL_PRECISIONS, TUTORIAL_SEQ_MULTIPLE
from cs336sys.studies import Axes, Study


def _leaderboard(section: Mapping[str, Any]) -> list[Axes]:
    """The course leaderboard configuration, benchmarked as its own cells for every implementation."""
    board = section.get("leaderboard")
    if not board:
        return []
    fixed = {"seq_len": board["seq_len"], "head_dim": board["head_dim"], "precision": board["precision"], "num_heads": board["num_heads"]}
    return [{**fixed, "impl": impl} for impl in section["grid"]["impl"]]


def _shape(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """(batch, heads, seq_len, head_dim, causal) of a row's core."""
    causal = row.get("causal")
    if causal is None or causal != causal:  # absent or NaN: rows did not say before the FLOP convention changed,
        causal = True  # and every flash run until then was causal (the section's default; their config.yaml)
    return row.get("batch_size"), row.get("num_heads"), row.get("seq_len"), row.get("head_dim"), causal


def _valid(axes: Axes, offered: catalog.Catalog) -> bool:
    """Some implementations handle only some shapes and dtypes (their catalog line's ``unsupported``: Triton's tutorial kernel)."""
    if axes["impl"] not in offered.names(catalog.FUSED):
        return True  # the schema refuses the name, with the allowed ones
    return not offered.lookup(axes["impl"]).why_unsupported(axes["seq_len"], axes["head_dim"], axes["precision"])


STUDY = Study(
    name="flash",
    question="How fast are our Triton FlashAttention-2 kernels against SDPA's backends, Triton's tutorial kernel and eager PyTorch? (§1.3)",
    axes=("seq_len", "head_dim", "precision", "impl", "num_heads"),
    kind=catalog.FUSED,
    valid=_valid,
    why_invalid=(
        f"impl tutorial (Triton's fused-attention tutorial kernel) runs only precision {', '.join(TUTORIAL_PRECISIONS)}, "
        f"head_dim {', '.join(map(str, TUTORIAL_HEAD_DIMS))} and seq_len a multiple of {TUTORIAL_SEQ_MULTIPLE}"
    ),
    extra_cells=_leaderboard,
    cell_keys=("leaderboard",),
    estimate_s=2.0,  # the median cell of the H100 default sweep (results/h100), rounded
    attention_shape=_shape,
    renamed={"seq": "seq_len", "d": "head_dim", "heads": "num_heads"},  # runs before the axes got one name each
)
