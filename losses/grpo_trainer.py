"""TRL's GRPOTrainer for SPY-Tune: tree-packed groups, and a judge failure as a missing reward, never a zero.

Two hooks, the narrowest TRL has for each:

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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.utils import logging
from trl import GRPOConfig, GRPOTrainer

from cli.errors import RunStopped
from losses.checkpointing import HubFormatResumeMixin
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


class VisionGRPOTrainer(HubFormatResumeMixin, GRPOTrainer):
    def __init__(self, model, reward_funcs, args: VisionGRPOConfig, **kwargs):
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
        count = int(missing.sum())
        self._metrics[mode]["rewards/missing"].append(float(count))
        share = count / max(rewards.size(0), 1)
        if share > self.args.max_missing_reward_share:
            raise RunStopped(f"training stopped at step {self.state.global_step + 1}: {count} of {rewards.size(0)} "
                             f"samples have no reward (the judge failed; {share:.0%} > max_missing_reward_share "
                             f"{self.args.max_missing_reward_share}); checkpoints before this step are kept")
        return rewards
