"""A warm-up cell is an e2e cell whose warm-up step count is an axis: the same measurement, alone.

It times no partner and no CUDA-graph replay: what it measures is the cold start of its own steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from cs336sys.measure.session import Session
from cs336sys.studies.e2e import measure as e2e


def measure(
    device: torch.device,
    context: dict,
    session: Session,
    *,
    compile: bool,
    warmup_steps: int,
    measure_steps: int,
    modes: Sequence[str],
    **lm: Any,  # the LM settings the four LM studies share: measure.lm_steps.LMCell's fields
) -> Iterator[dict[str, Any]]:
    return e2e.measure(
        device,
        context,
        session,
        compile=compile,
        cuda_graphs=False,
        warmup_steps=warmup_steps,
        measure_steps=measure_steps,
        block_steps=None,
        modes=modes,
        partners=(),
        **lm,
    )
