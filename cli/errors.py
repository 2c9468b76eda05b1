"""One error type for bad input, everywhere: it names the file, the line or record, and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path


class InputError(ValueError):
    """Bad user input. Command lines print `str(err)` on one line and exit with status 2."""

    def __init__(self, path, where, field, message: str):
        self.path, self.where, self.field, self.message = str(path), where, field, message
        location = self.path if where is None else f"{self.path}:{where}"
        line = f"{location}: {field}: {message}" if field else f"{location}: {message}"
        # a lone surrogate (a non-UTF-8 file name, a key read from "\udc00") has no UTF-8 form: the line could not
        # be printed; U+FFFD in its place
        super().__init__(re.sub("[\ud800-\udfff]", "\ufffd", line))

    def __reduce__(self):  # raised in a worker process (the study's --jobs), it travels back whole
        return type(self), (self.path, self.where, self.field, self.message)


def new_file_mode() -> int:
    """The mode of a newly created file (0666 less the umask): what outputs get, not mkstemp's 0600."""
    import os

    try:  # Linux says it without changing it (setting it, even back, races with other threads)
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return 0o666 & ~mask


def unwritable(path, is_folder: bool = False) -> str | None:
    """Why `path` (an output file, or an output folder) cannot be created or written, or None if it can."""
    import os

    path = Path(path)
    parent = path if is_folder else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot be created: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be written: no write permission in {parent}"
    if not is_folder and path.is_file() and not os.access(path, os.W_OK):
        return "cannot be written: the file is read-only"
    problem = write_probe(parent)
    if problem is None and not is_folder and path.is_file():
        try:  # appending nothing changes nothing; an immutable file refuses it even to root
            open(path, "ab").close()
        except OSError as err:
            problem = f"cannot be written ({err.strerror})"
    return problem


def not_regular(path) -> None:
    """Refuse an input that exists but is not a regular file (or a folder): reading a FIFO blocks for ever, a
    device never ends. Stat does not open it, so this never blocks; a missing path is left to the reader."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as err:
        raise InputError(path, None, None, f"cannot read ({err.strerror})") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise InputError(path, None, None, f"is {kind}, not a regular file; refused (it could block or never end)")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs):
    """A JSON object whose keys are distinct (json keeps the last of two silently, as PyYAML does)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


class NotJSON(InputError):
    """Text that is not valid JSON (parse_json): a reader that also takes another format may try that instead."""


# ---- the one reader of what users give: JSON, JSON Lines (parse_json per line), YAML (strict_yaml.parse) --------
# What it refuses, each in one line naming the file, the line and the field (docs/reliability/files.md):
MAX_BYTES = 1 << 30  # a file larger than 1 GiB (no data, run or result file of ours comes near; reading it whole
#                      would take the machine's memory)
MAX_DEPTH = 100  # nesting deeper than this (ours nest at most 8 levels; deeper crashes code that recurses)
# and: bytes that are not UTF-8, a key given twice in one object, NaN / Infinity / a number that overflows to one
# (JSON has none; where a run file of another tool holds one, its reader says finite=False), an integer of more
# digits than the interpreter converts (sys.get_int_max_str_digits: a ValueError deep in json otherwise), a lone
# surrogate ("\ud800" reads as one: no UTF-8 form, so the first write of it fails).
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _Problem(ValueError):
    """What `check_data` found: the field (a dotted path, [i] for list items) and the message."""

    def __init__(self, field: str | None, message: str, kind: str):
        self.field, self.message, self.kind, self.line = field, message, kind, None
        super().__init__(message)

    def at(self, line):
        self.line = line
        return self


def field_name(where) -> str | None:
    """('q4', 'boxes', 0, 3) -> 'q4.boxes[0][3]'."""
    text = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in where)
    return text.lstrip(".") or None


