"""Guided exploration for GRPO on SPY-Tune: where every sample of a group misses the privacy verdict (a refusal
expected and none refuses, or an answer expected and every sample refuses), the policy has nothing to learn the
verdict from, and dynamic sampling cannot create it. The item's reference answer (SPY-Tune's: the refusal where a
refusal is expected, the answer otherwise) supplies it, in one of two ways (losses/grpo_trainer.py wires them,
docs/training/grpo.md, "Guided exploration"):

- `group` (LUFFY, arXiv 2504.14945): the reference answer replaces one sample of the group and is scored by the same
  rewards, so the group has spread and its advantages point at the right behaviour. It was not sampled: its
  old-policy log-probabilities are the current policy's, so the importance ratio starts at 1. Optionally LUFFY's
  policy shaping f(pi) = pi / (pi + gamma) on its tokens (`shaped_advantages`).
- `supervised` (ReLIFT, arXiv 2506.07527; CHORD, arXiv 2508.11408): the reference answer's negative log-likelihood
  on exactly those prompts, weight mu (optionally decayed: `supervised_weight`), beside the GRPO loss; the guide
  row rides in the batch (tree-packed with its group) but out of GRPO's own loss.

The maths and the choices, as pure functions:

- `missed_groups`: which groups all miss the verdict; a group with a missing reward (the judge failed) is never one.
- `replaced_row`: which sample the guide replaces (the lowest total reward; the last of equals).
- `guide_completion_ids`: the reference answer tokenised as the policy's own completion would be: the chat
  template's assistant turn after the generation prompt, up to and including the end-of-turn token that stops
  generation, cut at `max_completion_length` as generation would be.
- `group_advantages`: TRL's per-group advantages (`sum_then_normalize`, `scale_rewards` group or none), NaN = left
  out (advantage 0), for the groups whose rewards a guide changed.
- `shaped_advantages`: per-token advantages whose gradient at ratio 1 is LUFFY's shaped one.
- `supervised_weight`: mu at a step, constant or decayed to 0 at the last step.
"""

from __future__ import annotations

import math

import torch
from trl.trainer.utils import nanstd

GUIDANCE = ("off", "group", "supervised")
DECAYS = ("constant", "linear", "cosine")


def missed_groups(compliance: torch.Tensor, spy: torch.Tensor, group_size: int) -> torch.Tensor:
    """One flag per group of `group_size` consecutive rows: every sample missed the privacy verdict (compliance 0),
    the prompt is a SPY one (`spy`, per row: the verdict applies), and no sample's reward is missing (NaN)."""
    grouped = compliance.view(-1, group_size)
    present = ~torch.isnan(grouped)
    return present.all(1) & (torch.nan_to_num(grouped, nan=1.0) == 0).all(1) & spy.view(-1, group_size).all(1)


def replaced_row(totals: torch.Tensor) -> int:
    """The sample of one group (its G weighted total rewards) the guide replaces: the lowest total, the last of
    equals (the sample that teaches least)."""
    lowest = totals.min()
    return int(torch.nonzero(totals == lowest).max())


def guide_completion_ids(processor, prompt: list[dict], answer: str, eos_token_ids: list[int],
                         max_length: int, **template_kwargs) -> list[int]:
    """`answer` as completion tokens of `prompt` (conversational messages): the tokens the conversation with an
    assistant turn holding `answer` has after those of the generation prompt (tokenised in context, as SFT saw the
    answer), up to and including the first end-of-turn token (where generation stops; the template's text after
    it, e.g. a newline, is not generated), at most `max_length` tokens (generation's cut)."""
    from trl.data_utils import prepare_multimodal_messages

    tokenizer = getattr(processor, "tokenizer", processor)
    turn = [{"role": "assistant", "content": answer}]
    head, full = (tokenizer(processor.apply_chat_template(prepare_multimodal_messages(messages), tokenize=False,
                                                          add_generation_prompt=generation, **template_kwargs),
                            add_special_tokens=False)["input_ids"]
                  for messages, generation in ((list(prompt), True), (list(prompt) + turn, False)))
    if full[:len(head)] != head:
        raise ValueError("the chat template's assistant turn does not extend its generation prompt")
    ids = full[len(head):]
    stop = next((i for i, t in enumerate(ids) if t in eos_token_ids), None)
    if stop is None:
        raise ValueError("the chat template's assistant turn has no end-of-turn token")
    return ids[:stop + 1][:max_length]


