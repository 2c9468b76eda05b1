"""Build a tiny random-weight vision-language model, entirely offline, that loads exactly like the real one.

One builder per supported family (`FAMILIES`): a BPE tokenizer trained here on the synthetic SPY text with
the family's special tokens, the family's own chat template (train/assets/, provenance below), the family's
real processor class, and a config of the family's architecture shrunk to a few layers. Everything is
written with `save_pretrained`, so the rest of the code loads it through `from_pretrained` /
`AutoProcessor.from_pretrained`, as it loads Qwen2-VL-7B-Instruct or gemma-3-4b-it. Tests and the demo use it.

    python -m train.tiny_model outputs/tiny-qwen2vl [--family qwen3_vl] [--hidden 128 --layers 2 --vision-depth 1]

Chat templates: `qwen2_vl_chat_template.jinja` is Qwen2-VL-7B-Instruct's (Qwen2.5-VL ships the same text,
byte for byte identical to TRL's `trl/chat_templates/qwen2_5_vl.jinja`); `qwen3_vl_chat_template.jinja` and
`gemma3_chat_template.jinja` are copied unchanged from TRL 1.16's `trl/chat_templates/` (the templates
shipped by Qwen/Qwen3-VL-* and google/gemma-3-*-it, which TRL checks weekly against the Hub). Qwen3-VL-MoE
checkpoints (Qwen3-VL-30B-A3B-Instruct) ship the Qwen3-VL template.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import InputError
from cli.numbers import option
from train.common import run

ASSETS = Path(__file__).parent / "assets"
CHAT_TEMPLATE_FILE = ASSETS / "qwen2_vl_chat_template.jinja"
# The demo's size (../shared/specs/demo_notes.md): learns the synthetic task in minutes on 2 CPU cores.
DEMO_CONFIG = dict(hidden=128, layers=2, vision_depth=1)
QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]
SPECIAL_TOKENS = QWEN_SPECIAL_TOKENS  # the default family's, kept for callers of build_tokenizer
GEMMA3_SPECIAL_TOKENS = [
    "<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
    "<image_soft_token>",
]


def build_tokenizer(corpus: list[str], vocab_size: int, chat_template: str, special_tokens=QWEN_SPECIAL_TOKENS,
                    eos_token="<|im_end|>", pad_token="<|endoftext|>", named_tokens: dict | None = None, **extra):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Newlines split first and a prefix space everywhere: a label word then gets the same token at the
    # start of an instruction line as inside the question, which a model trained from scratch needs.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex("\n+"), "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=True)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    named = named_tokens or {}
    # Named special tokens (Gemma 3's boi_token / eoi_token / image_token) become tokenizer attributes, which the
    # family's processor reads; the rest stay plain special tokens.
    extra_special = named or [t for t in special_tokens if t not in (pad_token, eos_token)]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos_token, pad_token=pad_token, extra_special_tokens=extra_special,
        chat_template=chat_template, padding_side="right", **extra,
    )
    if named:
        tokenizer.add_special_tokens({"additional_special_tokens": [t for t in special_tokens
                                                                    if t not in (pad_token, eos_token)]})
    return tokenizer


def rope_sections(head_dim: int) -> list[int]:
    """Qwen2-VL's temporal/height/width split of the rotary half-dimension (16/24/24 of 64 at 7B)."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def _qwen_text(tokenizer, ids, hidden, layers, heads, kv_heads, **extra) -> dict:
    return dict(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False, **extra,
    )


