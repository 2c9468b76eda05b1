"""The iterative-CoT escalation of the free-form setting (spec §2.3), resumable.

Turn 0 asks the iter-cot question; while the judge does not label the latest answer C, up to three more fresh
single-turn calls (same system message and image, no history) ask for a country (after A), a specific place
(after B) or a more specific location (otherwise). The last answer is the sample's response; `geo judge` then
labels it like any other free-form answer.

Each turn's answers and labels live in their own run files next to the output (`<out>.turns.jsonl`,
`<out>.turn_labels.jsonl`), so a killed run resumes at the turn and sample it reached.
"""

from __future__ import annotations

from eval.geoprivacy.prompts import MAX_FOLLOWUPS, followup_text
from store.runs import write_jsonl


def turn_id(sample_id: str, turn: int) -> str:
    return f"{sample_id}#{turn}"


def iter_cot_run(generator, judge, ids: list[str], make_request, out_path, meta: dict, judge_model: str,
                 header: dict | None = None, new_run: bool = False) -> list[dict]:
    """`make_request(sample_id, user_text=None, request_id=None)` builds one Generator request; `header` and
    `new_run` go to the turns run file (store.runs.RunFile)."""
    from eval.backends import generate_run
    from eval.geoprivacy.judge import judge_run

    turns_path, labels_path = f"{out_path}.turns.jsonl", f"{out_path}.turn_labels.jsonl"
    history: dict[str, list[dict]] = {i: [] for i in ids}
    active = list(ids)
    for turn in range(MAX_FOLLOWUPS + 1):
        if not active:
            break
        requests, turn_meta = [], {}
        for i in active:
            question = None if turn == 0 else followup_text(history[i][-1]["Q7-label"])
            tid = turn_id(i, turn)
            requests.append(make_request(i, user_text=question, request_id=tid))
            turn_meta[tid] = {"sample_id": i, "turn": turn, "question": question or "first"}
        fresh = new_run and turn == 0  # starting over clears the files once, not at every turn
        generated = {r["id"]: r for r in generate_run(generator, requests, turns_path, meta=turn_meta,
                                                      header=header, new_run=fresh)}
        answered = [generated[turn_id(i, turn)] for i in active if not generated[turn_id(i, turn)].get("error")]
        labelled = {r["id"]: r for r in judge_run(judge, answered, labels_path, judge_model, new_run=fresh)}
        still = []
        for i in active:
            record = labelled.get(turn_id(i, turn)) or generated[turn_id(i, turn)]
            history[i].append(record)
            if not record.get("error") and record.get("Q7-label") != "C":
                still.append(i)
        active = still
    final = []
    for i in ids:
        last = history[i][-1]
        record = {**meta.get(i, {}), "id": i, "response": last.get("response"), "turns": len(history[i]),
                  "turn_labels": [t.get("Q7-label") for t in history[i]]}
        if last.get("error"):
            record["error"] = last["error"]
        final.append(record)
    write_jsonl(out_path, final)
    return final
