"""GRPO on SPY-Tune's prompts: the policy's own samples, scored by the privacy judge and the helpfulness reward.

    accelerate launch --config_file accelerate_configs/zero2.yaml train/grpo.py recipes/grpo.yaml [--key value ...]

Each prompt (one SPY-Tune case, or a general-task question: `general_fraction`) is answered `num_generations` times;
the rewards (losses/rewards.py, named in the recipe's `reward_funcs` with `reward_weights`) score the answers, and
TRL's GRPO loss moves the policy towards the better ones within each group (losses/grpo_trainer.py: tree-packed
groups, a judge failure as a missing reward). Generation: transformers by default, vLLM with `use_vllm`.
"""

import math
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file by accelerate

from trl import ModelConfig, get_peft_config  # noqa: E402

from cli.strict_yaml import did_you_mean  # noqa: E402
from losses.grpo_trainer import VisionGRPOConfig, VisionGRPOTrainer, dynamic_sampling_problem  # noqa: E402
from losses.rewards import REWARD_NAMES  # noqa: E402
from train.card import attach, finish  # noqa: E402
from train.common import (  # noqa: E402
    SpyTuneArguments,
    check_run,
    load_datasets,
    load_model_and_processor,
    option_error,
    parse_recipe,
    resume_checkpoint,
    run,
)
from train.rewards import JudgeSettings, VerdictJudge, make_reward_funcs  # noqa: E402


def check_grpo(script_args, args: VisionGRPOConfig) -> None:
    """The rewards, their weights, the judge and the data mix, before any model loads (one line each)."""
    for name in args.reward_funcs:
        if name not in REWARD_NAMES:
            raise option_error("reward_funcs", f"unknown reward {name!r}{did_you_mean(name, REWARD_NAMES)}; "
                                               f"known: {', '.join(REWARD_NAMES)}")
    if len(set(args.reward_funcs)) != len(args.reward_funcs) or not args.reward_funcs:
        raise option_error("reward_funcs", f"expected distinct reward names, got {args.reward_funcs}")
    weights = args.reward_weights
    if weights is not None:
        if len(weights) != len(args.reward_funcs):
            raise option_error("reward_weights", f"{len(weights)} weights for {len(args.reward_funcs)} rewards "
                                                 f"({', '.join(args.reward_funcs)})")
        if any(not math.isfinite(w) or w < 0 for w in weights) or not any(weights):
            raise option_error("reward_weights", f"expected finite weights >= 0, not all 0, got {weights}")
    if not args.judge.strip():
        raise option_error("judge", "expected `rule` or an LLM judge's model name")
    if args.judge != "rule" and args.judge_base_url and not args.judge_base_url.startswith(("http://", "https://")):
        raise option_error("judge_base_url", f"expected an http(s):// URL, got {args.judge_base_url!r}")
    for name, low in (("judge_concurrency", 1), ("judge_max_retries", 0)):
        if getattr(args, name) < low:
            raise option_error(name, f"must be >= {low}, got {getattr(args, name)}")
    if not args.judge_timeout > 0:
        raise option_error("judge_timeout", f"must be > 0 seconds, got {args.judge_timeout}")
    if not 0 <= args.max_missing_reward_share <= 1:
        raise option_error("max_missing_reward_share", f"must be in [0, 1], got {args.max_missing_reward_share}")
    if not 0 <= args.general_fraction < 1:
        raise option_error("general_fraction", f"must be in [0, 1), got {args.general_fraction}")
    if (args.general_fraction > 0) != bool(script_args.general_data_path):
        raise option_error("general_fraction", "general_fraction > 0 and general_data_path go together")
    if script_args.helpful:
        raise option_error("helpful", "only SFT trains the helpful backbone, not GRPO")
    problem = dynamic_sampling_problem(args)
    if problem:
        raise option_error(*problem)


def main():
    # args
    script_args, training_args, model_args = parse_recipe(SpyTuneArguments, VisionGRPOConfig, ModelConfig)
    check_grpo(script_args, training_args)
    cache = Path(training_args.judge_cache or Path(training_args.output_dir) / "judge_cache.jsonl")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # each process judges its own completions: one cache file each
        cache = cache.with_name(f"{cache.stem}-rank{os.environ.get('RANK', '0')}{cache.suffix}")
    judge = VerdictJudge(JudgeSettings(  # an LLM judge without its key fails here
        training_args.judge, training_args.judge_base_url, training_args.judge_api_key_env,
        training_args.judge_concurrency, training_args.judge_max_retries, training_args.judge_timeout, str(cache),
        script_args.categories))
    check_run(script_args, training_args, model_args)
    # data, all of it checked before the model loads
    train_dataset, eval_dataset = load_datasets("grpo", script_args, training_args.seed,
                                                general_fraction=training_args.general_fraction)
    # model
    model, processor = load_model_and_processor(model_args, script_args, training_args)
    # trainer
    trainer = VisionGRPOTrainer(
        model=model,
        reward_funcs=make_reward_funcs(training_args.reward_funcs, judge),
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=processor,
        peft_config=get_peft_config(model_args),
    )
    attach(trainer, "grpo", script_args, training_args, model_args)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    # save / push
    finish(trainer, "grpo", script_args, training_args, model_args)


if __name__ == "__main__":
    run(main)
