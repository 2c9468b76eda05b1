"""Every number a training run takes, in one table: each numeric field of every config class an entry script
accepts (ours, TRL's and transformers'), with its range and whether `null` (unset) is allowed.

The fields come from the dataclasses themselves (`fields_of`): a field typed int or float, or a list of them, is a
number. `RANGES` gives each one's range by name; every whole number, and every float that counts steps, epochs or
seconds (COUNTS), is at most LARGEST unless its range says less (an int that torch or a sampler cannot hold was an
OverflowError mid-run). A numeric field the table does not name is still finite and within +-LARGEST, and
tests/test_ranges.py fails until it is named: a field a new TRL adds cannot slip past unreviewed. `null` is allowed exactly where the dataclass types a field Optional (TRL's
command-line parser takes `null` / `none` there too), except where the library types it so and then divides by it
(NOT_NULL); a field that is not Optional, numeric or not, refuses it.

`check_values` runs in train/common.py's parse_recipe on the parsed values (recipe and command line merged),
before any config dataclass is built, before the data or the model load and before any folder is made.
`check_batches` runs in train/common.py's load_datasets on the training data, before the model loads: a batch
larger than the data (a run that would train 0 steps, or a first batch it cannot fill) is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass

from cli import numbers
from cli.numbers import FRACTION, NON_NEGATIVE, POSITIVE, Rule, real, shown, whole

LARGEST = 2**31 - 1  # a C int: what every count, size, step and seed fits in
SEED = whole(0, 2**32 - 1)  # numpy's seeds end there
PORT = whole(1, 65535)
BELOW_ONE = real(0, 1, high_open=True)
# The numbers our GRPO trainer checks itself too (a config built in code): their ranges are cli/numbers.py's, one
# table for both
GRPO_SETTINGS = ("dynamic_sampling_max_extra_rounds", "dynamic_sampling_min_spread", "dynamic_sampling_anchor_share",
                 "guidance_gamma", "guidance_mu")

# Field name -> its range, for every numeric field of SpyTuneArguments, ModelConfig, SFTConfig, VisionDPOConfig,
# NCAPConfig and VisionGRPOConfig (transformers' TrainingArguments below them). A name means the same in every class.
RANGES: dict[str, Rule] = {
    # the data (train/common.py SpyTuneArguments)
    "num_train_samples": whole(1), "min_pixels": numbers.RULES["min_pixels"],
    "max_pixels": numbers.RULES["max_pixels"],
    # LoRA (TRL's ModelConfig)
    "lora_r": whole(1), "lora_alpha": POSITIVE, "lora_dropout": BELOW_ONE,
    # transformers' TrainingArguments: batches, steps, the optimizer, logging, saving, processes
    "per_device_train_batch_size": whole(1), "per_device_eval_batch_size": whole(1),
    "gradient_accumulation_steps": whole(1), "eval_accumulation_steps": whole(1),
    "num_train_epochs": POSITIVE, "max_steps": whole(-1), "learning_rate": POSITIVE, "warmup_steps": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE, "adam_beta1": BELOW_ONE, "adam_beta2": BELOW_ONE, "adam_epsilon": POSITIVE,
    "max_grad_norm": NON_NEGATIVE, "label_smoothing_factor": BELOW_ONE, "neftune_noise_alpha": POSITIVE,
    "torch_empty_cache_steps": whole(1), "logging_steps": whole(1), "eval_steps": whole(1), "save_steps": whole(1),
    "eval_delay": NON_NEGATIVE, "save_total_limit": whole(1), "seed": SEED, "data_seed": SEED,
    "dataloader_num_workers": whole(0), "dataloader_prefetch_factor": whole(1), "ddp_bucket_cap_mb": whole(1),
    "ddp_timeout": whole(1), "local_rank": whole(-1), "router_aux_loss_coef": NON_NEGATIVE,
    # TRL's SFTConfig
    "dataset_num_proc": whole(1), "max_length": whole(1), "pad_to_multiple_of": whole(1),
    # TRL's DPOConfig (VisionDPOConfig, NCAPConfig)
    "beta": POSITIVE, "label_smoothing": BELOW_ONE, "precompute_ref_batch_size": whole(1),
    "loss_weights": NON_NEGATIVE, "ld_alpha": FRACTION, "f_alpha_divergence_coef": POSITIVE,
    "discopop_tau": POSITIVE, "ref_model_mixup_alpha": FRACTION, "ref_model_sync_steps": whole(1),
    # TRL's GRPOConfig: sampling, batches, vLLM, the loss (VisionGRPOConfig)
    "num_generations": whole(2), "num_generations_eval": whole(2),  # a group's advantages need two
    "max_completion_length": whole(1), "generation_batch_size": whole(1), "steps_per_generation": whole(1),
    "num_iterations": whole(1), "temperature": POSITIVE, "top_p": real(0, 1, low_open=True), "top_k": whole(0),
    "min_p": FRACTION, "repetition_penalty": POSITIVE,
    "vllm_server_port": PORT, "vllm_group_port": PORT, "vllm_server_timeout": POSITIVE,
    "vllm_gpu_memory_utilization": real(0, 1, low_open=True), "vllm_max_model_length": whole(1),
    "vllm_tensor_parallel_size": whole(1), "vllm_importance_sampling_clip_max": POSITIVE,
    "vllm_importance_sampling_clip_min": NON_NEGATIVE, "vllm_importance_sampling_cap": POSITIVE,
    "epsilon": NON_NEGATIVE, "epsilon_high": NON_NEGATIVE, "delta": POSITIVE,
    "sapo_temperature_neg": POSITIVE, "sapo_temperature_pos": POSITIVE,
    "vespo_k_pos": NON_NEGATIVE, "vespo_lambda_pos": NON_NEGATIVE, "vespo_k_neg": NON_NEGATIVE,
    "vespo_lambda_neg": NON_NEGATIVE, "reward_weights": NON_NEGATIVE, "top_entropy_quantile": FRACTION,
    "entropy_coef": NON_NEGATIVE, "entropy_coef_min": NON_NEGATIVE, "entropy_coef_max": NON_NEGATIVE,
    "entropy_coef_delta": NON_NEGATIVE, "entropy_target": NON_NEGATIVE, "max_tool_calling_iterations": whole(1),
    "off_policy_mask_threshold": NON_NEGATIVE, "num_completions_to_print": whole(0),
    # ours (losses/grpo_trainer.py): the judge (the chat client's own ranges), rewards, dynamic sampling
    "judge_concurrency": numbers.RULES["concurrency"], "judge_max_retries": numbers.RULES["max_retries"],
    "judge_timeout": numbers.RULES["timeout"], "max_missing_reward_share": FRACTION,
    "general_fraction": BELOW_ONE, "vllm_kv_cache_gib": POSITIVE,
    # ours (train/privacy_eval.py): privacy scored while training
    "eval_privacy_limit": whole(1), "eval_privacy_max_new_tokens": numbers.RULES["max_new_tokens"],
    # ours: dynamic sampling and guidance (losses/dynamic_sampling.py, losses/guidance.py), the trainer's ranges
    **{name: numbers.RULES[name] for name in GRPO_SETTINGS},
}
# Floats that count steps, epochs or seconds (the library makes ints of them, or timers): at most LARGEST, as every
# whole number is. Other floats are only finite: a learning rate of 1e30 is legal, and diverges (losses/finite.py).
COUNTS = {"num_train_epochs", "warmup_steps", "eval_delay", "vllm_server_timeout", "judge_timeout"}
# Typed Optional by the library, which then computes with them: null is refused.
NOT_NULL = {"num_generations": "GRPO divides the batch by it"}
UNNAMED = real()  # a numeric field RANGES does not name yet: finite, within +-LARGEST


@dataclass(frozen=True)
class Field:
    """A config field as the checks see it: its range if it is a number (a list of numbers: `items`), and
    whether it may be null."""

    name: str
    rule: Rule | None
    null: bool
    items: bool = False


def _parts(hint) -> tuple:
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _numeric(hint) -> tuple[bool, bool]:
    """(is a number, is a list of numbers) for a type hint; bool is not a number."""
    for part in _parts(hint):
        if part in (int, float):
            return True, False
        if typing.get_origin(part) is list and any(a in (int, float) for a in typing.get_args(part)):
            return True, True
    return False, False


@functools.cache
def fields_of(*config_types) -> dict[str, Field]:
    """Every init field of the config dataclasses (the parser's options), by name (the first class naming one
    wins, as in the parser)."""
    found: dict[str, Field] = {}
    for config in config_types:
        hints = typing.get_type_hints(config)
        for f in dataclasses.fields(config):
            if not f.init or f.name in found:
                continue
            numeric, items = _numeric(hints[f.name])
            null = (type(None) in _parts(hints[f.name]) or f.default is None) and f.name not in NOT_NULL
            found[f.name] = Field(f.name, RANGES.get(f.name, UNNAMED) if numeric else None, null, items)
    return found


def number_problem(value, rule: Rule, capped: bool = True) -> str | None:
    """Why a parsed number is out of its range (or, `capped`, past LARGEST either way), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected {'a whole number' if rule.whole else 'a number'}, got {value!r}"
    problem = rule.problem(value)
    if problem:
        return problem
    if capped and rule.high is None and value > LARGEST:
        return f"must be at most {LARGEST}, got {shown(value)}"
    if capped and rule.low is None and value < -LARGEST:
        return f"must be at least {-LARGEST}, got {shown(value)}"
    return None


