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
import re
from pathlib import Path

from cli.errors import InputError, read_json
from cli.numbers import finite
from cli.paths import contained, inside
from data_prep.categories import as_categories
from data_prep.spy import expected_verdict
from store.runs import read_jsonl, read_run

logger = logging.getLogger(__name__)

VERDICTS = ("respond", "reject")
GEO_GRANULARITY = {"A": "abstain", "B": "country / city", "C": "exact location"}


def recorded_root(folder, value, source, field: str, flag: str | None = None) -> Path | None:
    """A root that a run records for itself (results.json's `inputs`, a run header's `images`), relative to the
    run's folder. It gets the rule of every path a data file names (cli.paths.inside), symbolic links resolved
    first: really inside that folder, or it is not used (a crafted results.json, or a link in the folder, must not
    make us copy files from elsewhere into a site); the warning says which option names the folder instead."""
    if value is None:
        return None
    try:
        return inside(folder, value, source, None, field, resolve=True)
    except InputError as err:
        logger.warning(f"{err}: not used" + (f"; pass {flag} to name it" if flag else ""))
        return None


class MissingImages:
    """Counts the samples shown without their image, said once per run file with the reason (eval view warns
    rather than showing "no image" on every card in silence). Every image the site shows passes here: one whose
    real path (symbolic links followed) leaves the images folder is refused (cli.paths.contained)."""

    def __init__(self, source, images):
        self.source, self.images, self.samples, self.missing, self.first = source, images, 0, 0, None
        self.exists: dict[Path, bool] = {}  # samples share images: one look each

    def find(self, path: Path | None, name, where=None, field: str = "image") -> Path | None:
        self.samples += 1
        if path is not None and path not in self.exists:
            if self.images is not None:
                contained(self.images, path, self.source, where, field, name)
            self.exists[path] = path.is_file()
        if path is not None and self.exists[path]:
            return path
        self.missing += 1
        self.first = self.first or name
        return None

    def warn(self, flag: str = "--images") -> None:
        if not self.missing:
            return
        why = f"no images folder is known (pass {flag} DIR)" if self.images is None else \
            f"not found in {self.images} (e.g. {self.first})"
        logger.warning(f"{self.source}: {self.missing} of {self.samples} samples are shown without their "
                       f"image: {why}")


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
    return [{"text": line, "label": label, "private": flag in (1, True, "1"), "target": label == record["label"]}
            for line, (label, flag) in zip(lines, labels)], body


def _check_spy_record(path, line: int, r: dict, resp_key: str) -> None:
    """The fields the page shows, each of its type (the page escapes text anyway: this keeps a crafted file from
    breaking the build or the counts)."""
    def fail(field, message):
        raise InputError(path, line, field, message)

    if not isinstance(r["label"], str):
        fail("label", "expected a string")
    if r["is_privacy"] not in (0, 1) or isinstance(r["is_privacy"], float):
        fail("is_privacy", f"expected 0 or 1, got {r['is_privacy']!r}")
    if not isinstance(r["id"], (str, int)) or isinstance(r["id"], bool):
        fail("id", "expected a string or an integer")
    for field in ("input_question", "question", "ref_answer", resp_key, "judge_output", "image_path", "error"):
        if r.get(field) is not None and not isinstance(r[field], str):
            fail(field, "expected a string or null")
    if r.get("other_labels") is not None and not (isinstance(r["other_labels"], dict) and all(
            isinstance(k, str) and v in (0, 1) for k, v in r["other_labels"].items())):
        fail("other_labels", "expected an object of category -> 0 or 1")
    scenario = r.get("scenario")
    if scenario is not None and not (isinstance(scenario, dict) and scenario.get("is_privacy") in (0, 1)
                                     and isinstance(scenario.get("id", ""), (str, int))):
        fail("scenario", "expected null or an object with is_privacy 0 or 1 and an id")
    if not isinstance(r.get("benchmark_id", ""), (str, int)) or isinstance(r.get("benchmark_id"), bool):
        fail("benchmark_id", "expected a string or an integer")


