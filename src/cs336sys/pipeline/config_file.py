"""Reading a config file strictly, with limits: the one reader of the workflow and the CLI.

``load_yaml`` refuses, naming the file and line and what to write instead, a key given twice
and the YAML 1.1 readings a reader would not expect (``01024`` as 532, ``on`` as true, ``1:30``
as 90, and ``0o17``, ``0128``, ``1e3`` as text); a document over ``MAX_DOCUMENT_BYTES``, or one
that nests past ``MAX_DEPTH`` or expands past ``MAX_NODES`` through its aliases, before building
anything from it. ``check_layer`` refuses an empty study block in one layer of a run's config (a
file, or the command line's entries); ``check_size`` applies the node limits to a config object.
``dump_yaml`` writes what ``load_yaml`` reads back unchanged (the run's settings snapshot).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from cs336sys.errors import ConfigError  # on the ground floor: the plug-in section raises it too

# A config is a few KB and a few hundred nodes (config/full.yaml: 3.5 KB). Before these limits a
# 504-byte alias bomb ran 3 minutes into 5.7 GB before a MemoryError.
MAX_DOCUMENT_BYTES = 1_000_000
MAX_NODES = 100_000  # values, lists and mappings, each alias counted as what it expands to
MAX_DEPTH = 32  # a config nests 5 levels deep (e2e.grid.size.0); PyYAML's composer recurses per level


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key given twice and the YAML 1.1 readings a reader would not expect."""


def _where(node: yaml.Node) -> str:
    mark = node.start_mark
    return f"{mark.name}:{mark.line + 1}:{mark.column + 1}"


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: its keys may be overridden here
            continue
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"{key_node.start_mark.name}:{key_node.start_mark.line + 1}: config key {key!r} is given twice "
                f"(first on line {seen[key] + 1}); a second block would silently replace the first"
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_OCTAL_11 = re.compile(r"[-+]?0[0-7_]+")  # PyYAML: 01024 -> 532
_BINARY = re.compile(r"[-+]?0b[01_]+")
_BASE_60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")  # PyYAML: 1:30 -> 90
# plain text to PyYAML, a number to a YAML 1.2 reader (and to the eye): 0o17, 0128, 1e3
_OCTAL_12 = re.compile(r"[-+]?0o[0-7_]+")
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")
_EXPONENT = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+")


def _decimal(text: str, base: int) -> int:
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-").replace("_", "")
    return sign * int(digits[2:] if base in (2, 8) and digits[1:2] in ("b", "o") else digits, base)


def _strict_int(loader: _StrictLoader, node: yaml.ScalarNode) -> int:
    text = node.value
    if _OCTAL_11.fullmatch(text):
        raise ConfigError(
            f"{_where(node)}: {text} is a YAML 1.1 octal literal (read as {_decimal(text, 8)}); "
            f"write {_decimal(text, 10)} for the decimal number, or quote it ('{text}') for text"
        )
    if _BINARY.fullmatch(text):
        raise ConfigError(f"{_where(node)}: {text} is a YAML 1.1 binary literal; write {_decimal(text, 2)}, or quote it for text")
    if _BASE_60.fullmatch(text):
        value = loader.construct_yaml_int(node)
        raise ConfigError(
            f"{_where(node)}: {text} is a YAML 1.1 base-60 number (read as {value}); write {value}, or quote it ('{text}') for text"
        )
    return loader.construct_yaml_int(node)


def _strict_float(loader: _StrictLoader, node: yaml.ScalarNode) -> float:
    if _BASE_60.fullmatch(node.value):
        value = loader.construct_yaml_float(node)
        raise ConfigError(
            f"{_where(node)}: {node.value} is a YAML 1.1 base-60 number (read as {value:g}); write {value:g}, "
            f"or quote it ('{node.value}') for text"
        )
    return loader.construct_yaml_float(node)


def _strict_bool(loader: _StrictLoader, node: yaml.ScalarNode) -> bool:
    value = loader.construct_yaml_bool(node)
    if node.value.lower() not in ("true", "false"):  # yes/no/on/off: booleans in YAML 1.1 only
        raise ConfigError(
            f"{_where(node)}: {node.value!r} is a YAML 1.1 boolean (read as {str(value).lower()}); "
            f"write true or false for a switch, or quote it ('{node.value}') for text"
        )
    return value


