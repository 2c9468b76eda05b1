"""Prompts: the one-pass baseline, the three SpatialTrustGuard stages, and the q4/q5 judge.

Every model request is `{"id", "messages", "images": [image path]}` with the image part before the text
(eval/backends.py). Box coordinates are asked in absolute pixels of the original image (the format of the
data), or on Qwen's 0-1000 grid with `box_scale="1000"` for models trained to answer that way.
"""

from __future__ import annotations

import json

from eval.spatialtrust.data import CATEGORY, exclusive_option, question

SYSTEM = (
    "You audit a laptop-camera capture taken during login verification. The person in front of the camera is the "
    "user (the primary subject). Look only for visible background or non-primary-subject factors that could leak "
    "information from the computer being logged into. A direct factor is already an immediate disclosure path (a "
    "second person looking at the camera or screen, a phone or camera aimed at the scene, a surveillance camera "
    "facing the user). An indirect factor is a condition that makes disclosure possible (an open doorway, a window "
    "or layout that exposes the screen, a nearby person not currently looking). Rely on visible evidence only: do "
    "not infer identity, intent, occupation or unseen activity."
)


def box_rule(record: dict, box_scale: str) -> str:
    if box_scale == "1000":
        return ("Boxes are [x1, y1, x2, y2] on a 0-1000 grid over the image: (0, 0) is the top-left corner and "
                "(1000, 1000) the bottom-right.")
    return (f"The image is {record['width']}x{record['height']} pixels. Boxes are [x1, y1, x2, y2] in absolute pixels "
            "of this image: x to the right, y down, (0, 0) the top-left corner.")


def format_question(q: dict) -> str:
    lines = [f"{q['qid']}: {q['text']}"]
    if "options" in q:
        if q["qid"] != "q1":
            none = exclusive_option(q["options"])
            lines.append("(choose every option that applies" + (f"; {none} only on its own)" if none else ")"))
        lines += [f"  {key}. {text}" for key, text in q["options"].items()]
    return "\n".join(lines)


