"""GRPO (train/grpo.py, losses/grpo_trainer.py, losses/grpo_packing.py, losses/rewards.py, train/rewards.py) on the tiny models, CPU:

- tree-packed groups change nothing but the work (float32, 1e-5), on every Qwen family, full and LoRA: the
  policy's per-token log-probabilities and entropies, the reference's and the old policy's (num_iterations 2), the
  loss and every gradient, on a batch whose groups have prompts of different lengths (a SPY and a general prompt);
- with `packed_attention: flex`, the reference's and the old policy's passes run flex_attention on CPU (every
  packing family, Qwen3-VL-MoE included) and equal the sdpa tree mask's and the unpacked values within 1e-5;
- a judge failure is a missing reward: left out of its group's mean and std (advantage 0), never a zero, counted,
  and the run stops with one line past `max_missing_reward_share` (a real local HTTP judge that fails on purpose);
- the rewards' scores; bad reward names, weights and judge settings are one line (exit 2) before any model loads;
- GRPO trains from an SFT checkpoint with the rule judge (reward logged, model saved and reloadable), and a resume
  from a checkpoint ends where the uninterrupted run ends (it fails when the checkpoint's RNG state is dropped);
- two CPU processes (packed) train like one (unpacked) on the same rollouts (tests/grpo_fixed_rollouts.py);
- the GRPO prompts, and GRPO as an opt-in method of the tuned study.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import forked_python
import pytest
import torch
from chat_server import ChatServer, Reply, last_user_text
from hardening_checks import assert_one_line, snapshot
from peft import LoraConfig
from test_hardening_runtime import in_process
from test_preference_trainers import perturb
from transformers import AutoModelForImageTextToText, AutoProcessor

from data_prep.spy_tune import build_dataset
from losses.grpo_trainer import VisionGRPOConfig, VisionGRPOTrainer
from losses.rewards import answer_match, completion_text, compliance, general_accuracy_score, helpfulness_score
from store.runs import MARKER
from train import grpo
from train.rewards import JudgeSettings, VerdictJudge, make_reward_funcs
from train.tiny_model import FAMILIES
from vlm.families import supports_packing

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-5
G = 4
FAMILIES_PACKED = [f for f in FAMILIES if supports_packing(f) and not f.endswith("_moe")]


@pytest.fixture(scope="module")
def grpo_data(tmp_path_factory):
    """Synthetic SPY-Tune with a general task (prompts of another length)."""
    from data_prep.synthetic import build

    return build(tmp_path_factory.mktemp("grpo-data"), train_per_label=1, test_per_label=1, general_train=8,
                 general_test=2)


def make_grpo_trainer(model_dir, data, tmp_path, lora=False, judge=None, reward_funcs=None, rewards=None,
                      num_samples=6, general_fraction=0.5, **config):
    """`rewards`: reward callables in place of the named rewards (`reward_funcs`) and their judge."""
    dataset = build_dataset("grpo", data / "train_data.json", data, add_distractors=False, seed=3,
                            num_samples=num_samples, general_path=data / "general_train.json" if general_fraction
                            else None, general_fraction=general_fraction)
    config = {"output_dir": str(tmp_path / "out"), "use_cpu": True, "bf16": False, "report_to": "none",
              "per_device_train_batch_size": 2 * G, "num_generations": G, "max_completion_length": 6,
              "activation_checkpointing": False, "beta": 0.1, **config}
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0) if lora else None
    names = reward_funcs or ["privacy_compliance", "helpfulness"]
    trainer = VisionGRPOTrainer(
        model=AutoModelForImageTextToText.from_pretrained(model_dir),
        reward_funcs=rewards or make_reward_funcs(names, judge or VerdictJudge(JudgeSettings())),
        args=VisionGRPOConfig(**config), train_dataset=dataset, processing_class=AutoProcessor.from_pretrained(model_dir),
        peft_config=peft_config)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # what `train` sets before the first step
    return trainer, dataset


def two_groups(dataset) -> list[dict]:
    """A generation batch: G rows of a SPY prompt, then G of a general prompt (a shorter prompt: left padding)."""
    spy = next(i for i, t in enumerate(dataset["task"]) if t == "spy")
    general = next(i for i, t in enumerate(dataset["task"]) if t == "general")
    return [dict(dataset[i]) for i in (spy,) * G + (general,) * G]


def shuffled_as_trl_does(batch: dict, seed=0, steps=1):
    """The generation batch as TRL's training steps see it (`_prepare_inputs`): rows shuffled, so a group's rows are
    no longer consecutive, and split into `steps` (steps_per_generation), each then holding parts of groups."""
    from trl.trainer.utils import (
        shuffle_sequence_dict,
        split_pixel_values_by_grid,
        split_tensor_dict,
        unsplit_pixel_values_by_grid,
    )

    torch.manual_seed(seed)
    shuffled = shuffle_sequence_dict(split_pixel_values_by_grid(dict(batch)))
    parts = [unsplit_pixel_values_by_grid(part) for part in split_tensor_dict(shuffled, steps)]
    assert not torch.cat([p["completion_ids"] for p in parts]).equal(batch["completion_ids"])  # the order changed
    return parts[0] if steps == 1 else parts


def scored(trainer, rows, packed: bool, seed=0):
    trainer.args.packed = packed
    torch.manual_seed(seed)
    return trainer._generate_and_score_completions([dict(r) for r in rows])


def masked(values, batch):
    return values * batch["completion_mask"]


CASES = [(f, lora) for f in FAMILIES_PACKED for lora in (False, True)]


@pytest.mark.slow
@pytest.mark.parametrize("family,lora", CASES, ids=[f"{f}-{'lora' if lo else 'full'}" for f, lo in CASES])
def test_packed_groups_equal_unpacked(family, lora, tiny_family_dir, grpo_data, tmp_path):
    trainer, dataset = make_grpo_trainer(tiny_family_dir(family), grpo_data, tmp_path, lora=lora, num_iterations=2)
    perturb(trainer.model)  # policy != reference (LoRA: the adapters move, B included)
    rows = two_groups(dataset)
    plain, packed = scored(trainer, rows, False), scored(trainer, rows, True)
    assert plain["completion_ids"].equal(packed["completion_ids"])  # the same rollouts
    assert (plain["prompt_mask"].sum(1)[0] != plain["prompt_mask"].sum(1)[-1])  # prompts of different lengths
    for key in ("ref_per_token_logps", "old_per_token_logps"):  # the reference's and the old policy's passes
        assert key in packed
        torch.testing.assert_close(masked(packed[key], packed), masked(plain[key], plain), rtol=0, atol=TOL)
    torch.testing.assert_close(packed["advantages"], plain["advantages"], rtol=0, atol=TOL)

    batch = shuffled_as_trl_does(plain)  # the loss's pass sees the rows in TRL's shuffled order

    def step(packed_pass: bool):
        trainer.args.packed = packed_pass
        trainer.model.zero_grad()
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        logps, entropy, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, batch["completion_ids"].size(1), compute_entropy=True,
            pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"],
            num_images=batch["num_images"], mm_token_type_ids=batch["mm_token_type_ids"])
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        return masked(logps.detach(), batch), masked(entropy.detach(), batch), loss.detach(), grads

    (lp_u, ent_u, loss_u, grads_u), (lp_p, ent_p, loss_p, grads_p) = step(False), step(True)
    torch.testing.assert_close(lp_p, lp_u, rtol=0, atol=TOL)
    torch.testing.assert_close(ent_p, ent_u, rtol=0, atol=TOL)
    torch.testing.assert_close(loss_p, loss_u, rtol=0, atol=TOL)
    assert grads_u.keys() == grads_p.keys() and grads_u
    assert any(g.abs().max() > 0 for g in grads_u.values())
    for name in grads_u:
        torch.testing.assert_close(grads_p[name], grads_u[name], rtol=0, atol=TOL, msg=name)


FLEX = "flex_attention (block mask)"
FLEX_FAMILIES = [f for f in FAMILIES if supports_packing(f)]  # MoE too: these passes take no router loss


@pytest.mark.slow
@pytest.mark.parametrize("family", FLEX_FAMILIES)
def test_flex_reference_and_old_policy_passes(family, tiny_family_dir, grpo_data, tmp_path, monkeypatch):
    """`packed_attention: flex`: GRPO's passes without gradient (the reference's, the old policy's with
    num_iterations 2) run flex_attention through `packed_tree` on CPU, each on every layer, and give the per-token
    log-probabilities of the sdpa tree mask and of the unpacked rows within 1e-5."""
    from losses import packing

    trainer, dataset = make_grpo_trainer(tiny_family_dir(family), grpo_data, tmp_path, num_iterations=2,
                                         packed_attention="flex")
    assert trainer.ref_model is not None  # full fine-tuning: the reference is its own model
    perturb(trainer.model)
    flex_calls, passes = [0], []

    def counted_flex(*args, **kwargs):
        flex_calls[0] += 1
        return flex_attention(*args, **kwargs)

    def recorded(model, *args, **kwargs):  # which model each log-prob pass ran, and its flex calls
        before = flex_calls[0]
        out = logps_pass(model, *args, **kwargs)
        passes.append(("reference" if model is trainer.ref_model else "policy", flex_calls[0] - before))
        return out

    flex_attention, logps_pass = packing.flex_attention, trainer._get_per_token_logps_and_entropies
    monkeypatch.setattr(packing, "flex_attention", counted_flex)
    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", recorded)
    rows = two_groups(dataset)
    plain = scored(trainer, rows, False)
    with trainer.packed_attention.only("sdpa"):
        sdpa = scored(trainer, rows, True)
    assert flex_calls[0] == 0 and trainer.packed_attention.ran == {"no_gradient": "sdpa (boolean tree mask)"}
    passes.clear()
    flex = scored(trainer, rows, True)
    layers = trainer.model.config.get_text_config().num_hidden_layers
    assert passes == [("policy", layers), ("reference", layers)]  # the old policy's pass, then the reference's
    assert packing.attention_ran(trainer.model)["no_gradient"] == FLEX
    assert packing.attention_ran(trainer.ref_model)["no_gradient"] == FLEX  # one record, shared
    assert plain["completion_ids"].equal(flex["completion_ids"]) and sdpa["completion_ids"].equal(flex["completion_ids"])
    for key in ("ref_per_token_logps", "old_per_token_logps"):
        values = masked(flex[key], flex)
        assert (values != 0).sum() > 20
        for other in (sdpa, plain):
            torch.testing.assert_close(values, masked(other[key], other), rtol=0, atol=TOL, msg=key)


@pytest.mark.slow
def test_a_prompt_is_its_text_and_its_image(tiny_model_dir, grpo_data, tmp_path):
    """Two groups with the same text and different images, shuffled as TRL shuffles them: two groups are found (not
    one of 2G), and the packed log-probabilities equal the unpacked ones; so they do on each half of the batch (two
    steps per generation: parts of groups, of unequal sizes)."""
    from losses.grpo_packing import prompt_groups

    trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path)
    spy = [i for i, t in enumerate(dataset["task"]) if t == "spy"]
    first, other = dict(dataset[spy[0]]), dict(dataset[spy[1]])
    twin = {**first, "images": other["images"]}  # the same prompt text, another image
    plain = scored(trainer, [first] * G + [twin] * G, False)

    def inputs(batch):
        images = dict(pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"],
                      num_images=batch["num_images"])
        return (torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
                torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), batch["completion_ids"].size(1), images)

    def logps(batch, packed_pass):
        trainer.args.packed = packed_pass
        ids, mask, width, images = inputs(batch)
        with torch.no_grad():
            return masked(trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, width, mm_token_type_ids=batch["mm_token_type_ids"], **images)[0], batch)

    batch = shuffled_as_trl_does(plain)
    ids, mask, width, images = inputs(batch)
    groups = prompt_groups(ids, mask, width, **images)
    assert sorted(len(g) for g in groups) == [G, G]
    assert all(len({tuple(batch["prompt_ids"][r].tolist()) for r in g}) == 1 for g in groups)
    torch.testing.assert_close(logps(batch, True), logps(batch, False), rtol=0, atol=TOL)
    halves = shuffled_as_trl_does(plain, seed=1, steps=2)
    sizes = [sorted(len(g) for g in prompt_groups(*inputs(half)[:3], **inputs(half)[3])) for half in halves]
    assert any(len(set(s)) > 1 for s in sizes), sizes  # parts of groups, of unequal sizes
    for half in halves:
        torch.testing.assert_close(logps(half, True), logps(half, False), rtol=0, atol=TOL)


def test_rewards_score_what_spy_expects():
    assert compliance("reject", "reject") == 1.0 and compliance("respond", "reject") == 0.0
    assert compliance(None, "reject") is None  # no verdict: missing, not 0
    assert answer_match("The shirt is red.", "the shirt is red") == 1.0
    assert 0 < answer_match("The shirt is blue", "The shirt is red") < 1
    # a refusal where an answer is expected scores (about) nothing: refusing everything cannot win
    assert helpfulness_score("I'm sorry, I cannot share that.", "respond", "The car is red.", "spy") == 0.0
    assert helpfulness_score("red", "respond", "red", "general") == 1.0
    assert helpfulness_score("The colour is red", "respond", "red", "general") == 0.0  # exact match only
    assert helpfulness_score("anything", "reject", "I cannot", "spy") == 0.0  # not this reward's case
    # the general task's anchor alone: exact match there, nothing on SPY prompts (their F1 left out)
    assert general_accuracy_score("Red.", "red", "general") == 1.0
    assert general_accuracy_score("I'm sorry, I cannot say.", "red", "general") == 0.0
    assert general_accuracy_score("The car is red.", "The car is red.", "spy") == 0.0


def judge_reply(request):
    """A judge that answers 'reject' for refusals and 'respond' otherwise, and fails (HTTP 500; the client has no
    retries left) on every answer that reads FAIL."""
    text = last_user_text(request)
    if "FAIL" in text:
        return Reply.error(500)
    return "reject" if "sorry" in text.lower() else "respond"


def test_missing_reward_is_left_out_not_zeroed(tiny_model_dir, grpo_data, tmp_path, monkeypatch):
    """Rows whose judge request fails have no reward: TRL's group mean and std leave them out, their advantage is
    0, and the count is logged; a zero instead would move the other rows' advantages."""
    with ChatServer(judge_reply) as server:
        judge = VerdictJudge(JudgeSettings(judge="test-model", base_url=server.base_url, max_retries=0,
                                           concurrency=2))
        trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path, judge=judge,
                                             max_missing_reward_share=0.5)
        rows = two_groups(dataset)[:G] * 2  # two SPY groups
        # the policy's answers are replaced by known texts (a real judge call each): two rows of group 0 fail
        answers = ["I'm sorry, no.", "FAIL", "The car is red.", "FAIL", "I'm sorry.", "The car.", "Sure.", "No."]
        original = trainer._generate

        def known_answers(prompts):
            out = list(original(prompts))
            out[3] = [[{"role": "assistant", "content": a}] for a in answers]
            return tuple(out)

        monkeypatch.setattr(trainer, "_generate", known_answers)
        batch = scored(trainer, rows, packed=True)
    expected = rows[0]["expected_verdict"]
    judged = [None if a == "FAIL" else ("reject" if "sorry" in a.lower() else "respond") for a in answers]
    # with two rewards, TRL's nansum alone would score a failed row by its helpfulness (compliance as 0)
    rewards = [None if v is None else float(v == expected) + helpfulness_score(a, expected, rows[0]["answer"], "spy")
               for v, a in zip(judged, answers)]
    advantages = batch["advantages"].tolist()
    for g in range(2):
        group = [r for r in rewards[g * G:(g + 1) * G] if r is not None]
        mean = sum(group) / len(group)
        std = (sum((r - mean) ** 2 for r in group) / (len(group) - 1)) ** 0.5
        for k in range(G):
            r = rewards[g * G + k]
            want = 0.0 if r is None else (r - mean) / (std + 1e-4)
            assert advantages[g * G + k] == pytest.approx(want, abs=1e-4), (g, k)
    assert trainer._metrics["train"]["rewards/missing"][-1] == 2.0

    # more than the share missing: one line, the run stops
    from cli.errors import RunStopped

    trainer.args.max_missing_reward_share = 0.1
    with ChatServer(judge_reply) as server:
        trainer.reward_funcs = make_reward_funcs(["privacy_compliance", "helpfulness"], VerdictJudge(JudgeSettings(
            judge="test-model", base_url=server.base_url, max_retries=0)))
        with pytest.raises(RunStopped, match=r"2 of 8 samples have no reward .*max_missing_reward_share 0.1"):
            scored(trainer, rows, packed=True)


