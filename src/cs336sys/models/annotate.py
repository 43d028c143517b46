"""Named ranges for profilers, free when none is attached.

``torch.profiler.record_function`` costs a dispatcher call even with no
profiler running, so it is entered only while one is; NVTX ranges (for nsys)
are switched on by the environment variable ``CS336SYS_NVTX=1``, which the
nsys rule sets: no second copy of the model is needed for profiling.
"""

from __future__ import annotations

import contextlib
import os
from typing import ContextManager

import torch
from torch.autograd import profiler as _autograd_profiler


def _nvtx_enabled() -> bool:
    return os.environ.get("CS336SYS_NVTX") == "1" and torch.cuda.is_available()


@contextlib.contextmanager
def _both(name: str):
    with contextlib.ExitStack() as stack:
        if _autograd_profiler._is_profiler_enabled:
            stack.enter_context(torch.profiler.record_function(name))
        if _nvtx_enabled():
            stack.enter_context(torch.cuda.nvtx.range(name))
        yield


def annotate(name: str) -> ContextManager[None]:
    """A profiler/NVTX range named ``name``; a no-op context when nothing listens."""
    if _autograd_profiler._is_profiler_enabled or _nvtx_enabled():
        return _both(name)
    return contextlib.nullcontext()
