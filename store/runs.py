"""Resumable, crash-safe JSON Lines run files, and atomic JSON outputs.

A run file holds one JSON object per finished sample, keyed by a string id. Steps append a line as each
sample finishes and flush it to disk, so a killed run loses at most the line being written. The next
append after a resume drops such a torn last line (opening never changes a file); `pending` returns what is left to do. A record that carries an
`error` (its request failed for good) is kept in the file but counts as pending, so a re-run retries it;
the newer line for an id supersedes the older one. `finalize` rewrites the file once, atomically, in the
order of the inputs and without superseded lines, so an interrupted-and-resumed run ends with exactly the
file an uninterrupted run writes. A run file's first line is a header recording what made it (see RunFile).

Below them, the checks every command makes before it loads a model or writes anything: outputs that are
inputs or cannot be written (`check_outputs`); numeric options are checked by cli/numbers.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from cli import secrets
from cli.errors import InputError, check_types, parse_json, read_text, unwritable
from cli.paths import real
from store import locks, writer
from store.processes import is_main_process

logger = logging.getLogger(__name__)

HEADER = "run_header"  # the first line of a run file, `{"run_header": {...}}`: what made the run
# Header entries that say where the run's inputs are (for eval view), not what makes its answers: a resume from
# a moved folder is the same run, so they are not compared.
DESCRIPTIVE = ("images",)


def _parse_lines(path, lines, required: Iterable[str] = (), first: int = 1, numbers: list | None = None,
                 types: dict | None = None):
    """(header or None, records) of JSON Lines text lines; a bad line raises InputError. `numbers`, when given,
    receives each record's line number; `types` (cli.errors.check_types) the kinds of the records' fields."""
    header, records = None, []
    for lineno, line in enumerate(lines, first):
        if not line.strip():
            continue
        record = parse_json(line, path, lineno)
        if not isinstance(record, dict):
            raise InputError(path, lineno, None, "expected a JSON object")
        if lineno == 1 and list(record) == [HEADER] and isinstance(record[HEADER], dict):
            header = record[HEADER]
            continue
        for field in required:
            if field not in record:
                raise InputError(path, lineno, field, "missing field")
        if types:
            check_types(path, lineno, record, types)
        records.append(record)
        if numbers is not None:
            numbers.append(lineno)
    return header, records


def read_jsonl(path, required: Iterable[str] = (), types: dict | None = None) -> list[dict]:
    """Every object of a JSON Lines file (a run file's header line left out); a bad line, a missing
    required field, a field not of its kind in `types` (cli.errors.check_types) or bytes that are not UTF-8 raise
    InputError."""
    return _parse_lines(path, read_text(path).split("\n"), required, types=types)[1]


def read_run(path, required: Iterable[str] = (), made_by: Iterable[str] = (), types: dict | None = None
             ) -> tuple[dict | None, list[tuple[int, dict]]]:
    """(header or None, [(line number, record), ...]) of a run file that a step reads: the numbers are the file's
    own lines (the header line and blank lines counted), as an error message names them. With `made_by`, a file
    whose header names another step (a SPY run given to a GeoPrivacy judge) is refused. A file without a header
    (written before headers, or released by the authors) is left to the caller's checks of its records."""
    numbers: list[int] = []
    header, records = _parse_lines(path, read_text(path).split("\n"), required, numbers=numbers, types=types)
    made_by = tuple(made_by)
    if made_by and header is not None and header.get("step") not in made_by:
        raise InputError(path, 1, "run_header.step", f"this file was made by {header.get('step')!r}; this command "
                         f"reads what {' or '.join(made_by)} writes")
    return header, list(zip(numbers, records))


def write_text(path, text: str) -> None:
    """Write a text file atomically through the one writer (store/writer.py: no link followed, a temporary of its
    own, then a rename): readers see the old file or the new one. Every secret the process knows is redacted first
    (cli.secrets): no key reaches a file through here."""
    if not is_main_process():
        return
    writer.write_text(path, secrets.redact(text))


def write_json(path, obj) -> None:
    """Write JSON atomically (temporary file + rename): readers see the old file or the new one."""
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path, records: Iterable[dict]) -> None:
    """Write a whole JSON Lines file atomically."""
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def _line(record: dict) -> str:
    return secrets.redact(json.dumps(record, ensure_ascii=False)) + "\n"


