"""Run files -> the viewer's rows: one row per sample, the same item under one key in every run.

A row holds what the item is (benchmark, setting, category, scenario kind, instruction variant, image, the
texts a reader needs) and, per run, its outcome: the answer, the verdict, a score in [0, 1] (SPY-Bench and
GeoPrivacy: 1 right, 0 wrong; SpatialTrust: the image's mean question score), and whether the sample failed
or is unjudged. The key is `<benchmark>/<setting>/<id>`, so the same items line up across runs.

Accepted runs: a suite folder (`python -m eval suite --out`; its results.json says where its inputs are), a
judged SPY-Bench run file (`spy judge`), a GeoPrivacy run file (`geo generate` for mcq, `geo judge` for free-form),
or SpatialTrust predictions (`spatialtrust generate --out`, with `spatialtrust_data`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from data_prep.categories import as_categories
from data_prep.errors import InputError, read_json
from data_prep.runs import read_jsonl
from data_prep.spy import expected_verdict

logger = logging.getLogger(__name__)

VERDICTS = ("respond", "reject")
GEO_GRANULARITY = {"A": "abstain", "B": "country / city", "C": "exact location"}


def inside(folder, relative: str, source, where, field: str) -> Path:
    """`folder / relative`, refused when it leads out of `folder` (a data file cannot make us read elsewhere)."""
    folder = Path(folder).resolve()
    path = (folder / relative).resolve()
    if not path.is_relative_to(folder):
        raise InputError(source, where, field, f"{relative!r} leads outside {folder}")
    return path


def _existing_image(path: Path, source, where, field: str) -> Path:
    if not path.is_file():
        raise InputError(source, where, field, f"image not found: {path}")
    return path


# ----------------------------------------------------------------------------------------------- SPY-Bench
def _instruction_lines(record: dict, texts: dict) -> tuple[list[dict], str]:
    """The instruction block as lines, each with the category it names and whether it marks it private, and
    the rest of the prompt (the question, in its scenario's words when there is one)."""
    prompt = record.get("input_question") or ""
    block, _, body = prompt.partition("\n\n")
    lines = block.split("\n") if block else []
    other = record.get("other_labels") or {record["label"]: record.get("is_privacy")}
    labels = list(other.items())
    if len(labels) != len(lines):  # not our composition (a released file): show the lines unlabelled
        return [{"text": line} for line in lines], body
    return [{"text": line, "label": label, "private": bool(int(flag)), "target": label == record["label"]}
            for line, (label, flag) in zip(lines, labels)], body


def spy_rows(path, section: str | None = None, images=None, categories=None, resp_key: str = "response") -> dict:
    """key -> (item, outcome) for a judged SPY-Bench run file; `section` defaults to the distractor setting."""
    from eval.spy.cli import failed_generation
    from eval.spy.prompts import eval_key

    cats = as_categories(categories)
    texts, absolute, scenario_names = cats.label2text(), cats.absolute_labels(), cats.scenarios_json()
    key_name = eval_key(resp_key)
    rows, found = {}, {}  # image_path -> the checked image (items share images: one check each)
    for n, r in enumerate(read_jsonl(path, required=("id", "label", "is_privacy")), 1):
        scenario = r.get("scenario")
        scenario_is_privacy = scenario.get("is_privacy") if isinstance(scenario, dict) else None
        kind = "none" if scenario is None else "conflict" if scenario_is_privacy == 0 else "privacy"
        setting = section or ("with_distractors" if r.get("other_labels") else "without_distractors")
        lines, body = _instruction_lines(r, texts)
        image = found.get(r.get("image_path"))
        if image is None and images is not None and r.get("image_path"):
            image = found[r["image_path"]] = _existing_image(inside(images, r["image_path"], path, n, "image_path"),
                                                             path, n, "image_path")
        expected = expected_verdict(r["label"], int(r["is_privacy"]), scenario_is_privacy, cats)
        item = {"bench": "spy", "section": setting, "id": str(r["id"]), "image": image, "category": r["label"],
                "scenario": kind, "variant": "private" if r["is_privacy"] else "not private", "expected": expected,
                "pair": str(r.get("benchmark_id")), "absolute": r["label"] in absolute,
                "detail": {"instructions": lines, "prompt": body if scenario is not None else None,
                           "scenario_id": scenario.get("id") if scenario else None,
                           "scenario_name": (scenario_names.get((scenario or {}).get("id")) or {}).get("name"),
                           "question": r.get("question"), "reference": r.get("ref_answer")}}
        verdict = r.get(key_name)
        if failed_generation(r, resp_key):
            state = "failed"
        elif verdict not in VERDICTS:
            state = "unjudged"
        else:
            state = "ok"
        outcome = {"answer": r.get(resp_key), "verdict": verdict if isinstance(verdict, str) else None,
                   "score": (1.0 if verdict == expected else 0.0) if state == "ok" else None, "state": state,
                   "extra": {"judge_output": r.get("judge_output")} if r.get("judge_output") else {}}
        rows[f"spy/{setting}/{r['id']}"] = (item, outcome)
    return rows


# ----------------------------------------------------------------------------------------------- GeoPrivacy
def geo_rows(path, setting: str | None = None, images=None, labels=None, metadata=None) -> dict:
    """key -> (item, outcome) for a GeoPrivacy run file: MCQ answers Q1..Q7 (or the free-form answer and its
    judged granularity) against the gold labels; the score is whether Q7 (the granularity) is right."""
    from eval.geoprivacy import cli as geo
    from eval.geoprivacy import data
    from eval.geoprivacy.metrics import granularity

    path = Path(path)
    raw = data.read_records(path)  # our JSON Lines run files, or the authors' released JSON lists
    if not isinstance(raw, list) or not all(isinstance(r, dict) and "id" in r for r in raw):
        raise InputError(path, None, "id", "expected records with an id (a GeoPrivacy run or prediction file)")
    setting = setting or geo.infer_setting(path, raw)
    gold = data.load_labels(labels or data.DEFAULT_LABELS)
    meta = data.load_metadata(metadata or data.DEFAULT_METADATA) if images is not None else {}
    parsed = {row["id"]: row for row in data.load_predictions(path, setting)}
    questions = [f"Q{i}" for i in range(1, 8)]
    rows = {}
    for n, r in enumerate(raw, 1):
        rid = data.label_id(r["id"])
        truth = gold.get(rid)
        if truth is None:
            raise InputError(path, n, "id", f"{rid!r} is not in the gold labels")
        image = data.find_image(images, rid, meta.get(rid)) if images is not None else None
        row = parsed.get(rid, {})
        item = {"bench": "geo", "section": setting, "id": rid, "image": image, "category": truth["Q7"],
                "scenario": None, "variant": None, "expected": truth["Q7"],
                "detail": {"gold": {q: truth.get(q) for q in questions}}}
        predicted = granularity(row.get("Q7-label" if setting == "free-form" else "Q7"))
        state = "failed" if r.get("error") else "unjudged" if predicted is None else "ok"
        answers = {q: row.get(q) for q in questions} if setting == "mcq" else {"Q7": row.get("Q7-label")}
        outcome = {"answer": r.get("response", r.get("Q7-gen")), "verdict": predicted, "state": state,
                   "score": (1.0 if predicted == truth["Q7"] else 0.0) if state == "ok" else None,
                   "extra": {"answers": answers}}
        rows[f"geo/{setting}/{rid}"] = (item, outcome)
    return rows


# ----------------------------------------------------------------------------------------------- SpatialTrust
def spatialtrust_rows(predictions_path, data_path, mode: str = "predictions", image_root=None,
                      judgments_path=None) -> dict:
    """key -> (item, outcome) per image: gold answers and boxes, the predicted ones, the five question scores."""
    from eval.spatialtrust import data
    from eval.spatialtrust.scoring import score_image, validate_predictions

    records = data.load(data_path, image_root=image_root)
    predictions = read_jsonl(predictions_path, required=("image_id",))
    validate_predictions(predictions_path, predictions, records)
    by_image = {p["image_id"]: p for p in predictions}
    verdicts = {}
    if judgments_path is not None and Path(judgments_path).is_file():
        for j in read_jsonl(judgments_path):
            if not j.get("error"):
                verdicts.setdefault(j.get("image_id"), {})[j.get("qid")] = j
    root = Path(image_root) if image_root else Path(data_path).parent
    rows = {}
    for line, record in data.with_line_numbers(data_path, records):
        image = _existing_image(inside(root, record["image"], data_path, line, "image"), data_path, line, "image")
        q1 = data.question(record, "q1")
        item = {"bench": "st", "section": mode, "id": str(record["image_id"]), "image": image,
                "category": "/".join(q1["answer"]), "scenario": None, "variant": None, "expected": None,
                "size": [record["width"], record["height"]],
                "detail": {"questions": [{k: q.get(k) for k in ("qid", "text", "options", "answer", "evidence")}
                                         for q in record["questions"]]}}
        prediction = by_image.get(record["image_id"])
        scores = score_image(record, prediction, verdicts.get(record["image_id"], {}))["scores"]
        chosen = ((prediction or {}).get("q1") or {}).get("choices") or []
        outcome = {"answer": None, "verdict": "/".join(chosen) if chosen else None,
                   "state": "failed" if prediction is None else "ok", "score": sum(scores.values()) / len(scores),
                   "extra": {"prediction": {q: (prediction or {}).get(q) for q in data.QIDS}, "scores": scores}}
        rows[f"st/{mode}/{record['image_id']}"] = (item, outcome)
    return rows


# ----------------------------------------------------------------------------------------------- runs
def _resolve(folder: Path, value):
    return None if value is None else (folder / value).resolve()


def suite_rows(folder, images=None, spatialtrust_data=None) -> dict:
    """Every section a suite folder holds; where its inputs are comes from results.json's `inputs` (the suite
    writes them), or from `images` / `spatialtrust_data` for folders written before it did."""
    folder = Path(folder)
    results = read_json(folder / "results.json")
    if not isinstance(results, dict) or not isinstance(results.get("sections"), dict):
        raise InputError(folder / "results.json", None, "sections", "missing (expected `python -m eval suite` output)")
    inputs = results.get("inputs") or {}
    rows = {}
    spy = inputs.get("spy") or {}
    spy_images = _resolve(folder, spy.get("images")) or images
    for setting in results["sections"].get("spy", {}):
        base = setting.removesuffix("_self_moderation")
        run = folder / "spy" / base / ("self_moderation_judged.jsonl" if base != setting else "judged.jsonl")
        rows.update(spy_rows(run, setting, spy_images, _resolve(folder, spy.get("categories")),
                             resp_key="resp_3" if base != setting else "response"))
    geo = inputs.get("geo") or {}
    for setting in results["sections"].get("geo", {}):
        run = folder / "geo" / setting / ("judged.jsonl" if setting == "free-form" else "run.jsonl")
        rows.update(geo_rows(run, setting, _resolve(folder, geo.get("images")) or images,
                             _resolve(folder, geo.get("labels")), _resolve(folder, geo.get("metadata"))))
    spatial = inputs.get("spatialtrust") or {}
    data_path = _resolve(folder, spatial.get("data")) or spatialtrust_data
    for mode in results["sections"].get("spatialtrust", {}):
        if data_path is None:
            logger.warning(f"{folder}: SpatialTrust {mode} left out: its results.json does not say where the data "
                           "is; pass --spatialtrust-data")
            continue
        sub = folder / "spatialtrust" / mode
        rows.update(spatialtrust_rows(sub / "predictions.jsonl", data_path, mode,
                                      _resolve(folder, spatial.get("image_root")), sub / "judgments.jsonl"))
    return rows


def load_run(source, images=None, spatialtrust_data=None, geo_labels=None) -> dict:
    """key -> (item, outcome) of one run: a suite folder or one run file, told apart by content."""
    source = Path(source)
    if source.is_dir():
        if not (source / "results.json").is_file():
            raise InputError(source, None, None, "a folder without results.json (not a `python -m eval suite` --out)")
        return suite_rows(source, images, spatialtrust_data)
    if source.name == "results.json":
        return suite_rows(source.parent, images, spatialtrust_data)
    from eval.geoprivacy.data import read_records

    records = read_records(source)
    if not isinstance(records, list) or not records or not isinstance(records[0], dict):
        raise InputError(source, None, None, "no records (expected a run file: JSON Lines, or a JSON list)")
    first = records[0]
    if "label" in first and "is_privacy" in first:
        resp_key = "resp_3" if "eval_3" in first else "response"
        return spy_rows(source, None, images, resp_key=resp_key)
    if "image_id" in first and "q1" in first:
        if spatialtrust_data is None:
            raise InputError(source, None, None, "SpatialTrust predictions: pass --spatialtrust-data (the data file)")
        return spatialtrust_rows(source, spatialtrust_data, source.stem)
    if any(k in first for k in ("Q7", "Q7-label", "setting")):
        return geo_rows(source, images=images, labels=geo_labels)
    raise InputError(source, 1, None, "not a judged SPY-Bench, GeoPrivacy or SpatialTrust run file "
                     "(expected label/is_privacy, Q7 or image_id/q1 fields)")


def suite_inputs(config: dict, out) -> dict:
    """What the viewer needs to find a suite's inputs again, as paths relative to the suite folder."""
    import os

    out = Path(out).resolve()

    def rel(value):
        return None if value is None else os.path.relpath(Path(value).resolve(), out)

    sections = config["sections"]
    keep = {"spy": ("images", "categories"), "geo": ("images", "labels", "metadata"),
            "spatialtrust": ("data", "image_root")}
    return {name: {k: rel(sections[name].get(k)) for k in keys} for name, keys in keep.items() if name in sections}


def merge_runs(runs: list[dict]) -> list[dict]:
    """One row per key (in the first run's order, then keys only later runs have), `runs[i]` -> outcome i."""
    keys = list(dict.fromkeys(k for run in runs for k in run))
    rows = []
    for key in keys:
        item = next(run[key][0] for run in runs if key in run)
        rows.append({"key": key, **item, "runs": [run[key][1] if key in run else None for run in runs]})
    return rows


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
