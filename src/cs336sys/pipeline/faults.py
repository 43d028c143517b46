"""The test hook that makes cells fail on purpose, checked before anything runs.

``CS336SYS_INJECT_FAULT=<kind>[:<cell-id substring>]`` makes matching cells fail
inside the measuring child (``pipeline.cells``), so every failure path becomes a
row in tests without a real GPU. A typo in the kind would inject nothing and the
test would pass for the wrong reason, so an unknown kind stops the run. No torch.
"""

from __future__ import annotations

FAULT_ENV = "CS336SYS_INJECT_FAULT"
FAULT_KINDS = ("oom", "error", "abort", "hang")


def check_fault_spec(spec: str) -> None:
    """Reject a ``CS336SYS_INJECT_FAULT`` value whose kind is unknown (a typo would inject nothing)."""
    kind = spec.partition(":")[0]
    if spec and kind not in FAULT_KINDS:
        raise ValueError(f"{FAULT_ENV}={spec!r}: unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
