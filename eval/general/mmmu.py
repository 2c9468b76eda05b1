"""MMMU dev + validation: loading, the Qwen2-VL prompt of VLMEvalKit, and two scoring profiles.

We run dev (150) and validation (900) together like VLMEvalKit's MMMU_DEV_VAL, the setting the SPY paper used;
the reported MMMU number, and the composite's, is validation accuracy only.

Scoring profiles (both pure functions of the run records):
- `vlmevalkit` (SPY-compatible, VLMEvalKit's `exact_matching` judge as it was before VLMEvalKit PR #1175):
  an open question becomes a two-way choice, A = the gold answer text, B = "Other Answers". The letter is the one
  option letter that appears as a token of the response (after `.()[],:;!*#{}` become spaces); failing that, the
  one option whose text the lowercased response contains; failing that, 'Z', which is always wrong. A response
  holding VLMEvalKit's "Failed to obtain answer via API" marker gives no letter (only the option-text pass runs).
- `official` (the MMMU repository's `eval/eval_utils.py`): multiple choice reads "(X)", then " X ", then (for
  responses over 5 words) option texts, the latest occurrence winning, and guesses at random when nothing is
  found; open questions extract key phrases and numbers and match them against the answer. The official script
  scores each split on its own, seeding its generator with 42: so does this, one generator per split, so the
  dev records in a file never move validation's guesses.
"""

from __future__ import annotations

import ast
import random
import re
import string

from cli.errors import InputError
from eval.general import common

NAME = "mmmu"
HUB_ID = "MMMU/MMMU"  # one config per subject; a flattened copy such as lmms-lab/MMMU loads with one call
SPLITS = ("dev", "validation")
IMAGE_COLUMNS = [f"image_{n}" for n in range(1, 8)]
REQUIRED = ("id", "question", "options", "answer", "question_type")
PROFILES = ("vlmevalkit", "official")

DISCIPLINES = {
    "Art and Design": ["Art", "Art_Theory", "Design", "Music"],
    "Business": ["Accounting", "Economics", "Finance", "Manage", "Marketing"],
    "Science": ["Biology", "Chemistry", "Geography", "Math", "Physics"],
    "Health and Medicine": [
        "Basic_Medical_Science", "Clinical_Medicine", "Diagnostics_and_Laboratory_Medicine", "Pharmacy",
        "Public_Health",
    ],
    "Humanities and Social Science": ["History", "Literature", "Sociology", "Psychology"],
    "Tech and Engineering": [
        "Agriculture", "Architecture_and_Engineering", "Computer_Science", "Electronics", "Energy_and_Power",
        "Materials", "Mechanical_Engineering",
    ],
}
SUBJECTS = sorted(s for subjects in DISCIPLINES.values() for s in subjects)
DISCIPLINE_OF = {s: d for d, subjects in DISCIPLINES.items() for s in subjects}
ID_PATTERN = re.compile(r"^(dev|validation|test)_(.+?)_\d+$")


# ---------------------------------------------------------------------------------------------------- loading
def load(source: str | None = None, splits: tuple[str, ...] = SPLITS, limit: int | None = None):
    """MMMU rows of the given splits: `MMMU/MMMU` (30 subject configs), a flattened Hub copy, or a local copy."""
    import datasets

    def from_hub(hub_id):
        if hub_id == HUB_ID:
            parts = [datasets.load_dataset(hub_id, s, split=split) for split in splits for s in SUBJECTS]
        else:
            parts = [datasets.load_dataset(hub_id, split=split) for split in splits]
        return datasets.concatenate_datasets(parts)

    source = source or HUB_ID
    ds = common.load_source(source, splits, from_hub)
    common.check_columns(ds, REQUIRED, source)
    # Flattened and parquet copies hold every split in one table; the id says which split a row is from.
    keep = [i for i, sample_id in enumerate(ds["id"]) if _split_of(sample_id) in splits]
    if len(keep) < len(ds):
        ds = ds.select(keep)
    return common.head(ds, limit)


def _split_of(sample_id: str) -> str | None:
    match = ID_PATTERN.match(sample_id)
    return match.group(1) if match else None


def parse_options(text: str, source, sample_id) -> list[str]:
    """MMMU stores options as the text of a Python list literal, "[]" for open questions."""
    try:
        options = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        options = None
    if not isinstance(options, list):
        raise InputError(source, sample_id, "options", f"not a list literal: {text[:60]!r}")
    return [str(o) for o in options]


def build_prompt(question: str, options: list[str]) -> str:
    """VLMEvalKit's Qwen2-VL MMMU prompt (`<image n>` tags stay in the text; the images come before it)."""
    prompt = f"Question: {question}\n"
    if options:
        prompt += "Options:\n" + "".join(f"{letter}. {o}\n" for letter, o in zip(string.ascii_uppercase, options))
        prompt += "Please select the correct answer from the options above. \n"
    return prompt.rstrip()


