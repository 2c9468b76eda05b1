"""The q4/q5 judge: structured verdicts through JudgeClient and a real local server; resumable; one repair turn."""

import json
import random

import pytest
from chat_server import ChatServer, last_user_text

from eval.judge import JudgeClient
from eval.spatialtrust import data
from eval.spatialtrust.judge import judge_items, judge_run, parse_judge_verdict
from eval.spatialtrust.prompts import judge_prompt
from eval.spatialtrust.scoring import compute_metrics
from store.runs import read_jsonl


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("st")
    return [data.synthetic_record(i, random.Random(i), 120, 80, out) for i in range(4)]


def predictions_for(records):
    return [{"image_id": r["image_id"], "q4": {"text": "Someone watches.", "boxes": [[1, 1, 9, 9]]},
             "q5": {"text": "", "boxes": [], "error": "unparsable"}} for r in records]


def verdict_for(request, **override):
    prompt = request["messages"][0]["content"]  # the judge prompt, also under a corrective turn
    n = int(prompt.split("There are exactly ")[1].split()[0])
    return json.dumps({"unsupported": False, "states_absence": n == 0,
                       "factors": [{"identified": True, "explanation_correct": True, "box_index": 0}] * n, **override})


def client(server, cache=None):
    return JudgeClient("judge", base_url=server.base_url, api_key_env="SPATIALTRUST_TEST_NO_KEY", max_retries=0,
                       cache_path=cache)


def test_parse_judge_verdict():
    good = {"unsupported": "false", "states_absence": False,
            "factors": [{"identified": True, "explanation_correct": "true", "box_index": "1"},
                        {"identified": False, "explanation_correct": False, "box_index": -1}]}
    assert parse_judge_verdict("```json\n" + json.dumps(good) + "\n```", 2) == ({
        "unsupported": False, "states_absence": False,
        "factors": [{"identified": True, "explanation_correct": True, "box_index": 1},
                    {"identified": False, "explanation_correct": False, "box_index": None}]}, None)
    assert parse_judge_verdict(json.dumps(good), 3)[1].startswith("factors must be a list of exactly 3")
    assert parse_judge_verdict(json.dumps({**good, "unsupported": "maybe"}), 2)[1] == "unsupported must be true or false"
    assert parse_judge_verdict("I think it is fine", 2) == (None, "no JSON object")
    assert parse_judge_verdict(None, 0) == (None, "no JSON object")


def test_the_prompt_shows_truth_and_numbered_boxes(records):
    r = next(r for r in records if data.question(r, "q4")["evidence"])
    prompt = judge_prompt(r, "q4", {"text": "A person.", "boxes": [[1, 2, 3, 4], None]})
    q4 = data.question(r, "q4")
    assert f"0. {q4['evidence'][0]['factor']}" in prompt and q4["answer"] in prompt
    assert "0. [1, 2, 3, 4]\n1. null" in prompt and f"exactly {len(q4['evidence'])} ground-truth" in prompt


def test_unreadable_predictions_are_not_sent(records):
    items = judge_items(records, predictions_for(records))
    assert [i["qid"] for i in items] == ["q4"] * len(records)


def test_a_malformed_verdict_gets_one_corrective_turn(records, tmp_path):
    def reply(request):
        if len(request["messages"]) == 1:
            return '{"unsupported": false, "states_absence": false, "factors": []}' if "exactly 0" not in \
                last_user_text(request) else verdict_for(request)
        return verdict_for(request)

    with ChatServer(reply) as server:
        lines = judge_run(client(server), records, predictions_for(records), tmp_path / "v.jsonl", progress=False)
        corrective = [req for req in server.requests if len(req["messages"]) == 3]
    assert not any(line.get("error") for line in lines) and len(lines) == len(records)
    assert corrective and "not usable: factors must be a list" in corrective[0]["messages"][2]["content"]


def test_a_verdict_that_stays_malformed_is_an_error_counted_as_unjudged(records, tmp_path):
    with ChatServer(lambda request: "no idea") as server:
        lines = judge_run(client(server), records, predictions_for(records), tmp_path / "v.jsonl", progress=False)
        distinct = {judge_prompt(r, "q4", p["q4"]) for r, p in zip(records, predictions_for(records))}
        assert len(server.requests) == 2 * len(distinct)  # identical prompts are asked once
    assert all(line["error"] == "judge answer: no JSON object" for line in lines)
    metrics = compute_metrics(records, predictions_for(records), lines)
    assert metrics["unjudged"] == {"q4": len(records), "q5": 0} and metrics["q4"] == 0.0


def test_a_killed_judge_run_resumes_without_asking_twice(records, tmp_path):
    predictions = [{"image_id": r["image_id"], "q4": {"text": "x", "boxes": []}, "q5": {"text": "y", "boxes": []}}
                   for r in records]
    with ChatServer(verdict_for) as server:
        full = judge_run(client(server), records, predictions, tmp_path / "full.jsonl", progress=False)
    text = (tmp_path / "full.jsonl").read_text().splitlines()
    (tmp_path / "part.jsonl").write_text("\n".join(text[:4]) + "\n" + text[4][:10])  # header, 3 lines, a torn 4th
    with ChatServer(verdict_for) as server:
        resumed = judge_run(client(server), records, predictions, tmp_path / "part.jsonl", progress=False)
        assert len(server.requests) == len(full) - 3
    assert resumed == full == read_jsonl(tmp_path / "part.jsonl")
    # with a cache, a fresh judgments file costs no request at all
    with ChatServer(verdict_for) as server:
        judge_run(client(server, tmp_path / "cache.jsonl"), records, predictions, tmp_path / "a.jsonl", progress=False)
        n = len(server.requests)
        judge_run(client(server, tmp_path / "cache.jsonl"), records, predictions, tmp_path / "b.jsonl", progress=False)
        assert len(server.requests) == n