def check_values(values: dict, config_types, fail, nulls=()) -> None:
    """The parsed values (option name -> value) of the config dataclasses `config_types`: `fail(name, message)`
    at the first field set to null (`nulls`: the recipe's `key: null`, the command line's `--key null`) that cannot
    be unset, and the first number outside its range."""
    for name, spec in fields_of(*config_types).items():
        if name not in values:
            continue
        value = values[name]
        if value is None:
            if name in nulls and not spec.null:
                why = NOT_NULL.get(name, "it cannot be unset")
                kind = "a value" if spec.rule is None else "a whole number" if spec.rule.whole else "a number"
                fail(name, f"expected {kind}, got null ({why})")
            continue
        if spec.rule is None:
            continue
        for item in (value if spec.items and isinstance(value, (list, tuple)) else [value]):
            if isinstance(item, str) and not spec.items:
                continue  # a field typed `int | str` (pad_to_multiple_of: 'auto'): the text is the library's to check
            problem = number_problem(item, spec.rule, spec.rule.whole or name in COUNTS or spec.rule is UNNAMED)
            if problem:
                fail(name, problem)
    for name in MAPPINGS_OF_NUMBERS:  # GRPO's generation_kwargs: the sampler's numbers, by the same table
        mapping = values.get(name)
        if isinstance(mapping, dict):
            for key, value in mapping.items():
                rule = numbers.RULES.get(str(key))
                problem = rule and number_problem(value, rule)
                if problem:
                    fail(name, f"{key}: {problem}")


