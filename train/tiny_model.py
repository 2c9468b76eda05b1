"""Build a tiny random-weight Qwen2-VL, entirely offline, that loads exactly like Qwen2-VL-7B-Instruct.

It has a BPE tokenizer trained here on the synthetic SPY text, the official Qwen2-VL chat template and a
real `Qwen2VLProcessor`, and is written with `save_pretrained`, so everything else loads it through
`from_pretrained` / `AutoProcessor.from_pretrained`. Tests and the demo use it.

    python -m train.tiny_model outputs/tiny-qwen2vl [--hidden 128 --layers 2 --vision-depth 1]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from data_prep.errors import InputError
from train.common import run

CHAT_TEMPLATE_FILE = Path(__file__).parent / "assets" / "qwen2_vl_chat_template.jinja"
# The demo's size (../shared/specs/demo_notes.md): learns the synthetic task in minutes on 2 CPU cores.
DEMO_CONFIG = dict(hidden=128, layers=2, vision_depth=1)
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]


def build_tokenizer(corpus: list[str], vocab_size: int, chat_template: str):
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
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|endoftext|>", "<|im_end|>")],
        chat_template=chat_template,
        padding_side="right",
    )


def rope_sections(head_dim: int) -> list[int]:
    """Qwen2-VL's temporal/height/width split of the rotary half-dimension (16/24/24 of 64 at 7B)."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def build_tiny_model(
    out_dir,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    vision_depth: int = 2,
    vision_embed: int = 32,
    vocab_size: int = 1024,
    min_pixels: int = 56 * 56,
    max_pixels: int = 224 * 224,
    seed: int = 0,
    corpus: list[str] | None = None,
) -> Path:
    import torch
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    from data_prep.synthetic import text_corpus

    out_dir = Path(out_dir)
    template = CHAT_TEMPLATE_FILE.read_text()
    tokenizer = build_tokenizer(corpus or text_corpus(), vocab_size, template)
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=template,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": rope_sections(hidden // heads)},
            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=vision_depth, embed_dim=vision_embed, hidden_size=hidden, mlp_ratio=2, num_heads=2,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
        ),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--hidden", type=int, default=DEMO_CONFIG["hidden"])
    parser.add_argument("--layers", type=int, default=DEMO_CONFIG["layers"])
    parser.add_argument("--vision-depth", type=int, default=DEMO_CONFIG["vision_depth"])
    parser.add_argument("--vision-embed", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    except OSError as err:  # under a file, or no permission
        raise InputError(args.out_dir, None, "out_dir", f"cannot create the folder ({err.strerror})") from None
    out = build_tiny_model(args.out_dir, hidden=args.hidden, layers=args.layers, vision_depth=args.vision_depth,
                           vision_embed=args.vision_embed, seed=args.seed)
    print(f"wrote a tiny random Qwen2-VL to {out}")


if __name__ == "__main__":
    run(main)