def _qwen_family(config_class, model_class, processor_class, video_processor_class, template, patch_size):
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL (dense and MoE): one tokenizer and layout, their own configs."""

    def build(corpus, vocab_size, hidden, layers, heads, kv_heads, vision_depth, vision_embed, min_pixels,
              max_pixels, moe):
        import transformers
        from transformers import Qwen2VLImageProcessor

        text_template = (ASSETS / template).read_text()
        tokenizer = build_tokenizer(corpus, vocab_size, text_template)
        factor = 2 * patch_size  # one visual token per merged 2x2 patch block
        processor = getattr(transformers, processor_class)(
            image_processor=Qwen2VLImageProcessor(patch_size=patch_size, min_pixels=min_pixels or 2 * factor * factor,
                                                  max_pixels=max_pixels or 8 * factor * 8 * factor),
            tokenizer=tokenizer,
            video_processor=getattr(transformers, video_processor_class)(patch_size=patch_size),
            chat_template=text_template,
        )
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
        head_dim = hidden // heads
        rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": rope_sections(head_dim)}
        if config_class == "Qwen2VLConfig":
            vision = dict(depth=vision_depth, embed_dim=vision_embed, hidden_size=hidden, mlp_ratio=2, num_heads=2,
                          patch_size=patch_size, spatial_merge_size=2, temporal_patch_size=2)
            text = _qwen_text(tokenizer, ids, hidden, layers, heads, kv_heads, rope_parameters=rope)
        elif config_class == "Qwen2_5_VLConfig":
            # window attention in the last block, full attention in the others (as in 7B: 7, 15, 23, 31)
            vision = dict(depth=vision_depth, hidden_size=vision_embed, intermediate_size=2 * vision_embed,
                          out_hidden_size=hidden, num_heads=2, patch_size=patch_size, spatial_merge_size=2,
                          temporal_patch_size=2, window_size=4 * patch_size,
                          fullatt_block_indexes=list(range(vision_depth - 1)))
            text = _qwen_text(tokenizer, ids, hidden, layers, heads, kv_heads, rope_parameters=rope)
        else:  # Qwen3-VL: deepstack features of every vision block enter the first language layers
            rope["mrope_interleaved"] = True
            vision = dict(depth=vision_depth, hidden_size=vision_embed, intermediate_size=2 * vision_embed,
                          out_hidden_size=hidden, num_heads=2, patch_size=patch_size, spatial_merge_size=2,
                          temporal_patch_size=2, num_position_embeddings=64,
                          deepstack_visual_indexes=list(range(min(vision_depth, layers))))
            extra = dict(head_dim=head_dim, rope_parameters=rope)
            if moe:
                extra.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden, decoder_sparse_step=1)
            text = _qwen_text(tokenizer, ids, hidden, layers, heads, kv_heads, **extra)
        config = getattr(transformers, config_class)(
            text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
        )
        model = getattr(transformers, model_class)(config)
        model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
        model.generation_config.pad_token_id = ids["<|endoftext|>"]
        return model, processor

    return build


def _gemma3(corpus, vocab_size, hidden, layers, heads, kv_heads, vision_depth, vision_embed, min_pixels, max_pixels,
            moe):
    """Gemma 3: a SigLIP tower on a fixed square image, pooled to `mm_tokens_per_image` soft tokens."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3ImageProcessor, Gemma3Processor

    if min_pixels or max_pixels:
        raise ValueError("gemma3 resizes every image to one fixed square; it has no min_pixels / max_pixels")
    template = (ASSETS / "gemma3_chat_template.jinja").read_text()
    tokenizer = build_tokenizer(
        corpus, vocab_size, template, GEMMA3_SPECIAL_TOKENS, eos_token="<eos>", pad_token="<pad>",
        named_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                      "image_token": "<image_soft_token>"},
        bos_token="<bos>",
    )
    image_size, patch_size, tokens = 56, 14, 4  # 4x4 patches average-pooled to 2x2 (896 / 14 -> 256 at 4B)
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": image_size, "width": image_size}),
        tokenizer=tokenizer, chat_template=template, image_seq_length=tokens,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GEMMA3_SPECIAL_TOKENS}
    head_dim = hidden // heads
    config = Gemma3Config(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
            query_pre_attn_scalar=head_dim, max_position_embeddings=4096, sliding_window=512,
            layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"],  # 5:1 at 4B; the last is global
            bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"],
        ),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=vision_embed,
                           intermediate_size=2 * vision_embed, num_hidden_layers=vision_depth, num_attention_heads=2,
                           image_size=image_size, patch_size=patch_size, vision_use_head=False),
        mm_tokens_per_image=tokens, boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )
    model = Gemma3ForConditionalGeneration(config)
    # Gemma 3 initialises the image projection to zeros (images would be invisible and the vision tower would get
    # no gradient until the projection moved); a released checkpoint's projection is trained, so make it random.
    torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.02)
    model.generation_config.eos_token_id = [ids["<end_of_turn>"], ids["<eos>"]]
    model.generation_config.pad_token_id = ids["<pad>"]
    model.generation_config.bos_token_id = ids["<bos>"]
    return model, processor


