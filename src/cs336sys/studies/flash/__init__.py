"""Study ``flash``: fused attention kernels vs SDPA's backends and eager PyTorch (handout §1.3 flash_benchmarking)."""

from collections.abc import Mapping
from typing import Any

from cs336sys.studies import Axes, Study


def _leaderboard(section: Mapping[str, Any]) -> list[Axes]:
    """The course leaderboard configuration, benchmarked as its own cells for every implementation."""
    board = section.get("leaderboard")
    if not board:
        return []
    fixed = {"seq_len": board["seq_len"], "head_dim": board["head_dim"], "precision": board["precision"], "num_heads": board["num_heads"]}
    return [{**fixed, "impl": impl} for impl in section["grid"]["impl"]]


STUDY = Study(
    name="flash",
    question="How fast are our Triton FlashAttention-2 kernels against SDPA's backends and eager PyTorch? (§1.3)",
    axes=("seq_len", "head_dim", "precision", "impl", "num_heads"),
    extra_cells=_leaderboard,
    cell_keys=("leaderboard",),
    optional_modules={"cs336sys.models.triton_attention": lambda axes: axes["impl"] == "triton"},
)
