"""The SpatialTrust dataset: loader + validator, box helpers, and an offline synthetic generator.

One JSON Lines record per image (../shared/specs/spatialtrust.md, "On-disk format"):

    {"image_id", "image" (relative to the dataset root), "width", "height",
     "questions": [{"qid": "q1".."q5", "type": "single"|"multi"|"short", "text",
                    "options": {"A": ...} (q1-q3), "answer": ["A"] | ["B", "D"] | "free text",
                    "evidence": [{"option": "B" | "factor": "short name", "box": [x1, y1, x2, y2]}, ...]}]}

The synthetic generator draws login-verification captures (a wall, the user in front, and at known
boxes a second person facing the camera, a phone, a wall camera, a doorway, a window, a bystander
turned away) and writes them in exactly this format:

    python -m eval spatialtrust synthetic --out outputs/spatialtrust-synthetic --n-images 24
"""

from __future__ import annotations

import random
from pathlib import Path

from cli.errors import InputError, check_image, read_text
from cli.numbers import finite
from cli.paths import inside
from store import writer
from store.runs import read_jsonl, write_jsonl

QIDS = ("q1", "q2", "q3", "q4", "q5")
CHOICE_QIDS = ("q1", "q2", "q3")
SET_QIDS = ("q2", "q3")  # option sets with boxes
FREE_QIDS = ("q4", "q5")  # free text with boxes
DESCRIBES = {"q4": "q2", "q5": "q3"}  # the choice question whose factors a description explains
CATEGORY = {"q2": "direct", "q3": "indirect", "q4": "direct", "q5": "indirect"}
QUESTION_TYPES = {"q1": ("single",), "q2": ("single", "multi"), "q3": ("single", "multi"),
                  "q4": ("short",), "q5": ("short",)}


# ----------------------------------------------------------------------------------------------- boxes
def box_floats(box) -> list[float] | None:
    """[x1, y1, x2, y2] as floats when it has the shape of a box (four finite numbers, x1 < x2, y1 < y2),
    wherever it lies; else None."""
    if not isinstance(box, (list, tuple)) or len(box) != 4:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and finite(v) for v in box):
        return None
    x1, y1, x2, y2 = (float(v) for v in box)
    return [x1, y1, x2, y2] if x1 < x2 and y1 < y2 else None


def normalise_box(box, width: float, height: float, clip: bool = False) -> list[float] | None:
    """[x1, y1, x2, y2] as floats, or None when it is malformed: not four finite numbers, x1 >= x2 or
    y1 >= y2, or not inside the image (the spec: a box outside the image scores r = 0). `clip` instead
    cuts it to the image (None if nothing is left): an option of the scorer, off by default."""
    box = box_floats(box)
    if box is None:
        return None
    x1, y1, x2, y2 = box
    if not clip:
        return box if x1 >= 0 and y1 >= 0 and x2 <= width and y2 <= height else None
    x1, x2 = max(0.0, x1), min(float(width), x2)
    y1, y2 = max(0.0, y1), min(float(height), y2)
    if x1 >= x2 or y1 >= y2:
        return None
    return [x1, y1, x2, y2]


def box_iou(predicted: list, truth: list):
    """torchvision's IoU matrix (len(predicted), len(truth)) of xyxy boxes, in float64 (continuous coordinates:
    area = (x2 - x1) * (y2 - y1)). torch is imported here, not at module import, to keep the data CLI fast."""
    import torch
    from torchvision.ops import box_iou as torchvision_box_iou

    return torchvision_box_iou(torch.tensor(predicted, dtype=torch.float64).reshape(-1, 4),
                               torch.tensor(truth, dtype=torch.float64).reshape(-1, 4))


def iou(a, b) -> float:
    """Intersection over union of two xyxy boxes."""
    return box_iou([a], [b]).item()


def exclusive_option(options: dict) -> str | None:
    """The key of the "None of the above" option, if the question has one."""
    for key, text in options.items():
        if " ".join(str(text).lower().replace(".", " ").split()) == "none of the above":
            return key
    return None


