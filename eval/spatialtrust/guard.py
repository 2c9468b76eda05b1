"""SpatialTrustGuard (../shared/specs/spatialtrust.md): staged inference around any Generator, and the baselines.

    one-pass  one request per image answers q1-q5 at once
    staged    1. candidate selection (q1-q3 letters)  ->  3. grounded final generation
    guard     1. candidate selection  ->  2. conservative verification  ->  3. grounded final generation

Each stage is a pure function from model text to state (`parse_selection`, `apply_verification`,
`read_final`), so it is testable without a model. `generate_predictions` drives them: all images go through
a stage together (one batch for the backend), every request and its response is a line of one run file
(`{image}/select`, `{image}/verify/q2/B`, `{image}/final/0`, ...), and a last line per image
(`{"id": image, "stage": "result", ...}`) holds the derived state: the selection, each verification answer,
the verified sets, every final attempt's violations, and the prediction. A killed run resumes from the run
file: finished requests are not sent again and the derived state is recomputed from their responses.
"""

from __future__ import annotations

import re

from cli.errors import InputError
from eval.spatialtrust import prompts
from eval.spatialtrust.data import (
    CATEGORY,
    CHOICE_QIDS,
    DESCRIBES,
    QIDS,
    SET_QIDS,
    exclusive_option,
    normalise_box,
    question,
)
from eval.spatialtrust.parsing import (
    as_box_list,
    extract_json,
    lookup,
    missing,
    option_key,
    parse_box,
    parse_choices,
    parse_one_pass,
)
from store.runs import RunFile

MODES = ("one-pass", "staged", "guard")
DEFAULT_RETRIES = 2  # final-stage attempts after the first
STAGE_ORDER = {"one-pass": 0, "select": 1, "verify": 2, "final": 3, "result": 4}
_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)


def absence_text(qid: str) -> str:
    return f"No visually supported {CATEGORY[qid]} sensitive factor is visible."


# ----------------------------------------------------------------------------------------------- stage 1
def parse_selection(text, record: dict) -> dict:
    """Stage 1 output -> {q1, q2, q3: {"choices"} or {"choices": [], "error"}}: exactly one q1 option, valid
    q2/q3 sets, the exclusive option alone (combined with factors it is dropped: verification checks those)."""
    obj = extract_json(text, keys=CHOICE_QIDS)
    selection = {}
    for qid in CHOICE_QIDS:
        value = lookup(obj, qid)
        if value is None:
            error = "no JSON object" if obj is None else f"no {qid} in the answer"
            selection[qid] = {"choices": [], "error": f"candidate selection: {error}"}
            continue
        choices, error = parse_choices(value, question(record, qid)["options"], single=qid == "q1",
                                       drop_exclusive=True)
        selection[qid] = {"choices": choices, **({"error": f"candidate selection: {error}"} if error else {})}
    return selection


# ----------------------------------------------------------------------------------------------- stage 2
def options_to_verify(record: dict, selection: dict) -> list[tuple[str, str]]:
    """(qid, option) for every selected q2/q3 option except the exclusive one."""
    pairs = []
    for qid in SET_QIDS:
        none = exclusive_option(question(record, qid)["options"])
        if not selection[qid].get("error"):
            pairs += [(qid, option) for option in selection[qid]["choices"] if option != none]
    return pairs


def parse_verdict(text) -> bool:
    """Keep an option only on a clear "yes"; "no", anything unclear or nothing at all removes it."""
    return isinstance(text, str) and bool(m := _YES_NO.match(text)) and m.group(1).lower() == "yes"


def apply_verification(record: dict, selection: dict, keep: dict[tuple[str, str], bool]) -> dict:
    """Deletion only: each q2/q3 set keeps the selected options confirmed in `keep`; q1 is never touched. A set
    left empty becomes "no visually supported factor": the exclusive option where the question has one."""
    verified = {"q1": dict(selection["q1"])}
    for qid in SET_QIDS:
        if selection[qid].get("error"):
            verified[qid] = dict(selection[qid])
            continue
        none = exclusive_option(question(record, qid)["options"])
        kept = [o for o in selection[qid]["choices"] if o == none or keep.get((qid, o), False)]
        verified[qid] = {"choices": kept or ([none] if none else [])}
    return verified


