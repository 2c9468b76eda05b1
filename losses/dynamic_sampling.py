"""Dynamic sampling (DAPO, arXiv 2503.14476, section 3.2) for GRPO: a group whose rewards do not vary has advantage 0
for every completion, so it moves the policy only through the KL term; such groups are dropped from the generation
batch and replaced by groups of further prompts, up to a bound on extra generation rounds.

The maths and the row bookkeeping, as pure functions; losses/grpo_trainer.py drives them from TRL's
`_generate_and_score_completions` (docs/training/grpo.md, "Dynamic sampling").

- `filter_values`: what the filter measures per row: a chosen reward (default the privacy verdict, binary, as DAPO
  filters on its accuracy: verl's `filter_groups.metric=acc`) on SPY prompts, the weighted total on the general
  task's (exact match: the verdict does not score them), or the weighted total everywhere (`total`: the filter
  before issue 45, under which a group whose helpfulness F1 alone varies by 0.01 counted as one with signal).
- `group_spread`: which groups are zero spread, from those values (NaN = missing). The spread is over the values
  present. A group with two or more present values, all equal (TRL's own test: `isclose(nanstd, 0)`), or within
  `min_spread` of each other (max - min, for a continuous reward), is zero spread. A group with fewer than two
  present values is *unscored*, not zero spread: its spread is unknown (the judge failed), so it is kept, and TRL
  gives its rows advantage 0, as without dynamic sampling; dropping it would quietly select the prompts the judge
  can judge.
- `anchor_groups`: which zero-spread general-task groups are kept anyway (`dynamic_sampling_anchor_share`): all
  their answers right, advantage 0, their KL term holds the general task near the reference; a function of (seed,
  step, round) alone, like `refill_indices`.
- `choose_groups`: the batch, from the rounds drawn: the groups with spread in draw order up to the batch's size;
  when the bound stops the refill short, the rest is padded with the dropped groups in draw order, so the batch
  keeps TRL's fixed size (every process, every step, `per_device_train_batch_size` rows per step).
- `refill_indices`: the dataset rows of an extra round, a function of (seed, step, round) alone, so a resumed run
  draws what the uninterrupted run drew, with nothing to save in the checkpoint.
- `batch_rows` / `collate_rows`: rows of TRL's scored batches (each round padded to its own widths) as per-row
  records, and records back into one batch: prompts left-padded, completions right-padded, images per row.
"""

from __future__ import annotations

import random

import torch
from trl.trainer.utils import nanstd, pad, split_pixel_values_by_grid, unsplit_pixel_values_by_grid

# TRL's scored batch: per-row tensors padded on the left (the prompt), on the right (the completion), or both
# (prompt | completion), with TRL's own padding values; the padding token is the tokenizer's (`None` here)
PROMPT_SIDE = {"prompt_ids": None, "prompt_mask": 0}
COMPLETION_SIDE = {"completion_ids": None, "completion_mask": 0, "old_per_token_logps": 0.0,
                   "ref_per_token_logps": 0.0, "sampling_per_token_logps": 0.0, "importance_sampling_ratio": 1.0,
                   "tool_mask": 1}
BOTH_SIDES = {"mm_token_type_ids": 0, "token_type_ids": 0}
BATCH_LEVEL = ("num_items_in_batch",)  # recomputed for the batch built (collate_rows' caller)


