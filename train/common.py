"""What every entry script shares: the recipe parser, model and processor loading, the SPY-Tune datasets.
Saving, the model card and publishing at the end of a run are in train/card.py."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from data_prep.errors import InputError

METHOD_NAMES = {"sft": "SFT", "dpo": "DPO", "nca": "NCA", "nca_p": "NCA-P"}


@dataclass
class SpyTuneArguments:
    """Where the data is and how it becomes training rows (the recipe's data section)."""

    train_data_path: str = field(metadata={"help": "SPY-Tune JSON ({\"data_list\": [...]})."})
    image_folder: str = field(metadata={"help": "Folder that the items' image_path values are relative to."})
    eval_data_path: str | None = field(default=None, metadata={"help": "Optional held-out SPY-Tune JSON for eval loss."})
    label_path: str | None = field(default=None, metadata={"help": "label2text.json; default: the bundled copy."})
    add_distractors: bool = field(default=True, metadata={"help": "Five distractor instruction lines per prompt."})
    shuffle: bool = field(default=True, metadata={"help": "Shuffle the rows with the training seed."})
    num_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N rows (after shuffling)."})
    min_pixels: int | None = field(default=None, metadata={"help": "Image processor lower bound (pixels)."})
    max_pixels: int | None = field(default=None, metadata={"help": "Image processor upper bound (pixels)."})
    dataset_name: str = field(default="SPY-Tune", metadata={"help": "Dataset name shown in the model card."})


def parse_recipe(*dataclass_types):
    """`script.py RECIPE.yaml [--key value ...]`: the recipe sets defaults, flags override them.

    Unknown keys in the recipe or on the command line are errors, so a misspelt key cannot be silently ignored.
    """
    from trl import TrlParser

    argv = sys.argv[1:]
    if argv and argv[0].endswith((".yaml", ".yml")):
        argv = ["--config", argv[0], *argv[1:]]
    return TrlParser(dataclass_types).parse_args_and_config(argv, fail_with_unknown_args=True)


def load_model_and_processor(model_args, script_args: SpyTuneArguments, training_args):
    """Model and processor through `from_pretrained`, as for Qwen2-VL-7B-Instruct on the Hub."""
    import torch
    from accelerate import PartialState
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import get_quantization_config

    trust = training_args.trust_remote_code
    pixel_bounds = {k: v for k, v in (("min_pixels", script_args.min_pixels), ("max_pixels", script_args.max_pixels))
                    if v is not None}
    processor = AutoProcessor.from_pretrained(
        model_args.model_name_or_path, revision=model_args.model_revision, trust_remote_code=trust, **pixel_bounds
    )
    quantization_config = get_quantization_config(model_args)
    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(torch, model_args.dtype)
    model = AutoModelForImageTextToText.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        dtype=dtype,
        attn_implementation=model_args.attn_implementation,
        trust_remote_code=trust,
        quantization_config=quantization_config,
        # QLoRA: each process keeps its quantized copy on its own device
        device_map={"": PartialState().local_process_index} if quantization_config is not None else None,
    )
    return model, processor


def load_datasets(method: str, script_args: SpyTuneArguments, seed: int):
    """(train, eval or None) datasets of one method; bad input exits with one line naming file, record, field."""
    from data_prep.spy_tune import build_dataset

    def build(path, shuffle, num_samples):
        return build_dataset(method, path, script_args.image_folder, script_args.add_distractors,
                             script_args.label_path, shuffle, seed, num_samples)

    try:
        train = build(script_args.train_data_path, script_args.shuffle, script_args.num_train_samples)
        evaluation = build(script_args.eval_data_path, False, None) if script_args.eval_data_path else None
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    return train, evaluation


def resume_checkpoint(training_args):
    """`--resume_from_checkpoint PATH`, or `true` for the newest checkpoint in output_dir."""
    value = training_args.resume_from_checkpoint
    if value is None or str(value).lower() in ("false", "none", ""):
        return None
    return True if str(value).lower() in ("true", "last") else value
