"""Attention FLOPs as the FlashAttention papers and Triton's tutorial 06 count them.

Backward 2.5× the forward (2× for dQ, dK, dV plus 0.5× for the recomputed QKᵀ),
forward+backward 3.5×, causal at half; the attention and flash studies' rows are
recounted so at merge time, their times untouched; an LM training step stays 3×
its forward (6ND) and the mha layer keeps its own convention.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from cell_kwargs import cell_kwargs
from cs336sys import studies as S
from cs336sys.measure import flops as F
from cs336sys.measure.session import Session
from cs336sys.models.sizes import MODEL_SIZES
from cs336sys.pipeline.merge import derive, load_study, merge_cells
from cs336sys.rows import write_csv_atomic

H100 = "NVIDIA H100 80GB HBM3"
H100_BF16_PEAK = 989.4
# batch 2, 3 heads, 128 tokens, d 64: QKᵀ and PV, 2·B·H·L·L·d each = 4 · 2 · 3 · 128 · 128 · 64
FORWARD = 25_165_824.0
HAND = {  # phase → FLOPs, non-causal, counted by hand from FORWARD
    "forward": 25_165_824.0,
    "backward": 62_914_560.0,  # 2.5 × forward
    "forward_backward": 88_080_384.0,  # 3.5 × forward
    "step": 88_080_384.0,  # the attention study's forward + backward
}


@pytest.mark.parametrize("causal, half", [(False, 1.0), (True, 0.5)])
def test_attention_phase_flops_match_the_hand_count(causal, half):
    got = F.attention_phase_flops(2, 3, 128, 64, causal)
    for phase, flops in HAND.items():
        assert got[phase] == half * flops, phase


def _cell_files(tmp_path, study: str, cells: list[tuple[dict, list[dict]]]) -> list:
    """One cell CSV per (axes, rows), named after its cell id as the workflow names it."""
    paths = []
    for axes, rows in cells:
        cid = S.cell_id(study, axes)
        head = {"study": study, "cell_id": cid, "status": "ok", "error": "", **axes}
        env = {"device": "cuda", "device_name": H100, "host": "h"}
        paths.append(tmp_path / f"{cid}.csv")
        write_csv_atomic(pd.DataFrame([{**head, **row, **env} for row in rows]), paths[-1])
    return paths


# The old convention: backward 2× the forward, forward+backward 3×.
OLD = {"forward": 1.0, "backward": 2.0, "forward_backward": 3.0, "step": 3.0}
MS = {"forward": 0.01, "backward": 0.03, "forward_backward": 0.04, "step": 0.04}


def _flash_rows(causal: bool | None) -> list[dict]:
    """A flash cell's three rows as a run before the convention changed wrote them (``causal`` absent then)."""
    fwd = FORWARD * (0.5 if causal in (None, True) else 1.0)
    extra = {} if causal is None else {"causal": int(causal)}
    return [
        {"mode": "train", "phase": p, "median_ms": MS[p], "flops": OLD[p] * fwd, "batch_size": 2, **extra}
        for p in ("forward", "backward", "forward_backward")
    ]


def test_a_merge_recounts_old_flash_rows_and_keeps_their_times(tmp_path):
    axes = {"seq_len": 128, "head_dim": 64, "precision": "bf16", "impl": "triton", "num_heads": 3}
    cells = [
        (axes, _flash_rows(None)),  # before flash rows said: every committed flash run was causal
        ({**axes, "impl": "sdpa-flash"}, _flash_rows(False)),
    ]
    paths = _cell_files(tmp_path, "flash", cells)
    merged = merge_cells(paths, "flash")
    for impl, half in (("triton", 0.5), ("sdpa-flash", 1.0)):
        rows = merged[merged["impl"] == impl].set_index("phase")
        for phase in ("forward", "backward", "forward_backward"):
            row = rows.loc[phase]
            assert row["median_ms"] == MS[phase], (impl, phase)  # the measurement is not touched
            assert row["flops"] == pytest.approx(half * HAND[phase], rel=1e-12), (impl, phase)
            assert row["tflops"] == pytest.approx(half * HAND[phase] / (MS[phase] / 1e3) / 1e12, rel=1e-12)
            assert row["mfu_pct"] == pytest.approx(100 * row["tflops"] / H100_BF16_PEAK, rel=1e-12)
    # the backward's TFLOP/s read 2.5 / 2 of what the old count gave
    old_bwd = OLD["backward"] * 0.5 * FORWARD / (MS["backward"] / 1e3) / 1e12
    assert merged.set_index(["impl", "phase"]).loc[("triton", "backward"), "tflops"] == pytest.approx(1.25 * old_bwd)


