"""GRPO's groups tree-packed: the G completions of a prompt as one prefix (the prompt, its image encoded once) and G
leaves, all groups of a chunk in one padding-free row, for every log-prob pass (policy, reference, old policy).

TRL's GRPO rows are `[left padding | prompt | completion | right padding]`, and the G rows of a group are
consecutive. Here each row is flushed left (`[prompt | completion | padding]`, the layout losses/packing.py takes),
the rows are reordered into its blocks (row k * groups + e holds completion k of group e), packed by
`pack_preference_batch` with G sequences per example, scored by the packed forward of `enable_packing`, and the
per-token values are put back into TRL's `(rows, logits_to_keep)` completion layout. Positions are the rope index
of the flushed rows, which equals that of TRL's left-padded rows (the rope index counts only attended tokens).
"""

from __future__ import annotations

import torch

from losses.packing import pack_preference_batch


def group_size_of(rows: int, num_generations: int) -> int | None:
    """Rows per group in a chunk of `rows` consecutive rows cut at multiples of `rows`: whole groups (G divides
    rows) or a part of one group (rows divides G); None when chunks cut groups unevenly (packing then is off)."""
    if rows % num_generations == 0:
        return num_generations
    if num_generations % rows == 0:
        return rows
    return None


def pack_grpo_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, group_size: int,
                   mm_token_type_ids: torch.Tensor, pixel_values: torch.Tensor | None = None,
                   image_grid_thw: torch.Tensor | None = None, num_images: list[int] | None = None):
    """(packed model inputs, unpack) for TRL's rows; `unpack(grid)` maps a packed forward's (rows, length - 1)
    output (in the packed row order) back onto TRL's (rows, logits_to_keep) completion columns."""
    rows, width = input_ids.shape
    groups = rows // group_size
    prompt_width = width - logits_to_keep
    left_pad = prompt_width - attention_mask[:, :prompt_width].sum(1)
    shift = (torch.arange(width, device=input_ids.device)[None] + left_pad[:, None]) % width  # flush left

    def flushed(t):
        return t.gather(1, shift)

    order = torch.arange(rows, device=input_ids.device).view(groups, group_size).t().flatten()  # block k holds completion k of every group
    mask = flushed(attention_mask)[order]
    prompt_len = (prompt_width - left_pad)[order]
    columns = torch.arange(width, device=input_ids.device)[None]
    batch = {"input_ids": flushed(input_ids)[order], "attention_mask": mask,
             "completion_mask": (mask.bool() & (columns >= prompt_len[:, None])).long(),
             "mm_token_type_ids": flushed(mm_token_type_ids)[order]}
    if pixel_values is not None:
        patches = image_grid_thw.prod(-1).cpu()
        image_rows = torch.arange(image_grid_thw.size(0)).split(list(num_images))  # each row's images
        starts = torch.cat([patches.new_zeros(1), patches.cumsum(0)])
        image_order = torch.cat([image_rows[r] for r in order.tolist()])
        pixel_order = torch.cat([torch.arange(starts[i], starts[i] + patches[i]) for i in image_order.tolist()])
        batch["pixel_values"] = pixel_values[pixel_order.to(pixel_values.device)]
        batch["image_grid_thw"] = image_grid_thw[image_order.to(image_grid_thw.device)]
    packed = pack_preference_batch(batch, sequences_per_example=group_size)
    packed.pop("completion_mask")
    # completion token j of a row is predicted at flushed column prompt_len + j - 1 of the (rows, length - 1) grid
    take = (prompt_len[:, None] - 1 + torch.arange(logits_to_keep, device=input_ids.device)[None]).clamp(max=width - 2)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(rows)

    def unpack(grid: torch.Tensor) -> torch.Tensor:
        return grid.gather(1, take.to(grid.device))[inverse.to(grid.device)]

    return packed, unpack
