"""How every command line ends: the one wrapper around `python -m eval`, `python -m data_prep.*` and `train/*.py`.

    if __name__ == "__main__":
        run_command(main)

Whatever stops a command is said in one line on stderr, with an exit status a script can test:

    2    bad input (InputError: a file, line and field; a key the endpoint refused; a closed stdout / stderr; a
         symbolic link loop met anywhere)
    1    the run stopped (RunStopped: a NaN loss, ...) or the machine failed it (no space left, no permission)
    130  Ctrl-C: "interrupted; the same command resumes" (run files and checkpoints keep what was done)

Tracebacks are left for bugs. `ArgumentParser` is argparse's, with its errors as one such line (no usage block).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time

from cli.errors import InputError, RunStopped
from cli.paths import loop_error

RESUMES = "interrupted; the same command resumes"
LOOP = "Symlink loop from "
# What the machine, not the input, did to a write: one line each, never a traceback.
OS_FAILURES = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
               errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
               errno.EROFS: "read-only file system", errno.EIO: "input/output error",
               errno.EFBIG: "file too large (a file-size limit)",
               # a file the run read at its start is gone (an image folder removed mid-run)
               errno.ENOENT: "no such file or directory (it was there when the run was checked: was it moved?)"}


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser; a bad or missing option is InputError (one line, exit 2), not usage + message, and so is
    a value that holds a key (cli.secrets: keys come from the environment only)."""

    def parse_known_args(self, args=None, namespace=None):
        from cli.secrets import refuse_on_command_line

        refuse_on_command_line(sys.argv[1:] if args is None else list(args))
        return super().parse_known_args(args, namespace)

    def error(self, message):
        raise InputError("command line", None, None, message.removeprefix("argument "))


def _is_main_process() -> bool:
    return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))) == 0


def _say(line: str) -> None:
    """One line on stderr (stdout when stderr is closed); a stream that fails takes the line with it."""
    for stream in (sys.stderr, sys.stdout):
        if stream is None:
            continue
        try:
            print(line, file=stream, flush=True)
            return
        except (OSError, ValueError):
            continue


def _closed_stream() -> str | None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or stream.closed:
            return name
        try:
            fd = stream.fileno()
        except (OSError, ValueError):  # not a file (a test's capture): open
            continue
        try:
            os.fstat(fd)
        except OSError:
            return name
    return None


def _silence_stdout() -> None:
    """After stdout failed: what is still buffered goes nowhere, so Python's exit does not print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def run_main(main, *args, interrupted: str = RESUMES) -> int:
    """Run `main(*args)`; its return value (None: 0) or the status of what stopped it, said in one line.

    Under a multi-process launch every process holds the same results (eval/backends.py gathers them), so only the
    first one prints them: the others' stdout goes to /dev/null (their logs stay on stderr)."""
    if int(os.environ.get("RANK", "0")) == 0:
        return _run_main(main, *args, interrupted=interrupted)
    stdout = sys.stdout
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        return _run_main(main, *args, interrupted=interrupted)
    finally:
        sys.stdout.close()
        sys.stdout = stdout


def _run_main(main, *args, interrupted: str = RESUMES) -> int:
    from cli.secrets import guard_streams

    guard_streams()  # nothing printed (logs, tracebacks, this line) holds a key
    closed = _closed_stream()
    if closed:  # its messages (or its results) would be lost: refuse before any work
        _say(f"error: {closed} is closed; give the command somewhere to write it (a file, or /dev/null)")
        return 2
    try:
        from cli.log import level_from_env

        level_from_env()  # a bad PRIVACY_ALIGN_VERBOSITY: one line before any work, whichever command it is
        status = main(*args) or 0
        try:
            sys.stdout.flush()
        except OSError as err:
            _silence_stdout()
            return _failed(f"error: writing the standard output failed ({err.strerror or err})", 1)
        return status
    except InputError as err:
        return _failed(f"error: {err}", 2)
    except RunStopped as err:
        return _failed(f"error: {err}", err.status)
    except KeyboardInterrupt:
        return _failed(interrupted, 130, wait=False)
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        _silence_stdout()
        return 1
    except RuntimeError as err:  # Python 3.11's pathlib meeting a symbolic link loop anywhere (cli.paths.real)
        if not str(err).startswith(LOOP):
            raise
        return _failed(f"error: {loop_error(str(err)[len(LOOP):].strip(chr(39)))}", 2)
    except OSError as err:
        if err.errno == errno.ELOOP:  # opening a path through a symbolic link loop: bad input, one line
            return _failed(f"error: {loop_error(err.filename or 'a path')}", 2)
        if err.errno not in OS_FAILURES:
            raise
        where = f"{err.filename}: " if err.filename else ""
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            _silence_stdout()
        return _failed(f"error: {where}{OS_FAILURES[err.errno]}; what was finished is kept, and the same command "
                       "resumes once it can write", 1)


def _failed(line: str, status: int, wait: bool = True) -> int:
    # Under a multi-process launcher every process fails alike and the launcher stops the others when the first
    # one exits: the first process reports at once, any other only if it is still running a moment later.
    if not _is_main_process():
        if not wait:
            return status
        time.sleep(10)
    from cli.secrets import scrub

    _say(one_line(scrub(line)))  # no key, URL credentials or key parameter in it, whatever raised it
    return status


def one_line(text: str) -> str:
    """`text` on one line: a value it quotes that holds a line break or another control character (a carriage
    return, a newline, U+2028, ...) shows it escaped, so the error stays one line whatever the input held."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def run_command(main, *args, interrupted: str = RESUMES) -> None:
    """`sys.exit(run_main(main, *args))`: the last line of every command-line module."""
    sys.exit(run_main(main, *args, interrupted=interrupted))