def items(ds, source="MMMU") -> list[dict]:
    rows = ds.select_columns(list(REQUIRED)).to_list()
    image_counts = _image_counts(ds)
    out = []
    for row, n_images in zip(rows, image_counts):
        match = ID_PATTERN.match(row["id"])
        if not match:
            raise InputError(source, row["id"], "id", "expected <split>_<Subject>_<n>, e.g. validation_Art_1")
        options = parse_options(row["options"], source, row["id"])
        out.append({
            "id": row["id"], "split": match.group(1), "subject": match.group(2),
            "question_type": row["question_type"], "answer": row["answer"], "options": options,
            "n_images": n_images, "prompt": build_prompt(row["question"], options),
        })
    common.check_unique(out, source)
    return out


def _image_counts(ds) -> list[int]:
    # Read the image columns as Arrow structs: nothing decoded, nothing cached next to the user's dataset.
    columns = [c for c in IMAGE_COLUMNS if c in ds.column_names]
    table = ds.select_columns(columns).with_format("arrow")[:]
    present = [table.column(c).is_valid().to_pylist() for c in columns]
    return [sum(flags) for flags in zip(*present)] if present else [0] * len(ds)


def request(item: dict, row: dict) -> dict:
    """All images first, in column order, so the k-th image is the one the text calls `<image k>`."""
    images = [common.rgb(row[c]) for c in IMAGE_COLUMNS if row.get(c) is not None]
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": item["prompt"]}]
    return {"id": item["id"], "messages": [{"role": "user", "content": content}], "images": images}


# ---------------------------------------------------------------------------------------------------- vlmevalkit
API_FAILURE = "Failed to obtain answer via API"  # VLMEvalKit's marker of a request that failed: no letter read
REFUSALS = (
    "Sorry, I can't help with images of people yet.", "I can't process this file.",
    "I'm sorry, but without the image provided", "Cannot determine the answer",
)


def infer_option_letter(response: str, choices: dict[str, str]) -> str | None:
    if API_FAILURE in response:  # checked first, as VLMEvalKit's can_infer_option does (the text pass still runs)
        return None
    if any(refusal in response for refusal in REFUSALS):
        return "Z"
    tokens = re.sub(r"[.()\[\],:;!*#{}]", " ", response).split()
    found = [letter for letter in choices if letter in tokens]
    if len(found) == 1:
        return found[0]
    if not found and "Z" in tokens:
        return "Z"
    return None


def infer_option_text(response: str, choices: dict[str, str]) -> str | None:
    lowered = response.lower()
    found = [letter for letter, text in choices.items() if str(text).lower() in lowered]
    return found[0] if len(found) == 1 else None


def judge_vlmevalkit(record: dict) -> tuple[str, bool]:
    """(extracted letter, hit) under VLMEvalKit's exact matching; an open question is A = gold vs B = other."""
    options, answer = record["options"], record["answer"]
    if options:
        choices, gold = dict(zip(string.ascii_uppercase, options)), answer
    else:
        choices = {"A": answer, "B": "Other Answers"}
        gold = answer if re.fullmatch(r"[A-Z]", answer) else "A"
    response = record.get("response") or ""
    letter = infer_option_letter(response, choices) or infer_option_text(response, choices) or "Z"
    return letter, letter == gold


# ---------------------------------------------------------------------------------------------------- official
def parse_multi_choice(response: str, choices: dict[str, str], rng: random.Random) -> str:
    for char in ",.!?;:'":  # one character after the other, as the official parser does
        response = response.strip(char)
    response = f" {response} "
    candidates = [letter for letter in choices if f"({letter})" in response]
    marker = "({})"
    if not candidates:
        candidates, marker = [letter for letter in choices if f" {letter} " in response], " {} "
    by_text = False
    if not candidates and len(response.split()) > 5:
        candidates = [letter for letter, text in choices.items() if text.lower() in response.lower()]
        by_text = True
    if not candidates:
        return rng.choice(list(choices)) if choices else ""
    if len(candidates) == 1:
        return candidates[0]
    # Several: the one mentioned last.
    if by_text:
        positions = [response.lower().rfind(choices[c].lower()) for c in candidates]
    else:
        positions = [response.rfind(marker.format(c)) for c in candidates]
    return candidates[positions.index(max(positions))]


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
        return True
    except ValueError:
        return False


def normalize(text: str) -> list:
    """A number becomes a float rounded to 2 places; other text is lowercased, a single character padded."""
    text = text.strip()
    if _is_number(text):
        return [round(float(text.replace(",", "")), 2)]
    text = text.lower()
    return [" " + text, text + " "] if len(text) == 1 else [text]


