"""MME (lmms-lab/MME, 2374 yes/no questions, two per image): loading, prompt, and the official score.

Per subtask: acc = % of questions answered right, acc+ = % of images with both questions right, score = acc + acc+
(max 200). Perception sums the 10 perception subtasks (max 2000), cognition the 4 cognition subtasks (max 800);
VLMEvalKit calls cognition "reasoning". A response that is neither yes nor no is wrong.
"""

from __future__ import annotations

import re

from cli.errors import InputError
from eval.general import common

NAME = "mme"
HUB_ID = "lmms-lab/MME"
SPLITS = ("test",)
IMAGE_COLUMNS = ["image"]
REQUIRED = ("question_id", "question", "answer", "category", "image")
PERCEPTION = ("existence", "count", "position", "color", "posters", "celebrity", "scene", "landmark", "artwork", "OCR")
COGNITION = ("commonsense_reasoning", "numerical_calculation", "text_translation", "code_reasoning")
SUBTASKS = PERCEPTION + COGNITION
PROFILES = ("vlmevalkit", "lmms-eval")


def load(source: str | None = None, limit: int | None = None):
    return common.load_test_split(source, HUB_ID, SPLITS, REQUIRED, limit)


def items(ds, source="MME") -> list[dict]:
    out, seen = [], {}
    for index, row in enumerate(ds.select_columns(["question_id", "question", "answer", "category"]).to_list()):
        if row["category"] not in SUBTASKS:
            raise InputError(source, f"row {index}", "category", f"unknown MME subtask {row['category']!r}")
        if row["answer"] not in ("Yes", "No"):
            raise InputError(source, f"row {index}", "answer", f"expected Yes or No, got {row['answer']!r}")
        # Both questions of an image share its question_id; the k-th question of an image gets "#k".
        image_key = (row["category"], row["question_id"])
        k = seen[image_key] = seen.get(image_key, -1) + 1
        qid = row["question_id"]
        prefix = "" if qid.startswith(row["category"] + "/") else row["category"] + "/"
        out.append({
            "id": f"{prefix}{qid}#{k}", "question_id": qid, "category": row["category"], "answer": row["answer"],
            "prompt": row["question"],
        })
    return out


def request(item: dict, row: dict) -> dict:
    # VLMEvalKit gives MME its own prompt: the image, then the question verbatim ("... Please answer yes or no.").
    content = [{"type": "image"}, {"type": "text", "text": item["prompt"]}]
    return {"id": item["id"], "messages": [{"role": "user", "content": content}], "images": [common.rgb(row["image"])]}


# VLMEvalKit's punctuation handling before it looks for the words yes / no.
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
DIGIT_COMMA_DIGIT = re.compile(r"(\d)(,)(\d)")
PERIOD_NOT_IN_NUMBER = re.compile(r"\.(?!\d)")


def _words(text: str) -> list[str]:
    out = text
    for p in PUNCTUATION:
        # A mark next to a space (or any text with "1,000"-like numbers) is dropped; otherwise it separates words.
        glued = p + " " in text or " " + p in text or DIGIT_COMMA_DIGIT.search(text) is not None
        out = out.replace(p, "" if glued else " ")
    return PERIOD_NOT_IN_NUMBER.sub("", out).split()


def extract_vlmevalkit(response: str) -> str:
    words = _words(response.lower())
    if "yes" in words and "no" not in words:
        return "Yes"
    if "no" in words and "yes" not in words:
        return "No"
    return "Unknown"


def extract_lmms_eval(response: str) -> str:
    text = response.lower().strip().replace(".", "")
    if text in ("yes", "no"):
        return text.capitalize()
    if len(text) == 1:
        return {"y": "Yes", "n": "No"}.get(text, "Unknown")
    head = text[:4]
    return "Yes" if "yes" in head else "No" if "no" in head else "Unknown"


RUN_FIELDS = ("question_id", "category", "answer")


def check(record: dict):
    if record["category"] not in SUBTASKS:
        return "category", f"unknown MME subtask {record['category']!r}"
    return None


def score(records: list[dict], profile: str = "vlmevalkit") -> dict:
    """acc, acc+ and score per subtask; perception, cognition and `score` = their sum (max 2800)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown MME profile {profile!r}; choose from {PROFILES}")
    extract = extract_vlmevalkit if profile == "vlmevalkit" else extract_lmms_eval
    judged = []
    for r in records:
        extracted = extract(r.get("response") or "")
        judged.append({"id": r["id"], "category": r["category"], "question_id": r["question_id"],
                       "extracted": extracted, "hit": extracted == r["answer"]})
    subtasks, odd_images = {}, []
    for category in dict.fromkeys(j["category"] for j in judged):  # order of first appearance, as VLMEvalKit
        rows = [j for j in judged if j["category"] == category]
        images: dict[str, list[bool]] = {}
        for j in rows:
            images.setdefault(j["question_id"], []).append(j["hit"])
        odd_images += [f"{category}/{q}" for q, hits in images.items() if len(hits) != 2]
        acc = 100 * sum(j["hit"] for j in rows) / len(rows)
        acc_plus = 100 * sum(all(hits) for hits in images.values()) / len(images)
        subtasks[category] = {"n_questions": len(rows), "n_images": len(images), "acc": acc, "acc_plus": acc_plus,
                              "score": acc + acc_plus}
    perception = sum(v["score"] for c, v in subtasks.items() if c in PERCEPTION)
    cognition = sum(v["score"] for c, v in subtasks.items() if c in COGNITION)
    return {
        "benchmark": NAME, "profile": profile, "n": len(records), "n_failed": common.count_failed(records),
        "n_unknown": sum(j["extracted"] == "Unknown" for j in judged),
        "score": perception + cognition, "perception": perception, "cognition": cognition, "subtasks": subtasks,
        "missing_subtasks": [c for c in SUBTASKS if c not in subtasks],
        "images_without_two_questions": odd_images, "items": judged,
    }
