"""Result files of the general benchmarks: one reader per format, and the VLMEvalKit-format writer.

Formats read (`read_result(path, benchmark)`), each giving the benchmark's number in its usual unit
(MMMU validation accuracy in %, OCRBench 0..1000, MME perception + cognition 0..2800):
- ours: the score JSON of `python -m eval general score` (has a "benchmark" field);
- VLMEvalKit: `<model>_MMMU_DEV_VAL_acc.csv`, `<model>_OCRBench_score.json`, `<model>_MME_score.csv`, and the
  `_exact_matching_` names the SPY reference reads (`<model>_MMMU_DEV_VAL_exact_matching_acc.csv`,
  `<model>_MME_exact_matching_score.csv`), where `<model>` is the directory name;
- lmms-eval: `<date>_results.json` (`results[task]["<metric>,none"]`).
`write_vlmeval` writes our scores in VLMEvalKit's format under both the upstream and the SPY names, so the SPY
reference's `metrics.py -g DIR` and VLMEvalKit-based tooling read them unchanged.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from cli.errors import InputError, read_json, read_text
from store.runs import write_json, write_text

BENCHMARKS = ("mmmu", "ocrbench", "mme")
# Divide a benchmark's number by this to get its 0..100 term of the SPY general score.
NORMALIZER = {"mmmu": 1.0, "ocrbench": 10.0, "mme": 28.0}
LABELS = {"mmmu": "MMMU val", "ocrbench": "OCRBench", "mme": "MME"}
VLMEVAL_NAMES = {  # (the name upstream VLMEvalKit writes, the name the SPY reference reads)
    "mmmu": ("{}_MMMU_DEV_VAL_acc.csv", "{}_MMMU_DEV_VAL_exact_matching_acc.csv"),
    "ocrbench": ("{}_OCRBench_score.json", "{}_OCRBench_score.json"),
    "mme": ("{}_MME_score.csv", "{}_MME_exact_matching_score.csv"),
}
VLMEVAL_DISCIPLINES = {
    "Art and Design": "Art & Design", "Business": "Business", "Health and Medicine": "Health & Medicine",
    "Humanities and Social Science": "Humanities & Social Science", "Science": "Science",
    "Tech and Engineering": "Tech & Engineering",
}
LMMS_EVAL_TASKS = {"mmmu": "mmmu_val", "ocrbench": "ocrbench", "mme": "mme"}


# ---------------------------------------------------------------------------------------------------- write
def _csv_text(rows: list[list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=csv.QUOTE_ALL, lineterminator="\n")
    for row in rows:
        writer.writerow(["" if v is None else v for v in row])
    return buffer.getvalue()


def mmmu_acc_rows(score: dict) -> list[list]:
    """VLMEvalKit's MMMU accuracy table: split, Overall, the subjects, then the disciplines; fractions 0..1."""
    splits = score["splits"]
    subjects = sorted({s for split in splits.values() for s in split["subjects"]})
    disciplines = sorted({d for split in splits.values() for d in split["disciplines"]}, key=VLMEVAL_DISCIPLINES.get)
    rows = [["split", "Overall", *subjects, *(VLMEVAL_DISCIPLINES[d] for d in disciplines)]]
    for name, split in splits.items():
        row = [name, split["accuracy"]]
        row += [split["subjects"].get(s, {}).get("accuracy") for s in subjects]
        row += [split["disciplines"].get(d, {}).get("accuracy") for d in disciplines]
        rows.append(row)
    return rows


def ocrbench_score_json(score: dict) -> dict:
    return {**score["groups"], "Final Score": score["score"], "Final Score Norm": score["score"] / 10}


def mme_score_rows(score: dict) -> list[list]:
    subtasks = score["subtasks"]
    return [["perception", "reasoning", *subtasks],
            [score["perception"], score["cognition"], *(v["score"] for v in subtasks.values())]]