def check_data(value, finite: bool = True, strings: bool = True, line_of=None, nul: bool = False) -> None:
    """Raise _Problem for the first value (in document order) that the reader refuses: nesting deeper than
    MAX_DEPTH, a float that is NaN or infinite (`finite`), a lone surrogate in a string or a key (`strings`: False
    when the text cannot hold one). `line_of(node, key)` gives the line of a mapping's key or a list's item where the
    caller knows it (YAML)."""
    import math

    stack = [(value, 0, (), None)]
    while stack:
        v, depth, where, line = stack.pop()
        if isinstance(v, str):
            if strings and _LONE_SURROGATE.search(v):
                raise _Problem(field_name(where), "holds a lone surrogate (a \\ud800-\\udfff escape that is no "
                               "character); refused: it has no UTF-8 form", "surrogate").at(line)
            if nul and "\0" in v:  # a config's text reaches the OS (a path, a variable, an argument): none holds NUL
                raise _Problem(field_name(where), "holds a NUL character (\\0); refused: no path, variable or "
                               "argument can hold one", "nul").at(line)
        elif isinstance(v, float):
            if finite and not math.isfinite(v):
                raise _Problem(field_name(where), f"must be a finite number, got {v}", "nonfinite").at(line)
        elif isinstance(v, (dict, list)):
            if depth >= MAX_DEPTH:
                raise _Problem(None, f"nested too deeply (more than {MAX_DEPTH} levels)", "depth").at(line)
            items = list(v.items()) if isinstance(v, dict) else list(enumerate(v))
            for k, x in reversed(items):
                if nul and isinstance(k, str) and "\0" in k:
                    raise _Problem(field_name(where), "a key here holds a NUL character; refused",
                                   "nul").at(line_of(v, k) if line_of else line)
                if strings and isinstance(k, str) and _LONE_SURROGATE.search(k):
                    raise _Problem(field_name(where), "a key here holds a lone surrogate; refused: it has no "
                                   "UTF-8 form", "surrogate").at(line_of(v, k) if line_of else line)
                stack.append((x, depth + 1, (*where, k), line_of(v, k) if line_of else line))


# Where, in a whole JSON file's text, the first such value sits (only for the error's line number)
_STRING = r'"(?:[^"\\]|\\.)*"'
_LOCATORS = {
    "nonfinite": re.compile(_STRING + r"|(-?Infinity|NaN|-?\d+(?:\.\d+)?[eE][+-]?\d{3,})"),
    "surrogate": re.compile(r'"((?:[^"\\]|\\.)*\\u[dD][89a-fA-F](?:[^"\\]|\\.)*)"'),
    "depth": re.compile(_STRING + r"|([\[{])|[\]}]"),
}


def _line_in(text: str, kind: str) -> int | None:
    if kind == "depth":
        level = 0
        for m in _LOCATORS["depth"].finditer(text):
            if m.group(1):
                level += 1
                if level > MAX_DEPTH:
                    return text.count("\n", 0, m.start()) + 1
            elif m.group(0) in "]}":
                level -= 1
        return None
    if kind == "digits":
        import sys

        digits = (sys.get_int_max_str_digits() or 4300) + 1
        pattern = re.compile(_STRING + rf"|(-?\d{{{digits},}})")
    else:
        pattern = _LOCATORS[kind]
    for m in pattern.finditer(text):
        if m.group(1) and _is_it(kind, m.group(1)):
            return text.count("\n", 0, m.start()) + 1
    return None


def _is_it(kind: str, token: str) -> bool:
    import math

    if kind == "nonfinite":
        return not math.isfinite(float(token))
    if kind == "surrogate":
        try:
            return bool(_LONE_SURROGATE.search(json.loads(f'"{token}"')))
        except ValueError:
            return False
    return True


