"""Tree-packed, padding-free preference batches: each example's shared prompt goes through the language model once.

An example's rows (DPO / NCA: [prompt + chosen, prompt + rejected]; NCA-P: the two instruction variants, each with
its chosen and rejected answer) become a tree of segments: the prefix that all its distinct prompts share (system
text, image, common text) once, one branch per distinct prompt continuation, one leaf per answer. All examples of
a micro-batch go into one row, without padding. A token attends to the earlier tokens of its own segment and to
every segment on its path to the root, never to a sibling or another example. Because attention is causal and the
positions of a token depend only on the tokens before it, a packed token then has exactly the hidden state it has in
its unpacked sequence, so the log-probabilities, the losses and the gradients are those of the unpacked batch.

- Positions: the model's own rope-index function (M-RoPE for Qwen2-VL / 2.5-VL / 3-VL) runs on the unpacked rows
  (small integer tensors the collator keeps), and each packed token takes the position of the token it was copied
  from.
- Images: each example's images once (`image_index`, losses/shared_vision.py); Qwen3-VL's deepstack features follow
  the image tokens of the packed row.
- Log-probabilities: a completion token is predicted by its predecessor in the tree (the first token of an answer by
  the last token of its prompt, which is in the parent segment), so the backbone returns the hidden states of those
  predecessors only, and TRL's fused head scores exactly the completion tokens. The wrapper then writes the
  per-token values back into the unpacked (rows, length - 1) grid, so TRL's loss code and metrics read them as usual.
- Attention: on CPU, sdpa with a boolean (1, 1, T, T) mask. On CUDA, flex_attention with a block mask built once per
  batch from the segment tree (no dense T x T mask). The choice is made on the first packed forward and logged once.
  The CUDA path has not run on a GPU yet (no GPU was available when it was written).
"""

from __future__ import annotations

import functools
import logging
import types

import torch

from losses.shared_vision import enable_shared_vision, vision_backbone

logger = logging.getLogger(__name__)

IMAGE = 1  # mm_token_type_ids value of image tokens
PACKED_KEYS = ("packed_input_ids", "packed_mm_token_type_ids", "packed_segments", "packed_ancestors",
               "packed_source", "packed_multiplicity", "packed_logp_index", "packed_logp_source",
               "rope_image_grid_thw")


# ---- the layout (collator side, pure tensor functions) -------------------------------------------------------------

def _common_prefix_length(sequences: list[list[int]]) -> int:
    length = min(len(s) for s in sequences)
    for i in range(length):
        if any(s[i] != sequences[0][i] for s in sequences[1:]):
            return i
    return length


def example_tree(prompts: list[list[int]]) -> tuple[int, list[int], list[int]]:
    """(prefix length, distinct prompts as indices into `prompts`, branch of every prompt) for one example's rows."""
    distinct, branch_of = [], []
    for prompt in prompts:
        for k, d in enumerate(distinct):
            if prompts[d] == prompt:
                branch_of.append(k)
                break
        else:
            branch_of.append(len(distinct))
            distinct.append(len(branch_of) - 1)
    return _common_prefix_length([prompts[d] for d in distinct]), distinct, branch_of


