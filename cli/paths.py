"""Paths that a data file names (an item's `image_path`, a record's `image`, a metadata `image_id`), resolved
inside the folder they are relative to.

A crafted benchmark file must not make us read, and send to an endpoint, a file outside its data: an absolute
path, or one whose `..` parts leave the base folder, is refused with the file, line and field that named it. The
check is on the path as written (`..` resolved lexically), so a symlink the user put inside the folder still
works. `PRIVACY_ALIGN_ALLOW_OUTSIDE_PATHS=1` is the explicit consent for data whose paths point elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from cli.errors import InputError

ALLOW_ENV = "PRIVACY_ALIGN_ALLOW_OUTSIDE_PATHS"


def outside_allowed() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def inside(base, name, source=None, where=None, field=None) -> Path:
    """`base / name`, refused (InputError naming `source`, `where`, `field`) when `name` is absolute, empty or
    leaves `base`, unless outside paths are allowed."""
    if not isinstance(name, str) or not name.strip() or "\0" in name:
        raise InputError(source or base, where, field, f"expected a relative file path, got {name!r}")
    path = Path(name)
    if outside_allowed():
        return path if path.is_absolute() else Path(base) / path
    problem = None
    if path.is_absolute() or PurePosixPath(name.replace("\\", "/")).is_absolute() or path.drive:
        problem = "is an absolute path"
    else:
        parts = []
        for part in name.replace("\\", "/").split("/"):
            if part == "..":
                if not parts:
                    problem = "leaves its folder (..)"
                    break
                parts.pop()
            elif part not in ("", "."):
                parts.append(part)
    if problem:
        raise InputError(source or base, where, field, f"{name!r} {problem}; a data file names files inside {base} "
                         f"only (set {ALLOW_ENV}=1 to allow others)")
    return Path(base) / path
