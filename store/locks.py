"""Advisory locks (flock) on run files and training output folders, held for the life of a run.

Two commands writing one run file (or training into one folder) interleave their records; the second one now
stops at once with one line naming the first one's pid. The lock is a file beside the output, `.NAME.lock`, that
holds the holder's pid; the kernel drops a flock when its process dies, so a lock left by a killed run is simply
taken over. The lock file is removed when the holder releases it (the acquirer checks that the file it locked is
still the one on disk, so a release racing an acquire cannot hand out the lock twice). Within one process the
lock is re-entrant (a suite writes a run file, then reads it back through another RunFile). Under a multi-process
launch only the main process takes it: the others write nothing.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import threading
from pathlib import Path

from cli.errors import InputError
from store import writer
from store.processes import is_main_process

_held: dict[str, list] = {}  # lock file -> [fd, count]
_mutex = threading.Lock()


def lock_path(target) -> Path:
    target = Path(target).absolute()
    return target.parent / f".{target.name}.lock"


def is_lock_file(path) -> bool:
    name = Path(path).name
    return name.startswith(".") and name.endswith(".lock")


def _holder(path: Path) -> str:
    try:
        pid = path.read_text(encoding="ascii").strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "another process"


def acquire(target, what: str = "run file", create: bool = True) -> Path | None:
    """Lock `target` (a file or a folder, which need not exist yet; its parent folder is created) for this process,
    or raise InputError naming the holder. Returns the lock file (None under a non-main process, or, with
    `create=False`, when the parent folder does not exist yet: nothing can hold it, and nothing is created before
    the command has checked its input). The lock file is opened by the one writer (no link followed)."""
    if not is_main_process():
        return None
    path = lock_path(target)
    key = str(path)
    with _mutex:
        if key in _held:
            _held[key][1] += 1
            return path
        if not create and not os.path.isdir(path.parent):
            return None
        for _ in range(100):
            fd = writer.open_lock(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise InputError(target, None, None, f"this {what} is in use by {_holder(path)} (another command "
                                 f"writing it); wait for it to finish, or choose another output path") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed the file as we opened it: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        _held[key] = [fd, 1]
        return path


def release(target) -> None:
    """Drop one hold on `target`'s lock; the last one removes the lock file and unlocks it."""
    key = str(lock_path(target))
    with _mutex:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        _unlink_own(key, entry[0])
        os.close(entry[0])


@atexit.register
def _release_all() -> None:
    with _mutex:
        for key, (fd, _) in list(_held.items()):
            _unlink_own(key, fd)
            os.close(fd)
        _held.clear()


def _unlink_own(key: str, fd: int) -> None:
    """Remove the lock file only if it is still the one we hold (never a file put in its place)."""
    try:
        if os.stat(key, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
            os.unlink(key)
    except OSError:
        pass


class Held:
    """`with Held(path):` the lock for a block (a training run, a whole command)."""

    def __init__(self, target, what: str = "output folder"):
        self.target, self.what = target, what

    def __enter__(self):
        acquire(self.target, self.what)
        return self

    def __exit__(self, *exc):
        release(self.target)
