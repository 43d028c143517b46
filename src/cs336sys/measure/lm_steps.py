"""The TransformerLM workload that every LM study times (e2e, warmup, profile, memory).

One seeded model and batch per cell (:class:`LMCell`, the settings the four
studies share) and the two step
functions: an inference forward under ``torch.no_grad`` and a training step
(forward + loss, backward, optimizer step), each phase wrapped in
``clock.phase`` so CUDA events time it inside the same step and the profiler
sees its range. Profiling or measuring memory runs exactly what e2e times.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cs336sys import plugins
from cs336sys.measure import SEED, memory
from cs336sys.measure.timing import StepClock
from cs336sys.models.dtypes import autocast, set_matmul_precision
from cs336sys.models.model import TransformerLM
from cs336sys.models.optim import make_optimizer
from cs336sys.models.sizes import ModelSize, resolve_size


def build_lm(size: ModelSize, vocab_size: int, context_length: int, attention: str, device: torch.device) -> torch.nn.Module:
    """Our TransformerLM, or the user's class where the config names one (``plugins.model``, activated in this process)."""
    user = plugins.active_model()
    if user is not None:
        return build_user_lm(user, size, vocab_size, context_length, device)
    # Built on the device: initialising 3.4B parameters on the host first would take minutes.
    return TransformerLM.from_size(size, vocab_size, context_length, attention=attention, device=device)


def build_user_lm(user: tuple[str, str], size: ModelSize, vocab_size: int, context_length: int, device: torch.device) -> torch.nn.Module:
    """The user's LM with the course's constructor; it runs its own attention (the config keeps impl [eager])."""
    cls = plugins.load(*user)
    with torch.device(device):  # factory functions default to the device: no host-side copy of the weights
        model = cls(vocab_size, context_length, size.d_model, size.num_layers, size.num_heads, size.d_ff, plugins.ROPE_THETA)
    model = model.to(device)
    if not hasattr(model, "num_parameters"):  # the studies' `params` column, as our TransformerLM counts it
        model.num_parameters = lambda: sum(p.numel() for p in model.parameters())
    return model


