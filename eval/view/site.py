"""The static site: index.html, the viewer's script and style (package data, copied), the rows in chunks of
`<script>` files (a page opened from file:// may not fetch() JSON, but may load scripts beside it), and the
images: a thumbnail and a full-size copy of each, named by the source file's path, size and time, so they are
made once and reused by every later build into the same folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cli.errors import InputError, read_text
from cli.paths import real
from eval.view.records import GEO_GRANULARITY, dumps, safe_text
from store import writer
from store.runs import claim_files, claim_folder, forget_files, write_text, written_files

ASSETS = Path(__file__).parent / "assets"
CHUNK_ROWS = 2000
THUMB_SIDE = 240
FULL_SIDE = 1600


def image_name(path: Path) -> str:
    resolved = real(path)  # a loop: one line
    stat = resolved.stat()
    return hashlib.sha1(f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:20]


WEB_IMAGES = (".jpg", ".jpeg", ".png", ".webp", ".gif")  # shown as they are when not huge


def prepare_images(path: Path, folder: Path) -> dict:
    """What the site needs of one image, made before the site's folder is touched, so that an image that does not
    decode is refused before anything is written: its thumbnail (JPEG bytes) and the name of its full-size copy,
    the file itself when the browser shows it and it is not huge, else a JPEG at most FULL_SIDE pixels on a side.
    Both already in `folder` (an earlier build, checked by the one writer: a link planted under a predictable name
    is refused, never served): nothing to make."""
    import io

    from PIL import Image

    name = image_name(path)
    thumb, copied, resized = folder / f"{name}_t.jpg", folder / f"{name}{path.suffix.lower()}", folder / f"{name}_f.jpg"
    for full in (copied, resized):
        if writer.is_file(thumb, root=folder.parent) and writer.is_file(full, root=folder.parent):
            return {"thumb": thumb, "full": full}
    try:
        with Image.open(path) as image:
            image.load()
            rgb = image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise InputError(path, None, None, f"not a readable image ({type(err).__name__})") from None
    big = max(rgb.size) > FULL_SIDE or path.suffix.lower() not in WEB_IMAGES
    rgb.thumbnail((THUMB_SIDE, THUMB_SIDE))
    data = io.BytesIO()
    rgb.save(data, format="JPEG", quality=85)
    return {"thumb": thumb, "full": resized if big else copied, "source": path, "thumb_bytes": data.getvalue()}


def write_images(made: dict) -> tuple[str, str]:
    """Write what prepare_images made through the one writer (the folder is the site's own by now); the
    (thumbnail, full-size) paths relative to the site."""
    from PIL import Image

    thumb, full = made["thumb"], made["full"]
    root = thumb.parent.parent
    if "thumb_bytes" in made:
        if full.name.endswith("_f.jpg"):
            with Image.open(made["source"]) as image:
                copy = image.convert("RGB")
            copy.thumbnail((FULL_SIDE, FULL_SIDE))
            with writer.atomic(full, root=root) as f:
                copy.save(f, format="JPEG", quality=85)
        else:
            writer.copy_file(made["source"], full, root=root)
        writer.write_bytes(thumb, made["thumb_bytes"], root=root)
    return f"img/{thumb.name}", f"img/{full.name}"


def category_names(rows: list[dict]) -> dict:
    """`<benchmark>:<category>` -> the category's display name: a category belongs to its benchmark (SpatialTrust's
    q1 answer "A" and GeoPrivacy's Q7 "A" are two categories)."""
    from data_prep.categories import as_categories

    names = {}
    spy_texts = as_categories(None).label2text()
    for row in rows:
        key, category = f"{row['bench']}:{row['category']}", row["category"]
        if key in names:
            continue
        if row["bench"] == "spy":
            names[key] = f"{category.split('_')[0]} {spy_texts.get(category, category.partition('_')[2])}"
        elif row["bench"] == "geo":
            names[key] = f"Q7 gold {category}: {GEO_GRANULARITY.get(category, category)}"
        else:
            names[key] = f"q1 gold {category}"
    return names


COMMAND = "eval view"  # the marker (store.runs.claim_folder) that says a folder is a viewer we wrote
SITE_FILES = {"index.html", "viewer.js", "viewer.css", "data", "img"}


def _viewer_before_markers(out: Path) -> bool:
    """A viewer written before the marker existed: only our files, and our own script (its first line)."""
    try:  # through the reader: a FIFO planted as viewer.js is refused, never opened (it would block)
        script = read_text(out / "viewer.js")
        names = {p.name for p in out.iterdir()}
        data = {p.name for p in (out / "data").iterdir()}
    except (OSError, InputError):
        return False
    ours = (ASSETS / "viewer.js").read_text(encoding="utf-8").split("\n", 1)[0]
    return names <= SITE_FILES and script.split("\n", 1)[0] == ours and all(
        n == "meta.js" or (n.startswith("rows-") and n.endswith(".js")) or n.startswith(".") for n in data)


def write_site(rows: list[dict], run_names: list[str], out, title: str = "privacy-align samples",
               progress: bool = True) -> Path:
    """Write the viewer of `rows` (records.merge_runs) under `out`; returns index.html.

    Everything the page holds is rendered (and encoded), and every new image decoded and thumbnailed, before the
    folder is touched; the folder must be new, empty or a viewer this command wrote (its marker, written first, so
    a killed build is one too); index.html is written last."""
    from tqdm.auto import tqdm

    out = Path(out)
    images: dict[Path, int] = {}
    sources, shown = [], []
    for row in rows:
        path = row["image"]
        if path is not None and path not in images:
            images[path] = len(sources)
            sources.append(Path(path))
        # the site names its own copies only: no path of this machine goes into the page
        shown.append({**{k: v for k, v in row.items() if k != "image"}, "img": images.get(path)})
    chunks = [shown[i: i + CHUNK_ROWS] for i in range(0, len(shown), CHUNK_ROWS)] or [[]]
    texts = {f"rows-{n:04d}.js": f"VIEWER.addChunk({n},{dumps(chunk)});\n" for n, chunk in enumerate(chunks)}
    meta = {"title": title, "runs": [{"name": n} for n in run_names], "n_rows": len(shown), "n_chunks": len(chunks),
            "categories": category_names(shown), "sections": list(dict.fromkeys(r["section"] for r in shown)),
            "benches": list(dict.fromkeys(r["bench"] for r in shown))}
    page = (ASSETS / "index.html").read_text(encoding="utf-8").replace("{{title}}", _escape(safe_text(title)))
    # every file the site writes, checked by the one writer before anything is: a link planted in an earlier build's
    # folder (data/, img/, a predictable image name) is refused in one line, never followed
    for name in [*(f"data/{n}" for n in texts), "data/meta.js", "viewer.js", "viewer.css", "index.html"]:
        writer.check_output(out / name, root=out)
    with tqdm(sources, desc="thumbnails", disable=not progress, mininterval=1.0) as bar:  # closed before an error
        made = [prepare_images(path, out / "img") for path in bar]
    for m in made:
        writer.check_output(m["full"], root=out)
        writer.check_output(m["thumb"], root=out)
    claim_folder(out, COMMAND, own=SITE_FILES if out.is_dir() and _viewer_before_markers(out) else ())
    table = [dict(zip(("thumb", "full"), write_images(m))) for m in made]
    rows = [f"data/{name}" for name in texts]
    claim_files(out, rows, mark=True)  # the ledger: the rows files this command wrote, the only ones it may remove
    for name, text in texts.items():
        write_text(out / "data" / name, text)
    ledger = written_files(out)
    stale = [n for n in sorted(ledger) if n.startswith("data/rows-") and n not in rows]  # a bigger viewer built here
    for name in stale:
        writer.remove(out / name, ledger, root=out)
    forget_files(out, stale)
    write_text(out / "data" / "meta.js", f"VIEWER.setMeta({dumps({**meta, 'images': table})});\n")
    for asset in ("viewer.js", "viewer.css"):
        write_text(out / asset, (ASSETS / asset).read_text(encoding="utf-8"))
    write_text(out / "index.html", page)
    return out / "index.html"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