def group_spread(rewards: torch.Tensor, group_size: int, min_spread: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(zero_spread, unscored), one flag per group of `group_size` consecutive values (NaN = missing); with
    `min_spread` > 0 a group whose present values lie within it (max - min) is zero spread too."""
    grouped = rewards.view(-1, group_size)
    present = (~torch.isnan(grouped)).sum(1)
    unscored = present < 2
    std = nanstd(grouped, dim=1)
    zero = torch.isclose(std, torch.zeros_like(std))
    if min_spread > 0:
        spread = nanmax(grouped, 1) - nanmin(grouped, 1)
        zero |= spread <= min_spread
    return ~unscored & zero, unscored


def nanmax(values: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.nan_to_num(values, nan=-torch.inf).max(dim).values


def nanmin(values: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.nan_to_num(values, nan=torch.inf).min(dim).values


def filter_values(rewards: torch.Tensor, total: torch.Tensor, names: list[str], reward: str,
                  general: torch.Tensor) -> torch.Tensor:
    """Per row, the value whose spread decides whether its group is kept: reward function `reward`'s on SPY rows
    and the weighted total `total` on the general task's rows (`general`, a flag per row), or the total everywhere
    (`reward == "total"`). `rewards`: (rows, functions); NaN = missing."""
    if reward == "total":
        return total
    values = rewards[:, names.index(reward)].clone()
    values[general] = total[general]
    return values


def anchor_groups(seed: int, step: int, round_: int, count: int, share: float) -> list[bool]:
    """For the `count` groups of a round: whether a zero-spread general-task group among them is kept as an anchor,
    each with probability `share`, the same for every process and after a resume."""
    rng = random.Random(f"dynamic-sampling-anchor/{seed}/{step}/{round_}")
    return [rng.random() < share for _ in range(count)]


def group_statistics(rewards: torch.Tensor, total: torch.Tensor, names: list[str], kinds: list[str],
                     group_size: int) -> dict[str, float]:
    """Where a generation batch's signal is (logged per round, `groups/...`): per kind of prompt (`kinds`, one per
    row: the general task; SPY with an answer expected (`respond`); a customizable category under a private
    instruction (`reject`); an absolute category, refused whatever the instruction (`absolute`)), the share of its
    groups with zero spread; the share of the `reject` groups in which any sample complied (`privacy_compliance` 1:
    the policy produced a refusal to learn from); and, per reward function, the share of the groups with spread in
    which that function alone varies (the one that owns their advantage). `rewards`: (rows, functions), `total`:
    the weighted total, NaN = missing."""
    zero, unscored = group_spread(total, group_size)
    grouped = rewards.view(-1, group_size, len(names))
    varies = ~torch.isclose(nanstd(grouped, dim=1), torch.zeros(())) & ((~torch.isnan(grouped)).sum(1) >= 2)
    kind = kinds[::group_size]
    stats = {}
    for name in sorted(set(kind)):
        mine = torch.tensor([k == name for k in kind])
        stats[f"groups/zero_spread/{name}"] = zero[mine].float().mean().item()
    if "reject" in kind and "privacy_compliance" in names:
        reject = torch.tensor([k == "reject" for k in kind])
        complied = (grouped[reject][:, :, names.index("privacy_compliance")] == 1).any(1)
        stats["groups/reject_with_refusal"] = complied.float().mean().item()
    spread = ~zero & ~unscored
    if spread.any():
        for i, name in enumerate(names):
            alone = varies[:, i] & (varies.sum(1) == 1)
            stats[f"groups/spread_only/{name}"] = alone[spread].float().mean().item()
    return stats


def choose_groups(zero_spread: list[list[bool]], needed: int) -> tuple[list[tuple[int, int]], int]:
    """(the batch's groups as (round, group), how many of them are padding): the groups with spread in draw order,
    the first `needed`; short of that, the dropped groups in draw order fill the rest."""
    drawn = [(r, g) for r, flags in enumerate(zero_spread) for g in range(len(flags))]
    kept = [(r, g) for r, g in drawn if not zero_spread[r][g]][:needed]
    padding = [(r, g) for r, g in drawn if zero_spread[r][g]][:needed - len(kept)]
    if len(kept) + len(padding) < needed:
        raise ValueError(f"{len(drawn)} groups drawn, {needed} needed")
    return kept + padding, len(padding)


def refill_indices(seed: int, step: int, round_: int, dataset_size: int, count: int) -> list[int]:
    """`count` dataset indices for extra round `round_` (1, 2, ...) of optimizer step `step`: distinct while the
    dataset lasts (then again in the same order), the same for every process and after a resume."""
    rng = random.Random(f"dynamic-sampling/{seed}/{step}/{round_}")  # str seeds are stable across runs (sha512)
    order = rng.sample(range(dataset_size), dataset_size)
    return [order[i % dataset_size] for i in range(count)]


def batch_rows(batch: dict, rows: list[int]) -> list[dict]:
    """Those rows of a scored batch as records: each padded tensor cut to the row (at its batch's widths, `both
    sides` tensors split at the prompt's width), images per row; a list value is kept as a list of one."""
    split = split_pixel_values_by_grid(batch)
    width = batch["prompt_ids"].size(1)
    records = []
    for i in rows:
        record = {}
        for key, value in split.items():
            if key in BATCH_LEVEL or value is None:
                continue
            if isinstance(value, list):
                record[key] = [value[i]]
            elif key in BOTH_SIDES:
                record[key] = (value[i, :width], value[i, width:])
            elif isinstance(value, torch.Tensor) and value.ndim >= 1:
                record[key] = value[i]
            else:
                raise ValueError(f"dynamic sampling cannot split the scored batch's {key!r} by row")
        records.append(record)
    return records


def collate_rows(records: list[dict], pad_token_id: int, pad_to_multiple_of: int | None = None) -> dict:
    """Records (batch_rows, from batches of any widths) as one batch in TRL's layout."""
    batch = {}
    for key in records[0]:
        values = [r[key] for r in records]
        if key in PROMPT_SIDE or key in COMPLETION_SIDE:
            side = "left" if key in PROMPT_SIDE else "right"
            fill = {**PROMPT_SIDE, **COMPLETION_SIDE}[key]
            batch[key] = pad(values, pad_token_id if fill is None else fill, side, pad_to_multiple_of)
        elif key in BOTH_SIDES:
            batch[key] = torch.cat([pad([p for p, _ in values], BOTH_SIDES[key], "left", pad_to_multiple_of),
                                    pad([c for _, c in values], BOTH_SIDES[key], "right", pad_to_multiple_of)], 1)
        elif isinstance(values[0], list):
            batch[key] = [v for value in values for v in value]
        else:
            batch[key] = torch.stack(values)
    return unsplit_pixel_values_by_grid(batch)
