"""`python -m eval spatialtrust ...` end to end: scripted model and judge over HTTP, the tiny model, bad input."""

import json

import pytest
from chat_server import ChatServer
from spatialtrust_fixtures import Oracle, judge_oracle

from eval.__main__ import main
from eval.spatialtrust import data
from store.runs import read_jsonl

NO_KEY = ["--api-key-env", "SPATIALTRUST_TEST_NO_KEY"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return data.build_synthetic(tmp_path_factory.mktemp("st"), n_images=4, width=120, height=80)


def st(*args) -> int:
    return main(["spatialtrust", *map(str, args)])


def test_scripted_perfect_model_scores_100_in_every_mode(dataset, tmp_path):
    records = data.load(dataset)
    with ChatServer(Oracle(records)) as model, ChatServer(judge_oracle) as judge:
        for mode in ("one-pass", "staged", "guard"):
            pred, verdicts, metrics = (tmp_path / f"{mode}.{ext}" for ext in ("jsonl", "judge.jsonl", "metrics.json"))
            assert st("generate", "--data", dataset, "--mode", mode, "--backend", "openai", "--model", "scripted",
                      "--base-url", model.base_url, *NO_KEY, "--out", pred) == 0
            assert st("judge", "--data", dataset, "--predictions", pred, "--out", verdicts, "--judge-model", "j",
                      "--base-url", judge.base_url, *NO_KEY) == 0
            assert st("score", "--data", dataset, "--predictions", pred, "--judgments", verdicts, "--out", metrics) == 0
            m = json.loads(metrics.read_text())
            assert {k: m[k] for k in ("q1", "q2", "q3", "q4", "q5", "overall")} == dict.fromkeys(
                ("q1", "q2", "q3", "q4", "q5", "overall"), 100.0), mode
            assert m["n_images"] == 4 and sum(m["unparsable"].values()) == 0
            assert (tmp_path / f"{mode}.metrics.md").read_text().count("\n| ") == 5  # header, our row, 3 paper rows
            assert (tmp_path / f"{mode}.metrics.png").stat().st_size > 1000
        judged = len(judge.requests)
        # judging again sends nothing: every verdict is in the file (and the cache)
        assert st("judge", "--data", dataset, "--predictions", tmp_path / "guard.jsonl", "--out",
                  tmp_path / "guard.judge.jsonl", "--judge-model", "j", "--base-url", judge.base_url, *NO_KEY) == 0
        assert len(judge.requests) == judged
    lines = read_jsonl(tmp_path / "guard.judge.jsonl")
    assert [line["id"] for line in lines] == [f"{r['image_id']}/{q}" for r in records for q in ("q4", "q5")]
    for line in lines:
        assert isinstance(line["unsupported"], bool) and isinstance(line["states_absence"], bool)
        assert all(set(f) == {"identified", "explanation_correct", "box_index"} for f in line["factors"])
    assert st("report", "--metrics", *(tmp_path / f"{m}.metrics.json" for m in ("one-pass", "staged", "guard")),
              "--names", "one-pass", "staged", "guard", "--out", tmp_path / "report") == 0
    table = (tmp_path / "report.md").read_text()
    assert "| guard | 100.00 |" in table and "41.12" in table


def test_a_changed_prediction_is_judged_again_and_a_stale_verdict_is_refused(dataset, tmp_path, capsys):
    records = data.load(dataset)
    pred, verdicts = tmp_path / "p.jsonl", tmp_path / "v.jsonl"
    with ChatServer(Oracle(records)) as model, ChatServer(judge_oracle) as judge:
        st("generate", "--data", dataset, "--mode", "one-pass", "--backend", "openai", "--model", "m",
           "--base-url", model.base_url, *NO_KEY, "--out", pred)
        st("judge", "--data", dataset, "--predictions", pred, "--out", verdicts, "--judge-model", "j",
           "--base-url", judge.base_url, *NO_KEY)
        predictions = read_jsonl(pred)
        predictions[0]["q4"]["text"] += " And a poster."
        pred.write_text("".join(json.dumps(p) + "\n" for p in predictions))
        assert st("score", "--data", dataset, "--predictions", pred, "--judgments", verdicts,
                  "--out", tmp_path / "m.json") == 2
        assert "v.jsonl:2: prediction_digest:" in capsys.readouterr().err  # line 1 is the run header
        n = len(judge.requests)
        st("judge", "--data", dataset, "--predictions", pred, "--out", verdicts, "--judge-model", "j",
           "--base-url", judge.base_url, *NO_KEY)
        assert len(judge.requests) == n + 1
    assert st("score", "--data", dataset, "--predictions", pred, "--judgments", verdicts,
              "--out", tmp_path / "m.json") == 0


def test_bad_input_exits_2_naming_file_line_field_and_writes_nothing(dataset, tmp_path, capsys):
    lines = dataset.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["questions"][1]["answer"] = ["Z"]
    bad_data = dataset.parent / "bad.jsonl"
    bad_data.write_text("\n".join([lines[0], json.dumps(bad)]) + "\n")
    out = tmp_path / "p.jsonl"
    assert st("generate", "--data", bad_data, "--mode", "guard", "--backend", "openai", "--model", "m",
              "--base-url", "http://127.0.0.1:9", *NO_KEY, "--out", out) == 2
    assert capsys.readouterr().err.strip() == (f"error: {bad_data}:2: questions.q2.answer: 'Z' is not among the "
                                               "options ['A', 'B', 'C', 'D']")
    assert not out.exists() and not (tmp_path / "p.run.jsonl").exists()

    predictions = tmp_path / "pred.jsonl"
    predictions.write_text('{"image_id": "st_00000"}\n{"image_id": "nope"}\n')
    assert st("score", "--data", dataset, "--predictions", predictions, "--out", tmp_path / "m.json") == 2
    assert f"{predictions}:2: image_id: 'nope' is not in the data" in capsys.readouterr().err
    predictions.write_text('{"image_id": "st_00001"}\n')
    verdicts = tmp_path / "v.jsonl"
    verdicts.write_text(json.dumps({"image_id": "st_00001", "qid": "q4", "unsupported": False,
                                    "states_absence": False, "factors": []}) + "\n")
    assert st("score", "--data", dataset, "--predictions", predictions, "--judgments", verdicts,
              "--out", tmp_path / "m.json") == 2
    assert f"{verdicts}:1: factors: expected a list of" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
    assert st("report", "--metrics", tmp_path / "missing.json", "--out", tmp_path / "r") == 2
    assert not (tmp_path / "r.md").exists()


@pytest.mark.parametrize("command", ["validate", "score"])
def test_crafted_answers_and_image_ids_are_one_line(dataset, tmp_path, capsys, command):
    """Issue 39 item 7: a question's answer of [["B"]] (validate) and a prediction's image_id of {"a": 1} (score)
    were TypeErrors (unhashable); both are one line naming the file, line and field, and nothing is written."""
    lines = dataset.read_text().splitlines()
    if command == "validate":
        record = json.loads(lines[1])
        next(q for q in record["questions"] if q["qid"] == "q1")["answer"] = [["B"]]
        path = tmp_path / "data.jsonl"
        path.write_text("\n".join([lines[0], json.dumps(record), *lines[2:]]) + "\n")
        assert st("validate", "--data", path, "--image-root", dataset.parent) == 2
        needle = f"{path}:2: questions.q1.answer: expected a non-empty list of distinct option keys"
    else:
        path = tmp_path / "p.jsonl"
        path.write_text(json.dumps({"image_id": "st_00000", "q1": {"choices": ["A"]}}) + "\n"
                        + json.dumps({"image_id": {"a": 1}, "q1": {"choices": ["A"]}}) + "\n")
        assert st("score", "--data", dataset, "--predictions", path, "--out", tmp_path / "m.json") == 2
        needle = f"{path}:2: image_id: expected a string, got {{\"a\": 1}}"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "m.json").exists()