class RunFile:
    """An append-only JSON Lines file of finished samples, keyed by `key` (default `id`).

    `header` describes what makes the answers (model, backend, judge, settings that change answers): a new
    file starts with it, and an existing file with another header is refused, naming the first setting that
    differs, unless `new_run` (the user's explicit --new-run) starts it over. A file without a header (written
    before headers existed) is checked against the settings its records carry, and gains the header when
    rewritten.
    Opening never changes the file: a torn last line is cut only when something is appended, i.e. after the
    command has checked all its input; a last line that is complete but lacks its newline is kept.
    Once the file is known to be this run's, it is locked (store.locks) until `close()` or the end of the
    process: a second command on the same file stops at once, naming this one's pid. Records are redacted
    (cli.secrets) as they are written: a server error that echoes the key is stored without it."""

    def __init__(self, path, key: str = "id", header: dict | None = None, new_run: bool = False, check=None):
        self.path = Path(path)
        self.key = key
        self.header = header
        self.check = check  # record -> (field, problem) or None: what a line of this file must be, checked at open
        self._records: dict[str, dict] = {}
        self._restart = header is not None  # write a fresh file (header line) before the first append
        self._cut: int | None = None  # byte length to truncate to (a torn tail) before the first append
        self._newline = False  # the last line is whole but lacks its newline: add it before appending
        writer.check_output(self.path)  # a link where the run file goes, a FIFO, a loop: one line, before any work
        if self.path.exists():
            self._load(new_run)
        self._locked = False
        if header is not None:  # a file this command writes (a header-less RunFile only reads or caches)
            self.lock()

    def lock(self) -> None:
        """Hold the run file's lock (re-entrant in one process); InputError names another holder's pid."""
        if not self._locked:
            locks.acquire(self.path, "run file")
            self._locked = True

    def close(self) -> None:
        if self._locked:
            locks.release(self.path)
            self._locked = False

    def _load(self, new_run: bool) -> None:
        text = read_text(self.path)
        if not text and not new_run and (self.header is not None or self.check is not None):
            # every file we write holds a line (a run file its header, a cache its first answer): an empty one is
            # someone else's, never ours to take over
            raise InputError(self.path, None, None, "is an empty file that this project did not write; an output "
                             "never takes over your file: choose another output path (or remove it)")
        complete, _, tail = text.rpartition("\n")
        lines = complete.split("\n") if complete or text.startswith("\n") else []
        numbers: list[int] = []
        header, records = _parse_lines(self.path, lines, numbers=numbers)
        if tail.strip():
            try:
                last = parse_json(tail, self.path)
            except InputError:  # torn by a kill (or not ours: said below)
                last = None
            if isinstance(last, dict) and self.key in last:
                records.append(last)
                numbers.append(len(lines) + 1)
                self._newline = True
            elif header is None and not records:
                # Nothing here was written by a run: the user's file, not ours to repair.
                raise InputError(self.path, len(lines) + 1, None,
                                 "not a run file (one incomplete line); choose another output path")
            else:  # a process killed mid-write left this line: that sample is simply not done
                self._cut = len((complete + "\n").encode("utf-8"))
        for lineno, record in zip(numbers, records):
            if self.key not in record:
                raise InputError(self.path, lineno, self.key, "missing field")
            problem = self.check(record) if self.check is not None else None
            if problem:
                raise InputError(self.path, lineno, *problem)
        if new_run:
            self._restart = True
            return  # the existing file is ours (it parsed as one) and the user asked to start over
        if self.header is not None and header is not None:
            self._check_header(header)
        elif self.header is not None:
            self._check_records(records, first=1)
        self._restart = False
        self.header = self.header if self.header is not None else header
        for record in records:
            self._records[str(record[self.key])] = record

    def _check_header(self, found: dict) -> None:
        for name in sorted(set(self.header) | set(found)):
            if name not in DESCRIPTIVE and found.get(name) != self.header.get(name):
                self._refuse(1, name, found.get(name))

    def _check_records(self, records: list[dict], first: int) -> None:
        # A file from before run headers: its records carry some of the settings (model, mode, judge...).
        for lineno, record in enumerate(records, first):
            for name, value in self.header.items():
                if name in record and record[name] != value:
                    self._refuse(lineno, name, record[name])

    def _refuse(self, where, name: str, found) -> None:
        raise InputError(self.path, where, name, f"this run was made with {found!r}, not {self.header.get(name)!r}; "
                         "pass --new-run to start it over, or choose another output path")

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

    def _header_lines(self) -> list[str]:
        return [_line({HEADER: self.header})] if self.header is not None else []

    def begin(self) -> None:
        """Call once all input is checked: start the file (its header line; over the old file with
        `new_run`), or repair a torn end. The first append does this itself."""
        self._prepare()

    def _prepare(self) -> None:
        """The first write: start the file (header line), or repair its end, now that input is checked."""
        if not is_main_process():
            pass
        elif self._restart:
            write_text(self.path, "".join(self._header_lines()))
        elif self._cut is not None:
            writer.truncate(self.path, self._cut)
        elif self._newline:
            writer.append_text(self.path, "\n")
        self._restart, self._cut, self._newline = False, None, False

    def append_many(self, records: Iterable[dict]) -> None:
        lines = []
        for record in records:
            self._records[str(record[self.key])] = record
            lines.append(_line(record))
        if not lines or not is_main_process():
            return
        self.lock()
        self._prepare()
        writer.append_text(self.path, "".join(lines))

    def finalize(self, order: Iterable) -> list[dict]:
        """Rewrite the file atomically with one line per id, in the given id order (ids not listed go last)."""
        order = [str(i) for i in order]
        listed = set(order)
        final = [self._records[i] for i in order if i in self._records]
        final += [r for i, r in self._records.items() if i not in listed]
        self.lock()
        write_text(self.path, "".join(self._header_lines()) + "".join(_line(r) for r in final))
        self._restart, self._cut, self._newline = False, None, False
        return final


