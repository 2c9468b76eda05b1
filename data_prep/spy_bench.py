"""SPY-Bench items -> evaluation samples (../shared/specs/spy.md §1.3-§1.5).

Each item expands, in this order, into: the private and the non-private instruction without scenario;
the private instruction in each of its `non_privacy_scenarios` (conflict: the context needs the category);
and the private, then the non-private, instruction in each of its `privacy_scenarios` (non-conflict).
With `distractors`, the instruction block has one line per `other_labels` entry (5 unrelated, fixed
instructions plus the target's).

A sample carries the reference's fields (`benchmark_id`, `label`, `is_privacy`, `question_id`,
`image_path`, `question`, `ref_answer`, optional `label2text` / `instruct_templates`, `other_labels` with
distractors, `scenario` = `{id, is_privacy, 2nd_template}` for scenario cases only) plus an `id` and the
composed `input_question`. Label texts and instruction templates come from a category file
(`data_prep/categories.py`; default: SPY's 67 categories); an item's own `label2text` / `instruct_templates`
override them. Every item is checked before any sample is made; bad input raises InputError naming the file,
the line where the item starts, and the field.

    samples = build_samples("questions.json", images_dir="data", distractors=True, categories="my_categories.yaml")
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from cli.errors import InputError, check_image, parse_json, read_text
from cli.paths import inside
from data_prep.categories import as_categories, template_problem
from data_prep.spy import SAFE_LABEL, compose_prompt, instruction_block, own_label_problem


def to_bench_item(item: dict, texts: dict[str, str] | None = None) -> dict:
    """The SPY-Bench shape of a SPY-Tune item (spy.md §1.3): `gt` instead of the answer pair; with `texts`, the
    optional `label2text` of its labels, so the bench reads without the category file."""
    q = item["question_item"]
    bench = {
        "benchmark_id": item["benchmark_id"],
        "label": item["label"],
        "question_item": {"question_id": q["question_id"], "image_path": q["image_path"],
                          "question": q["question"], "gt": q["respond_ans"]},
        "other_labels": item["other_labels"],
    }
    if texts is not None:
        bench["label2text"] = {k: texts[k] for k in item["other_labels"]}
    return {**bench, "non_privacy_scenarios": item["non_privacy_scenarios"],
            "privacy_scenarios": item["privacy_scenarios"]}


def sample_id(record: dict) -> str:
    """`<benchmark_id>:p<is_privacy>[:<scenario id>]`, unique within a benchmark; also derivable from the
    reference's own result records, which have no id."""
    base = f"{record['benchmark_id']}:p{int(record['is_privacy'])}"
    scenario = record.get("scenario")
    return base if scenario is None else f"{base}:{scenario['id']}"


def _item_lines(text: str) -> list[int] | None:
    """The line on which each element of the `benchmark_list` array starts (None if it cannot be found)."""
    match = re.search(r'"benchmark_list"\s*:\s*\[', text)
    if not match:
        return None
    decoder, skip = json.JSONDecoder(), re.compile(r"[\s,]*")
    pos, line, counted, lines = match.end(), 1, 0, []
    try:
        while True:
            pos = skip.match(text, pos).end()
            if pos >= len(text) or text[pos] == "]":
                return lines
            line += text.count("\n", counted, pos)
            counted = pos
            lines.append(line)
            _, pos = decoder.raw_decode(text, pos)
    except json.JSONDecodeError:
        return None


def load_items(path) -> list[tuple[object, dict]]:
    """`(where, item)` pairs from a released `questions.json` (`{"benchmark_list": [...]}`), a JSON list, or
    JSON Lines; `where` is the line the item starts on."""
    path = Path(path)
    text = read_text(path)
    if path.suffix == ".jsonl":
        items = []
        for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may sit in a string
            if line.strip():
                items.append((lineno, parse_json(line, path, lineno)))
        return items
    data = parse_json(text, path)
    if isinstance(data, dict):
        if not isinstance(data.get("benchmark_list"), list):
            raise InputError(path, 1, "benchmark_list", "expected a list of items")
        items = data["benchmark_list"]
        lines = _item_lines(text)
    elif isinstance(data, list):
        items, lines = data, None
    else:
        raise InputError(path, 1, None, 'expected {"benchmark_list": [...]} or a list of items')
    if lines is None or len(lines) != len(items):
        lines = [f"item {n}" for n in range(1, len(items) + 1)]
    return list(zip(lines, items))


def _is_flag(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1)



