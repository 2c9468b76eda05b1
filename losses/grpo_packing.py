"""GRPO's groups tree-packed: the G completions of a prompt as one prefix (the prompt, its image encoded once) and G
leaves, all groups of a chunk in one padding-free row, for every log-prob pass (policy, reference, old policy).

TRL's GRPO rows are `[left padding | prompt | completion | right padding]`. The G rows of a group are consecutive
when TRL scores its rollouts (the reference's and the old policy's passes) but not in the loss: TRL shuffles the
generation batch before it splits it into steps. So the groups are found, not assumed (`prompt_groups`: rows with
the same prompt tokens and the same image pixels, whatever their order), and a step that holds part of a group
(`gradient_accumulation_steps` > 1: TRL splits the shuffled batch into steps) packs its groups by size, one forward
per size. Each row is flushed left (`[prompt |
completion | padding]`, the layout losses/packing.py takes), the rows are reordered into its blocks (row k * groups
+ e holds completion k of group e), packed by `pack_preference_batch` with one group per example, scored by the
packed forward of `enable_packing`, and the per-token values are put back into TRL's `(rows, logits_to_keep)`
completion layout, in TRL's row order. Positions are the rope index of the flushed rows, which equals that of
TRL's left-padded rows (the rope index counts only attended tokens).
"""

from __future__ import annotations

import torch

from losses.packing import pack_preference_batch


def image_ranges(image_grid_thw: torch.Tensor, num_images: list[int]) -> list[list[tuple[int, int, int]]]:
    """Per row, its images as (image index, first pixel row, end pixel row) of the batch's `pixel_values`."""
    starts = [0, *torch.cumsum(image_grid_thw.prod(-1), 0).tolist()]
    out, first = [], 0
    for count in num_images:
        out.append([(i, starts[i], starts[i + 1]) for i in range(first, first + count)])
        first += count
    return out


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                  pixel_values: torch.Tensor | None = None, image_grid_thw: torch.Tensor | None = None,
                  num_images: list[int] | None = None) -> list[list[int]]:
    """The rows of each prompt (the same prompt tokens and the same images, pixel for pixel), in the order they come."""
    prompt_width = input_ids.size(1) - logits_to_keep
    kept = attention_mask[:, :prompt_width].bool()
    prompts = [tuple(row[keep].tolist()) for row, keep in zip(input_ids[:, :prompt_width], kept)]
    images: list[list[torch.Tensor]] = [[] for _ in prompts]
    if pixel_values is not None:
        images = [[pixel_values[a:b] for _, a, b in row] for row in image_ranges(image_grid_thw, num_images)]
    groups: list[list[int]] = []
    for r in range(len(prompts)):
        for group in groups:
            g = group[0]
            if prompts[g] == prompts[r] and len(images[g]) == len(images[r]) and all(
                    a.shape == b.shape and torch.equal(a, b) for a, b in zip(images[g], images[r])):
                group.append(r)
                break
        else:
            groups.append([r])
    return groups


def by_size(groups: list[list[int]]) -> list[list[list[int]]]:
    """The groups in sets of one size, one packed forward each (packing takes examples of one size)."""
    sizes: dict[int, list[list[int]]] = {}
    for group in groups:
        sizes.setdefault(len(group), []).append(group)
    return list(sizes.values())


def take_rows(rows: list[int], input_ids: torch.Tensor, attention_mask: torch.Tensor, mm_token_type_ids: torch.Tensor,
              pixel_values: torch.Tensor | None = None, image_grid_thw: torch.Tensor | None = None,
              num_images: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Those rows of a batch, their images with them."""
    index = torch.tensor(rows, device=input_ids.device)
    images = {}
    if pixel_values is not None:
        ranges = image_ranges(image_grid_thw, num_images)
        picked = [item for r in rows for item in ranges[r]]
        images = {"pixel_values": torch.cat([pixel_values[a:b] for _, a, b in picked]),
                  "image_grid_thw": image_grid_thw[torch.tensor([i for i, _, _ in picked], dtype=torch.long,
                                                                device=image_grid_thw.device)],
                  "num_images": [num_images[r] for r in rows]}
    return input_ids[index], attention_mask[index], mm_token_type_ids[index], images


def pack_grpo_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                   groups: list[list[int]], mm_token_type_ids: torch.Tensor, pixel_values: torch.Tensor | None = None,
                   image_grid_thw: torch.Tensor | None = None, num_images: list[int] | None = None):
    """(packed model inputs, unpack) for TRL's rows, `groups` (prompt_groups) one example each; `unpack(grid)` maps a
    packed forward's (rows, length - 1) output (in the packed row order) back onto TRL's (rows, logits_to_keep)
    completion columns."""
    rows, width = input_ids.shape
    prompt_width = width - logits_to_keep
    left_pad = prompt_width - attention_mask[:, :prompt_width].sum(1)
    shift = (torch.arange(width, device=input_ids.device)[None] + left_pad[:, None]) % width  # flush left

    def flushed(t):
        return t.gather(1, shift)

    group_size = len(groups[0])
    order = torch.tensor([group[k] for k in range(group_size) for group in groups],  # block k: row k of every group
                         device=input_ids.device)
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