# --------------------------------------------------------------------------------------------------------------
# Checks every command makes before it reads a model or writes a byte


def check_outputs(inputs: Iterable, outputs: Iterable, folders: Iterable = ()) -> None:
    """Refuse (InputError) an output file that is one of the inputs (by resolved path), that is a folder, that
    cannot be created (under a file, or in a folder without write permission), or that would be written through a
    symbolic link (store.writer.check_output); `folders` are output folders, checked the same way, and claimed as
    roots of the one writer. A symbolic link loop in any of them is one line."""
    given = {real(p): p for p in inputs if p is not None}
    written: dict[Path, object] = {}
    for path, is_folder in [*((p, True) for p in folders), *((p, False) for p in outputs)]:
        if path is None:
            continue
        path = Path(path)
        resolved = real(path)
        if resolved in given:
            raise InputError(path, None, None, "is also an input of this command; choose another output path")
        if resolved in written:  # e.g. --out X --reference-out X, or a report named like the JSON
            raise InputError(path, None, None, "is written twice by this command (two of its outputs have this "
                             "path); give them different names")
        written[resolved] = path
        writer.check_output(path, folder=is_folder)
        if is_folder and path.exists() and not path.is_dir():
            raise InputError(path, None, None, "is a file; the output here is a folder")
        if not is_folder and path.is_dir():
            raise InputError(path, None, None, "is a folder; the output here is a file")
        problem = unwritable(path, is_folder)
        if problem:
            raise InputError(path, None, None, problem)
        if is_folder:
            writer.claim_root(path)


MARKER = ".privacy-align-output"  # in an output folder: the command that made it, the files our commands wrote there