NUMBER_PATTERNS = (
    r"-?\b\d{1,3}(?:,\d{3})+\b",  # 1,234,567
    r"-?\d+(?:\.\d+)?[eE][+-]?\d+",  # 1.5e-3
    r"-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d])",  # 12, 3.5, .5
)
KEY_INDICATORS = ("could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result ")


def key_phrases(response: str) -> list[str]:
    """Per line, the shortest tail after an answer indicator ("=" also counts on the last line)."""
    response = response.strip().strip(".").lower()
    # The official parser lowercases first, so its "sentence end before a capital" split never fires: lines only.
    lines = re.split(r"\.\s(?=[A-Z])|\n", response)
    found = []
    for index, line in enumerate(lines):
        indicators = KEY_INDICATORS + (("=",) if index == len(lines) - 1 else ())
        shortest = None
        for indicator in indicators:
            if indicator in line:
                tail = line.split(indicator)[-1].strip()
                if not shortest or len(tail) < len(shortest):
                    shortest = tail
        if shortest and shortest not in (":", ",", ".", "!", "?", ";", "'"):
            found.append(shortest)
    return found or [response]


def parse_open(response: str) -> list:
    phrases = key_phrases(response)
    predictions = list(phrases)
    for phrase in phrases:
        for pattern in NUMBER_PATTERNS:
            predictions += re.findall(pattern, phrase)
    return list({value for p in predictions for value in normalize(p)})


def open_is_correct(gold, predictions: list) -> bool:
    golds = [value for g in (gold if isinstance(gold, list) else [gold]) for value in normalize(str(g))]
    for pred in predictions:
        if isinstance(pred, str):
            if any(isinstance(g, str) and g in pred for g in golds):
                return True
        elif pred in golds:
            return True
    return False


def _gold(answer: str):
    # A few answers are list literals of acceptable answers.
    if answer.startswith("["):
        try:
            value = ast.literal_eval(answer)
            if isinstance(value, list):
                return [str(v) for v in value]
        except (ValueError, SyntaxError):
            pass
    return answer


def judge_official(record: dict, rng: random.Random) -> tuple[object, bool]:
    response, gold = record.get("response") or "", _gold(record["answer"])
    if record["question_type"] == "multiple-choice":
        letter = parse_multi_choice(response, dict(zip(string.ascii_uppercase, record["options"])), rng)
        return letter, letter in gold if isinstance(gold, list) else letter == gold
    predictions = parse_open(response)
    return sorted(map(str, predictions)), open_is_correct(gold, predictions)


# ---------------------------------------------------------------------------------------------------- score
RUN_FIELDS = ("split", "subject", "question_type", "answer", "options")


def check(record: dict):
    if not isinstance(record["options"], list):
        return "options", "expected a list of option texts"
    if not isinstance(record["answer"], str):
        return "answer", "expected a string"
    return None


def score(records: list[dict], profile: str = "vlmevalkit") -> dict:
    """Accuracy (0..1) per split, subject and discipline; `score` = validation accuracy in percent."""
    if profile not in PROFILES:
        raise ValueError(f"unknown MMMU profile {profile!r}; choose from {PROFILES}")
    rngs: dict[str, random.Random] = {}  # the official script's seed, per split: each split scored on its own
    judged = []
    for record in records:
        if profile == "vlmevalkit":
            extracted, hit = judge_vlmevalkit(record)
        else:
            extracted, hit = judge_official(record, rngs.setdefault(record["split"], random.Random(42)))
        judged.append({"id": record["id"], "split": record["split"], "subject": record["subject"],
                       "extracted": extracted, "hit": bool(hit)})
    splits = {}
    for split in sorted({j["split"] for j in judged}, key=lambda s: (s != "validation", s)):
        rows = [j for j in judged if j["split"] == split]
        splits[split] = {
            **_accuracy(rows),
            "subjects": {s: _accuracy([j for j in rows if j["subject"] == s]) for s in sorted({j["subject"] for j in rows})},
            "disciplines": {
                d: _accuracy(group)
                for d in DISCIPLINES
                if (group := [j for j in rows if DISCIPLINE_OF.get(j["subject"]) == d])
            },
        }
    validation = splits.get("validation")
    return {
        "benchmark": NAME, "profile": profile, "n": len(records), "n_failed": common.count_failed(records),
        "score": 100 * validation["accuracy"] if validation else None, "splits": splits, "items": judged,
    }


def _accuracy(rows: list[dict]) -> dict:
    correct = sum(r["hit"] for r in rows)
    return {"n": len(rows), "correct": correct, "accuracy": correct / len(rows) if rows else None}
