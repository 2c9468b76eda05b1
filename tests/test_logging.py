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