def test_a_run_file_of_another_mode_is_refused_before_any_work(dataset, tmp_path, capsys):
    run = tmp_path / "p.run.jsonl"
    run.write_text(json.dumps({"id": "st_00000", "image_id": "st_00000", "mode": "one-pass", "model": "m",
                               "stage": "result"}) + "\n")
    assert st("generate", "--data", dataset, "--mode", "guard", "--backend", "openai", "--model", "m",
              "--base-url", "http://127.0.0.1:9", *NO_KEY, "--out", tmp_path / "p.jsonl") == 2
    assert "p.run.jsonl:1: mode: this run was made with 'one-pass', not 'guard'" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_model_garbage_is_scored_as_wrong_in_all_three_modes(dataset, tiny_model_dir, tmp_path):
    for mode in ("one-pass", "staged", "guard"):
        pred = tmp_path / f"{mode}.jsonl"
        assert st("generate", "--data", dataset, "--mode", mode, "--backend", "hf", "--model", tiny_model_dir,
                  "--max-new-tokens", 6, "--batch-size", 4, "--out", pred) == 0
        predictions = read_jsonl(pred)
        assert [p["image_id"] for p in predictions] == [r["image_id"] for r in data.load(dataset)]
        results = [line for line in read_jsonl(tmp_path / f"{mode}.run.jsonl") if line["stage"] == "result"]
        assert len(results) == 4 and not any(line.get("error") for line in results)
        # no API key and no server: nothing readable to judge, so nothing is sent
        assert st("judge", "--data", dataset, "--predictions", pred, "--out", tmp_path / f"{mode}.v.jsonl",
                  "--judge-model", "j", *NO_KEY) == 0
        assert st("score", "--data", dataset, "--predictions", pred, "--judgments", tmp_path / f"{mode}.v.jsonl",
                  "--out", tmp_path / f"{mode}.m.json") == 0
        m = json.loads((tmp_path / f"{mode}.m.json").read_text())
        assert m["overall"] == 0.0 and all(m[q] == 0.0 for q in data.QIDS), (mode, m)