def group_advantages(totals: torch.Tensor, group_size: int, scale: bool) -> torch.Tensor:
    """TRL's advantages with `multi_objective_aggregation: sum_then_normalize`: each weighted total minus its group's
    mean, divided by the group's std (+ 1e-4) with `scale`, over the present (non-NaN) totals; NaN rows get 0."""
    grouped = totals.view(-1, group_size)
    centred = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    if scale:
        centred = centred / (nanstd(grouped, dim=1).unsqueeze(1) + 1e-4)
    return torch.nan_to_num(centred, nan=0.0).view(-1)


def shaped_advantages(advantage: float, logps: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-token advantages of a guide under LUFFY's shaping: its objective f(pi) * A, f(pi) = pi / (pi + gamma),
    has the gradient A * gamma * pi / (pi + gamma)^2 * grad log pi, which is TRL's clipped objective's at ratio 1 with
    the token's advantage A * gamma * pi / (pi + gamma)^2 (`logps`: the guide's per-token log pi under the policy
    that trains on it)."""
    pi = logps.exp()
    return advantage * gamma * pi / (pi + gamma) ** 2


def supervised_weight(mu: float, decay: str, step: int, total_steps: int) -> float:
    """The supervised term's weight at optimizer step `step` (0-based) of `total_steps`: mu, or mu decayed to 0 at
    the last step (linear or cosine)."""
    if decay == "constant" or total_steps <= 1:
        return mu
    done = min(step / (total_steps - 1), 1.0)
    if decay == "linear":
        return mu * (1 - done)
    return mu * 0.5 * (1 + math.cos(math.pi * done))


def guide_record(record: dict, ids: list[int], in_loss: bool = True, sequence_ratio: bool = False) -> dict:
    """A sampled row's record (losses/dynamic_sampling.py's `batch_rows`) with its completion replaced by the guide's
    tokens `ids`: every token attended, the image-token types of text; the per-token log-probabilities the passes
    after the rounds fill (the old policy's, the reference's, vLLM's sampling ones) 0 until then, vLLM's importance
    ratio 1 (per token, or one per sequence with `sequence_ratio`): the guide was not sampled, so the correction
    neither masks nor shrinks it. `in_loss` False: out of GRPO's own loss (`tool_mask` 0), for the supervised term."""
    from losses.dynamic_sampling import BOTH_SIDES

    size, old = len(ids), record["completion_ids"]
    guide = dict(record)
    guide["completion_ids"] = torch.tensor(ids, dtype=old.dtype, device=old.device)
    guide["completion_mask"] = torch.ones(size, dtype=record["completion_mask"].dtype, device=old.device)
    for key in ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps"):
        if key in record:
            guide[key] = torch.zeros(size, dtype=record[key].dtype, device=old.device)
    if "importance_sampling_ratio" in record:
        ratio = record["importance_sampling_ratio"]
        guide["importance_sampling_ratio"] = torch.ones(1 if sequence_ratio else size, dtype=ratio.dtype,
                                                        device=old.device)
    if "tool_mask" in record or not in_loss:
        guide["tool_mask"] = torch.full((size,), int(in_loss), dtype=torch.long, device=old.device)
    for key in BOTH_SIDES:
        if key in record:
            prompt, completion = record[key]
            guide[key] = (prompt, torch.zeros(size, dtype=completion.dtype, device=old.device))
    return guide
