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


def read_json(path):
    """A whole JSON file; a missing file or bad JSON raises InputError naming the file (and the line)."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise InputError(path, err.lineno, None, f"not valid JSON ({err.msg})") from None


def read_text(path) -> str:
    """A whole UTF-8 text file; a missing, unreadable or non-UTF-8 file raises InputError (line and byte offset)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, None, None, "file not found") from None
    except IsADirectoryError:
        raise InputError(path, None, None, "is a folder, expected a file") from None
    except PermissionError:
        raise InputError(path, None, None, "cannot read the file (permission denied)") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(path, line, None, f"not UTF-8 text (byte 0x{data[err.start]:02x} at byte offset {err.start})"
                         ) from None


def image_problem(path) -> str | None:
    """Why the image file at `path` cannot be used (None when it decodes): decoded in full, not only opened, so
    truncated files and bytes that are not an image are caught before any work starts."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.draft("RGB", (64, 64))  # JPEG: decode every byte at 1/8 scale, several times faster
            image.load()
    except FileNotFoundError:
        return f"image not found: {path}"
    except Exception as err:  # PIL raises many types on malformed bytes (OSError, SyntaxError, struct.error, ...)
        return f"not a readable image: {path} ({type(err).__name__}: {err})"
    return None
