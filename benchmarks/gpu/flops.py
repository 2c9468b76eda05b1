"""The FLOP accounting of the GPU benchmark (nca_p_throughput.py): parameter groups, the model and executed FLOPs
of one step, and the step-time ratios they predict for each option (--estimate). Pure arithmetic on parameter
counts, the model's shape and a batch's masks and image grids; nothing here runs a model.

Model FLOPs of one step: the work the step needs, whatever the implementation (each image encoded once, no
activation-checkpointing recomputation). Per forward pass over the batch:
    text   = 2 * N_text * T + 4 * L * d * sum(S_i^2)     (T non-padding tokens, S_i sequence lengths, attention dense)
             packed: T the tokens of the packed row, sum(S_i^2) -> 2 * (query, key) pairs of the tree mask
    head   = 2 * V * d * C                               (C completion tokens: TRL's fused head projects only those)
    vision = sum over unique images of 2 * N_vision(P) + 4 * L_v * d_v * P^2   (P patches; merger on P / 4)
    step, full fine-tuning = 3 * (text + head + vision)                (forward + backward of weights and inputs)
    step, LoRA             = 2 * text_linear + 3 * attention + 2 * head + vision + 6 * N_lora * T
                             (frozen weights: backward through the activations only; the vision tower, frozen and
                             before every adapter, needs no backward)
    + text + head + vision for a live reference (0 when precomputed).
Executed FLOPs (for HFU) add what the kernels really run: the repeated vision encodes (k copies per model) and the
recomputed forward under activation checkpointing.
"""

from __future__ import annotations


def parameter_counts(model) -> dict:
    """Parameter groups the FLOP count needs (embedding table left out, LM head counted as a matmul)."""
    groups = {"vision_blocks": 0, "vision_patch_embed": 0, "vision_merger": 0, "text": 0, "embedding": 0}
    for name, p in model.named_parameters():
        if ".visual.blocks." in f".{name}":
            groups["vision_blocks"] += p.numel()
        elif ".visual.patch_embed." in f".{name}":
            groups["vision_patch_embed"] += p.numel()
        elif ".visual." in f".{name}":
            groups["vision_merger"] += p.numel()
        elif "embed_tokens" in name:
            groups["embedding"] += p.numel()
        elif "lm_head" not in name:
            groups["text"] += p.numel()
    config = model.config.get_text_config()
    groups["lm_head"] = config.vocab_size * config.hidden_size  # a matmul even when tied to the embedding
    groups["total"] = sum(p.numel() for p in model.parameters())
    return groups