def _strict_str(loader: _StrictLoader, node: yaml.ScalarNode) -> str:
    text = loader.construct_yaml_str(node)
    if node.style is None:  # plain, not quoted: what the writer meant is a number
        if _OCTAL_12.fullmatch(text):
            raise ConfigError(
                f"{_where(node)}: {text} is a YAML 1.2 octal literal, read as text here; "
                f"write {_decimal(text, 8)}, or quote it ('{text}') for text"
            )
        if _LEADING_ZERO.fullmatch(text) or _EXPONENT.fullmatch(text):
            number = float(text.replace("_", "")) if _EXPONENT.fullmatch(text) else _decimal(text, 10)
            raise ConfigError(
                f"{_where(node)}: {text} is read as text here (a number in YAML 1.2); write {number!r}, or quote it ('{text}') for text"
            )
    return text


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _strict_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _strict_float)
_StrictLoader.add_constructor("tag:yaml.org,2002:bool", _strict_bool)
_StrictLoader.add_constructor("tag:yaml.org,2002:str", _strict_str)


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, but text that ``load_yaml`` would refuse plain (``1e3``, ``0128``) is quoted."""


def _represent_str(dumper: _Dumper, text: str) -> yaml.ScalarNode:
    plain_is_refused = any(p.fullmatch(text) for p in (_OCTAL_12, _LEADING_ZERO, _EXPONENT))
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="'" if plain_is_refused else None)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(value: Any) -> str:
    """YAML that ``load_yaml`` reads back as ``value`` (a run name ``1e3`` stays a name); keys in their order."""
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, allow_unicode=True)


def _check_nodes(root: yaml.Node, source: str) -> None:
    """Refuse a composed document that nests too deep, contains itself, or expands past ``MAX_NODES``.

    Aliases share their node, so the expanded size is summed once per distinct node: the check
    costs the document's size, not the expansion's.
    """
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_:
            raise ConfigError(f"{_where(node)}: a recursive alias (a node that contains itself); a config is a tree")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{_where(node)}: nested more than {MAX_DEPTH} levels deep (a config nests 5)")
        total = 1
        if isinstance(node, yaml.CollectionNode):
            open_.add(id(node))
            children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
            for child in children:
                total += size(child, depth + 1)
                if total > MAX_NODES:
                    raise ConfigError(
                        f"{source}: its aliases expand to more than {MAX_NODES} nodes (values, lists and "
                        "mappings); a config holds a few hundred"
                    )
            open_.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root, 0)


def _read_text(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            on_disk = os.fstat(f.fileno()).st_size
            data = f.read(MAX_DOCUMENT_BYTES + 1)  # never more, whatever the path is
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        size = f"{on_disk} bytes" if on_disk > MAX_DOCUMENT_BYTES else f"more than {MAX_DOCUMENT_BYTES} bytes"
        raise ConfigError(f"config file {path} is {size}; a config may hold at most {MAX_DOCUMENT_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})") from None


def _check_depth(text: str, path: Path) -> None:
    """Refuse a document nesting past ``MAX_DEPTH`` from the parser's events, before the composer recurses
    into it: 2000 nested lists took the composer seconds to give up (a RecursionError), the events milliseconds."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ConfigError(f"{path}:{event.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep (a config nests 5)")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:  # the strict loader below refuses it, in its own words
        return


def load_yaml(path: str | Path) -> Any:
    """Read a config file strictly: each refusal names the file and line and what to write instead.

    A missing file, a syntax error, a duplicate key, a YAML 1.1 surprise, a document over
    ``MAX_DOCUMENT_BYTES`` or one that nests or expands past the limits: all ``ConfigError``.
    """
    path = Path(path)
    text = _read_text(path)
    _check_depth(text, path)
    loader = _StrictLoader(text)
    loader.name = str(path)  # marks (duplicate keys) name the file, not "<unicode string>"
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, str(path))
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:  # the reader's: a control character
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:  # the composer recurses per level, before _check_nodes can count them
        raise ConfigError(f"{path}: nested too deep (a config may nest at most {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()


def _is_empty(value: Any) -> bool:
    return value is None or value == {} or (isinstance(value, str) and value.strip() in ("", "~", "null", "Null", "NULL"))


def check_layer(layer: Mapping[str, Any], source: str) -> None:
    """One layer of a run's config (a config file, or the command line's ``--config`` entries).

    A study block that is present but empty is refused: merged over config.yaml, ``e2e:`` (null)
    would replace config.yaml's e2e settings by the schema's defaults while ``e2e: {}`` would
    change nothing, and neither says which the writer meant.
    """
    from cs336sys.studies import STUDIES  # torch-free: the registry of names

    for key in STUDIES:
        if key in layer and _is_empty(layer[key]):
            raise ConfigError(
                f"{source}: config key {key!r} is an empty study block: refused, because over config.yaml "
                f"`{key}:` would drop its {key} settings for the schema's defaults and `{key}: {{}}` would "
                f"change nothing. To keep the settings of the files before, omit the key; to change some, "
                f"name them ({key}: {{timeout_s: 60}})"
            )


def load_config_file(path: str | Path) -> dict:
    """A config file as one layer of a run's config: read by ``load_yaml``, a mapping, no empty study block."""
    data = load_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a mapping of config keys (it holds a {type(data).__name__})")
    check_layer(data, str(path))
    return data


def check_size(config: Mapping[str, Any]) -> None:
    """Refuse a config object that nests past ``MAX_DEPTH`` or expands past ``MAX_NODES`` (shared lists counted
    each time they occur): the command line's ``--config`` entries and programs build configs without ``load_yaml``."""
    sizes: dict[int, int] = {}

    def size(value: Any, depth: int, key: str) -> int:
        if not isinstance(value, (dict, list)):
            return 1
        if id(value) in sizes:
            return sizes[id(value)]
        if depth > MAX_DEPTH:
            raise ConfigError(f"invalid config:\n  config key {key!r}: nested more than {MAX_DEPTH} levels deep (a config nests 5)")
        sizes[id(value)] = MAX_NODES + 1  # met again while being counted: it contains itself
        total = 1
        for item in value.values() if isinstance(value, dict) else value:
            total += size(item, depth + 1, key)
            if total > MAX_NODES:
                raise ConfigError(
                    f"invalid config:\n  config key {key!r}: holds more than {MAX_NODES} nodes (values, lists "
                    "and mappings, a shared one counted each time it occurs); a config holds a few hundred"
                )
        sizes[id(value)] = total
        return total

    total = 0
    for key, value in config.items():
        total += size(value, 1, str(key))
        if total > MAX_NODES:
            raise ConfigError(f"invalid config:\n  the config holds more than {MAX_NODES} nodes; a config holds a few hundred")
