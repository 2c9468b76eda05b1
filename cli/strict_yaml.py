"""The one YAML reader (suite configs, recipes, category files) and the strict key check of every config.

`load(path)` reads a file through `errors.read_text` (a FIFO or a device is refused, not read) and returns plain
dicts and lists that also know their lines (`Map.line`, `Map.key_lines`, `Seq.item_lines`), so that errors name
the line. A key given twice in one mapping is refused (PyYAML keeps the last one silently). Aliases are expanded
lazily by PyYAML, but whatever walks the result (JSON, a merge, a check) pays for the full tree: a document whose
expanded tree holds more than `MAX_NODES` nodes ("billion laughs") is refused before it is constructed.

`check_keys` refuses a key that is not in a schema, naming the key, its line and the closest known key; `check`
walks a nested schema so every level is strict, in its keys and in its types: a dict of key -> sub-schema wants a
mapping, `[sub]` a list (never a scalar, which code would iterate character by character), a type or a tuple of
types a value of one of them (`bool` wants true or false, never the text "no", which is truthy), `ANY` anything
(a number is checked by cli/numbers.py, with its range).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable

import yaml

from cli.errors import InputError, check_data, read_text

MAX_NODES = 200_000  # far above any real config (the default category file: 1,099 nodes, strict_yaml.expanded_size)
ANY = None  # a schema leaf: any value, checked elsewhere
TEXT = str  # schema leaves: a value of this type (or tuple of types; NOTHING lets a key be empty)
NOTHING = type(None)
KINDS = {str: "text", bool: "true or false", int: "a whole number", float: "a number", dict: "a mapping",
         list: "a list", NOTHING: "nothing"}


class Map(dict):
    line = 0
    key_lines: dict = {}


class Seq(list):
    line = 0
    item_lines: list = []


class _Loader(yaml.SafeLoader):
    pass


def _mapping(loader, node):
    written = {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
    loader.flatten_mapping(node)  # merged (`<<`) pairs come first, and the keys written here may override them
    result, key_lines, explicit = Map(), {}, set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in explicit and id(key_node) in written:
            raise InputError(loader.name, key_node.start_mark.line + 1, key, "appears twice")
        if id(key_node) in written:
            explicit.add(key)
        try:
            result[key] = loader.construct_object(value_node, deep=True)
        except TypeError:
            raise InputError(loader.name, key_node.start_mark.line + 1, None, "a key must be a plain value") from None
        key_lines[key] = key_node.start_mark.line + 1
    result.line, result.key_lines = node.start_mark.line + 1, key_lines
    return result


def _sequence(loader, node):
    result = Seq(loader.construct_object(child, deep=True) for child in node.value)
    result.line, result.item_lines = node.start_mark.line + 1, [c.start_mark.line + 1 for c in node.value]
    return result


def _integer(loader, node):
    """An integer judged by its magnitude, whatever its spelling: decimal digits past Python's conversion limit
    are refused before converting (int() would raise ValueError), and so is a hexadecimal, octal, binary or
    sexagesimal spelling whose value has that many decimal digits (`0x` + 4,298 `f`s: converting it is allowed,
    printing it in an error is not)."""
    limit = sys.get_int_max_str_digits() or 4300
    refused = InputError(loader.name, node.start_mark.line + 1, None,
                         f"an integer of more than {limit:,} digits; refused (no number here needs that many)")
    if sum(c.isalnum() for c in node.value) > 4 * limit:  # no spelling of a number within the limit is this long
        raise refused
    if node.value.lstrip("+-").replace("_", "").isdigit() and len(node.value) > limit:
        raise refused  # decimal: past the limit, converting is what fails
    value = loader.construct_yaml_int(node)
    if abs(value) >= 10**limit:  # more decimal digits than str() will print
        raise refused
    return value


_Loader.add_constructor("tag:yaml.org,2002:int", _integer)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def expanded_size(node, limit: int = MAX_NODES) -> int:
    """Nodes in the tree once every alias is expanded (each shared node counted once per use), stopping past
    `limit`; computed on the composed graph with one memo per node, so it is linear in the file, not the tree."""
    memo: dict[int, int] = {}

    def size(n) -> int:
        if id(n) in memo:
            return memo[id(n)]
        total = 1
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                total += size(k) + size(v)
                if total > limit:
                    break
        elif isinstance(n, yaml.SequenceNode):
            for child in n.value:
                total += size(child)
                if total > limit:
                    break
        memo[id(n)] = total
        return total

    return size(node)


def parse(text: str, path) -> object:
    """The document in `text` (None when empty); every problem is an InputError naming `path` and the line."""
    loader = _Loader(text)
    loader.name = str(path)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if expanded_size(node) > MAX_NODES:
            raise InputError(path, node.start_mark.line + 1, None,
                             f"expands to more than {MAX_NODES:,} values (aliases of aliases); refused")
        value = loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise InputError(path, mark.line + 1 if mark else None, None,
                         f"not YAML ({getattr(err, 'problem', None) or err})") from None
    except RecursionError:
        raise InputError(path, None, None, "nested too deeply") from None
    finally:
        loader.dispose()
    try:  # the reader's refusals (cli.errors.check_data): depth, .nan / .inf, a lone surrogate ("\ud800")
        check_data(value, line_of=line_of, nul=True)
    except ValueError as problem:
        raise InputError(path, problem.line, problem.field, problem.message) from None
    return value


def load(path) -> object:
    """The YAML file at `path`, checked as `parse` does."""
    return parse(read_text(path), path)


def did_you_mean(name, known: Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def line_of(mapping, key=None):
    """The line of `key` in `mapping` (or of the mapping), when it came from `load`."""
    if key is not None and key in getattr(mapping, "key_lines", {}):
        return mapping.key_lines[key]
    return getattr(mapping, "line", None) or None


def check_keys(path, mapping, known: Iterable[str], field: str = "") -> None:
    """Refuse the first key of `mapping` not in `known`, naming its line, the dotted field and the closest key."""
    known = set(known)
    for key in mapping:
        if key not in known:
            raise InputError(path, line_of(mapping, key), f"{field}.{key}" if field else str(key),
                             "unknown key" + did_you_mean(key, known) + f"; expected one of {', '.join(sorted(known))}")


def _is(value, kind) -> bool:
    if isinstance(value, bool) or kind is bool:  # YAML's true is an int to Python; "no" is no bool
        return isinstance(value, bool) and kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


def _shown(value) -> str:
    return "nothing" if value is None else "a mapping" if isinstance(value, dict) else \
        "a list" if isinstance(value, list) else repr(value)


def check(path, value, schema, field: str = "", line=None) -> None:
    """Walk `schema` over `value` (see the module's docstring): the first key or value that does not fit raises
    InputError naming `path`, the line and the dotted field. `line` is the value's own line when its parent knows
    it (a scalar does not carry one)."""
    if schema is ANY:
        return
    where = line or line_of(value)
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise InputError(path, where, field or None, f"expected a mapping, got {_shown(value)}")
        check_keys(path, value, schema, field)
        for key, sub in schema.items():
            if key in value:
                check(path, value[key], sub, f"{field}.{key}" if field else key, line_of(value, key))
    elif isinstance(schema, list):
        if not isinstance(value, list):
            hint = f" (write [{value}] for one)" if isinstance(value, str) else ""
            raise InputError(path, where, field or None, f"expected a list, got {_shown(value)}{hint}")
        lines = getattr(value, "item_lines", None) or [where] * len(value)
        for item, item_line in zip(value, lines):
            check(path, item, schema[0], field, item_line)
    else:
        kinds = schema if isinstance(schema, tuple) else (schema,)
        if not any(_is(value, kind) for kind in kinds):
            wanted = " or ".join(KINDS.get(kind, kind.__name__) for kind in kinds if not (kind is int and float in kinds))
            raise InputError(path, where, field or None, f"expected {wanted}, got {_shown(value)}")
