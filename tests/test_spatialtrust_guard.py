"""SpatialTrustGuard against a real local chat-completions server with scripted answers (no mock objects)."""

import json

import pytest
from chat_server import ChatServer, Reply
from spatialtrust_fixtures import Oracle, final_answer

from cli.errors import InputError
from eval.backends import load_generator
from eval.spatialtrust import data, guard
from eval.spatialtrust.data import question
from store.runs import RunFile, read_jsonl


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = data.build_synthetic(tmp_path_factory.mktemp("st"), n_images=4, width=120, height=80)
    return data.load(path, check_images=True)


def generator(server, **options):
    return load_generator("openai", "scripted", base_url=server.base_url, api_key_env="SPATIALTRUST_TEST_NO_KEY",
                          max_retries=0, timeout=10, **options)


def run(server, records, mode, path, **kwargs):
    with generator(server) as gen:
        return guard.generate_predictions(gen, records, mode, path, progress=False, **kwargs)


def both(records):
    """An image with direct and indirect factors."""
    return next(r for r in records if question(r, "q2")["evidence"] and question(r, "q3")["evidence"])


# ----------------------------------------------------------------------------------------------- pure stages
def test_verification_can_only_remove_and_never_touches_q1(records):
    r = both(records)
    selection = {"q1": {"choices": ["B"]}, "q2": {"choices": ["A", "B"]}, "q3": {"choices": ["C"]}}
    # "keep" even says yes to options nobody selected: they must not appear
    keep = {("q2", "A"): True, ("q2", "B"): False, ("q2", "C"): True, ("q3", "A"): True, ("q3", "C"): False}
    verified = guard.apply_verification(r, selection, keep)
    assert verified == {"q1": {"choices": ["B"]}, "q2": {"choices": ["A"]}, "q3": {"choices": ["D"]}}
    assert guard.options_to_verify(r, selection) == [("q2", "A"), ("q2", "B"), ("q3", "C")]
    assert guard.options_to_verify(r, {**selection, "q2": {"choices": ["D"]}}) == [("q3", "C")]


@pytest.mark.parametrize("text,keep", [("Yes", True), ("yes, clearly.", True), ("**Yes**", True), ("No", False),
                                       ("Not sure", False), ("", False), (None, False), ("Yesterday", False)])
def test_only_a_clear_yes_keeps_an_option(text, keep):
    assert guard.parse_verdict(text) is keep


def test_selection_normalises_and_drops_the_exclusive_option_next_to_factors(records):
    r = both(records)
    s = guard.parse_selection('{"q1": "Yes", "q2": ["b", "D"], "q3": "None of the above"}', r)
    assert s == {"q1": {"choices": ["A"]}, "q2": {"choices": ["B"]}, "q3": {"choices": ["D"]}}
    s = guard.parse_selection('{"q1": ["A", "B"], "q2": []}', r)
    assert s["q1"]["error"] and s["q2"]["error"] and s["q3"]["error"] == "candidate selection: no q3 in the answer"


def test_final_stage_cannot_introduce_a_factor(records):
    r = both(records)
    committed = {"q1": ["A"], "q2": ["A"], "q3": ["D"]}
    answer = {"q2": {"choices": ["A", "C"], "boxes": {"A": [[1, 1, 20, 20]], "C": [[30, 30, 40, 40]]}},
              "q3": {"choices": ["B"], "boxes": {"B": [[5, 5, 9, 9]]}},
              "q4": [{"option": "A", "description": "a watcher", "box": [1, 1, 20, 20]},
                     {"option": "C", "description": "a wall camera", "box": [30, 30, 40, 40]}],
              "q5": [{"option": "B", "description": "a window", "box": [5, 5, 9, 9]}]}
    parts, violations = guard.read_final(json.dumps(answer), r, committed)
    assert parts == {"q2": {"choices": ["A"], "boxes": {"A": [[1.0, 1.0, 20.0, 20.0]]}},
                     "q4": {"text": "a watcher", "boxes": [[1.0, 1.0, 20.0, 20.0]]},
                     "q3": {"choices": ["D"], "boxes": {}},
                     "q5": {"text": "No visually supported indirect sensitive factor is visible.", "boxes": []}}
    assert len(violations) == 6 and any("q4[1]: option 'C'" in v for v in violations)