# ----------------------------------------------------------------------------------------------- stage 3
def commitments(verified: dict) -> dict[str, list[str]]:
    """qid -> fixed choices, for the choice questions the earlier stages answered readably."""
    return {qid: list(verified[qid]["choices"]) for qid in CHOICE_QIDS if not verified[qid].get("error")}


def _strict_box(value, record: dict, box_scale: str, where: str, violations: list) -> list | None:
    """A box clipped to the image, or None; a malformed box or one reaching outside the image is a violation."""
    w, h = record["width"], record["height"]
    box = parse_box(value, w, h, box_scale)
    if box is None:
        violations.append(f"{where}: {value!r} is not a box [x1, y1, x2, y2] inside the image")
    elif normalise_box(box, w, h) is None:
        violations.append(f"{where}: {value!r} reaches outside the {w}x{h} image")
        box = normalise_box(box, w, h, clip=True)  # what a repair keeps once retries are spent
    return box


def read_final(text, record: dict, committed: dict, box_scale: str = "pixels") -> tuple[dict, list[str]]:
    """Stage 3 output -> (the q2-q5 predictions it supports, violations).

    The predictions are already repaired: q2/q3 choices are the commitments whatever the model wrote, boxes
    and descriptions of options outside the commitments are dropped, so no new factor can enter. The
    violations (structure: JSON, boxes inside the image; consistency: choices unchanged, every factor tied to
    a verified option, every verified option boxed and described) decide whether the stage is retried.
    """
    obj = extract_json(text, keys=("q2", "q3", "q4", "q5"))
    violations = [] if obj is not None else ["the answer is not a JSON object"]
    parts = {}
    for set_qid in SET_QIDS:
        if set_qid not in committed:
            continue
        free_qid = next(f for f, s in DESCRIBES.items() if s == set_qid)
        options = question(record, set_qid)["options"]
        fixed = committed[set_qid]
        factors_fixed = [o for o in fixed if o != exclusive_option(options)]
        value = lookup(obj, set_qid)
        if lookup(value, "choices") is not None:
            got, error = parse_choices(lookup(value, "choices"), options, single=False)
            if error or got != fixed:
                violations.append(f"{set_qid}: the choices must stay {fixed}, got {lookup(value, 'choices')!r}")
        boxes: dict[str, list] = {}
        raw_boxes = lookup(value, "boxes")
        if raw_boxes is not None and not isinstance(raw_boxes, dict):
            violations.append(f"{set_qid}: boxes must be an object from option letter to a list of boxes")
        for label, raw in (raw_boxes.items() if isinstance(raw_boxes, dict) else ()):
            key = option_key(label, options)
            if key not in factors_fixed:
                violations.append(f"{set_qid}: a box for {label!r}, which is not one of the fixed factors {factors_fixed}")
                continue
            for i, b in enumerate(as_box_list(raw)):
                box = _strict_box(b, record, box_scale, f"{set_qid} box {i} of {key}", violations)
                if box is not None:
                    boxes.setdefault(key, []).append(box)
        factors = []
        entries = lookup(obj, free_qid)
        if isinstance(lookup(entries, "factors"), list):  # {"factors": [...]} instead of the bare list
            entries = lookup(entries, "factors")
        if entries is None:
            entries = []
            if factors_fixed:
                violations.append(f"{free_qid}: missing; describe the fixed factors {factors_fixed}")
        if not isinstance(entries, list):
            violations.append(f"{free_qid}: must be a list of {{option, description, box}} entries")
            entries = []
        for i, entry in enumerate(entries):
            description = lookup(entry, "description")
            key = option_key(str(lookup(entry, "option")), options)
            if key not in factors_fixed:
                violations.append(f"{free_qid}[{i}]: option {lookup(entry, 'option')!r} is not one of the fixed "
                                  f"{CATEGORY[set_qid]} factors {factors_fixed}; it cannot be described")
                continue
            if not isinstance(description, str) or not description.strip():
                violations.append(f"{free_qid}[{i}]: needs a description")
                continue
            box = _strict_box(lookup(entry, "box"), record, box_scale, f"{free_qid}[{i}] box", violations)
            factors.append({"option": key, "description": description.strip(),
                            "box": box if box is not None else (boxes.get(key) or [None])[0]})
        for option in factors_fixed:
            if option not in boxes:
                violations.append(f"{set_qid}: no box for the fixed option {option}")
                own = [f["box"] for f in factors if f["option"] == option and f["box"] is not None]
                if own:  # repair: the box its description gave
                    boxes[option] = own
            if not any(f["option"] == option for f in factors):
                violations.append(f"{free_qid}: the fixed option {option} is not described")
        parts[set_qid] = {"choices": list(fixed), "boxes": boxes}
        if not factors_fixed:
            parts[free_qid] = {"text": absence_text(free_qid), "boxes": []}
        elif factors:
            parts[free_qid] = {"text": " ".join(f["description"] for f in factors), "boxes": [f["box"] for f in factors]}
        else:
            parts[free_qid] = missing(free_qid, "the final stage described none of the fixed factors")
    return parts, violations


