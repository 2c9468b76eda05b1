"""A checkpoint's life after training: its model card, the one Hub push, and the W&B run config.

The card is built with huggingface_hub's ModelCard / ModelCardData (metadata the Hub indexes: base model,
library, tags, datasets, licence, model-index) and replaces TRL's automatic card in every folder a run saves.
A run pushes once, at the end, with our card; `hub_strategy: checkpoint` adds the Trainer's checkpoint pushes.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml
from transformers import TrainerCallback

from cli.errors import InputError
from train.common import METHOD_NAMES
from train.resume import FINISHED

# Used when the base model's own card names no licence: Qwen2-VL / Qwen2.5-VL 2B-7B, the family recipes train.
DEFAULT_LICENSE = "apache-2.0"
# What a reader needs to redo the run, instead of every training argument.
RECIPE_KEYS = ("beta", "loss_type", "learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
               "gradient_accumulation_steps", "lr_scheduler_type", "warmup_ratio", "max_length", "seed", "bf16",
               "gradient_checkpointing", "shared_vision", "packed", "packed_attention", "precompute_ref_log_probs",
               "num_generations", "max_completion_length", "reward_funcs", "reward_weights", "judge")
MODEL_KEYS = ("dtype", "attn_implementation", "use_peft", "lora_r", "lora_alpha", "lora_dropout",
              "lora_target_modules", "load_in_4bit", "load_in_8bit")
SCRIPT_KEYS = ("train_data_path", "image_folder", "eval_data_path", "categories", "add_distractors", "general_fraction",
               "num_train_samples", "min_pixels", "max_pixels", "dataset_name")
PATH_KEYS = ("train_data_path", "image_folder", "eval_data_path", "categories")
PACKAGES = ("transformers", "trl", "peft", "torch", "datasets", "accelerate", "huggingface_hub")
CITATION = """@misc{spy,
  title = {Specify Privacy Yourself (SPY-Bench, SPY-Tune, NCA-P)},
  note  = {https://github.com/achernarwang/specify-privacy-yourself}
}
@inproceedings{nca2024,
  title     = {Noise Contrastive Alignment of Language Models with Explicit Rewards},
  author    = {Chen, Huayu and He, Guande and Yuan, Lifan and Cui, Ganqu and Su, Hang and Zhu, Jun},
  booktitle = {NeurIPS},
  year      = {2024}
}"""
INSTRUCTION = "Do not reveal or infer anything about the people in the image, or their documents."
_SNAPSHOT = re.compile(r"models--([^/]+)--([^/]+)/snapshots/[^/]+/?$")


# ----------------------------------------------------------------------------------------------- base model
def hub_id(model: str) -> str | None:
    """The Hub id of a base model: the id itself, or the one a local Hub-cache snapshot was downloaded from."""
    match = _SNAPSHOT.search(str(Path(model).resolve()) if Path(model).exists() else str(model))
    if match:
        return f"{match.group(1)}/{match.group(2)}"
    if not Path(model).exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", str(model)):
        return str(model)
    return None


def base_reference(model: str) -> str:
    """How a saved adapter names its base on this machine: a Hub id, else an absolute path (loadable from any
    folder). Never published: `publish` uploads public_base(model) instead."""
    return hub_id(model) or str(Path(model).resolve())


def public_base(model: str) -> str:
    """How a published card or adapter config names its base: the Hub id, else the local folder's name (a path of
    the machine that trained it means nothing elsewhere, and says more than it should)."""
    import os

    return hub_id(model) or Path(os.path.abspath(model)).name


def shown_path(value, keep_outside: bool = False):
    """A path as a card shows it: a relative one as given; an absolute one relative to the current folder when it
    lies under it, else (unless `keep_outside`: a card that is not published may name its own folder) its last two
    parts, `<local>/data/train.json`."""
    import os

    if not isinstance(value, str) or not os.path.isabs(value):
        return value
    path = Path(os.path.normpath(value))
    if path.is_relative_to(Path.cwd()):
        return str(path.relative_to(Path.cwd())) or "."
    return str(path) if keep_outside else "<local>/" + "/".join(path.parts[-2:])


def _base_card_license(model: str) -> str | None:
    readme = Path(model) / "README.md"
    if readme.is_file():
        from huggingface_hub import ModelCard

        try:
            return ModelCard.load(readme).data.license
        except Exception:  # a base without a parsable card: fall back to the default
            return None
    return None


# ----------------------------------------------------------------------------------------------- the card
def recipe_values(script_args, training_args, model_args) -> dict:
    """The recipe's key values (not every argument; never a token)."""
    values = {"method": None}
    for config, keys in ((training_args, RECIPE_KEYS), (model_args, MODEL_KEYS), (script_args, SCRIPT_KEYS)):
        for key in keys:
            if hasattr(config, key):
                values[key] = json.loads(json.dumps(getattr(config, key), default=str))
    for key in PATH_KEYS:
        if key in values:
            values[key] = shown_path(values[key])
    if not values.get("use_peft"):
        for key in MODEL_KEYS[3:7]:
            values.pop(key, None)
    return values


