"""Resumable, crash-safe JSON Lines run files, and atomic JSON outputs.

A run file holds one JSON object per finished sample, keyed by a string id. Steps append a line as each
sample finishes and flush it to disk, so a killed run loses at most the line being written. Opening the
file again drops such a torn last line; `pending` returns what is left to do. A record that carries an
`error` (its request failed for good) is kept in the file but counts as pending, so a re-run retries it;
the newer line for an id supersedes the older one. `finalize` rewrites the file once, atomically, in the
order of the inputs and without superseded lines, so an interrupted-and-resumed run ends with exactly the
file an uninterrupted run writes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from data_prep.errors import InputError


def read_jsonl(path, required: Iterable[str] = ()) -> list[dict]:
    """Every object of a JSON Lines file; a bad line or a missing required field raises InputError."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, None, "file not found")
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(path, lineno, None, f"not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise InputError(path, lineno, None, "expected a JSON object")
            for field in required:
                if field not in record:
                    raise InputError(path, lineno, field, "missing field")
            records.append(record)
    return records


def write_text(path, text: str) -> None:
    """Write a text file atomically (temporary file + rename): readers see the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path, obj) -> None:
    """Write JSON atomically (temporary file + rename): readers see the old file or the new one."""
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path, records: Iterable[dict]) -> None:
    """Write a whole JSON Lines file atomically."""
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


class RunFile:
    """An append-only JSON Lines file of finished samples, keyed by `key` (default `id`)."""

    def __init__(self, path, key: str = "id"):
        self.path = Path(path)
        self.key = key
        self._records: dict[str, dict] = {}
        if self.path.exists():
            self._drop_torn_tail()
            for lineno, record in enumerate(read_jsonl(self.path), 1):
                if key not in record:
                    raise InputError(self.path, lineno, key, "missing field")
                self._records[str(record[key])] = record

    def _drop_torn_tail(self) -> None:
        # A process killed mid-write leaves a last line without its newline: that sample is simply not done.
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, sample_id) -> bool:
        return str(sample_id) in self._records

    def get(self, sample_id) -> dict | None:
        return self._records.get(str(sample_id))

    def records(self) -> list[dict]:
        return list(self._records.values())

    def is_done(self, sample_id) -> bool:
        record = self._records.get(str(sample_id))
        return record is not None and not record.get("error")

    def pending(self, items: Iterable[dict], key: str | None = None) -> list[dict]:
        """The items (dicts with an id under `key`, default this file's key) not yet done."""
        key = key or self.key
        return [item for item in items if not self.is_done(item[key])]

    def append(self, record: dict) -> None:
        self.append_many([record])

    def append_many(self, records: Iterable[dict]) -> None:
        lines = []
        for record in records:
            self._records[str(record[self.key])] = record
            lines.append(json.dumps(record, ensure_ascii=False) + "\n")
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())

    def finalize(self, order: Iterable) -> list[dict]:
        """Rewrite the file atomically with one line per id, in the given id order (ids not listed go last)."""
        order = [str(i) for i in order]
        listed = set(order)
        final = [self._records[i] for i in order if i in self._records]
        final += [r for i, r in self._records.items() if i not in listed]
        write_jsonl(self.path, final)
        return final


def iter_chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