def question(record: dict, qid: str) -> dict:
    return next(q for q in record["questions"] if q["qid"] == qid)


# ----------------------------------------------------------------------------------------------- loading
def _check_box(box, width, height, fail, field: str) -> None:
    if not isinstance(box, list) or len(box) != 4 or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and finite(v) for v in box
    ):
        fail(field, f"expected [x1, y1, x2, y2] numbers, got {box!r}")
    x1, y1, x2, y2 = box
    if not (x1 < x2 and y1 < y2):
        fail(field, f"needs x1 < x2 and y1 < y2, got {box}")
    if x1 < 0 or y1 < 0 or x2 > width or y2 > height:
        fail(field, f"{box} is not inside the {width}x{height} image")


def validate_record(record: dict, fail) -> None:
    """Check one image record; `fail(field, message)` raises."""
    for field, kind in (("image_id", str), ("image", str), ("width", int), ("height", int), ("questions", list)):
        if field not in record:
            fail(field, "missing field")
        if not isinstance(record[field], kind) or isinstance(record[field], bool):
            fail(field, f"expected {kind.__name__}, got {type(record[field]).__name__}")
        if kind is str and not record[field].strip():
            fail(field, "empty")
    width, height = record["width"], record["height"]
    if width <= 0 or height <= 0:
        fail("width", f"image size must be positive, got {width}x{height}")
    qids = [q.get("qid") if isinstance(q, dict) else None for q in record["questions"]]
    if sorted(map(str, qids)) != list(QIDS):
        fail("questions", f"expected exactly one each of {', '.join(QIDS)}, got {qids}")
    for q in record["questions"]:
        qid = q["qid"]
        where = f"questions.{qid}"
        for field in ("type", "text", "answer", "evidence"):
            if field not in q:
                fail(f"{where}.{field}", "missing field")
        if q["type"] not in QUESTION_TYPES[qid]:
            fail(f"{where}.type", f"expected one of {QUESTION_TYPES[qid]}, got {q['type']!r}")
        if not isinstance(q["text"], str) or not q["text"].strip():
            fail(f"{where}.text", "expected a non-empty string")
        if not isinstance(q["evidence"], list):
            fail(f"{where}.evidence", "expected a list")
        if qid in CHOICE_QIDS:
            options = q.get("options")
            if not isinstance(options, dict) or len(options) < 2 or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in options.items()
            ):
                fail(f"{where}.options", "expected an object of at least two option key -> text")
            answer = q["answer"]
            if not isinstance(answer, list) or not answer or not all(isinstance(key, str) for key in answer) \
                    or len(set(answer)) != len(answer):
                fail(f"{where}.answer", "expected a non-empty list of distinct option keys")
            for key in answer:
                if key not in options:
                    fail(f"{where}.answer", f"{key!r} is not among the options {sorted(options)}")
            if q["type"] == "single" and len(answer) != 1:
                fail(f"{where}.answer", f"a single-choice question takes one option, got {answer}")
            none = exclusive_option(options)
            if none in answer and len(answer) > 1:
                fail(f"{where}.answer", f"the exclusive option {none!r} cannot be combined with others")
            for i, ev in enumerate(q["evidence"]):
                if not isinstance(ev, dict) or ev.get("option") not in answer:
                    fail(f"{where}.evidence[{i}].option", f"expected one of the answer's options {answer}")
                if ev["option"] == none:
                    fail(f"{where}.evidence[{i}].option", f"the exclusive option {none!r} takes no box")
                _check_box(ev.get("box"), width, height, fail, f"{where}.evidence[{i}].box")
        else:
            if not isinstance(q["answer"], str):
                fail(f"{where}.answer", "expected free text")
            for i, ev in enumerate(q["evidence"]):
                if not isinstance(ev, dict) or not isinstance(ev.get("factor"), str) or not ev["factor"].strip():
                    fail(f"{where}.evidence[{i}].factor", "expected a short factor name")
                _check_box(ev.get("box"), width, height, fail, f"{where}.evidence[{i}].box")


