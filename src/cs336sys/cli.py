"""``cs336sys``: measure one cell of a study and print its rows as a table.

Every subcommand is a study from the registry; its flags are the study's axes
(one value each) and settings, named as in the config and the CSV columns, with
the schema's defaults. The cell is validated by the workflow's schema, gets the
workflow's cell id and runs through the same cell runner, so an OOM is a row.

Seconds on a CPU:
    cs336sys e2e --size tiny --context-length 32 --measure-steps 3 --device cpu
    cs336sys attention --d-model 16 --seq-len 128 --measure-steps 5 --device cpu
On a GPU:
    cs336sys e2e --size small --context-length 512 --precision bf16 --impl sdpa
    cs336sys attention --d-model 64 --seq-len 4096 --activation relu
    cs336sys mha --embed-dim 256 --num-heads 8 --seq-len 1024 --variant performer --num-features 128
    cs336sys flash --seq-len 16384 --head-dim 64 --num-heads 16 --impl triton
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cs336sys import catalog
from cs336sys import studies as S
from cs336sys.cli_result import result_tables
from cs336sys.pipeline import plan
from cs336sys.pipeline.config import ConfigError, load_schema, validate_config
from cs336sys.pipeline.config_file import load_config_file

# a size small enough for the CPU examples above (the built-in sizes take minutes on a CPU): the CPU
# demo's `tiny` (config/cpu-demo.yaml's extra_sizes, a test keeps the two equal); a --config may redefine it
CPU_SIZES = {"tiny": {"d_model": 64, "d_ff": 256, "num_layers": 2, "num_heads": 4}}
RUN_FLAGS = ("device", "timeout", "memory_fraction", "config", "csv")
# what `--config FILE` may hold: these top-level keys and the study's own section (a flag wins over the file);
# every other key is refused by name, never ignored
CONFIG_APPLIES = ("device", "memory_fraction", "cache_dir", "extra_sizes", "peak_tflops", "peak_gbps", "flags", "plugins")
CONFIG_REFUSES = {"interval_floor_rel": "it widens merged intervals, and the CLI prints one cell's rows unmerged"}
SECTION_REFUSES = {"passes": "the CLI measures one pass of one cell", "resources": "job resources of a workflow run"}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _resolve(schema: Mapping, sub: Mapping) -> Mapping:
    while "$ref" in sub:
        sub = {**schema["$defs"][sub["$ref"].rpartition("/")[2]], **{k: v for k, v in sub.items() if k != "$ref"}}
    return sub


def _value_type(schema: Mapping, sub: Mapping):
    """argparse type and choices of one schema value (an axis's list item, or a scalar setting)."""
    sub = _resolve(schema, sub)
    if "enum" in sub:
        return str, list(sub["enum"])
    kind = sub.get("type")
    if kind == "boolean":
        return None, None  # a --flag/--no-flag pair
    return {"integer": int, "number": float}.get(kind, str), None


def _show(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _add_value(p: argparse.ArgumentParser, schema: Mapping, key: str, sub: Mapping, help_: str, many: bool = False) -> None:
    """A flag for one schema value: a --flag/--no-flag pair for a boolean; ``many``: a list's values. Its default is None:
    not given, so the --config file's value or the schema's default applies (:func:`_cli_config`)."""
    typ, choices = _value_type(schema, sub)
    if typ is None:
        p.add_argument(_flag(key), action=argparse.BooleanOptionalAction, default=None, help=help_)
    else:
        p.add_argument(_flag(key), type=typ, choices=choices, default=None, help=help_, **({"nargs": "+"} if many else {}))


def _add_study(sub, schema: Mapping, name: str) -> None:
    spec = S.study(name)
    section = schema["properties"][name]
    p = sub.add_parser(name, help=spec.question, description=spec.question)
    grid = section["properties"]["grid"]["properties"]
    for axis in spec.axes:
        item = _resolve(schema, grid[axis])
        default = item.get("default", [None])[0]
        help_ = f"grid axis: one value here, a list in a config (default: the --config file's one value, else {default})"
        _add_value(p, schema, axis, item.get("items", {}), help_)
    for key, sub_schema in section["properties"].items():
        if key not in plan.JOB_KEYS + spec.cell_keys:
            sub_schema = _resolve(schema, sub_schema)
            many = sub_schema.get("type") == "array"
            help_ = f"(default: {_show(sub_schema.get('default'))})"
            _add_value(p, schema, key, sub_schema["items"] if many else sub_schema, help_, many)
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default=None,
        help="where to run; auto: CUDA if present (default: the --config file's device, else auto)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"time limit of the cell in seconds (default: the --config file's {name}.timeout_s, else "
        f"{_show(_resolve(schema, section['properties']['timeout_s']).get('default'))})",
    )
    p.add_argument("--memory-fraction", type=float, default=None, help="cap GPU memory to this fraction of the card, in (0, 1]")
    p.add_argument(
        "--config",
        default=None,
        help=f"a config file (YAML) whose {', '.join(CONFIG_APPLIES)} and {name} section (one value per grid axis, "
        f"timeout_s; not passes, resources) apply; any other key is an error",
    )
    p.add_argument("--csv", default=None, help="also write the rows to this CSV file (atomically)")


def build_parser(offered: catalog.Catalog = catalog.BUILT_IN) -> argparse.ArgumentParser:
    """The parser, whose ``--impl`` choices are ``offered``'s (the ``--config`` file's plug-ins included: :func:`_offered`)."""
    parser = argparse.ArgumentParser(prog="cs336sys", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="study", required=True)
    schema = load_schema(offered=offered)
    for name in S.STUDIES:
        _add_study(sub, schema, name)
    return parser


def _config_file(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The ``--config`` file, read as the workflow reads a config file; a key the CLI cannot apply is an error."""
    try:
        base = load_config_file(args.config)
    except ConfigError as exc:
        parser.error(f"--config: {exc}")
    known = load_schema()["properties"]
    unknown = [key for key in base if key not in known]
    if unknown:
        parser.error(f"--config {args.config}: unknown config key {unknown[0]!r} (allowed at the top level: {', '.join(known)})")
    for key in ("extra_sizes", "peak_tflops", "peak_gbps", args.study):
        if base.get(key) is not None and not isinstance(base[key], dict):
            parser.error(f"--config {args.config}: config key {key!r} must be a mapping, not {type(base[key]).__name__}")
    refused = []
    for key in base:
        if key in S.STUDIES and key != args.study:
            refused.append(f"config key {key!r}: the CLI measures one {args.study} cell, so {key} settings do not apply")
        elif key not in CONFIG_APPLIES and key != args.study:
            why = CONFIG_REFUSES.get(key, "a workflow setting: it does not apply to one cell")
            refused.append(f"config key {key!r}: {why}")
    section = base.get(args.study) or {}
    refused += [f"config key '{args.study}.{key}': {why}" for key, why in SECTION_REFUSES.items() if key in section]
    if refused:
        allowed = f"{', '.join(CONFIG_APPLIES)} and the {args.study} section but its {' and '.join(SECTION_REFUSES)}"
        parser.error(f"--config {args.config}: keys the CLI cannot apply (remove them; it applies {allowed}):\n  " + "\n  ".join(refused))
    return base


def _axis_values(args: argparse.Namespace, grid: Mapping[str, Any], parser: argparse.ArgumentParser) -> tuple[dict, set]:
    """This cell's axis values: the flag's, else the file's only value, else the schema's default; and the axes the file set."""
    schema = load_schema()
    defaults = schema["properties"][args.study]["properties"]["grid"]["properties"]
    values, from_file = {}, set()
    for axis in S.study(args.study).axes:
        if getattr(args, axis) is not None:
            values[axis] = getattr(args, axis)
        elif axis in grid:
            listed = grid[axis]
            if isinstance(listed, list) and len(listed) > 1:
                parser.error(
                    f"--config {args.config}: config key '{args.study}.grid.{axis}' lists {len(listed)} values "
                    f"{listed}; the CLI measures one cell: pick one with {_flag(axis)}"
                )
            values[axis] = listed[0] if isinstance(listed, list) and listed else listed
            from_file.add(axis)
        else:
            values[axis] = _resolve(schema, defaults[axis]).get("default", [None])[0]
    return values, from_file


def _cli_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[dict[str, Any], catalog.Catalog]:
    """The workflow config that holds exactly this one cell, validated by the workflow's schema, and the implementations it offers.

    Resolves ``args.device`` and ``args.timeout`` too: a flag, else the ``--config`` file, else the default.
    """
    base = _config_file(args, parser) if args.config else {}
    spec = S.study(args.study)
    section = copy.deepcopy(base.get(args.study) or {})
    values, from_file = _axis_values(args, section.get("grid") or {}, parser)
    section["grid"] = {axis: [value] for axis, value in values.items()}
    for key, value in vars(args).items():
        if key not in spec.axes and key not in RUN_FLAGS and key != "study" and value is not None:
            section[key] = value
    if args.device is None:
        args.device = base.get("device", "auto")
    config = {key: copy.deepcopy(base[key]) for key in CONFIG_APPLIES if key in base}
    config.update(
        run="cli",
        device="cuda" if args.device == "auto" else args.device,
        check_local_cuda=False,
        studies=[args.study],
        extra_sizes={**CPU_SIZES, **(base.get("extra_sizes") or {})},
        peak_tflops=base.get("peak_tflops") or {},
        peak_gbps=base.get("peak_gbps") or {},
    )
    config[args.study] = section
    if args.memory_fraction is not None:
        config["memory_fraction"] = args.memory_fraction
    try:
        # in a child, as the workflow does: a plug-in's import that hangs, exits or changes directory cannot reach this process
        config, offered = validate_config(config, check_imports="subprocess")
    except ConfigError as exc:
        parser.error(_name_flags(str(exc), args, values, from_file))
    if args.timeout is None:
        args.timeout = float(config[args.study]["timeout_s"])  # the file's, else the schema's default (validation wrote it)
    return config, offered


def _name_flags(message: str, args: argparse.Namespace, values: Mapping[str, Any], from_file: set) -> str:
    """Config key paths → the flags that set them: 'e2e.grid.context_length.0' → '--context-length'.

    A key that no flag set came from ``--config``'s file and keeps its config name, with the file's.
    """
    spec = S.study(args.study)
    flagged = (set(spec.axes) - from_file) | {k for k, v in vars(args).items() if v is not None and k not in RUN_FLAGS and k != "study"}

    def name(m: re.Match) -> str:
        key = m.group(1)
        if key == "grid":  # 'no valid cell': the axes' flags together make the impossible combination
            return "these flags"
        if key in flagged:
            return f"flag '{_flag(key)}'"
        return f"{m.group(0)} (in --config {args.config})" if args.config else m.group(0)

    message = re.sub(rf"config key '{args.study}\.(?:grid\.)?(\w+?)(?:\.\d+)?'", name, message)
    if args.config:  # top-level keys that no flag set (main checked the flags' values before)
        message = re.sub(
            r"config key '((?:device|memory_fraction|cache_dir|extra_sizes|peak_tflops|peak_gbps|flags)(?:\.[^']*)?)'",
            rf"config key '\1' (in --config {args.config})",
            message,
        )
    axes = " ".join(_flag_text(axis, values[axis]) for axis in spec.axes)
    return re.sub(r"these flags: no valid cell: (.*?) \(this grid: [^\n]*\)", rf"these flags make no valid cell ({axes}): \1", message)


def _flag_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return _flag(key) if value else "--no-" + key.replace("_", "-")
    return f"{_flag(key)} {_show(value)}"


def command_line(study: str, axes: Mapping[str, Any], config: Mapping[str, Any], target: str = "e2e") -> str:
    """Flags of ``cs336sys <target>`` that run the same cell as ``study``'s ``axes`` under ``config`` (the nsys rule)."""
    known = set(S.study(target).axes) | set(load_schema()["properties"][target]["properties"])
    settings = {
        k: v for k, v in {**config[study], **axes}.items() if k in known and k not in plan.JOB_KEYS and not isinstance(v, (list, dict))
    }
    flags = [
        f"{_flag(k)} {v}" if not isinstance(v, bool) else (_flag(k) if v else "--no-" + k.replace("_", "-")) for k, v in settings.items()
    ]
    return " ".join(flags + ["--device cuda", "--modes inference train"])


def _offered(argv: Sequence[str] | None) -> catalog.Catalog:
    """The implementations the ``--config`` file offers (its ``plugins`` names), for the parser's ``--impl`` choices."""
    argv = list(sys.argv[1:] if argv is None else argv)
    files = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"] + [
        a.partition("=")[2] for a in argv if a.startswith("--config=")
    ]
    try:
        section = load_config_file(files[-1]).get("plugins") if files else None
    except (ConfigError, OSError, AttributeError):
        return catalog.BUILT_IN  # the parser reports an unreadable file by its flag
    from cs336sys import plugins

    try:
        return plugins.offered(section)
    except ConfigError as exc:
        sys.exit(f"cs336sys: --config {files[-1]}: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_offered(argv))
    args = parser.parse_args(argv)
    if args.memory_fraction is not None and not 0 < args.memory_fraction <= 1:
        parser.error(f"--memory-fraction must be in (0, 1], got {args.memory_fraction}")
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.csv:  # before measuring: the rename at the end would replace whatever is there, /dev/null included
        from cs336sys.fileio import not_a_file

        try:
            kind = not_a_file(Path(args.csv))
        except OSError as exc:
            parser.error(f"--csv {args.csv}: {exc.strerror}")
        if kind is not None:
            parser.error(f"--csv {args.csv} is {kind}; name a file (--csv replaces only a regular file)")
        args.csv = os.path.abspath(args.csv)  # where it was meant, whatever directory the user's code moves to
    from cs336sys.pipeline.faults import FAULT_ENV, check_fault_spec

    try:
        check_fault_spec(os.environ.get(FAULT_ENV, ""))
    except ValueError as exc:
        parser.error(str(exc))
    config, offered = _cli_config(args, parser)
    (axes,) = plan.grid(args.study, config, offered).values() or [None]
    if axes is None:
        parser.error(f"{args.study}: these flags make no valid cell")

    from cs336sys.pipeline.cells import run_cell
    from cs336sys.pipeline.merge import derive
    from cs336sys.rows import rows_to_frame, write_csv_atomic

    cell = plan.plan_cell(args.study, axes, config, offered, artifact_dir="cs336sys-artifacts")
    cell = dataclasses.replace(cell, device=args.device, timeout_s=args.timeout)
    print(f"measuring {args.study} {cell.cell_id} on {args.device} (time limit {args.timeout:g} s) …", file=sys.stderr, flush=True)

    # The child resolves --device auto: asking torch.cuda here would poison a fork.
    def progress(context: dict, elapsed_s: float) -> None:  # a long cell is not silent
        part = " ".join(f"{k}={v}" for k, v in context.items()) or "starting"
        print(f"  … {part} ({elapsed_s:.0f} s)", file=sys.stderr, flush=True)

    # fork (fast) only where this process is the command itself: a caller of main() (a test, a notebook)
    # may have run torch on the CPU already, and OpenMP's pool does not survive a fork (the child hangs)
    rows = run_cell(cell, start_method="fork" if argv is None else None, progress=progress)
    frame = derive(rows_to_frame(rows, cell.axes), args.study, config["peak_tflops"], config["flags"], config["peak_gbps"])
    if args.device == "auto" and (frame.get("device") == "cpu").all():
        print("note: no CUDA device found; ran on CPU (memory columns stay empty)", file=sys.stderr)
    if args.csv:
        write_csv_atomic(frame, args.csv)
    first = frame.iloc[0]
    print(f"# {args.study} {cell.cell_id} on {first.get('device_name', '?')} (torch {first.get('torch_version', '?')})\n")
    print(result_tables(frame, args.study))
    return 0 if (frame["status"] == "ok").all() else 1


if __name__ == "__main__":
    sys.exit(main())
