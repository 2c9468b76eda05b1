"""TRL's GRPOTrainer for SPY-Tune: tree-packed groups, and a judge failure as a missing reward, never a zero.

Three hooks, the narrowest TRL has for each:

- `_get_per_token_logps_and_entropies`, the one function behind every log-prob pass (the policy in the loss, the
  reference, the old policy when `num_iterations > 1` or steps are misaligned): with `packed` (default on for the
  Qwen families) each chunk's groups go through the language model as one prefix and G leaves in one padding-free
  row (losses/grpo_packing.py), each image encoded once. The values equal TRL's unpacked ones (tests/test_grpo.py).
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
  batch, rows generated on another process included, so two processes train on what one process would.

Every generation batch logs the tokens its generation took, every round included (`generation/prompt_tokens`,
`generation/completion_tokens`, summed over processes: counted in `_generate`); `num_tokens`, TRL's running count
of the tokens trained, counts the rows kept (TRL's own count would add every round's); where the signal is
(`groups/*`: losses/dynamic_sampling.py's group_statistics, per round), and with dynamic sampling `dynamic_sampling/*`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from accelerate.utils import gather_object
from transformers.utils import logging
from trl import GRPOConfig, GRPOTrainer

from cli.errors import RunStopped
from losses.checkpointing import HubFormatResumeMixin
from losses.dynamic_sampling import (
    batch_rows,
    choose_groups,
    collate_rows,
    group_spread,
    group_statistics,
    refill_indices,
)
from losses.grpo_packing import by_size, pack_grpo_rows, prompt_groups, take_rows
from losses.packing import PackedAttention, enable_packing, packed_attention_field
from losses.rewards import JUDGED_REWARDS
from vlm.families import supports_packing

logger = logging.get_logger(__name__)


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
    general_fraction: float = field(default=0.0, metadata={
        "help": "Share of the training prompts drawn from general_data_path (exact-match reward)."})
    dynamic_sampling: bool = field(default=False, metadata={
        "help": "DAPO's dynamic sampling: drop a generation batch's groups whose rewards do not vary and replace them "
                "with groups of further prompts (losses/dynamic_sampling.py)."})
    dynamic_sampling_max_extra_rounds: int = field(default=4, metadata={
        "help": "Extra generation rounds per generation batch at most; past it the batch is padded with the dropped "
                "groups drawn (advantage 0)."})


def dynamic_sampling_problem(args: VisionGRPOConfig) -> tuple[str, str] | None:
    """(field, what is wrong) with the dynamic sampling settings, or None."""
    if args.dynamic_sampling_max_extra_rounds < 1:
        return "dynamic_sampling_max_extra_rounds", f"must be >= 1, got {args.dynamic_sampling_max_extra_rounds}"
    if not args.dynamic_sampling:
        return None
    # the advantages are computed per round: only group-wise normalisation is the same over the rounds' batch
    if args.scale_rewards not in ("group", "none", True, False):
        return "scale_rewards", f"dynamic_sampling needs `group` or `none` (per-group advantages), got " \
                                f"{args.scale_rewards!r}"
    if args.multi_objective_aggregation != "sum_then_normalize":
        return "multi_objective_aggregation", "dynamic_sampling needs `sum_then_normalize` (per-group advantages), " \
                                              f"got {args.multi_objective_aggregation!r}"
    return None


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
        problem = dynamic_sampling_problem(args)
        if problem:
            raise ValueError(f"{problem[0]}: {problem[1]}")
        if args.dynamic_sampling and not hasattr(kwargs.get("train_dataset"), "__getitem__"):
            raise ValueError("dynamic_sampling draws further prompts by index: it needs a map-style train_dataset")
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        unpacked = args.packed and not supports_packing(model_type)
        if unpacked:  # the card's recipe then records what ran
            args.packed = False
        processor = kwargs.get("processing_class")
        if processor is not None:  # TRL left-pads prompt_ids itself but takes mm_token_type_ids from the processor:
            for p in (processor, getattr(processor, "tokenizer", None)):  # right padding there shifts the image
                if p is not None:  # positions of every shorter prompt (TRL sets left only on a processor it loads)
                    p.padding_side = "left"
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, **kwargs)
        if unpacked and self.is_world_process_zero():
            logger.warning(f"packed: {model_type} cannot take tree-packed batches; training unpacked")
        self.packed_attention = PackedAttention(args.packed_attention)  # masks shared by policy and reference
        if args.packed:
            for m in (self.model, self.ref_model):
                if m is not None:
                    enable_packing(m, self.packed_attention)  # after TRL's fused head, which it wraps
        self._judged = [i for i, name in enumerate(self.reward_func_names) if name in JUDGED_REWARDS]
        self._generated_tokens = torch.zeros(2, dtype=torch.long)  # (prompt, completion) of this generation batch
        self._total_rewards = None  # the last scored round's weighted total per sample, every process's, NaN = missing

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, pixel_values=None,
                                           image_grid_thw=None, num_images=None, mm_token_type_ids=None, **kwargs):
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

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # all processes'
        missing = torch.isnan(rewards[:, self._judged]).any(dim=1) if self._judged else \
            torch.zeros(rewards.size(0), dtype=torch.bool, device=rewards.device)
        rewards[missing] = torch.nan  # left out of the group's mean and std, advantage 0 (TRL's unscorable rows)
        mode = "train" if self.model.training else "eval"
        total = (rewards * self.reward_weights.to(rewards.device)).nansum(1)  # what TRL normalises per group
        total[torch.isnan(rewards).all(1)] = torch.nan
        self._total_rewards = total
        if all(key in inputs[0] for key in ("task", "expected_verdict")):  # SPY-Tune's prompts: where the signal is
            kinds = gather_object([x["task"] if x["task"] != "spy" else "absolute" if x.get("absolute")
                                   else x["expected_verdict"] for x in inputs])
            for key, value in group_statistics(rewards, total, self.reward_func_names, kinds,
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
        result = super()._generate(prompts)
        prompt_ids, completion_ids = result[0], result[1]
        local = torch.tensor([sum(map(len, prompt_ids)), sum(map(len, completion_ids))], device=self.accelerator.device)
        self._generated_tokens += self.accelerator.gather(local).view(-1, 2).sum(0).cpu()
        return result

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        self._generated_tokens.zero_()
        if mode == "train" and self.args.dynamic_sampling:
            output = self._dynamically_sampled(inputs)
        else:
            output = super()._generate_and_score_completions(inputs)
        prompt_tokens, completion_tokens = self._generated_tokens.tolist()
        self._metrics[mode]["generation/prompt_tokens"].append(float(prompt_tokens))
        self._metrics[mode]["generation/completion_tokens"].append(float(completion_tokens))
        return output

    def _dynamically_sampled(self, inputs):
        """TRL's scored batch of the groups with spread: round 0 is the dataloader's batch, each extra round the
        same number of further prompts (refill_indices), until the batch's groups with spread are found or the bound
        is reached (then the batch is padded with the dropped groups, earliest first)."""
        size = self.num_generations
        local, processes, rank = len(inputs), self.accelerator.num_processes, self.accelerator.process_index
        needed = local * processes // size  # the generation batch's groups, over every process
        rounds, zero_spread, seen = [], [], self.state.num_input_tokens_seen
        for round_ in range(self.args.dynamic_sampling_max_extra_rounds + 1):
            batch = inputs if round_ == 0 else self._more_prompts(round_, needed, local)
            rounds.append(super()._generate_and_score_completions(batch))
            zero_spread.append(group_spread(self._total_rewards, size)[0].tolist())  # every process's groups
            if sum(not z for flags in zero_spread for z in flags) >= needed:
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
        output = collate_rows([held[key] for key in mine], self._tokenizer.pad_token_id, self.pad_to_multiple_of)
        loss_mask = output["completion_mask"] * output["tool_mask"] if "tool_mask" in output \
            else output["completion_mask"]
        completion, prompt = self.accelerator.gather(torch.stack([loss_mask.sum(), output["prompt_mask"].sum()])
                                                     .view(1, 2)).sum(0)
        output["num_items_in_batch"] = completion  # as TRL counts it
        # TRL counted every round's tokens as seen; the tokens trained are the kept rows' (train/compute.py)
        self.state.num_input_tokens_seen = seen + int(prompt + completion)
        metrics = self._metrics["train"]
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        drawn = needed * len(rounds)
        metrics["dynamic_sampling/dropped_share"].append(sum(map(sum, zero_spread)) / drawn)
        metrics["dynamic_sampling/extra_rounds"].append(float(len(rounds) - 1))
        metrics["dynamic_sampling/prompts_drawn"].append(float(drawn))
        metrics["dynamic_sampling/padded_share"].append(padded / needed)
        return output

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