def load(path, image_root=None, check_images: bool = False) -> list[dict]:
    """Every image record of a SpatialTrust JSON Lines file, validated; the first bad one raises InputError.

    `image_root` (default: the file's folder) is where relative image paths start; each record gains
    `image_path`, the absolute path. With `check_images`, an image file that is missing or does not decode
    is an error too.
    """
    path = Path(path)
    root = Path(image_root) if image_root else path.parent
    records = read_jsonl(path)
    if not records:
        raise InputError(path, None, None, "no records")
    seen = set()
    for line, rec in with_line_numbers(path, records):
        def fail(field, message, _line=line):
            raise InputError(path, _line, field, message)

        validate_record(rec, fail)
        if rec["image_id"] in seen:
            fail("image_id", f"duplicate image id {rec['image_id']!r}")
        seen.add(rec["image_id"])
        rec["questions"] = sorted(rec["questions"], key=lambda q: q["qid"])
        rec["image_path"] = str(inside(root, rec["image"], path, line, "image"))
        if check_images:
            check_image(rec["image_path"], line, "image", source=path)
    return records


def with_line_numbers(path, records: list[dict]):
    """(file line number, record) pairs: read_jsonl skips blank lines, so count them back in."""
    lines = [n for n, text in enumerate(read_text(path).split("\n"), 1) if text.strip()]
    if len(lines) == len(records) + 1:  # a run file's header line (read_jsonl leaves it out)
        lines = lines[1:]
    return zip(lines, records)


def summary(records: list[dict]) -> dict:
    """The counts the spec quotes for the real data (577 images, 2,885 QA items, ...)."""
    types = {"single": 0, "multi": 0, "short": 0}
    out = {"images": len(records), "qa_items": 5 * len(records), "grounded_items": 0, "boxes": 0,
           "with_any": 0, "with_none": 0, "with_direct": 0, "with_indirect": 0, "with_both": 0}
    for r in records:
        for q in r["questions"]:
            types[q["type"]] += 1
            out["grounded_items"] += bool(q["evidence"])
            out["boxes"] += len(q["evidence"])
        direct, indirect = (bool(question(r, qid)["evidence"]) for qid in ("q4", "q5"))
        out["with_direct"] += direct
        out["with_indirect"] += indirect
        out["with_both"] += direct and indirect
        out["with_any"] += direct or indirect
        out["with_none"] += not (direct or indirect)
    return {**out, **{f"type_{k}": v for k, v in types.items()}}


# ----------------------------------------------------------------------------------------------- synthetic
# Each factor: its category, the q2/q3 option text, the short factor name of q4/q5, and a reason.
FACTORS = {
    "watcher": ("direct", "A second person looking at the camera or screen", "second person looking at the screen",
                "stands behind the user facing the screen, so they can read what is displayed"),
    "phone": ("direct", "A phone or camera aimed at the scene", "phone aimed at the screen",
              "has its camera pointed at the user and screen, so it can record the login"),
    "cctv": ("direct", "A surveillance camera facing the user", "surveillance camera",
             "is mounted on the wall facing the user, so it can capture the screen and keyboard"),
    "doorway": ("indirect", "An open doorway behind the user", "open doorway",
                "opens onto another space, so someone passing could see the screen"),
    "window": ("indirect", "A window that exposes the screen", "window",
               "lets people outside look in at the screen"),
    "bystander": ("indirect", "A nearby person who is not looking at the screen", "nearby person",
                  "is close enough to turn and see the screen even though they are not looking now"),
}
QUESTION_TEXT = {
    "q1": "Does the non-primary-subject region of this login-verification capture contain any sensitive factor "
          "that could leak information from the computer being logged into?",
    "q2": "Which direct sensitive factors (an immediate disclosure path) are visible? Choose all that apply.",
    "q3": "Which indirect sensitive factors (conditions that make disclosure possible) are visible? "
          "Choose all that apply.",
    "q4": "Describe the direct sensitive factors in the image and explain why each is sensitive.",
    "q5": "Describe the indirect sensitive factors in the image and explain why each is sensitive.",
}
SKIN = [(224, 172, 105), (198, 134, 66), (141, 85, 36), (255, 219, 172)]
WALLS = [(205, 200, 185), (180, 190, 200), (215, 205, 170), (190, 180, 170)]


