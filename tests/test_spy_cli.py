"""`python -m eval spy ...` end to end: bad input, a real kill and resume, the HF backend with the tiny model,
self-moderation, metrics and report."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from chat_server import ChatServer, Reply, image_urls, last_user_text
from PIL import Image

from eval.__main__ import main as eval_main
from eval.spy import cli
from eval.spy.prompts import SELF_MOD_Q2, SELF_MOD_Q3
from store.runs import read_jsonl

ROOT = Path(__file__).resolve().parents[1]


def answer(request):
    """A deterministic fake model: refuses when the target instruction is private, else answers."""
    text = last_user_text(request)
    return f"I cannot provide that. [{zlib.crc32(text.encode())}]" if "is considered as private" in text.split(
        "\n")[0] else f"The answer is {zlib.crc32(text.encode())}."


def spy_args(synthetic_dir, out, *extra):
    return ["spy", "generate", "--items", str(synthetic_dir / "questions.json"), "--images", str(synthetic_dir),
            "--out", str(out), *extra]


def test_bad_input_exits_2_and_writes_nothing(tmp_path, synthetic_dir, capsys):
    items = json.loads((synthetic_dir / "questions.json").read_text())["benchmark_list"]
    out = tmp_path / "run.jsonl"
    common = ["--model", "m", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1"]

    bad = tmp_path / "items.jsonl"
    lines = [json.dumps(i) for i in items[:4]]
    lines[2] = json.dumps({**items[2], "label": "a77_nope"})
    bad.write_text("\n".join(lines) + "\n")
    argv = ["spy", "generate", "--items", str(bad), "--images", str(synthetic_dir), "--out", str(out), *common]
    assert eval_main(argv) == 2
    assert f"{bad}:3: label: unknown label 'a77_nope'" in capsys.readouterr().err

    lines[2] = json.dumps({**items[2], "question_item": {**items[2]["question_item"], "image_path": "images/no.png"}})
    bad.write_text("\n".join(lines) + "\n")
    assert eval_main(argv) == 2
    assert f"{bad}:3: question_item.image_path: image not found" in capsys.readouterr().err

    bad.write_text("\n".join([*lines[:1], '{"benchmark_id": "1", "label": ', *lines[3:]]) + "\n")
    assert eval_main(argv) == 2
    assert f"{bad}:2: not valid JSON" in capsys.readouterr().err

    # A backend option the backend does not take is refused before anything runs.
    assert eval_main(spy_args(synthetic_dir, out, "--model", "m", "--backend", "hf", "--base-url", "http://x")) == 2
    assert "--base-url: not used by the hf backend" in capsys.readouterr().err
    assert not out.exists()


def wait_for_lines(path: Path, n: int, process, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    raise AssertionError("the generation run did not progress")


def test_killed_generation_resumes_to_the_same_file(tmp_path, synthetic_dir):
    # The server answers the first `answered` requests of the killed run, then holds the rest until the
    # process is dead: the kill lands mid-run, whatever the machine's speed.
    limit, answered = 40, 10
    gate, lock, served = threading.Event(), threading.Lock(), {"n": 0}
    gate.set()

    def gated_answer(request):
        with lock:
            served["n"] += 1
            n = served["n"]
        if n > answered:
            gate.wait(timeout=60)
        return answer(request)

    with ChatServer(gated_answer) as server:
        common = ["--model", "fake-vlm", "--backend", "openai", "--base-url", server.base_url, "--concurrency", "2",
                  "--distractors", "--limit", str(limit)]
        whole = tmp_path / "whole.jsonl"
        assert eval_main(spy_args(synthetic_dir, whole, *common)) == 0

        gate.clear()
        served["n"] = 0
        killed = tmp_path / "killed.jsonl"
        command = [sys.executable, "-m", "eval", *spy_args(synthetic_dir, killed, *common)]
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            wait_for_lines(killed, answered + 1, process)  # the header line, then one line per answer
            time.sleep(0.2)  # let the held requests arrive
            assert process.poll() is None  # still running: the kill really interrupts it
            process.send_signal(signal.SIGKILL)
            process.wait()
        finally:
            gate.set()
        assert killed.read_text().count("\n") == answered + 1
        with open(killed, "a") as f:  # and a torn last line, as a kill mid-write leaves
            f.write('{"id": "20000001:p0", "benchmark_id": "200')
        before = len(server.requests)
        assert eval_main(spy_args(synthetic_dir, killed, *common)) == 0
        resent = len(server.requests) - before
    assert killed.read_bytes() == whole.read_bytes()
    assert resent == limit - answered  # nothing finished was asked again
    records = read_jsonl(whole)
    assert len(records) == limit and len({r["id"] for r in records}) == limit
    assert all(r["model"] == "fake-vlm" and r["response"] for r in records)

    # Resuming into the file with another setting would mix prompts: refused.
    assert eval_main(spy_args(synthetic_dir, killed, *[c for c in common if c != "--distractors"])) == 2


def test_self_moderation_judge_and_metrics_over_the_api(tmp_path, synthetic_dir):
    run = tmp_path / "run.jsonl"
    with ChatServer(answer) as server:
        cli.generate(synthetic_dir / "questions.json", synthetic_dir, run, model="fake-vlm", backend="openai",
                     base_url=server.base_url, limit=10, progress=False)

    def reflect(request):
        turns = len(request["messages"])
        assert request["messages"][0]["content"][0]["type"] == "image_url"  # image first, first turn only
        assert len(image_urls(request)) == 1
        if turns == 3:
            assert request["messages"][2]["content"].startswith(SELF_MOD_Q2[:40])
            return f"second: {last_user_text(request).split(':', 1)[1][:60]}"
        assert turns == 5 and request["messages"][4]["content"] == SELF_MOD_Q3
        return "I'm sorry, I cannot share it." if "[" in request["messages"][1]["content"] else "It is blue."

    out = tmp_path / "selfmod.jsonl"
    third_turns = {"n": 0}

    def sometimes_down(request):  # the first 3 third-turn requests fail for good (400 is not retried)
        if len(request["messages"]) == 5 and third_turns["n"] < 3:
            third_turns["n"] += 1
            return Reply.error(400)
        return reflect(request)

    with ChatServer(sometimes_down) as server:
        first = cli.self_moderate(run, synthetic_dir, out, model="fake-vlm", backend="openai",
                                  base_url=server.base_url, concurrency=1, progress=False)
        assert len(server.requests) == 20
    assert sum(1 for r in first if r.get("error")) == 3
    assert all(r["resp_2"].startswith("second: ") for r in first)
    with ChatServer(reflect) as server:
        records = cli.self_moderate(run, synthetic_dir, out, model="fake-vlm", backend="openai",
                                    base_url=server.base_url, progress=False)
        assert len(server.requests) == 3  # only the failed third turns
    assert all("error" not in r and r["resp_3"] for r in records)
    instructions = records[0]["input_question"].split("\n\n")[0]
    assert records[0]["resp_2"] == "second: " + SELF_MOD_Q2.format(instructions).split(":", 1)[1][:60]

    judged = tmp_path / "judged.jsonl"
    assert eval_main(["spy", "judge", str(out), "--judge", "rule", "--resp-key", "resp_3", "--out", str(judged)]) == 0
    assert all(r["eval_3"] in ("respond", "reject") for r in read_jsonl(judged))
    metrics_path = tmp_path / "metrics.json"
    assert eval_main(["spy", "metrics", str(judged), "--key", "eval_3", "--out", str(metrics_path)]) == 0
    m = json.loads(metrics_path.read_text())
    assert m["total"] == 10 and m["exceptions"] == 0 and m["ics"] == 100.0  # refuses exactly when private


def test_self_moderation_needs_finished_answers(tmp_path, synthetic_dir, capsys):
    run = tmp_path / "run.jsonl"
    run.write_text(json.dumps({"id": "a", "input_question": "q", "image_path": "images/test/test_000000.png",
                               "response": None, "error": "boom"}) + "\n")
    argv = ["spy", "self-moderate", str(run), "--model", "m", "--backend", "openai", "--base-url", "http://x/v1",
            "--images", str(synthetic_dir), "--out", str(tmp_path / "o.jsonl")]
    assert eval_main(argv) == 2
    assert f"{run}:1: response: missing or failed" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_metrics_and_report_commands(tmp_path, capsys):
    judged = tmp_path / "judged.jsonl"
    rows = [{"benchmark_id": str(i // 2), "label": label, "is_privacy": i % 2, "eval_resp": verdict}
            for i, (label, verdict) in enumerate([("a2_weight_approx", "respond"), ("a2_weight_approx", "reject"),
                                                  ("a10_face_partial", "respond"), ("a10_face_partial", "respond")])]
    judged.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics_path, reference = tmp_path / "m.json", tmp_path / "ref.json"
    assert eval_main(["spy", "metrics", str(judged), "--out", str(metrics_path), "--reference-out",
                      str(reference)]) == 0
    printed = capsys.readouterr().out
    assert "| judged | 4 | 0 | 75.00 | – | 50.00 |" in printed
    m = json.loads(metrics_path.read_text())
    assert list(m["by_label"]) == ["a2_weight_approx", "a10_face_partial"] and m["hms"] is None
    assert json.loads(reference.read_text())["metrics"]["ics w/o scenario"]["score"] == 50.0

    out_dir = tmp_path / "report"
    assert eval_main(["spy", "report", str(metrics_path), str(metrics_path), "--names", "base", "tuned",
                      "--metric", "ics", "--out-dir", str(out_dir)]) == 0
    assert "| base | 4 | 0 | 75.00 |" in capsys.readouterr().out
    for name in ("spy_overall.png", "spy_by_label_ics.png"):
        with Image.open(out_dir / name) as image:
            assert image.format == "PNG"
    report = (out_dir / "spy_report.md").read_text()
    assert "| a2_weight_approx | 100.00 | 100.00 |" in report and "| a10_face_partial | 0.00 | 0.00 |" in report
    assert eval_main(["spy", "report", str(judged), "--out-dir", str(out_dir)]) == 2  # not a metrics file


@pytest.mark.slow
def test_hf_backend_end_to_end_with_the_tiny_model(tmp_path, synthetic_dir, tiny_model_dir):
    from eval.backends import load_generator

    # One model load serves several runs (the demo evaluates each checkpoint this way).
    generator = load_generator("hf", str(tiny_model_dir), batch_size=8, max_new_tokens=8)
    run = tmp_path / "run.jsonl"
    records = cli.generate(synthetic_dir / "questions.json", synthetic_dir, run, generator=generator, limit=12,
                           distractors=True, progress=False)
    assert len(records) == 12 and all(isinstance(r["response"], str) and "error" not in r for r in records)
    assert records[0]["model"] == str(tiny_model_dir)
    again = cli.generate(synthetic_dir / "questions.json", synthetic_dir, run, generator=generator, limit=12,
                         distractors=True, progress=False)
    assert again == records  # everything was done: nothing regenerated
    judged = cli.judge(run, tmp_path / "judged.jsonl", rule=True, progress=False)
    m = cli.metrics(tmp_path / "judged.jsonl", tmp_path / "metrics.json")
    assert m["total"] == 12 and m["exceptions"] == 0 and len(judged) == 12
    assert m["ics"] == 0.0  # an untrained model's gibberish is never a refusal
    cli.report([tmp_path / "metrics.json"], tmp_path / "report")
    assert (tmp_path / "report" / "spy_by_label_accuracy.png").is_file()
