"""Each method trains the tiny model a few steps through the entry script and recipe the README shows, and leaves a
loadable checkpoint with a model card. Resuming works.

Run here: every method on Qwen2-VL, NCA-P on every other family, SFT on Gemma 3, each as `python train/SCRIPT.py
RECIPE` (forked from a preloaded interpreter, tests/forked_python.py); NCA-P on Qwen2-VL, the LoRA + W&B run and the
resume under the real `accelerate launch` as the README shows it. The remaining (method, family) pairs run the same
entry scripts in process (tests/test_families.py)."""

import json
import math
import os
import shutil
import sys
from pathlib import Path

import forked_python
import pytest
from safetensors.torch import load_file

from cli.errors import new_file_mode
from store.runs import MARKER
from train.common import METHOD_NAMES
from train.tiny_model import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def launch(script: str, recipe: str, tiny_model_dir, synthetic_dir, out, *overrides, config="cpu.yaml", env=None,
           launcher_args=(), output=None, log=None, accelerate=True):
    """Train through `accelerate launch` (with `accelerate=False`, `python train/SCRIPT.py`); returns the run's log
    history (and its stdout into `output`, its stderr into `log`, lists)."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(ROOT / "accelerate_configs" / config), *launcher_args] if accelerate else [sys.executable]
    command = [
        *launcher, str(ROOT / "train" / f"{script}.py"), str(ROOT / "recipes" / "demo" / f"{recipe}.yaml"),
        "--model_name_or_path", str(tiny_model_dir), "--train_data_path", str(synthetic_dir / "train_data.json"),
        "--image_folder", str(synthetic_dir), "--output_dir", str(out), "--max_steps", "3", "--logging_steps", "1",
        "--per_device_train_batch_size", "2", "--save_steps", "2", "--save_total_limit", "null", *overrides,
    ]
    result = forked_python.run(command, cwd=ROOT, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr[-3000:]
    if output is not None:
        output.append(result.stdout)
    if log is not None:
        log.append(result.stderr)
    return json.loads((Path(out) / "train_metrics.json").read_text())


def changed_fraction(before: dict, after: dict) -> float:
    return sum(not before[k].equal(after[k]) for k in before) / len(before)


LAUNCHED = [
    ("sft", "sft", "sft", "qwen2_vl"), ("dpo", "dpo", "dpo", "qwen2_vl"), ("dpo", "nca", "nca", "qwen2_vl"),
    ("nca_p", "nca_p", "nca_p", "qwen2_vl"),
    *[("nca_p", "nca_p", "nca_p", family) for family in FAMILIES if family != "qwen2_vl"],
    ("sft", "sft", "sft", "gemma3"),
]


@pytest.mark.parametrize("script,recipe,method,family", LAUNCHED)
def test_method_trains_and_saves(script, recipe, method, family, tiny_family_dir, synthetic_dir, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    tiny_model_dir = tiny_family_dir(family)
    out = tmp_path / recipe
    log = []
    launched = (script, family) == ("nca_p", "qwen2_vl")  # the README's command as it is; the others run the script
    history = launch(script, recipe, tiny_model_dir, synthetic_dir, out, log=log, accelerate=launched)
    # the arguments logged once, the start said, TRL's deprecated-alias FutureWarning filtered (cli/log.py)
    assert log[0].count("arguments that differ from the defaults: {") == 1, log[0][-3000:]
    assert log[0].count("SpyTuneArguments: {") == 1 and log[0].count("ModelConfig: {") == 1  # data and model args
    assert f'"model_name_or_path": "{tiny_model_dir}"' in log[0]
    assert f"training from the start into {out}" in log[0] and "is_gradient_checkpointing" not in log[0]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    assert changed_fraction(before, after) > 0.9  # every trained tensor moved (a few buffers may not)
    assert AutoModelForImageTextToText.from_pretrained(out).config.model_type == family
    AutoProcessor.from_pretrained(out)
    # readable by colleagues: the user's umask, not safetensors' 0600, for the final folder and checkpoints
    for weights in (out / "model.safetensors", out / "checkpoint-2" / "model.safetensors"):
        assert weights.stat().st_mode & 0o777 == new_file_mode()
    card = (out / "README.md").read_text()
    # a local base is no Hub id: the card names its folder (never the machine's path), not as base_model metadata
    assert f"`{tiny_model_dir.name}` (a local model folder, not on the Hub) fine-tuned with " \
           f"**{METHOD_NAMES[method]}**" in card and "base_model" not in card
    assert str(tiny_model_dir) not in card
    assert f"- {family}\n" in card  # the family's tag: the saved config's model_type
    if method != "sft":
        assert any("rewards/accuracies" in entry for entry in history)
    if method == "nca_p":
        logged = next(entry for entry in history if "loss" in entry)
        for key in ("rewards/chosen_0", "rewards/chosen_1", "rewards/rejected_0", "rewards/rejected_1",
                    "rewards/margins", "rewards/accuracies_private", "rewards/accuracies_non_private"):
            assert key in logged


def test_nca_p_with_lora_tracked_in_wandb(tiny_model_dir, synthetic_dir, tmp_path):
    out = tmp_path / "lora"
    launch("nca_p", "nca_p", tiny_model_dir, synthetic_dir, out, "--use_peft", "true", "--lora_r", "4",
           "--lora_target_modules", "q_proj", "v_proj", "--report_to", "wandb", "--run_name", "lora-test",
           env={"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_PROJECT": "privacy-align-tests"})
    adapter = load_file(out / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at zero: it trained
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    # finished by the script (train/card.py), not left to wandb's exit hooks, whose teardown can cut the writer
    # off before it flushes: the run file then holds only its header
    assert "finishing run" in (runs[0] / "logs" / "debug.log").read_text()
    logged = b"".join(p.read_bytes() for p in runs[0].rglob("*.wandb"))
    assert b"rewards/accuracies_private" in logged
    # the run config holds the script and model arguments (data, distractors, LoRA), the method is a tag
    for key in (b"script/train_data_path", b"script/add_distractors", b"model/lora_target_modules", b"model/lora_r",
                b"model/model_name_or_path"):
        assert key in logged, key
    assert b"nca_p" in logged


def test_resume_reaches_the_same_state(tiny_model_dir, synthetic_dir, tmp_path):
    """Stop after 2 of 4 steps (the run's later files removed), resume: step 4 again, with the same weights."""
    full = tmp_path / "full"
    launch("nca_p", "nca_p", tiny_model_dir, synthetic_dir, full, "--max_steps", "4", accelerate=False)
    resumed = tmp_path / "resumed"
    shutil.copytree(full / "checkpoint-2", resumed / "checkpoint-2")
    shutil.copy(full / MARKER, resumed / MARKER)  # a killed run's folder: the marker its start wrote
    log = []
    history = launch("nca_p", "nca_p", tiny_model_dir, synthetic_dir, resumed, "--max_steps", "4",
                     "--resume_from_checkpoint", "true", log=log)
    assert f"resuming from {resumed / 'checkpoint-2'}" in log[0]
    assert max(entry["step"] for entry in history) == 4
    # the history of steps 1-2 comes from the checkpoint; 3-4 ran once each, nothing lost or repeated
    assert [e["step"] for e in history if "loss" in e] == [1, 2, 3, 4]
    state = json.loads((resumed / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all((a[k] - b[k]).abs().max() < 1e-5 for k in a)
