"""SPY-Tune JSON + images -> `datasets.Dataset`s for SFT, DPO / NCA and NCA-P (spy.md §5.1, §5.2).

Every method sees the same cases, built from the same rule (`data_prep.spy.expected_verdict`):

| method | rows per item | columns |
|---|---|---|
| sft | one per (instruction, context) case: 2 + |non-privacy scenarios| + 2 |privacy scenarios| | images, prompt, completion |
| dpo, nca | the same cases | images, prompt, chosen, rejected |
| nca_p | one per context (none, each scenario), holding both instructions | images, prompt_0/1, chosen_0/1, rejected_0/1 |
| grpo | the SFT cases, as prompts only | images, prompt, expected_verdict, answer, question, task |

SFT rows are prompt-completion pairs, so TRL trains on the answer only: the system prompt, the
instructions, the question and the image tokens are not trained on (the reference trained on all of them).
Variant 0 is the non-private instruction, 1 the private one. Conversational messages hold plain strings;
TRL inserts the image block before the first user turn.

The categories (label texts, absolute ones, instruction templates) come from a category file
(`data_prep/categories.py`; default: SPY's 67). Every item is checked before any row is built: required strings are
non-empty strings, labels are in the category file, templates have their `{}` slot, and each image is decoded in
full. To check a file without training (exit 0
and a one-line summary, or exit 2 and the first problems, one per line, naming file, record and field):

    python -m data_prep.spy_tune validate data/spy-tune/train_data.json --images data/spy-tune [--categories FILE]
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cli.entry import ArgumentParser, run_command
from cli.errors import InputError, check_image, read_json
from cli.paths import inside
from data_prep import spy
from data_prep.categories import CategorySet, as_categories, template_problem

if TYPE_CHECKING:
    import datasets

ITEM_FIELDS = ("benchmark_id", "label", "question_item", "non_privacy_scenarios", "privacy_scenarios")
QUESTION_FIELDS = ("image_path", "question", "respond_ans", "reject_ans")


def load_label_texts(path=None, categories=None) -> dict[str, str]:
    """The category set's label texts; a label2text.json at `path` renames some of them (it adds none)."""
    cats = as_categories(categories)
    texts = cats.label2text()
    if path is None:
        return texts
    renamed = read_json(path)
    if not isinstance(renamed, dict) or not all(isinstance(v, str) and v for v in renamed.values()):
        raise InputError(path, None, None, "expected an object of label -> text")
    renamed.pop(spy.SAFE_LABEL, None)
    for label in renamed:
        if label not in texts:
            raise InputError(path, None, label, cats.unknown_label(label))
    return {**texts, **renamed}


def load_items(path, image_folder, label_texts: dict[str, str] | None = None, categories=None) -> list[dict]:
    """The validated items of a SPY-Tune JSON file (`{"data_list": [...]}`); the first problem raises InputError."""
    items, problems = check_file(path, image_folder, label_texts, categories)
    if problems:
        raise problems[0]
    return items


def check_file(path, image_folder, label_texts: dict[str, str] | None = None,
               categories=None) -> tuple[list, list[InputError]]:
    """(items, the first problem of each bad item). A file that cannot be read as SPY-Tune at all raises."""
    path, image_folder = Path(path), Path(image_folder)
    cats = as_categories(categories)
    label_texts = label_texts or cats.label2text()
    data = read_json(path)
    if not image_folder.is_dir():
        raise InputError(image_folder, None, None, "image folder not found")
    items = data.get("data_list") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise InputError(path, None, "data_list", "missing: expected {\"data_list\": [items]}")
    if not items:
        raise InputError(path, None, "data_list", "no items")
    problems, decoded = [], set()
    for index, item in enumerate(items):
        try:
            check_item(item, path, f"record {index}", label_texts, image_folder, decoded, cats)
        except InputError as problem:
            problems.append(problem)
    return items, problems


def _text_problem(container: dict, field: str) -> str | None:
    """A required string: present, a string, not blank (null would train on the text "None")."""
    if field not in container:
        return "missing field"
    value = container[field]
    if not isinstance(value, str) or not value.strip():
        return f"expected a non-empty string, got {json.dumps(value)}"
    return None


