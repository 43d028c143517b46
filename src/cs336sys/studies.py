"""The studies: their grid axes, which cells are valid, what each cell measures and which code it runs.

This is the one place that turns a (validated) config into cells: the
workflow's ``common.smk`` asks it for cell ids, per-cell measurement kwargs
and per-cell source hashes; nothing about a study's grid is written twice.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from cs336sys import attention as attn
from cs336sys.mha import is_valid as mha_valid
from cs336sys.provenance import CELL_RUNTIME, code_hash

Axes = dict[str, Any]


def _product(**lists: list) -> list[Axes]:
    keys = list(lists)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(lists[k] for k in keys))]


def _flag(value: Any) -> int:
    return int(bool(value))


@dataclass(frozen=True)
class Study:
    name: str
    axes: tuple[str, ...]  # cell-id order; also the axis columns of every row
    target: str  # "module:function" of the measurement
    cells: Callable[[Mapping[str, Any]], list[Axes]]  # study block → valid cells
    kwargs: Callable[[Axes, Mapping[str, Any], Mapping[str, Any]], dict]  # (axes, block, config) → measurement kwargs
    sources: Callable[[Axes], tuple[str, ...]]  # modules this cell runs, besides CELL_RUNTIME
    artifact_kwarg: str | None = None  # kwarg that receives a directory for traces/snapshots


# --- e2e and warmup: TransformerLM -------------------------------------------------------------

_LM_SOURCES = ("bench_lm.py", "model.py", "attention.py", "optim.py")


def _lm_sources(axes: Axes) -> tuple[str, ...]:
    return _LM_SOURCES + (("triton_attention.py",) if axes.get("attn") == "triton" else ())


def _e2e_cells(block: Mapping[str, Any]) -> list[Axes]:
    return _product(size=block["sizes"], ctx=block["context_lengths"], precision=block["precisions"],
                    attn=block["attention"], compile=[_flag(c) for c in block["compile"]])  # fmt: skip


def _lm_kwargs(axes: Axes, block: Mapping[str, Any], config: Mapping[str, Any], warmup: int | None = None) -> dict:
    return dict(
        size=axes["size"], context_length=int(axes["ctx"]), precision=axes["precision"], attention=axes["attn"],
        compile=bool(axes["compile"]), warmup_steps=int(block["warmup_steps"] if warmup is None else warmup),
        measure_steps=int(block["measure_steps"]), batch_size=int(block["batch_size"]), vocab_size=int(block["vocab_size"]),
        modes=tuple(block["modes"]), optimizer=block["optimizer"], extra_sizes=dict(config.get("extra_sizes") or {}),
    )  # fmt: skip


def _warmup_cells(block: Mapping[str, Any]) -> list[Axes]:
    return _product(size=[block["size"]], ctx=[block["context_length"]], precision=[block["precision"]],
                    attn=[block["attention"]], compile=[_flag(c) for c in block["compile"]], warmup=block["warmup_steps"])  # fmt: skip


def _warmup_kwargs(axes: Axes, block: Mapping[str, Any], config: Mapping[str, Any]) -> dict:
    return _lm_kwargs(axes, block, config, warmup=int(axes["warmup"]))


# --- attention: one core, batch × one head --------------------------------------------------------


def _attention_cells(block: Mapping[str, Any]) -> list[Axes]:
    cells = _product(d=block["d_model"], seq=block["seq_len"], act=block["activation"], impl=block["impl"],
                     causal=[_flag(c) for c in block["causal"]], precision=block["precisions"])  # fmt: skip
    return [c for c in cells if attn.is_valid(c["impl"], c["act"])]  # sdpa × relu is not a cell


def _attention_kwargs(axes: Axes, block: Mapping[str, Any], config: Mapping[str, Any]) -> dict:
    return dict(d_model=int(axes["d"]), seq_len=int(axes["seq"]), activation=axes["act"], impl=axes["impl"],
                causal=bool(axes["causal"]), precision=axes["precision"], batch_size=int(block["batch_size"]),
                warmup_steps=int(block["warmup_steps"]), measure_steps=int(block["measure_steps"]))  # fmt: skip


def _core_sources(axes: Axes) -> tuple[str, ...]:
    return ("bench_attention.py", "attention.py") + (("triton_attention.py",) if axes.get("impl") == "triton" else ())


# --- mha: exact vs performer ----------------------------------------------------------------------


def _mha_cells(block: Mapping[str, Any]) -> list[Axes]:
    cells = []
    for base in _product(embed=block["embed_dim"], heads=block["num_heads"], seq=block["seq_len"],
                         variant=block["variants"], kernel=block["kernels"]):  # fmt: skip
        if not mha_valid(base["variant"], base["kernel"]) or base["embed"] % base["heads"]:
            continue
        features = block["num_features"] if base["variant"] == "performer" else [0]
        cells += [{**base, "m": m} for m in features]
    return cells


def _mha_kwargs(axes: Axes, block: Mapping[str, Any], config: Mapping[str, Any]) -> dict:
    return dict(embed_dim=int(axes["embed"]), num_heads=int(axes["heads"]), seq_len=int(axes["seq"]), variant=axes["variant"],
                kernel=axes["kernel"], num_features=int(axes["m"]) or None, batch_size=int(block["batch_size"]),
                precision=block["precision"], warmup_steps=int(block["warmup_steps"]), measure_steps=int(block["measure_steps"]))  # fmt: skip


def _mha_sources(axes: Axes) -> tuple[str, ...]:
    # Performer cells do not run the exact cores: editing attention.py leaves them alone.
    # mha.py imports performer.py, so every mha cell hashes it; only exact cells run attention.py.
    return ("bench_mha.py", "mha.py", "performer.py") + (() if axes["variant"] == "performer" else ("attention.py",))


# --- flash: fused kernels vs SDPA backends -------------------------------------------------------


def _flash_cells(block: Mapping[str, Any]) -> list[Axes]:
    cells = _product(seq=block["seq_len"], d=block["head_dim"], precision=block["precisions"], impl=block["impl"], heads=[block["num_heads"]])
    leaderboard = block.get("leaderboard")
    if leaderboard:
        cells += _product(seq=[leaderboard["seq_len"]], d=[leaderboard["head_dim"]], precision=[leaderboard["precision"]],
                          impl=block["impl"], heads=[leaderboard["num_heads"]])  # fmt: skip
    unique = {tuple(c.items()): c for c in cells}
    return list(unique.values())


def _flash_kwargs(axes: Axes, block: Mapping[str, Any], config: Mapping[str, Any]) -> dict:
    return dict(seq_len=int(axes["seq"]), head_dim=int(axes["d"]), precision=axes["precision"], impl=axes["impl"],
                num_heads=int(axes["heads"]), batch_size=int(block["batch_size"]), causal=bool(block["causal"]),
                rep_ms=float(block["rep_ms"]))  # fmt: skip


# --- profile and memory: where the time and the bytes go ------------------------------------------


def _profile_cells(block: Mapping[str, Any]) -> list[Axes]:
    return _product(size=block["sizes"], ctx=block["context_lengths"], precision=block["precisions"], attn=[block["attention"]])


def _profile_kwargs(axes: Axes, block: Mapping[str, Any], config: Mapping[str, Any]) -> dict:
    return dict(size=axes["size"], context_length=int(axes["ctx"]), precision=axes["precision"], attention=axes["attn"],
                warmup_steps=int(block["warmup_steps"]), measure_steps=int(block["measure_steps"]),
                profile_steps=int(block["profile_steps"]), batch_size=int(block["batch_size"]),
                vocab_size=int(block["vocab_size"]), optimizer=block["optimizer"],
                extra_sizes=dict(config.get("extra_sizes") or {}))  # fmt: skip


def _memory_cells(block: Mapping[str, Any]) -> list[Axes]:
    return _product(size=block["sizes"], ctx=block["context_lengths"], precision=block["precisions"], mode=block["modes"])


def _memory_kwargs(axes: Axes, block: Mapping[str, Any], config: Mapping[str, Any]) -> dict:
    return dict(size=axes["size"], context_length=int(axes["ctx"]), precision=axes["precision"], mode=axes["mode"],
                attention=block["attention"], warmup_steps=int(block["warmup_steps"]), measure_steps=int(block["measure_steps"]),
                batch_size=int(block["batch_size"]), vocab_size=int(block["vocab_size"]), optimizer=block["optimizer"],
                top_n=int(block["top_n"]), extra_sizes=dict(config.get("extra_sizes") or {}))  # fmt: skip


def _precision_cells(block: Mapping[str, Any]) -> list[Axes]:
    return _product(part=block["parts"])


def _precision_kwargs(axes: Axes, block: Mapping[str, Any], config: Mapping[str, Any]) -> dict:
    return dict(part=axes["part"])


STUDIES: dict[str, Study] = {
    s.name: s
    for s in (
        Study("e2e", ("size", "ctx", "precision", "attn", "compile"), "cs336sys.bench_lm:measure_e2e", _e2e_cells, _lm_kwargs, _lm_sources),
        Study("warmup", ("size", "ctx", "precision", "attn", "compile", "warmup"), "cs336sys.bench_lm:measure_e2e", _warmup_cells, _warmup_kwargs, _lm_sources),
        Study("attention", ("d", "seq", "act", "impl", "causal", "precision"), "cs336sys.bench_attention:measure_attention",
              _attention_cells, _attention_kwargs, _core_sources),
        Study("mha", ("embed", "heads", "seq", "variant", "kernel", "m"), "cs336sys.bench_mha:measure_mha", _mha_cells, _mha_kwargs, _mha_sources),
        Study("flash", ("seq", "d", "precision", "impl", "heads"), "cs336sys.bench_attention:measure_flash", _flash_cells, _flash_kwargs, _core_sources),
        Study("profile", ("size", "ctx", "precision", "attn"), "cs336sys.bench_profile:measure_profile", _profile_cells, _profile_kwargs,
              lambda axes: _lm_sources(axes) + ("bench_profile.py", "profiling.py"), artifact_kwarg="trace_dir"),
        Study("memory", ("size", "ctx", "precision", "mode"), "cs336sys.bench_profile:measure_memory", _memory_cells, _memory_kwargs,
              # the attention implementation is a section-level setting here, so the Triton file is always hashed
              lambda axes: _LM_SOURCES + ("triton_attention.py", "bench_profile.py", "memory_snapshot.py"), artifact_kwarg="snapshot_dir"),
        Study("precision", ("part",), "cs336sys.precision:measure_precision", _precision_cells, _precision_kwargs, lambda axes: ("precision.py",)),
    )
}  # fmt: skip


def study(name: str) -> Study:
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; known: {', '.join(STUDIES)}")
    return STUDIES[name]


def cell_id(name: str, axes: Axes) -> str:
    return "_".join(f"{key}={axes[key]}" for key in study(name).axes)


def grid(name: str, config: Mapping[str, Any]) -> dict[str, Axes]:
    """Cell id → axes for every valid cell of study ``name`` under ``config``."""
    s = study(name)
    return {cell_id(name, axes): axes for axes in s.cells(config[name])}


def cell_settings(name: str, axes: Axes, config: Mapping[str, Any], artifact_dir: str | None = None) -> dict[str, Any]:
    """Everything a cell's job needs; Snakemake params, so any change reruns the cell."""
    s = study(name)
    block = config[name]
    kwargs = s.kwargs(axes, block, config)
    if s.artifact_kwarg:
        kwargs.update({s.artifact_kwarg: artifact_dir, "cell_id": cell_id(name, axes)})
    return {
        "study": name,
        "cell_id": cell_id(name, axes),
        "axes": dict(axes),
        "target": s.target,
        "kwargs": kwargs,
        "device": config["device"],
        "timeout_s": float(block["timeout_s"]),
        "memory_fraction": config.get("memory_fraction"),
    }


def cell_code_hash(name: str, axes: Axes) -> str:
    return code_hash(CELL_RUNTIME + study(name).sources(axes))
