"""The docs site (docs/, mkdocs.yml): the generated CLI reference is what `--help` prints, the getting-started page's
commands are the ones the tests run, and every heading of the old one-page README has a page in the site.
(`make docs` builds the site strictly: broken links, missing pages and unresolved API references fail there.)"""

import argparse
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# The headings of the README before the docs site (979 lines), and the page each one lives on now.
OLD_HEADINGS = {
    "privacy-align": "index.md",
    "Install": "getting-started.md",
    "The demo": "getting-started.md",
    "The miniature study": "study.md",
    "Logging": "development.md",
    "Tests": "development.md",
    "Training": "training/index.md",
    "Data": "training/data.md",
    "Your own categories": "categories.md",
    "The four methods on 8 GPUs": "training/recipes.md",
    "Model families": "training/families.md",
    "NCA-P": "training/methods.md",
    "Training efficiency": "training/efficiency.md",
    "Scaling out": "training/scaling.md",
    "Evaluation": "evaluation/index.md",
    "The evaluation suite": "evaluation/suite.md",
    "SPY-Bench": "evaluation/spy-bench.md",
    "General capability: MMMU (val), OCRBench, MME and the SPY composite score": "evaluation/general.md",
    "VLM-GeoPrivacy (location disclosure under contextual integrity)": "evaluation/geoprivacy.md",
    "SpatialTrust and SpatialTrustGuard": "evaluation/spatialtrust.md",
    "Repository layout": "development.md",
    "Citation": "citation.md",
}
# Pages other issues write; until they merge, a placeholder holds the old README's text on the topic.
OWNED_ELSEWHERE = {"study.md", "evaluation/vllm.md", "evaluation/viewer.md", "training/packing.md",
                   "reliability/inputs.md", "reliability/runtime.md"}


def nav_pages(node=None) -> set[str]:
    if node is None:
        node = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    if isinstance(node, str):
        return {node}
    items = node.values() if isinstance(node, dict) else node
    return set().union(*(nav_pages(item) for item in items))


@pytest.fixture(scope="module")
def hook():
    import logging

    from cli.log import PACKAGES

    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # the commands run here set up our loggers (eval's main does); leave them as the other tests found them
    loggers = [logging.getLogger(name) for name in PACKAGES]
    saved = [(lg.level, list(lg.handlers), lg.propagate) for lg in loggers]
    yield module
    for lg, (level, handlers, propagate) in zip(loggers, saved):
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate = propagate


@pytest.fixture(scope="module")
def generated(hook):
    return hook.help_texts()


def help_of(hook, how, argv) -> str:
    """What `<command> [argv] --help` prints, run in this process as the interpreter would run it."""
    out = io.StringIO()
    with hook._width(), redirect_stdout(out), pytest.raises(SystemExit) as exit:
        hook.run_command(how, [*argv, "--help"])
    assert exit.value.code in (0, None)
    return out.getvalue()


def test_cli_reference_is_what_help_prints(hook, generated):
    commands = hook.commands()
    typed = [command for command, _, _ in commands]
    from eval.__main__ import COMMANDS

    # every benchmark of `python -m eval`, every data_prep / train module with a command line, the launcher
    assert {f"python -m eval {name}" for name in COMMANDS} <= set(typed)
    for package in ("data_prep", "train", "study"):
        for path in (ROOT / package).glob("*.py"):
            if re.search(r'^if __name__ == "__main__":', path.read_text(), re.MULTILINE):  # not one in a docstring
                module = package if path.stem == "__main__" else f"{package}.{path.stem}"
                assert f"python -m {module}" in typed or f"{package}/{path.name}" in typed, path
    assert {"train/sft.py", "train/dpo.py", "train/nca_p.py", "launch/slurm.py", "python -m eval spy generate",
            "python -m data_prep.spy_tune validate", "python -m data_prep.generate"} <= set(generated)

    page = hook.on_page_markdown((DOCS / "reference" / "cli.md").read_text(), None, None, None)
    checked = 0
    for command, _, how in commands:
        steps = [name for name in generated if name.startswith(command + " ")]
        for name in [command, *steps]:
            text = help_of(hook, how, name[len(command):].split())
            assert text == generated[name], name
            assert f"`{name}`\n\n```text\n{text.rstrip()}\n```" in page, name
            checked += 1
    assert checked == len(generated)


