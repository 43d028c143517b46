"""One cell as planned: a study's measurement at one point of its grid, with everything it runs under.

``pipeline.plan`` builds it once, from a validated config and the implementations the config offers. It
travels as its job's Snakemake params (:meth:`Cell.params`: exactly what should rerun the cell when it
changes) and in the warm worker's request, and is rebuilt from them by :meth:`Cell.from_params`, which
checks every field: a request another process wrote is refused field by field (``pipeline.warmcheck``).
The runner (``pipeline.cells``) measures it. Torch-free: a job's side imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cs336sys.measure.session import Policy

NUMBER = (int, float)
# a params field → the types its value may have (a bool is no number here: JSON's true is not 1)
FIELDS: dict[str, tuple[type, ...]] = {
    "study": (str,),
    "cell_id": (str,),
    "axes": (dict,),
    "target": (str,),
    "settings": (dict,),
    "device": (str,),
    "policy": (dict,),
    "plugins": (dict,),
    "memory_fraction": (*NUMBER, type(None)),
    "cache_dir": (str, type(None)),
    "pass_index": (int,),
}
REQUIRED = ("study", "cell_id", "axes", "target")


@dataclass(frozen=True)
class Cell:
    study: str
    cell_id: str
    axes: Mapping[str, Any]  # the grid coordinates: keyword arguments of the measurement, copied into every row
    target: str  # "module:function" of the measurement generator
    settings: Mapping[str, Any] = field(default_factory=dict)  # its other keyword arguments (the study's settings, partners…)
    device: str = "cuda"  # cuda | cpu | auto
    policy: Policy = field(default_factory=Policy)  # how it times (measure.session)
    plugins: Mapping[str, Any] = field(default_factory=dict)  # the user's code this cell runs (cs336sys.plugins.cell_plugins)
    memory_fraction: float | None = None
    cache_dir: str | None = None  # Triton's and torch.compile's on-disk caches: a rerun compiles and autotunes nothing
    pass_index: int = 0  # which pass over the grid (analysis.passes); copied into every row
    # The job's, not the cell's: no params, so changing them reruns nothing. The time limit covers the wait for
    # a GPU too. torch's intra-op threads in a CPU cell (None: one): its shapes are tiny, and two threads on a
    # loaded two-core machine made a tiny model's step 20-80x slower (OpenMP's barriers wait for a descheduled thread).
    timeout_s: float = 600.0
    threads: int | None = None
    # The study's passes: each pass takes its share of the pairs and of max_measure_s (Policy.passes). The job's
    # too: adding a pass reruns the new pass only, and the passes measured keep what they measured.
    passes: int = 1

    def kwargs(self) -> dict[str, Any]:
        """The measurement's keyword arguments: its settings and its axes; a measurement that writes artifacts
        (an ``artifact_dir`` setting) also gets the cell id, to name them."""
        named = {"cell_id": self.cell_id} if "artifact_dir" in self.settings else {}
        return {**self.settings, **self.axes, **named}

    def params(self) -> dict[str, Any]:
        """The cell as its job's params: plain data, plug-ins only where it runs some (adding a plug-in reruns no other cell)."""
        out = {name: getattr(self, name) for name in FIELDS}
        policy = {k: v for k, v in dataclasses.asdict(self.policy).items() if k != "passes"}  # the job's (``passes``)
        out.update(axes=dict(self.axes), settings=dict(self.settings), policy=policy)
        plugins = out.pop("plugins")
        return {**({"plugins": dict(plugins)} if plugins else {}), **out}

    @classmethod
    def from_params(cls, params: Any, **job: Any) -> Cell:
        """The cell whose :meth:`params` are ``params`` (``job``: ``timeout_s``, ``threads``, ``passes``); ValueError names a field
        that is missing, unknown or of the wrong type."""
        if not isinstance(params, Mapping):
            raise ValueError(f"a cell's params are a mapping, not {type(params).__name__}")
        unknown = sorted(set(params) - set(FIELDS))
        missing = [name for name in REQUIRED if name not in params]
        if unknown or missing:
            raise ValueError(f"a cell's params: unknown fields {unknown}, missing {missing} (fields: {', '.join(FIELDS)})")
        for name, value in params.items():
            if not isinstance(value, FIELDS[name]) or (isinstance(value, bool) and bool not in FIELDS[name]):
                allowed = " or ".join(t.__name__ for t in FIELDS[name])
                raise ValueError(f"a cell's field {name!r}: {type(value).__name__} (allowed: {allowed})")
        policy = params.get("policy", {})
        known = {f.name for f in dataclasses.fields(Policy)}
        if set(policy) - known or not all(isinstance(v, NUMBER) and not isinstance(v, bool) for v in policy.values()):
            raise ValueError(f"a cell's field 'policy': {policy!r} (allowed: numbers under {', '.join(sorted(known))})")
        return cls(**{**params, "policy": Policy(**policy)}, **job)