def assemble(record: dict, verified: dict, final_parts: dict) -> dict:
    """The prediction record: q1 as selected, q2-q5 from the final stage, or the earlier stage's error."""
    prediction = {"image_id": record["image_id"], "q1": dict(verified["q1"])}
    for set_qid in SET_QIDS:
        free_qid = next(f for f, s in DESCRIBES.items() if s == set_qid)
        if verified[set_qid].get("error"):
            prediction[set_qid] = missing(set_qid, verified[set_qid]["error"])
            prediction[free_qid] = missing(free_qid, f"no {set_qid} answer to describe ({verified[set_qid]['error']})")
        else:
            prediction[set_qid] = final_parts[set_qid]
            prediction[free_qid] = final_parts[free_qid]
    return {"image_id": record["image_id"], **{qid: prediction[qid] for qid in QIDS}}


# ----------------------------------------------------------------------------------------------- driver
def run_header(mode: str, model: str, backend: str, box_scale: str, retries: int, options: dict) -> dict:
    """What makes a guard run's answers (the run file's header): one definition for the CLI and the suite, so a run
    started by one resumes under the other."""
    return {"step": "spatialtrust generate", "mode": mode, "model": model, "backend": backend, "box_scale": box_scale,
            "retries": retries, **{k: options.get(k) for k in ("max_new_tokens", "min_pixels", "max_pixels")}}


def check_run_file(path, mode: str, model: str) -> None:
    """A run file continues only the run that wrote it: same mode, same model."""
    for record in RunFile(path).records():
        for field, value in (("mode", mode), ("model", model)):
            if record.get(field, value) != value:
                raise InputError(path, None, field, f"this run file holds a run with {field} {record[field]!r}, "
                                 f"not {value!r}; pass another --run path")


def _generate(generator, requests: list[dict], run_path, meta: dict, progress: bool) -> RunFile:
    from eval.backends import generate_run

    if requests:
        generate_run(generator, requests, run_path, meta={r["id"]: meta[r["id"]] for r in requests},
                     progress=progress)
    return RunFile(run_path)


def failed_prediction(record: dict, error: str) -> dict:
    return {"image_id": record["image_id"], **{qid: missing(qid, error) for qid in QIDS}}