def parse_json(text: str, path, line=None, unique_keys: bool = True, finite: bool = True):
    """The one JSON parser of what users give (data, run and result files, caches, a line of JSON Lines): bad JSON
    (NotJSON), a key given twice in one object, nesting deeper than MAX_DEPTH (or than Python's recursion limit: a
    100,000-deep array), NaN / Infinity or a number that overflows to one (`finite`), an integer of more digits than
    Python converts, a lone surrogate: each an InputError naming `path`, the line (`line`, for one line of a file)
    and the field. `unique_keys=False` only for text that is not a user's (never)."""
    import sys

    try:
        value = json.loads(text, object_pairs_hook=_unique_keys if unique_keys else None)
    except json.JSONDecodeError as err:
        raise NotJSON(path, err.lineno if line is None else line, None, f"not valid JSON ({err.msg})") from None
    except _DuplicateKey as err:
        raise InputError(path, line or _key_line(text, str(err)), str(err), "appears twice in one object") from None
    except RecursionError:
        raise InputError(path, line, None, "nested too deeply") from None
    except ValueError:  # int(): more digits than sys.get_int_max_str_digits()
        limit = sys.get_int_max_str_digits() or 4300
        raise InputError(path, line or _line_in(text, "digits"), None, f"an integer of more than {limit:,} digits; "
                         "refused (no number here needs that many)") from None
    try:
        check_data(value, finite=finite, strings=bool(_SURROGATE_ESCAPE.search(text)))
    except _Problem as problem:
        raise InputError(path, line or _line_in(text, problem.kind), problem.field, problem.message) from None
    return value


def _key_line(text: str, key: str) -> int | None:
    at = text.find(json.dumps(key, ensure_ascii=False) + ":")
    at = text.find(json.dumps(key, ensure_ascii=False)) if at < 0 else at
    return text.count("\n", 0, at) + 1 if at >= 0 else None


def read_json(path, finite: bool = True, types: dict | None = None):
    """A whole JSON file, read and checked as `parse_json` does (InputError naming the file, the line and the
    field); `types`: the kinds of the object's fields (check_types), so a list where text goes is one line too.
    `finite=False` only for files another tool writes with NaN (transformers' trainer_state.json)."""
    value = parse_json(read_text(path), path, finite=finite)
    if types is not None:
        if not isinstance(value, dict):
            raise InputError(path, None, None, f"expected a JSON object, got {_kind_of(value)}")
        check_types(path, None, value, types)
    return value


