"""`python -m eval <benchmark> <step> ...`: one command line for every benchmark.

Each benchmark's command line lives beside its code and is imported only when asked for, so that
`python -m eval geo metrics` never pays for importing torch.
"""

from __future__ import annotations

import importlib
import sys

from cli import log
from cli.entry import run_main

# benchmark -> module exposing `main(argv: list[str]) -> int`
COMMANDS = {
    "spy": "eval.spy.cli",
    "general": "eval.general.cli",
    "composite": "eval.general.composite",
    "geo": "eval.geoprivacy.cli",
    "spatialtrust": "eval.spatialtrust.cli",
    "suite": "eval.suite",
    "compare": "eval.compare",
    "view": "eval.view",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        asked = bool(argv) and argv[0] in ("-h", "--help")  # asked for: on stdout; a wrong command: on stderr
        print(f"usage: python -m eval {{{','.join(COMMANDS)}}} ...  (`python -m eval BENCHMARK --help` says more)",
              file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    def command():
        log.setup()  # inside the wrapper: a bad PRIVACY_ALIGN_VERBOSITY is one line
        return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])

    return run_main(command)


if __name__ == "__main__":
    sys.exit(main())
