"""Model output -> the predictions format of the spec, robustly.

A prediction record is `{"image_id", "q1": {"choices": [...]}, "q2"/"q3": {"choices", "boxes": {option: [box, ...]}},
"q4"/"q5": {"text", "boxes": [box, ...]}}`. Anything that cannot be read becomes that question's `"error"`
(the scorer gives it 0 and counts it); a malformed box becomes `null` in place (r_i = 0, counted). Nothing here
raises on model output.
"""

from __future__ import annotations

import json
import re

from eval.spatialtrust.data import CHOICE_QIDS, FREE_QIDS, QIDS, SET_QIDS, box_floats, exclusive_option, question

BOX_SCALES = ("pixels", "1000")  # absolute pixels, or Qwen-style coordinates on a 0-1000 grid
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_LETTER = re.compile(r"^\(?([A-Za-z])\)?(?:\s*[.:)\-]\s*.*)?$", re.DOTALL)


def extract_json(text, keys=()) -> dict | None:
    """The first JSON object in `text` (fenced or inside prose) that has one of `keys`, else the first object.

    Trailing commas are forgiven; anything else that is not JSON is not guessed at.
    """
    if not isinstance(text, str):
        return None
    decoder = json.JSONDecoder()
    first = None
    for chunk in [*_FENCE.findall(text), text]:
        for source in (chunk, _TRAILING_COMMA.sub(r"\1", chunk)):
            for start in (i for i, ch in enumerate(source) if ch == "{"):
                try:
                    obj, _ = decoder.raw_decode(source, start)
                except (json.JSONDecodeError, RecursionError):  # a reply nested thousands deep holds no answer
                    continue
                if not isinstance(obj, dict):
                    continue
                if not keys or any(lookup(obj, k) is not None for k in keys):
                    return obj
                first = first if first is not None else obj
    return first


def lookup(obj, key: str):
    """obj[key], case-insensitively; None when obj is not an object or lacks the key."""
    if not isinstance(obj, dict):
        return None
    for k, v in obj.items():
        if isinstance(k, str) and k.strip().lower() == key.lower():
            return v
    return None


