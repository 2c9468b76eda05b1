"""Run the vision tower once per image and reuse its output in every sequence of that example.

A DPO / NCA pair is two sequences on one image, an NCA-P example four; TRL's collator repeats the image in
every sequence, so the vision tower runs 2x / 4x per model per step. Here the collator keeps each image
once and adds `image_index` (one entry per image slot of the batch, pointing at its unique image), and the
Qwen backbone (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) encodes the unique images and hands the features
to every slot through `mm_encoder_outputs`. Qwen3-VL also feeds each image's deepstack features (one per
listed vision block) into the first language layers; they are indexed onto the slots the same way. It all
happens inside the model's forward, so DDP and DeepSpeed hooks see every parameter, and the backward pass sums each image's gradient over the sequences that used it: losses and
gradients equal those of the repeated computation.
"""

from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling


class SharedImagesMixin:
    """Mixed into the backbone class (`Qwen2VLModel`, ..., `Qwen3VLMoeModel`): accepts `image_index`."""

    def forward(self, *args, image_index: torch.Tensor | None = None, **kwargs):
        if image_index is None:
            return super().forward(*args, **kwargs)
        pixel_values, image_grid_thw = kwargs.pop("pixel_values"), kwargs.pop("image_grid_thw")
        features = self.get_image_features(pixel_values, image_grid_thw, return_dict=True)
        slots = image_index.tolist()
        pooled = tuple(features.pooler_output[i] for i in slots)
        deepstack = getattr(features, "deepstack_features", None)
        if deepstack is None:
            shared = BaseModelOutputWithPooling(pooler_output=pooled)
        else:  # Qwen3-VL: per listed vision block, a tuple of per-image features
            shared = type(features)(pooler_output=pooled,
                                    deepstack_features=[tuple(layer[i] for i in slots) for layer in deepstack])
        return super().forward(*args, image_grid_thw=image_grid_thw[image_index], mm_encoder_outputs={"image": shared},
                               **kwargs)


def vision_backbone(model):
    """The module that owns `get_image_features` (Qwen2VLModel), under PEFT and accelerate wrappers."""
    module = getattr(model, "module", model)  # DDP / DeepSpeed engine
    if hasattr(module, "get_base_model"):  # PEFT
        module = module.get_base_model()
    for candidate in (module, getattr(module, "model", None)):
        if candidate is not None and hasattr(candidate, "get_image_features") and hasattr(candidate, "visual"):
            return candidate
    raise TypeError(f"{type(module).__name__} has no vision backbone with get_image_features (not a Qwen-VL?)")


def enable_shared_vision(model) -> None:
    """Swap the backbone's class for one that understands `image_index` (weights and config are untouched)."""
    backbone = vision_backbone(model)
    cls = type(backbone)
    if issubclass(cls, SharedImagesMixin):
        return
    backbone.__class__ = type(f"{cls.__name__}SharedImages", (SharedImagesMixin, cls), {})


def share_images(batch: dict, repeats: int) -> dict:
    """Keep the first of `repeats` identical blocks of images in a collated batch and index the rest onto it.

    TRL's vision collators process the examples' images once per sequence block (chosen, rejected, ...), in the
    same order in each block, so image slot s shows unique image s % (slots / repeats).
    """
    grid = batch["image_grid_thw"]
    slots = grid.size(0)
    if slots % repeats:
        raise ValueError(f"{slots} image slots do not split into {repeats} identical blocks")
    unique = slots // repeats
    patches = int(grid[:unique].prod(-1).sum())
    batch["pixel_values"] = batch["pixel_values"][:patches]
    batch["image_grid_thw"] = grid[:unique]
    batch["image_index"] = torch.arange(slots) % unique
    return batch
