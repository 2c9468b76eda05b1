"""VLM-GeoPrivacy data: gold labels, image metadata, prediction and coordinate files, and the id mapping.

Three id forms name the same image (spec §1.2): `image_id` (`yfcc-123`, `im2gps3k-123`, `gptgeochat-123`, in the
metadata and the image file names of the download script), and the label id (`123`, with `s` in front for the 50
GPTGeoChat images: `s123`), used by `annotation_labels.csv` and by every released prediction file. Open-model files
store the numeric ids as JSON ints. Everything here joins on the label id, as a string.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from cli.errors import InputError, NotJSON, parse_json, read_text
from cli.paths import inside
from store.runs import read_jsonl

ASSETS = Path(__file__).resolve().parent / "assets"
DEFAULT_LABELS = ASSETS / "annotation_labels.csv"
DEFAULT_METADATA = ASSETS / "images_metadata.csv"
QUESTIONS = tuple(f"Q{i}" for i in range(1, 8))
# Which letters each question takes (spec §1.3).
OPTIONS = {"Q1": "ABC", "Q2": "AB", "Q3": "AB", "Q4": "ABC", "Q5": "ABC", "Q6": "AB", "Q7": "ABC"}
IMAGE_PREFIXES = ("yfcc", "im2gps3k", "gptgeochat")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def label_id(raw) -> str:
    """Any of the three id forms (or a JSON int) -> the label id used by the gold labels."""
    text = str(raw).strip()
    stem = Path(text).stem if text.lower().endswith(IMAGE_SUFFIXES) else text
    prefix, sep, number = stem.partition("-")
    if sep and prefix in IMAGE_PREFIXES:
        return ("s" if prefix == "gptgeochat" else "") + number
    return stem


def is_label_id(label) -> bool:
    """Whether `label` (as label_id gives it) has the form of a GeoPrivacy label id: a number (YFCC, im2gps3k), or
    s and a number (GPTGeoChat). Every id of the released labels has it."""
    return isinstance(label, str) and re.fullmatch(r"s?[0-9]+", label) is not None


def image_id(label: str, source: str | None = None) -> str:
    """Label id -> `image_id`. Without the source, a bare number is taken to be YFCC (1,100 of 1,200 images)."""
    label = str(label)
    if label.startswith("s"):
        return f"gptgeochat-{label[1:]}"
    if source and "im2gps" in source:
        return f"im2gps3k-{label}"
    return f"yfcc-{label}"


def load_labels(path=DEFAULT_LABELS) -> dict[str, dict[str, str]]:
    """`annotation_labels.csv` -> {label id: {"Q1": "A", ..., "Q7": "C"}}."""
    path = Path(path)
    labels: dict[str, dict[str, str]] = {}
    with io.StringIO(read_text(path), newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("id", *QUESTIONS) if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(path, 1, missing[0], "missing column")
        for lineno, row in enumerate(reader, 2):
            key = label_id(row["id"])
            if not key:
                raise InputError(path, lineno, "id", "empty id")
            if key in labels:
                raise InputError(path, lineno, "id", f"duplicate id {key!r}")
            for q in QUESTIONS:
                value = (row[q] or "").strip()
                if len(value) != 1 or value not in OPTIONS[q]:
                    raise InputError(path, lineno, q, f"expected one of {', '.join(OPTIONS[q])}, got {value!r}")
            labels[key] = {q: row[q].strip() for q in QUESTIONS}
    if not labels:
        raise InputError(path, None, None, "no rows")
    return labels


def load_metadata(path=DEFAULT_METADATA) -> dict[str, dict]:
    """`images_metadata.csv` -> {label id: {"image_id", "image_source", "lat", "lon", "sharing_intent"}}."""
    path = Path(path)
    meta = {}
    with io.StringIO(read_text(path), newline="") as f:
        for lineno, row in enumerate(csv.DictReader(f), 2):
            for field in ("image_id", "image_source", "true_coordinate"):
                if not row.get(field):
                    raise InputError(path, lineno, field, "missing value")
            try:
                lat, lon = (float(x) for x in parse_json(row["true_coordinate"], path, lineno))
            except (InputError, ValueError, TypeError):
                raise InputError(path, lineno, "true_coordinate", "expected \"[lat, lon]\"") from None
            meta[label_id(row["image_id"])] = {
                "image_id": row["image_id"], "image_source": row["image_source"], "lat": lat, "lon": lon,
                "sharing_intent": row.get("sharing_intent"),
            }
    return meta


def read_records(path: Path):
    """A JSON document, or a JSON Lines file (our run files, `.jsonl`) as a list of objects."""
    text = read_text(path)
    if path.suffix != ".jsonl":  # a one-line JSON Lines file is also a JSON document: trust the suffix
        try:
            return parse_json(text, path)
        except NotJSON:
            pass
    return read_jsonl(path)


def load_predictions(path, setting: str) -> list[dict]:
    """A released prediction file (a JSON list) or one of our run files (JSON Lines), as rows with str ids.

    Free-form rows keep `Q7-label` exactly as stored (judge output, possibly `D` or empty). MCQ rows keep Q1..Q7
    as stored; a run file of raw MCQ responses (`response`, not yet parsed) is parsed here with the authors' rules.
    Records of our run files that carry an `error` (generation or judging failed for good) are left out: a re-run
    of that step fills them in.
    """
    from eval.geoprivacy.parsing import parse_mcq, parse_q7_only
    from eval.spatialtrust.data import with_line_numbers

    path = Path(path)
    data = read_records(path)
    if not isinstance(data, list):
        raise InputError(path, None, None, "expected a JSON list of records (or JSON Lines)")
    rows, seen = [], set()
    # a run file's errors name its lines (its header line counted); a released JSON list's, the record's number
    for n, record in with_line_numbers(path, data) if path.suffix == ".jsonl" else enumerate(data, 1):
        if not isinstance(record, dict):
            raise InputError(path, n, None, "expected a JSON object")
        if "id" not in record:
            raise InputError(path, n, "id", "missing field")
        row = dict(record)
        row["id"] = label_id(record["id"])
        if row["id"] in seen:
            raise InputError(path, n, "id", f"duplicate id {row['id']!r}")
        seen.add(row["id"])
        if record.get("error"):
            continue
        if setting == "free-form":
            if "Q7-label" not in record:
                hint = " (run `geo judge` on this file first)" if "response" in record else ""
                raise InputError(path, n, "Q7-label", "missing field" + hint)
        elif setting == "mcq":
            if "Q7" not in record:
                if not isinstance(record.get("response"), str):
                    raise InputError(path, n, "Q7", "missing field (and no `response` to parse)")
                q7_only = record.get("q7_only", False)
                row.update(parse_q7_only(record["response"]) if q7_only else parse_mcq(record["response"]))
        else:
            raise ValueError(f"unknown setting {setting!r}")
        rows.append(row)
    return rows


def load_coordinates(path) -> dict[str, tuple[float, float]]:
    """Predicted coordinates: the authors' `{id: {"lat", "lng", ..., "source": "geocoded"}}` or our JSON Lines
    `{"id", "lat", "lng", ...}`. Only geocoded entries count (the authors' cache keeps only those)."""
    path = Path(path)
    data = read_records(path)
    if isinstance(data, dict):
        items = [(key, value) for key, value in data.items()]
    elif isinstance(data, list):
        items = [(r.get("id") if isinstance(r, dict) else None, r) for r in data]
    else:
        raise InputError(path, None, None, "expected a JSON object keyed by id, or JSON Lines")
    coords = {}
    for n, (key, entry) in enumerate(items, 1):
        where = key if isinstance(data, dict) else n
        if key is None or not isinstance(entry, dict):
            raise InputError(path, where, "id", "expected an object with an id")
        if entry.get("error") or entry.get("source", "geocoded") != "geocoded" or entry.get("lat") is None:
            continue
        try:
            lat, lng = float(entry["lat"]), float(entry["lng"])
        except (KeyError, TypeError, ValueError):
            raise InputError(path, where, "lat/lng", "expected numbers") from None
        if not (-90 <= lat <= 90 and -180 <= lng <= 180):
            raise InputError(path, where, "lat/lng", f"out of range: {lat}, {lng}")
        coords[label_id(key)] = (lat, lng)
    return coords


def find_image(images_dir, label: str, meta: dict | None = None) -> Path | None:
    """The image file of a label id in a folder named either way (`yfcc-123.jpg` or `123.jpg`)."""
    images_dir = Path(images_dir)
    names = [label, image_id(label, (meta or {}).get("image_source"))]
    if meta:
        names.insert(0, meta["image_id"])
    for name in names:
        for suffix in IMAGE_SUFFIXES:
            candidate = inside(images_dir, f"{name}{suffix}", field="image_id")
            if candidate.is_file():
                return candidate
    return None


def model_group(path) -> str:
    """Files of one model's seed runs share this key: the file stem without its `seed<N>` part."""
    return re.sub(r"_?seed\d+", "", Path(path).stem)