def pack_preference_batch(batch: dict, sequences_per_example: int) -> dict:
    """Pack a batch collated by TRL's vision preference collator (every row with its images, right-padded after
    `flush_left`) into one padding-free tree-packed row; the unpacked integer tensors stay for positions and for
    TRL's bookkeeping (`input_ids`, `attention_mask`, `completion_mask`, which the model no longer reads).

    Rows are in blocks of the examples: row r belongs to example r % (rows / sequences_per_example).
    """
    input_ids, attention, completion = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    if "mm_token_type_ids" not in batch:
        raise ValueError("packing needs mm_token_type_ids (the Qwen-VL processors' image token map)")
    mm_types = batch["mm_token_type_ids"]
    rows, length = input_ids.shape
    if rows % sequences_per_example:
        raise ValueError(f"{rows} rows do not split into examples of {sequences_per_example} sequences")
    examples = rows // sequences_per_example
    ids, types_, real, answer = (t.tolist() for t in (input_ids, mm_types, attention.bool(), completion.bool()))

    def starts_image(row: int, c: int) -> bool:
        return types_[row][c] == IMAGE and (c == 0 or types_[row][c - 1] != IMAGE)

    # image slots: row by row, one per run of image tokens; slot s shows unique image s % (slots / sequences)
    slot_start, slots = [], 0
    for r in range(rows):
        slot_start.append(slots)
        slots += sum(starts_image(r, c) for c in range(length))
    if slots % sequences_per_example:
        raise ValueError(f"{slots} image slots do not split into {sequences_per_example} identical blocks")
    unique_images = slots // sequences_per_example

    packed_ids, packed_types, segments, source, image_index = [], [], [], [], []
    parents: list[int] = []
    where = [[-1] * length for _ in range(rows)]  # packed index of every real token of every row

    def emit(row: int, columns: range, parent: int) -> int:
        segment = len(parents)
        parents.append(parent)
        images_before = sum(starts_image(row, c) for c in range(columns.start))
        for c in columns:
            if starts_image(row, c):
                image_index.append((slot_start[row] + images_before) % unique_images)
                images_before += 1
            where[row][c] = len(packed_ids)
            packed_ids.append(ids[row][c])
            packed_types.append(types_[row][c])
            segments.append(segment)
            source.append(row * length + c)
        return segment

    logp_index, logp_source = [], []
    for e in range(examples):
        members = [e + k * examples for k in range(sequences_per_example)]
        prompts = []
        for r in members:
            n_real, n_answer = sum(real[r]), sum(answer[r])
            n_prompt = n_real - n_answer
            if not all(real[r][:n_real]) or answer[r] != [False] * n_prompt + [True] * n_answer + [False] * (
                    length - n_real) or n_prompt == 0:
                raise ValueError("packing expects every row as [prompt | completion | padding] (TRL's flush_left)")
            prompts.append(ids[r][:n_prompt])
        prefix, distinct, branch_of = example_tree(prompts)
        root = emit(members[distinct[0]], range(prefix), -1) if prefix else -1
        branches = []
        for d in distinct:
            row = members[d]
            tail = range(prefix, len(prompts[d]))
            branches.append(emit(row, tail, root) if len(tail) else root)
            for c in range(prefix):
                where[row][c] = where[members[distinct[0]]][c]
        for k, row in enumerate(members):
            first = members[distinct[branch_of[k]]]
            for c in range(len(prompts[k])):
                where[row][c] = where[first][c]
            end = len(prompts[k]) + sum(answer[row])
            emit(row, range(len(prompts[k]), end), branches[branch_of[k]])
            for c in range(len(prompts[k]), end):
                logp_index.append(where[row][c - 1])
                logp_source.append(row * length + c)

    multiplicity = [0.0] * len(packed_ids)  # how many unpacked rows hold each packed token
    for r in range(rows):
        for i in where[r]:
            if i >= 0:
                multiplicity[i] += 1
    ancestors = torch.eye(len(parents), dtype=torch.bool)
    for s, parent in enumerate(parents):  # parents come before their children
        if parent >= 0:
            ancestors[s] |= ancestors[parent]
    packed = {k: v for k, v in batch.items() if k not in ("pixel_values", "image_grid_thw")}
    grid = batch["image_grid_thw"]
    patches = int(grid[:unique_images].prod(-1).sum())
    long = functools.partial(torch.tensor, dtype=torch.long)
    packed.update({
        "pixel_values": batch["pixel_values"][:patches], "image_grid_thw": grid[:unique_images],
        "image_index": long(image_index), "rope_image_grid_thw": grid,
        "packed_input_ids": long([packed_ids]), "packed_mm_token_type_ids": long([packed_types]),
        "packed_segments": long(segments), "packed_ancestors": ancestors, "packed_source": long(source),
        "packed_multiplicity": torch.tensor([multiplicity]),
        "packed_logp_index": long(logp_index), "packed_logp_source": long(logp_source),
    })
    return packed