@pytest.mark.slow
def test_tiny_model_through_verification_and_final_retries(dataset, tiny_model_dir, tmp_path):
    """A resumed guard run whose (scripted) selection is in the run file: the tiny model then answers every
    verification with garbage, which removes every factor, and every final attempt breaks the rules."""
    records = data.load(dataset)
    pred, run = tmp_path / "guard.jsonl", tmp_path / "guard.run.jsonl"
    selected = {r["image_id"]: {q: ["A"] if q == "q1" else ["A", "B"] for q in ("q1", "q2", "q3")} for r in records}
    run.write_text("".join(json.dumps({"image_id": i, "mode": "guard", "model": str(tiny_model_dir), "stage": "select",
                                       "id": f"{i}/select", "response": json.dumps(s)}) + "\n"
                           for i, s in selected.items()))
    assert st("generate", "--data", dataset, "--mode", "guard", "--backend", "hf", "--model", tiny_model_dir,
              "--max-new-tokens", 4, "--batch-size", 8, "--retries", 1, "--out", pred) == 0
    lines = read_jsonl(run)
    assert sum(line["stage"] == "verify" for line in lines) == 4 * 4
    assert sum(line["stage"] == "final" for line in lines) == 4 * 2  # first attempt + one retry each
    for result in (line for line in lines if line["stage"] == "result"):
        assert result["repaired"] and set(result["verification"].values()) == {"no"}
    for p in read_jsonl(pred):
        assert p["q1"] == {"choices": ["A"]}
        assert p["q2"] == p["q3"] == {"choices": ["D"], "boxes": {}}
        assert p["q4"]["text"].startswith("No visually supported") and p["q4"]["boxes"] == []
