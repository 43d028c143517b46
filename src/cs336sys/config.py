"""Config validation: the JSON schema first (types, unknown keys), then what a schema cannot say.

Errors name the offending key as a dotted path (``e2e.batch_size``) and, for
model sizes, list the known ones — all before any job starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import jsonschema
import yaml

from cs336sys.sizes import known_sizes


class ConfigError(ValueError):
    pass


def _path(parts) -> str:
    return ".".join(str(p) for p in parts) or "<top level>"


def validate_schema(config: Mapping[str, Any], schema_path: str | Path) -> None:
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    lines = []
    for err in errors:
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            where = _path(err.absolute_path)
            lines += [f"unknown config key {_path(list(err.absolute_path) + [k])!r} (allowed under {where}: {', '.join(err.schema.get('properties', {}))})" for k in extra]
        else:
            lines.append(f"config key {_path(err.absolute_path)!r}: {err.message}")
    raise ConfigError("invalid config:\n  " + "\n  ".join(lines))


def validate_semantics(config: Mapping[str, Any]) -> None:
    """Checks across keys: model sizes exist, head counts divide widths."""
    sizes = known_sizes(config.get("extra_sizes") or {})
    problems = []
    size_keys = [("e2e.sizes", (config.get("e2e") or {}).get("sizes", [])), ("warmup.size", [(config.get("warmup") or {}).get("size")]),
                 ("profile.sizes", (config.get("profile") or {}).get("sizes", [])), ("memory.sizes", (config.get("memory") or {}).get("sizes", []))]  # fmt: skip
    for key, names in size_keys:
        for name in names:
            if name is not None and name not in sizes:
                problems.append(f"config key {key!r}: unknown model size {name!r}; known sizes: {', '.join(sizes)}")
    for name, size in sizes.items():
        if size.d_model % size.num_heads:
            problems.append(f"config key 'extra_sizes.{name}': d_model {size.d_model} is not divisible by num_heads {size.num_heads}")
    for study in config.get("studies", []):
        if study not in config:
            problems.append(f"config key 'studies' lists {study!r} but the config has no {study!r} section")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def coerce_command_line(config: dict) -> None:
    """``--config check_local_cuda=false`` arrives as the string 'false': make it the boolean it means."""
    value = config.get("check_local_cuda")
    if isinstance(value, str) and value.lower() in ("true", "false"):
        config["check_local_cuda"] = value.lower() == "true"


def validate_config(config: dict, schema_path: str | Path) -> None:
    coerce_command_line(config)
    validate_schema(config, schema_path)
    validate_semantics(config)