def generate_predictions(generator, records: list[dict], mode: str, run_path, retries: int = DEFAULT_RETRIES,
                         box_scale: str = "pixels", model: str | None = None, progress: bool = True) -> list[dict]:
    """Run `mode` over every image (resumable through the run file) and return the prediction records.

    An image whose request failed for good in the backend gets a result line with an "error" (its
    prediction counts as unparsable); running the same command again retries it.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    model = model or getattr(generator, "name", "model")
    check_run_file(run_path, mode, model)
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}

    def meta(record, stage, **extra):
        return {"image_id": record["image_id"], "mode": mode, "model": model, "stage": stage, **extra}

    def response(run, request_id, image_id, stage):
        line = run.get(request_id)
        if line is None or line.get("error"):
            failed.setdefault(image_id, f"backend failed at {stage}: {(line or {}).get('error', 'no result')}")
            return None
        return line["response"]

    if mode == "one-pass":
        requests = [prompts.one_pass_request(r, box_scale) for r in records]
        run = _generate(generator, requests, run_path,
                        {q["id"]: meta(r, "one-pass") for q, r in zip(requests, records)}, progress)
        for request, r in zip(requests, records):
            text = response(run, request["id"], r["image_id"], "one-pass")
            if r["image_id"] not in failed:
                results[r["image_id"]] = {"prediction": parse_one_pass(text, r, box_scale)}
    else:
        _staged(generator, records, mode, run_path, retries, box_scale, progress, meta, response, results, failed)

    run = RunFile(run_path)
    lines = []
    for r in records:
        image_id = r["image_id"]
        if image_id in failed:
            lines.append({**meta(r, "result"), "id": image_id, **results.get(image_id, {}),
                          "prediction": failed_prediction(r, failed[image_id]), "error": failed[image_id]})
        else:
            lines.append({**meta(r, "result"), "id": image_id, **results[image_id]})
    run.append_many(lines)
    index = {r["image_id"]: i for i, r in enumerate(records)}
    ordered = sorted(run.records(), key=lambda x: (index.get(x.get("image_id"), len(index)),
                                                   STAGE_ORDER.get(x.get("stage"), 9), x.get("attempt", 0),
                                                   str(x["id"])))
    run.finalize([x["id"] for x in ordered])
    return [line["prediction"] for line in lines]


def _staged(generator, records, mode, run_path, retries, box_scale, progress, meta, response, results, failed):
    """Stages 1 (and 2 in guard mode) and 3 for every image; fills `results` and `failed`."""
    # 1. candidate selection
    requests = [prompts.selection_request(r) for r in records]
    run = _generate(generator, requests, run_path, {q["id"]: meta(r, "select") for q, r in zip(requests, records)},
                    progress)
    state = {}
    for r in records:
        text = response(run, f"{r['image_id']}/select", r["image_id"], "select")
        if text is not None:
            selection = parse_selection(text, r)
            state[r["image_id"]] = {"selection": selection, "verified": selection}
    alive = [r for r in records if r["image_id"] in state]

    # 2. conservative verification (guard only)
    if mode == "guard":
        requests, request_meta = [], {}
        for r in alive:
            for qid, option in options_to_verify(r, state[r["image_id"]]["selection"]):
                request = prompts.verification_request(r, qid, option)
                requests.append(request)
                request_meta[request["id"]] = meta(r, "verify", qid=qid, option=option)
        run = _generate(generator, requests, run_path, request_meta, progress)
        for r in alive:
            s = state[r["image_id"]]
            answers, keep = {}, {}
            for qid, option in options_to_verify(r, s["selection"]):
                text = response(run, f"{r['image_id']}/verify/{qid}/{option}", r["image_id"], "verify")
                answers[f"{qid}/{option}"] = "yes" if parse_verdict(text) else "no"
                keep[(qid, option)] = parse_verdict(text)
            s["verification"] = answers
            s["verified"] = apply_verification(r, s["selection"], keep)
        alive = [r for r in alive if r["image_id"] not in failed]

    # 3. grounded final generation, retried while it breaks the rules
    for r in alive:
        s = state[r["image_id"]]
        s["committed"] = commitments(s["verified"])
        s["attempts"] = []
    need_final = [r for r in alive if set(SET_QIDS) & set(state[r["image_id"]]["committed"])]
    for attempt in range(retries + 1):
        todo = [r for r in need_final if r["image_id"] not in failed and len(state[r["image_id"]]["attempts"]) == attempt
                and (attempt == 0 or state[r["image_id"]]["attempts"][-1]["violations"])]
        requests, request_meta = [], {}
        for r in todo:
            s = state[r["image_id"]]
            history = [(a["response"] or "", prompts.retry_text(a["violations"])) for a in s["attempts"]]
            request = prompts.final_request(r, s["committed"], attempt, history, box_scale)
            requests.append(request)
            request_meta[request["id"]] = meta(r, "final", attempt=attempt)
        run = _generate(generator, requests, run_path, request_meta, progress)
        for r in todo:
            text = response(run, f"{r['image_id']}/final/{attempt}", r["image_id"], "final")
            if text is not None:
                parts, violations = read_final(text, r, state[r["image_id"]]["committed"], box_scale)
                state[r["image_id"]]["attempts"].append({"response": text, "violations": violations, "parts": parts})

    for r in alive:
        s = state[r["image_id"]]
        if r["image_id"] in failed:
            continue
        last = s["attempts"][-1] if s["attempts"] else {"parts": {}, "violations": []}
        results[r["image_id"]] = {
            "selection": s["selection"],
            **({"verification": s["verification"], "verified": s["verified"]} if mode == "guard" else {}),
            "final_attempts": [{"attempt": i, "violations": a["violations"]} for i, a in enumerate(s["attempts"])],
            "repaired": bool(last["violations"]),
            "prediction": assemble(r, s["verified"], last["parts"]),
        }