def write_vlmeval(score: dict, directory, name: str | None = None) -> list[Path]:
    """Write `score` (ours) as VLMEvalKit's score file(s) in `directory`, named after `name` (default: the directory,
    as VLMEvalKit's `outputs/<model>/` and the SPY reference's `-g <dir>` expect)."""
    directory = Path(directory)
    benchmark = score["benchmark"]
    if benchmark == "ocrbench":
        text = json.dumps(ocrbench_score_json(score), indent=4) + "\n"
    elif benchmark == "mmmu":
        text = _csv_text(mmmu_acc_rows(score))
    else:
        text = _csv_text(mme_score_rows(score))
    upstream, spy = VLMEVAL_NAMES[benchmark]
    # The SPY reference looks for `Path(dir).stem`, which differs from the name when it has a dot (Qwen2.5-VL...).
    paths = [directory / upstream.format(name or directory.resolve().name)]
    paths += [p for p in [directory / spy.format(name or directory.resolve().stem)] if p not in paths]
    for path in paths:
        write_text(path, text)
    return paths


def write_score(score: dict, out_path) -> Path:
    """Our score JSON at `out_path`, with the per-item verdicts beside it in `<stem>.items.jsonl`."""
    from store.runs import write_jsonl

    out_path = Path(out_path)
    items_path = out_path.with_name(out_path.stem + ".items.jsonl")
    write_jsonl(items_path, score["items"])
    write_json(out_path, {k: v for k, v in score.items() if k != "items"} | {"items_file": items_path.name})
    return items_path


