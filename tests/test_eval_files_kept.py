"""Issue 12, evaluation side: no user file is lost (overwrite cases, torn lines), a run file knows what made it
(model switch refused, --new-run), permissions follow the umask, and failures stay visible in judge, metrics
and report. Commands run as subprocesses against real HTTP servers on 127.0.0.1."""

import json
import os
import subprocess
import sys
from pathlib import Path

import forked_python
import pytest
from chat_server import ChatServer
from PIL import Image
from test_bad_inputs_eval import CASES, DEAD, assert_refused, template  # noqa: F401 - the fixture is shared

from store.runs import HEADER, RunFile, read_jsonl, write_jsonl, write_text
from vlm.chat_client import ChatClient

ROOT = Path(__file__).resolve().parents[1]


def run_eval(folder: Path, *argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": ""}
    return forked_python.run([sys.executable, "-m", "eval", *map(str, argv)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def work(template, tmp_path):  # noqa: F811
    import shutil

    folder = tmp_path / "w"
    shutil.copytree(template, folder)
    return folder


@pytest.mark.parametrize("case", ["spy-generate-out-is-items", "st-generate-out-is-data", "spy-judge-out-is-input"])
def test_the_three_overwrite_cases_of_the_issue_are_refused(work, case):
    _, prepare, argv, fragments = next(c for c in CASES if c[0] == case)
    assert prepare is None
    assert_refused(work, argv, fragments)


def spy_generate(folder, model, out, *extra):
    return run_eval(folder, "spy", "generate", "--backend", "openai", "--model", model, "--base-url", extra[0],
                    "--items", "q.json", "--images", ".", "--out", out, *extra[1:])


def test_a_torn_last_line_is_kept_when_the_command_refuses_and_repaired_when_it_resumes(work):
    with ChatServer(lambda request: "An answer.") as server:
        assert spy_generate(work, "m", "out.jsonl", server.base_url, "--limit", "3").returncode == 0
    whole = (work / "out.jsonl").read_bytes()
    torn = whole + b'{"id": "00002121:p1", "benchm'
    (work / "out.jsonl").write_bytes(torn)
    (work / "images" / "x.png").write_bytes(b"not an image")  # bad input: refused before anything is written
    result = spy_generate(work, "m", "out.jsonl", DEAD)
    assert result.returncode == 2 and "not a readable image" in result.stderr
    assert (work / "out.jsonl").read_bytes() == torn
    Image.new("RGB", (16, 16), (200, 40, 40)).save(work / "images" / "x.png")
    with ChatServer(lambda request: "An answer.") as server:
        assert spy_generate(work, "m", "out.jsonl", server.base_url, "--limit", "3").returncode == 0
        assert not server.requests  # the three answers were kept; the torn line was dropped
    assert (work / "out.jsonl").read_bytes() == whole

    # A user's file whose last line has no newline is not a run file: refused, kept byte for byte.
    (work / "mine.jsonl").write_bytes(b'["my", "list"]')
    assert_refused(work, ["spy", "generate", "--backend", "openai", "--model", "m", "--base-url", DEAD, "--items",
                          "q.json", "--images", ".", "--out", "mine.jsonl"], ["mine.jsonl:1: not a run file"])


def test_run_file_repairs_only_on_the_first_write_and_keeps_a_whole_last_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a", "response": "x"}\n{"id": "b", "response": "y"}')  # whole, newline missing
    run = RunFile(path)
    assert path.read_text().endswith('"y"}') and run.is_done("b")
    run.append({"id": "c", "response": "z"})
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b", "c"]
    path.write_text('{"id": "a", "response": "x"}\n{"id": "b", "resp')  # torn by a kill
    before = path.read_bytes()
    run = RunFile(path)
    assert path.read_bytes() == before and not run.is_done("b")  # opening changes nothing
    run.append({"id": "b", "response": "y"})
    assert [r["id"] for r in read_jsonl(path)] == ["a", "b"]


def test_resuming_with_another_model_or_setting_refuses_and_new_run_starts_over(work):
    with ChatServer(lambda request: f"Answer of {request['model']}.") as server:
        assert spy_generate(work, "model-a", "out.jsonl", server.base_url, "--limit", "3").returncode == 0
        before = (work / "out.jsonl").read_bytes()
        result = spy_generate(work, "model-b", "out.jsonl", server.base_url)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.strip().splitlines()[-1].endswith(
            "out.jsonl:1: model: this run was made with 'model-a', not 'model-b'; pass --new-run to start it over, "
            "or choose another output path")
        result = spy_generate(work, "model-a", "out.jsonl", server.base_url, "--max-new-tokens", "64")
        assert result.returncode == 2 and "max_new_tokens: this run was made with None, not 64" in result.stderr
        assert (work / "out.jsonl").read_bytes() == before
        sent = len(server.requests)
        assert spy_generate(work, "model-b", "out.jsonl", server.base_url, "--new-run").returncode == 0
        assert len(server.requests) - sent == 5  # every sample asked again: nothing of model-a was kept
    records = read_jsonl(work / "out.jsonl")
    assert len(records) == 5 and {r["model"] for r in records} == {"model-b"}
    assert {r["response"] for r in records} == {"Answer of model-b."}
    assert json.loads((work / "out.jsonl").read_text().splitlines()[0])[HEADER]["model"] == "model-b"


def test_geo_generate_refuses_another_models_run(work):
    args = ["geo", "generate", "--backend", "openai", "--images", "geo/images", "--labels", "geo/labels.csv",
            "--metadata", "geo/meta.csv", "--out", "geo/out.jsonl"]
    with ChatServer(lambda request: "Paris, France.") as server:
        assert run_eval(work, *args, "--model", "a", "--base-url", server.base_url).returncode == 0
        before = (work / "geo" / "out.jsonl").read_bytes()
        result = run_eval(work, *args, "--model", "b", "--base-url", server.base_url)
        assert result.returncode == 2 and "out.jsonl:1: model: this run was made with 'a', not 'b'" in result.stderr
        assert (work / "geo" / "out.jsonl").read_bytes() == before
        assert run_eval(work, *args, "--model", "b", "--base-url", server.base_url, "--new-run").returncode == 0
    assert [r["model"] for r in read_jsonl(work / "geo" / "out.jsonl")] == ["b"]


def test_concurrency_zero_is_refused_on_the_command_line_and_in_the_client():
    with pytest.raises(ValueError, match="concurrency: must be at least 1"):
        ChatClient("m", base_url=DEAD, concurrency=0)  # would otherwise wait forever for a free slot


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_outputs_get_the_users_umask_not_0600(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_text(tmp_path / "a.json", "{}\n")
        write_jsonl(tmp_path / "b.jsonl", [{"id": 1}])
        run = RunFile(tmp_path / "c.jsonl", header={"step": "test"})
        run.append({"id": "x"})
        run.finalize(["x"])
    finally:
        os.umask(old)
    for name in ("a.json", "b.jsonl", "c.jsonl"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_a_cli_output_is_readable_by_colleagues(work):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(f"umask 022 && {sys.executable} -m eval spy metrics judged.jsonl --out m2.json",
                            shell=True, cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (work / "m2.json").stat().st_mode & 0o777 == 0o644


def test_judge_skips_failed_generations_and_metrics_count_them(work):
    lines = (work / "run.jsonl").read_text().splitlines()
    failed = {**json.loads(lines[1]), "response": None, "error": "failed after 7 attempt(s): timeout"}
    (work / "run.jsonl").write_text("\n".join([lines[0], json.dumps(failed), *lines[2:]]) + "\n")
    result = run_eval(work, "spy", "judge", "run.jsonl", "--judge", "rule", "--out", "j.jsonl")
    assert result.returncode == 0, result.stderr
    assert "4 judged in j.jsonl; 1 failed generations not judged" in result.stdout
    judged = read_jsonl(work / "j.jsonl")
    assert "eval_resp" not in judged[1] and judged[1]["error"].startswith("failed after")
    result = run_eval(work, "spy", "metrics", "j.jsonl", "--out", "m.json")
    assert result.returncode == 0
    assert "1 failed generations, 0 unjudged and 0 missing samples" in result.stderr
    metrics = json.loads((work / "m.json").read_text())
    assert (metrics["n_failed"], metrics["n_unjudged"], metrics["n_missing"]) == (1, 0, 0)
    assert metrics["exceptions"] == 1 and metrics["total"] == 5


def test_reports_warn_when_runs_have_different_sample_counts(work):
    metrics = json.loads((work / "metrics.json").read_text())
    (work / "fewer.json").write_text(json.dumps({**metrics, "total": metrics["total"] - 2}))
    result = run_eval(work, "spy", "report", "metrics.json", "fewer.json", "--out-dir", "rep")
    assert result.returncode == 0, result.stderr
    assert "warning: the runs compared have different numbers of records (metrics 5, fewer 3)" in result.stderr
    result = run_eval(work, "spy", "report", "metrics.json", "metrics.json", "--names", "a", "b", "--out-dir", "rep2")
    assert result.returncode == 0 and "warning" not in result.stderr
    st = json.loads((work / "st" / "m.json").read_text())
    (work / "st" / "m3.json").write_text(json.dumps({**st, "n_images": 3}))
    result = run_eval(work, "spatialtrust", "report", "--metrics", "st/m.json", "st/m3.json", "--out", "st/rep")
    assert result.returncode == 0, result.stderr
    assert "different numbers of images (m 2, m3 3)" in result.stderr


def test_spatialtrust_score_warns_about_images_without_a_prediction(work):
    first = (work / "st" / "pred.jsonl").read_text().splitlines()[0]
    (work / "st" / "one.jsonl").write_text(first + "\n")
    result = run_eval(work, "spatialtrust", "score", "--data", "st/data.jsonl", "--predictions", "st/one.jsonl",
                      "--out", "st/s.json")
    assert result.returncode == 0, result.stderr
    assert "warning: 1 images without a prediction" in result.stderr
    assert json.loads((work / "st" / "s.json").read_text())["missing_predictions"] == 1
