"""End-to-end TransformerLM measurements (studies ``e2e`` and ``warmup``; handout §1.1.3, §1.1.5, §1.3).

One cell measures, with the same model and batch, an inference forward
(``mode=inference``, under ``torch.no_grad``) and a training step
(``mode=train``: forward + loss, backward and optimizer step, each timed by
CUDA events inside the same step, and the whole step by the wall clock).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch
import torch.nn.functional as F

from cs336sys import memory
from cs336sys.attention import needs_cuda
from cs336sys.cells import Skip
from cs336sys.dtypes import autocast, set_matmul_precision
from cs336sys.flops import BACKWARD_FACTOR, lm_forward_flops
from cs336sys.model import TransformerLM
from cs336sys.optim import make_optimizer
from cs336sys.sizes import ModelSize, resolve_size
from cs336sys.timing import STEP, StepClock, Timing, time_steps

MODES = ("inference", "train")


def build_lm(size: ModelSize, vocab_size: int, context_length: int, attention: str, device: torch.device) -> TransformerLM:
    # Built on the device: initialising 3.4B parameters on the host first would take minutes.
    return TransformerLM.from_size(size, vocab_size, context_length, attention=attention, device=device)


def random_batch(batch_size: int, context_length: int, vocab_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(vocab_size, (batch_size, context_length + 1), device=device)
    return tokens[:, :-1], tokens[:, 1:]  # inputs and next-token targets


def setup_lm(device, size, context_length, precision, attention, batch_size, vocab_size, extra_sizes, seed):
    """Seeded model and batch of one LM cell: (size spec, model, inputs, targets)."""
    spec = resolve_size(size, extra_sizes)
    torch.manual_seed(seed)
    set_matmul_precision(precision)
    model = build_lm(spec, vocab_size, context_length, attention, device)
    inputs, targets = random_batch(batch_size, context_length, vocab_size, device)
    return spec, model, inputs, targets


def train_step_fn(model, run_model, optimizer, inputs, targets, precision: str, device: torch.device, memory_log: dict):
    """The training step every LM study times (e2e, warmup, profile, memory)."""

    def step(clock: StepClock) -> None:
        optimizer.zero_grad(set_to_none=True)
        with clock.phase("forward"), autocast(precision, device):
            logits = run_model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        memory_log["before_backward"] = memory.allocated_bytes(device)
        with clock.phase("backward"):
            loss.backward()
        with clock.phase("optimizer_step"):
            optimizer.step()

    return step


def inference_step_fn(run_model, inputs, precision: str, device: torch.device):
    def step(clock: StepClock) -> None:
        with torch.no_grad(), clock.phase("forward"), autocast(precision, device):
            run_model(inputs)

    return step


def _rows(timing: Timing, flops: Mapping[str, float | None], extra: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for phase, stats in timing.phases.items():
        yield {"phase": phase, **stats.as_row(), "flops": flops.get(phase), "warmup_s": timing.warmup_s, **extra}


def measure_e2e(
    device: torch.device,
    context: dict,
    *,
    size: str,
    context_length: int,
    precision: str,
    attention: str = "eager",
    compile: bool = False,
    warmup_steps: int = 5,
    measure_steps: int = 10,
    batch_size: int = 4,
    vocab_size: int = 10_000,
    modes: tuple[str, ...] = MODES,
    optimizer: str = "course",
    extra_sizes: Mapping[str, Mapping[str, int]] | None = None,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    if needs_cuda(attention) and device.type != "cuda":
        raise Skip(f"attention {attention!r} needs CUDA")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    spec, model, inputs, targets = setup_lm(device, size, context_length, precision, attention, batch_size, vocab_size, extra_sizes, seed)
    run_model = torch.compile(model) if compile else model
    fwd = lm_forward_flops(spec, batch_size, context_length, vocab_size)
    common = {
        "batch_size": batch_size,
        "tokens": batch_size * context_length,
        "params": model.num_parameters(),
        "memory_note": "" if device.type == "cuda" else memory.NO_CUDA_REASON,
    }

    if "inference" in modes:
        context["mode"] = "inference"
        memory.reset_peak(device)
        timing = time_steps(inference_step_fn(run_model, inputs, precision, device), warmup=warmup_steps, steps=measure_steps, device=device)
        peak = memory.peak_allocated_bytes(device)
        yield from _rows(timing, {"forward": fwd, STEP: fwd}, {"mode": "inference", **common, "peak_mem_bytes": peak})
        memory.release(device)

    if "train" in modes:
        context["mode"] = "train"
        opt = make_optimizer(optimizer, model.parameters())
        memory_log: dict[str, int | None] = {}
        memory.reset_peak(device)
        step = train_step_fn(model, run_model, opt, inputs, targets, precision, device, memory_log)
        timing = time_steps(step, warmup=warmup_steps, steps=measure_steps, device=device)
        flops = {"forward": fwd, "backward": BACKWARD_FACTOR * fwd, "optimizer_step": None, STEP: (1 + BACKWARD_FACTOR) * fwd}
        extra = {
            "mode": "train",
            **common,
            "optimizer": optimizer,
            "peak_mem_bytes": memory.peak_allocated_bytes(device),
            "mem_before_bwd_bytes": memory_log.get("before_backward"),
        }
        yield from _rows(timing, flops, extra)
