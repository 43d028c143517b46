"""What a test passes to a study's ``measure()``: a cell's complete settings from a validated config.

``measure()`` restates no default (the schema holds them all), so a test that calls it directly
takes the keyword arguments a cell of the default config gets (``pipeline.plan.plan_cell``) and
replaces the few it cares about.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from cs336sys import studies as S
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import validate_config


@functools.cache
def _default_config(study: str) -> tuple[dict[str, Any], Any]:
    return validate_config({"run": "t", "device": "cpu", "studies": [study]})


def cell_kwargs(study: str, **values: Any) -> dict[str, Any]:
    """``measure()``'s keyword arguments for a cell of ``study`` with every default, ``values`` replacing some.

    The cell takes each axis's first default value. It times no partner unless ``partners`` is given
    (a test times its cell alone unless it says otherwise); an artifact study writes none
    (``artifact_dir`` None). A name the measurement does not take is an error, not ignored.
    """
    config, offered = _default_config(study)
    config = copy.deepcopy(config)
    axes = {axis: config[study]["grid"][axis][0] for axis in S.study(study).axes}
    kwargs = plan.plan_cell(study, axes, config, offered).kwargs()
    if "partners" in kwargs:
        kwargs["partners"] = []
    unknown = sorted(set(values) - set(kwargs))
    if unknown:
        raise TypeError(f"{study}'s measure() takes no {unknown}; it takes {sorted(kwargs)}")
    return {**kwargs, **values}
