"""A scripted SpatialTrust model and judge for tests/chat_server.py: they know each image's ground truth.

The model recognises the image of a request by its data URL, the stage by the prompt's wording, and answers
what a perfect model would; tests wrap it to inject specific behaviour (a stubborn new factor, a "no").
"""

from __future__ import annotations

import json

from chat_server import image_urls, last_user_text

from eval.spatialtrust.data import question
from vlm.chat_client import image_data_url


def stage_of(request: dict) -> str:
    first_user = next(m for m in request["messages"] if m["role"] == "user")
    text = "\n".join(p.get("text", "") for p in first_user["content"] if isinstance(p, dict))
    if "option letters only" in text:
        return "select"
    if "yes or no" in text:
        return "verify"
    if "Fixed answer" in text:
        return "final"
    if "Answer the five questions" in text:
        return "one-pass"
    if "You grade a model's answer" in text:
        return "judge"
    raise AssertionError(f"unknown prompt: {text[:200]}")


def option_in_verification(request: dict) -> str:
    """The option text quoted in a verification prompt."""
    return last_user_text(request).split('"')[1]


def final_answer(record: dict, committed: dict[str, list[str]] | None = None) -> dict:
    """The perfect stage-3 answer: the ground-truth boxes of the committed options, one description each."""
    out = {}
    for set_qid, free_qid in (("q2", "q4"), ("q3", "q5")):
        q = question(record, set_qid)
        choices = committed[set_qid] if committed else q["answer"]
        boxes = {ev["option"]: [ev["box"]] for ev in q["evidence"] if ev["option"] in choices}
        out[set_qid] = {"choices": choices, "boxes": boxes}
        out[free_qid] = [{"option": o, "description": f"{q['options'][o]}: it can expose the screen.", "box": b[0]}
                         for o, b in boxes.items()]
    return out


def committed_from_prompt(record: dict, request: dict) -> dict[str, list[str]]:
    """The fixed answers a final-stage prompt states, read back from its text."""
    first_user = next(m for m in request["messages"] if m["role"] == "user")
    text = "\n".join(p.get("text", "") for p in first_user["content"] if isinstance(p, dict))
    committed = {}
    for block in text.split("\n\n"):
        for qid in ("q2", "q3"):
            if block.startswith(f"{qid}:") and "Fixed answer:" in block:
                fixed = block.split("Fixed answer:")[1].strip()
                options = question(record, qid)["options"]
                committed[qid] = [k for k, v in options.items() if f"{k} ({v})" in fixed] or [
                    k for k, v in options.items() if v == "None of the above"]
    return committed


class Oracle:
    """reply(request) for ChatServer: the right answer for every stage; `override(stage, record, request)`
    may return another reply (or None to keep the right one)."""

    def __init__(self, records: list[dict], override=None):
        self.by_url = {image_data_url(r["image_path"]): r for r in records}
        self.override = override
        self.calls: list[tuple[str, str]] = []  # (stage, image_id)

    def __call__(self, request: dict) -> str:
        stage = stage_of(request)
        record = self.by_url[image_urls(request)[0]]
        self.calls.append((stage, record["image_id"]))
        if self.override:
            reply = self.override(stage, record, request)
            if reply is not None:
                return reply
        if stage == "select":
            return json.dumps({qid: question(record, qid)["answer"] for qid in ("q1", "q2", "q3")})
        if stage == "verify":
            wanted = option_in_verification(request)
            present = [question(record, qid)["options"][o] for qid in ("q2", "q3") for o in question(record, qid)["answer"]]
            return "Yes." if wanted in present else "No, it is not visible."
        if stage == "final":
            return "```json\n" + json.dumps(final_answer(record, committed_from_prompt(record, request))) + "\n```"
        if stage == "one-pass":
            answer = {"q1": question(record, "q1")["answer"][0]}
            final = final_answer(record)
            for set_qid, free_qid in (("q2", "q4"), ("q3", "q5")):
                answer[set_qid] = final[set_qid]
                answer[free_qid] = {"text": " ".join(f["description"] for f in final[free_qid]) or "None visible.",
                                    "boxes": [f["box"] for f in final[free_qid]]}
            return json.dumps(answer)
        raise AssertionError(stage)


def judge_oracle(request: dict) -> str:
    """A judge that reads the prompt's ground-truth factors and the model's boxes and answers by exact box match."""
    text = last_user_text(request)
    truth = text.split("Ground-truth factors (numbered from 0):\n")[1].split("\n\nModel answer:")[0]
    boxes_block = text.split("in the order the answer describes its factors):\n")[1].split("\n\nReturn one JSON")[0]
    answer = text.split("Model answer: ")[1].split("\nModel boxes")[0]
    n = 0 if truth == "(none)" else len(truth.splitlines())
    factors = [{"identified": True, "explanation_correct": True, "box_index": i} for i in range(n)]
    n_boxes = 0 if boxes_block == "(none)" else len(boxes_block.splitlines())
    return json.dumps({"unsupported": n_boxes > n, "states_absence": n == 0 and answer.startswith(("No ", "None")),
                       "factors": [f if f["box_index"] < n_boxes else {**f, "identified": False} for f in factors]})