def check_item(item, where, path, distractors: bool, images_dir=None, categories=None) -> dict[str, str]:
    """Raise InputError on the first problem of one item; return the label texts it uses."""
    def fail(field, message):
        raise InputError(path, where, field, message)

    if not isinstance(item, dict):
        fail(None, "expected a JSON object")
    for field in ("benchmark_id", "label", "question_item", "non_privacy_scenarios", "privacy_scenarios"):
        if field not in item:
            fail(field, "missing field")
    if not isinstance(item["benchmark_id"], (str, int)) or isinstance(item["benchmark_id"], bool):
        fail("benchmark_id", "expected a string")
    cats = as_categories(categories)
    texts = cats.label2text()
    if "label2text" in item:
        if not isinstance(item["label2text"], dict) or not all(isinstance(v, str) for v in item["label2text"].values()):
            fail("label2text", "expected an object of label -> text")
        texts = {**texts, **item["label2text"]}
    label = item["label"]
    if label == SAFE_LABEL:
        fail("label", f"{SAFE_LABEL} is not a SPY-Bench category")
    if not isinstance(label, str):
        fail("label", f"unknown label {label!r}")
    if label not in texts:
        fail("label", cats.unknown_label(label, path))
    question = item["question_item"]
    if not isinstance(question, dict):
        fail("question_item", "expected an object")
    for field in ("image_path", "question"):
        if not isinstance(question.get(field), str) or not question[field]:
            fail(f"question_item.{field}", "missing or not a string")
    if images_dir is not None:
        check_image(inside(images_dir, question["image_path"], path, where, "question_item.image_path"), where,
                    "question_item.image_path", source=path)
    templates = item.get("instruct_templates", cats.templates)
    if (not isinstance(templates, (list, tuple)) or len(templates) != 2
            or any(template_problem(t) for t in templates)):
        fail("instruct_templates", "expected two strings, each with one {} slot")
    other = item.get("other_labels")
    if distractors and (not isinstance(other, dict) or not other):
        fail("other_labels", "needed with distractors: an object of label -> 0/1")
    if other is not None:  # checked when present, used or not: a NaN there is a broken file either way
        if not isinstance(other, dict):
            fail("other_labels", "expected an object of label -> 0/1")
        for key, value in other.items():
            if key not in texts:
                fail(f"other_labels.{key}", cats.unknown_label(key, path))
            if key != label and not _is_flag(value):
                fail(f"other_labels.{key}", f"expected 0 or 1, got {value!r}")
            if key == label and (problem := own_label_problem(value)):
                fail(f"other_labels.{key}", problem)
    seen = set()
    for field in ("non_privacy_scenarios", "privacy_scenarios"):
        if not isinstance(item[field], list):
            fail(field, "expected a list")
        for n, scenario in enumerate(item[field]):
            name = f"{field}[{n}]"
            if not isinstance(scenario, dict) or not isinstance(scenario.get("scenario"), str):
                fail(f"{name}.scenario", "missing or not a string")
            template = scenario.get("2nd_person_template")
            if template_problem(template):
                fail(f"{name}.2nd_person_template", "expected a string with one {} slot")
            if scenario["scenario"] in seen:
                fail(f"{name}.scenario", f"scenario {scenario['scenario']!r} listed twice for this item")
            seen.add(scenario["scenario"])
    return texts


def expand_item(item: dict, distractors: bool = False, texts: dict[str, str] | None = None,
                categories=None) -> list[dict]:
    """The evaluation samples of one (valid) item, in the reference's order (spy.md §1.4)."""
    cats = as_categories(categories)
    texts = texts or {**cats.label2text(), **item.get("label2text", {})}
    templates = tuple(item.get("instruct_templates", cats.templates))
    label, question = item["label"], item["question_item"]
    common = {
        "benchmark_id": str(item["benchmark_id"]),
        "label": label,
        "question_id": question.get("question_id"),
        "image_path": question["image_path"],
        "question": question["question"],
        "ref_answer": question.get("gt"),
    }
    for optional in ("label2text", "instruct_templates"):
        if optional in item:
            common[optional] = item[optional]
    cases = [(1, None, None), (0, None, None)]
    cases += [(1, s, 0) for s in item["non_privacy_scenarios"]]
    cases += [(p, s, 1) for s in item["privacy_scenarios"] for p in (1, 0)]
    samples = []
    for is_privacy, scenario, scenario_is_privacy in cases:
        sample = {"id": None, "benchmark_id": common["benchmark_id"], "label": label, "is_privacy": is_privacy,
                  **{k: v for k, v in common.items() if k not in ("benchmark_id", "label")}}
        other = None
        if distractors:
            other = copy.deepcopy(item["other_labels"])
            other[label] = is_privacy  # keeps the target's position, or appends it last
            other = {k: int(v) for k, v in other.items()}
            sample["other_labels"] = other
        template = None
        if scenario is not None:
            template = scenario["2nd_person_template"]
            sample["scenario"] = {"id": scenario["scenario"], "is_privacy": scenario_is_privacy,
                                  "2nd_template": template}
        instructions = instruction_block(label, is_privacy, texts, other, templates)
        sample["input_question"] = compose_prompt(instructions, question["question"], template)
        sample["id"] = sample_id(sample)
        samples.append(sample)
    for sample in samples:  # how many samples the item has (2 + its scenarios), so metrics can tell one missing
        sample["item_samples"] = len(samples)
    return samples


def build_samples(items_path, images_dir=None, distractors: bool = False, categories=None) -> list[dict]:
    """Check every item (and, given `images_dir`, that its image decodes), then expand them all; `categories`
    is a category file (path or CategorySet; default SPY's)."""
    cats = as_categories(categories)
    items = load_items(items_path)
    checked, ids = [], set()
    for where, item in items:
        texts = check_item(item, where, items_path, distractors, images_dir, cats)
        if str(item["benchmark_id"]) in ids:
            raise InputError(items_path, where, "benchmark_id", f"duplicate benchmark_id {item['benchmark_id']!r}")
        ids.add(str(item["benchmark_id"]))
        checked.append((item, texts))
    samples, seen = [], set()
    for (where, _), (item, texts) in zip(items, checked):
        for sample in expand_item(item, distractors, texts, cats):
            if sample["id"] in seen:  # two samples would be one in every run file, and in every metric
                raise InputError(items_path, where, "benchmark_id", f"a sample of this item gets the id "
                                 f"{sample['id']!r}, which another item's sample has (ids are benchmark_id:p0|p1"
                                 "[:scenario]); give this item another benchmark_id")
            seen.add(sample["id"])
            samples.append(sample)
    return samples