def test_a_merge_recounts_attention_rows_from_their_axes(tmp_path):
    axes = {"d_model": 64, "seq_len": 128, "activation": "softmax", "impl": "eager", "causal": 1, "precision": "fp32"}
    rows = [
        {"mode": "train", "phase": p, "median_ms": MS[p], "flops": OLD[p] * FORWARD / 2, "batch_size": 6}
        for p in ("forward", "backward", "step")
    ]
    merged = merge_cells(_cell_files(tmp_path, "attention", [(axes, rows)]), "attention").set_index("phase")
    for phase in ("forward", "backward", "step"):  # batch 6 × 1 head = 2 × 3 heads, causal: half of HAND
        assert merged.loc[phase, "flops"] == pytest.approx(0.5 * HAND[phase], rel=1e-12), phase
        assert merged.loc[phase, "median_ms"] == MS[phase]


def test_a_row_without_the_shape_keeps_its_flops_and_a_failure_stays_empty(tmp_path):
    axes = {"seq_len": 128, "head_dim": 64, "precision": "bf16", "impl": "triton", "num_heads": 3}
    no_batch = [{k: v for k, v in r.items() if k != "batch_size"} for r in _flash_rows(None)]
    paths = _cell_files(tmp_path, "flash", [(axes, no_batch)])
    oom = [{"status": "oom", "error": "CUDA out of memory", "mode": "train", "phase": ""}]
    paths += _cell_files(tmp_path, "flash", [({**axes, "seq_len": 256}, oom)])
    merged = merge_cells(paths, "flash")
    kept = merged[merged["seq_len"] == 128].set_index("phase")["flops"]
    assert kept.to_dict() == {p: OLD[p] * FORWARD / 2 for p in ("forward", "backward", "forward_backward")}
    failed = merged[merged["seq_len"] == 256]
    assert failed["status"].tolist() == ["oom"] and failed["flops"].isna().all()


def test_rederiving_a_merged_csv_recounts_it_and_changes_nothing_else(tmp_path):
    axes = {"seq_len": 128, "head_dim": 64, "precision": "bf16", "impl": "triton", "num_heads": 3}
    merged = merge_cells(_cell_files(tmp_path, "flash", [(axes, _flash_rows(None))]), "flash")
    old = merged.assign(flops=[OLD[p] * FORWARD / 2 for p in merged["phase"]])  # as a committed run holds it
    write_csv_atomic(old, tmp_path / "old.csv")
    again = derive(load_study(tmp_path / "old.csv", "flash"), "flash")
    assert again["flops"].tolist() == [0.5 * HAND[p] for p in again["phase"]]
    write_csv_atomic(again[merged.columns], tmp_path / "again.csv")
    derived = ["flops", "tflops", "mfu_pct"]
    before, after = (load_study(tmp_path / f, "flash").drop(columns=derived) for f in ("old.csv", "again.csv"))
    pd.testing.assert_frame_equal(after, before)


def test_lm_training_step_and_mha_keep_their_flops(tmp_path):
    size = MODEL_SIZES["small"]
    fwd = F.lm_forward_flops(size, 4, 128, 10_000)
    lm = F.phase_flops(fwd, "train")
    assert lm["backward"] == 2 * fwd and lm["step"] == 3 * fwd  # 6ND: the model-FLOPs convention
    mha = F.phase_flops(F.mha_forward_flops(2, 64, 32, 4, "exact-eager", None), "train")
    assert mha["backward"] == 2 * mha["forward"]
    # and a merge leaves e2e rows' stored FLOPs alone
    e2e = {"size": "small", "context_length": 128, "precision": "bf16", "impl": "eager", "compile": 0, "cuda_graphs": 0}
    e2e = {a: e2e.get(a, 0) for a in S.study("e2e").axes}
    rows = [{"mode": "train", "phase": p, "median_ms": 10.0, "flops": f, "batch_size": 4} for p, f in lm.items() if f is not None]
    merged = merge_cells(_cell_files(tmp_path, "e2e", [(e2e, rows)]), "e2e").set_index("phase")
    assert merged.loc["step", "flops"] == 3 * fwd and merged.loc["backward", "flops"] == 2 * fwd


def test_the_flash_and_attention_measurements_write_the_new_count():
    from cs336sys.studies.attention.measure import measure as attention
    from cs336sys.studies.flash.measure import measure as flash

    cpu = torch.device("cpu")
    rows = list(
        flash(
            cpu,
            {},
            Session(),
            **cell_kwargs(
                "flash", seq_len=128, head_dim=64, precision="fp32", impl="eager", num_heads=3, batch_size=2, causal=False, rep_ms=1
            ),
        )
    )
    assert {r["phase"]: r["flops"] for r in rows} == {p: HAND[p] for p in ("forward", "backward", "forward_backward")}
    assert {r["causal"] for r in rows} == {0}  # so a re-merge need not guess it
    axes = dict(d_model=64, seq_len=128, activation="softmax", impl="eager", causal=1, precision="fp32")
    rows = list(attention(cpu, {}, Session(), **cell_kwargs("attention", **axes, batch_size=6, warmup_steps=1, measure_steps=2)))
    assert {r["phase"]: r["flops"] for r in rows if r["phase"] in HAND} == {p: 0.5 * HAND[p] for p in ("forward", "backward", "step")}
