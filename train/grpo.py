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

from cli.errors import InputError  # noqa: E402
from cli.paths import real  # noqa: E402
from cli.secrets import endpoint_problem, variable_problem  # noqa: E402
from cli.strict_yaml import did_you_mean  # noqa: E402
from losses.grpo_trainer import VisionGRPOConfig, VisionGRPOTrainer, dynamic_sampling_problem  # noqa: E402
from losses.rewards import REWARD_NAMES  # noqa: E402
from store.runs import check_outputs  # noqa: E402
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
from train.grpo_console import use_console  # noqa: E402
from train.rewards import JudgeSettings, VerdictJudge, make_reward_funcs  # noqa: E402

# GRPO's options that take one of a few words (TRL 1.16's GRPOConfig; an unknown one failed mid-training). Their
# numbers have ranges in train/ranges.py's table, checked when the recipe is parsed.
CHOICES = {
    "loss_type": ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"),
    "scale_rewards": ("group", "batch", "none"),
    "importance_sampling_level": ("token", "sequence"),
    "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
}


def check_grpo(script_args, args: VisionGRPOConfig) -> None:
    """The rewards, their weights, the judge and the data mix, before any model loads (one line each)."""
    for name, known in CHOICES.items():
        if getattr(args, name) not in known:
            raise option_error(name, f"unknown value {getattr(args, name)!r}"
                                     f"{did_you_mean(str(getattr(args, name)), known)}; known: {', '.join(known)}")
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
    # whatever the judge: both are saved with the run's arguments (checkpoints, training_args.bin)
    problems = {"judge_api_key_env": variable_problem(args.judge_api_key_env),
                "judge_base_url": args.judge_base_url and endpoint_problem(args.judge_base_url)}
    for name, problem in problems.items():
        if problem:
            raise option_error(name, problem)
    if script_args.helpful:
        raise option_error("helpful", "only SFT trains the helpful backbone, not GRPO")
    problem = dynamic_sampling_problem(args)
    if problem:
        raise option_error(*problem)


def judge_cache_path(script_args, args: VisionGRPOConfig) -> Path:
    """This process's judge cache, claimed like every output before anything loads: `judge_cache` (default
    <output_dir>/judge_cache.jsonl) is a JSON Lines file inside the output folder or beside it (where no other
    output of the run has its name), not an input, and writable; a file already there must be a judge cache
    (eval/judge.py checks its lines when it opens it). Under a multi-process launch each process judges its own
    completions: one file each."""
    out = Path(args.output_dir)
    cache = Path(args.judge_cache) if args.judge_cache else out / "judge_cache.jsonl"
    if args.judge_cache:
        if cache.suffix != ".jsonl":
            raise option_error("judge_cache", f"expected a .jsonl file (JSON Lines), got {args.judge_cache!r}")
        if real(cache).parent not in (real(out), real(out).parent):  # a loop: one line
            raise option_error("judge_cache", f"{args.judge_cache} is neither in output_dir ({out}) nor beside it; "
                                              "a judge cache lives with its run")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        cache = cache.with_name(f"{cache.stem}-rank{os.environ.get('RANK', '0')}{cache.suffix}")
    inputs = (script_args.train_data_path, script_args.eval_data_path, script_args.label_path,
              script_args.categories, script_args.general_data_path)
    try:
        check_outputs(inputs, [cache])
    except InputError as err:
        raise option_error("judge_cache", str(err)) from None
    return cache


def main():
    # args
    script_args, training_args, model_args = parse_recipe(SpyTuneArguments, VisionGRPOConfig, ModelConfig)
    check_grpo(script_args, training_args)
    cache = judge_cache_path(script_args, training_args)
    judge = VerdictJudge(JudgeSettings(  # an LLM judge without its key, or a cache that is not one, fails here
        training_args.judge, training_args.judge_base_url, training_args.judge_api_key_env,
        training_args.judge_concurrency, training_args.judge_max_retries, training_args.judge_timeout, str(cache),
        script_args.categories))
    check_run(script_args, training_args, model_args)
    # data, all of it checked before the model loads
    train_dataset, eval_dataset = load_datasets("grpo", script_args, training_args)
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
    use_console(trainer, training_args.reward_funcs)  # a short line per logging window; the full record is kept
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    # save / push
    finish(trainer, "grpo", script_args, training_args, model_args)


if __name__ == "__main__":
    run(main)