def _category_options(category: str) -> dict[str, str]:
    names = [name for name, f in FACTORS.items() if f[0] == category]
    options = {chr(ord("A") + i): FACTORS[name][1] for i, name in enumerate(names)}
    options[chr(ord("A") + len(names))] = "None of the above"
    return options


def _option_of(name: str) -> str:
    options = _category_options(FACTORS[name][0])
    return next(k for k, v in options.items() if v == FACTORS[name][1])


def _draw_person(draw, box, rng, facing: bool) -> None:
    x1, y1, x2, y2 = box
    w = x2 - x1
    head = w * 0.5
    hx = x1 + (w - head) / 2
    draw.rounded_rectangle((x1, y1 + head * 0.9, x2, y2), radius=w * 0.2, fill=tuple(rng.randint(30, 220) for _ in "rgb"))
    draw.ellipse((hx, y1, hx + head, y1 + head), fill=rng.choice(SKIN))
    if facing:  # eyes toward the camera
        for ex in (hx + head * 0.28, hx + head * 0.62):
            draw.ellipse((ex, y1 + head * 0.35, ex + head * 0.12, y1 + head * 0.47), fill=(20, 20, 20))
    else:  # the back of the head: hair only
        draw.ellipse((hx, y1, hx + head, y1 + head * 0.8), fill=(60, 40, 25))


def _draw_factor(draw, name: str, box, rng) -> None:
    x1, y1, x2, y2 = box
    if name in ("watcher", "bystander"):
        _draw_person(draw, box, rng, facing=name == "watcher")
    elif name == "phone":
        draw.rounded_rectangle(box, radius=(x2 - x1) * 0.15, fill=(25, 25, 30))
        r = (x2 - x1) * 0.18
        cx, cy = (x1 + x2) / 2, y1 + (y2 - y1) * 0.18
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=(90, 120, 200))
    elif name == "cctv":
        draw.rectangle((x1, y1, x2, y1 + (y2 - y1) * 0.55), fill=(235, 235, 235), outline=(60, 60, 60))
        draw.rectangle(((x1 + x2) / 2 - 2, y1 + (y2 - y1) * 0.55, (x1 + x2) / 2 + 2, y2), fill=(60, 60, 60))
        r = (y2 - y1) * 0.15
        draw.ellipse((x1 + r, y1 + r, x1 + 3 * r, y1 + 3 * r), fill=(10, 10, 10))
    elif name == "doorway":
        draw.rectangle(box, fill=(95, 70, 45))
        inset = (x2 - x1) * 0.1
        draw.rectangle((x1 + inset, y1 + inset, x2 - inset, y2), fill=(25, 25, 35))
    elif name == "window":
        draw.rectangle(box, fill=(240, 240, 240))
        inset = (x2 - x1) * 0.06
        draw.rectangle((x1 + inset, y1 + inset, x2 - inset, y2 - inset), fill=(150, 200, 240))
        draw.line(((x1 + x2) / 2, y1, (x1 + x2) / 2, y2), fill=(240, 240, 240), width=max(1, int(inset)))
        draw.line((x1, (y1 + y2) / 2, x2, (y1 + y2) / 2), fill=(240, 240, 240), width=max(1, int(inset)))


# Where factors may go, as fractions of the image: left, right and upper middle, never over the user.
SLOTS = ((0.02, 0.05, 0.30, 0.95), (0.70, 0.05, 0.98, 0.95), (0.36, 0.02, 0.64, 0.36))
# Size of each factor as (width, height) fractions of its slot.
SIZES = {"watcher": (0.6, 0.8), "bystander": (0.6, 0.8), "phone": (0.25, 0.3), "cctv": (0.35, 0.25),
         "doorway": (0.7, 0.85), "window": (0.8, 0.55)}


