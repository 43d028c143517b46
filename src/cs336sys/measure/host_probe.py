"""How fast this host launches work right now: the evidence behind "host-dependent".

A launch-bound step's time is set by the host's CPU, not the GPU: two H100 machines ran the warm-up
study's small eager step 45% apart (issue "intervals that hold on another machine"), and two others
(h100-d06b0e7-a, -b) the e2e study's eager rows up to 65% apart while the same phases replayed as
CUDA graphs agreed within 1.3%. A comparison of two machines must be
able to tell that apart from a slower kernel, so every timed block records the host's speed beside
the GPU's clocks: the host's microseconds per launch of a one-element ``add_`` (on a CPU device,
per dispatch of it), measured just before and just after the block (``start_host_launch_us``,
``end_host_launch_us``). On a GPU the launches are queued without a synchronisation in between,
so the figure is the host's launch path alone (a few hundred launches stay far below the queue's
depth); the probe costs 1–3 ms per sample (300 launches at 3–8 µs).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch

LAUNCHES = 100  # per block: a few hundred microseconds on a GPU host
BLOCKS = 3  # the median of three blocks: one preempted block does not move it


def launch_us(device: torch.device, launches: int = LAUNCHES, blocks: int = BLOCKS) -> float:
    """The median over ``blocks`` of the host's microseconds per launch of a tiny in-place op."""
    x = torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    for _ in range(10):  # the op's first dispatches are slower (caches, lazy init)
        x.add_(1.0)
    sync(device)
    per_launch = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(launches):
            x.add_(1.0)
        per_launch.append((time.perf_counter() - start) / launches * 1e6)
        sync(device)
    return round(statistics.median(per_launch), 3)


def with_probe(sampler: Callable[[], Mapping[str, object]], device: torch.device) -> Callable[[], dict[str, object]]:
    """``sampler`` (the GPU/host state) with ``host_launch_us`` added to each sample; never raises."""

    def sample() -> dict[str, object]:
        state = dict(sampler())
        try:
            state["host_launch_us"] = launch_us(device)
        except Exception:  # noqa: BLE001 - a probe must never cost a measurement
            state["host_launch_us"] = ""
        return state

    return sample
