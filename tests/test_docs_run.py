"""Every shell and Python block of README.md and docs/ runs as written after `make demo` (with the smallest
settings its page's marker names), or its page says why it does not run here (tests/docs_run.py: the markers).

The blocks run on the session's `make demo` (tests/conftest.py's `demo_outputs`, shared with tests/test_demo.py on
one xdist worker), each in a folder of its own that looks like a fresh clone after `make demo`."""

import re
import shlex
from pathlib import Path

import docs_run
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

try:
    BLOCKS, PROBLEM = docs_run.all_blocks(), None
except ValueError as err:  # a marker out of place: test_every_block_is_run_or_marked says which
    BLOCKS, PROBLEM = [], str(err)


def test_every_block_is_run_or_marked():
    assert PROBLEM is None, PROBLEM
    assert len(BLOCKS) >= 30 and {b.page for b in BLOCKS} >= {"README.md", "docs/getting-started.md",
                                                               "docs/training/grpo.md"}
    for block in BLOCKS:
        if block.kind in docs_run.SKIPPED or block.kind == "pending":
            assert len(block.text.split()) >= 3, f"{block.id}: say why ({block.kind}: REASON)"
        elif block.kind == "small":
            assert block.text.startswith("-") and shlex.split(block.text), f"{block.id}: small: --OPTION VALUE ..."
        elif block.kind == "tested-by":  # tests/FILE.py::NAME, or .ci/run for the make targets it runs
            named = re.findall(r"(tests/\w+\.py)::(\w+)", block.text)
            ci = re.findall(r"\bstep \S+ (make [\w.-]+)$", (ROOT / ".ci" / "run").read_text(), re.M)
            assert named or ".ci/run" in block.text, f"{block.id}: tested-by: tests/FILE.py::NAME ... or .ci/run"
            for file, name in named:
                source = (ROOT / file).read_text() if (ROOT / file).is_file() else ""
                assert re.search(rf"^def {name}\(", source, re.M), f"{block.id}: no test {file}::{name}"
            after_ci = block.text.partition(".ci/run")[2].split("tests/")[0]  # `.ci/run `make X` and `make Y``
            for command in re.findall(r"`(make [\w.-]+)`", after_ci):
                assert command in ci, f"{block.id}: .ci/run does not run {command}"
    # every `make` target a page runs exists
    targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
    for block in BLOCKS:
        for line in docs_run.commands(block):
            words = shlex.split(line, comments=True)
            if words[:1] == ["make"]:
                assert words[1] in targets, f"{block.id}: no make target {words[1]}"


def test_no_user_page_relies_on_files_outside_the_repository():
    """../shared (specs, released data) is beside the developers' checkout, not a user's clone: only the
    contributors' page may name it."""
    for page in docs_run.pages():
        if page.name != "development.md":
            text = page.read_text()
            assert not re.search(r"\.\./shared|shared/(specs|geo_data|spy_data)", text), page


def test_a_block_without_marker_runs_and_a_stray_marker_is_refused(tmp_path, monkeypatch):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("# A page\n\n```bash\npython -c 'print(1)'\n```\n\n<!-- docs-run: needs-gpu: 8 H100s for a 7B model"
                    " -->\n```bash\naccelerate launch big.py\n```\n\n```yaml\nkey: value\n```\n")
    monkeypatch.setattr(docs_run, "ROOT", tmp_path)
    found = docs_run.blocks(page)
    assert [(b.line, b.kind, b.runs) for b in found] == [(3, None, True), (8, "needs-gpu", False)]
    assert found[1].text == "8 H100s for a 7B model"
    page.write_text("<!-- docs-run: needs-gpu: why -->\n\nSome prose.\n\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match=r"docs/page.md:1: a docs-run marker must be the line right before"):
        docs_run.blocks(page)
    page.write_text("<!-- docs-run: needs-gpus: why -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="unknown docs-run marker 'needs-gpus'"):
        docs_run.blocks(page)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs], ids=lambda b: b.id)
def test_block_runs(block, demo_outputs, tmp_path):
    clone = docs_run.folder(tmp_path / "clone", demo_outputs)
    result = docs_run.run(block, clone)
    wrong = docs_run.problems(result)
    said = f"{block.id} ({block.kind or 'as written'}): exit {result.returncode}, {wrong[:3]}\n{result.args}\n" \
           f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    if block.kind == "pending":
        assert result.returncode or wrong, f"{block.id} runs now: remove its pending marker ({block.text})"
        pytest.xfail(f"{block.id}: pending: {block.text}")
    assert result.returncode == 0 and not wrong, said