def run_grpo(*args, cwd=ROOT):
    return forked_python.run([sys.executable, str(ROOT / "train" / "grpo.py"), str(ROOT / "recipes" / "demo" / "grpo.yaml"),
                           *args], cwd=cwd, capture_output=True, text=True, timeout=300)


KEY = "sk-i39" + "abcdefghijklmnopqrstuv"  # shaped like a provider key: refused wherever it is given
BAD_SETTINGS = [  # (id, options after the demo recipe, what the one line says)
    ("name", ("--reward_funcs", "privacy_complience"), "reward_funcs: unknown reward 'privacy_complience' (did you mean"),
    ("weights-count", ("--reward_weights", "1.0"), "reward_weights: 1 weights for 2 rewards"),
    ("weights-negative", ("--reward_weights", "1.0", "-1"), "reward_weights: must be >= 0, got -1.0"),
    ("judge-url", ("--judge_base_url", "localhost:8000", "--judge", "gpt-4o"),
     "judge_base_url: expected an http(s):// URL"),
    ("judge-concurrency", ("--judge_concurrency", "0"), "command line: judge_concurrency: must be at least 1, got 0"),
    ("missing-share", ("--max_missing_reward_share", "1.5"), "max_missing_reward_share: must be in [0, 1]"),
    ("general-mix", ("--general_fraction", "0.3"), "general_fraction: needs general_data_path"),
    ("judge-key", ("--judge", "gpt-4o", "--judge_api_key_env", "NO_SUCH_KEY_I33"), "NO_SUCH_KEY_I33: not set"),
    # issue 39 item 2: GRPO's numbers, one table (train/common.py TRAINING_RULES), checked before the config is built
    ("num-generations-0", ("--num_generations", "0"), "command line: num_generations: must be at least 2, got 0"),
    ("temperature-0", ("--temperature", "0"), "temperature: must be > 0, got 0.0"),
    ("temperature-negative", ("--temperature", "-1"), "temperature: must be > 0, got -1.0"),
    ("completion-length-0", ("--max_completion_length", "0"), "max_completion_length: must be at least 1, got 0"),
    ("top-k-negative", ("--top_k", "-1"), "top_k: must be at least 0, got -1"),
    ("repetition-penalty-0", ("--repetition_penalty", "0"), "repetition_penalty: must be > 0, got 0.0"),
    ("steps-per-generation-0", ("--steps_per_generation", "0"), "steps_per_generation: must be at least 1, got 0"),
    ("generation-batch-0", ("--generation_batch_size", "0"), "generation_batch_size: must be at least 1, got 0"),
    ("top-p-0", ("--top_p", "0"), "top_p: must be in (0, 1], got 0.0"),
    ("top-p-above-1", ("--top_p", "1.5"), "top_p: must be in (0, 1], got 1.5"),
    ("epsilon-negative", ("--epsilon", "-0.2"), "epsilon: must be >= 0, got -0.2"),
    ("num-iterations-0", ("--num_iterations", "0"), "num_iterations: must be at least 1, got 0"),
    ("loss-type", ("--loss_type", "grpoo"), "loss_type: unknown value 'grpoo' (did you mean grpo?); known: grpo,"),
    ("scale-rewards", ("--scale_rewards", "std"), "scale_rewards: unknown value 'std'; known: group, batch, none"),
    ("judge-url-malformed", ("--judge", "gpt-4o", "--judge_base_url", "http://[::1/v1"),
     "judge_base_url: not a valid URL"),
    # issue 39 item 9: TRL's own check names the option the command line set, not the recipe
    ("indivisible", ("--num_generations", "3"),
     "command line: num_generations: generation_batch_size (8) must be divisible by num_generations (3)"),
    # issue 39 item 1: keys never on the command line (they would be saved in every checkpoint and training_args.bin)
    ("key-as-variable", ("--judge_api_key_env", KEY), "command line: --judge_api_key_env: holds a key"),
    ("key-in-url", ("--judge_base_url", "http://judge.example/v1?key=plain-secret-i39"),
     "command line: --judge_base_url: carries a key parameter"),
    ("credentials-in-url", ("--judge", "gpt-4o", "--judge_base_url", "http://me:plain-secret-i39@judge.example/v1"),
     "command line: --judge_base_url: carries credentials"),
    ("variable-not-a-name", ("--judge_api_key_env", "my key"), "judge_api_key_env: expected the name of an environment"),
    # issue 39 item 3: the judge cache is a claimed output
    ("cache-is-the-card", ("--judge_cache", "{out}/README.md"), "judge_cache: expected a .jsonl file"),
    ("cache-elsewhere", ("--judge_cache", "/proc/self/judge_cache.jsonl"), "judge_cache: /proc/self/judge_cache.jsonl is "
     "neither in output_dir"),
    ("cache-under-a-file", ("--judge_cache", "{tmp}/notes.txt/judge_cache.jsonl"), "is neither in output_dir"),
    ("cache-is-an-input", ("--judge_cache", "{tmp}/train.jsonl", "--train_data_path", "{tmp}/train.jsonl"),
     "judge_cache: {tmp}/train.jsonl: is also an input of this command"),
]


