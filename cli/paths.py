"""Paths that a data file names (an item's `image_path`, a record's `image`, a metadata `image_id`), resolved
inside the folder they are relative to.

A crafted benchmark file must not make us read, and send to an endpoint, a file outside its data: an absolute
path, or one whose `..` parts leave the base folder, is refused with the file, line and field that named it. That
check is on the path as written (`..` resolved lexically), so a symlink the user put inside the folder still
works for the commands that read the user's own data. Where the folder itself may come from someone else (the
viewer's run and suite folders), `inside(..., resolve=True)` and `contained` resolve every symbolic link first:
the real path must lie inside the real folder (`link/../passport.png` and an image that is a link to an outside
file are refused); a Hugging Face snapshot's own links into its repository's blob store stay allowed.
`PRIVACY_ALIGN_ALLOW_OUTSIDE_PATHS=1` is the explicit consent for data whose paths point elsewhere.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path, PurePosixPath

from cli.errors import InputError

ALLOW_ENV = "PRIVACY_ALIGN_ALLOW_OUTSIDE_PATHS"


def loop_error(path) -> InputError:
    """A symbolic link loop met anywhere (an image, --out, a run file, a recorded root): one line, never pathlib's
    RuntimeError."""
    return InputError(path, None, None, "is a symbolic link loop (too many levels of symbolic links); refused")


def real(path) -> Path:
    """`path` with every symbolic link resolved (Path.resolve), a loop refused as one line (loop_error)."""
    try:
        return Path(path).resolve()
    except RuntimeError:  # Python 3.11's pathlib: "Symlink loop from ..."
        raise loop_error(path) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise loop_error(path) from None
        raise


def outside_allowed() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def inside(base, name, source=None, where=None, field=None, resolve: bool = False) -> Path:
    """`base / name`, refused (InputError naming `source`, `where`, `field`) when `name` is absolute, empty or
    leaves `base`, unless outside paths are allowed; with `resolve`, also when its real path leaves the real `base`
    (`contained`)."""
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
    return contained(base, Path(base) / path, source, where, field, name) if resolve else Path(base) / path


def contained(base, path, source=None, where=None, field=None, name=None) -> Path:
    """`path` (a file or folder under `base`), refused (InputError naming `source` or the path, `where`, `field`)
    when its real location, every symbolic link followed, is not inside the real `base` nor, for a Hugging Face
    snapshot, in its repository's blob store; unless outside paths are allowed."""
    if outside_allowed():
        return Path(path)
    real_path = real(path)
    if any(real_path.is_relative_to(root) for root in _real_roots(base)):
        return Path(path)
    shown = str(path) if name is None else repr(name)
    raise InputError(source or path, where, field, f"{shown} leads outside {base} through a symbolic link; only "
                     f"files inside {base} are read (set {ALLOW_ENV}=1 to allow others)")


def _real_roots(base) -> list[Path]:
    """Where a path under `base` may really lie: `base` itself, and when `base` is (in) a Hugging Face snapshot,
    `<repo>/snapshots/<revision>/...`, the repository's `blobs/`, which the snapshot's files are links into."""
    roots = [real(base)]
    for start in dict.fromkeys((Path(os.path.abspath(base)), roots[0])):
        snapshot = next((f for f in (start, *start.parents) if f.parent.name == "snapshots"), None)
        if snapshot is not None and (snapshot.parent.parent / "blobs").is_dir():
            roots.append(real(snapshot.parent.parent / "blobs"))
    return roots