def tree_attention_mask(segments: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
    """(1, 1, T, T) boolean mask, True where query i may attend key j: j <= i and j's segment is on i's path."""
    positions = torch.arange(segments.numel(), device=segments.device)
    causal = positions[None, :] <= positions[:, None]
    return (causal & ancestors[segments[:, None], segments[None, :]])[None, None]


def tree_block_mask(segments: torch.Tensor, ancestors: torch.Tensor):
    """The same mask as a flex_attention BlockMask: only the (128 x 128) blocks that any query attends are kept."""
    from torch.nn.attention.flex_attention import create_block_mask

    def tree(b, h, q, kv):
        return (kv <= q) & ancestors[segments[q], segments[kv]]

    n = segments.numel()
    return create_block_mask(tree, B=None, H=None, Q_LEN=n, KV_LEN=n, device=segments.device)


# ---- the model side -------------------------------------------------------------------------------------------------

class PackedTreeMixin:
    """Mixed into the backbone class (after SharedImagesMixin): attends through `tree_mask` and returns only the
    hidden states at `gather_index`. (`attention_mask` then holds each packed token's multiplicity, which is what
    TRL's fused head hands to an MoE load-balancing loss: the unpacked batch's token weights.)"""

    def forward(self, *args, gather_index: torch.Tensor | None = None, tree_mask=None, **kwargs):
        if tree_mask is not None:
            kwargs["attention_mask"] = tree_mask
        outputs = super().forward(*args, **kwargs)
        if gather_index is not None:
            outputs.last_hidden_state = outputs.last_hidden_state[:, gather_index]
        return outputs


@functools.lru_cache(maxsize=1)
def _log_attention_choice(choice: str) -> None:
    logger.info("packed attention: %s", choice)


class _MaskCache:
    """One mask per batch, shared by the policy and the reference forward (keyed by the segment tensor itself)."""
    key, value = None, None


def _attention_mask(model, text_config, segments: torch.Tensor, ancestors: torch.Tensor):
    if _MaskCache.key is segments:
        return _MaskCache.value
    if segments.device.type == "cuda":
        if text_config._attn_implementation != "flex_attention":
            model.set_attn_implementation({"text_config": "flex_attention"})
        _log_attention_choice("flex_attention with a block mask from the segment tree (CUDA)")
        mask = tree_block_mask(segments, ancestors)
    else:
        _log_attention_choice(f"{text_config._attn_implementation} with a boolean tree mask "
                              f"({segments.device.type})")
        mask = tree_attention_mask(segments, ancestors)
    _MaskCache.key, _MaskCache.value = segments, mask
    return mask


def packed_positions(backbone, batch: dict) -> torch.Tensor:
    """(3, 1, T) positions: the model's rope index of the unpacked rows, gathered onto the packed tokens."""
    positions, _ = backbone.get_rope_index(input_ids=batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
                                           image_grid_thw=batch["rope_image_grid_thw"],
                                           attention_mask=batch["attention_mask"])
    return positions.flatten(1)[:, batch["packed_source"]][:, None]


def enable_packing(model) -> None:
    """Let `model` (a TRL-fused-head model: call after `add_fused_lm_head`) take tree-packed batches.

    The wrapped forward recognises a packed batch by its keys, runs the backbone on the packed row and writes the
    per-token outputs of the completion tokens back into the unpacked (rows, length - 1) layout that TRL expects.
    """
    enable_shared_vision(model)
    backbone = vision_backbone(model)
    if not isinstance(backbone, PackedTreeMixin):
        backbone.__class__ = type(f"{type(backbone).__name__}Packed", (PackedTreeMixin, type(backbone)), {})
    top = getattr(model, "module", model)  # DDP / DeepSpeed engine (TRL prepares a ZeRO-3 reference at once)
    top = top.get_base_model() if hasattr(top, "get_base_model") else top
    if getattr(top.forward, "_packed", False):
        return
    fused_forward = top.forward
    text_config = top.config.get_text_config()

    @functools.wraps(type(top).forward)  # keep the signature: `generate` (GRPO's rollouts) checks kwargs against it
    def packed_forward(self, *args, **kwargs):
        if "packed_input_ids" not in kwargs:
            return fused_forward(*args, **kwargs)
        batch = {k: kwargs.pop(k) for k in (*PACKED_KEYS, "input_ids", "attention_mask", "mm_token_type_ids")}
        kwargs.pop("labels", None)
        rows, length = batch["input_ids"].shape
        source = batch["packed_logp_source"]
        labels = batch["input_ids"].flatten()[source]
        outputs = fused_forward(
            input_ids=batch["packed_input_ids"], mm_token_type_ids=batch["packed_mm_token_type_ids"],
            position_ids=packed_positions(vision_backbone(self), batch),
            tree_mask=_attention_mask(top, text_config, batch["packed_segments"], batch["packed_ancestors"]),
            attention_mask=batch["packed_multiplicity"],
            gather_index=batch["packed_logp_index"], shift_labels=labels[None], **kwargs)
        target = source - source // length - 1  # (r, c) -> r * (length - 1) + c - 1: where TRL's shift puts it
        for name in ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1"):
            value = getattr(outputs, name, None)
            if value is not None:
                grid = value.new_zeros(rows * (length - 1)).index_put((target,), value[0])
                setattr(outputs, name, grid.view(rows, length - 1))
        outputs.label_mask = torch.zeros(rows * (length - 1), dtype=torch.bool, device=source.device).index_fill(
            0, target, True).view(rows, length - 1)
        return outputs

    packed_forward._packed = True
    top.forward = types.MethodType(packed_forward, top)


class PaddingFreeCollator:
    """SFT without padding: TRL's vision collator, then every sequence of the batch into one row (one root segment
    each: the prompt, with the labelled tokens as its leaf), with each sequence's own (M-RoPE) positions. Labels stay
    in the unpacked layout, for the Trainer's token count; the model scores the same tokens."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.collator(examples)
        labelled = batch["labels"] != -100
        labelled[:, 0] = False  # the first token is never predicted (TRL shifts it away)
        batch["completion_mask"] = labelled.long()
        packed = pack_preference_batch(batch, sequences_per_example=1)
        del packed["completion_mask"]
        return packed
