"""The built docs site: `make docs` fails on a broken link (strict, and nothing hides its warnings), and the site
opens from disk in Chromium with the network off, search included, with no request leaving its folder.

Both run the real `make docs` recipe on a copy of the docs (the project's code linked in, for the CLI reference and
the API pages): once as it is, once with a broken link added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("docs", "mkdocs.yml", "Makefile", "pyproject.toml", "constraints.txt")  # what a test may change
SKIPPED = {".git", ".venv", ".venv-vllm", "site", "outputs", ".whl", "__pycache__"}

pytest.importorskip("mkdocs", reason="the docs extra (pip install -e .[docs]) builds the site")
pytest.importorskip("material", reason="the docs extra (pip install -e .[docs]) builds the site")


def docs_copy(folder: Path) -> Path:
    """A checkout whose docs, mkdocs.yml and Makefile are copies; everything else links to this one."""
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in SKIPPED:
            continue
        if entry.name in COPIED:
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, folder / entry.name)
        else:
            (folder / entry.name).symlink_to(entry)
    return folder


def make_docs(checkout: Path) -> subprocess.CompletedProcess:
    """The Makefile's `docs` target, run with this interpreter; its set-up steps are marked done (stamp files
    newer than pyproject.toml), so only the build itself runs."""
    stamps = checkout / "stamps"
    stamps.mkdir(exist_ok=True)
    for name in (".installed", ".installed-docs"):
        (stamps / name).touch()
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    return subprocess.run(["make", "-s", "-C", str(checkout), "docs", f"VENV={stamps}", f"PY={sys.executable}"],
                          capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    checkout = docs_copy(tmp_path_factory.mktemp("docs") / "clean")
    proc = make_docs(checkout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (checkout / "site" / "index.html").is_file()
    return checkout / "site"


def test_make_docs_fails_on_a_broken_link(built, tmp_path):
    checkout = docs_copy(tmp_path / "broken")
    index = checkout / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [the old notes](no-such-page.md).\n")
    proc = make_docs(checkout)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said[-3000:]
    assert "no-such-page.md" in said and "strict mode" in said, said[-3000:]


def test_the_site_works_from_disk_with_the_network_off(built):
    pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
    from eval.view.browser import CHROMIUM, chromium

    if not CHROMIUM.is_file():
        pytest.skip("needs Debian's Chromium at /usr/bin/chromium")
    inside = built.resolve().as_uri() + "/"
    requests, errors = [], []
    with chromium() as context:
        context.set_offline(True)
        context.on("request", lambda r: requests.append(r.url))
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(inside + "index.html")
        page.fill("input.md-search__input", "LoRA")
        page.wait_for_selector(".md-search-result__item", timeout=20_000)
        hits = page.locator(".md-search-result__item").count()
        meta = page.inner_text(".md-search-result__meta")
        page.goto(inside + "training/lora.html")  # a page one folder down: its links and assets resolve on disk
        page.wait_for_selector("h1")
        title = page.inner_text("h1")
    assert hits >= 1 and "Initializing" not in meta, meta
    assert "LoRA" in title
    assert requests and all(url.startswith(inside) for url in requests), [u for u in requests
                                                                          if not u.startswith(inside)]
    assert not errors, errors