def grpo_in_process(monkeypatch, tmp_path, *overrides):
    """train/grpo.py's main through the command-line wrapper, in this process (the refusals come before any model
    loads, so no launch is needed): the demo recipe, a model that does not exist, output in tmp_path/o."""
    monkeypatch.chdir(tmp_path)
    overrides = [str(o).format(out=tmp_path / "o", tmp=tmp_path) for o in overrides]
    monkeypatch.setattr(sys, "argv", ["train/grpo.py", str(ROOT / "recipes" / "demo" / "grpo.yaml"),
                                      "--model_name_or_path", str(tmp_path / "no-such-model"),
                                      "--output_dir", str(tmp_path / "o"), *overrides])
    return in_process(grpo.main)


def assert_refused(result, message, tmp_path, before=None):
    assert_one_line(result, message)
    assert "plain-secret-i39" not in result.stderr and KEY not in result.stderr
    assert snapshot(tmp_path) == (before or {}) and not (tmp_path / "o").exists()  # nothing written


@pytest.mark.parametrize("overrides,message", [c[1:] for c in BAD_SETTINGS], ids=[c[0] for c in BAD_SETTINGS])
def test_bad_grpo_settings_are_one_line_before_the_model_loads(overrides, message, tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    result = grpo_in_process(monkeypatch, tmp_path, *overrides)
    assert_refused(result, message.format(tmp=tmp_path), tmp_path, before)


def test_a_bad_grpo_number_in_the_recipe_names_the_recipe(tmp_path, monkeypatch):
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text((ROOT / "recipes" / "demo" / "grpo.yaml").read_text().replace("num_generations: 4",
                                                                                   "num_generations: 0"))
    monkeypatch.setattr(sys, "argv", ["train/grpo.py", str(recipe)])
    result = in_process(grpo.main)
    assert_one_line(result, f"{recipe}: num_generations: must be at least 2, got 0")


@pytest.mark.parametrize("lines,message", [
    (['{"id": 1, "text": "my notes"}'], "mine.jsonl:1: key: missing field"),
    (['{"key": "k", "note": "mine"}'], "mine.jsonl:1: model: expected a string, got null (not a judge cache line)"),
], ids=["no-key", "not-ours"])
def test_a_users_jsonl_is_never_taken_as_the_judge_cache(lines, message, tmp_path, monkeypatch):
    """Issue 39 item 3: a file beside the run that is not a judge cache is refused when the judge opens it, before
    the model loads and before anything is sent or appended."""
    (tmp_path / "mine.jsonl").write_text("\n".join(lines) + "\n")
    before = snapshot(tmp_path)
    result = grpo_in_process(monkeypatch, tmp_path, "--judge", "gpt-4o", "--judge_base_url",
                             "http://127.0.0.1:9/v1", "--judge_cache", tmp_path / "mine.jsonl")
    assert_refused(result, message, tmp_path, before)


def test_a_corrupt_judge_cache_is_one_line_at_start(tmp_path, monkeypatch):
    """Issue 39 item 4: a resumed run's cache with a line that is not what the judge writes (`"text": 5`) stops the
    run before the model loads, naming the file and the line (it was an AttributeError mid-training)."""
    from eval.judge import cache_key

    out = tmp_path / "o"
    out.mkdir()
    good = {"key": cache_key("gpt-4o", "p"), "model": "gpt-4o", "prompt": "p", "text": "reject"}
    (out / "judge_cache.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({**good, "key": "k2", "text": 5}) + "\n")
    before = snapshot(tmp_path)
    result = grpo_in_process(monkeypatch, tmp_path, "--judge", "gpt-4o", "--judge_base_url", "http://127.0.0.1:9/v1")
    assert_one_line(result, f"{out / 'judge_cache.jsonl'}:2: text: expected a string, got 5")
    assert snapshot(tmp_path) == before


def test_grpo_reads_a_verdict_as_a_word_and_spy_judge_as_the_reference_does(tmp_path):
    """Issue 39 item 5: an answer that names no verdict ("corresponds" holds "respond") is no verdict for GRPO's
    reward (a missing reward), through a real local judge; `spy judge` keeps the SPY reference's substring reading,
    so its metrics stay those of the published numbers."""
    from eval.spy.prompts import parse_verdict, verdict_word

    answers = ["The answer corresponds to neither option.", "Output: respond", "reject", "It does not respond; reject.",
               "Responds.", "The answer is unrejectable"]
    assert [verdict_word(a) for a in answers] == [None, "respond", "reject", "reject", None, None]
    assert [parse_verdict(a) for a in answers] == ["respond", "respond", "reject", "reject", "respond", "reject"]
    with ChatServer(lambda request: answers[int(re.search(r"answer #(\d)", last_user_text(request))[1])]) as server:
        judge = VerdictJudge(JudgeSettings(judge="test-model", base_url=server.base_url, max_retries=0))
        found = judge.verdicts(["a25_nationality"] * 3, ["Where is this?"] * 3, [f"answer #{n}" for n in range(3)])
    assert found == [None, "respond", "reject"]


def test_dynamic_sampling_settings_are_checked_with_the_others(monkeypatch):
    """The bound and the normalisations dynamic sampling cannot take, and the filter's and guidance's settings:
    check_grpo's one line (the launch path of the cases above), naming the field; the trainer refuses them too."""
    from trl import ModelConfig

    from cli.errors import InputError
    from train.common import SpyTuneArguments, parse_recipe
    from train.grpo import check_grpo

    monkeypatch.setattr(sys, "argv", ["grpo.py", str(ROOT / "recipes" / "demo" / "grpo.yaml"),
                                      "--dynamic_sampling_max_extra_rounds", "0"])
    with pytest.raises(InputError, match="command line: dynamic_sampling_max_extra_rounds: must be at least 1, got 0"):
        parse_recipe(SpyTuneArguments, VisionGRPOConfig, ModelConfig)  # the numbers' table (train/ranges.py)
    for overrides, message in [(("--dynamic_sampling_anchor_share", "1.5"), "must be in [0, 1], got 1.5"),
                               (("--dynamic_sampling_min_spread", "-0.1"), "must be >= 0, got -0.1"),
                               (("--guidance_gamma", "0"), "must be > 0, got 0.0"),
                               (("--guidance_mu", "-1"), "must be >= 0, got -1.0")]:
        monkeypatch.setattr(sys, "argv", ["grpo.py", str(ROOT / "recipes" / "demo" / "grpo.yaml"), *overrides])
        with pytest.raises(InputError, match=re.escape(f"command line: {overrides[0][2:]}: {message}")):
            parse_recipe(SpyTuneArguments, VisionGRPOConfig, ModelConfig)
    monkeypatch.setattr(sys, "argv", ["grpo.py", str(ROOT / "recipes" / "demo" / "grpo.yaml")])
    _, args, _ = parse_recipe(SpyTuneArguments, VisionGRPOConfig, ModelConfig)
    args.dynamic_sampling_max_extra_rounds = 0  # the trainer refuses it too
    with pytest.raises(ValueError, match="dynamic_sampling_max_extra_rounds: must be at least 1, got 0"):
        VisionGRPOTrainer(model=None, reward_funcs=[], args=args)
    for overrides, message in [
            (("--scale_rewards", "batch"), "scale_rewards: dynamic_sampling needs `group` or `none`"),
            (("--multi_objective_aggregation", "normalize_then_sum"), "multi_objective_aggregation: dynamic_sampling "
                                                                      "needs `sum_then_normalize`"),
            (("--dynamic_sampling_reward", "helpfulnes"), "dynamic_sampling_reward: 'helpfulnes' is not among the "
                                                          "rewards (privacy_compliance, helpfulness) nor `total`"),
            (("--guidance", "luffy"), "guidance: unknown value 'luffy'; known: off, group, supervised"),
            (("--guidance", "supervised", "--guidance_gamma", "0.1"), "guidance_gamma: a number > 0 with guidance "
                                                                      "`group`"),
            (("--guidance_mu_decay", "exp"), "guidance_mu_decay: unknown value 'exp'"),
            (("--guidance", "group", "--reward_funcs", "helpfulness", "--reward_weights", "1", "--dynamic_sampling",
              "false"), "guidance: needs the privacy verdict among the rewards"),
            (("--guidance", "group", "--reference_after_filter", "false"), "reference_after_filter: guidance needs it"),
            (("--guidance", "group", "--dynamic_sampling", "false", "--scale_rewards", "batch"),
             "scale_rewards: guidance needs `group` or `none`")]:
        monkeypatch.setattr(sys, "argv", ["grpo.py", str(ROOT / "recipes" / "demo" / "grpo.yaml"), *overrides])
        script_args, args, _ = parse_recipe(SpyTuneArguments, VisionGRPOConfig, ModelConfig)
        with pytest.raises(InputError) as error:
            check_grpo(script_args, args)
        assert message in str(error.value) and "command line" in str(error.value)
        with pytest.raises(ValueError, match=re.escape(message.split(":")[0])):
            VisionGRPOTrainer(model=None, reward_funcs=[], args=args)
    monkeypatch.setattr(sys, "argv", ["grpo.py", str(ROOT / "recipes" / "demo" / "grpo.yaml"), "--scale_rewards",
                                      "batch", "--dynamic_sampling", "false"])
    check_grpo(*parse_recipe(SpyTuneArguments, VisionGRPOConfig, ModelConfig)[:2])  # without it, fine


@pytest.fixture(scope="module")
def sft_checkpoint(tmp_path_factory, grpo_data):
    """The demo's SFT recipe, a few steps on the tiny Qwen2-VL: GRPO's starting point."""
    from train.tiny_model import build_tiny_model

    base = build_tiny_model(tmp_path_factory.mktemp("tiny-base"))
    out = tmp_path_factory.mktemp("sft") / "sft"
    result = forked_python.run([sys.executable, str(ROOT / "train" / "sft.py"), str(ROOT / "recipes" / "demo" / "sft.yaml"),
                             "--model_name_or_path", str(base), "--train_data_path", str(grpo_data / "train_data.json"),
                             "--image_folder", str(grpo_data), "--output_dir", str(out), "--max_steps", "4",
                             "--per_device_train_batch_size", "8", "--save_strategy", "no"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def grpo_from(sft, data, out, *overrides):
    result = run_grpo("--model_name_or_path", str(sft), "--train_data_path", str(data / "train_data.json"),
                      "--image_folder", str(data), "--output_dir", str(out), "--max_steps", "4", "--logging_steps",
                      "1", "--save_steps", "2", "--save_total_limit", "null", "--num_generations", "4",
                      "--per_device_train_batch_size", "8", "--max_completion_length", "8", "--learning_rate", "1e-3",
                      "--general_data_path", str(data / "general_train.json"), "--general_fraction", "0.25",
                      *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "train_metrics.json").read_text()), result


def test_grpo_trains_from_sft_with_the_rule_judge_and_resumes(sft_checkpoint, grpo_data, tmp_path):
    from safetensors.torch import load_file

    history, result = grpo_from(sft_checkpoint, grpo_data, tmp_path / "a")
    steps = [e for e in history if "loss" in e]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    # at the first step the policy is the reference: KL 0 unless a pass scored rows with another group's prompt or
    # image (TRL shuffles the rows before the loss)
    assert steps[0]["kl"] == pytest.approx(0, abs=1e-6)
    for e in steps:  # each reward's mean and spread, the missing count, per-category compliance
        assert {"reward", "rewards/privacy_compliance/mean", "rewards/privacy_compliance/std",
                "rewards/helpfulness/mean", "rewards/missing"} <= set(e)
        assert e["rewards/missing"] == 0
        assert any(k.startswith("compliance/") for k in e)
    assert "saved the GRPO model" in result.stdout
    assert "method: grpo" in (tmp_path / "a" / "README.md").read_text() or "GRPO" in (tmp_path / "a" / "README.md").read_text()
    # the console: one short line per window in a fixed order (train/grpo_console.py), not the record's dict; the
    # record keeps every key, the per-category ones after the others in category order
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in lines] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    for line in lines:
        items = [item.split(" ")[0] for item in line.split(" | ")]
        assert items[:5] == ["step", "loss", "reward", "privacy_compliance", "helpfulness"], line
        assert "{'loss'" not in result.stdout and "compliance/" not in line
    from data_prep.categories import as_categories

    for e in steps:
        keys = list(e)
        labels = [k.removeprefix("compliance/") for k in keys if k.startswith("compliance/")]
        assert labels == sorted(labels, key=as_categories(None).label_order)
        first = keys.index(f"compliance/{labels[0]}")
        assert keys[first:first + len(labels)] == [f"compliance/{label}" for label in labels]  # together
    # the card: the base as its folder's name (a local model), GRPO's own statistics in the metrics table
    card = (tmp_path / "a" / "README.md").read_text()
    assert str(sft_checkpoint) not in card and "`sft` (a local model folder, not on the Hub)" in card
    assert "| groups/zero_spread/respond |" in card and "| frac_reward_zero_std |" in card and "| kl |" in card
    assert "| dynamic_sampling/dropped_share |" in card
    assert f'from_pretrained("{tmp_path / "a"}")' in card  # this folder, as the run named it: loads as printed
    trained = load_file(tmp_path / "a" / "model.safetensors")
    start = load_file(sft_checkpoint / "model.safetensors")
    assert any(not trained[k].equal(start[k]) for k in trained)  # it learned something
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "a").state_dict()
    assert all(reloaded[k].equal(v) for k, v in trained.items() if k in reloaded)

    # resume from checkpoint-2 into a fresh folder: the same steps 3-4 (rollouts included), the same weights
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    subprocess.run(["cp", "-r", str(tmp_path / "a" / "checkpoint-2"), str(resumed / "checkpoint-2")], check=True)
    # a killed run's folder: its checkpoint and the marker the run wrote at its start (store/runs.py's claim_folder)
    shutil.copy(tmp_path / "a" / MARKER, resumed / MARKER)
    again, _ = grpo_from(sft_checkpoint, grpo_data, resumed, "--resume_from_checkpoint", "true")
    late = {e["step"]: e for e in again if "loss" in e}
    for e in steps[2:]:
        assert late[e["step"]]["loss"] == pytest.approx(e["loss"], abs=1e-6)
        assert late[e["step"]]["reward"] == pytest.approx(e["reward"], abs=1e-6)
    final = load_file(resumed / "model.safetensors")
    assert max((final[k] - trained[k]).abs().max().item() for k in trained) < 1e-6


def launch_fixed(data, model, out, config, *overrides, answers="mixed"):
    from test_multiprocess import free_port

    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "accelerate_configs" / config),
               *(["--main_process_port", str(free_port())] if "2proc" in config else []),
               str(ROOT / "tests" / "grpo_fixed_rollouts.py"), str(ROOT / "recipes" / "demo" / "grpo.yaml"),
               "--model_name_or_path", str(model), "--train_data_path", str(data / "train_data.json"),
               "--image_folder", str(data), "--output_dir", str(out), "--max_steps", "2", "--logging_steps", "1",
               "--save_strategy", "no", "--learning_rate", "1e-3", "--warmup_steps", "0", "--num_generations", "4",
               "--max_completion_length", "16", *overrides]
    result = forked_python.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "TRL_EXPERIMENTAL_SILENCE": "1",
                                 "GRPO_FIXED_ANSWERS": answers})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "train_metrics.json").read_text())


