"""OCRBench (echo840/OCRBench, 1000 items): loading, the Qwen2-VL prompt of VLMEvalKit, and the official score.

An item scores 1 when any of its acceptable answers is found in the response: a case-insensitive substring
match, except for handwritten mathematical expressions, which match case-sensitively with all spaces removed
from both sides (LaTeX answers are spaced arbitrarily). Each category is capped at its item count on the
real benchmark, so the score is out of 1000.
"""

from __future__ import annotations

from cli.errors import InputError
from eval.general import common

NAME = "ocrbench"
HUB_ID = "echo840/OCRBench"
SPLITS = ("test",)
IMAGE_COLUMNS = ["image"]
REQUIRED = ("question", "question_type", "answer", "image")
HME = "Handwritten Mathematical Expression Recognition"
TEXT_RECOGNITION = (
    "Regular Text Recognition", "Irregular Text Recognition", "Artistic Text Recognition", "Handwriting Recognition",
    "Digit String Recognition", "Non-Semantic Text Recognition",
)
# category -> its number of items on the real benchmark, which is also its maximum score
CAPS = {
    **{c: 50 for c in TEXT_RECOGNITION},
    "Scene Text-centric VQA": 200, "Doc-oriented VQA": 200, "Key Information Extraction": 200, HME: 100,
}
# The five lines of VLMEvalKit's score file: the six recognition categories are reported as one.
GROUPS = {
    "Text Recognition": TEXT_RECOGNITION, "Scene Text-centric VQA": ("Scene Text-centric VQA",),
    "Doc-oriented VQA": ("Doc-oriented VQA",), "Key Information Extraction": ("Key Information Extraction",),
    HME: (HME,),
}
PROMPT_SUFFIX = "\nPlease try to answer the question with short words or phrases if possible."


def load(source: str | None = None, limit: int | None = None):
    return common.load_test_split(source, HUB_ID, SPLITS, REQUIRED, limit)


def items(ds, source="OCRBench") -> list[dict]:
    columns = [c for c in ("dataset", "question", "question_type", "answer") if c in ds.column_names]
    out = []
    # OCRBench has no id column; the row number is stable for a given copy of the dataset.
    for index, row in enumerate(ds.select_columns(columns).to_list()):
        if row["question_type"] not in CAPS:
            raise InputError(source, f"row {index}", "question_type", f"unknown category {row['question_type']!r}")
        answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
        out.append({
            "id": str(index), "dataset": row.get("dataset"), "category": row["question_type"],
            "answers": [str(a) for a in answers], "prompt": row["question"] + PROMPT_SUFFIX,
        })
    return out


def request(item: dict, row: dict) -> dict:
    content = [{"type": "image"}, {"type": "text", "text": item["prompt"]}]
    return {"id": item["id"], "messages": [{"role": "user", "content": content}], "images": [common.rgb(row["image"])]}


def is_hit(category: str, answers: list[str], response: str | None) -> bool:
    response = response or ""
    for answer in answers:
        if category == HME:
            gold = answer.strip().replace("\n", " ").replace(" ", "")
            predicted = response.strip().replace("\n", " ").replace(" ", "")
        else:
            gold = answer.lower().strip().replace("\n", " ")
            predicted = response.lower().strip().replace("\n", " ")
        if gold in predicted:
            return True
    return False


RUN_FIELDS = ("category", "answers")


def check(record: dict):
    if record["category"] not in CAPS:
        return "category", f"unknown OCRBench category {record['category']!r}"
    if not isinstance(record["answers"], list):
        return "answers", "expected a list of acceptable answers"
    return None


def score(records: list[dict]) -> dict:
    """Hits per category, capped; `score` = the sum, out of 1000 on the full benchmark."""
    judged = [{"id": r["id"], "category": r["category"], "hit": is_hit(r["category"], r["answers"], r["response"])}
              for r in records]
    categories = {}
    for category, cap in CAPS.items():
        rows = [j for j in judged if j["category"] == category]
        if rows:
            hits = sum(j["hit"] for j in rows)
            categories[category] = {"n": len(rows), "hits": hits, "cap": cap, "score": min(hits, cap)}
    unknown = sorted({j["category"] for j in judged} - set(CAPS))
    if unknown:
        raise ValueError(f"unknown OCRBench categories {unknown}")
    groups = {g: sum(categories[c]["score"] for c in members if c in categories) for g, members in GROUPS.items()}
    total = sum(c["score"] for c in categories.values())
    return {
        "benchmark": NAME, "n": len(records), "n_failed": common.count_failed(records), "score": total,
        "final_score_norm": total / 10, "groups": groups, "categories": categories,
        "over_cap": sorted(c for c, v in categories.items() if v["n"] > v["cap"]), "items": judged,
    }
