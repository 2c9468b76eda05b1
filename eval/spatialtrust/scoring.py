"""SpatialTrust scores (../shared/specs/spatialtrust.md, "Scoring"): pure functions over records, no model.

q1 exact match of the normalised chosen option ("a", "(A)" or the option's text count as "A"); q2/q3 option-level with the extra-option rule and max-IoU grounding; q4/q5 from the judge's
structured verdict and box IoU; overall = mean of the five. tau = 0.5 and IoU >= tau counts. A predicted box
not inside the image is malformed (r = 0); `clip_boxes=True` cuts it to the image instead (off by default).
"""

from __future__ import annotations

import hashlib
import json

from cli.errors import InputError, Number, Whole
from eval.spatialtrust.data import (
    CHOICE_QIDS,
    FREE_QIDS,
    QIDS,
    box_iou,
    iou,
    normalise_box,
    question,
    with_line_numbers,
)
from eval.spatialtrust.parsing import option_key, parse_choices

TAU = 0.5


def _valid_boxes(boxes, width, height, clip: bool = False) -> tuple[list, int]:
    """(usable boxes, number of malformed ones) of a prediction's box list."""
    if not isinstance(boxes, list):
        return [], 1 if boxes is not None else 0
    good = [normalise_box(b, width, height, clip) for b in boxes]
    return [b for b in good if b is not None], sum(b is None for b in good)


def max_iou(predicted: list, truth: list) -> float:
    """M(o): the best IoU over all (predicted, ground-truth) pairs; 0 when either side is empty."""
    return box_iou(predicted, truth).max().item() if predicted and truth else 0.0


def is_unparsable(qid: str, pred) -> bool:
    """A missing question, one the parser marked with an error, or one whose fields have the wrong types."""
    if not isinstance(pred, dict) or pred.get("error"):
        return True
    if qid in CHOICE_QIDS:
        return not isinstance(pred.get("choices"), list) or not all(isinstance(c, str) for c in pred["choices"])
    return not isinstance(pred.get("text"), str)


def score_q1(q: dict, pred) -> float:
    if is_unparsable("q1", pred):
        return 0.0
    choices, error = parse_choices(pred["choices"], q["options"], single=True)
    return float(error is None and choices == q["answer"])


def score_choice_set(q: dict, pred, width: int, height: int, tau: float = TAU,
                     clip: bool = False) -> tuple[float, int]:
    """q2/q3: (score in [0, 1], malformed boxes). Any option outside the ground truth zeroes the score."""
    if is_unparsable(q["qid"], pred):
        return 0.0, 0
    # normalised as q1 is ("b", "(B)" or the option's text are "B"), the boxes' keys too; a token that is no
    # option counts as an option outside the ground truth
    keys, error = parse_choices(pred["choices"], q["options"], single=False) if pred["choices"] else ([], None)
    chosen = set(keys) if error is None else {None}
    truth = set(q["answer"])
    boxes = pred.get("boxes") if isinstance(pred.get("boxes"), dict) else {}
    boxes = {(option_key(k, q["options"]) or k): v for k, v in boxes.items()}
    malformed = 0
    for option in chosen & truth:
        malformed += _valid_boxes(boxes.get(option, []), width, height, clip)[1]
    if not chosen or chosen - truth:
        return 0.0, malformed
    total = 0.0
    for option in chosen & truth:
        gt_boxes = [ev["box"] for ev in q["evidence"] if ev["option"] == option]
        if not gt_boxes:  # e.g. "None of the above": choosing it suffices
            total += 1.0
            continue
        predicted, _ = _valid_boxes(boxes.get(option, []), width, height, clip)
        total += float(max_iou(predicted, gt_boxes) >= tau)
    return total / len(truth), malformed


def score_free(q: dict, pred, verdict: dict | None, width: int, height: int, tau: float = TAU,
               clip: bool = False) -> tuple[float, int]:
    """q4/q5: (score in [0, 1], malformed boxes) from the judge verdict and the boxes it points at."""
    if is_unparsable(q["qid"], pred) or verdict is None:
        return 0.0, 0
    boxes = pred.get("boxes") if isinstance(pred.get("boxes"), list) else []
    malformed = _valid_boxes(boxes, width, height, clip)[1]
    if verdict["unsupported"]:
        return 0.0, malformed
    truth = q["evidence"]
    if not truth:  # N = 0: a clear statement of absence, and no box at all
        return float(bool(verdict["states_absence"]) and not boxes), malformed
    total = 0
    for ev, factor in zip(truth, verdict["factors"]):
        if not (factor["identified"] and factor["explanation_correct"]):
            continue
        index = factor["box_index"]
        box = normalise_box(boxes[index], width, height, clip) if index is not None and 0 <= index < len(boxes) else None
        total += box is not None and iou(box, ev["box"]) >= tau
    return total / len(truth), malformed


def score_image(record: dict, prediction: dict | None, verdicts: dict, clip_boxes: bool = False) -> dict:
    """{qid: score in [0, 1]} for one image; `verdicts` maps "q4"/"q5" to the judge's verdict (or lacks it)."""
    prediction = prediction or {}
    w, h = record["width"], record["height"]
    scores, malformed = {}, {}
    scores["q1"] = score_q1(question(record, "q1"), prediction.get("q1"))
    for qid in ("q2", "q3"):
        scores[qid], malformed[qid] = score_choice_set(question(record, qid), prediction.get(qid), w, h,
                                                       clip=clip_boxes)
    for qid in FREE_QIDS:
        scores[qid], malformed[qid] = score_free(question(record, qid), prediction.get(qid), verdicts.get(qid), w, h,
                                                 clip=clip_boxes)
    return {"scores": scores, "malformed_boxes": malformed}


