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
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, None, None, "file not found") from None
    except json.JSONDecodeError as err:
        raise InputError(path, err.lineno, None, f"not valid JSON ({err.msg})") from None
