"""What differs between two compared runs besides their numbers: the environment and the config.

Used by :mod:`cs336sys.runs.compare` for its report's "Environment" and "Config" sections.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from cs336sys.errors import ConfigError
from cs336sys.pipeline.config import load_yaml

ENV_FIELDS = ("device_name", "driver_version", "torch_version", "cuda_version", "git_commit", "host")


def _env_values(frames: Mapping[str, pd.DataFrame], field: str) -> str:
    values = {str(v) for df in frames.values() if field in df.columns for v in df[field].dropna() if str(v) != ""}
    return ", ".join(sorted(values))


def environment_diff(a_frames: Mapping[str, pd.DataFrame], b_frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """(field, a, b, differs) for the environment columns; several values per run are joined with ', '."""
    rows = [(f, _env_values(a_frames, f), _env_values(b_frames, f)) for f in ENV_FIELDS]
    return pd.DataFrame([(f, a, b, a != b) for f, a, b in rows], columns=["field", "a", "b", "differs"])


def flatten(cfg: Mapping, prefix: str = "") -> dict[str, Any]:
    """``cfg`` as dotted key → value, nested mappings opened (an empty one kept as a value)."""
    flat: dict[str, Any] = {}
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def config_diff(a_cfg: Mapping | None, b_cfg: Mapping | None) -> pd.DataFrame:
    """(key, a, b) for each dotted key whose value differs (None where absent); empty if either is None."""
    if a_cfg is None or b_cfg is None:
        return pd.DataFrame(columns=["key", "a", "b"])
    fa, fb = flatten(a_cfg), flatten(b_cfg)
    keys = sorted(set(fa) | set(fb))
    return pd.DataFrame(
        [(k, fa.get(k), fb.get(k)) for k in keys if k not in fa or k not in fb or fa[k] != fb[k]], columns=["key", "a", "b"]
    )


def load_config(run_dir: Path) -> Mapping | None:
    """A run's ``config.yaml`` (None where it has none), read strictly: one that is no YAML mapping is a
    :class:`cs336sys.errors.ConfigError` naming it."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    config = load_yaml(path) or {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"{path}: a run's config.yaml is a mapping of settings, not a {type(config).__name__}")
    return config
