"""The supported model families and what differs between them, keyed by the checkpoint config's `model_type`.

- `shared_vision`: the backbone can encode each image once and hand its features to every sequence that shows
  it (losses/shared_vision.py). Gemma 3 scatters its pooled image tokens inside a forward that takes pixel
  values only, so it trains on the plain path.
- `packing`: tree-packed, padding-free preference batches (losses/packing.py): needs shared vision, the
  processor's `mm_token_type_ids` and a rope-index function on the backbone.
- `lora_targets`: what `--use_peft true` adapts when the recipe names no `lora_target_modules` (PEFT knows no
  default for these families and would stop with a traceback after the model loads): the language model's
  attention and MLP projections, by a regex that leaves the vision tower out (Qwen2.5-VL's vision blocks have
  their own gate/up/down projections; Qwen3-VL-MoE's experts are fused parameters, so there the attention only).
- `pixel_bounds`: the image processor sizes images between `min_pixels` and `max_pixels` (Qwen's dynamic
  resolution). Gemma 3 resizes every image to one fixed square (896 x 896 in the released checkpoints), so
  the bounds are refused rather than ignored.
- `flex_routes`: where `packed_attention: auto` runs flex_attention for this family, as (device type, pass)
  pairs, pass "gradient" or "no_gradient": only where that route has run and matched sdpa. None yet: on CPU flex
  runs eager and unfused (the tests' route, slower than sdpa), and no GPU has run it (benchmarks/gpu/run.sh's
  first check is the one that may add ("cuda", ...) here).

A model of a family not listed here still loads and trains through the Auto classes, on the plain path, and
its pixel bounds go to its processor unchanged.
"""

from __future__ import annotations

from cli.errors import InputError

LANGUAGE_PROJECTIONS = r".*\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
FAMILIES = {
    "qwen2_vl": {"shared_vision": True, "packing": True, "pixel_bounds": True, "flex_routes": (),
                 "lora_targets": LANGUAGE_PROJECTIONS},
    "qwen2_5_vl": {"shared_vision": True, "packing": True, "pixel_bounds": True, "flex_routes": (),
                   "lora_targets": LANGUAGE_PROJECTIONS},
    "qwen3_vl": {"shared_vision": True, "packing": True, "pixel_bounds": True, "flex_routes": (),
                 "lora_targets": LANGUAGE_PROJECTIONS},
    "qwen3_vl_moe": {"shared_vision": True, "packing": True, "pixel_bounds": True, "flex_routes": (),
                     "lora_targets": LANGUAGE_PROJECTIONS},
    "gemma3": {"shared_vision": False, "packing": False, "pixel_bounds": False, "lora_targets": LANGUAGE_PROJECTIONS},
}


def supports_shared_vision(model_type: str) -> bool:
    return FAMILIES.get(model_type, {}).get("shared_vision", False)


def supports_packing(model_type: str) -> bool:
    return FAMILIES.get(model_type, {}).get("packing", False)


def flex_ran_on(model_type: str | None) -> tuple:
    return FAMILIES.get(model_type, {}).get("flex_routes", ())


def default_lora_targets(model_type: str) -> str | None:
    return FAMILIES.get(model_type, {}).get("lora_targets")


def model_type_of(model_name_or_path, **hub_kwargs) -> str:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_name_or_path, **hub_kwargs).model_type


def pixel_kwargs(model_name_or_path, min_pixels: int | None, max_pixels: int | None, **hub_kwargs) -> dict:
    """`AutoProcessor.from_pretrained` keyword arguments for the pixel bounds; InputError where the family has
    no such notion."""
    bounds = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
    if not bounds:
        return {}
    model_type = model_type_of(model_name_or_path, **hub_kwargs)
    if not FAMILIES.get(model_type, {}).get("pixel_bounds", True):
        raise InputError(model_name_or_path, None, "/".join(bounds),
                         f"{model_type} resizes every image to one fixed size and has no min_pixels/max_pixels; "
                         "remove them")
    return bounds
