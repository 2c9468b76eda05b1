"""Merge a LoRA adapter into its base: a full model folder that loads without peft, with its card.

    python -m train.merge_lora ADAPTER_DIR --out MERGED_DIR [--dtype bfloat16]

The base comes from the adapter's adapter_config.json (a Hub id or an absolute path, as our training saves it).
The merged folder gets the adapter's card with library_name transformers and a line saying what was merged.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from cli.entry import ArgumentParser, run_command
from cli.errors import read_json
from store.runs import check_outputs


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def merge(adapter, out, dtype: str = "auto") -> Path:
    import torch
    from huggingface_hub import ModelCard
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    adapter, out = Path(adapter), Path(out)
    config_path = adapter / "adapter_config.json"
    if not config_path.is_file():
        fail(f"{adapter}: no adapter_config.json (not a LoRA adapter folder)")
    if out.exists() and any(out.iterdir()):
        fail(f"{out}: exists and is not empty; choose another --out")
    check_outputs([adapter], [], folders=[out, out.with_name(out.name + ".partial")])  # writable, not the adapter
    config = read_json(config_path)
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not base:
        fail(f"{config_path}: base_model_name_or_path is missing")
    if not Path(base).is_absolute() and Path(base).exists() is False and "/" not in base:
        fail(f"{config_path}: base_model_name_or_path {base!r} is neither a Hub id nor an absolute path")
    model = AutoModelForImageTextToText.from_pretrained(base, dtype=dtype if dtype == "auto" else getattr(torch, dtype))
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    processor_source = adapter if (adapter / "preprocessor_config.json").exists() else base
    # build beside the target and rename: an interrupted merge never looks finished
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp)
    AutoProcessor.from_pretrained(processor_source).save_pretrained(tmp)
    if (adapter / "README.md").exists():
        card = ModelCard.load(adapter / "README.md")
        card.data.library_name = "transformers"
        card.data.tags = [t for t in (card.data.tags or []) if t != "lora"]
        card.text = (card.text.replace("This is a LoRA adapter (peft) on", "LoRA adapter merged into")
                     + f"\n\nMerged from the LoRA adapter `{adapter.resolve().name}` with `python -m train.merge_lora`.\n")
        card.save(tmp / "README.md")
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m train.merge_lora", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapter", help="folder with adapter_config.json + adapter_model.safetensors")
    parser.add_argument("--out", required=True, help="folder for the merged model (must not exist or be empty)")
    parser.add_argument("--dtype", default="auto", help="auto (the base's), bfloat16, float32, ...")
    args = parser.parse_args(argv)
    out = merge(args.adapter, args.out, args.dtype)
    print(f"merged {args.adapter} into its base: {out}")
    return 0


if __name__ == "__main__":
    run_command(main)
