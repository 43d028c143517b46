"""The TransformerLM workload that every LM study times (e2e, warmup, profile, memory).

One seeded model and batch per cell (:func:`setup_lm`) and the two step
functions: an inference forward under ``torch.no_grad`` and a training step
(forward + loss, backward, optimizer step), each phase wrapped in
``clock.phase`` so CUDA events time it inside the same step and the profiler
sees its range. Profiling or measuring memory runs exactly what e2e times.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cs336sys.measure import memory
from cs336sys.measure.timing import StepClock
from cs336sys.models.dtypes import autocast, set_matmul_precision
from cs336sys.models.model import TransformerLM
from cs336sys.models.optim import make_optimizer
from cs336sys.models.sizes import ModelSize, resolve_size


def build_lm(size: ModelSize, vocab_size: int, context_length: int, attention: str, device: torch.device) -> TransformerLM:
    # Built on the device: initialising 3.4B parameters on the host first would take minutes.
    return TransformerLM.from_size(size, vocab_size, context_length, attention=attention, device=device)


def random_batch(batch_size: int, context_length: int, vocab_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(vocab_size, (batch_size, context_length + 1), device=device)
    return tokens[:, :-1], tokens[:, 1:]  # inputs and next-token targets


def setup_lm(device, size, context_length, precision, impl, batch_size, vocab_size, extra_sizes, seed):
    """Seeded model and batch of one LM cell: (size spec, model, inputs, targets)."""
    spec = resolve_size(size, extra_sizes)
    torch.manual_seed(seed)
    set_matmul_precision(precision)
    model = build_lm(spec, vocab_size, context_length, impl, device)
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


def lm_steps(model, run_model, inputs, targets, precision: str, device: torch.device, optimizer: str, memory_log: dict) -> dict:
    """Mode → step function: the inference forward and the training step of one LM cell."""
    opt = make_optimizer(optimizer, model.parameters())
    return {
        "inference": inference_step_fn(run_model, inputs, precision, device),
        "train": train_step_fn(model, run_model, opt, inputs, targets, precision, device, memory_log),
    }


def graphed_lm_steps(model, run_model, inputs, targets, precision: str, device: torch.device) -> dict:
    """Mode → step that replays one CUDA graph of the whole inference forward or training step.

    The training step (forward, loss, backward, fused AdamW with ``capturable=True``,
    so the step count lives on the GPU and every replay is a real optimizer step) is
    the same computation as the eager step, launched as one graph: its time is what the
    GPU needs, free of Python and launch overhead. Each graph is warmed up on a side
    stream before capture, as CUDA graphs require. Raises RuntimeError when a mode
    cannot be captured (the caller records why).
    """
    opt = make_optimizer("fused", model.parameters(), capturable=True)

    def train() -> None:
        with autocast(precision, device, cache=False):
            logits = run_model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        opt.step()

    def inference() -> None:
        with torch.no_grad(), autocast(precision, device, cache=False):
            run_model(inputs)

    graphs = {}
    for mode, body in (("inference", inference), ("train", train)):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                body()
        torch.cuda.current_stream(device).wait_stream(side)
        # as in PyTorch's whole-network recipe: gradients are None at capture, so the captured
        # backward writes them (in the graph's pool) instead of accumulating into stale ones
        opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        graphs[mode] = graph
    # A graph holds raw addresses, not references: the optimizer's state (allocated in warm-up, outside
    # the graph's pool) must outlive it, or freed and reused memory is what a replay updates.
    return {mode: (lambda clock, g=g, keep=(opt, inference, train): g.replay()) for mode, g in graphs.items()}