MAPPINGS_OF_NUMBERS = ("generation_kwargs",)


def check_batches(method: str, rows: int, args, fail) -> None:
    """A training set of `rows` rows fills at least one batch: GRPO's generation batch takes
    generation_batch_size / num_generations prompts at once (TRL's sampler yields none from fewer, and the run
    trains 0 steps); the other methods' first batch is per_device_train_batch_size rows on each process."""
    processes = max(int(getattr(args, "world_size", 1) or 1), 1)
    if method == "grpo":
        prompts = args.generation_batch_size // args.num_generations
        if prompts > rows:
            # TRL derives the generation batch from the training batch unless one of its own options is set
            name = "per_device_train_batch_size" if args.steps_per_generation == args.gradient_accumulation_steps \
                else "generation_batch_size"
            fail(name, f"a generation batch takes {prompts} prompts (generation_batch_size "
                       f"{args.generation_batch_size} / num_generations {args.num_generations}) and the training data "
                       f"has {rows}: it would train 0 steps; lower {name} (or steps_per_generation) or give more data")
        return
    batch = args.per_device_train_batch_size * processes
    if batch > rows:
        fail("per_device_train_batch_size", f"a batch of {args.per_device_train_batch_size} rows on each of "
             f"{processes} process(es) is larger than the training data ({rows} rows): its first batch could not be "
             "filled (0 steps with dataloader_drop_last); lower it or give more data")