def test_cli_reference_lists_the_command_and_each_subcommand(hook):
    """docs/reference/cli.md opens with `privacy-align`: its --help and `train --help` as the installed script
    prints them, and a row for every subcommand naming the command line it runs (which has its own section)."""
    from cli.command import DATA, MODULES, TRAIN

    script = Path(sys.executable).parent / "privacy-align"
    page = hook.on_page_markdown((DOCS / "reference" / "cli.md").read_text(), None, None, None)
    for argv in (["--help"], ["train", "--help"]):
        printed = subprocess.run([str(script), *argv], capture_output=True, text=True, timeout=120)
        assert printed.returncode == 0 and printed.stdout.strip() in page, argv
    rows = [line for line in page.splitlines() if line.startswith("| `privacy-align ")]
    expected = [f"train {m}" for m in TRAIN] + list(MODULES) + [f"data {k}" for k in DATA]
    assert [row.split("`")[1].removeprefix("privacy-align ") for row in rows] == expected
    for row in rows:
        section = row.split("|")[3].strip().split("`")[1]
        assert f"## `{section}" in page, row  # its section (`python -m eval`: one per benchmark)


def test_in_process_help_equals_a_real_interpreter(generated):
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT)}
    for command in ("python -m data_prep.synthetic", "python -m eval compare", "python -m eval spy judge"):
        argv = [sys.executable, *command.split()[1:], "--help"]
        result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        assert result.returncode == 0 and result.stdout == generated[command], command + result.stderr[-2000:]


def test_recipe_keys_page_lists_every_field_the_project_defines(hook):
    from dataclasses import fields

    from losses.nca_p_trainer import NCAPConfig
    from losses.vision_dpo_trainer import VisionDPOConfig
    from train.common import SpyTuneArguments

    page = hook.on_page_markdown((DOCS / "reference" / "recipe-keys.md").read_text(), None, None, None)
    for name in [f.name for f in fields(SpyTuneArguments)] + ["shared_vision", "packed_attention", "beta"]:
        assert f"| `{name}` |" in page, name
    assert all(cls.__name__ in page for cls in (SpyTuneArguments, VisionDPOConfig, NCAPConfig))


def page_commands(page: str) -> list[list[str]]:
    """The command lines of a page's ```bash blocks (continuations joined, comments dropped)."""
    text = (DOCS / page).read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.replace("<any>", "ANY"), comments=True)
            if words:
                commands.append(words)
    return commands


def resolve(words: list[str]) -> tuple[str, list[str]]:
    """(command as the CLI reference names it, its arguments) of a shell command line."""
    if words[0] == ".venv/bin/privacy-align":  # cli/command.py: the module or script each subcommand runs
        from cli.command import DATA, MODULES, TRAIN

        if words[1] == "train":
            return f"train/{TRAIN[words[2]]}.py", words[3:]
        if words[1] == "data":
            module, args = DATA[words[2]], words[3:]
        else:
            module, first, _ = MODULES[words[1]]
            args = [*first, *words[2:]]
        if module == "eval":
            return f"python -m eval {args[0]}", args[1:]
        return f"python -m {module}", args
    if words[:2] in (["accelerate", "launch"], [".venv/bin/python", "launch/run.py"]):  # launch/run.py: accelerate's
        config = words[words.index("--config_file") + 1]
        assert (ROOT / config).exists(), config
        words = words[next(i for i, w in enumerate(words) if w.endswith(".py")):]
        return words[0], words[1:]
    if words[0].endswith("python"):
        assert words[1] == "-m", words
        if words[2] == "eval":
            return f"python -m eval {words[3]}", words[4:]
        return f"python -m {words[2]}", words[3:]
    raise AssertionError(f"unexpected command: {words}")


