"""Config validation: the JSON schema fills defaults and checks types, then the checks a schema cannot say.

Errors name the offending key as a dotted path (``e2e.batch_size``) and what is
allowed, all before any job starts. The schema's ``default:`` values are the
only defaults (``pipeline.schema`` assembles it: the run-wide keys, then each
study's own section): validation writes them into the config, so the workflow,
the CLI and the report all see the same complete settings.

Strict on purpose: an integer key takes no float (``2.0``) and a number key no bool; a pattern's
``$`` is the end of the text (Python's ``$`` also matches before a final newline); a run of more
than ``max_cell_jobs`` cell jobs is refused before any is planned, and a run whose snapshot says
another device path (``RUN_WIDE_KEYS``, a GPU sweep's ``check_local_cuda``) unless ``overwrite: true``. Files are read by
``pipeline.config_file`` (YAML 1.1 surprises, size and alias limits, empty study blocks).
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from cs336sys import catalog
from cs336sys.models.sizes import MODEL_SIZES, known_sizes
from cs336sys.pipeline.config_file import ConfigError, check_size, load_yaml  # the strict reader, its limits
from cs336sys.pipeline.schema import SCHEMA_PATH, load_schema  # the run-wide keys and each study's section, assembled

# top-level keys in every cell's params (pipeline.plan.plan_cell): changing one remeasures every cell of a run
RUN_WIDE_KEYS = ("device", "memory_fraction", "cache_dir")


def _path(parts) -> str:
    return ".".join(str(p) for p in parts) or "<top level>"


def _fill_defaults(validator_class, root: Mapping[str, Any]):
    """A validator that writes each property's ``default`` into the instance before checking it."""
    check_properties = validator_class.VALIDATORS["properties"]

    def resolve(sub: Mapping[str, Any]) -> Mapping[str, Any]:
        while "$ref" in sub and "default" not in sub:  # only local "#/$defs/<name>" references here
            sub = root["$defs"][sub["$ref"].rpartition("/")[2]]
        return sub

    def properties(validator, props, instance, schema):
        if isinstance(instance, dict):
            for name, sub in props.items():
                sub = resolve(sub)
                if name not in instance and "default" in sub:
                    instance[name] = _copy(sub["default"])
        yield from check_properties(validator, props, instance, schema)

    # JSON Schema's bounds are all False for NaN, so `minimum: 0` lets NaN through; inf passes a lower bound
    def finite_bound(keyword: str):
        check_bound = validator_class.VALIDATORS[keyword]

        def bound(validator, value, instance, schema):
            if isinstance(instance, float) and not math.isfinite(instance):
                if keyword == next(k for k in _BOUNDS if k in schema):  # one error per value, not one per bound
                    yield jsonschema.ValidationError(f"{instance} is not a finite number (allowed: {_bounds_text(schema)})")
                return
            yield from check_bound(validator, value, instance, schema)

        return bound

    def pattern(validator, regex, instance, schema):
        if validator.is_type(instance, "string") and not re.search(_ecma_end(regex), instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {regex!r}")

    # JSON Schema counts 2.0 as an integer; a float where a count is meant crashes later (range(2.0))
    integers = validator_class.TYPE_CHECKER.redefine("integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    extra = {"properties": properties, "pattern": pattern, **{k: finite_bound(k) for k in _BOUNDS}}
    return jsonschema.validators.extend(validator_class, extra, type_checker=integers)


def _ecma_end(regex: str) -> str:
    """A schema pattern's final ``$`` as JSON Schema (ECMA 262) means it: the end of the text, not before a final newline."""
    return regex[:-1] + r"\Z" if regex.endswith("$") and not regex.endswith(r"\$") else regex


_BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
_BOUND_SIGNS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _bounds_text(schema: Mapping[str, Any]) -> str:
    return "a number " + " and ".join(f"{_BOUND_SIGNS[k]} {schema[k]}" for k in _BOUNDS if k in schema)


def _copy(value: Any) -> Any:
    return yaml.safe_load(yaml.safe_dump(value))


def validate_schema(config: dict, schema: Mapping[str, Any]) -> None:
    validator = _fill_defaults(jsonschema.Draft202012Validator, schema)(schema)
    # a study listed without its section takes every default (`null` counts as absent)
    for name in config.get("studies") or []:
        if isinstance(name, str) and name in schema["properties"] and config.get(name) is None:
            config[name] = {}
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    lines = []
    for err in errors:
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            where = _path(err.absolute_path)
            allowed = ", ".join(err.schema.get("properties", {}))
            lines += [f"unknown config key {_path(list(err.absolute_path) + [k])!r} (allowed under {where}: {allowed})" for k in extra]
        elif err.validator == "pattern":  # a name: a path component of results/ and report/, or a device-name substring
            rule = err.schema.get("description", "see the schema")
            lines.append(
                f"config key {_path(err.absolute_path)!r}: {err.instance!r} is not a valid name "
                f"(allowed: {rule}; pattern {err.validator_value})"
            )
        elif err.validator == "minItems" and "enum" in err.schema.get("items", {}):
            choices = ", ".join(map(str, err.schema["items"]["enum"]))
            lines.append(f"config key {_path(err.absolute_path)!r}: {err.message} (choose from {choices})")
        else:
            lines.append(f"config key {_path(err.absolute_path)!r}: {err.message}")
    raise ConfigError("invalid config:\n  " + "\n  ".join(lines))


def _numbers(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, float]]:
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _numbers(sub, path + (key,))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _numbers(sub, path + (i,))
    elif isinstance(value, float):
        yield path, value


def validate_semantics(config: Mapping[str, Any], offered: catalog.Catalog) -> None:
    """Checks across keys: finite numbers, model sizes exist and are sound, grids (of ``offered``'s names) are not empty."""
    from cs336sys import studies as S
    from cs336sys.pipeline.plan import cells

    problems = [
        f"config key {_path(p)!r}: {v} is not a finite number (allowed: a finite number)"
        for p, v in _numbers(dict(config))
        if not math.isfinite(v)
    ]
    extra = config.get("extra_sizes") or {}
    problems += [
        f"config key 'extra_sizes.{name}': {name!r} is a built-in size; give the extra size another name "
        f"(built-in: {', '.join(MODEL_SIZES)})"
        for name in extra
        if name in MODEL_SIZES
    ]
    sizes = known_sizes({k: v for k, v in extra.items() if k not in MODEL_SIZES})
    for name, size in sizes.items():
        if size.d_model % size.num_heads:
            problems.append(f"config key 'extra_sizes.{name}': d_model {size.d_model} is not divisible by num_heads {size.num_heads}")
        elif (size.d_model // size.num_heads) % 2:
            problems.append(
                f"config key 'extra_sizes.{name}': head dimension d_model/num_heads = {size.d_model // size.num_heads} is odd; RoPE needs it even"
            )
    for study in config.get("studies", []):
        grid = (config.get(study) or {}).get("grid") or {}
        for name in grid.get("size", []):
            if name not in sizes:
                problems.append(f"config key '{study}.grid.size': unknown model size {name!r}; known sizes: {', '.join(sizes)}")
    if not problems:
        for study in config.get("studies", []):
            if not cells(study, config[study], offered):
                why = S.study(study).why_invalid or "every combination is invalid"
                grid = "; ".join(f"{axis} {config[study]['grid'][axis]}" for axis in S.study(study).axes)
                problems.append(f"config key '{study}.grid': no valid cell: {why} (this grid: {grid})")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def coerce_command_line(config: dict, schema: Mapping[str, Any] | None = None) -> None:
    """``--config check_local_cuda=false`` arrives as the string 'false', ``--config cache_dir=null`` as 'null':
    make each the boolean or the null it means, for the top-level keys whose schema allows one.

    A cache directory named null is spelled ``./null``.
    """
    schema = schema or load_schema()
    for key, sub in schema["properties"].items():
        value = config.get(key)
        if not isinstance(value, str):
            continue
        kinds = sub.get("type", [])
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if "boolean" in kinds and value.lower() in ("true", "false"):
            config[key] = value.lower() == "true"
        elif "null" in kinds and value in ("null", "Null", "NULL", "~"):
            config[key] = None


def check_grid_size(config: Mapping[str, Any]) -> None:
    """Refuse a run of more than ``max_cell_jobs`` cell jobs before any is planned.

    Counted from the axis lengths alone (an upper bound: invalid combinations are dropped later), times
    each study's passes: a 10^5-cell grid took 6 minutes and 2.2 GB to plan.
    """
    from cs336sys import studies as S

    limit = config["max_cell_jobs"]  # filled in by the schema
    total, parts = 0, []
    for study in config.get("studies") or []:
        section = config.get(study) or {}
        lengths = [len(section.get("grid", {}).get(axis) or [None]) for axis in S.study(study).axes]
        cells, passes = math.prod(lengths), section.get("passes", 1)
        total += cells * passes
        parts.append(f"{study}: {' × '.join(map(str, lengths))} = {cells} cells" + (f" × {passes} passes" if passes > 1 else ""))
    if total > limit:
        raise ConfigError(
            f"invalid config:\n  config key 'max_cell_jobs': the grids make {total} cell jobs ({'; '.join(parts)}); "
            f"a run plans at most {limit} (config/full.yaml makes about 3300): split the grids over several runs, "
            "or raise max_cell_jobs"
        )


# --- the default run name: `run: auto` (the schema's default) names the run after the GPU -------
AUTO_RUN = "auto"
_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro"}
_MODEL_SUFFIXES = {"ti", "super", "ada"}  # part of the model: an RTX 4070 Ti is not an RTX 4070


def run_name_for(gpu_name: str | None) -> str:
    """A run name from a GPU's NVML name; None (no GPU) is "cpu".

    The model is the first word with a digit, after the vendor words: "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA A100-SXM4-80GB" -> "a100", "Tesla V100-SXM2-16GB" -> "v100". A bare number keeps the words
    before it and a Ti/Super/Ada after it: "NVIDIA GeForce RTX 4090" -> "rtx4090", "GeForce GTX 1080 Ti" -> "gtx1080ti".
    """
    if gpu_name is None:
        return "cpu"
    words = [w for w in re.split(r"[\s_-]+", gpu_name.lower()) if w and w not in _VENDOR_WORDS]
    name = "-".join(words)  # no model number at all ("NVIDIA TITAN V"): every word
    for i, word in enumerate(words):
        if any(c.isdigit() for c in word):
            prefix = "".join(words[:i]) if word.isdigit() else ""
            suffix = ""
            for extra in words[i + 1 :]:
                if extra not in _MODEL_SUFFIXES:
                    break
                suffix += extra
            name = prefix + word + suffix
            break
    name = re.sub(r"[^a-z0-9.+-]", "", name).lstrip(".+-")  # the schema's name pattern: a path component
    return name[:64] or "gpu"


def detected_gpu_name() -> str | None:
    """The NVML name of the first GPU this process may use ("" if it cannot be read), None without one.

    NVML, then nvidia-smi, never torch: the workflow's parse must not import it.
    """
    from cs336sys.pipeline.gpulock import visible_gpus

    gpus = visible_gpus()
    if not gpus:
        return None
    uuid = gpus[0].uuid
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByUUID(uuid))
            return name.decode() if isinstance(name, bytes) else str(name)  # bytes from older bindings
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - ImportError, NVMLError, OSError: ask nvidia-smi instead
        pass
    try:
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", f"--id={uuid}"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""


def resolve_run_name(config: dict) -> None:
    """Replace ``run: auto`` by the device's name: "cpu" for device: cpu, else the GPU's model ("cpu" without one)."""
    if config.get("run") != AUTO_RUN:
        return
    if config.get("device") == "cpu":
        config["run"] = "cpu"
    elif not config.get("check_local_cuda", True):
        # a SLURM login node: this machine's GPU (or none) is not the one the cells run on, and each job
        # parses the workflow again on its own node: the two would name different output paths
        raise ConfigError(
            "invalid config:\n  config key 'run': 'auto' names the run after this machine's GPU, but "
            "check_local_cuda: false says the cells run elsewhere: name the run, e.g. --config run=h100"
        )
    else:
        config["run"] = run_name_for(detected_gpu_name())


def validate_config(config: dict, schema_path: str | Path = SCHEMA_PATH, check_imports: str = "") -> tuple[dict, catalog.Catalog]:
    """Fill defaults into ``config`` and check it; raises ConfigError naming each bad key. Answers the config and
    the implementations it offers: the built-in lines and its ``plugins`` (their names join the schema's ``impl``
    enums), a view to pass to what plans its cells. No module state changes: nothing is registered.

    ``check_imports``: ``subprocess`` (the workflow's parse, which must not import torch) or
    ``here`` also imports the user's code and checks it; "" does not.
    """
    from cs336sys import plugin_imports, plugins
    from cs336sys import studies as S

    check_size(config)
    config["plugins"] = plugins.normalise(config.get("plugins"))  # with its defaults (form: adapter)
    offered = plugins.offered(config["plugins"])
    schema = load_schema(schema_path, offered)
    coerce_command_line(config, schema)
    validate_schema(config, schema)
    resolve_run_name(config)
    check_grid_size(config)
    plugins.check_lm_studies(config, {name: S.study(name).kind for name in config["studies"]})
    validate_semantics(config, offered)
    if check_imports == "subprocess":
        plugin_imports.check_imports_in_subprocess(config["plugins"])
    elif check_imports == "here":
        plugin_imports.check_imports(config["plugins"])
    return config, offered


def _shown(value: Any) -> str:
    """A value as the config file spells it: null, true, false, the rest as it prints."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _device_path(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run-wide keys that decide where a run's cells measure: ``RUN_WIDE_KEYS``, and for a GPU sweep whether
    this machine's GPU is checked (false: a cluster's nodes, or cells ``skipped`` on a host whose GPU is gone)."""
    keys = RUN_WIDE_KEYS + (("check_local_cuda",) if config.get("device") == "cuda" else ())
    return {key: config.get(key) for key in keys if key in config}


def check_run_snapshot(config: Mapping[str, Any], snapshot_path: str | Path) -> None:
    """Refuse to remeasure a run whose snapshot says another device path (:func:`_device_path`), unless ``overwrite: true``.

    Its cells would run again, on another device or none, and their rows replace the run's (``ok`` rows by
    ``skipped`` ones where the GPU is gone), with exit status 0.
    """
    path = Path(snapshot_path)
    if config.get("overwrite") or not path.is_file():
        return
    old = load_yaml(path)
    if not isinstance(old, dict):
        raise ConfigError(f"{path} is not a run's settings snapshot (a mapping); remove it, or pass --config overwrite=true")
    run = config.get("run")
    lines = [
        f"config key {key!r}: run {run!r} was measured with {key}: {_shown(old[key])} ({path}); this config says {key}: {_shown(value)}"
        for key, value in _device_path(config).items()
        if key in old and old[key] != value
    ]
    if lines:
        how = f"name another run (--config run={run}-2, or run: in the config), or pass --config overwrite=true to remeasure this one"
        lines.append(f"its cells would be measured again on another device path, and their rows would replace the run's: {how}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines))


def settings_snapshot(config: Mapping[str, Any]) -> dict:
    """A validated config without each study's ``timeout_s`` and ``resources``: what a run's numbers depend on.

    Job limits change no measured number, so changing them must not rewrite a run's
    snapshot (and with it its report).
    """
    snapshot = _copy(dict(config))
    for key in ("warm_worker", "overwrite", "max_cell_jobs"):  # how jobs start and what may run, not what they measure
        snapshot.pop(key, None)
    (snapshot.get("plugins") or {}).pop("import_timeout_s", None)  # how long the check may take, likewise
    for study in snapshot.get("studies") or []:
        for key in ("timeout_s", "resources"):
            (snapshot.get(study) or {}).pop(key, None)
    return snapshot