def check_item(item, path, where, label_texts: dict[str, str], image_folder: Path, decoded: set[Path],
               categories: CategorySet | None = None) -> None:
    """Raise InputError on the first problem of one item; `decoded` holds the images already checked."""
    def fail(field, message):
        raise InputError(path, where, field, message)

    if not isinstance(item, dict):
        fail(None, "expected a JSON object")
    for field in ITEM_FIELDS:
        if field not in item:
            fail(field, "missing field")
    label = item["label"]
    if not isinstance(label, str):
        fail("label", f"unknown label {label!r}")
    if label not in label_texts:
        fail("label", as_categories(categories).unknown_label(label, path))
    q = item["question_item"]
    if not isinstance(q, dict):
        fail("question_item", "expected a JSON object")
    for field in QUESTION_FIELDS:
        if problem := _text_problem(q, field):
            fail(f"question_item.{field}", problem)
    if q["respond_ans"] == q["reject_ans"]:
        fail("question_item.reject_ans", "the same text as respond_ans: nothing to prefer")
    other = item.get("other_labels") or {}
    if not isinstance(other, dict):
        fail("other_labels", "expected an object of label -> 0/1")
    if other and label not in other:  # the prompt would lack the item's own instruction
        fail("other_labels", f"does not list the item's label {label!r}")
    for key, value in other.items():
        if key not in label_texts:
            fail(f"other_labels.{key}", as_categories(categories).unknown_label(key, path))
        if key != label and (isinstance(value, bool) or value not in (0, 1)):
            fail(f"other_labels.{key}", f"expected 0 or 1, got {json.dumps(value)}")
        if key == label and (problem := spy.own_label_problem(value)):
            fail(f"other_labels.{key}", problem)
    templates = item.get("instruct_templates")
    if templates is not None:
        if not isinstance(templates, list) or len(templates) != 2:
            fail("instruct_templates", "expected two strings, each with one {} slot")
        for j, template in enumerate(templates):
            if problem := template_problem(template):
                fail(f"instruct_templates[{j}]", problem)
    for kind in ("non_privacy_scenarios", "privacy_scenarios", "chosen_scenarios"):
        scenarios = item.get(kind, [])
        if not isinstance(scenarios, list):
            fail(kind, "expected a list")
        for n, scenario in enumerate(scenarios):
            if not isinstance(scenario, dict):
                fail(f"{kind}[{n}]", "expected a JSON object")
            if problem := _text_problem(scenario, "scenario"):
                fail(f"{kind}[{n}].scenario", problem)
            if problem := template_problem(scenario.get("2nd_person_template")):
                fail(f"{kind}[{n}].2nd_person_template", problem)
    image = inside(image_folder, q["image_path"], path, where, "question_item.image_path")
    if image not in decoded:
        check_image(image, where, "question_item.image_path", source=path)
        decoded.add(image)


def _prompts(item: dict, texts: dict[str, str], add_distractors: bool, scenario: dict | None,
             cats: CategorySet) -> tuple[str, str]:
    """The (non-private, private) prompts of one item in one context."""
    templates = tuple(item.get("instruct_templates") or cats.templates)
    other = item.get("other_labels") if add_distractors else None
    template = scenario["2nd_person_template"] if scenario else None
    question = item["question_item"]["question"]
    return tuple(
        spy.compose_prompt(spy.instruction_block(item["label"], j, texts, other, templates), question, template)
        for j in (0, 1)
    )


def _answers(item: dict, is_privacy: int, scenario_is_privacy: int | None, cats: CategorySet) -> tuple[str, str]:
    """(chosen, rejected) under SPY's rule."""
    q = item["question_item"]
    verdict = spy.expected_verdict(item["label"], is_privacy, scenario_is_privacy, cats)
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


def pairwise_rows(item: dict, texts: dict[str, str], add_distractors: bool, categories=None) -> list[dict]:
    cats, rows = as_categories(categories), []
    for is_privacy, scenario, scenario_is_privacy in _cases(item):
        prompt = _prompts(item, texts, add_distractors, scenario, cats)[is_privacy]
        chosen, rejected = _answers(item, is_privacy, scenario_is_privacy, cats)
        rows.append({"prompt": _user(prompt), "chosen": _assistant(chosen), "rejected": _assistant(rejected)})
    return rows


def sft_rows(item: dict, texts: dict[str, str], add_distractors: bool, categories=None) -> list[dict]:
    return [{"prompt": r["prompt"], "completion": r["chosen"]}
            for r in pairwise_rows(item, texts, add_distractors, categories)]


