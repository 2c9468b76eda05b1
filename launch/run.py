"""`accelerate launch`, with our entry scripts' ending: the command users type to train.

    python launch/run.py --config_file accelerate_configs/zero2.yaml train/sft.py recipes/sft.yaml [--key value ...]

It takes exactly `accelerate launch`'s arguments (accelerate's own parser) and runs accelerate's own launcher. The
one difference is how a failed run ends. `accelerate launch` raises `subprocess.CalledProcessError` when its one
process (or DeepSpeed's multi-node launcher) exits non-zero, and Python prints that exception with the child's whole
argv: every option of the command line, a key given in `--run_name run-$WANDB_API_KEY` included, after our one-line
refusal. Through torch's launcher (several processes) it raises `ChildFailedError`, a page of traceback. Here the
child has already said what stopped it, in one line (cli/entry.py), so the launcher adds nothing and exits with
the child's own status (2: bad input, 1: the run stopped, 130: Ctrl-C) instead of accelerate's 1.

What accelerate itself prints before the child starts (its own warnings) goes through the same scrubber as our
streams (cli.secrets.guard_streams).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file


def child_status(err: BaseException) -> int | None:
    """The failed child's exit status, from the exception accelerate's launchers raise, or None for any other."""
    if isinstance(err, subprocess.CalledProcessError):
        return err.returncode
    failures = getattr(err, "failures", None)  # torch.distributed.elastic's ChildFailedError: rank -> ProcessFailure
    if isinstance(failures, dict) and failures:
        first = min(failures.values(), key=lambda f: getattr(f, "timestamp", 0))
        code = getattr(first, "exitcode", 1)
        return code if isinstance(code, int) and 0 < code < 256 else 1
    return None


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser

    from cli.log import quiet_third_party
    from cli.secrets import guard_streams

    guard_streams()  # accelerate's and torch's own lines are scrubbed like ours
    quiet_third_party()  # its notice that a CPU run uses the CPU's threads
    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    # torch's launcher logs each failed rank at ERROR before it raises: the child said it already
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        launch_command(args)
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - only a failed child's exception is answered here
        status = child_status(err)
        if status is None:
            raise
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