@pytest.mark.parametrize("page", ["../README.md", "getting-started.md", "training/lora.md", "evaluation/backends.md"])
def test_every_command_shown_parses_with_its_real_parser(hook, page):
    by_name = {command: how for command, _, how in hook.commands()}
    seen = 0
    for words in page_commands(page):
        if words[0] in ("make", "pip"):  # set-up lines, not command lines of ours
            continue
        command, args = resolve(words)
        if command == "python -m eval view" and command not in by_name:  # the viewer arrives with issue 27
            continue
        if command == "train/grpo.py" and command not in by_name:  # not in the CLI reference; its block runs
            continue                                                 # (tests/test_docs_run.py), parsing it
        parser = hook.parser_of(by_name[command])
        if command.startswith("train/"):  # train/X.py RECIPE [--key value ...]: the recipe is read by parse_recipe
            assert (ROOT / args[0]).exists(), args[0]
            unknown = [w for w in args[1:] if w.startswith("--") and w not in parser._option_string_actions]
            assert not unknown, (page, command, unknown)
        else:
            parser.parse_args(args)  # argparse exits (failing the test) on an unknown or missing option
        seen += 1
    assert seen >= 1


def test_getting_started_runs_what_the_demo_test_runs(monkeypatch, tmp_path):
    commands = page_commands("getting-started.md")
    assert ["make", "demo"] in commands
    # `make demo` is `python -m train.demo --out outputs/demo`, which tests/conftest.py's demo_outputs runs as
    # `make demo` (tests/test_demo.py and the docs' blocks use its outputs)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^OUT \?= outputs/demo$", makefile, re.M)
    assert re.search(r"^demo: \$\(STAMP\)\n\t\$\(OFFLINE\) \$\(PY\) -m train\.demo --out \$\(OUT\)$", makefile, re.M)
    import docs_run

    assert 'docs_run.make(clone, "demo")' in (ROOT / "tests" / "conftest.py").read_text()
    ran = []
    with monkeypatch.context() as patch:  # record the command docs_run.make runs, instead of running it
        patch.setattr(docs_run.subprocess, "run", lambda argv, **kw: ran.append(argv) or
                      subprocess.CompletedProcess(argv, 0, "", ""))
        docs_run.make(tmp_path, "demo")
    assert ran[0][:3] == ["make", "-s", "demo"] and all(w.startswith(("VENV=", "PY=")) for w in ran[0][3:])

    # the suite and compare commands are the ones the demo runs (and logs) for each stage
    demo_source = (ROOT / "train" / "demo.py").read_text()
    suite = next(w for w in commands if w[:3] == [".venv/bin/privacy-align", "eval", "suite"])
    from train.demo import suite_command

    defaults = argparse.Namespace(eval_batch_size=None, max_new_tokens=None, eval_limit=None)
    monkeypatch.chdir(ROOT)
    assert suite[3:] == suite_command(Path("outputs/demo/nca_p"), Path("outputs/demo/suite/nca_p"),
                                      Path("outputs/demo"), defaults)  # what `make demo` prints and runs
    compare = next(w for w in commands if w[:3] == [".venv/bin/privacy-align", "eval", "compare"])
    assert compare[3:] == [*(f"outputs/demo/suite/{s}" for s in ("base", "sft", "nca_p")), "--out",
                           "outputs/demo/leaderboard", "--images", "outputs/demo/synthetic-spy-tune",
                           "--spatialtrust-data", "outputs/demo/spatialtrust-synthetic/data.jsonl"]
    assert 'compare([out / "suite" / stage for stage in STAGES], out / "leaderboard"' in demo_source
    # the chat command runs on the demo's model in tests/test_docs_run.py


def test_every_old_readme_heading_has_a_page():
    nav = nav_pages()
    for heading, page in OLD_HEADINGS.items():
        assert page in nav and (DOCS / page).exists(), page
        headings = [h.lower() for h in re.findall(r"^#+ (.+)$", (DOCS / page).read_text(), re.M)]
        assert page in OWNED_ELSEWHERE or any(heading.lower() in h for h in headings), (heading, page)
    for page in OWNED_ELSEWHERE:
        assert page in nav and (DOCS / page).exists(), page
    assert (DOCS / "study.png").exists()


def links(page: Path) -> set[Path]:
    found = set()
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
        found.add((page.parent / target).resolve())
    return found


def test_the_readme_is_short_and_the_common_tasks_are_two_clicks_away():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 160
    first = links(readme)
    assert first and all(p.exists() for p in first), [p for p in first if not p.exists()]
    reachable = first | set().union(*(links(p) for p in first))
    for page in ("training/lora.md", "evaluation/backends.md", "evaluation/spy-bench.md", "categories.md"):
        assert (DOCS / page).resolve() in reachable, page
