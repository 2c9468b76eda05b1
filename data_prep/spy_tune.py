"""SPY-Tune JSON + images -> `datasets.Dataset`s for SFT, DPO / NCA and NCA-P (spy.md §5.1, §5.2).

Every method sees the same cases, built from the same rule (`data_prep.spy.expected_verdict`):

| method | rows per item | columns |
|---|---|---|
| sft | one per (instruction, context) case: 2 + |non-privacy scenarios| + 2 |privacy scenarios| | images, prompt, completion |
| dpo, nca | the same cases | images, prompt, chosen, rejected |
| nca_p | one per context (none, each scenario), holding both instructions | images, prompt_0/1, chosen_0/1, rejected_0/1 |

SFT rows are prompt-completion pairs, so TRL trains on the answer only: the system prompt, the
instructions, the question and the image tokens are not trained on (the reference trained on all of them).
Variant 0 is the non-private instruction, 1 the private one. Conversational messages hold plain strings;
TRL inserts the image block before the first user turn.
"""

from __future__ import annotations

import random
from pathlib import Path

from datasets import Dataset, Image, List

from data_prep import spy
from data_prep.errors import InputError, read_json

ITEM_FIELDS = ("benchmark_id", "label", "question_item", "non_privacy_scenarios", "privacy_scenarios")
QUESTION_FIELDS = ("image_path", "question", "respond_ans", "reject_ans")
SCENARIO_FIELDS = ("scenario", "2nd_person_template")


def load_label_texts(path=None) -> dict[str, str]:
    if path is None:
        return spy.label2text()
    texts = read_json(path)
    texts.pop(spy.SAFE_LABEL, None)
    return texts


def load_items(path, image_folder, label_texts: dict[str, str] | None = None) -> list[dict]:
    """The validated items of a SPY-Tune JSON file (`{"data_list": [...]}`); the first problem raises InputError."""
    path, image_folder = Path(path), Path(image_folder)
    label_texts = label_texts or spy.label2text()
    data = read_json(path)
    items = data.get("data_list") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise InputError(path, None, "data_list", "missing: expected {\"data_list\": [items]}")
    for index, item in enumerate(items):
        where = f"record {index}"
        if not isinstance(item, dict):
            raise InputError(path, where, None, "expected a JSON object")
        for field in ITEM_FIELDS:
            if field not in item:
                raise InputError(path, where, field, "missing field")
        q = item["question_item"]
        for field in QUESTION_FIELDS:
            if field not in q:
                raise InputError(path, where, f"question_item.{field}", "missing field")
        if item["label"] not in label_texts:
            raise InputError(path, where, "label", f"unknown label {item['label']!r}")
        other = item.get("other_labels") or {}
        for key, value in other.items():
            if key not in label_texts:
                raise InputError(path, where, f"other_labels.{key}", "unknown label")
            if key != item["label"] and value not in (0, 1):
                raise InputError(path, where, f"other_labels.{key}", f"expected 0 or 1, got {value!r}")
        for kind in ("non_privacy_scenarios", "privacy_scenarios", "chosen_scenarios"):
            for n, scenario in enumerate(item.get(kind) or []):
                for field in SCENARIO_FIELDS:
                    if field not in scenario:
                        raise InputError(path, where, f"{kind}[{n}].{field}", "missing field")
        if not (image_folder / q["image_path"]).is_file():
            raise InputError(path, where, "question_item.image_path", f"image not found: {image_folder / q['image_path']}")
    return items


def _prompts(item: dict, texts: dict[str, str], add_distractors: bool, scenario: dict | None) -> tuple[str, str]:
    """The (non-private, private) prompts of one item in one context."""
    templates = tuple(item.get("instruct_templates") or spy.INSTRUCT_TEMPLATES)
    other = item.get("other_labels") if add_distractors else None
    template = scenario["2nd_person_template"] if scenario else None
    question = item["question_item"]["question"]
    return tuple(
        spy.compose_prompt(spy.instruction_block(item["label"], j, texts, other, templates), question, template)
        for j in (0, 1)
    )


def _answers(item: dict, is_privacy: int, scenario_is_privacy: int | None) -> tuple[str, str]:
    """(chosen, rejected) under SPY's rule."""
    q = item["question_item"]
    verdict = spy.expected_verdict(item["label"], is_privacy, scenario_is_privacy)
    return (q["respond_ans"], q["reject_ans"]) if verdict == "respond" else (q["reject_ans"], q["respond_ans"])


def _cases(item: dict):
    """(is_privacy, scenario, scenario_is_privacy) for the five SFT / DPO cases of spy.md §5.2."""
    yield 1, None, None
    yield 0, None, None
    for s in item["non_privacy_scenarios"]:
        yield 1, s, 0
    for s in item["privacy_scenarios"]:
        yield 1, s, 1
    for s in item.get("chosen_scenarios", item["privacy_scenarios"]):
        yield 0, s, 1


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def pairwise_rows(item: dict, texts: dict[str, str], add_distractors: bool) -> list[dict]:
    rows = []
    for is_privacy, scenario, scenario_is_privacy in _cases(item):
        prompt = _prompts(item, texts, add_distractors, scenario)[is_privacy]
        chosen, rejected = _answers(item, is_privacy, scenario_is_privacy)
        rows.append({"prompt": _user(prompt), "chosen": _assistant(chosen), "rejected": _assistant(rejected)})
    return rows


def sft_rows(item: dict, texts: dict[str, str], add_distractors: bool) -> list[dict]:
    return [{"prompt": r["prompt"], "completion": r["chosen"]} for r in pairwise_rows(item, texts, add_distractors)]


def nca_p_rows(item: dict, texts: dict[str, str], add_distractors: bool) -> list[dict]:
    contexts = [(None, None)]
    contexts += [(s, 0) for s in item["non_privacy_scenarios"]] + [(s, 1) for s in item["privacy_scenarios"]]
    rows = []
    for scenario, scenario_is_privacy in contexts:
        row = {}
        for j, prompt in enumerate(_prompts(item, texts, add_distractors, scenario)):
            chosen, rejected = _answers(item, j, scenario_is_privacy)
            row.update({f"prompt_{j}": _user(prompt), f"chosen_{j}": _assistant(chosen),
                        f"rejected_{j}": _assistant(rejected)})
        rows.append(row)
    return rows


ROW_BUILDERS = {"sft": sft_rows, "dpo": pairwise_rows, "nca": pairwise_rows, "nca_p": nca_p_rows}


def build_dataset(
    method: str,
    data_path,
    image_folder,
    add_distractors: bool = True,
    label_path=None,
    shuffle: bool = True,
    seed: int = 42,
    num_samples: int | None = None,
) -> Dataset:
    """The training (or evaluation) dataset of one method, images decoded lazily from `image_folder`."""
    texts = load_label_texts(label_path)
    items = load_items(data_path, image_folder, texts)
    rows = []
    for item in items:
        image = str(Path(image_folder) / item["question_item"]["image_path"])
        for row in ROW_BUILDERS[method](item, texts, add_distractors):
            rows.append({"images": [image], **row, "p_label": item["label"]})
    if shuffle:
        random.Random(seed).shuffle(rows)
    if num_samples is not None:
        rows = rows[:num_samples]
    return Dataset.from_list(rows).cast_column("images", List(Image()))
