"""The flash study's figures: one per (precision, heads) pair that has rows."""

from __future__ import annotations

import pandas as pd

from cs336sys.pipeline.merge import load_study
from cs336sys.studies.flash import report as flash_report
from workflow_helpers import REPO


def test_a_grid_whose_heads_differ_by_precision_draws_only_the_pairs_it_has(tmp_path):
    # the handout grid: one head at bf16 and fp32, the 16-head leaderboard row at bf16 only
    df = load_study(REPO / "results" / "h100-flash" / "flash.csv")
    fp32 = df[df["num_heads"] == 1].assign(precision="fp32")
    df = pd.concat([df, fp32], ignore_index=True)
    names = [name for name, _ in flash_report.figures(df, "t")]
    assert {"flash_bf16_heads-1", "flash_bf16_heads-16", "flash_fp32_heads-1"} <= set(names)
    assert "flash_fp32_heads-16" not in names
    for name, draw in flash_report.figures(df, "t"):
        assert draw(tmp_path / f"{name}.png").stat().st_size > 1000


def test_a_backend_that_refuses_says_why_from_sdpas_warnings():
    import warnings

    import pytest
    import torch

    from cs336sys.rows import Skip
    from cs336sys.studies.flash.measure import _first_call

    def refusing(q, k, v, is_causal):  # what SDPA says on an H100 for fp32 under the flash backend (torch 2.11)
        for text in (
            "Memory efficient kernel not used because: (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:986.)",
            "Memory Efficient attention has been runtime disabled. (Triggered internally at /pytorch/aten/src/ATen/native/transformers/sdp_utils_cpp.h:552.)",
            "Flash attention kernel not used because: (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:988.)",
            "Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: float, Key dtype: float, "
            "and Value dtype: float instead. (Triggered internally at /pytorch/aten/src/ATen/native/transformers/sdp_utils_cpp.h:113.)",
            "Memory Efficient attention has been runtime disabled. (Triggered internally at /pytorch/aten/src/ATen/native/transformers/sdp_utils_cpp.h:552.)",
        ):
            warnings.warn(text, stacklevel=2)
        raise RuntimeError("No available kernel. Aborting execution.\nmore")

    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(Skip) as refused:
        _first_call(refusing, q, q, q, True)
    assert str(refused.value) == (
        "unsupported: No available kernel. Aborting execution. (Expected query, key and value to all be of dtype: "
        "{Half, BFloat16}. Got Query dtype: float, Key dtype: float, and Value dtype: float instead.)"
    )

    def out_of_memory(q, k, v, is_causal):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):  # an oom row, not a skipped one
        _first_call(out_of_memory, q, q, q, True)


def test_sdpas_backends_are_set_beside_their_published_h100_figures():
    from cs336sys.analysis.tables import ok_rows

    h100 = ok_rows(load_study(REPO / "results" / "h100-flash-leaderboard" / "flash.csv"))
    text = flash_report.published(h100)
    assert "`sdpa-flash` (16 heads): 283 [280, 286] TFLOP/s here, FlashAttention-2 299 published: 0.95× [0.94, 0.96]" in text
    assert "`sdpa-cudnn` (16 heads)" in text and "arXiv:2407.08608" in text
    assert flash_report.published(h100.assign(device_name="NVIDIA H200")) == ""  # the figures are the H100's
    assert flash_report.published(h100[h100["seq_len"] != 16384]) == ""
    assert "Against published figures" in flash_report.findings(h100)