def nca_p_rows(item: dict, texts: dict[str, str], add_distractors: bool, categories=None) -> list[dict]:
    cats = as_categories(categories)
    contexts = [(None, None)]
    contexts += [(s, 0) for s in item["non_privacy_scenarios"]] + [(s, 1) for s in item["privacy_scenarios"]]
    rows = []
    for scenario, scenario_is_privacy in contexts:
        row = {}
        for j, prompt in enumerate(_prompts(item, texts, add_distractors, scenario, cats)):
            chosen, rejected = _answers(item, j, scenario_is_privacy, cats)
            row.update({f"prompt_{j}": _user(prompt), f"chosen_{j}": _assistant(chosen),
                        f"rejected_{j}": _assistant(rejected)})
        rows.append(row)
    return rows


def helpful_rows(item: dict, texts: dict[str, str], add_distractors: bool, categories=None) -> list[dict]:
    """The SFT cases answered whatever the instruction says: an instruction-tuned model that ignores privacy
    instructions, as Qwen2-VL does (the study's backbone). Like a safety-tuned model it still refuses the absolute
    categories (passports, nudity), so refusing is in its repertoire; what it lacks is following the instruction."""
    q = item["question_item"]
    answer = _assistant(q["reject_ans"] if spy.is_abs(item["label"], categories) else q["respond_ans"])
    return [{"prompt": r["prompt"], "completion": answer}
            for r in pairwise_rows(item, texts, add_distractors, categories)]


def grpo_rows(item: dict, texts: dict[str, str], add_distractors: bool, categories=None) -> list[dict]:
    """The SFT cases as prompts for online RL: what the rewards need to score a sampled answer (the verdict SPY
    expects, the reference answer when it expects one, the question the LLM judge is shown), and whether the category
    is absolute (refused whatever the instruction: GRPO's logged group statistics tell these groups apart)."""
    cats, rows = as_categories(categories), []
    q = item["question_item"]
    for is_privacy, scenario, scenario_is_privacy in _cases(item):
        prompt = _prompts(item, texts, add_distractors, scenario, cats)[is_privacy]
        verdict = spy.expected_verdict(item["label"], is_privacy, scenario_is_privacy, cats)
        rows.append({"prompt": _user(prompt), "expected_verdict": verdict, "question": q["question"],
                     "answer": q["respond_ans"] if verdict == "respond" else q["reject_ans"], "task": "spy",
                     "absolute": spy.is_abs(item["label"], cats)})
    return rows


ROW_BUILDERS = {"sft": sft_rows, "dpo": pairwise_rows, "nca": pairwise_rows, "nca_p": nca_p_rows, "grpo": grpo_rows}


def general_rows(path, image_folder) -> list[dict]:
    """Prompt-completion rows of a general-task file (`{"data_list": [{image_path, question, answer}]}`,
    data_prep/synthetic.py), for SFT."""
    data = read_json(path)
    items = data.get("data_list") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise InputError(path, None, "data_list", "missing or empty: expected {\"data_list\": [items]}")
    rows, decoded = [], set()
    for n, item in enumerate(items):
        for field in ("image_path", "question", "answer"):
            if not isinstance(item, dict) or _text_problem(item, field):
                raise InputError(path, f"record {n}", field, "expected a non-empty string")
        image = inside(image_folder, item["image_path"], path, f"record {n}", "image_path")
        if image not in decoded:
            check_image(image, f"record {n}", "image_path", source=path)
            decoded.add(image)
        rows.append({"images": [str(image)], "prompt": _user(item["question"]),
                     "completion": _assistant(item["answer"]), "p_label": "general"})
    return rows


def general_pair(row: dict, n: int, refusals: list[str], answers: list[str]) -> tuple[dict, dict]:
    """The two rejected answers a general-task question is paired against (chosen: its right answer): a refusal
    (the over-refusal the study counts: a refusal of the SPY data, `refusals`, the n-th in turn) and a wrong answer
    (another answer of the file, `answers`, the n-th in turn; the refusal again where the file has no other)."""
    right = row["completion"][0]["content"]
    wrong = [a for a in answers if a.strip().lower() != right.strip().lower()]
    return _assistant(refusals[n % len(refusals)]), _assistant(wrong[n % len(wrong)] if wrong else refusals[n % len(refusals)])