def random_batch(batch_size: int, context_length: int, vocab_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(vocab_size, (batch_size, context_length + 1), device=device)
    return tokens[:, :-1], tokens[:, 1:]  # inputs and next-token targets


@dataclass(frozen=True)
class LMCell:
    """The model and batch of one LM cell: the settings the LM studies share (e2e, warmup, profile, memory).

    A study's ``measure(..., **lm)`` builds it once from the cell's keyword settings, which arrive
    complete from a validated config: the schema holds every default, so no field has one here and a
    missing or misspelt setting is a TypeError naming it.
    """

    size: str  # a built-in size (models.sizes) or one of extra_sizes
    context_length: int
    precision: str  # fp32 | tf32 | bf16 (models.dtypes)
    impl: str  # the attention implementation inside the model (catalog)
    batch_size: int
    vocab_size: int
    optimizer: str  # course | fused (models.optim)
    extra_sizes: Mapping[str, Mapping[str, int]]  # the config's sizes beyond the built-in table

    @property
    def spec(self) -> ModelSize:
        return resolve_size(self.size, self.extra_sizes)

    @property
    def tokens(self) -> int:
        return self.batch_size * self.context_length

    def build(self, device: torch.device, impl: str | None = None) -> torch.nn.Module:
        """The cell's model, seeded: every call draws the same weights (``impl``: another attention, a partner's model)."""
        spec = self.spec  # an unknown size fails before the seed is drawn
        torch.manual_seed(SEED)
        return build_lm(spec, self.vocab_size, self.context_length, self.impl if impl is None else impl, device)

    def setup(self, device: torch.device) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
        """Seeded model and batch: (model, inputs, targets); sets the cell's matmul precision."""
        set_matmul_precision(self.precision)
        model = self.build(device)
        inputs, targets = random_batch(self.batch_size, self.context_length, self.vocab_size, device)
        return model, inputs, targets


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


def lm_steps(
    model,
    run_model,
    inputs,
    targets,
    precision: str,
    device: torch.device,
    optimizer: str,
    memory_log: dict,
    opt: torch.optim.Optimizer | None = None,
) -> dict:
    """Mode → step function: the inference forward and the training step of one LM cell (``opt``: reuse that optimizer)."""
    opt = opt if opt is not None else make_optimizer(optimizer, model.parameters())
    return {
        "inference": inference_step_fn(run_model, inputs, precision, device),
        "train": train_step_fn(model, run_model, opt, inputs, targets, precision, device, memory_log),
    }


def graph_optimizer(name: str, model, eager: torch.optim.Optimizer | None = None) -> torch.optim.Optimizer:
    """The optimizer a captured step runs: the eager one where its step can be captured, else a capturable twin.

    The course's AdamW keeps its step count in Python, so a captured step bakes in the
    bias correction of the capture's step: every replay runs the same kernels with the
    same step size, which is all a timing needs. PyTorch's fused AdamW keeps the count
    on the GPU only with ``capturable=True``, which needs its own instance.
    """
    if name == "course" and eager is not None:
        return eager
    return make_optimizer(name, model.parameters(), **({"capturable": True} if name == "fused" else {}))


def graphed_lm_steps(
    model, run_model, inputs, targets, precision: str, device: torch.device, opt: torch.optim.Optimizer | None = None
) -> dict:
    """Mode → step that replays one CUDA graph per phase: the GPU-bound time of each phase.

    Inference is one graph (the forward). The training step is three graphs captured in
    one memory pool and replayed in order: forward with the loss, backward, optimizer
    step; each replay sits in ``clock.phase`` so CUDA events time it as in the eager step.
    The phases sum to the step: the kernels are the eager step's, launched without Python
    or launch gaps between them. ``opt`` is the optimizer to capture (default: fused AdamW,
    capturable). Each mode is warmed up on a side stream before capture, as CUDA graphs
    require. Raises RuntimeError when a mode cannot be captured (the caller records why, and
    counts the capture as the session's ``graph`` part).
    """
    opt = opt if opt is not None else make_optimizer("fused", model.parameters(), capturable=True)
    out: dict[str, torch.Tensor] = {}

    def forward_loss() -> None:
        with autocast(precision, device, cache=False):
            logits = run_model(inputs)
            out["loss"] = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def backward() -> None:
        out.pop("loss").backward()

    def inference() -> None:
        with torch.no_grad(), autocast(precision, device, cache=False):
            run_model(inputs)

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            inference()
            opt.zero_grad(set_to_none=True)
            forward_loss()
            backward()
            opt.step()
    torch.cuda.current_stream(device).wait_stream(side)
    infer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(infer):
        inference()
    # as in PyTorch's whole-network recipe: gradients are None at capture, so the captured
    # backward writes them (in the graph's pool) instead of accumulating into stale ones
    opt.zero_grad(set_to_none=True)
    train = [torch.cuda.CUDAGraph() for _ in range(3)]
    with torch.cuda.graph(train[0]):
        forward_loss()
    pool = train[0].pool()  # the backward reads what the forward saved: one pool for the three
    with torch.cuda.graph(train[1], pool=pool):
        backward()
    with torch.cuda.graph(train[2], pool=pool):
        opt.step()

    def infer_step(clock: StepClock) -> None:
        with clock.phase("forward"):
            infer.replay()

    def train_step(clock: StepClock) -> None:
        for name, graph in zip(("forward", "backward", "optimizer_step"), train):
            with clock.phase(name):
                graph.replay()

    # A graph holds raw addresses, not references: what it reads (the optimizer's state,
    # allocated in warm-up outside the pool) must outlive it.
    infer_step.keep = train_step.keep = (opt, infer, train, out)  # type: ignore[attr-defined]
    return {"inference": infer_step, "train": train_step}