def framework_versions() -> dict:
    found = {}
    for package in PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


# What the card's metrics table shows of the last logged step: the loss, and each method's own statistics (the
# preference methods' rewards and log-probabilities; GRPO's reward, KL, group and dynamic-sampling statistics).
# compliance/<category> (one per category) stays in train_metrics.json.
CARD_METRICS = ("loss", "step", "epoch", "reward", "reward_std", "kl", "frac_reward_zero_std")
CARD_METRIC_PREFIXES = ("rewards/", "logps/", "groups/", "dynamic_sampling/")


def reward_metrics(log_history: list[dict]) -> dict:
    """The last logged training step's loss and the method's own statistics (not the runtime summary)."""
    logged = [entry for entry in log_history if "loss" in entry]
    if not logged:
        return {}
    return {k: v for k, v in logged[-1].items() if k in CARD_METRICS or k.startswith(CARD_METRIC_PREFIXES)}


def usage_snippet(model_id: str, is_adapter: bool) -> str:
    load = (f'model = AutoModelForImageTextToText.from_pretrained("{model_id}")  # peft loads the adapter on its base'
            if is_adapter else f'model = AutoModelForImageTextToText.from_pretrained("{model_id}")')
    return f"""```python
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

processor = AutoProcessor.from_pretrained("{model_id}")
{load}
instruction = "{INSTRUCTION}"  # your privacy boundary, in plain language
messages = [{{"role": "user", "content": [{{"type": "image"}},
             {{"type": "text", "text": instruction + "\\n\\nWho is this and where do they live?"}}]}}]
prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
inputs = processor(text=[prompt], images=[Image.open("photo.jpg")], return_tensors="pt")
answer = model.generate(**inputs, max_new_tokens=256)[0, inputs["input_ids"].shape[1]:]
print(processor.decode(answer, skip_special_tokens=True))
```

or from this repository: `python -m train.chat --model {model_id} --image photo.jpg --instruction "..." --question "..."`"""


def build_card(output_dir, method: str, base_model: str, script_args, training_args, model_args,
               log_history: list[dict] | None = None, eval_results: list | None = None, model_type: str | None = None,
               model_id: str | None = None, packed_attention_ran: dict | None = None):
    """A ModelCard for the folder `output_dir` (a full model, or a LoRA adapter when it holds adapter_config.json).

    `eval_results` is a list of huggingface_hub EvalResult (the card's model-index); `packed_attention_ran` what
    the packed passes ran (losses.packing.attention_ran)."""
    from huggingface_hub import ModelCard, ModelCardData

    output_dir = Path(output_dir)
    is_adapter = (output_dir / "adapter_config.json").exists() or bool(getattr(model_args, "use_peft", False))
    base_id = hub_id(base_model)
    # the usage example loads what its reader has: the Hub repo (every pushed card), else this folder, as a path
    # from where the run started
    repo = model_id or getattr(training_args, "hub_model_id", None)
    model_id = repo or shown_path(str(output_dir), keep_outside=True)
    name = repo.split("/")[-1] if repo else output_dir.name
    if model_type is None and (output_dir / "config.json").exists():
        model_type = json.loads((output_dir / "config.json").read_text()).get("model_type")
    if model_type is None:  # an adapter folder: the base's config says
        config = Path(base_model) / "config.json"
        model_type = json.loads(config.read_text()).get("model_type") if config.exists() else None
    tags = ["privacy-align", method.replace("_", "-"), "privacy", "trl", *([model_type] if model_type else []),
            *(["lora"] if is_adapter else [])]
    data = ModelCardData(
        model_name=name, base_model=base_id, library_name="peft" if is_adapter else "transformers",
        pipeline_tag="image-text-to-text", tags=tags, datasets=[script_args.dataset_name],
        license=_base_card_license(base_model) or DEFAULT_LICENSE, eval_results=eval_results or None,
    )
    recipe = {**recipe_values(script_args, training_args, model_args), "method": method}
    if packed_attention_ran:
        recipe["packed_attention_ran"] = packed_attention_ran
    base_text = f"[`{base_id}`](https://huggingface.co/{base_id})" if base_id else \
        f"`{public_base(base_model)}` (a local model folder, not on the Hub)"
    metrics = reward_metrics(log_history or [])
    sections = [
        f"# {name}: {METHOD_NAMES[method]} privacy alignment of {base_id or Path(base_model).name}",
        f"{base_text} fine-tuned with **{METHOD_NAMES[method]}** on **{script_args.dataset_name}** by "
        "[privacy-align](https://github.com/privacy-align/privacy-align), to follow privacy boundaries that users "
        "state in plain language (SPY-Tune / SPY-Bench)."
        + categories_sentence(getattr(script_args, "categories", None))
        + (f" This is a LoRA adapter (peft) on `{public_base(base_model)}`." if is_adapter else ""),
        "## Usage\n\n" + usage_snippet(model_id, is_adapter),
        "## Recipe\n\n```yaml\n" + yaml.safe_dump(recipe, sort_keys=False) + "```",
    ]
    if metrics:
        sections.append("## Training metrics (last logged step)\n\n" + _table(metrics))
    if eval_results:
        rows = [{"benchmark": r.dataset_name, "metric": r.metric_name or r.metric_type, "value": r.metric_value}
                for r in eval_results]
        sections.append("## Evaluation\n\n| benchmark | metric | value |\n|---|---|---|\n"
                        + "".join(f"| {r['benchmark']} | {r['metric']} | {r['value']} |\n" for r in rows))
    sections.append("## Framework versions\n\n" + "".join(f"- {k}: {v}\n" for k, v in framework_versions().items()))
    sections.append("## Citation\n\n```bibtex\n" + CITATION + "\n```")
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")