def test_final_stage_structure_violations_and_repairs(records):
    r = both(records)
    committed = {"q2": ["A", "B"]}
    answer = {"q2": {"boxes": {"A": [[-5, 1, 20, 20]]}},
              "q4": [{"option": "A", "description": "a watcher", "box": "oops"},
                     {"option": "B", "description": "a phone", "box": [50, 50, 60, 60]}]}
    parts, violations = guard.read_final(json.dumps(answer), r, committed)
    # the clipped q2 box stands in for A's malformed description box; B's description box grounds q2's B
    assert parts == {"q2": {"choices": ["A", "B"], "boxes": {"A": [[0.0, 1.0, 20.0, 20.0]], "B": [[50.0, 50.0, 60.0, 60.0]]}},
                     "q4": {"text": "a watcher a phone", "boxes": [[0.0, 1.0, 20.0, 20.0], [50.0, 50.0, 60.0, 60.0]]}}
    assert [v.split(":")[0] for v in violations] == ["q2 box 0 of A", "q4[0] box", "q2"]
    parts, violations = guard.read_final("garbage", r, committed)
    assert parts["q2"] == {"choices": ["A", "B"], "boxes": {}} and parts["q4"]["error"]
    assert violations[0] == "the answer is not a JSON object"


# ----------------------------------------------------------------------------------------------- full runs
def test_perfect_scripted_model_and_the_run_file(records, tmp_path):
    oracle = Oracle(records)
    with ChatServer(oracle) as server:
        predictions = run(server, records, "guard", tmp_path / "run.jsonl")
    for r, p in zip(records, predictions):
        for qid in ("q1", "q2", "q3"):
            assert p[qid]["choices"] == question(r, qid)["answer"]
        for qid in ("q2", "q3"):
            for ev in question(r, qid)["evidence"]:
                assert p[qid]["boxes"][ev["option"]] == [[float(v) for v in ev["box"]]]
    lines = read_jsonl(tmp_path / "run.jsonl")
    stages = [(line["image_id"], line["stage"]) for line in lines]
    assert stages == sorted(stages, key=lambda s: ([r["image_id"] for r in records].index(s[0]), guard.STAGE_ORDER[s[1]]))
    results = [line for line in lines if line["stage"] == "result"]
    assert len(results) == len(records)
    for result in results:
        assert {"selection", "verification", "verified", "final_attempts", "prediction"} <= set(result)
        assert result["repaired"] is False
    # one verification request per selected factor, none for "None of the above"
    n_factors = sum(len(question(r, q)["evidence"]) for r in records for q in ("q2", "q3"))
    assert sum(1 for stage, _ in oracle.calls if stage == "verify") == n_factors


def test_guard_removes_unverified_factors_and_q1_never_changes(records, tmp_path):
    r = both(records)
    direct = [question(r, "q2")["options"][o] for o in question(r, "q2")["answer"]]

    def script(stage, record, request):
        if record is not r:
            return None
        if stage == "select":  # q1 "No", yet factors selected: q1 must stay as chosen
            return json.dumps({"q1": "B", "q2": question(r, "q2")["answer"], "q3": question(r, "q3")["answer"]})
        if stage == "verify":  # confirms the direct factors only
            return "Yes" if request["messages"][1]["content"][1]["text"].split('"')[1] in direct else "No"
        return None

    oracle = Oracle(records, script)
    with ChatServer(oracle) as server:
        predictions = run(server, records, "guard", tmp_path / "run.jsonl")
    p = next(p for p in predictions if p["image_id"] == r["image_id"])
    assert p["q1"] == {"choices": ["B"]}
    assert p["q2"]["choices"] == question(r, "q2")["answer"]
    assert p["q3"] == {"choices": ["D"], "boxes": {}}  # emptied by verification: no visually supported factor
    assert p["q5"] == {"text": "No visually supported indirect sensitive factor is visible.", "boxes": []}
    result = RunFile(tmp_path / "run.jsonl").get(r["image_id"])
    assert result["selection"]["q3"] == {"choices": question(r, "q3")["answer"]}
    assert set(result["verification"].values()) == {"yes", "no"}


