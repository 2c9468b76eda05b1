"""The shell and Python blocks of README.md and docs/, and how tests/test_docs_run.py runs them (an idea of
mktestdocs / pytest-examples / phmdoctest, kept to what our pages need).

Every ```bash / sh / shell / console / python block is run by the test suite, or marked in its page by an HTML
comment on the line before its fence (the site does not show it):

    <!-- docs-run: needs-gpu: REASON -->   not run here: it needs a GPU (needs-network, needs-key, needs-cluster,
                                           needs-hours and needs-minutes alike); the reason is said
    <!-- docs-run: small: ARGS -->         run with ARGS appended to each of its commands: the smallest settings
                                           that take the same path (the command in the page stays as written)
    <!-- docs-run: tested-by: TESTS -->    run by the tests named (tests/FILE.py::NAME ...), e.g. `make test`
    <!-- docs-run: pending: REASON -->     run, and expected to fail until REASON is fixed (strict: once the block
                                           passes the test fails, so the marker goes)
    (no marker)                            run as written

A block runs after `make demo` in a folder of its own that looks like a fresh clone where `make demo` has run:
links to this checkout's files, `.venv` the environment running the tests, `outputs/demo` a copy of the session's
demo (tests/conftest.py's `demo_outputs`), the offline environment set, and no virtual environment active (that
environment's bin/ is not on PATH, as in a new shell): a command runs as `.venv/bin/privacy-align ...`,
`.venv/bin/python ...` or `.venv/bin/accelerate ...` as printed; a bare `python` or `accelerate` fails as it does for
a user.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = {"bash", "sh", "shell", "console", "python", "py"}
SKIPPED = ("needs-gpu", "needs-network", "needs-key", "needs-cluster", "needs-hours", "needs-minutes")
KINDS = (*SKIPPED, "small", "tested-by", "pending")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
# a marker starts its line (one quoted inside a sentence or a table is text about markers)
MARKER = re.compile(r"^[ \t]*<!--\s*docs-run:\s*(?P<kind>[\w-]+)\s*(?::(?P<text>(?:(?!-->).)*))?-->", re.S | re.M)
MARKER_BEFORE = re.compile(MARKER.pattern + r"\s*\Z", re.S | re.M)  # the marker of the block that follows it
# what a command line of a block may hold for the harness to run it word by word (anything else runs in bash)
SHELL_SYNTAX = re.compile(r"[$|;&<>*`(){}]")
# the checkout's entries a block's folder does not link: what `make demo` and the blocks write, and caches
NOT_LINKED = {".git", "outputs", "site", ".pytest_cache", "__pycache__", ".ruff_cache", ".venv"}
# Pages whose commands still start with a bare `python` (another issue rewrites them): run with the tests' interpreter
FORKED = {".venv/bin/python": [], ".venv/bin/privacy-align": ["-m", "cli.command"]}  # the same, preloaded


@dataclass
class Block:
    page: str            # relative to the repository root
    line: int            # the opening fence's line
    language: str
    code: str
    kind: str | None     # the marker's kind, None: run as written
    text: str            # the marker's reason, arguments or tests

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.kind in (None, "small", "pending")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    """The page's code blocks in the languages above, each with its marker; a marker that no such block follows, or
    of an unknown kind, is an error (a ValueError naming the page and line)."""
    text = page.read_text()
    name = str(page.relative_to(ROOT))
    found, used = [], set()
    for match in FENCE.finditer(text):
        language = match["lang"].lower()
        if language not in LANGUAGES:
            continue
        before = text[:match.start()]
        marker = MARKER_BEFORE.search(before)
        kind = text_ = None
        if marker:
            kind, text_ = marker["kind"], " ".join((marker["text"] or "").split())
            used.add(marker.start())
            if kind not in KINDS:
                raise ValueError(f"{name}:{text[:marker.start()].count(chr(10)) + 1}: unknown docs-run marker {kind!r}; "
                                 f"known: {', '.join(KINDS)}")
        code = "\n".join(line[len(match["indent"]):] for line in match["code"].splitlines())
        found.append(Block(name, text[:match.start()].count("\n") + 1, language, code, kind, text_ or ""))
    for marker in MARKER.finditer(text):
        if marker.start() not in used:
            raise ValueError(f"{name}:{text[:marker.start()].count(chr(10)) + 1}: a docs-run marker must be the "
                             "line right before a shell or Python block")
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def commands(block: Block) -> list[str]:
    """The block's command lines: continuations joined, comment-only and blank lines dropped (a console block: its
    `$ ` lines)."""
    lines = block.code.replace("\\\n", " ").splitlines()
    if block.language == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def simple(line: str) -> list[str] | None:
    """The words of a command line without shell syntax (variables, pipes, globs, loops...), else None."""
    words = shlex.split(line, comments=True)
    return None if any(SHELL_SYNTAX.search(word) for word in words) else words


def folder(target: Path, demo: Path | None) -> Path:
    """A folder that looks like this checkout after `make demo`: links to its files, `outputs/demo` a copy of
    `demo` (a block may write there; the session's demo stays as it was)."""
    target.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (target / entry.name).symlink_to(entry)
    (target / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the tests' environment, as `.venv`
    if demo is not None:
        shutil.copytree(demo, target / "outputs" / "demo", symlinks=True)
    return target


def make(clone: Path, target: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """`make TARGET` in `clone` with this interpreter, its install step marked done (a stamp newer than
    pyproject.toml and constraints.txt), as tests/test_docs_site.py runs `make docs`."""
    stamps = clone / ".test-stamps"
    stamps.mkdir(exist_ok=True)
    (stamps / ".installed").touch()
    return subprocess.run(["make", "-s", target, f"VENV={stamps}", f"PY={sys.executable}"], cwd=clone,
                          env=environment(), capture_output=True, text=True, timeout=timeout)


def environment() -> dict:
    """The tests' environment (offline, tests/conftest.py) as in a new shell: the interpreter's folder is not on PATH
    and no virtual environment is active."""
    bin_dir = os.path.dirname(sys.executable)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and os.path.realpath(p) != os.path.realpath(bin_dir)]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    return {**env, "PATH": os.pathsep.join(path)}


def run(block: Block, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the block in `cwd`: a Python block as a script; a shell block command by command when each is a plain
    command (a `python ...` one forked from tests/forked_python.py's preloaded interpreter), else as a bash script
    (`set -euo pipefail`). Stops at the first failing command and returns its result."""
    import forked_python

    env = environment()
    if block.language in ("python", "py"):
        script = cwd / "docs_block.py"
        script.write_text(block.code)
        return forked_python.run([sys.executable, str(script)], cwd=cwd, env=env, timeout=timeout)
    extra = shlex.split(block.text) if block.kind == "small" else []
    lines = commands(block)
    split = [simple(line) for line in lines]
    if None in split:
        assert not extra, f"{block.id}: `small` needs plain commands (no shell syntax) to append its arguments to"
        return subprocess.run(["bash", "-c", "set -euo pipefail\n" + block.code], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)
    result = None
    for words in split:
        words, assigned = [*words, *extra], {}
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):  # VAR=value before the command
            name, value = words.pop(0).split("=", 1)
            assigned[name] = value
        if words[0] in FORKED:
            result = forked_python.run([sys.executable, *FORKED[words[0]], *words[1:]], cwd=cwd,
                                       env={**env, **assigned}, timeout=timeout)
        else:
            result = subprocess.run(words, cwd=cwd, env={**env, **assigned}, capture_output=True, text=True,
                                    timeout=timeout)
        if result.returncode:
            break
    return result


def problems(result: subprocess.CompletedProcess) -> list[str]:
    """What makes a block's run a failure besides its exit status: a traceback, or one of our warnings
    (`warning: ...`: a documented command that runs as written runs without them)."""
    lines = (result.stdout + result.stderr).splitlines()
    return [line for line in lines if line.startswith("warning: ") or line.startswith("Traceback (most recent")]