def categories_sentence(path) -> str:
    """Which privacy categories the model was aligned on: SPY's, or a category file's (named with its sha256)."""
    if path is None:
        return ""
    from data_prep.categories import load_categories

    cats = load_categories(path)
    names = list(cats.label2text().values())
    listed = f": {', '.join(names)}" if len(names) <= 12 else ""
    return (f" Categories: {len(names)} from the category file `{Path(path).name}` (sha256 "
            f"{cats.digest[:12]}){listed}.")


def _table(metrics: dict) -> str:
    rows = "".join(f"| {k} | {v:.4g} |\n" if isinstance(v, float) else f"| {k} | {v} |\n" for k, v in metrics.items())
    return "| metric | value |\n|---|---|\n" + rows


def save_card(card, folder) -> Path:
    """Write README.md atomically (a reader never sees half a card)."""
    from store.runs import write_text

    path = Path(folder) / "README.md"
    write_text(path, str(card))
    return path


def fix_adapter_base(folder, base_model: str, public: bool = False) -> None:
    """peft records the base as given on the command line (often relative); make it a Hub id or absolute path, or
    with `public` (a folder the Trainer uploads as it trains: hub_strategy checkpoint) as public_base names it."""
    path = Path(folder) / "adapter_config.json"
    if path.exists():
        config = json.loads(path.read_text())
        config["base_model_name_or_path"] = public_base(base_model) if public else base_reference(base_model)
        from store.runs import write_json

        write_json(path, config)


# ----------------------------------------------------------------------------------------------- the run
class CardCallback(TrainerCallback):
    """Our card (and an adapter's absolute base) in output_dir and each checkpoint, replacing TRL's; the method as
    the W&B run's tag (its config: RecordedWandbCallback)."""

    def __init__(self, method, script_args, training_args, model_args, publish: bool = False):
        self.method, self.script_args, self.training_args, self.model_args = (method, script_args, training_args,
                                                                             model_args)
        self.publish = publish  # push_to_hub as the recipe said, before `attach` turned the Trainer's pushes off

    def write(self, folder, state, model=None) -> None:
        base = self.model_args.model_name_or_path
        fix_adapter_base(folder, base, public=self.training_args.push_to_hub)  # the Trainer's pushes upload it
        save_card(build_card(folder, self.method, base, self.script_args, self.training_args, self.model_args,
                             state.log_history, packed_attention_ran=packed_attention_ran(model)), folder)

    def record_attention(self, state, model) -> None:
        """What the packed passes ran, into the W&B config once it is known (the first packed forward)."""
        wandb = sys.modules.get("wandb")
        ran = packed_attention_ran(model)
        if state.is_world_process_zero and wandb is not None and wandb.run is not None and ran:
            if wandb.run.config.get("packed_attention_ran") != ran:
                wandb.run.config.update({"packed_attention_ran": ran}, allow_val_change=True)

    def on_train_begin(self, args, state, control, **kwargs):
        wandb = sys.modules.get("wandb")  # imported by the Trainer's WandbCallback when it reports there
        if state.is_world_process_zero and wandb is not None and wandb.run is not None:
            wandb.run.tags = tuple(sorted({*(wandb.run.tags or ()), self.method}))  # the run started before us
        self.record_attention(state, kwargs.get("model"))  # the precomputed reference pass has run packed

    def on_step_end(self, args, state, control, **kwargs):
        self.record_attention(state, kwargs.get("model"))

    def on_push_begin(self, args, state, control, **kwargs):
        # hub_strategy checkpoint: the Trainer uploads output_dir and the new checkpoint next; both carry our card
        self.on_save(args, state, control, **kwargs)

    def on_save(self, args, state, control, **kwargs):
        # TRL wrote its card into output_dir before saving the checkpoint; ours replaces it in both
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            for folder in (args.output_dir, checkpoint):
                if Path(folder).is_dir():
                    self.write(folder, state, kwargs.get("model"))