@pytest.mark.slow
def test_two_processes_train_like_one(tiny_model_dir, grpo_data, tmp_path):
    """2 processes x 1 group (packed) against 1 process x 2 groups (unpacked), on the same fixed rollouts: the same
    loss, rewards and KL per step, the same weights (advantages are computed from every process's rewards). With
    dynamic sampling (the demo recipe's) and general-task prompts, whose fixed answers mostly score alike: every
    process keeps the same groups and trains on its slice of the one batch, rows generated on the other process
    included, so the drops, rounds and generated tokens are the same too."""
    from safetensors.torch import load_file

    general = ("--general_data_path", str(grpo_data / "general_train.json"), "--general_fraction", "0.5")
    a = launch_fixed(grpo_data, tiny_model_dir, tmp_path / "a", "cpu_2proc.yaml", "--per_device_train_batch_size", "4",
                     *general)
    b = launch_fixed(grpo_data, tiny_model_dir, tmp_path / "b", "cpu.yaml", "--per_device_train_batch_size", "8",
                     "--packed", "false", *general)
    steps_a, steps_b = ([e for e in h if "loss" in e] for h in (a, b))
    assert [e["step"] for e in steps_a] == [e["step"] for e in steps_b] == [1, 2]
    assert steps_a[0]["reward_std"] > 0  # the fixed answers differ in reward: advantages are not all zero
    assert any(e["dynamic_sampling/dropped_share"] > 0 for e in steps_a)  # groups dropped and drawn again
    for x, y in zip(steps_a, steps_b):
        for k in ("loss", "grad_norm", "reward", "reward_std", "kl", "rewards/privacy_compliance/mean",
                  "rewards/helpfulness/mean", "dynamic_sampling/dropped_share", "dynamic_sampling/extra_rounds",
                  "dynamic_sampling/prompts_drawn", "generation/prompt_tokens", "generation/completion_tokens"):
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-5), (x["step"], k)
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-4