def read_text(path) -> str:
    """A whole UTF-8 text file; a missing, unreadable, non-UTF-8 or too large (MAX_BYTES) file raises InputError
    naming the file (and, for bad bytes, their line and byte offset)."""
    import os

    path = Path(path)
    try:
        not_regular(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise InputError(path, None, None, f"is {size:,} bytes, more than the {MAX_BYTES:,} a file we read "
                                 "may hold; refused")
            data = f.read()
    except FileNotFoundError:
        raise InputError(path, None, None, "file not found") from None
    except IsADirectoryError:
        raise InputError(path, None, None, "is a folder, not a file") from None
    except OSError as err:
        raise InputError(path, None, None, f"cannot read ({err.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(path, line, None, f"not UTF-8 text (byte offset {err.start})") from None


# ---- typed field access: what a reader says each field must be, checked as the file is read --------------------
class Number:
    """A field's kind: a finite number (an integer or a float, never true / false, never an integer past a float's
    range)."""


class Whole:
    """A field's kind: a whole number (never true / false)."""


ID = (str, Whole)  # a record's id: text or a whole number (str() makes the key)
_KIND_NAMES = {str: "a string", bool: "true or false", Whole: "a whole number", Number: "a number", dict: "an object",
               list: "a list", type(None): "null"}


def _kind_of(value) -> str:
    return ("null" if value is None else "true or false" if isinstance(value, bool) else
            "a number" if isinstance(value, (int, float)) else "text" if isinstance(value, str) else
            "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__)


def is_kind(value, kind) -> bool:
    """Whether `value` is of `kind` (a type, Number, Whole, or a tuple of them)."""
    if isinstance(kind, tuple):
        return any(is_kind(value, k) for k in kind)
    if isinstance(value, bool) or kind is bool:
        return isinstance(value, bool) and kind is bool
    if kind is Whole:
        return isinstance(value, int)
    if kind is Number:
        if isinstance(value, int):
            return abs(value) <= 1.7976931348623157e308
        return isinstance(value, float)
    return isinstance(value, kind)


def kind_names(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_KIND_NAMES.get(k, getattr(k, "__name__", str(k))) for k in kinds)


def check_types(path, line, record: dict, types: dict, prefix: str = "") -> None:
    """Refuse (InputError naming `path`, `line` and the field) the first field of `record` named in `types` whose
    value is not of its kind: `types` maps a field to a kind (`str`, `bool`, `list`, `dict`, `Number`, `Whole`,
    `ID`, `type(None)`, or a tuple of them) or to a nested `types` dict for an object field; the name "*" stands
    for every field of the object. A missing field is the caller's to require."""
    for name, kind in types.items():
        if name == "*":
            check_types(path, line, record, {key: kind for key in record if key not in types}, prefix)
            continue
        if name not in record:
            continue
        value, field = record[name], f"{prefix}{name}"
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                raise InputError(path, line, field, f"expected an object, got {_shown(value)}")
            check_types(path, line, value, kind, f"{field}.")
        elif not is_kind(value, kind):
            raise InputError(path, line, field, f"expected {kind_names(kind)}, got {_shown(value)}")


def _shown(value) -> str:
    """The value as JSON, cut at 60 characters (an integer past a float's range by its digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**20:
        from cli.numbers import shown

        return shown(value)
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


MAX_ASPECT_RATIO = 200  # the Qwen-VL processors' smart_resize refuses a longer side over 200 times the shorter


def check_image(path, where=None, field=None, source=None) -> None:
    """Decode an image file fully (opening reads only the header), so a file that is not an image, or is
    truncated, is bad input here rather than a failure later. Errors name `source` (the file that refers to
    the image, with `where` / `field`) when given, else the image."""
    import warnings

    from PIL import Image

    try:
        not_regular(path)
        with warnings.catch_warnings():  # PIL only warns up to twice its limit; past the limit is refused here
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()
                width, height = image.size
        if max(width, height) > MAX_ASPECT_RATIO * max(min(width, height), 1):
            raise InputError(path, None, None, f"{width}x{height} pixels: an aspect ratio over {MAX_ASPECT_RATIO}:1, "
                             "which the Qwen-VL processors refuse mid-run; refused (crop or pad it)")
    except FileNotFoundError:
        problem = "image not found"
    except InputError as err:
        problem = err.message
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        problem = (f"too many pixels (over {Image.MAX_IMAGE_PIXELS:,}, PIL's limit against decompression bombs); "
                   "refused")
    except (OSError, SyntaxError, ValueError) as err:
        problem = f"not a readable image ({type(err).__name__})"
    else:
        return
    if source is None:
        raise InputError(path, None, None, problem)
    raise InputError(source, where, field, f"{problem}: {path}")


class RunStopped(Exception):
    """The run cannot go on for a reason that is not a bad input file or option (the loss became NaN, ...).
    Command lines print `str(err)` on one line and exit with `status`; what was written before is kept."""

    def __init__(self, message: str, status: int = 1):
        self.status = status
        super().__init__(message)


def key_refused(endpoint: str | None, variable: str, status: int) -> InputError:
    """The error of an endpoint answering 401 / 403: the key in `variable` is wrong, so nothing else is sent."""
    what = "refused the key" if status == 401 else "refused access with this key"
    return InputError(endpoint or "the OpenAI API", None, variable,
                      f"the server {what} (HTTP {status}); set a valid key in this environment variable and run "
                      "the same command again (the run stopped: nothing more was sent)")


def write_probe(folder) -> str | None:
    """Create and remove a file in an existing `folder`: why that fails (read-only file system, an immutable or
    root-squashed folder: what permission bits and os.access miss, above all as root), or None."""
    import os
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
    except OSError as err:
        return f"cannot be written: creating a file in {folder} failed ({err.strerror})"
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError as err:
        return f"cannot be written: removing a file from {folder} failed ({err.strerror})"
    return None
