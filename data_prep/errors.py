"""One error type for bad input, everywhere: it names the file, the line or record, and the field."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input. Command lines print `str(err)` on one line and exit with status 2."""

    def __init__(self, path, where, field, message: str):
        self.path, self.where, self.field, self.message = str(path), where, field, message
        location = self.path if where is None else f"{self.path}:{where}"
        super().__init__(f"{location}: {field}: {message}" if field else f"{location}: {message}")
