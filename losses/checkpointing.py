"""Resuming full fine-tuning from a Trainer checkpoint of a model whose weights are saved in Hub format.

transformers 5 saves Qwen2-VL under the Hub key names (`model.embed_tokens...`, `visual...`) and converts them
back in `from_pretrained`, but `Trainer._load_from_checkpoint` (5.24) loads the file with a plain
`load_state_dict(strict=False)`: every renamed key is skipped and training silently restarts from the base
weights. Loading the checkpoint through `from_pretrained`, which applies the conversion, fixes that.
DeepSpeed and PEFT checkpoints take other paths and are left to the Trainer.

Saving: safetensors 0.8 writes its files with mode 0600, so colleagues sharing a machine could not read a trained
model or its checkpoints; every saved folder's weight files get the permissions of any new file (0666 less umask).
The Trainer pickles its arguments into every saved folder (`torch.save(self.args)`: training_args.bin, which a push
uploads); it pickles cli.secrets.scrub's copy of them instead (no credential field, no secret, URLs without
userinfo, query or fragment), the one place that file is written.

The mixin is also where every training run logs its arguments once and says whether it resumes (all our trainers
use it); it sets our loggers' level by the recipe's `log_level` / `log_level_replica` (cli/log.py).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path

from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from cli import log
from cli.errors import InputError, new_file_mode, read_json
from losses.finite import FiniteTrainingMixin

logger = logging.getLogger(__name__)


def non_default_arguments(args) -> dict:
    """The fields of a config dataclass that differ from their defaults, as JSON-able values."""
    changed = {}
    for f in dataclasses.fields(args):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = getattr(args, f.name)
        if f.init and not f.name.startswith("_") and "token" not in f.name and value != default:
            changed[f.name] = json.loads(json.dumps(value, default=str))
    return changed


def require_extras(training_args) -> None:
    """A recipe that reports to W&B needs the `wandb` extra; say so before the Trainer's own RuntimeError."""
    if training_args is not None and "wandb" in (training_args.report_to or []) and importlib.util.find_spec("wandb") is None:
        raise InputError("training arguments", None, "report_to",
                         "wandb is not installed: pip install -c constraints.txt -e \".[wandb]\", or report_to: none")


def is_complete_checkpoint(folder) -> bool:
    """The Trainer writes trainer_state.json last (after weights, optimizer, scheduler and RNG states): a checkpoint
    whose state file is missing or torn was cut short by a kill, and resuming from it would crash or mislead."""
    try:
        # transformers writes NaN where a gradient norm was not finite: a complete state all the same
        return isinstance(read_json(Path(folder) / "trainer_state.json", finite=False), dict)
    except InputError:
        return False


def _checkpoints(output_dir) -> list[Path]:
    """checkpoint-N folders of output_dir, newest (highest N) first."""
    folder = Path(output_dir)
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name.split("-", 1)[1].isdigit()] \
        if folder.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.split("-", 1)[1]), reverse=True)


def last_complete_checkpoint(output_dir) -> str | None:
    """The newest complete checkpoint (`resume_from_checkpoint: true`), skipping any a kill left half-written."""
    return next((str(p) for p in _checkpoints(output_dir) if is_complete_checkpoint(p)), None)


def remove_incomplete_checkpoints(output_dir) -> None:
    """Half-written checkpoints go before training (main process): else the Trainer's rotation (save_total_limit,
    by step number) could keep one of them and delete the complete checkpoint just written."""
    import shutil

    for path in _checkpoints(output_dir):
        if not is_complete_checkpoint(path):
            logger.warning(f"removing {path}: a run was stopped while writing it (no complete trainer_state.json)")
            shutil.rmtree(path, ignore_errors=True)


