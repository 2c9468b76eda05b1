"""The one writer: every file our commands create goes through here (docs/reliability/files.md).

An output lives inside a folder the user named (`--out`, `--output_dir`, the folder of an output file): the
*root*. The root is the user's, links and all; below it, everything is ours, so every path component is checked with
lstat and opened relative to its parent's descriptor with O_NOFOLLOW: a symbolic link planted there (`out/data` ->
another folder, `out/img/NAME.png` -> an outside image, `judge_cache.jsonl` -> a file of the user's) is refused in
one line, never followed. A file is written whole to a temporary of an unpredictable name, created with
O_CREAT | O_EXCL | O_NOFOLLOW (a planted `.NAME.tmp` is never opened), then renamed over the target atomically;
appends open the file with O_NOFOLLOW | O_APPEND and refuse what is not a regular file (a FIFO would block). A file
is removed only when the caller shows that we wrote it (`remove`'s `written`: the folder's ledger). A symbolic link
loop is one line (`loop_error`). Text that holds a lone surrogate is written with U+FFFD in its place (it has no
UTF-8 form; the write would fail half-way).

The root of a path is the deepest folder claimed in this process (`claim_root`: store.runs.claim_folder,
claim_files and check_outputs call it) that holds the path, else the path's own folder; a caller may name it.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

from cli.errors import InputError
from cli.paths import loop_error

_roots: set[Path] = set()
_FILE_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def claim_root(folder) -> None:
    """`folder` is an output folder of this command: what lies below it is checked component by component."""
    _roots.add(Path(os.path.abspath(folder)))


def root_of(path, root=None) -> tuple[Path, tuple[str, ...]]:
    """(root, the parts of `path` below it): `root` if given, else the deepest claimed folder holding `path`, else
    its parent. `..` is resolved lexically: nothing below the root is followed, so the result stays inside it."""
    path = Path(os.path.abspath(path))
    if root is not None:
        root = Path(os.path.abspath(root))
    else:
        held = [r for r in _roots if r != path and path.is_relative_to(r)]
        root = max(held, key=lambda r: len(r.parts)) if held else path.parent
    if path == root or not path.is_relative_to(root):
        raise InputError(path, None, None, f"is not inside the output folder {root}; refused")
    return root, path.relative_to(root).parts


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else
            "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def _refuse_link(shown: Path) -> InputError:
    return InputError(shown, None, None, "is a symbolic link inside an output folder; refused: outputs are never "
                      "written through a link (remove it, or choose another output path)")


def _open_root(root: Path, create: bool) -> int | None:
    """A descriptor of the root (the user's: its links are followed), made when `create`; None when missing."""
    for attempt in (0, 1):
        try:
            return os.open(root, _DIR_FLAGS)
        except FileNotFoundError:
            if not create or attempt:
                return None if not create else _open_root_failed(root)
            try:
                os.makedirs(root, exist_ok=True)
            except FileExistsError:  # a dangling link, or a loop, in the way
                _open_root_failed(root)
            except NotADirectoryError:
                raise InputError(root, None, None, "cannot be created: a part of it is a file, not a folder") from None
        except NotADirectoryError:
            raise InputError(root, None, None, "is a file, or lies under one; the output here goes in a folder") \
                from None
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise loop_error(root) from None
            raise
    return None


def _open_root_failed(root: Path):
    try:
        os.stat(root)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise loop_error(root) from None
    raise InputError(root, None, None, "cannot be created (a link to a missing folder, or a file, is in the way)")


def _descend(fd: int, root: Path, parts: tuple[str, ...], create: bool) -> int | None:
    """The descriptor of root/parts (each part lstat'ed: a link or a file is refused; made when `create`), or None
    when a part is missing and not `create`. Closes `fd`."""
    shown = root
    try:
        for name in parts:
            shown = shown / name
            try:
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                except FileExistsError:  # made meanwhile: checked below like any other
                    pass
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise _refuse_link(shown)
            if not stat.S_ISDIR(mode):
                raise InputError(shown, None, None, f"is {_kind(mode)}, not a folder; refused")
            child = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
        child, fd = fd, -1
        return child
    finally:
        if fd >= 0:
            os.close(fd)


@contextmanager
def _parent(path, root=None, create: bool = True):
    """(descriptor of the folder holding `path`, its name), every component below the root checked; (None, name)
    when that folder is missing and not `create`."""
    root, parts = root_of(path, root)
    fd = _open_root(root, create)
    if fd is not None:
        fd = _descend(fd, root, parts[:-1], create)
    try:
        yield fd, parts[-1]
    finally:
        if fd is not None:
            os.close(fd)


def _target_mode(fd: int, name: str, shown) -> int | None:
    """The mode of an existing target that may be replaced or appended to (a regular file), None when missing."""
    try:
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        raise _refuse_link(Path(shown))
    if not stat.S_ISREG(mode):
        raise InputError(shown, None, None, f"is {_kind(mode)}, not a regular file; refused")
    return mode


def check_output(path, root=None, folder: bool = False) -> None:
    """Refuse, before any work, an output (a file, or a `folder`) that we would have to write through a link:
    every existing component below its root lstat'ed, a file output itself neither a link nor a FIFO, device or
    folder; a loop is one line. An output folder that no claimed folder holds is its own root (the user named it,
    links and all). Nothing is created."""
    absolute = Path(os.path.abspath(path))
    if folder and root is None and not any(r != absolute and absolute.is_relative_to(r) for r in _roots):
        try:
            os.stat(path)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise loop_error(path) from None
        return
    root_path, parts = root_of(path, root)
    try:
        fd = os.open(root_path, _DIR_FLAGS)
    except OSError as err:  # missing, or under a file: the caller's other checks say so
        if err.errno == errno.ELOOP:
            raise loop_error(root_path) from None
        return
    fd = _descend(fd, root_path, parts[:-1], create=False)
    if fd is None:
        return
    try:
        if folder:
            try:
                mode = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return
            if stat.S_ISLNK(mode):
                raise _refuse_link(Path(path))
        else:
            _target_mode(fd, parts[-1], path)
    finally:
        os.close(fd)


def is_file(path, root=None) -> bool:
    """Whether `path` is a regular file reached without a link (one we may reuse); a link or a FIFO there is
    refused (InputError), never followed."""
    with _parent(path, root, create=False) as (fd, name):
        return fd is not None and _target_mode(fd, name, path) is not None


def encode(text: str) -> bytes:
    """UTF-8 bytes of `text`; a lone surrogate (no UTF-8 form) becomes U+FFFD instead of failing the write."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return re.sub("[\ud800-\udfff]", "\ufffd", text).encode("utf-8")


@contextmanager
def atomic(path, root=None):
    """`with atomic(path) as f:` a binary file object; on success its bytes replace `path` at once (fsync, then
    rename), on failure the temporary is removed and `path` is as it was. The file gets the mode of any new file
    (0666 less the umask)."""
    with _parent(path, root) as (fd, name):
        _target_mode(fd, name, Path(path))
        tmp = f".{name[:200]}.{secrets.token_hex(8)}.tmp"
        tmp_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o666, dir_fd=fd)
        try:
            with os.fdopen(tmp_fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)  # ours: made with O_EXCL above
            except OSError:
                pass
            raise


def write_bytes(path, data: bytes, root=None) -> None:
    with atomic(path, root) as f:
        f.write(data)


def write_text(path, text: str, root=None) -> None:
    write_bytes(path, encode(text), root)


def copy_file(source, path, root=None) -> None:
    """Copy `source` (an input, read as given) to `path` atomically."""
    import shutil

    with open(source, "rb") as src, atomic(path, root) as f:
        shutil.copyfileobj(src, f)


@contextmanager
def open_existing(path, root=None, append: bool = True, create: bool = True):
    """`with open_existing(path) as f:` a binary file object on `path` itself, for appending (or, `append=False`,
    truncating in place): no link followed, a FIFO or device refused (opened non-blocking, then checked)."""
    flags = os.O_WRONLY | os.O_NONBLOCK | _FILE_FLAGS | (os.O_APPEND if append else 0) | (os.O_CREAT if create else 0)
    with _parent(path, root, create=create) as (fd, name):
        _target_mode(fd, name, Path(path))
        try:
            file_fd = os.open(name, flags, 0o666, dir_fd=fd)
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.EMLINK):
                raise _refuse_link(Path(path)) from None
            if err.errno == errno.ENXIO:  # a FIFO put there since the check, no reader
                raise InputError(path, None, None, "is a FIFO, not a regular file; refused") from None
            raise
        mode = os.fstat(file_fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(file_fd)
            raise InputError(path, None, None, f"is {_kind(mode)}, not a regular file; refused")
        os.set_blocking(file_fd, True)
        with os.fdopen(file_fd, "ab" if append else "r+b") as f:
            yield f


def append_text(path, text: str, root=None) -> None:
    """Append `text` to `path` (made when missing) and flush it to disk."""
    with open_existing(path, root) as f:
        f.write(encode(text))
        f.flush()
        os.fsync(f.fileno())


def truncate(path, size: int, root=None) -> None:
    with open_existing(path, root, append=False, create=False) as f:
        f.truncate(size)


def make_folder(path, root=None) -> Path:
    """Make `path` (a folder below its root, each part checked as the writer checks it) and return it."""
    root_path, parts = root_of(path, root)
    fd = _open_root(root_path, create=True)
    os.close(_descend(fd, root_path, parts, create=True))
    return Path(path)


def remove(path, written: Iterable[str], root=None) -> bool:
    """Remove `path` only when it is one of the files we wrote (`written`: names relative to the root, the folder's
    ledger), a regular file reached without a link; whether it was removed. Anything else is left alone."""
    root_path, parts = root_of(path, root)
    if "/".join(parts) not in set(written):
        return False
    with _parent(path, root, create=False) as (fd, name):
        if fd is None or _target_mode(fd, name, Path(path)) is None:
            return False
        os.unlink(name, dir_fd=fd)
        return True


def open_lock(path, root=None) -> int:
    """A descriptor of the lock file `path` (made when missing; O_NOFOLLOW: a planted link is refused)."""
    with _parent(path, root) as (fd, name):
        _target_mode(fd, name, Path(path))
        try:
            return os.open(name, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _FILE_FLAGS, 0o644, dir_fd=fd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise _refuse_link(Path(path)) from None
            raise
