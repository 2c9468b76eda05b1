"""cli/log.py: the library's loggers print `warning: ...` / bare info to the current stderr, at the level
PRIVACY_ALIGN_VERBOSITY or a recipe's log level names, and TRL's deprecated-alias FutureWarning is filtered."""

import logging
import warnings

import pytest

from cli import log


@pytest.fixture(autouse=True)
def restore_levels():
    yield
    log.setup(logging.INFO)


def test_levels_prefixes_and_the_current_stderr(capsys, monkeypatch):
    monkeypatch.delenv("PRIVACY_ALIGN_VERBOSITY", raising=False)
    log.setup()
    log.setup()  # idempotent: one handler
    logger = logging.getLogger("store.runs")
    logger.info("wrote it")
    logger.warning("2 samples differ")
    logger.debug("hidden")
    assert capsys.readouterr().err == "wrote it\nwarning: 2 samples differ\n"
    monkeypatch.setenv("PRIVACY_ALIGN_VERBOSITY", "error")
    log.setup()
    logging.getLogger("losses.checkpointing").warning("quiet now")
    assert capsys.readouterr().err == ""
    log.setup(logging.DEBUG)  # a recipe's log_level wins over the environment
    logging.getLogger("data_prep.spy").debug("shown")
    assert capsys.readouterr().err == "shown\n"
    monkeypatch.setenv("PRIVACY_ALIGN_VERBOSITY", "chatty")
    with pytest.raises(ValueError, match="PRIVACY_ALIGN_VERBOSITY"):
        log.setup()


def test_trl_deprecated_alias_warning_is_filtered_and_others_are_not():
    log.setup(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log.quiet_third_party()
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
        warnings.warn("something else is deprecated", FutureWarning)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]


def test_the_cpu_notices_of_deepspeed_and_accelerate_launch_are_filtered_and_other_defaults_are_not():
    """Every CPU run printed DeepSpeed's "Setting accelerator to CPU" (at its import, as the Trainer does) and
    `accelerate launch`'s notice that it chose the CPU thread count: both filtered, by the real libraries' own
    loggers; a notice naming another defaulted value (here --num_processes) still prints."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import torch

    if torch.cuda.is_available():
        pytest.skip("DeepSpeed's CPU notice is printed only where no accelerator is found")
    code = """if True:
        import sys
        from cli import log
        log.quiet_third_party()
        import deepspeed
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
        print("--- cpu.yaml", file=sys.stderr, flush=True)
        _validate_launch_command(launch_command_parser().parse_args(["--config_file", "accelerate_configs/cpu.yaml", "x.py"]))
        print("--- --cpu", file=sys.stderr, flush=True)
        _validate_launch_command(launch_command_parser().parse_args(["--cpu", "x.py"]))
    """
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr[-3000:]
    before, cpu_yaml, cpu_flag = result.stderr.split("--- ")
    assert "Setting accelerator" not in result.stderr and "not passed" not in cpu_yaml, result.stderr
    assert "`--num_processes` was set to a value of" in cpu_flag, result.stderr