class HubFormatResumeMixin(FiniteTrainingMixin):
    def __init__(self, *args, **kwargs):
        require_extras(kwargs.get("args"))
        log.quiet_third_party()  # before the Trainer's __init__, which may already run the reference pass (precompute)
        super().__init__(*args, **kwargs)
        # TRL's convention (get_process_log_level); an unset `log_level` on the main process keeps our default (info)
        passive = self.args.should_log and self.args.log_level == "passive"
        log.setup(None if passive else self.args.get_process_log_level())
        if self.args.should_log:
            logger.info("%s on %s, arguments that differ from the defaults: %s", type(self).__name__,
                        getattr(self.model.config, "_name_or_path", "?"), json.dumps(non_default_arguments(self.args)))

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        checkpoint = last_complete_checkpoint(self.args.output_dir) if resume_from_checkpoint is True \
            else resume_from_checkpoint
        if self.args.should_log and not (resume_from_checkpoint is True and checkpoint is None):  # the Trainer raises
            logger.info(f"resuming from {checkpoint}" if checkpoint else f"training from the start into {self.args.output_dir}")
        if self.args.should_save:
            remove_incomplete_checkpoints(self.args.output_dir)
        return super().train(checkpoint or resume_from_checkpoint, *args, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        model = self.model if model is None else model
        full_weights = any(os.path.isfile(os.path.join(resume_from_checkpoint, name))
                           for name in (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME))
        if not full_weights or self.is_fsdp_enabled or hasattr(model, "peft_config"):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        loaded = type(model).from_pretrained(resume_from_checkpoint, dtype=model.dtype)
        model.load_state_dict(loaded.state_dict(), strict=True)
        del loaded

    def _save(self, output_dir=None, state_dict=None):
        with _recorded_arguments(self):
            super()._save(output_dir, state_dict)
        folder = Path(output_dir or self.args.output_dir)
        if self.args.should_save and folder.is_dir():
            for path in folder.glob("*.safetensors"):
                os.chmod(path, new_file_mode())

    def _save_checkpoint(self, model, trial):
        with guarded_save(self.args.output_dir, self.args.should_save):
            return super()._save_checkpoint(model, trial)

    def save_model(self, output_dir=None, _internal_call=False):
        with guarded_save(output_dir or self.args.output_dir, self.args.should_save):
            return super().save_model(output_dir, _internal_call)

    def _push_from_checkpoint(self, checkpoint_folder):
        with _recorded_arguments(self):  # it pickles the arguments into output_dir again
            return super()._push_from_checkpoint(checkpoint_folder)


@contextmanager
def _recorded_arguments(trainer):
    """While the Trainer writes a saved folder, `trainer.args` is cli.secrets.scrub's copy, which is what
    `torch.save(self.args)` pickles into training_args.bin; the run's own arguments are back afterwards."""
    from cli.secrets import scrub

    args = trainer.args
    trainer.args = scrub(args)
    try:
        yield
    finally:
        trainer.args = args


def check_run_tree(output_dir) -> None:
    """Before transformers writes into a run's output folder: nothing below it is a symbolic link (a link planted at
    `config.json` or `checkpoint-1` would take the save, the whole checkpoint, wherever it points) or a file with
    another name elsewhere (a hard link, written through by a save in place), and the folder is
    still this run's: its marker names this training script (store.runs.MARKER), the rule every output folder
    follows, never a name pattern. InputError, one line, naming the entry."""
    import stat

    from store.runs import MARKER, _marker, training_command

    folder = Path(output_dir)
    if not folder.is_dir():
        return
    owner = _marker(folder).get("command")  # None: a trainer our entry scripts did not start (a library use)
    if owner is not None and owner != training_command():
        raise InputError(folder, None, None, f"is no longer this run's output folder (its {MARKER} names "
                         f"{owner or 'no command'}); the save is refused so that no file of another is overwritten")
    for parent, folders, names in os.walk(folder):  # followlinks=False: a link is seen, never entered
        for name in [*folders, *names]:
            path = Path(parent) / name
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                raise InputError(path, None, None, "is a symbolic link in the run's output folder; the save is "
                                 "refused (it would write where the link points): remove it and resume")
            # a hard link: a save that rewrites the file in place (open "w") would change the other name's file too;
            # every file a save makes is new, with one name
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                raise InputError(path, None, None, f"is a hard link ({info.st_nlink} names) in the run's output "
                                 "folder; the save is refused (it would write into the other name's file too): "
                                 "remove it and resume")


@contextmanager
def guarded_save(output_dir, should_save: bool = True):
    """Around each of transformers' saves (the Trainer's checkpoint, the final save_model): the folder is checked
    first (check_run_tree); a fault while writing is one line naming the folder and the cause. safetensors reports
    a full disk or a file-size limit as SafetensorError, which is no OSError: it becomes the OSError it wraps,
    which cli/entry.py says in one line (no space left, file too large). A checkpoint cut short has no
    trainer_state.json and is never resumed from (is_complete_checkpoint)."""
    import errno
    import re

    from safetensors import SafetensorError

    if should_save:
        check_run_tree(output_dir)
    try:
        yield
    except SafetensorError as err:
        code = re.search(r"code: (\d+)", str(err))
        number = int(code[1]) if code else errno.EIO
        raise OSError(number, os.strerror(number), str(output_dir)) from None