def _marker(folder: Path) -> dict:
    try:  # through the reader: a FIFO planted as the marker is refused, never opened (it would block)
        found = parse_json(read_text(folder / MARKER), folder / MARKER)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def claim_folder(folder, command: str, own: Iterable[str] = (), option: str = "--out", mark: bool = True) -> None:
    """Refuse an output folder that holds files this command did not write there: it must be missing, empty, or
    made by the same command (its MARKER says so; a rerun replaces its own files), or hold only entries named in
    `own` (what the command builds there and reuses, e.g. the demo's tiny model). Call after the other checks;
    the marker is written at once (`mark=False`: the check alone, the marker written later by a second call), so
    a killed run's folder is still recognised."""
    own = set(own)
    folder = Path(folder)
    writer.check_output(folder, folder=True)  # a loop: one line
    writer.claim_root(folder)  # below it, the one writer follows no link
    problem = unwritable(folder, is_folder=True)  # a probe file made and removed: what permission bits miss
    if problem:
        raise InputError(folder, None, None, problem)
    marker = _marker(folder)
    if folder.is_dir():
        owner = marker.get("command")
        if owner != command:
            foreign = next((p for p in sorted(folder.iterdir())
                            if p.name != MARKER and p.name not in own and not locks.is_lock_file(p)), None)
            if foreign is not None:
                made = f"made by {owner}" if owner else "not made by this command"
                raise InputError(folder, None, None, f"holds files {made} (e.g. {foreign.name}); an output folder "
                                 f"must be new, empty, or this command's own; choose another {option}")
    if mark:
        mark_folder(folder, command)


def training_command() -> str:
    """What a training run's output folder's marker names as its maker: the training script (train/X.py)."""
    return f"train/{Path(sys.argv[0]).name}"


def mark_folder(folder, command: str) -> None:
    """Record in `folder` that `command` made it (claim_folder's check then lets that command write there again)."""
    write_json(Path(folder) / MARKER, {**_marker(Path(folder)), "command": command})


def claim_files(folder, names: Iterable[str], mark: bool = False, option: str = "--out") -> None:
    """For commands that write a few named files into a folder that may hold others (a report beside its
    inputs): refuse when one of `names` is there already and no command of ours wrote it (the folder's MARKER
    lists what ours wrote), so a user's metrics.md is never overwritten. `mark=True`, just before writing:
    record the names."""
    folder = Path(folder)
    writer.claim_root(folder)
    marker = _marker(folder)
    written = set(marker.get("files") or ())
    if not mark:
        mine = marker.get("command") is not None  # a folder one of our commands made: its files are ours
        for name in names:
            if (folder / name).exists() and name not in written and not mine:
                raise InputError(folder / name, None, None, "is already there and was not written by this "
                                 f"project's commands; an output never overwrites your file: choose another {option} "
                                 "(or move the file)")
        return
    write_json(folder / MARKER, {**marker, "files": sorted(written | set(names))})


def written_files(folder) -> set[str]:
    """What our commands wrote in `folder`, by the ledger in its marker (claim_files): the only files the one writer
    may remove there (store.writer.remove)."""
    return set(_marker(Path(folder)).get("files") or ())


def forget_files(folder, names: Iterable[str]) -> None:
    """Take `names` (removed) off the ledger of `folder`."""
    marker = _marker(Path(folder))
    gone = set(names)
    write_json(Path(folder) / MARKER, {**marker, "files": sorted(set(marker.get("files") or ()) - gone)})


def nonempty(text: str) -> str:
    """An argparse type: a name that is not empty or blank (a model, a judge)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def iter_chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def warn_unequal_counts(counts: dict, what: str = "samples") -> None:
    """Warn when the runs being compared were scored over different numbers of samples."""
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name} {n}" for name, n in counts.items())
        logger.warning(f"the runs compared have different numbers of {what} ({listed}); their scores are not "
                       "over the same samples")


def warn_if_empty(path, records: list, step: str) -> None:
    """A step's input holding no records (an empty or header-only file) runs and writes an empty output: say so."""
    if not records:
        logger.warning(f"{path} holds no records: {step} has nothing to do (was the previous step run?)")
