"""What every entry script shares: the recipe parser, model and processor loading, the SPY-Tune datasets,
and saving, the model card and publishing at the end of a run."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

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

    from data_prep.families import pixel_kwargs

    trust = training_args.trust_remote_code
    try:
        pixel_bounds = pixel_kwargs(model_args.model_name_or_path, script_args.min_pixels, script_args.max_pixels,
                                    revision=model_args.model_revision, trust_remote_code=trust)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
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


def _recipe_dict(*configs) -> dict:
    keep = {}
    for config in configs:
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if f.name.startswith("_") or "token" in f.name:  # never write credentials into the card
                continue
            # Enums and paths become their plain values, so the recipe reads back as YAML
            keep[f.name] = json.loads(json.dumps(value, default=str))
    return keep


def write_model_card(output_dir, method: str, base_model: str, script_args, training_args, model_args,
                     train_metrics: dict | None = None, model_type: str = "qwen2_vl") -> Path:
    """README.md with Hub metadata: base model, method, recipe, data and the metrics known so far; the family
    tag comes from the model config's `model_type`."""
    from huggingface_hub import ModelCard, ModelCardData

    from data_prep.families import family_tag

    recipe = _recipe_dict(script_args, training_args, model_args)
    card_data = ModelCardData(
        base_model=base_model, library_name="transformers", pipeline_tag="image-text-to-text",
        tags=["privacy-align", method, "trl", family_tag(model_type), "privacy"], datasets=[script_args.dataset_name],
    )
    metrics = ""
    if train_metrics:
        metrics += "\n## Training metrics (last logged step)\n\n" + _table(train_metrics)
    content = f"""---
{card_data.to_yaml()}
---

# {Path(output_dir).name}

`{base_model}` fine-tuned with **{METHOD_NAMES[method]}** on **{script_args.dataset_name}** by
[privacy-align](https://github.com/privacy-align/privacy-align), to follow privacy boundaries that users state
in plain language (SPY-Tune / SPY-Bench).

- Method: `{method}`{f" (loss {', '.join(getattr(training_args, 'loss_type', []))}, beta {training_args.beta})"
                        if hasattr(training_args, "beta") else ""}
- Data: `{script_args.train_data_path}` (images under `{script_args.image_folder}`), distractor instructions:
  {script_args.add_distractors}
- Steps: {training_args.max_steps if training_args.max_steps > 0 else f"{training_args.num_train_epochs} epochs"},
  learning rate {training_args.learning_rate}, per-device batch {training_args.per_device_train_batch_size}
{metrics}
## Recipe

```yaml
{yaml.safe_dump(recipe, sort_keys=True)}```
"""
    card = ModelCard(content)
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path


def add_card_evaluation(output_dir, title: str, metrics: dict) -> None:
    """Add measured metrics to a saved model card, above its recipe (the metrics are known after training)."""
    path = Path(output_dir) / "README.md"
    text = path.read_text()
    section = f"## Evaluation: {title}\n\n{_table(metrics)}\n"
    head, sep, recipe = text.partition("## Recipe")
    path.write_text(f"{head}{section}\n{sep}{recipe}" if sep else f"{text}\n{section}")


def _table(metrics: dict) -> str:
    rows = "".join(f"| {k} | {v:.4g} |\n" if isinstance(v, float) else f"| {k} | {v} |\n" for k, v in metrics.items())
    return "| metric | value |\n|---|---|\n" + rows


def finish(trainer, method: str, script_args, training_args, model_args) -> None:
    """Save safetensors weights + processor + model card; publish to the Hub when the recipe says so."""
    trainer.save_model(training_args.output_dir)
    if not trainer.accelerator.is_main_process:
        return
    logged = [entry for entry in trainer.state.log_history if "loss" in entry or "train_loss" in entry]
    train_metrics = {k: v for entry in logged[-1:] for k, v in entry.items()}
    write_model_card(training_args.output_dir, method, model_args.model_name_or_path, script_args, training_args,
                     model_args, train_metrics, trainer.accelerator.unwrap_model(trainer.model).config.model_type)
    with open(Path(training_args.output_dir) / "train_metrics.json", "w") as f:
        json.dump(trainer.state.log_history, f, indent=1)
    if training_args.push_to_hub:
        publish(training_args.output_dir, training_args.hub_model_id, training_args.hub_private_repo)


def publish(output_dir, hub_model_id: str | None, private: bool | None = None) -> str:
    """Upload the final folder (weights, processor, model card) to the Hub; the token comes from the environment."""
    from huggingface_hub import HfApi

    if not hub_model_id:
        sys.exit("error: push_to_hub needs hub_model_id (e.g. your-name/qwen2-vl-7b-spy-nca-p)")
    api = HfApi(token=os.environ.get("HF_TOKEN"))
    api.create_repo(hub_model_id, private=private, exist_ok=True)
    api.upload_folder(repo_id=hub_model_id, folder_path=output_dir, commit_message="privacy-align: final model",
                      ignore_patterns=["checkpoint-*", "*.pt", "runs/*"])
    return hub_model_id