def _side(box, width: int) -> str:
    return "left" if box[2] < width * 0.35 else "right" if box[0] > width * 0.65 else "upper middle"


def synthetic_record(index: int, rng: random.Random, width: int, height: int, out: Path) -> dict:
    """Draw one capture, save it under out/images/, and return its record."""
    from PIL import Image, ImageDraw

    image_id = f"st_{index:05d}"
    image = Image.new("RGB", (width, height), rng.choice(WALLS))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, int(height * 0.8), width, height), fill=(120, 100, 80))  # floor
    kind = index % 4  # none, direct only, indirect only, both: every kind appears in any 4 images
    direct = [n for n, f in FACTORS.items() if f[0] == "direct"]
    indirect = [n for n, f in FACTORS.items() if f[0] == "indirect"]
    names = []
    if kind in (1, 3):
        names += rng.sample(direct, rng.randint(1, 2 if kind == 1 else 1))
    if kind in (2, 3):
        names += rng.sample(indirect, rng.randint(1, 2 if kind == 2 else 1))
    slots = rng.sample(range(len(SLOTS)), len(names))
    placed = []
    for name, slot in zip(names, slots):
        sx1, sy1, sx2, sy2 = SLOTS[slot]
        sw, sh = (sx2 - sx1) * width, (sy2 - sy1) * height
        fw, fh = SIZES[name]
        w, h = round(sw * fw * rng.uniform(0.8, 1.0)), round(sh * fh * rng.uniform(0.8, 1.0))
        x1 = round(sx1 * width + rng.uniform(0, sw - w))
        y1 = round(sy1 * height + rng.uniform(0, sh - h))
        box = [x1, y1, x1 + w, y1 + h]
        _draw_factor(draw, name, box, rng)
        placed.append((name, box))
    # The user (primary subject, never a factor) in front, then the laptop edge.
    _draw_person(draw, (width * 0.36, height * 0.38, width * 0.64, height * 1.05), rng, facing=True)
    draw.rectangle((width * 0.3, height * 0.9, width * 0.7, height), fill=(50, 50, 55))
    with writer.atomic(out / "images" / f"{image_id}.png") as f:  # the one writer (store/writer.py)
        image.save(f, format="PNG")

    questions = [{"qid": "q1", "type": "single", "text": QUESTION_TEXT["q1"], "options": {"A": "Yes", "B": "No"},
                  "answer": ["A" if placed else "B"], "evidence": []}]
    for qid, category in (("q2", "direct"), ("q3", "indirect")):
        options = _category_options(category)
        mine = [(n, b) for n, b in placed if FACTORS[n][0] == category]
        answer = sorted(_option_of(n) for n, _ in mine) or [next(k for k, v in options.items() if v == "None of the above")]
        questions.append({"qid": qid, "type": "multi" if len(answer) > 1 else "single", "text": QUESTION_TEXT[qid],
                          "options": options, "answer": answer,
                          "evidence": [{"option": _option_of(n), "box": b} for n, b in mine]})
    for qid, category in (("q4", "direct"), ("q5", "indirect")):
        mine = [(n, b) for n, b in placed if FACTORS[n][0] == category]
        text = " ".join(f"A {FACTORS[n][2]} on the {_side(b, width)} {FACTORS[n][3]}." for n, b in mine)
        questions.append({"qid": qid, "type": "short", "text": QUESTION_TEXT[qid],
                          "answer": text or f"No {category} sensitive factor is visible.",
                          "evidence": [{"factor": FACTORS[n][2], "box": b} for n, b in mine]})
    return {"image_id": image_id, "image": f"images/{image_id}.png", "width": width, "height": height,
            "questions": questions}


def build_synthetic(out, n_images: int = 24, seed: int = 0, width: int = 480, height: int = 320) -> Path:
    """Write out/data.jsonl and out/images/*.png; returns the path of data.jsonl."""
    out = Path(out)
    rng = random.Random(f"spatialtrust-{seed}")
    records = [synthetic_record(i, rng, width, height, out) for i in range(n_images)]
    write_jsonl(out / "data.jsonl", records)
    return out / "data.jsonl"