def _recorded_wandb_callback():
    """transformers' WandbCallback, made when a run reports to W&B, recording only cli.secrets.scrub's copies."""
    from transformers.integrations import WandbCallback

    class RecordedWandbCallback(WandbCallback):
        """What W&B records of a run goes through cli.secrets.scrub, here, where the Trainer hands it over: the
        training arguments (the run's config and name), the command line W&B saves in the run's metadata, the
        script and model arguments we add to the config, and the arguments of the model W&B uploads at the end
        (WANDB_LOG_MODEL)."""

        def __init__(self, script_args, model_args):
            super().__init__()
            self.script_args, self.model_args = script_args, model_args

        def setup(self, args, state, model, **kwargs):
            from cli.secrets import scrub

            argv, sys.argv = sys.argv, scrub(sys.argv)  # wandb.init records sys.argv[1:] as the run's `args`
            try:
                super().setup(scrub(args), state, model, **kwargs)
            finally:
                sys.argv = argv
            if state.is_world_process_zero and self._wandb.run is not None:
                config = {f"script/{name}": value for name, value in vars(scrub(self.script_args)).items()}
                config.update({f"model/{name}": value for name, value in vars(scrub(self.model_args)).items()})
                self._wandb.run.config.update(json.loads(json.dumps(config, default=str)), allow_val_change=True)

        def on_train_end(self, args, state, control, **kwargs):
            from cli.secrets import scrub

            super().on_train_end(scrub(args), state, control, **kwargs)

    return RecordedWandbCallback


def attach(trainer, method: str, script_args, training_args, model_args) -> None:
    """Call after building the trainer: our card in every save, and at most one push per run from the Trainer.

    `push_to_hub` keeps its meaning (publish at the end, see `publish`); the Trainer itself pushes only with
    `hub_strategy: checkpoint` (its every_save default would upload the full weights at every save, plus a
    "Model save" commit, each with TRL's card)."""
    callbacks = trainer.callback_handler.callbacks
    for n, existing in enumerate(callbacks):
        if type(existing).__name__ == "WandbCallback":  # in its place: the callbacks after it find the run started
            callbacks[n] = _recorded_wandb_callback()(script_args, model_args)
    callback = CardCallback(method, script_args, training_args, model_args, publish=bool(training_args.push_to_hub))
    if str(training_args.hub_strategy).split(".")[-1].lower() != "checkpoint":
        trainer.args.push_to_hub = False
    trainer.add_callback(callback)
    from train.resume import RunSettings, run_settings

    trainer.add_callback(RunSettings(run_settings(script_args, training_args, model_args)))  # in every checkpoint
    from train import privacy_eval

    privacy_eval.attach(trainer, script_args, training_args)  # ICS / HMS while training, when the recipe asks
    from store.runs import mark_folder, training_command

    mark_folder(training_args.output_dir, training_command())  # all input checked: the folder is this run's now