# family -> builder(corpus, vocab_size, hidden, layers, heads, kv_heads, vision_depth, vision_embed, min_pixels,
# max_pixels, moe) -> (model, processor). The keys are the families' `model_type`s (vlm/families.py).
FAMILIES = {
    "qwen2_vl": _qwen_family("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", "Qwen2VLProcessor",
                             "Qwen2VLVideoProcessor", "qwen2_vl_chat_template.jinja", 14),
    "qwen2_5_vl": _qwen_family("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor",
                               "Qwen2VLVideoProcessor", "qwen2_vl_chat_template.jinja", 14),
    "qwen3_vl": _qwen_family("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", "Qwen3VLProcessor",
                             "Qwen3VLVideoProcessor", "qwen3_vl_chat_template.jinja", 16),
    "qwen3_vl_moe": _qwen_family("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", "Qwen3VLProcessor",
                                 "Qwen3VLVideoProcessor", "qwen3_vl_chat_template.jinja", 16),
    "gemma3": _gemma3,
}


def build_tiny_model(
    out_dir,
    family: str = "qwen2_vl",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    vision_depth: int = 2,
    vision_embed: int = 32,
    vocab_size: int = 1024,
    min_pixels: int | None = 56 * 56,
    max_pixels: int | None = 224 * 224,
    seed: int = 0,
    corpus: list[str] | None = None,
) -> Path:
    """Write the tiny model of `family` to `out_dir`; the pixel bounds apply to the Qwen families only
    (None: 2 to 64 visual tokens per image)."""
    import torch

    from data_prep.synthetic import text_corpus

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; supported: {', '.join(FAMILIES)}")
    if family == "gemma3":
        min_pixels = max_pixels = None
    elif family.startswith("qwen3") and (min_pixels, max_pixels) == (56 * 56, 224 * 224):
        min_pixels, max_pixels = 64 * 64, 256 * 256  # the same token counts with Qwen3-VL's 16-pixel patches
    torch.manual_seed(seed)
    model, processor = FAMILIES[family](corpus or text_corpus(), vocab_size, hidden, layers, heads, kv_heads,
                                        vision_depth, vision_embed, min_pixels, max_pixels,
                                        moe=family.endswith("_moe"))
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--family", default="qwen2_vl", choices=list(FAMILIES))
    parser.add_argument("--hidden", type=option("hidden"), default=DEMO_CONFIG["hidden"])
    parser.add_argument("--layers", type=option("layers"), default=DEMO_CONFIG["layers"])
    parser.add_argument("--vision-depth", type=option("vision_depth"), default=DEMO_CONFIG["vision_depth"])
    parser.add_argument("--vision-embed", type=option("vision_embed"), default=32)
    parser.add_argument("--seed", type=option("seed"), default=0)
    args = parser.parse_args(argv)
    from store.runs import check_outputs, claim_folder

    try:
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    except OSError as err:  # under a file, or no permission
        raise InputError(args.out_dir, None, "out_dir", f"cannot create the folder ({err.strerror})") from None
    check_outputs([], [], [args.out_dir])
    claim_folder(args.out_dir, "train.tiny_model")  # a folder of the user's files is refused
    out = build_tiny_model(args.out_dir, family=args.family, hidden=args.hidden, layers=args.layers,
                           vision_depth=args.vision_depth, vision_embed=args.vision_embed, seed=args.seed)
    print(f"wrote a tiny random {args.family} to {out}")


if __name__ == "__main__":
    run(main)
