"""The CUDA-only measurements (memory study, profile on the GPU timeline) on a tiny model.

These paths cannot run on CPU (the memory study is `skipped` there); run them on the GPU
machine with `python -m pytest -m gpu`.
"""

import pandas as pd
import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys.measure.session import Session
from cs336sys.studies.memory.measure import measure as measure_memory
from cs336sys.studies.profile.measure import measure as measure_profile

TINY = {"tiny": {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4}}
LM = dict(size="tiny", context_length=64, precision="fp32", batch_size=2, vocab_size=100, extra_sizes=TINY)


@pytest.mark.gpu
def test_memory_cell_rows_on_cuda(tmp_path):
    kwargs = cell_kwargs("memory", **LM, mode="train", artifact_dir=str(tmp_path), cell_id="tiny")
    rows = pd.DataFrame(measure_memory(torch.device("cuda"), {}, Session(), **kwargs))
    summary = rows[rows["kind"] == "summary"].iloc[0]
    assert summary["peak_mem_bytes"] >= summary["mem_before_bwd_bytes"] > 0
    assert summary["residual_activation_bytes"] == 2 * 64 * 64 * 4
    timeline = rows[rows["kind"] == "timeline"]
    assert len(timeline) > 10 and timeline["allocated_bytes"].max() > 0
    assert (rows["kind"] == "phase").sum() == 2 and (rows["kind"] == "allocation").sum() > 0
    assert (tmp_path / "tiny.pickle").exists()


@pytest.mark.gpu
def test_profile_cell_rows_on_cuda(tmp_path):
    steps = dict(warmup_steps=1, measure_steps=2, profile_steps=2)
    kwargs = cell_kwargs("profile", **LM, **steps, artifact_dir=str(tmp_path), cell_id="tiny")
    rows = pd.DataFrame(measure_profile(torch.device("cuda"), {}, Session(), **kwargs))
    kernels = rows[(rows["kind"] == "kernel") & (rows["mode"] == "train")]
    assert {"forward", "backward", "optimizer_step"} <= set(kernels["phase"])
    shares = kernels.groupby("phase")["share_of_phase"].sum()
    assert shares.drop("other", errors="ignore").round(6).eq(1.0).all()
    sub = rows[(rows["kind"] == "subrange") & (rows["mode"] == "train")].set_index("phase")
    # each attention part appears once per layer and step, softmax included (lost once on torch 2.11)
    assert (sub["count"] == 2 * 2).all(), sub
    assert (tmp_path / "tiny_train.json.gz").exists()