def general_for(method: str, rows: list[dict], refusals: list[str]) -> list[dict]:
    """General-task rows in a method's columns. SFT: the question and its answer. DPO, NCA: one pair each, chosen = the
    right answer, rejected = a refusal on even rows and a wrong answer on odd ones. NCA-P: a row holds two pairs (its
    non-private and private slots, whose losses add up: losses/nca_p.py); a general question has no instruction to
    vary, so both slots hold the same question and right answer, rejected = a refusal in slot 0 and a wrong answer in
    slot 1: one row = two pairs, as a SPY row is, so the rows' share is the pairs' share. GRPO: a prompt scored by
    exact match."""
    answers = sorted({r["completion"][0]["content"] for r in rows})
    built = []
    for n, row in enumerate(rows):
        base = {"images": row["images"], "p_label": "general"}
        refusal, wrong = general_pair(row, n, refusals, answers)
        if method == "sft":
            built.append(row)
        elif method in ("dpo", "nca"):
            built.append({**base, "prompt": row["prompt"], "chosen": row["completion"],
                          "rejected": refusal if n % 2 == 0 else wrong})
        elif method == "nca_p":
            built.append({**base, "prompt_0": row["prompt"], "prompt_1": row["prompt"], "chosen_0": row["completion"],
                          "chosen_1": row["completion"], "rejected_0": refusal, "rejected_1": wrong})
        else:
            built.append({**base, "prompt": row["prompt"], "expected_verdict": "respond",
                          "question": row["prompt"][0]["content"], "answer": row["completion"][0]["content"],
                          "task": "general", "absolute": False})
    return built


def build_dataset(
    method: str,
    data_path,
    image_folder,
    add_distractors: bool = True,
    label_path=None,
    shuffle: bool = True,
    seed: int = 42,
    num_samples: int | None = None,
    categories=None,
    helpful: bool = False,
    general_path=None,
    general_fraction: float | None = None,
) -> datasets.Dataset:
    """The training (or evaluation) dataset of one method, images decoded lazily from `image_folder`;
    `categories`: a category file (path or CategorySet; default SPY's), `label_path` renames its labels.
    SFT only: `helpful` answers every case (helpful_rows). `general_path` adds a general-task file's rows in the
    method's columns (general_for), `general_fraction` of the rows, the file's rows cycled; SFT without a share: all
    of them."""
    from datasets import Dataset, Image, List  # here, so `validate` starts without importing datasets

    if helpful and method != "sft":
        raise InputError("command line", None, "helpful", f"only SFT trains on it, not {method}")
    cats = as_categories(categories)
    texts = load_label_texts(label_path, cats)
    items = load_items(data_path, image_folder, texts, cats)
    builder = helpful_rows if helpful else ROW_BUILDERS[method]
    rows = []
    for item in items:
        image = str(inside(image_folder, item["question_item"]["image_path"], data_path))
        for row in builder(item, texts, add_distractors, cats):
            rows.append({"images": [image], **row, "p_label": item["label"]})
    if general_path:
        general = general_rows(general_path, image_folder)
        if general_fraction is None:  # SFT without a share (the study's backbone): every row of the file
            picked = general
        else:  # the file's rows cycled, until they are this share of the rows
            wanted = round(len(rows) * general_fraction / (1 - general_fraction))
            picked = [general[i % len(general)] for i in range(wanted)]
        refusals = sorted({item["question_item"]["reject_ans"] for item in items})
        rows += general_for(method, picked, refusals)
    if shuffle:
        random.Random(seed).shuffle(rows)
    if num_samples is not None:
        rows = rows[:num_samples]
    return Dataset.from_list(rows).cast_column("images", List(Image()))


MAX_SHOWN = 20


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python -m data_prep.spy_tune", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    validate = commands.add_parser("validate", help="check a SPY-Tune file and its images, without training")
    validate.add_argument("file", help="SPY-Tune JSON ({\"data_list\": [...]})")
    validate.add_argument("--images", required=True, help="the folder that the items' image_path values are relative to")
    validate.add_argument("--categories", help="category file the data was made with (default: SPY's 67 categories)")
    validate.add_argument("--labels", help="label2text.json renaming some categories (default: their names in the "
                                           "category file)")
    args = parser.parse_args(argv)
    try:
        cats = as_categories(args.categories)
        items, problems = check_file(args.file, args.images, load_label_texts(args.labels, cats), cats)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for problem in problems[:MAX_SHOWN]:
        print(f"error: {problem}", file=sys.stderr)
    if len(problems) > MAX_SHOWN:
        print(f"error: {args.file}: {len(problems) - MAX_SHOWN} more bad items not shown", file=sys.stderr)
    if problems:
        return 2
    images = len({item["question_item"]["image_path"] for item in items})
    print(f"{args.file}: {len(items)} items, {images} images: OK")
    return 0


if __name__ == "__main__":
    run_command(main)