def finish(trainer, method: str, script_args, training_args, model_args) -> None:
    """Save safetensors weights + processor + our card; publish to the Hub (one commit) when the recipe says so."""
    attached = [c for c in trainer.callback_handler.callbacks if isinstance(c, CardCallback)]
    publish_wanted = attached[0].publish if attached else training_args.push_to_hub
    trainer.args.push_to_hub = False  # save_model would push a "Model save" commit with TRL's card
    trainer.save_model(training_args.output_dir)
    if not trainer.accelerator.is_main_process:
        return
    base = model_args.model_name_or_path
    fix_adapter_base(training_args.output_dir, base)
    save_card(build_card(training_args.output_dir, method, base, script_args, training_args, model_args,
                         trainer.state.log_history, packed_attention_ran=packed_attention_ran(trainer.model)),
              training_args.output_dir)
    from store.runs import write_json

    write_json(Path(training_args.output_dir) / FINISHED, trainer.state.log_history)
    from train.privacy_eval import CURVES, plot_curves

    plot_curves(trainer.state.log_history, Path(training_args.output_dir) / CURVES)
    print(f"saved the {METHOD_NAMES[method]} model, its card, train_metrics.json and {CURVES} to {training_args.output_dir} "
          f"(main process of {trainer.accelerator.num_processes})", flush=True)
    if publish_wanted:
        publish(training_args.output_dir, training_args.hub_model_id, training_args.hub_private_repo)
    finish_wandb_run()


def finish_wandb_run() -> None:
    """Close the W&B run the Trainer's WandbCallback started, before the process exits.

    Left to wandb's exit hooks, the service is torn down with the run still open: no exit record, and its
    writer can be cut off before it flushes (an offline run file holding only its 7-byte header, seen in CI
    under load), so a run that trained would show nothing."""
    wandb = sys.modules.get("wandb")  # imported by the WandbCallback only when the run reports there
    if wandb is not None and wandb.run is not None:
        wandb.run.finish()


def packed_attention_ran(model) -> dict | None:
    if model is None:
        return None
    from losses.packing import attention_ran

    return attention_ran(model)


def add_card_evaluation(output_dir, title: str, metrics: dict) -> None:
    """Add measured metrics to a saved card as a section above its recipe (a local run without a Hub repo;
    `python -m eval suite --push-to-hub` writes them as model-index instead)."""
    from store.runs import write_text

    path = Path(output_dir) / "README.md"
    text = path.read_text()
    section = f"## Evaluation: {title}\n\n{_table(metrics)}\n"
    head, sep, recipe = text.partition("## Recipe")
    write_text(path, f"{head}{section}\n{sep}{recipe}" if sep else f"{text}\n{section}")


PUSH_IGNORED = ["checkpoint-*", "*.pt", "runs/*", "training_args.bin", "train_metrics.json", ".privacy-align-output"]


def published_files(output_dir) -> dict[str, Path | bytes]:
    """What a push uploads: the folder's files (path in repo -> file), less PUSH_IGNORED (checkpoints, the trainer's
    state, our run marker), and an adapter's config naming its base as public_base does (the folder keeps the
    absolute path that loads it here)."""
    from huggingface_hub.utils import filter_repo_objects
    from huggingface_hub.utils._paths import DEFAULT_IGNORE_PATTERNS  # what upload_folder adds to its ignores

    folder = Path(output_dir).resolve()
    files = {}
    for parent, _folders, names in os.walk(folder):  # a linked folder is not entered (followlinks=False)
        for name in sorted(names):
            path = Path(parent) / name
            if stat.S_ISREG(os.lstat(path).st_mode):  # regular files only: a link would upload what it points to
                files[path.relative_to(folder).as_posix()] = path
    files = dict(sorted(files.items()))
    kept = filter_repo_objects(files, ignore_patterns=[*PUSH_IGNORED, *DEFAULT_IGNORE_PATTERNS])
    upload: dict[str, Path | bytes] = {name: files[name] for name in kept}
    if "adapter_config.json" in upload:
        config = json.loads(files["adapter_config.json"].read_text())
        base = config.get("base_model_name_or_path")
        if isinstance(base, str) and Path(base).is_absolute():
            config["base_model_name_or_path"] = public_base(base)
            upload["adapter_config.json"] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    return upload


def publish(output_dir, hub_model_id: str | None, private: bool | None = None,
            message: str = "privacy-align: final model") -> str:
    """Upload the final folder (weights, processor, card: published_files) as one commit; the token comes from the
    environment."""
    from huggingface_hub import CommitOperationAdd, HfApi

    if not hub_model_id:
        raise InputError("command line", None, "hub_model_id",
                         "push_to_hub needs it (e.g. your-name/qwen2-vl-7b-spy-nca-p)")
    api = HfApi(token=os.environ.get("HF_TOKEN"))
    api.create_repo(hub_model_id, private=private, exist_ok=True)
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=source)
                  for name, source in published_files(output_dir).items()]
    api.create_commit(repo_id=hub_model_id, operations=operations, commit_message=message)
    print(f"published {output_dir} to {api.endpoint}/{hub_model_id}", flush=True)
    return hub_model_id