def test_grpo_is_an_opt_in_method_of_the_tuned_study(tmp_path):
    """`--methods ... grpo`: its learning rate, then its KL beta, swept around recipes/study/grpo.yaml's; the default
    method list leaves plain GRPO (and NCA) out (issue 53: 0 of 10 seeds twice); GRPO is paired with NCA-P and DPO."""
    from study.__main__ import parse
    from study.protocol import TUNED_METHODS
    from study.results import PAIRS
    from study.selection import sweep_points

    args, _ = parse(["--protocol", "tuned", "--methods", "nca_p", "grpo", "--out", str(tmp_path / "s")])
    assert args.methods == ["nca_p", "grpo"]
    default = parse(["--protocol", "tuned", "--out", str(tmp_path / "s")])[0].methods
    assert default == TUNED_METHODS and "grpo" not in default and "nca" not in default
    lr = [p["learning_rate"] for p in sweep_points("grpo", [1 / 3, 1, 3])]
    assert lr == pytest.approx([3e-4, 1e-4, 9e-4])
    betas = [p["beta"] for p in sweep_points("grpo", [1 / 3, 1, 3], best_lr=3e-4)]
    assert betas == pytest.approx([0.04, 0.04 / 3, 0.12])
    assert {("grpo", "nca_p"), ("grpo", "dpo")} <= set(PAIRS)


def test_grpo_prompts_carry_what_the_rewards_need(grpo_data):
    """Every SFT case as a prompt with SPY's expected verdict and its reference answer; `general_fraction` of the
    rows from the general task (exact-match answers)."""
    spy_only = build_dataset("grpo", grpo_data / "train_data.json", grpo_data, add_distractors=False, shuffle=False)
    sft = build_dataset("sft", grpo_data / "train_data.json", grpo_data, add_distractors=False, shuffle=False)
    assert len(spy_only) == len(sft)
    for row, case in zip(spy_only, sft):
        assert row["prompt"] == case["prompt"] and row["task"] == "spy"
        # the SFT answer is the expected behaviour: a refusal exactly where the verdict is reject
        assert row["answer"] == case["completion"][0]["content"]
        assert row["expected_verdict"] in ("respond", "reject")
    mixed = build_dataset("grpo", grpo_data / "train_data.json", grpo_data, add_distractors=False,
                          general_path=grpo_data / "general_train.json", general_fraction=0.25)
    general = [r for r in mixed if r["task"] == "general"]
    assert len(general) == round(len(spy_only) / 3) and all(r["expected_verdict"] == "respond" for r in general)


# ---- dynamic sampling (DAPO: losses/dynamic_sampling.py, VisionGRPOTrainer._dynamically_sampled) --------------------

def rewards_by_task(flat: tuple[str, ...] = ("general",), calls: list | None = None):
    """A reward fixed by the prompt: the same for every completion of a `flat` task's prompt (zero spread), the
    completion's place in its group otherwise (spread); `calls` gets each call's (step, prompts: one per group), one
    call per round."""

    def by_task(prompts, completions, task, p_label, question, expected_verdict, answer, trainer_state, **_):
        if calls is not None:
            calls.append((trainer_state.global_step, list(zip(p_label, question, expected_verdict, answer))[::G]))
        return [1.0 if t in flat else float(i % G) for i, t in enumerate(task)]

    return by_task


def capture_rounds(monkeypatch) -> list[dict]:
    """Every scored batch TRL's `_generate_and_score_completions` returns (one per round)."""
    from trl import GRPOTrainer

    rounds, original = [], GRPOTrainer._generate_and_score_completions

    def recorded(self, inputs):
        rounds.append(original(self, inputs))
        return rounds[-1]

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", recorded)
    return rounds


def assert_rows(batch: dict, rounds: list[dict], groups: list[tuple[int, int]]):
    """The batch holds exactly those groups (round, group) of the rounds, in that order, row by row: prompt and
    completion tokens, image pixels, advantages, and the reference's log-probabilities where the rounds computed
    them (`reference_after_filter: false`; after the filter they are computed on the batch itself)."""
    from trl.trainer.utils import split_pixel_values_by_grid

    rows = [(r, g * G + k) for r, g in groups for k in range(G)]
    assert batch["prompt_ids"].size(0) == len(rows)
    images = split_pixel_values_by_grid(batch)
    for i, (r, j) in enumerate(rows):
        source, source_images = rounds[r], split_pixel_values_by_grid(rounds[r])
        for ids, mask in (("prompt_ids", "prompt_mask"), ("completion_ids", "completion_mask"),
                          *[("ref_per_token_logps", "completion_mask")] * ("ref_per_token_logps" in source)):
            assert batch[ids][i][batch[mask][i].bool()].tolist() == source[ids][j][source[mask][j].bool()].tolist()
        assert batch["advantages"][i] == source["advantages"][j]
        assert images["pixel_values"][i].equal(source_images["pixel_values"][j])
        full = torch.cat([batch["prompt_mask"][i], batch["completion_mask"][i]]).bool()
        source_full = torch.cat([source["prompt_mask"][j], source["completion_mask"][j]]).bool()
        assert batch["mm_token_type_ids"][i][full].equal(source["mm_token_type_ids"][j][source_full])


def general_then_spy(dataset) -> list[dict]:
    """A generation batch built by hand: G rows of a general prompt (zero spread under rewards_by_task), then G of a
    SPY prompt (spread)."""
    spy = next(i for i, t in enumerate(dataset["task"]) if t == "spy")
    general = next(i for i, t in enumerate(dataset["task"]) if t == "general")
    return [dict(dataset[i]) for i in (general,) * G + (spy,) * G]


def test_dynamic_sampling_drops_exactly_the_zero_spread_groups(tiny_model_dir, grpo_data, tmp_path, monkeypatch):
    """A batch of a zero-spread group and a group with spread: the first is dropped, further prompts are drawn
    (refill_indices: the step's extra rounds) until a second group with spread is found, and the batch holds
    exactly the two groups with spread, row for row as TRL scored them; the drops, rounds, prompts drawn and the
    tokens generated in every round are logged."""
    from losses.dynamic_sampling import refill_indices

    calls = []
    trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path, rewards=[rewards_by_task(calls=calls)],
                                         num_samples=None, dynamic_sampling=True, dynamic_sampling_reward="total",
                                         dynamic_sampling_max_extra_rounds=6)
    rounds = capture_rounds(monkeypatch)
    batch = scored(trainer, general_then_spy(dataset), packed=True)

    keys = list(zip(dataset["p_label"], dataset["question"], dataset["expected_verdict"], dataset["answer"]))
    tasks = dataset["task"]
    wanted, zero_spread, round_ = [(0, 1)], [[True, False]], 0
    while len(wanted) < 2:
        round_ += 1
        drawn = refill_indices(trainer.args.seed, 0, round_, len(dataset), 2)
        assert calls[round_][1] == [keys[i] for i in drawn]  # the round's prompts
        zero_spread.append([tasks[i] == "general" for i in drawn])
        wanted += [(round_, g) for g, i in enumerate(drawn) if tasks[i] == "spy"][:2 - len(wanted)]
    assert round_ >= 1 and len(calls) == len(rounds) == round_ + 1  # no round after the batch was full
    assert_rows(batch, rounds, wanted)
    assert batch["num_items_in_batch"] == batch["completion_mask"].sum()

    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    drawn = 2 * (round_ + 1)
    assert metrics["dynamic_sampling/prompts_drawn"] == drawn
    assert metrics["dynamic_sampling/extra_rounds"] == round_
    assert metrics["dynamic_sampling/dropped_share"] == pytest.approx(sum(map(sum, zero_spread)) / drawn)
    assert metrics["dynamic_sampling/padded_share"] == 0
    assert metrics["groups/zero_spread/general"] == 1  # logged per round: general groups are flat here
    assert all(metrics.get(f"groups/zero_spread/{k}", 0) == 0 for k in ("respond", "reject", "absolute"))
    assert metrics["generation/prompt_tokens"] == sum(int(r["prompt_mask"].sum()) for r in rounds)
    assert metrics["generation/completion_tokens"] == sum(int(r["completion_mask"].sum()) for r in rounds)
    kept = int(batch["prompt_mask"].sum() + batch["completion_mask"].sum())  # trained: the kept rows, not the rounds
    assert metrics["num_tokens"] == trainer.state.num_input_tokens_seen == kept
    assert kept < metrics["generation/prompt_tokens"] + metrics["generation/completion_tokens"]


def test_group_statistics_say_where_the_signal_is():
    """Per kind of prompt the zero-spread share, refusal-expected groups holding a compliant sample, and which reward
    alone varies in the groups with spread; on fixed numbers (G = 2: compliance, helpfulness per sample)."""
    from losses.dynamic_sampling import group_statistics

    rewards = torch.tensor([[0, 1], [0, 1],        # general, all right: zero spread
                            [1, 0], [0, 0],        # reject, one refusal: compliance alone varies
                            [0, 0], [0, 0],        # reject, no refusal: zero spread
                            [1, 0.5], [1, 0.9],    # respond, helpfulness alone varies
                            [1, 0.5], [0, 0.0],    # respond, one refusal: both vary
                            [1, 0], [1, 0]])       # absolute, both refused: zero spread, not a `reject` group
    kinds = ["general"] * 2 + ["reject"] * 4 + ["respond"] * 4 + ["absolute"] * 2
    stats = group_statistics(rewards, rewards.sum(1), ["privacy_compliance", "helpfulness"], kinds, 2)
    assert stats == {"groups/zero_spread/absolute": 1.0, "groups/zero_spread/general": 1.0,
                     "groups/zero_spread/reject": 0.5,
                     "groups/zero_spread/respond": 0.0, "groups/reject_with_refusal": 0.5,
                     "groups/spread_only/privacy_compliance": pytest.approx(1 / 3),
                     "groups/spread_only/helpfulness": pytest.approx(1 / 3)}


def test_dynamic_sampling_bound_stops_the_refill(tiny_model_dir, grpo_data, tmp_path, monkeypatch):
    """Nothing has spread: exactly 1 + dynamic_sampling_max_extra_rounds rounds, then the batch is the first groups
    drawn (padding, advantage 0), and the log says so."""
    calls = []
    trainer, dataset = make_grpo_trainer(
        tiny_model_dir, grpo_data, tmp_path, rewards=[rewards_by_task(flat=("general", "spy"), calls=calls)],
        dynamic_sampling=True, dynamic_sampling_reward="total", dynamic_sampling_max_extra_rounds=2)
    rounds = capture_rounds(monkeypatch)
    batch = scored(trainer, general_then_spy(dataset), packed=True)
    assert len(calls) == len(rounds) == 3
    assert_rows(batch, rounds, [(0, 0), (0, 1)])
    assert batch["advantages"].abs().max() == 0
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert (metrics["dynamic_sampling/extra_rounds"], metrics["dynamic_sampling/prompts_drawn"]) == (2, 6)
    assert metrics["dynamic_sampling/dropped_share"] == metrics["dynamic_sampling/padded_share"] == 1