def test_a_stubborn_new_factor_is_retried_then_dropped(records, tmp_path):
    r = both(records)

    def script(stage, record, request):
        if stage != "final" or record is not r:
            return None
        answer = final_answer(r)
        extra = next(o for o in ("A", "B", "C") if o not in question(r, "q2")["answer"])
        answer["q4"].append({"option": extra, "description": "an invented factor", "box": [1, 1, 30, 30]})
        answer["q2"]["boxes"][extra] = [[1, 1, 30, 30]]
        return json.dumps(answer)

    oracle = Oracle(records, script)
    with ChatServer(oracle) as server:
        predictions = run(server, records, "guard", tmp_path / "run.jsonl", retries=2)
        retry_prompts = [m for req in server.requests for m in req["messages"][3:4]]
    p = next(p for p in predictions if p["image_id"] == r["image_id"])
    assert p["q2"]["choices"] == question(r, "q2")["answer"] and set(p["q2"]["boxes"]) <= set(p["q2"]["choices"])
    assert "invented" not in p["q4"]["text"] and len(p["q4"]["boxes"]) == len(question(r, "q4")["evidence"])
    assert oracle.calls.count(("final", r["image_id"])) == 3
    assert retry_prompts and "not one of the fixed direct factors" in retry_prompts[0]["content"]
    result = RunFile(tmp_path / "run.jsonl").get(r["image_id"])
    assert result["repaired"] is True and [len(a["violations"]) for a in result["final_attempts"]] == [2, 2, 2]


def test_staged_mode_skips_verification(records, tmp_path):
    oracle = Oracle(records, lambda stage, record, request: "No" if stage == "verify" else None)
    with ChatServer(oracle) as server:
        predictions = run(server, records, "staged", tmp_path / "run.jsonl")
    assert not any(stage == "verify" for stage, _ in oracle.calls)
    assert [p["q2"]["choices"] for p in predictions] == [question(r, "q2")["answer"] for r in records]


def test_resume_after_a_kill_sends_nothing_twice_and_ends_identical(records, tmp_path):
    with ChatServer(Oracle(records)) as server:
        expected = run(server, records, "guard", tmp_path / "full.jsonl")
    full = (tmp_path / "full.jsonl").read_text().splitlines()
    # a run killed during verification: selection done, two verifications done, one torn line
    partial = [line for line in full if '"stage": "select"' in line]
    partial += [line for line in full if '"stage": "verify"' in line][:2]
    (tmp_path / "part.jsonl").write_text("\n".join(partial) + "\n" + full[-1][:25])
    oracle = Oracle(records)
    with ChatServer(oracle) as server:
        assert run(server, records, "guard", tmp_path / "part.jsonl") == expected
    assert not any(stage == "select" for stage, _ in oracle.calls)
    n_verify = sum('"stage": "verify"' in line for line in full)
    assert sum(stage == "verify" for stage, _ in oracle.calls) == n_verify - 2
    assert (tmp_path / "part.jsonl").read_text() == (tmp_path / "full.jsonl").read_text()


def test_backend_failure_is_recorded_and_retried_on_rerun(records, tmp_path):
    r = records[1]
    broken = Oracle(records, lambda stage, record, request: Reply.error(500) if record is r else None)
    with ChatServer(broken) as server:
        predictions = run(server, records, "guard", tmp_path / "run.jsonl")
    failed = next(p for p in predictions if p["image_id"] == r["image_id"])
    assert all(failed[q]["error"].startswith("backend failed at select") for q in data.QIDS)
    assert RunFile(tmp_path / "run.jsonl").get(r["image_id"])["error"]
    healthy = Oracle(records)
    with ChatServer(healthy) as server:
        predictions = run(server, records, "guard", tmp_path / "run.jsonl")
    assert {image for _, image in healthy.calls} == {r["image_id"]}
    assert not any(p[q].get("error") for p in predictions for q in data.QIDS)


def test_a_run_file_continues_only_its_own_mode(records, tmp_path):
    with ChatServer(Oracle(records)) as server:
        run(server, records[:1], "staged", tmp_path / "run.jsonl")
        with pytest.raises(InputError, match="mode 'staged'"):
            run(server, records[:1], "guard", tmp_path / "run.jsonl")


def test_one_pass_with_the_perfect_model(records, tmp_path):
    with ChatServer(Oracle(records)) as server:
        predictions = run(server, records, "one-pass", tmp_path / "run.jsonl")
    for r, p in zip(records, predictions):
        assert p["q2"]["choices"] == question(r, "q2")["answer"]
        assert len(p["q5"]["boxes"]) == len(question(r, "q5")["evidence"])