def step_flops(batch, counts: dict, spec: dict, finetune: str, live_reference: bool, checkpointing: bool,
               lora_params: int = 0, sequences_per_example: int = 4) -> dict:
    """Model and executed FLOPs of one NCA-P (or DPO: 2 sequences per example) step on `batch` (see the module
    docstring)."""
    text, vision = spec["text"], spec["vision"]
    completion = int(batch["completion_mask"].sum())
    if "packed_input_ids" in batch:
        tokens, squares = int(batch["packed_input_ids"].numel()), 2.0 * tree_pairs(batch)
    else:
        lengths = batch["attention_mask"].sum(dim=1).double()
        tokens, squares = int(lengths.sum()), float((lengths ** 2).sum())
    linear = 2 * counts["text"] * tokens
    attention = 4 * text["num_hidden_layers"] * text["hidden_size"] * squares
    head = 2 * counts["lm_head"] * completion
    grid = batch["image_grid_thw"]
    shared = "image_index" in batch
    unique = grid if shared else grid[: grid.size(0) // sequences_per_example]  # repeated: one image per example
    copies = 1 if shared else grid.size(0) // unique.size(0)  # encodes of each image per model
    image = 0.0
    for patches in unique.prod(dim=-1).tolist():
        image += (2 * ((counts["vision_blocks"] + counts["vision_patch_embed"]) * patches
                       + counts["vision_merger"] * patches / 4) + 4 * vision["depth"] * vision["embed_dim"] * patches ** 2)
    forward = linear + attention + head + image
    if finetune == "full":
        policy = 3 * forward
        recompute = (linear + attention + copies * image) if checkpointing else 0.0
        extra_vision = 3 * (copies - 1) * image
    else:
        policy = 2 * linear + 3 * attention + 2 * head + image + 6 * lora_params * tokens
        recompute = (linear + attention) if checkpointing else 0.0
        extra_vision = (copies - 1) * image
    reference = forward if live_reference else 0.0
    executed = policy + reference + recompute + extra_vision + ((copies - 1) * image if live_reference else 0.0)
    return {"tokens": tokens, "completion_tokens": completion, "flops": policy + reference,
            "executed_flops": executed, "vision_share": image / forward, "vision_copies": copies}


def tree_pairs(batch) -> float:
    """(query, key) pairs the tree mask of a packed batch allows, without building it: a token attends to the
    earlier tokens of its segment, itself and every token of its ancestor segments."""
    import torch

    segments, ancestors = batch["packed_segments"].cpu(), batch["packed_ancestors"].cpu()
    sizes = torch.bincount(segments, minlength=ancestors.size(0)).double()
    above = ancestors.double() @ sizes - sizes  # tokens in the strict ancestors of each segment
    return float((above * sizes + sizes * (sizes + 1) / 2).sum())


def causal_tree_flops(counts: dict, text: dict, segments: list[tuple[int, int]]) -> float:
    """Language-model forward FLOPs of a tree given as (length, tokens above it) segments (dense convention)."""
    tokens = sum(n for n, _ in segments)
    pairs = sum(n * above + n * (n + 1) / 2 for n, above in segments)
    return 2 * (counts["text"] + counts["lm_head"]) * tokens + 4 * text["num_hidden_layers"] * text["hidden_size"] * 2 * pairs


def expected_speedups(counts: dict, spec: dict, patches: int, text_tokens: int, checkpointing: bool,
                      sequences: int = 4, answer_tokens: int = 40, branch_tokens: int = 20) -> dict:
    """Step-time ratios predicted from the FLOPs each option executes, for one example of `sequences` sequences
    on one image (NCA-P: 4, DPO/NCA: 2).

    Executed per step (c = 1 with activation checkpointing): full fine-tuning runs the policy's forward, backward
    (2x) and recomputation (c) through both towers; LoRA on the language model needs input gradients only (~1x)
    there and no backward through the frozen vision tower. The live reference adds one forward of each; the vision
    tower runs k = `sequences` times per model without sharing, once with it.

    Packed: the language model runs the tree once per example: the prefix (image + the prompt text the
    sequences share), one branch of `branch_tokens` per instruction variant (NCA-P: 2, DPO/NCA: none) and one
    leaf of `answer_tokens` per sequence, instead of `sequences` full sequences (same convention as f_text).
    """
    text, vision = spec["text"], spec["vision"]
    length = text_tokens + patches // 4
    f_text = sequences * (2 * (counts["text"] + counts["lm_head"]) * length
                  + 4 * text["num_hidden_layers"] * text["hidden_size"] * length ** 2)
    f_vision = (2 * ((counts["vision_blocks"] + counts["vision_patch_embed"]) * patches
                     + counts["vision_merger"] * patches / 4)
                + 4 * vision["depth"] * vision["embed_dim"] * patches ** 2)
    c = int(checkpointing)
    variants = 2 if sequences == 4 else 1
    branches = branch_tokens if variants > 1 else 0
    prefix = length - answer_tokens - branches
    f_text_packed = causal_tree_flops(counts, text, [(prefix, 0)] + [(branches, prefix)] * variants * (branches > 0)
                                      + [(answer_tokens, prefix + branches)] * sequences)
    # the same convention for the unpacked sequences: causal pairs, doubled (= dense S^2 up to S)
    f_text_causal = sequences * causal_tree_flops(counts, text, [(length, 0)])

    def step(finetune, k, live, f_text=f_text):
        if finetune == "full":
            policy = (3 + c) * (f_text + k * f_vision)
        else:
            policy = (2 + c) * f_text + k * f_vision
        return policy + (f_text + k * f_vision if live else 0.0)

    out = {"tokens_per_sequence": length, "vision_share_of_shared_forward": f_vision / (f_text + f_vision)}
    for finetune in ("full", "lora"):
        out[f"{finetune}_shared_vision_speedup"] = step(finetune, sequences, True) / step(finetune, 1, True)
        out[f"{finetune}_precompute_speedup"] = step(finetune, 1, True) / step(finetune, 1, False)
        out[f"{finetune}_combined_speedup"] = step(finetune, sequences, True) / step(finetune, 1, False)
        for live in (True, False):
            out[f"{finetune}_packed_speedup{'' if live else '_precomputed'}"] = (
                step(finetune, 1, live, f_text_causal) / step(finetune, 1, live, f_text_packed))
    out["packed_tokens_per_example"] = prefix + variants * branches + sequences * answer_tokens
    return out
