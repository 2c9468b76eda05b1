"""Resuming a training run: only from a complete checkpoint, and only under the settings and data it was trained with.

Every checkpoint records the run's settings (every argument that changes what is trained, and the sha256 of each
data file) inside its trainer_state.json, through the `RunSettings` callback (a TrainerCallback with the Trainer's
ExportableState), so they are written in the same file, at the same moment, as the marker of a complete checkpoint
(losses/checkpointing.py). `check_resume` runs with the other option checks, before the data or the model load:

* `--resume_from_checkpoint true` takes the newest complete checkpoint (one a kill cut short is skipped, and
  removed when training starts); a named checkpoint that is not complete is refused;
* a resume whose settings or data differ from the checkpoint's is refused, naming every setting that differs
  (each with both values), unless `--resume_with_new_settings true` says it is meant.

The same digests, beside the model: every run writes `training_data.json` into its output folder when training starts
(the sha256 of each data file, no paths), and a run whose base model (`model_name_or_path`) is such a folder is
refused when its `train_data_path` holds other data than that model was trained on, unless `--base_with_other_data
true` says it is meant: a chained recipe (the demo's GRPO from its SFT) never trains on a stale copy by mistake.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from cli.errors import InputError, read_json
from losses.checkpointing import is_complete_checkpoint, last_complete_checkpoint

# Arguments that do not change what is trained: where and how often it is written, logged, evaluated or published.
IGNORED = {"output_dir", "run_name", "resume_from_checkpoint", "resume_with_new_settings", "base_with_other_data",
           "overwrite_output_dir",
           "report_to", "disable_tqdm", "log_level", "log_level_replica", "log_on_each_node", "dataset_name",
           "local_rank", "ddp_timeout", "per_device_eval_batch_size", "prediction_loss_only", "project",
           "greater_is_better", "metric_for_best_model", "load_best_model_at_end", "restore_callback_states_from_checkpoint"}
IGNORED_PREFIXES = ("logging_", "save_", "eval_", "hub_", "push_to_hub", "include_", "dataloader_", "trackio",
                    "do_", "torch_compile_")
KEPT = {"dataloader_drop_last"}  # under an ignored prefix, but it changes which rows are trained
# Data files: compared by content (sha256), not by path, so a moved copy of the same data resumes.
DATA_FILES = ("train_data_path", "label_path", "categories", "general_data_path")
STATE_KEY = "RunSettings"
DATA_RECORD = "training_data.json"  # in every output folder: the digests of the data the model there is trained on
FINISHED = "train_metrics.json"  # written by train/card.py when a run has trained to its end and saved its model


def _as_dict(config) -> dict:
    return config.to_dict() if hasattr(config, "to_dict") else dataclasses.asdict(config)


def _sha256(path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:  # a missing data file is reported by the data checks, with its own line
        return None
    return digest.hexdigest()


def run_settings(script_args, training_args, model_args) -> dict:
    """What a resume must keep: every argument that changes the training (as JSON values), and the data's digests.
    Taken once, when the options are checked: trainers later change some of their arguments themselves (TRL sets
    ddp_find_unused_parameters), and a checkpoint must record what the user asked for."""
    taken = getattr(training_args, "_run_settings", None)
    if taken is None:
        taken = _settings(script_args, training_args, model_args)
        object.__setattr__(training_args, "_run_settings", taken)
    return taken


def _settings(script_args, training_args, model_args) -> dict:
    from cli.secrets import scrub

    settings = {}
    for config in (script_args, training_args, model_args):  # as recorded: trainer_state.json holds them
        for name, value in _as_dict(scrub(config)).items():
            if name not in KEPT and (name in IGNORED or name.startswith(IGNORED_PREFIXES) or name in DATA_FILES
                                     or name == "eval_data_path" or "token" in name):
                continue
            settings[name] = json.loads(json.dumps(value, default=str))
    for name in DATA_FILES:
        path = getattr(script_args, name, None)
        settings[f"{name} (sha256)"] = _sha256(path) if path else None
    return settings


def recorded_settings(checkpoint) -> dict | None:
    try:
        state = read_json(Path(checkpoint) / "trainer_state.json", finite=False)  # transformers writes NaN
        return state["stateful_callbacks"][STATE_KEY]["args"]["settings"]
    except (InputError, KeyError, TypeError):
        return None


def check_resume(script_args, training_args, model_args, resume, fail) -> str | None:
    """The checkpoint a resume starts from (None: no resume); `fail(option, message)` for every refusal."""
    if resume is None:
        run_settings(script_args, training_args, model_args)  # taken now, for the checkpoints to record
        return None
    out = Path(training_args.output_dir)
    if resume is True:
        checkpoint = last_complete_checkpoint(out)
        if checkpoint is None:
            cut = " (only checkpoints a kill cut short, without trainer_state.json)" if any(out.glob("checkpoint-*")) else ""
            fail("resume_from_checkpoint", f"no complete checkpoint-* folder in {out} to resume from{cut}")
    else:
        checkpoint = str(resume)
        if not Path(checkpoint).is_dir():
            fail("resume_from_checkpoint", f"checkpoint folder not found: {checkpoint}")
        if not is_complete_checkpoint(checkpoint):
            fail("resume_from_checkpoint", f"{checkpoint} is not a complete checkpoint (no readable trainer_state.json: "
                                           "a kill cut it short); name an earlier one, or pass true for the newest")
    now = run_settings(script_args, training_args, model_args)
    if script_args.resume_with_new_settings:
        return checkpoint
    consent = ("pass --resume_with_new_settings true to resume with the new value, or drop --resume_from_checkpoint "
               "to start over")
    before = recorded_settings(checkpoint)
    if before is None:
        fail("resume_from_checkpoint", f"{checkpoint} holds no record of the settings it was trained with; {consent}")
    differ = [name for name in sorted(set(before) | set(now)) if before.get(name) != now.get(name)
              and not (name in KEPT and name not in before)]  # a checkpoint recorded before KEPT was kept
    if not differ:
        return checkpoint
    if len(differ) == 1:  # one setting: its name is the field, its two values the message
        name = differ[0]
        if name.endswith("(sha256)"):
            fail(name.split(" ")[0], f"the file changed since {checkpoint} was trained (another sha256); {consent}")
        fail(name, f"{checkpoint} was trained with {before.get(name)!r}, not {now.get(name)!r}; {consent}")
    changes = [f"{name.split(' ')[0]}: the file changed" if name.endswith("(sha256)")
               else f"{name} {before.get(name)!r}, not {now.get(name)!r}" for name in differ]
    fail(", ".join(name.split(" ")[0] for name in differ),
         f"{checkpoint} was trained with other settings ({'; '.join(changes)}); {consent}")
    return checkpoint


def check_finished(script_args, training_args, resume, fail) -> None:
    """A folder that holds a finished run is never trained over silently (a re-run recipe would replace the model
    there): refused, naming the folder and the two ways on, unless `--overwrite_output_dir true` says it is meant
    (a resume goes on from that run's checkpoint, as asked)."""
    out = Path(training_args.output_dir)
    if resume is None and not script_args.overwrite_output_dir and (out / FINISHED).is_file():
        fail("output_dir", f"{out} holds a finished run ({FINISHED}); name another --output_dir, or pass "
                           "--overwrite_output_dir true to train it again from the start")


def data_record(settings: dict) -> dict:
    """What `training_data.json` holds: the data files' digests of the run's settings (never a path)."""
    return {name: value for name, value in settings.items() if name.endswith("(sha256)")}


def check_base_data(script_args, model_args, fail) -> None:
    """A base model this project trained (a folder with training_data.json) goes on training on its own data only,
    unless base_with_other_data says otherwise; a Hub model or a folder without the record is not checked."""
    record = Path(model_args.model_name_or_path) / DATA_RECORD
    if script_args.base_with_other_data or not record.is_file():
        return
    recorded = read_json(record)
    trained_on = recorded.get("train_data_path (sha256)") if isinstance(recorded, dict) else None
    now = _sha256(script_args.train_data_path)  # None: a missing file, which the data checks report
    if now is not None and trained_on is not None and now != trained_on:
        fail("train_data_path", f"{script_args.train_data_path} is not the data {model_args.model_name_or_path} was "
                                f"trained on (another sha256 than its {DATA_RECORD}); give that model's data, or "
                                "--base_with_other_data true to train it on other data")


class RunSettings(TrainerCallback, ExportableState):
    """The run's settings, saved by the Trainer in every checkpoint's trainer_state.json."""

    def __init__(self, settings: dict):
        self.settings = settings

    def state(self) -> dict:
        return {"args": {"settings": self.settings}, "attributes": {}}

    def on_train_begin(self, args, state, control, **kwargs):
        # a consented resume from a checkpoint that lacks the record: the Trainer's save expects the entry
        state.stateful_callbacks.setdefault(STATE_KEY, self.state())
        if isinstance(state.stateful_callbacks[STATE_KEY], dict):
            state.stateful_callbacks[STATE_KEY] = self.state()  # the settings now in force
        if state.is_world_process_zero:  # all input is checked: the folder's model is trained on this data
            from store.runs import write_json

            write_json(Path(args.output_dir) / DATA_RECORD, data_record(self.settings))