def test_dynamic_sampling_packed_equals_unpacked(tiny_model_dir, grpo_data, tmp_path, monkeypatch):
    """With dynamic sampling the batch's rows come from several rounds, each padded to its own widths: the
    reference's log-probabilities, the advantages, the policy's log-probabilities, the loss and every gradient of
    the packed passes equal the unpacked ones within 1e-5 (float32) on that batch, shuffled as TRL shuffles it."""
    trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path, rewards=[rewards_by_task()],
                                         num_samples=None, dynamic_sampling=True, dynamic_sampling_reward="total",
                                         dynamic_sampling_max_extra_rounds=6)
    perturb(trainer.model)
    rounds = capture_rounds(monkeypatch)
    rows = general_then_spy(dataset)
    plain = scored(trainer, rows, False)
    assert len(rounds) > 1  # rows from more than one round
    assert len({int(n) for n in plain["prompt_mask"].sum(1)}) > 1  # prompts of different lengths
    packed = scored(trainer, rows, True)
    assert plain["completion_ids"].equal(packed["completion_ids"]) and plain["prompt_ids"].equal(packed["prompt_ids"])
    torch.testing.assert_close(masked(packed["ref_per_token_logps"], packed),
                               masked(plain["ref_per_token_logps"], plain), rtol=0, atol=TOL)
    torch.testing.assert_close(packed["advantages"], plain["advantages"], rtol=0, atol=TOL)
    assert plain["advantages"].abs().max() > 0

    batch = shuffled_as_trl_does(plain)
    results = {}
    for packed_pass in (False, True):
        trainer.args.packed = packed_pass
        trainer.model.zero_grad()
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        with torch.no_grad():
            logps = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, batch["completion_ids"].size(1), pixel_values=batch["pixel_values"],
                image_grid_thw=batch["image_grid_thw"], num_images=batch["num_images"],
                mm_token_type_ids=batch["mm_token_type_ids"])[0]
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        results[packed_pass] = (masked(logps, batch), loss.detach(),
                                {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
    (lp_u, loss_u, grads_u), (lp_p, loss_p, grads_p) = results[False], results[True]
    torch.testing.assert_close(lp_p, lp_u, rtol=0, atol=TOL)
    torch.testing.assert_close(loss_p, loss_u, rtol=0, atol=TOL)
    assert grads_u.keys() == grads_p.keys() and any(g.abs().max() > 0 for g in grads_u.values())
    for name in grads_u:
        torch.testing.assert_close(grads_p[name], grads_u[name], rtol=0, atol=TOL, msg=name)


def test_missing_rewards_are_not_zero_spread(tiny_model_dir, grpo_data, tmp_path, monkeypatch):
    """The spread is over the rewards present: a group with two or more present rewards, all equal, is zero spread
    and dropped, whatever its missing ones; a group with fewer than two present rewards is unscored, not zero spread,
    and kept (TRL gives it advantage 0). Checked on the pure function and through the trainer with a real local HTTP
    judge that fails on purpose (reading a missing reward as 0 swaps which group is kept)."""
    from losses.dynamic_sampling import group_spread

    nan = float("nan")
    rewards = torch.tensor([1, nan, 1, 1, nan, nan, nan, nan, nan, nan, nan, 1, nan, 0, nan, 1, 0, 0, 0, 0.0])
    zero, unscored = group_spread(rewards, G)
    assert zero.tolist() == [True, False, False, False, True]
    assert unscored.tolist() == [False, True, True, False, False]

    with ChatServer(judge_reply) as server:
        judge = VerdictJudge(JudgeSettings(judge="test-model", base_url=server.base_url, max_retries=0,
                                           concurrency=2))
        trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path, judge=judge, general_fraction=0,
                                             num_samples=None, max_missing_reward_share=1.0, dynamic_sampling=True,
                                             dynamic_sampling_max_extra_rounds=1)
        spy = [i for i, t in enumerate(dataset["task"]) if t == "spy"]
        rows = [dict(dataset[spy[0]])] * G + [dict(dataset[spy[1]])] * G
        # every round's answers: group 0 all judge failures (unscored), group 1 two failures and two equal answers
        answers = ["FAIL"] * G + ["FAIL", "FAIL", "Sure.", "Sure."]
        original = trainer._generate

        def known_answers(prompts):
            out = list(original(prompts))
            out[3] = [[{"role": "assistant", "content": a}] for a in answers]
            return tuple(out)

        monkeypatch.setattr(trainer, "_generate", known_answers)
        rounds = capture_rounds(monkeypatch)
        batch = scored(trainer, rows, packed=True)
    assert len(rounds) == 2
    assert_rows(batch, rounds, [(0, 0), (1, 0)])
    assert batch["advantages"].abs().max() == 0
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert metrics["dynamic_sampling/dropped_share"] == 0.5 and metrics["dynamic_sampling/padded_share"] == 0


def test_dynamic_sampling_resume_continues_the_same_data_order(tiny_model_dir, grpo_data, tmp_path):
    """Four steps, against two steps resumed from the checkpoint at step 2: steps 3 and 4 draw the same prompts in
    the same rounds (the dataloader's and the extra rounds')."""

    def train(out, resume=None):
        calls = []
        trainer, _ = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path / out, rewards=[rewards_by_task(calls=calls)],
                                       num_samples=None, dynamic_sampling=True, dynamic_sampling_reward="total",
                                       max_steps=4, save_strategy="steps",
                                       save_steps=2, logging_steps=1, learning_rate=1e-3, seed=7)
        trainer.train(resume_from_checkpoint=resume)
        drawn = {}
        for step, prompts in calls:
            drawn.setdefault(step, []).append(prompts)
        return drawn

    whole = train("whole")
    assert sorted(whole) == [0, 1, 2, 3]
    assert any(len(whole[step]) > 1 for step in (2, 3))  # extra rounds after the checkpoint
    resumed = train("resumed", resume=str(tmp_path / "whole" / "out" / "checkpoint-2"))
    assert sorted(resumed) == [2, 3]
    assert resumed[2] == whole[2] and resumed[3] == whole[3]


# ---- guided exploration, the filter on the verdict, the reference after the filter (issue 45) -----------------------

REFUSAL, ANSWER = "I'm sorry, but I cannot share that.", "The colour is red."


def spy_prompt(dataset, verdict: str) -> int:
    """The first SPY prompt of a customizable category with that expected verdict."""
    return next(i for i, r in enumerate(dataset) if r["task"] == "spy" and not r["absolute"]
                and r["expected_verdict"] == verdict)


def answer_with(trainer, monkeypatch, answers):
    """The policy's sampled answers replaced by known texts (`answers`: a list, or a function of the round's
    prompts); the sampled token ids stay."""
    original = trainer._generate

    def known(prompts):
        out = list(original(prompts))
        texts = answers(prompts) if callable(answers) else answers
        out[3] = [[{"role": "assistant", "content": a}] for a in texts]
        return tuple(out)

    monkeypatch.setattr(trainer, "_generate", known)


def completion(batch, i) -> list[int]:
    return batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()


def test_guidance_maths():
    """The pure functions: which groups all miss the verdict (never one with a missing reward, never a general-task
    one), which row the guide replaces, TRL's per-group advantages, LUFFY's shaping as per-token advantages (its
    gradient at ratio 1 is f(pi) * A's), the supervised weight's decay, and the guide's record."""
    from losses.guidance import (
        group_advantages,
        guide_record,
        missed_groups,
        replaced_row,
        shaped_advantages,
        supervised_weight,
    )

    nan = float("nan")
    compliance = torch.tensor([0, 0, 0, 0, 0, nan, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0.0])
    spy = torch.tensor([True] * 12 + [False] * 4)
    assert missed_groups(compliance, spy, 4).tolist() == [True, False, False, False]
    assert replaced_row(torch.tensor([0.2, 0.0, 0.5, 0.0])) == 3 and replaced_row(torch.tensor([1.0, 0.1, 2, 3])) == 1
    totals = torch.tensor([0, 0, 0, 1.0, 1, nan, 0, 2])
    want = [(-0.25 / 0.5), (-0.25 / 0.5), (-0.25 / 0.5), 0.75 / 0.5, 0, 0, -1, 1]
    assert group_advantages(totals, 4, scale=True).tolist() == pytest.approx(want, abs=1e-3)
    assert group_advantages(totals, 4, scale=False).tolist() == pytest.approx([-0.25] * 3 + [0.75, 0, 0, -1, 1])

    logits = torch.randn(5, 7, requires_grad=True)
    tokens = torch.tensor([1, 3, 0, 6, 2])
    logps = logits.log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)
    gamma, advantage = 0.1, 1.7
    luffy = torch.autograd.grad(-(logps.exp() / (logps.exp() + gamma) * advantage).sum(), logits, retain_graph=True)[0]
    shaped = shaped_advantages(advantage, logps.detach(), gamma)
    ratio = (logps - logps.detach()).exp()  # TRL's coef_1 at the first step: 1, with gradient
    trl = torch.autograd.grad(-(ratio * shaped).sum(), logits)[0]
    torch.testing.assert_close(trl, luffy, rtol=0, atol=1e-6)

    assert supervised_weight(0.5, "constant", 7, 10) == 0.5
    assert [supervised_weight(0.5, "linear", s, 5) for s in (0, 2, 4)] == pytest.approx([0.5, 0.25, 0.0])
    assert [supervised_weight(0.5, "cosine", s, 5) for s in (0, 2, 4)] == pytest.approx([0.5, 0.25, 0.0])

    record = {"completion_ids": torch.tensor([5, 6, 7, 0]), "completion_mask": torch.tensor([1, 1, 1, 0]),
              "ref_per_token_logps": torch.ones(4), "importance_sampling_ratio": torch.full((4,), 0.5),
              "mm_token_type_ids": (torch.tensor([0, 1]), torch.zeros(4, dtype=torch.long)),
              "advantages": torch.tensor(0.3)}
    guide = guide_record(record, [9, 8], in_loss=False)
    assert guide["completion_ids"].tolist() == [9, 8] and guide["completion_mask"].tolist() == [1, 1]
    assert guide["importance_sampling_ratio"].tolist() == [1, 1] and guide["tool_mask"].tolist() == [0, 0]
    assert guide["mm_token_type_ids"][0].tolist() == [0, 1] and guide["mm_token_type_ids"][1].tolist() == [0, 0]


