"""MkDocs hook: the CLI reference and the recipe keys, generated at build time from the parsers themselves.

Every command's parser is caught the moment its `main` asks it to parse (so nothing is built by hand and a new
option, step or benchmark shows up by itself), and its help is argparse's own `format_help()`, at a fixed width,
which is what `--help` prints. tests/test_docs.py checks the page against real `--help` runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import re
import runpy
import sys
import warnings
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WIDTH = "100"  # COLUMNS for argparse's formatter; the test runs --help with the same width
MARKERS = {"<!-- generated: cli -->": "cli_markdown", "<!-- generated: recipe-keys -->": "recipe_keys_markdown"}
TRL_SCRIPTS = ("sft", "dpo", "nca_p")  # train/*.py run as scripts (accelerate launch train/X.py RECIPE)


class _Caught(Exception):
    def __init__(self, parser):
        self.parser = parser


@contextmanager
def _width():
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = old


def _main_modules(package: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / package).glob("*.py")
                  if re.search(r'^if __name__ == "__main__":', p.read_text(), re.MULTILINE))


def commands() -> list[tuple[str, list[str], object]]:
    """(command as typed, argv, how to run it) for every command line of the project."""
    from eval.__main__ import COMMANDS

    found = [(f"python -m eval {name}", [name], ("eval", name)) for name in COMMANDS]
    for package in ("data_prep", "train", "study", "launch"):
        for stem in _main_modules(package):
            if package == "train" and stem in TRL_SCRIPTS or package == "launch":
                found.append((f"{package}/{stem}.py", [], ("path", str(ROOT / package / f"{stem}.py"))))
            elif stem == "__main__":  # the package itself: python -m study
                found.append((f"python -m {package}", [], ("module", package)))
            else:
                found.append((f"python -m {package}.{stem}", [], ("module", f"{package}.{stem}")))
    return found


def run_command(how, argv: list[str]) -> None:
    """Run a command line in this process as `python ...` would (sys.argv as the interpreter sets it)."""
    kind, target = how
    saved = sys.argv
    try:
        if kind == "eval":
            from eval.__main__ import main

            sys.argv = [str(ROOT / "eval" / "__main__.py"), target, *argv]
            main([target, *argv])
        elif kind == "module":
            sys.argv = ["-m", *argv]
            with warnings.catch_warnings():  # runpy warns when the module was imported before; `python -m` does not
                warnings.simplefilter("ignore", RuntimeWarning)
                runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *argv]
            runpy.run_path(target, run_name="__main__")
    finally:
        sys.argv = saved


def parser_of(how) -> argparse.ArgumentParser:
    """The parser a command builds, caught when it first parses (before it does any work)."""
    def catch(self, *args, **kwargs):
        raise _Caught(self)

    original = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = catch
    try:
        run_command(how, [])
    except _Caught as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original
    raise RuntimeError(f"{how}: no argument parser was used")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


def _argparse_help(parser: argparse.ArgumentParser) -> bool:
    """Whether format_help() is what `--help` prints: not for a formatter that edits the options as it formats them
    (accelerate launch's hides options by the command line in sys.argv, and does it once)."""
    return parser.formatter_class.add_argument is argparse.HelpFormatter.add_argument


def _printed_help(how) -> str:
    """What `--help` prints, the command run as `python ... --help`."""
    out = io.StringIO()
    with redirect_stdout(out):
        try:
            run_command(how, ["--help"])
        except SystemExit:
            pass
    return out.getvalue()


def help_texts() -> dict[str, str]:
    """Command as typed (e.g. `python -m eval spy generate`) -> its --help text, every step included."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    texts = {}
    with _width():
        for command, _, how in commands():
            parser = parser_of(how)
            texts[command] = parser.format_help() if _argparse_help(parser) else _printed_help(how)
            for name, sub in subparsers(parser).items():
                texts[f"{command} {name}"] = sub.format_help()
    return texts


def command_help(argv: list[str]) -> str:
    """What `privacy-align ARGV` prints (cli/command.py's own usage lines, not argparse's)."""
    from cli.command import main

    out = io.StringIO()
    with redirect_stdout(out):
        main(argv)
    return out.getvalue()


def command_markdown() -> list[str]:
    """`privacy-align`, the console script: its usage, `train`'s, and what each subcommand runs (whose --help is
    that command's own, below)."""
    from cli.command import DATA, LOSS_TYPE, MODULES, PROG, TRAIN

    out = [f"## `{PROG}`", "", "The one command the package installs (`.venv/bin/privacy-align`); each subcommand runs "
           "the command line named beside it, with the same options and exit statuses.", "",
           "```text", command_help(["--help"]).rstrip("\n"), "```", "", f"### `{PROG} train`", "",
           "```text", command_help(["train", "--help"]).rstrip("\n"), "```", "",
           "| command | runs | its options: the section |", "|---|---|---|"]
    for method, script in TRAIN.items():
        section = f"train/{script}.py" if script in TRL_SCRIPTS else f"python -m train.{script}"
        out.append(f"| `{PROG} train {method}` | `train/{script}.py`"
                   + (" (`loss_type` set by the method)" if method in LOSS_TYPE else "") + f" | `{section}` |")
    for name, (module, first, _) in MODULES.items():
        runs = " ".join([f"python -m {module}", *first])
        out.append(f"| `{PROG} {name}` | `{runs}` | `{runs}`{' (one section per benchmark)' if not first and module == 'eval' else ''} |")
    for kind, module in DATA.items():
        out.append(f"| `{PROG} data {kind}` | `python -m {module}` | `python -m {module}` |")
    return out + [""]


def cli_markdown() -> str:
    out = command_markdown()
    for command, text in help_texts().items():
        level = "###" if command.count(" ") > (3 if command.startswith("python -m eval") else 2) else "##"
        out += [f"{level} `{command}`", "", "```text", text.rstrip("\n"), "```", ""]
    return "\n".join(out)


def recipe_keys_markdown() -> str:
    """Per training script: its dataclasses, and the fields this project adds (TRL's own are in the CLI reference)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    types = {stem: parser_of(("path", str(ROOT / "train" / f"{stem}.py"))).dataclass_types for stem in TRL_SCRIPTS}
    out = []
    for stem, classes in types.items():
        names = ", ".join(f"`{cls.__module__}.{cls.__name__}`" for cls in classes)
        out += [f"### `train/{stem}.py`", "", f"Dataclasses, in order: {names}.", ""]
    out += ["### Keys this project defines", ""]
    ours = dict.fromkeys(cls for classes in types.values() for cls in classes
                         if cls.__module__.split(".")[0] in ("train", "losses", "data_prep"))
    for cls in ours:
        inherited = set().union(*(getattr(base, "__dataclass_fields__", {}) for base in cls.__mro__[1:]))
        own = [f for f in dataclasses.fields(cls) if f.name not in inherited or f.name in cls.__dict__]
        out += [f"#### `{cls.__module__}.{cls.__name__}`", "", "| key | default | what |", "|---|---|---|"]
        for f in own:
            if f.default is not dataclasses.MISSING:
                default = f"`{f.default!r}`"
            else:
                default = "required" if f.default_factory is dataclasses.MISSING else f"`{f.default_factory()!r}`"
            text = " ".join(str(f.metadata.get("help", "")).split()).replace("|", "\\|")
            out.append(f"| `{f.name}` | {default} | {text} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    for marker, function in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, globals()[function]())
    return markdown
