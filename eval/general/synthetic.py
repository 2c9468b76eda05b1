"""The synthetic general task (data_prep/synthetic.py's general_test.json): questions about a picture with one
checkable answer, the study's stand-in for MMMU / OCRBench / MME. Accuracy is the exact match of the answer
(lower-cased, surrounding spaces and a final full stop removed), in %: an answer wrapped in a sentence is wrong,
as a wrong option letter is on MMMU."""

from __future__ import annotations

from pathlib import Path

from cli.errors import InputError, read_json
from cli.paths import inside
from data_prep.synthetic import normalize_answer
from store.runs import write_json


def load(path, limit: int | None = None) -> list[dict]:
    data = read_json(path)
    items = data.get("data_list") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise InputError(path, None, "data_list", "missing or empty: expected the general_test.json of "
                         "data_prep/synthetic.py")
    for n, item in enumerate(items):
        for field in ("id", "image_path", "question", "answer"):
            if not isinstance(item, dict) or not isinstance(item.get(field), str):
                raise InputError(path, f"record {n}", field, "missing or not a string")
    return items[:limit] if limit else items


def score(records: list[dict]) -> dict:
    correct = sum(normalize_answer(r.get("response")) == normalize_answer(r["answer"]) for r in records)
    return {"accuracy": 100 * correct / len(records) if records else None, "n": len(records), "correct": correct}


ANSWER_KINDS = ("correct", "refusal", "wrong_colour", "malformed")


def breakdown(records: list[dict]) -> dict:
    """Why answers are wrong: the share (%) of answers that are correct, refusals (the rule judge's refusal phrases),
    another colour word, or anything else (malformed: a sentence, token soup, an empty answer)."""
    from data_prep.synthetic import COLOURS
    from eval.spy.rule_judge import rule_verdict

    counts = dict.fromkeys(ANSWER_KINDS, 0)
    for r in records:
        answer = normalize_answer(r.get("response"))
        if answer == normalize_answer(r["answer"]):
            counts["correct"] += 1
        elif answer and rule_verdict(answer) == "reject":
            counts["refusal"] += 1
        elif answer in COLOURS:
            counts["wrong_colour"] += 1
        else:
            counts["malformed"] += 1
    return {kind: 100 * n / len(records) if records else None for kind, n in counts.items()}


def run(generator, data, images, folder, backend: str, limit: int | None = None, options: dict | None = None) -> dict:
    """Answer every question (resumable run file folder/run.jsonl), score, write folder/score.json."""
    from eval.backends import generate_run
    from eval.spy.prompts import user_turn

    items = load(data, limit)
    requests = [{"id": i["id"], "messages": [user_turn(i["question"])], "images": [str(inside(images, i["image_path"], data, field="image_path"))]}
                for i in items]
    header = {"step": "synthetic general", "model": generator.name, "backend": backend, **(options or {})}
    records = generate_run(generator, requests, Path(folder) / "run.jsonl", meta={i["id"]: i for i in items},
                           progress=False, header=header)
    result = {**score(records), "breakdown": breakdown(records)}
    write_json(Path(folder) / "score.json", result)
    return result

