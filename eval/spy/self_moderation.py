"""Self-moderation baseline (paper §4.1, ../shared/specs/spy.md §2.3): two extra reflection turns.

One conversation per sample, the image only in the first user turn:
  user [image, input_question] -> assistant: the original `response`
  user SELF_MOD_Q2 (quoting the instruction block)  -> `resp_2`
  user SELF_MOD_Q3                                   -> `resp_3`, the answer that is judged
(`spy judge --resp-key resp_3` writes `eval_3`; `spy metrics --key eval_3`).

Unlike the reference it resumes: the output is a run file where a record holding `resp_2` but not yet
`resp_3` is half done, so a killed run continues where it stopped; any backend works.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from cli.errors import InputError, check_image
from cli.paths import inside
from eval.spy.prompts import SELF_MOD_Q2, SELF_MOD_Q3, user_turn
from store.runs import RunFile, read_jsonl


def instruction_part(input_question: str) -> str:
    """The instruction block: everything before the first blank line."""
    return input_question.split("\n\n")[0]


def conversation(record: dict, upto: int) -> list[dict]:
    """The messages asking for turn `upto` (2 or 3) of one sample."""
    messages = [user_turn(record["input_question"]), {"role": "assistant", "content": record["response"]},
                {"role": "user", "content": SELF_MOD_Q2.format(instruction_part(record["input_question"]))}]
    if upto == 3:
        messages += [{"role": "assistant", "content": record["resp_2"]}, {"role": "user", "content": SELF_MOD_Q3}]
    return messages


def load_answered(path, images_dir) -> list[dict]:
    """The records of a generation run; each must have its answer (an empty one is an answer: a model may stop at
    once) and image (else InputError)."""
    records = read_jsonl(path, required=("id", "input_question", "response", "image_path"))
    for n, record in enumerate(records, 1):
        if record.get("error") or not isinstance(record["response"], str):
            raise InputError(path, n, "response", "missing or failed; re-run `spy generate` first")
        check_image(inside(images_dir, record["image_path"], path, n, "image_path"), n, "image_path", source=path)
    return records


def self_moderate(generator, records: list[dict], images_dir, out_path, progress: bool = True,
                  header: dict | None = None, new_run: bool = False) -> list[dict]:
    """Add `resp_2` and `resp_3` to every record, resumably, in `out_path` (records in input order);
    `header` / `new_run` as in store.runs.RunFile."""
    run = RunFile(out_path, header=header, new_run=new_run)
    for turn, field in ((2, "resp_2"), (3, "resp_3")):
        todo = []
        for record in records:
            current = run.get(record["id"])
            if current is not None and current.get("response") != record["response"]:
                current = None  # the round-1 answer changed since: this sample starts again
            if turn == 2 and not isinstance((current or {}).get("resp_2"), str):
                todo.append(record)
            elif turn == 3 and isinstance((current or {}).get("resp_2"), str) and \
                    not isinstance(current.get("resp_3"), str):
                todo.append(current)  # (a failed turn 2 is retried by the next run)
        by_id = {str(r["id"]): r for r in todo}
        requests = [{"id": r["id"], "messages": conversation(r, turn),
                     "images": [str(inside(images_dir, r["image_path"], out_path))]} for r in todo]
        with tqdm(total=len(requests), desc=f"self-moderation turn {turn}", disable=not progress or not todo) as bar:
            for result in generator.generate(requests) if requests else ():
                base = {k: v for k, v in by_id[str(result["id"])].items() if k not in ("error", "resp_3")}
                record = {**base, field: result.get("text")}
                if result.get("error"):
                    record["error"] = f"turn {turn}: {result['error']}"
                run.append(record)
                bar.update()
    return run.finalize([r["id"] for r in records])
