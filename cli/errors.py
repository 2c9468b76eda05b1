"""One error type for bad input, everywhere: it names the file, the line or record, and the field."""

from __future__ import annotations

import json
from pathlib import Path


class InputError(ValueError):
    """Bad user input. Command lines print `str(err)` on one line and exit with status 2."""

    def __init__(self, path, where, field, message: str):
        self.path, self.where, self.field, self.message = str(path), where, field, message
        location = self.path if where is None else f"{self.path}:{where}"
        super().__init__(f"{location}: {field}: {message}" if field else f"{location}: {message}")


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


def parse_json(text: str, path, line=None, unique_keys: bool = False):
    """The one JSON parser of what users give (data, run and result files, caches, a line of JSON Lines): bad JSON
    (NotJSON), nesting deeper than Python's recursion limit (a 100,000-deep array) and, with `unique_keys`, a key
    given twice in one object raise InputError naming `path` and the line (`line`, for one line of a file)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys if unique_keys else None)
    except json.JSONDecodeError as err:
        raise NotJSON(path, err.lineno if line is None else line, None, f"not valid JSON ({err.msg})") from None
    except _DuplicateKey as err:
        raise InputError(path, line, str(err), "appears twice in one object") from None
    except RecursionError:
        raise InputError(path, line, None, "nested too deeply") from None


def read_json(path):
    """A whole JSON file; a missing file, bad JSON, too deep a nesting or a key given twice in one object raises
    InputError naming the file (and the line)."""
    return parse_json(read_text(path), path, unique_keys=True)


def read_text(path) -> str:
    """A whole UTF-8 text file; a missing, unreadable or non-UTF-8 file raises InputError naming the file
    (and, for bad bytes, their byte offset)."""
    path = Path(path)
    try:
        not_regular(path)
        data = path.read_bytes()
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