def spy_rows(path, section: str | None = None, images=None, categories=None, resp_key: str = "response",
             header_images: bool = True) -> dict:
    """key -> (item, outcome) for a judged SPY-Bench run file; `section` defaults to the distractor setting.

    Without `images`, the folder the run's header records (`spy generate` writes it; `spy judge` carries it) when
    it lies inside the run file's folder. An id given twice is two samples, `<key>` and `<key>#2`, counted as
    `spy metrics` counts them (every record), and said in a warning."""
    from eval.spy.cli import failed_generation
    from eval.spy.prompts import eval_key

    cats = as_categories(categories)
    texts, absolute, scenario_names = cats.label2text(), cats.absolute_labels(), cats.scenarios_json()
    key_name = eval_key(resp_key)
    header, records = read_run(path, required=("id", "label", "is_privacy"))
    if images is None and header_images and isinstance(header, dict) and header.get("images") is not None:
        images = recorded_root(Path(path).parent, header["images"], path, "run_header.images", "--images")
    seen: dict[str, list[int]] = {}
    rows, found = {}, {}  # image_path -> the checked image (items share images: one check each)
    missing = MissingImages(path, images)
    for n, r in records:
        _check_spy_record(path, n, r, resp_key)
        scenario = r.get("scenario")
        scenario_is_privacy = scenario.get("is_privacy") if isinstance(scenario, dict) else None
        kind = "none" if scenario is None else "conflict" if scenario_is_privacy == 0 else "privacy"
        setting = section or ("with_distractors" if r.get("other_labels") else "without_distractors")
        lines, body = _instruction_lines(r, texts)
        image_path = r.get("image_path")
        if image_path not in found:
            where = inside(images, image_path, path, n, "image_path") if images is not None and image_path else None
            found[image_path] = where
        image = missing.find(found[image_path], image_path, n, "image_path")
        expected = expected_verdict(r["label"], int(r["is_privacy"]), scenario_is_privacy, cats)
        item = {"bench": "spy", "section": setting, "id": str(r["id"]), "image": image, "category": r["label"],
                "scenario": kind, "variant": "private" if r["is_privacy"] else "not private", "expected": expected,
                "pair": str(r.get("benchmark_id")), "absolute": r["label"] in absolute,
                "detail": {"instructions": lines, "prompt": body if scenario is not None else None,
                           "scenario_id": str(scenario.get("id")) if scenario else None,
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
        key = f"spy/{setting}/{r['id']}"
        seen.setdefault(key, []).append(n)
        count = len(seen[key])
        rows[key if count == 1 else f"{key}#{count}"] = (item, outcome)
    missing.warn()
    twice = {key: lines for key, lines in seen.items() if len(lines) > 1}
    if twice:
        key, lines = next(iter(twice.items()))
        logger.warning(f"{path}: {len(twice)} ids appear more than once (e.g. {key.rpartition('/')[2]!r} on "
                       f"lines {', '.join(map(str, lines))}); each is shown as its own sample ({key}#2, ...) and "
                       "counted, as `spy metrics` counts every record")
    return rows


# ----------------------------------------------------------------------------------------------- GeoPrivacy
def geo_rows(path, setting: str | None = None, images=None, labels=None, metadata=None,
             images_flag: str = "--images") -> dict:
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
    missing = MissingImages(path, images)
    from eval.spatialtrust.data import with_line_numbers

    numbered = with_line_numbers(path, raw) if path.suffix == ".jsonl" else enumerate(raw, 1)  # header counted
    for n, r in numbered:
        rid = data.label_id(r["id"])
        truth = gold.get(rid)
        if truth is None:
            raise InputError(path, n, "id", f"{rid!r} is not in the gold labels")
        image = missing.find(data.find_image(images, rid, meta.get(rid)) if images is not None else None, rid, n, "id")
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
    missing.warn(images_flag)
    return rows


# ----------------------------------------------------------------------------------------------- SpatialTrust
def _check_box(box, fail, field: str) -> None:
    """A predicted box as our parser writes it: four finite numbers, or null where the model's was unreadable.
    The page draws it as SVG attributes: nothing but numbers may reach them."""
    if box is not None and not (isinstance(box, list) and len(box) == 4 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and finite(v) for v in box)):
        fail(field, f"expected [x1, y1, x2, y2] numbers or null, got {box!r}"[:200])


def check_prediction(path, line: int, prediction: dict) -> None:
    """A SpatialTrust prediction record of the shape eval/spatialtrust/parsing.py writes; what the page shows of it
    (choices, texts, errors as strings, boxes as numbers) of its type."""
    from eval.spatialtrust.data import FREE_QIDS, QIDS, SET_QIDS

    def fail(field, message):
        raise InputError(path, line, field, message)

    for qid in QIDS:
        part = prediction.get(qid)
        if part is None:
            continue
        if not isinstance(part, dict):
            fail(qid, "expected an object")
        choices = part.get("choices")
        if choices is not None and not (isinstance(choices, list) and all(isinstance(c, str) for c in choices)):
            fail(f"{qid}.choices", "expected a list of strings")
        for field in ("text", "error"):
            if part.get(field) is not None and not isinstance(part[field], str):
                fail(f"{qid}.{field}", "expected a string or null")
        boxes = part.get("boxes")
        if boxes is None:
            continue
        if qid in SET_QIDS:
            if not isinstance(boxes, dict):
                fail(f"{qid}.boxes", "expected an object of option -> list of boxes")
            for option, listed in boxes.items():
                if not isinstance(listed, list):
                    fail(f"{qid}.boxes.{option}"[:80], "expected a list of boxes")
                for i, box in enumerate(listed):
                    _check_box(box, fail, f"{qid}.boxes.{option}[{i}]"[:80])
        elif qid in FREE_QIDS:
            if not isinstance(boxes, list):
                fail(f"{qid}.boxes", "expected a list of boxes")
            for i, box in enumerate(boxes):
                _check_box(box, fail, f"{qid}.boxes[{i}]")


def spatialtrust_rows(predictions_path, data_path, mode: str = "predictions", image_root=None,
                      judgments_path=None) -> dict:
    """key -> (item, outcome) per image: gold answers and boxes, the predicted ones, the five question scores."""
    from eval.spatialtrust import data
    from eval.spatialtrust.scoring import JUDGMENT_TYPES, PREDICTION_TYPES, score_image, validate_predictions

    records = data.load(data_path, image_root=image_root)  # its image paths bounded by cli.paths
    predictions = read_jsonl(predictions_path, required=("image_id",), types=PREDICTION_TYPES)
    validate_predictions(predictions_path, predictions, records)
    for line, prediction in data.with_line_numbers(predictions_path, predictions):
        check_prediction(predictions_path, line, prediction)
    by_image = {p["image_id"]: p for p in predictions}
    verdicts = {}
    if judgments_path is not None and Path(judgments_path).is_file():
        for j in read_jsonl(judgments_path, types=JUDGMENT_TYPES):
            if not j.get("error"):
                verdicts.setdefault(j.get("image_id"), {})[j.get("qid")] = j
    rows = {}
    missing = MissingImages(data_path, image_root or Path(data_path).parent)
    for record in records:
        image = missing.find(Path(record["image_path"]), record["image"])
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
    missing.warn("--spatialtrust-data")
    return rows


# ----------------------------------------------------------------------------------------------- runs
# The option of `eval view` that names each root a suite records, for the warning when the recorded one is not used.
FLAGS = {("spy", "images"): "--images", ("geo", "images"): "--geo-images", ("geo", "labels"): "--geo-labels",
         ("spatialtrust", "data"): "--spatialtrust-data", ("spatialtrust", "image_root"): "--spatialtrust-data"}


def suite_rows(folder, given: dict | None = None) -> dict:
    """Every section a suite folder holds. Where its inputs are: `given[section][key]` (what the user named on the
    command line, or the suite itself), else results.json's `inputs`, bounded by the suite folder
    (recorded_root)."""
    folder = Path(folder)
    source = contained(folder, folder / "results.json")
    results = read_json(source)
    if not isinstance(results, dict) or not isinstance(results.get("sections"), dict):
        raise InputError(source, None, "sections", "missing (expected `python -m eval suite` output)")
    inputs = results.get("inputs") if isinstance(results.get("inputs"), dict) else {}
    given = given or {}

    def root(section: str, key: str):
        if (given.get(section) or {}).get(key) is not None:
            return Path(given[section][key])
        if section == "spatialtrust" and key == "image_root" and (given.get(section) or {}).get("data") is not None:
            return None  # the recorded image root belongs to the recorded data file
        recorded = inputs.get(section) if isinstance(inputs.get(section), dict) else {}
        return recorded_root(folder, recorded.get(key), source, f"inputs.{section}.{key}", FLAGS.get((section, key)))

    sections = results["sections"]
    for name in ("spy", "geo", "spatialtrust"):
        if not isinstance(sections.get(name) or {}, dict):
            raise InputError(source, None, f"sections.{name}", "expected an object of setting -> scores")

    def run_file(section: str, setting, name: str) -> Path:
        """A run file of the suite: named by a setting of its results.json, so it must really lie in the folder."""
        return inside(folder, f"{section}/{setting}/{name}", source, None, f"sections.{section}.{setting}",
                      resolve=True)

    rows = {}
    for setting in sections.get("spy") or {}:
        base = setting.removesuffix("_self_moderation")
        run = run_file("spy", base, "self_moderation_judged.jsonl" if base != setting else "judged.jsonl")
        rows.update(spy_rows(run, setting, root("spy", "images"), root("spy", "categories"),
                             resp_key="resp_3" if base != setting else "response", header_images=False))
    for setting in sections.get("geo") or {}:
        run = run_file("geo", setting, "judged.jsonl" if setting == "free-form" else "run.jsonl")
        rows.update(geo_rows(run, setting, root("geo", "images"), root("geo", "labels"), root("geo", "metadata"),
                             images_flag="--geo-images"))
    data_path = root("spatialtrust", "data")
    for mode in sections.get("spatialtrust") or {}:
        if data_path is None:
            logger.warning(f"{folder}: SpatialTrust {mode} left out: where its data is is not known; pass "
                           "--spatialtrust-data")
            continue
        rows.update(spatialtrust_rows(run_file("spatialtrust", mode, "predictions.jsonl"), data_path, mode,
                                      root("spatialtrust", "image_root"),
                                      run_file("spatialtrust", mode, "judgments.jsonl")))
    return rows


# The roots a suite's viewer needs that `eval compare` names with its own options: (section, key) -> (option, the
# key of `given` it fills). GeoPrivacy's labels and metadata default to the released files.
COMPARE_FLAGS = {("spy", "images"): ("--images", "images"), ("geo", "images"): ("--geo-images", "images"),
                 ("spatialtrust", "data"): ("--spatialtrust-data", "data"),
                 ("spatialtrust", "image_root"): ("--spatialtrust-data", "data")}


def roots_outside(folder, given: dict | None = None) -> dict[str, str]:
    """option -> the path to give it, for each root that a suite folder records (results.json's `inputs`), that its
    viewer needs, that lies outside the folder (suite_rows does not use it) and that `given` does not name. The path
    is the recorded one joined to the folder as text, relative to the current directory: nothing outside the folder
    is looked at."""
    import os
    import shlex

    folder = Path(folder)
    results = read_json(contained(folder, folder / "results.json"))
    sections = results.get("sections") if isinstance(results, dict) and isinstance(results.get("sections"), dict) \
        else {}
    inputs = results.get("inputs") if isinstance(results, dict) and isinstance(results.get("inputs"), dict) else {}
    wanted = {}
    for (section, key), (flag, given_key) in COMPARE_FLAGS.items():
        recorded = inputs.get(section) if isinstance(inputs.get(section), dict) else {}
        value = recorded.get(key)
        if not sections.get(section) or ((given or {}).get(section) or {}).get(given_key) is not None \
                or flag in wanted or not isinstance(value, str):
            continue
        try:
            inside(folder, value, resolve=True)
            continue  # used as recorded
        except InputError:
            pass
        value = recorded.get("data") if key == "image_root" else value  # the data file names its images
        if isinstance(value, str):
            path = os.path.normpath(value if os.path.isabs(value) else os.path.relpath(os.path.join(folder, value)))
            wanted[flag] = shlex.quote(path) if path.isprintable() else ascii(path)
    return wanted


def load_run(source, given: dict | None = None) -> dict:
    """key -> (item, outcome) of one run: a suite folder or one run file, told apart by content. `given`: the
    inputs the user named, as suite_rows takes them (`spy.images` is also a SPY-Bench or GeoPrivacy run file's
    images, `geo.labels` a GeoPrivacy run file's, `spatialtrust.data` the data of SpatialTrust predictions)."""
    source = Path(source)
    given = given or {}
    if source.is_dir():
        if not (source / "results.json").is_file():
            raise InputError(source, None, None, "a folder without results.json (not a `python -m eval suite` --out)")
        return suite_rows(source, given)
    if source.name == "results.json":
        return suite_rows(source.parent, given)
    from eval.geoprivacy.data import read_records

    records = read_records(source)
    if not isinstance(records, list) or not records or not isinstance(records[0], dict):
        raise InputError(source, None, None, "no records (expected a run file: JSON Lines, or a JSON list)")
    first = records[0]
    spy, geo, spatial = (given.get(k) or {} for k in ("spy", "geo", "spatialtrust"))
    if "label" in first and "is_privacy" in first:
        resp_key = "resp_3" if "eval_3" in first else "response"
        return spy_rows(source, None, spy.get("images"), resp_key=resp_key)
    if "image_id" in first and "q1" in first:
        if spatial.get("data") is None:
            raise InputError(source, None, None, "SpatialTrust predictions: pass --spatialtrust-data (the data file)")
        return spatialtrust_rows(source, spatial["data"], source.stem)
    if any(k in first for k in ("Q7", "Q7-label", "setting")):
        return geo_rows(source, images=geo.get("images") or spy.get("images"), labels=geo.get("labels"))
    raise InputError(source, None, None, "not a judged SPY-Bench, GeoPrivacy or SpatialTrust run file "
                     "(expected label/is_privacy, Q7 or image_id/q1 fields)")


def suite_inputs(config: dict, out=None) -> dict:
    """What the viewer needs to find a suite's inputs again: paths relative to the suite folder `out` (what
    results.json records), or with `out` None the absolute paths (what the suite gives its own viewer)."""
    import os

    out = None if out is None else Path(out).resolve()

    def rel(value):
        if value is None:
            return None
        return str(Path(value).resolve()) if out is None else os.path.relpath(Path(value).resolve(), out)

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


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def safe_text(text: str) -> str:
    """`text` with every lone surrogate (JSON's "\\ud800" reads as one; it has no UTF-8 form) as U+FFFD."""
    return LONE_SURROGATE.sub("\ufffd", text)


def dumps(value) -> str:
    """JSON for a page's script: UTF-8-encodable whatever the run file held."""
    return safe_text(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str))
