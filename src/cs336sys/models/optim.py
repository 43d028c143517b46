"""AdamW as the course writes it, and the choice against PyTorch's fused one."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

OPTIMIZERS = ("course", "fused")
DEFAULTS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


class AdamW(torch.optim.Optimizer):
    """Decoupled weight decay Adam (Loshchilov & Hutter), the CS336 assignment 1 algorithm.

    θ ← θ - lr·(m̂ / (√v̂ + ε)) - lr·λ·θ with bias correction folded into the step size.
    """

    def __init__(self, params: Iterable, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["t"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["t"] += 1
                t, m, v = state["t"], state["m"], state["v"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                step_size = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-step_size)
                p.mul_(1 - lr * wd)  # decoupled decay, applied after the Adam update as the course does
        return loss


def make_optimizer(name: str, params: Iterable, **overrides) -> torch.optim.Optimizer:
    """``course`` = the AdamW above; ``fused`` = ``torch.optim.AdamW(fused=True)`` (same hyper-parameters)."""
    kwargs = {**DEFAULTS, **overrides}
    if name == "course":
        return AdamW(params, **kwargs)
    if name == "fused":
        return torch.optim.AdamW(params, fused=True, **kwargs)
    raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