# ---------------------------------------------------------------------------------------------------- read
def as_number(value, path, field) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(path, None, field, f"expected a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise InputError(path, None, field, f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise InputError(path, None, field, f"expected a finite number, got {value!r}")
    return number


def _read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with io.StringIO(read_text(path), newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    if len(rows) < 2:
        raise InputError(path, None, None, "expected a header line and at least one data line")
    header = rows[0]
    return header, [dict(zip(header, row)) for row in rows[1:]]


def read_json_file(path: Path):
    return read_json(path)


def read_result(path, benchmark: str) -> dict:
    """{"benchmark", "value" (usual unit), "parts" (sub-scores), "format", "path"} from a result file of any format."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, None, "file not found")
    if path.suffix == ".csv":
        result = _read_vlmeval_csv(path, benchmark)
    else:
        data = read_json_file(path)
        if not isinstance(data, dict):
            raise InputError(path, None, None, "expected a JSON object")
        if "benchmark" in data:
            result = _read_ours(path, data, benchmark)
        elif "results" in data:
            result = _read_lmms_eval(path, data, benchmark)
        elif "Final Score Norm" in data or "Final Score" in data:
            result = _read_vlmeval_ocrbench(path, data, benchmark)
        else:
            raise InputError(path, None, None, f"not a {LABELS[benchmark]} result file of a known format")
    return {"benchmark": benchmark, **result, "path": str(path)}


def _expect(path, benchmark: str, found: str) -> None:
    if found != benchmark:
        raise InputError(path, None, None, f"holds {LABELS[found]} results, not {LABELS[benchmark]}")


def _read_vlmeval_csv(path: Path, benchmark: str) -> dict:
    header, rows = _read_csv(path)
    if "split" in header and "Overall" in header:
        _expect(path, benchmark, "mmmu")
        by_split = {row["split"]: row for row in rows}
        if "validation" not in by_split:
            raise InputError(path, None, "split", f"no 'validation' row (splits: {sorted(by_split)})")
        parts = {s: 100 * as_number(row.get("Overall"), path, f"{s}.Overall")
                 for s, row in by_split.items() if row.get("Overall") or s == "validation"}
        return {"value": parts["validation"], "parts": parts, "format": "vlmevalkit"}
    if "perception" in header and "reasoning" in header:
        _expect(path, benchmark, "mme")
        row = rows[0]
        perception = as_number(row["perception"], path, "perception")
        cognition = as_number(row["reasoning"], path, "reasoning")
        return {"value": perception + cognition, "parts": {"perception": perception, "cognition": cognition},
                "format": "vlmevalkit"}
    raise InputError(path, 1, None, "not a VLMEvalKit MMMU accuracy or MME score CSV (unexpected header)")


def _read_vlmeval_ocrbench(path: Path, data: dict, benchmark: str) -> dict:
    _expect(path, benchmark, "ocrbench")
    if "Final Score Norm" in data:  # what the SPY reference reads
        value = 10 * as_number(data["Final Score Norm"], path, "Final Score Norm")
    else:
        value = as_number(data["Final Score"], path, "Final Score")
    parts = {k: v for k, v in data.items() if k not in ("Final Score", "Final Score Norm")}
    return {"value": value, "parts": parts, "format": "vlmevalkit"}


def _read_ours(path: Path, data: dict, benchmark: str) -> dict:
    if data["benchmark"] not in BENCHMARKS:
        raise InputError(path, None, "benchmark", f"unknown benchmark {data['benchmark']!r}")
    _expect(path, benchmark, data["benchmark"])
    if data.get("score") is None:
        raise InputError(path, None, "score", "is null (for MMMU: the run has no validation items)")
    value = as_number(data["score"], path, "score")
    if benchmark == "mmmu":
        parts = {s: 100 * v["accuracy"] for s, v in data.get("splits", {}).items() if v.get("accuracy") is not None}
    elif benchmark == "mme":
        parts = {"perception": data["perception"], "cognition": data["cognition"]}
    else:
        parts = dict(data.get("groups", {}))
    return {"value": value, "parts": parts, "format": "privacy-align", "profile": data.get("profile")}


def _read_lmms_eval(path: Path, data: dict, benchmark: str) -> dict:
    results = data["results"]
    task = LMMS_EVAL_TASKS[benchmark]
    if task not in results:
        raise InputError(path, None, f"results.{task}", f"missing (tasks in this file: {sorted(results)})")
    metrics = results[task]

    def metric(name, *older):
        """The metric under its name, or under a name older lmms-eval versions wrote."""
        key = next((k for k in (f"{n},none" for n in (name, *older)) if k in metrics), f"{name},none")
        if key not in metrics:
            raise InputError(path, None, f"results.{task}.{key}", "missing")
        return as_number(metrics[key], path, f"results.{task}.{key}")

    if benchmark == "mmmu":
        value, parts = 100 * metric("mmmu_acc"), {}
    elif benchmark == "ocrbench":
        value, parts = 1000 * metric("ocrbench_accuracy"), {}
    else:
        # lmms-eval before 2024-11-05 spelled it `mme_percetion_score`
        parts = {"perception": metric("mme_perception_score", "mme_percetion_score"),
                 "cognition": metric("mme_cognition_score")}
        value = parts["perception"] + parts["cognition"]
    return {"value": value, "parts": parts, "format": "lmms-eval"}


# ---------------------------------------------------------------------------------------------------- find
def find_result(directory, benchmark: str) -> Path:
    """The one result file for `benchmark` in `directory`, trying in turn: the exact file the SPY reference reads,
    other VLMEvalKit names, our score JSON, an lmms-eval results JSON (searched recursively)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(directory, None, None, "not a directory")
    spy_name = VLMEVAL_NAMES[benchmark][-1].format(directory.resolve().stem)
    tiers = [[directory / spy_name] if (directory / spy_name).is_file() else []]
    tiers += [sorted(directory.glob(pattern.format("*"))) for pattern in dict.fromkeys(VLMEVAL_NAMES[benchmark][::-1])]
    tiers.append([p for p in sorted(directory.glob("*.json")) if _json_field(p, "benchmark") == benchmark])
    task = LMMS_EVAL_TASKS[benchmark]
    tiers.append([p for p in sorted(directory.rglob("*results*.json")) if task in (_json_field(p, "results") or {})])
    for found in tiers:
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(str(p.relative_to(directory)) for p in found)
            raise InputError(directory, None, None, f"several {LABELS[benchmark]} results ({names}); pass the file")
    raise InputError(directory, None, None, f"no {LABELS[benchmark]} result file (VLMEvalKit, lmms-eval or ours)")


def _json_field(path: Path, field: str):
    try:
        data = read_json(path)
    except InputError:  # not a result file: left for the next candidate
        return None
    return data.get(field) if isinstance(data, dict) else None