def compute_metrics(data: list[dict], predictions: list[dict], judgments: list[dict], clip_boxes: bool = False) -> dict:
    """The metrics file of the spec: q1..q5 and overall as percentages, n_images, and the failure counts."""
    by_image = {p["image_id"]: p for p in predictions}
    verdicts = {}
    for j in judgments:
        if not j.get("error"):
            verdicts.setdefault(j["image_id"], {})[j["qid"]] = j
    sums = dict.fromkeys(QIDS, 0.0)
    unparsable = dict.fromkeys(QIDS, 0)
    malformed = dict.fromkeys(("q2", "q3", "q4", "q5"), 0)
    unjudged = dict.fromkeys(FREE_QIDS, 0)
    missing_predictions = 0
    for record in data:
        prediction = by_image.get(record["image_id"])
        missing_predictions += prediction is None
        image_verdicts = verdicts.get(record["image_id"], {})
        result = score_image(record, prediction, image_verdicts, clip_boxes)
        for qid in QIDS:
            sums[qid] += result["scores"][qid]
            pred = (prediction or {}).get(qid)
            unparsable[qid] += is_unparsable(qid, pred)
            if qid in FREE_QIDS and not is_unparsable(qid, pred) and qid not in image_verdicts:
                unjudged[qid] += 1
        for qid, n in result["malformed_boxes"].items():
            malformed[qid] += n
    n = len(data)
    metrics = {qid: round(100 * sums[qid] / n, 2) if n else 0.0 for qid in QIDS}
    metrics["overall"] = round(sum(100 * sums[qid] / n for qid in QIDS) / len(QIDS), 2) if n else 0.0
    return {**metrics, "n_images": n, "unparsable": unparsable, "malformed_boxes": malformed,
            "unjudged": unjudged, "missing_predictions": missing_predictions, "clip_boxes": clip_boxes}


# ----------------------------------------------------------------------------------------------- judgments file
def prediction_digest(pred) -> str:
    """A short fingerprint of one question's prediction: a verdict is only valid for what it judged."""
    return hashlib.sha256(json.dumps(pred, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


# What the readers of predictions and verdicts take each field to be (cli.errors.check_types, as the file is read):
# a list where an id goes is one line naming the file, line and field, never a TypeError
PREDICTION_TYPES = {"image_id": str}
JUDGMENT_TYPES = {"image_id": str, "qid": str, "unsupported": bool, "states_absence": bool, "factors": list}
# a metrics file (`score --out`), as `report` reads it
METRICS_TYPES = {**dict.fromkeys(("q1", "q2", "q3", "q4", "q5", "overall"), Number), "n_images": Whole,
                 "missing_predictions": Whole, **dict.fromkeys(("unparsable", "malformed_boxes", "unjudged"),
                                                               {"*": Whole})}


def validate_judgments(path, judgments: list[dict], data: list[dict], predictions: list[dict] | None = None) -> None:
    """Check every verdict line against the spec and the data (one factor entry per ground-truth factor), and,
    where the line carries the judged prediction's digest, against the predictions being scored."""
    records = {r["image_id"]: r for r in data}
    by_image = {p["image_id"]: p for p in predictions or []}
    for line, j in with_line_numbers(path, judgments):
        def fail(field, message, _line=line):
            raise InputError(path, _line, field, message)

        if j.get("error"):
            continue  # a failed judge call: the scorer counts it as unjudged
        for field in ("image_id", "qid", "unsupported", "states_absence", "factors"):
            if field not in j:
                fail(field, "missing field")
        if j["qid"] not in FREE_QIDS:
            fail("qid", f"expected q4 or q5, got {j['qid']!r}")
        if j["image_id"] not in records:
            fail("image_id", f"{j['image_id']!r} is not in the data")
        for field in ("unsupported", "states_absence"):
            if not isinstance(j[field], bool):
                fail(field, "expected true or false")
        n = len(question(records[j["image_id"]], j["qid"])["evidence"])
        if not isinstance(j["factors"], list) or len(j["factors"]) != n:
            fail("factors", f"expected a list of {n} entries, one per ground-truth factor")
        for i, factor in enumerate(j["factors"]):
            if not isinstance(factor, dict):
                fail(f"factors[{i}]", "expected an object")
            for field in ("identified", "explanation_correct"):
                if not isinstance(factor.get(field), bool):
                    fail(f"factors[{i}].{field}", "expected true or false")
            index = factor.get("box_index", "missing")
            if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
                fail(f"factors[{i}].box_index", "expected a box index (0, 1, ...) or null")
        judged = by_image.get(j["image_id"], {}).get(j["qid"])
        if predictions is not None and "prediction_digest" in j and j["prediction_digest"] != prediction_digest(judged):
            fail("prediction_digest", "this verdict judged another version of the prediction; run judge again")


def validate_predictions(path, predictions: list[dict], data: list[dict]) -> None:
    """Predictions must name known images, once each; what is inside a question is the model's and never fatal."""
    known = {r["image_id"] for r in data}
    seen = set()
    for line, p in with_line_numbers(path, predictions):
        if "image_id" not in p:
            raise InputError(path, line, "image_id", "missing field")
        if not isinstance(p["image_id"], str):  # the data's ids are strings; a list or object is not even hashable
            raise InputError(path, line, "image_id", f"expected a string, got {json.dumps(p['image_id'])[:80]}")
        if p["image_id"] not in known:
            raise InputError(path, line, "image_id", f"{p['image_id']!r} is not in the data")
        if p["image_id"] in seen:
            raise InputError(path, line, "image_id", f"duplicate prediction for {p['image_id']!r}")
        seen.add(p["image_id"])