def _clean(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def option_key(token, options: dict) -> str | None:
    """One option as the model wrote it ("B", "(b)", "B. A phone ...", "Option B", the option text) -> its key."""
    if not isinstance(token, str):
        return None
    t = token.strip().strip("\"'`*").strip()
    t = re.sub(r"^option\s+", "", t, flags=re.IGNORECASE)
    by_upper = {k.upper(): k for k in options}
    match = _LETTER.match(t)
    if match and match.group(1).upper() in by_upper:
        return by_upper[match.group(1).upper()]
    by_text = {_clean(v): k for k, v in options.items()}
    return by_text.get(_clean(t))


def parse_choices(value, options: dict, single: bool, drop_exclusive: bool = False) -> tuple[list[str], str | None]:
    """(option keys in option order, None) or ([], reason).

    The exclusive option ("None of the above") must stand alone: combined with others it is an error, or with
    `drop_exclusive` it is dropped (candidate selection keeps the factors for verification to check).
    """
    if isinstance(value, dict):
        value = lookup(value, "choices") if lookup(value, "choices") is not None else lookup(value, "answer")
    tokens = value if isinstance(value, list) else [value]
    keys = []
    for token in tokens:
        key = option_key(token, options)
        if key is None and isinstance(token, str):
            # "A, C" or "A and C": every part must be an option.
            parts = [p for p in re.split(r"\s*(?:,|;|/|\band\b|&)\s*", token.strip()) if p]
            part_keys = [option_key(p, options) for p in parts]
            if len(parts) > 1 and all(part_keys):
                keys += part_keys
                continue
        if key is None:
            return [], f"not an option: {token!r}"
        keys.append(key)
    keys = [k for k in options if k in keys]
    if not keys:
        return [], "no option chosen"
    if single and len(keys) > 1:
        return [], f"one option expected, got {keys}"
    none = exclusive_option(options)
    if none in keys and len(keys) > 1 and drop_exclusive:
        keys.remove(none)
    if none in keys and len(keys) > 1:
        return [], f"the exclusive option {none!r} was combined with {[k for k in keys if k != none]}"
    return keys, None


def box_numbers(value, width: int, height: int, box_scale: str = "pixels") -> list | None:
    """The four pixel coordinates a model wrote (a list, a string holding four numbers, or {x1, y1, x2, y2}),
    scaled from the 0-1000 grid when asked, not yet checked or clipped."""
    if isinstance(value, str):
        numbers = _NUMBER.findall(value)
        value = [float(n) for n in numbers] if len(numbers) == 4 else None
    if isinstance(value, dict):
        value = [value.get(k) for k in ("x1", "y1", "x2", "y2")]
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        return None
    if box_scale == "1000" and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        value = [value[0] * width / 1000, value[1] * height / 1000, value[2] * width / 1000, value[3] * height / 1000]
    return list(value)


def parse_box(value, width: int, height: int, box_scale: str = "pixels") -> list[float] | None:
    """One box as the model wrote it -> pixel xyxy floats, or None when it is not shaped like a box. A box
    reaching outside the image is kept as written: the scorer counts it as malformed (or clips it, if asked)."""
    return box_floats(box_numbers(value, width, height, box_scale))


def as_box_list(value) -> list:
    """A list of boxes as given, one bare box wrapped in a list."""
    if value is None:
        return []
    if _is_flat_box(value) or not isinstance(value, list):
        return [value]
    return value


def _is_flat_box(value) -> bool:
    return isinstance(value, list) and len(value) == 4 and all(isinstance(v, (int, float)) for v in value)


def parse_box_list(value, width: int, height: int, box_scale: str = "pixels") -> list:
    """A list of boxes (or one bare box) -> list of pixel boxes, `None` in place of each malformed one."""
    return [parse_box(v, width, height, box_scale) for v in as_box_list(value)]


def parse_choice_answer(value, q: dict, width: int, height: int, box_scale: str = "pixels") -> dict:
    """A q1/q2/q3 answer -> {"choices", "boxes"?} or with an "error"."""
    grounded = q["qid"] in SET_QIDS
    choices, error = parse_choices(value, q["options"], single=q["qid"] == "q1")
    out = {"choices": choices}
    if grounded:
        out["boxes"] = {}
        raw = lookup(value, "boxes") if isinstance(value, dict) else None
        if isinstance(raw, dict):
            for k, boxes in raw.items():
                key = option_key(k, q["options"])
                if key in choices:
                    out["boxes"].setdefault(key, []).extend(parse_box_list(boxes, width, height, box_scale))
        elif raw is not None and len(choices) == 1:  # a bare list of boxes for the single chosen option
            out["boxes"][choices[0]] = parse_box_list(raw, width, height, box_scale)
    if error:
        out["error"] = error
    return out


def parse_free_answer(value, width: int, height: int, box_scale: str = "pixels") -> dict:
    """A q4/q5 answer ({"text", "boxes"} or bare text) -> {"text", "boxes"} or with an "error"."""
    if isinstance(value, str):
        return {"text": value.strip(), "boxes": []}
    if isinstance(value, dict) and isinstance(lookup(value, "text"), str):
        return {"text": lookup(value, "text").strip(),
                "boxes": parse_box_list(lookup(value, "boxes"), width, height, box_scale)}
    return {"text": "", "boxes": [], "error": f"expected text, got {type(value).__name__}"}


def missing(qid: str, error: str) -> dict:
    """The prediction of a question the model did not answer readably."""
    if qid in FREE_QIDS:
        return {"text": "", "boxes": [], "error": error}
    return {"choices": [], **({"boxes": {}} if qid in SET_QIDS else {}), "error": error}


def parse_one_pass(text, record: dict, box_scale: str = "pixels") -> dict:
    """The one-pass baseline's whole answer (one JSON object with q1..q5) -> a prediction record."""
    w, h = record["width"], record["height"]
    obj = extract_json(text, keys=QIDS)
    prediction = {"image_id": record["image_id"]}
    for qid in QIDS:
        value = lookup(obj, qid) if obj is not None else None
        if value is None:
            prediction[qid] = missing(qid, "no JSON object in the response" if obj is None else f"no {qid} in the answer")
        elif qid in CHOICE_QIDS:
            prediction[qid] = parse_choice_answer(value, question(record, qid), w, h, box_scale)
        else:
            prediction[qid] = parse_free_answer(value, w, h, box_scale)
    return prediction