def request(request_id: str, record: dict, text: str, history: list[tuple[str, str]] = ()) -> dict:
    """A request with the image and `text` in the first user turn; `history` adds (assistant, user) turns."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    for answer, follow_up in history:
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
    return {"id": request_id, "messages": messages, "images": [record["image_path"]]}


# ----------------------------------------------------------------------------------------------- one pass
ONE_PASS_FORMAT = """{"q1": "<option letter>",
 "q2": {"choices": ["<letter>", ...], "boxes": {"<letter>": [[x1, y1, x2, y2]], ...}},
 "q3": {"choices": ["<letter>", ...], "boxes": {"<letter>": [[x1, y1, x2, y2]], ...}},
 "q4": {"text": "<each direct factor and why it is sensitive>", "boxes": [[x1, y1, x2, y2], ...]},
 "q5": {"text": "<each indirect factor and why it is sensitive>", "boxes": [[x1, y1, x2, y2], ...]}}"""


def one_pass_text(record: dict, box_scale: str = "pixels") -> str:
    questions = "\n\n".join(format_question(q) for q in record["questions"])
    return (f"Answer the five questions about this image.\n\n{questions}\n\n{box_rule(record, box_scale)}\n"
            "Give a box for each chosen q2/q3 option except \"None of the above\", which takes no box. In q4 and q5 "
            "describe the factors one after the other and list their boxes in the same order; if there is no such "
            "factor, say so plainly and give no box.\n\n"
            f"Reply with one JSON object and nothing else:\n{ONE_PASS_FORMAT}")


def one_pass_request(record: dict, box_scale: str = "pixels") -> dict:
    return request(f"{record['image_id']}/one-pass", record, one_pass_text(record, box_scale))


# ----------------------------------------------------------------------------------------------- stage 1
def selection_text(record: dict) -> str:
    questions = "\n\n".join(format_question(question(record, qid)) for qid in ("q1", "q2", "q3"))
    return ("Answer these three questions about this image with option letters only.\n\n"
            f"{questions}\n\nReply with one JSON object and nothing else:\n"
            '{"q1": "<letter>", "q2": ["<letter>", ...], "q3": ["<letter>", ...]}')


def selection_request(record: dict) -> dict:
    return request(f"{record['image_id']}/select", record, selection_text(record))


# ----------------------------------------------------------------------------------------------- stage 2
def verification_text(record: dict, qid: str, option: str) -> str:
    q = question(record, qid)
    return (f"Consider this statement about a {CATEGORY[qid]} sensitive factor in the image:\n"
            f"\"{q['options'][option]}\"\n\n"
            "Is everything the statement describes clearly visible in the image, outside the user in front of the "
            "camera, without guessing about identity, intent or anything not shown? Answer yes only if every part "
            "of it is plainly visible; otherwise answer no.\n\nReply with one word: yes or no.")


def verification_request(record: dict, qid: str, option: str) -> dict:
    return request(f"{record['image_id']}/verify/{qid}/{option}", record, verification_text(record, qid, option))


# ----------------------------------------------------------------------------------------------- stage 3
FINAL_FORMAT = """{"q2": {"choices": [<the fixed q2 letters>], "boxes": {"<letter>": [[x1, y1, x2, y2]], ...}},
 "q3": {"choices": [<the fixed q3 letters>], "boxes": {"<letter>": [[x1, y1, x2, y2]], ...}},
 "q4": [{"option": "<a fixed q2 letter>", "description": "<what is visible and why it is sensitive>",
         "box": [x1, y1, x2, y2]}, ...],
 "q5": [{"option": "<a fixed q3 letter>", "description": "...", "box": [x1, y1, x2, y2]}, ...]}"""


def _fixed(q: dict, choices: list[str]) -> str:
    return ", ".join(f"{k} ({q['options'][k]})" for k in choices) or "no visually supported factor"


def final_text(record: dict, committed: dict, box_scale: str = "pixels") -> str:
    """The full item with the verified q1-q3 answers as fixed commitments; `committed` maps qid -> choices
    for the questions the final stage answers (q2 and/or q3; q1 is shown as context)."""
    intro = ("Here are the questions about this image and the answers already fixed for the choice questions. "
             "Do not change the fixed answers.\n")
    lines = [intro]
    for qid in ("q1", "q2", "q3"):
        if qid in committed:
            q = question(record, qid)
            lines.append(f"{format_question(q)}\nFixed answer: {_fixed(q, committed[qid])}\n")
    for qid, source in (("q4", "q2"), ("q5", "q3")):
        if source in committed:
            lines.append(f"{qid}: {question(record, qid)['text']}\n")
    lines.append(
        f"{box_rule(record, box_scale)}\n"
        "Now ground and explain the fixed answers:\n"
        "- repeat the fixed q2 and q3 letters as choices, and give a box for each of them except \"None of the "
        "above\", which takes no box;\n"
        "- in q4, one entry per fixed q2 factor: its letter, what is visible and why it is sensitive, and its box; "
        "in q5 the same for the fixed q3 factors;\n"
        "- describe no factor that is not among the fixed answers; a question whose fixed answer has no factor gets "
        "an empty list.\n\n"
        f"Reply with one JSON object and nothing else:\n{FINAL_FORMAT}")
    return "\n".join(lines)


def final_request(record: dict, committed: dict, attempt: int, history: list[tuple[str, str]],
                  box_scale: str = "pixels") -> dict:
    return request(f"{record['image_id']}/final/{attempt}", record, final_text(record, committed, box_scale), history)


def retry_text(violations: list[str]) -> str:
    return ("Your answer breaks the rules:\n" + "\n".join(f"- {v}" for v in violations)
            + "\nAnswer again with the corrected JSON object only, keeping the fixed answers unchanged.")


# ----------------------------------------------------------------------------------------------- judge
JUDGE_TEMPLATE = """You grade a model's answer to a question about {category} sensitive factors in a login-verification \
camera capture. Factors must rest on visible evidence only.

Question: {question}

Ground-truth answer: {truth}
Ground-truth factors (numbered from 0):
{factors}

Model answer: {answer}
Model boxes (numbered from 0, in the order the answer describes its factors):
{boxes}

Return one JSON object and nothing else:
{{"unsupported": <true if the answer claims any {category} factor that is not among the ground-truth factors>,
  "states_absence": <true if the answer clearly says that no {category} sensitive factor is present>,
  "factors": [one entry per ground-truth factor, in the order above:
    {{"identified": <true if the answer mentions this factor>,
      "explanation_correct": <true if its explanation of why this factor is sensitive is correct>,
      "box_index": <the number of the model box the answer gives for this factor, or null>}}]}}
There are exactly {n} ground-truth factors, so "factors" has exactly {n} entries."""


def judge_prompt(record: dict, qid: str, prediction: dict) -> str:
    q = question(record, qid)
    factors = "\n".join(f"{i}. {ev['factor']}" for i, ev in enumerate(q["evidence"])) or "(none)"
    boxes = prediction.get("boxes") or []
    box_lines = "\n".join(f"{i}. {json.dumps(b)}" for i, b in enumerate(boxes)) or "(none)"
    return JUDGE_TEMPLATE.format(category=CATEGORY[qid], question=q["text"], truth=q["answer"], factors=factors,
                                 answer=prediction.get("text") or "(empty)", boxes=box_lines, n=len(q["evidence"]))