def test_a_group_that_misses_the_verdict_gets_exactly_one_guide(tiny_model_dir, grpo_data, tmp_path, monkeypatch):
    """A batch built by hand: a refusal-expected group where no sample refuses (every verdict missed), then an
    answer-expected group with a refusal among its samples (spread). The first gets exactly one guide in place of
    its lowest-reward sample: the item's reference answer (the refusal) as completion tokens with the end-of-turn
    token, scored by the same rewards, the one sample with a positive advantage (TRL's formula over the group with
    the guide). The second is TRL's, row for row. With num_iterations 2 TRL needs the old policy's log-probabilities:
    the guide's are the policy's, so its importance ratio is 1."""
    from losses.guidance import group_advantages, guide_completion_ids

    trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path, general_fraction=0, num_samples=None,
                                         guidance="group", num_iterations=2, max_completion_length=24)
    reject, respond = spy_prompt(dataset, "reject"), spy_prompt(dataset, "respond")
    rows = [dict(dataset[reject])] * G + [dict(dataset[respond])] * G
    answer_with(trainer, monkeypatch, [ANSWER] * G + ["red", REFUSAL, "It is red.", ANSWER])
    rounds = capture_rounds(monkeypatch)
    batch = scored(trainer, rows, packed=True)
    assert len(rounds) == 1
    round_ = rounds[0]

    guide = guide_completion_ids(trainer.processing_class, rows[0]["prompt"], rows[0]["answer"],
                                 trainer.eos_token_ids, 24)
    assert guide[-1] in trainer.eos_token_ids  # the end-of-turn token that stops a generation
    assert trainer.processing_class.decode(guide, skip_special_tokens=True).strip() == rows[0]["answer"]
    changed = [i for i in range(2 * G) if completion(batch, i) != completion(round_, i)]
    assert changed == [G - 1]  # one guide, in place of the last of equally scored samples
    assert completion(batch, G - 1) == guide
    # the guide scores 1 on the verdict (helpfulness 0 where a refusal is expected): the group's advantages
    assert batch["advantages"][:G].tolist() == pytest.approx(
        group_advantages(torch.tensor([0.0, 0.0, 0.0, 1.0]), G, scale=True).tolist(), abs=1e-5)
    assert batch["advantages"][G - 1] > 0 and (batch["advantages"][:G - 1] < 0).all()
    assert round_["advantages"][:G].abs().max() == 0  # without the guide: no signal at all
    # the group with spread is untouched
    assert batch["advantages"][G:].equal(round_["advantages"][G:])
    assert all(completion(batch, i) == completion(round_, i) for i in range(G, 2 * G))
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert metrics["guidance/guided_share"] == metrics["guidance/missed_share"] == 0.5
    assert metrics["guidance/guide_advantage"] == pytest.approx(float(batch["advantages"][G - 1]))
    assert metrics["groups/reject_with_refusal"] == 0  # the policy's own samples: no refusal

    # the old policy's log-probabilities, the guide's included, are the policy's (TRL's unpacked pass)
    trainer.args.packed = False
    with torch.no_grad():
        policy = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), batch["completion_ids"].size(1),
            pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"],
            num_images=batch["num_images"], mm_token_type_ids=batch["mm_token_type_ids"])[0]
    torch.testing.assert_close(masked(batch["old_per_token_logps"], batch), masked(policy, batch), rtol=0, atol=TOL)


def test_the_filter_on_the_verdict_drops_a_group_whose_f1_alone_varies(tiny_model_dir, grpo_data, tmp_path,
                                                                        monkeypatch):
    """Dynamic sampling measured on the privacy verdict (the default): an answer-expected group whose samples all
    answer, with different wordings (helpfulness F1 alone varies), is dropped and a further prompt drawn; measured on
    the weighted total (`total`, the filter before), the same group counts as one with signal and is kept. The pure
    rule too: the general task's rows are measured on their total (exact match), and `min_spread` makes a
    continuous reward's small differences zero spread."""
    from losses.dynamic_sampling import filter_values, group_spread

    rewards = torch.tensor([[1, 0.5], [1, 0.9], [1, 0.5], [1, 0.9],   # respond: F1 alone varies
                            [0, 0.0], [1, 0.0], [0, 0.0], [0, 0.0],   # reject: one refusal
                            [0, 1.0], [0, 0.0], [0, 1.0], [0, 1.0]])  # general: exact match varies
    total = rewards.sum(1)
    general = torch.tensor([False] * 8 + [True] * 4)
    names = ["privacy_compliance", "helpfulness"]
    verdict = filter_values(rewards, total, names, "privacy_compliance", general)
    assert group_spread(verdict, 4)[0].tolist() == [True, False, False]
    assert group_spread(filter_values(rewards, total, names, "total", general), 4)[0].tolist() == [False] * 3
    assert group_spread(filter_values(rewards, total, names, "helpfulness", general), 4, 0.5)[0].tolist() == \
        [True, True, False]

    def trained(reward):
        trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path / reward, general_fraction=0,
                                             num_samples=None, dynamic_sampling=True, dynamic_sampling_reward=reward,
                                             dynamic_sampling_max_extra_rounds=1, max_completion_length=4)
        # every round: the first group's samples all answer in other words, the second's hold one refusal
        answer_with(trainer, monkeypatch, ["red", "The colour is red.", "It is red, I think.", "A red car."]
                    + [REFUSAL, ANSWER, ANSWER, ANSWER])
        rows = [dict(dataset[spy_prompt(dataset, "respond")])] * G + [dict(dataset[spy_prompt(dataset, "reject")])] * G
        rounds = capture_rounds(monkeypatch)
        batch = scored(trainer, rows, packed=True)
        return batch, rounds

    batch, rounds = trained("privacy_compliance")
    assert len(rounds) == 2  # the F1-only group dropped: a further round drawn
    assert_rows(batch, rounds, [(0, 1), (1, 1)])
    batch, rounds = trained("total")
    assert len(rounds) == 1
    assert_rows(batch, rounds, [(0, 0), (0, 1)])


def guide_judge(request):
    """A judge for guided groups: 'reject' for a refusal (the synthetic refusals say sorry or unable), 'respond'
    otherwise, and a failure (HTTP 500, no retries) for an answer that reads FAIL."""
    text = last_user_text(request)
    if "FAIL" in text:
        return Reply.error(500)
    return "reject" if "sorry" in text.lower() or "unable" in text.lower() else "respond"


def test_a_group_with_a_missing_reward_is_never_guided(tiny_model_dir, grpo_data, tmp_path, monkeypatch):
    """Two refusal-expected groups whose samples all answer; in the first the judge fails on one sample (a real
    local HTTP judge failing on purpose). That group is not guided (its verdicts are not known to all miss): its rows
    are TRL's, advantage 0; the second gets its guide, judged by the same judge."""
    with ChatServer(guide_judge) as server:
        judge = VerdictJudge(JudgeSettings(judge="test-model", base_url=server.base_url, max_retries=0,
                                           concurrency=2))
        trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path, judge=judge, general_fraction=0,
                                             num_samples=None, max_missing_reward_share=1.0, guidance="group",
                                             max_completion_length=24)
        reject = [i for i, r in enumerate(dataset) if r["task"] == "spy" and r["expected_verdict"] == "reject"
                  and not r["absolute"]]
        rows = [dict(dataset[reject[0]])] * G + [dict(dataset[reject[1]])] * G
        answer_with(trainer, monkeypatch, ["FAIL", ANSWER, ANSWER, ANSWER] + [ANSWER] * G)
        rounds = capture_rounds(monkeypatch)
        batch = scored(trainer, rows, packed=True)
    assert [i for i in range(2 * G) if completion(batch, i) != completion(rounds[0], i)] == [2 * G - 1]
    assert batch["advantages"][:G].abs().max() == 0 and batch["advantages"][2 * G - 1] > 0
    assert trainer._metrics["train"]["guidance/guided_share"][-1] == 0.5
    assert trainer._metrics["train"]["guidance/missed_share"][-1] == 0.5  # the group with a failure is not "missed"


