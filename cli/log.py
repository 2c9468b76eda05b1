"""Logging of the library modules (eval, train, study, losses, data_prep, cli, store, vlm), on transformers' conventions.

Each module logs to `logging.getLogger(__name__)`. `setup()` gives these packages one stderr handler, at the
level `PRIVACY_ALIGN_VERBOSITY` names (debug | info | warning | error, like `TRANSFORMERS_VERBOSITY`; default
info), or at a training recipe's `log_level` / `log_level_replica` (the trainers pass
`TrainingArguments.get_process_log_level()`, as TRL's scripts do). Warnings print as `warning: ...`, info as the
bare message. It also filters, once, the third-party warnings that every run printed (see `quiet_third_party`).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

PACKAGES = ("eval", "train", "study", "losses", "data_prep", "cli", "store", "vlm")
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
          "critical": logging.CRITICAL}


class _Stderr(logging.StreamHandler):
    """A handler on whatever `sys.stderr` is now (pytest and `contextlib.redirect_stderr` swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


class _Formatter(logging.Formatter):
    def format(self, record):
        message = super().format(record)
        return message if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {message}"


def level_from_env() -> int:
    """The level PRIVACY_ALIGN_VERBOSITY names; another value is bad input (every command checks it first)."""
    from cli.errors import InputError

    name = os.environ.get("PRIVACY_ALIGN_VERBOSITY", "info")
    if name.strip().lower() not in LEVELS:
        raise InputError("environment", None, "PRIVACY_ALIGN_VERBOSITY", f"{name!r}: use one of {', '.join(LEVELS)}")
    return LEVELS[name.strip().lower()]


def setup(level: int | None = None) -> None:
    """Our packages' loggers at `level` (default: from the environment), with one stderr handler; idempotent.
    stdout and stderr redact every secret the process knows from now on (cli.secrets)."""
    from cli import secrets

    secrets.guard_streams()
    level = level_from_env() if level is None or level < 0 else level
    for name in PACKAGES:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(isinstance(h, _Stderr) for h in logger.handlers):
            handler = _Stderr()
            handler.setFormatter(_Formatter())
            logger.addHandler(handler)
            logger.propagate = False
    quiet_third_party()


def quiet_third_party() -> None:
    """The warnings every run printed, filtered once (their causes are in the libraries, not in our calls)."""
    # TRL 1.16's `disable_gradient_checkpointing` (trl/models/utils.py, used by DPOTrainer and our reference
    # pass) reads transformers 5's deprecated `model.is_gradient_checkpointing` alias: a FutureWarning each run.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    # Two lines every CPU run printed, each saying only that the run is on the CPU (which the user chose):
    # DeepSpeed's accelerator detection, when the Trainer imports it (deepspeed/accelerator/real_accelerator.py),
    # and `accelerate launch`'s defaults notice when its one defaulted value is the CPU thread count
    # (accelerate/commands/launch.py _validate_launch_command). Any other default it reports still prints.
    logging.getLogger("DeepSpeed").addFilter(_CPU_NOTICES)
    logging.getLogger("accelerate.commands.launch").addFilter(_CPU_NOTICES)


def _not_a_cpu_notice(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    if message.startswith("Setting accelerator to CPU."):
        return False
    if message.startswith("The following values were not passed to `accelerate launch`"):
        defaulted = [line for line in message.splitlines() if line.startswith("\t")]
        return not all(line.startswith("\t`--num_cpu_threads_per_process`") for line in defaulted)
    return True


_CPU_NOTICES = _not_a_cpu_notice  # one object: addFilter adds it once however often this runs
