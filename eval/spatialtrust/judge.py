"""The q4/q5 judge: model answer + ground truth -> the structured verdict of the spec, through JudgeClient.

One line per (image, q4|q5) in the judgments file, which is a run file keyed `{image}/{qid}`:
`{"id", "image_id", "qid", "unsupported", "states_absence", "factors": [{"identified", "explanation_correct",
"box_index"}, ...], "judge_model", "judge_response"}`, or with an "error" when the judge failed or its answer
stayed malformed after one corrective turn. Answers are cached by the JudgeClient; a killed run resumes.
Unparsable predictions are not sent: they score 0 whatever a judge says.
"""

from __future__ import annotations

from pathlib import Path

from eval.spatialtrust.data import FREE_QIDS, question
from eval.spatialtrust.parsing import extract_json, lookup
from eval.spatialtrust.prompts import judge_prompt
from eval.spatialtrust.scoring import is_unparsable, prediction_digest
from store.runs import RunFile


def _flag(value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def parse_judge_verdict(text, n_factors: int) -> tuple[dict | None, str | None]:
    """(verdict, None) or (None, what is wrong). Booleans may come as "true"/"false"; a negative or
    non-integer box index becomes null (no box)."""
    obj = extract_json(text, keys=("unsupported", "factors"))
    if obj is None:
        return None, "no JSON object"
    verdict = {}
    for field in ("unsupported", "states_absence"):
        verdict[field] = _flag(lookup(obj, field))
        if verdict[field] is None:
            return None, f"{field} must be true or false"
    factors = lookup(obj, "factors")
    if not isinstance(factors, list) or len(factors) != n_factors:
        return None, f"factors must be a list of exactly {n_factors} entries, one per ground-truth factor"
    verdict["factors"] = []
    for i, factor in enumerate(factors):
        entry = {field: _flag(lookup(factor, field)) for field in ("identified", "explanation_correct")}
        if None in entry.values():
            return None, f"factors[{i}] needs identified and explanation_correct as true or false"
        index = lookup(factor, "box_index")
        if isinstance(index, str) and index.strip().isdigit():
            index = int(index)
        entry["box_index"] = index if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else None
        verdict["factors"].append(entry)
    return verdict, None


def judge_items(data: list[dict], predictions: list[dict]) -> list[dict]:
    """Every readable q4/q5 prediction to judge: {"id", "image_id", "qid", "record", "prediction"}."""
    by_image = {p["image_id"]: p for p in predictions}
    items = []
    for record in data:
        prediction = by_image.get(record["image_id"], {})
        for qid in FREE_QIDS:
            if not is_unparsable(qid, prediction.get(qid)):
                items.append({"id": f"{record['image_id']}/{qid}", "image_id": record["image_id"], "qid": qid,
                              "record": record, "prediction": prediction[qid]})
    return items


def correction(error: str) -> str:
    return f"That answer is not usable: {error}. Reply again with the JSON object only, exactly as specified."


def judge_run(client, data: list[dict], predictions: list[dict], out_path, progress: bool = True,
              new_run: bool = False) -> list[dict]:
    """Judge every pending item into the run file at `out_path`, then rewrite it in data order. The file's
    header names the judge model: a resume with another refuses unless `new_run`."""
    from tqdm.auto import tqdm

    run = RunFile(out_path, header={"step": "spatialtrust judge", "judge_model": client.model}, new_run=new_run)
    items = judge_items(data, predictions)
    # a verdict about an older version of the prediction (predictions regenerated since) is judged again
    pending = {item["id"]: item for item in items if not run.is_done(item["id"])
               or run.get(item["id"]).get("prediction_digest") != prediction_digest(item["prediction"])}
    prompts = {key: judge_prompt(item["record"], item["qid"], item["prediction"]) for key, item in pending.items()}

    def record(item, verdict, text, error):
        line = {"id": item["id"], "image_id": item["image_id"], "qid": item["qid"], **(verdict or {}),
                "judge_model": client.model, "judge_response": text,
                "prediction_digest": prediction_digest(item["prediction"])}
        return {**line, "error": error} if error else line

    retry = {}
    with tqdm(total=len(pending), desc=f"judge {Path(out_path).name}", disable=not progress or not pending) as bar:
        for key, result in client.stream(prompts.items()):
            item = pending[key]
            n = len(question(item["record"], item["qid"])["evidence"])
            if result.get("text") is None:
                run.append(record(item, None, None, result.get("error", "no answer")))
                bar.update()
                continue
            verdict, error = parse_judge_verdict(result["text"], n)
            if verdict is None:  # one corrective turn, below
                retry[key] = [{"role": "user", "content": prompts[key]},
                              {"role": "assistant", "content": result["text"]},
                              {"role": "user", "content": correction(error)}]
                continue
            run.append(record(item, verdict, result["text"], None))
            bar.update()
        for key, result in client.stream(retry.items()) if retry else ():
            item = pending[key]
            n = len(question(item["record"], item["qid"])["evidence"])
            verdict, error = parse_judge_verdict(result.get("text"), n)
            if result.get("text") is None:
                error = result.get("error", "no answer")
            run.append(record(item, verdict, result.get("text"), None if verdict else f"judge answer: {error}"))
            bar.update()
    return run.finalize([item["id"] for item in items])