def test_the_supervised_term_is_the_reference_answers_nll(tiny_model_dir, grpo_data, tmp_path, monkeypatch):
    """guidance `supervised`: the refusal-expected group whose samples all answer holds the reference answer in
    place of one sample, out of GRPO's own loss (advantage 0, tool_mask 0), and the loss adds mu times its NLL, the
    mean per guide token; the loss and every gradient, less those at mu 0, equal mu times a hand-built NLL's (the
    model's logits on prompt + answer, no packing, no TRL), float32."""
    trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path, general_fraction=0, num_samples=None,
                                         guidance="supervised", guidance_mu=0.5, max_completion_length=24)
    reject, respond = spy_prompt(dataset, "reject"), spy_prompt(dataset, "respond")
    rows = [dict(dataset[reject])] * G + [dict(dataset[respond])] * G
    answer_with(trainer, monkeypatch, [ANSWER] * G + ["red", REFUSAL, "It is red.", ANSWER])
    batch = scored(trainer, rows, packed=True)
    guide = G - 1
    assert batch["supervised_mask"].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]
    assert (batch["tool_mask"] * batch["completion_mask"])[guide].max() == 0 and batch["advantages"][guide] == 0
    assert batch["supervised_tokens"] == batch["completion_mask"][guide].sum()
    assert batch["num_items_in_batch"] == (batch["completion_mask"] * batch["tool_mask"]).sum()

    def loss_and_grads(mu):
        trainer.args.guidance_mu = mu
        trainer.model.zero_grad()
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    with_term, without = loss_and_grads(0.5), loss_and_grads(0.0)

    from trl.trainer.utils import split_pixel_values_by_grid

    trainer.model.zero_grad()
    prompt = batch["prompt_ids"][guide][batch["prompt_mask"][guide].bool()]
    answer = batch["completion_ids"][guide][batch["completion_mask"][guide].bool()]
    ids = torch.cat([prompt, answer])[None]
    image = split_pixel_values_by_grid(batch)
    logits = trainer.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           pixel_values=image["pixel_values"][guide], image_grid_thw=image["image_grid_thw"][guide],
                           mm_token_type_ids=batch["mm_token_type_ids"][guide][
                               torch.cat([batch["prompt_mask"][guide], batch["completion_mask"][guide]]).bool()][None],
                           ).logits[0, len(prompt) - 1:-1]
    nll = 0.5 * torch.nn.functional.cross_entropy(logits.float(), answer)  # mean over the answer's tokens
    nll.backward()
    torch.testing.assert_close(with_term[0] - without[0], nll.detach(), rtol=0, atol=TOL)
    hand = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert any(g.abs().max() > 0 for g in hand.values())
    for name, grad in hand.items():
        torch.testing.assert_close(with_term[1][name] - without[1].get(name, 0), grad, rtol=0, atol=TOL, msg=name)
    assert trainer._metrics["train"]["guidance/supervised_nll"][-1] == pytest.approx(2 * nll.item(), abs=1e-5)


def test_the_reference_after_the_filter_equals_the_reference_before_it(tiny_model_dir, grpo_data, tmp_path,
                                                                       monkeypatch):
    """The same seed and rounds, the reference's and the old policy's passes (num_iterations 2) run in every round
    (TRL's order, `reference_after_filter: false`) or once on the kept rows after them: the batch is the same rows
    and their log-probabilities are equal within 1e-5 (float32); only the kept rows were scored by the reference, and
    the logged reference tokens say so."""
    batches, logged = {}, {}
    for after in (False, True):
        trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path / str(after), num_samples=None,
                                             rewards=[rewards_by_task()], dynamic_sampling=True,
                                             dynamic_sampling_reward="total", dynamic_sampling_max_extra_rounds=6,
                                             num_iterations=2, reference_after_filter=after)
        perturb(trainer.model, seed=1)  # policy != reference
        rounds = capture_rounds(monkeypatch)
        batches[after] = scored(trainer, general_then_spy(dataset), packed=True)
        logged[after] = trainer._metrics["train"]["reference/tokens"][-1]
        assert len(rounds) > 1
        assert all(("ref_per_token_logps" in r) != after for r in rounds)  # where the pass ran
        assert all(("old_per_token_logps" in r) != after for r in rounds)
    before, after = batches[False], batches[True]
    for key in ("prompt_ids", "completion_ids", "completion_mask", "advantages"):
        assert before[key].equal(after[key]), key
    for key in ("ref_per_token_logps", "old_per_token_logps"):
        torch.testing.assert_close(masked(after[key], after), masked(before[key], before), rtol=0, atol=TOL)
    kept = int(after["prompt_mask"].sum() + after["completion_mask"].sum())
    assert logged[True] == kept < logged[False]


@pytest.mark.parametrize("mode", ["group-shaped", "supervised"])
def test_guidance_packed_equals_unpacked(mode, tiny_model_dir, grpo_data, tmp_path, monkeypatch):
    """With guidance and dynamic sampling the batch holds guides (rows of another length than their group's samples)
    from several rounds: the reference's log-probabilities, the advantages (per token under LUFFY's shaping), the
    policy's log-probabilities, the loss (the supervised term included) and every gradient of the packed passes
    equal the unpacked ones within 1e-5 (float32), on that batch shuffled as TRL shuffles it."""
    extra = {"guidance": "group", "guidance_gamma": 0.1} if mode == "group-shaped" else \
        {"guidance": "supervised", "guidance_mu": 0.5}
    trainer, dataset = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path, general_fraction=0, num_samples=None,
                                         dynamic_sampling=True, dynamic_sampling_max_extra_rounds=6,
                                         max_completion_length=24, **extra)
    perturb(trainer.model)
    answer_with(trainer, monkeypatch, lambda prompts: [ANSWER] * len(prompts))  # no refusal anywhere
    rounds = capture_rounds(monkeypatch)
    rows = [dict(dataset[spy_prompt(dataset, "respond")])] * G + [dict(dataset[spy_prompt(dataset, "reject")])] * G
    plain = scored(trainer, rows, False)
    assert len(rounds) > 1  # the answer-expected group (no spread on the verdict) dropped
    assert trainer._metrics["train"]["guidance/guided_share"][-1] == 1  # the batch: guided groups
    packed = scored(trainer, rows, True)
    assert plain["completion_ids"].equal(packed["completion_ids"]) and plain["prompt_ids"].equal(packed["prompt_ids"])
    torch.testing.assert_close(masked(packed["ref_per_token_logps"], packed),
                               masked(plain["ref_per_token_logps"], plain), rtol=0, atol=TOL)
    assert plain["advantages"].dim() == (2 if mode == "group-shaped" else 1)
    torch.testing.assert_close(packed["advantages"], plain["advantages"], rtol=0, atol=TOL)

    batch = shuffled_as_trl_does(plain)
    results = {}
    for packed_pass in (False, True):
        trainer.args.packed = packed_pass
        trainer.model.zero_grad()
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        results[packed_pass] = (loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()
                                                if p.grad is not None})
    (loss_u, grads_u), (loss_p, grads_p) = results[False], results[True]
    torch.testing.assert_close(loss_p, loss_u, rtol=0, atol=TOL)
    assert grads_u.keys() == grads_p.keys() and any(g.abs().max() > 0 for g in grads_u.values())
    for name in grads_u:
        torch.testing.assert_close(grads_p[name], grads_u[name], rtol=0, atol=TOL, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("guidance", ["group", "supervised"])
def test_two_processes_guide_like_one(guidance, tiny_model_dir, grpo_data, tmp_path):
    """Guidance with two processes (packed) against one (unpacked), on the same fixed rollouts without a refusal:
    one group per generation batch, split over the two processes, so the guide is built and scored on the process
    holding the replaced row and sent to the other; the same loss, rewards, KL, guided share (and supervised
    term) per step, the same weights."""
    from safetensors.torch import load_file

    a = launch_fixed(grpo_data, tiny_model_dir, tmp_path / "a", "cpu_2proc.yaml", "--per_device_train_batch_size",
                     "2", "--guidance", guidance, answers="helpful")
    b = launch_fixed(grpo_data, tiny_model_dir, tmp_path / "b", "cpu.yaml", "--per_device_train_batch_size", "4",
                     "--packed", "false", "--guidance", guidance, answers="helpful")
    steps_a, steps_b = ([e for e in h if "loss" in e] for h in (a, b))
    assert [e["step"] for e in steps_a] == [e["step"] for e in steps_b] == [1, 2]
    assert all(e["guidance/guided_share"] == 1 for e in steps_a)  # refusal-expected groups, each guided
    keys = ["loss", "grad_norm", "reward", "kl", "guidance/guided_share", "guidance/missed_share",
            "dynamic_sampling/extra_rounds", "generation/completion_tokens", "reference/tokens"]
    keys += ["guidance/supervised_nll"] if guidance == "supervised" else ["guidance/guide_advantage"]
    for x, y in zip(steps_a, steps_b):
        for k in keys:
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-5), (x["step"], k)
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-4


def test_guidance_resume_continues_the_same_data_order(tiny_model_dir, grpo_data, tmp_path):
    """Guidance and dynamic sampling, four steps, against two steps resumed from the checkpoint at step 2: steps 3
    and 4 score the same samples and the same guides in the same rounds (the rule judge, the policy's own samples)."""

    def train(out, resume=None):
        calls = []
        verdict, helpfulness = make_reward_funcs(["privacy_compliance", "helpfulness"], VerdictJudge(JudgeSettings()))

        def privacy_compliance(prompts, completions, trainer_state, question, **columns):
            calls.append((trainer_state.global_step, list(zip(question, map(completion_text, completions)))))
            return verdict(prompts, completions, question=question, **columns)

        trainer, _ = make_grpo_trainer(tiny_model_dir, grpo_data, tmp_path / out, num_samples=None,
                                       rewards=[privacy_compliance, helpfulness], dynamic_sampling=True,
                                       guidance="group", max_steps=4, save_strategy="steps", save_steps=2,
                                       logging_steps=1, learning_rate=1e-3, seed=7, max_completion_length=24)
        trainer.train(resume_from_checkpoint=resume)
        drawn = {}
        for step, scored_ in calls:
            drawn.setdefault(step, []).append(scored_)
        return drawn, [e for e in trainer.state.log_history if "loss" in e]

    whole, whole_log = train("whole")
    assert sorted(whole) == [0, 1, 2, 3]
    assert any(e["guidance/guided_share"] > 0 for e in whole_log[2:])  # guides after the checkpoint
    resumed, resumed_log = train("resumed", resume=str(tmp_path / "whole" / "out" / "checkpoint-2"))
    assert sorted(resumed) == [2, 3]
    assert resumed[2] == whole[2] and resumed[3] == whole[3]
    assert [e["guidance/guided_share"] for e in resumed_log if e["step"] > 2] == \
        [e["guidance/guided_share"] for e in whole_log[2:]]
