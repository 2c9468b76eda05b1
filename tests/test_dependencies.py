"""pyproject.toml's ranges, constraints.txt's tested set and the Makefile's install line agree, and every core
dependency is used by the code."""

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CORE = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {extra: [Requirement(r) for r in reqs] for extra, reqs in PROJECT["optional-dependencies"].items()}
LOCKED = {canonicalize_name(name): version for name, version in
          re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)}
SOURCES = "\n".join(p.read_text() for d in ("train", "study", "losses", "data_prep", "eval", "cli", "store", "vlm") for p in (ROOT / d).rglob("*.py"))
IMPORT_NAMES = {"pillow": "PIL", "pyyaml": "yaml"}
# used without an import of its own: the reason must still be in the code
INDIRECT = {"peft": "get_peft_config"}


@pytest.mark.parametrize("req", CORE + [r for reqs in EXTRAS.values() for r in reqs], ids=str)
def test_every_dependency_is_a_range_from_the_tested_version_below_the_next_major(req):
    lower = [s for s in req.specifier if s.operator == ">="]
    upper = [s for s in req.specifier if s.operator == "<"]
    assert len(req.specifier) == 2 and lower and upper, f"{req}: want >=tested,<next major"
    tested = Version(lower[0].version)
    assert LOCKED[canonicalize_name(req.name)] == lower[0].version, f"{req}: constraints.txt pins another version"
    assert Version(upper[0].version) == Version(str(tested.major + 1)), f"{req}: upper bound is not the next major"


@pytest.mark.parametrize("req", CORE, ids=lambda r: r.name)
def test_every_core_dependency_is_used(req):
    name = canonicalize_name(req.name)
    if name in INDIRECT:
        assert INDIRECT[name] in SOURCES
        return
    module = IMPORT_NAMES.get(name, name.replace("-", "_"))
    assert re.search(rf"^\s*(import|from) {module}\b", SOURCES, re.M), f"{req.name} is listed but never imported"


def test_unused_packages_are_not_listed_and_optional_ones_are_extras():
    names = {canonicalize_name(r.name) for r in CORE}
    assert not names & {"qwen-vl-utils", "safetensors", "wandb", "deepspeed"}
    assert [r.name for r in EXTRAS["wandb"]] == ["wandb"] and [r.name for r in EXTRAS["deepspeed"]] == ["deepspeed"]


def test_make_installs_the_locked_set():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r'pip install -q -c constraints\.txt -e "\.\[dev,deepspeed,wandb\]"', makefile)
    assert re.search(r"^\$\(STAMP\): pyproject\.toml constraints\.txt$", makefile, re.M)


def test_this_environment_is_the_locked_set():
    """The environment the suite runs in (make's .venv) has constraints.txt's versions of what we list."""
    for req in CORE + EXTRAS["dev"]:
        assert metadata.version(req.name) == LOCKED[canonicalize_name(req.name)], req.name


def test_a_wandb_recipe_without_wandb_says_which_extra(monkeypatch):
    from types import SimpleNamespace

    from cli.errors import InputError
    from losses.checkpointing import require_extras

    require_extras(SimpleNamespace(report_to=["wandb"]))  # installed here (make installs the extra)
    monkeypatch.setitem(sys.modules, "wandb", None)  # what a core-only install looks like to find_spec
    with pytest.raises(InputError, match=r'report_to: wandb is not installed: pip install -c constraints.txt -e "\.\[wandb\]"'):
        require_extras(SimpleNamespace(report_to=["wandb"]))
    require_extras(SimpleNamespace(report_to=[]))


def test_the_ground_floor_imports_neither_eval_nor_train():
    """data_prep, losses and the rooms below them sit below eval and train (docs/development.md, Repository layout):
    the data generator shares the run files and the chat client with eval by importing them from store and vlm,
    never the other way round."""
    import ast

    for folder in ("data_prep", "losses", "cli", "store", "vlm"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                for name in names:
                    assert name.split(".")[0] not in ("eval", "train"), f"{path}: imports {name}"


# docs/development.md, "The rooms and what each may import": each package and the packages of ours it may import
MAY_IMPORT = {
    "cli": set(),
    "store": {"cli"},
    "vlm": {"cli"},
    "data_prep": {"cli", "store", "vlm"},
    "losses": {"cli", "store", "vlm", "data_prep"},
    "eval": {"cli", "store", "vlm", "data_prep"},
    "train": {"cli", "store", "vlm", "data_prep", "losses", "eval"},
    "study": {"cli", "store", "vlm", "data_prep", "losses", "eval", "train"},
    "launch": {"cli"},
}


def test_the_development_page_states_these_rooms():
    """docs/development.md's table of the rooms says the same as MAY_IMPORT: one row per package, its imports."""
    page = (ROOT / "docs" / "development.md").read_text()
    table = page.split("### The rooms and what each may import", 1)[1].split("\n\n")[1:3]
    rows = [line.split("|")[1:-1] for line in "\n".join(table).splitlines() if line.startswith("| `")]
    stated = {}
    for package, _holds, imports in rows:
        stated[package.strip().strip("`/")] = set(re.findall(r"`([a-z_]+)`", imports))
    assert stated.pop("benchmarks") == set()  # "anything"
    assert stated == MAY_IMPORT


def test_every_package_imports_only_the_rooms_below_it():
    """No circle between packages and no import running back up, lazy imports and imports in strings of code
    included (a room that runs `python -c "import X"` or names a module to import_module depends on X too)."""
    import ast

    ours = set(MAY_IMPORT) | {"benchmarks"}
    assert {p.parent.name for p in ROOT.glob("*/__init__.py")} <= ours, "a package missing from MAY_IMPORT"
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            names = {alias.name for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Import)
                     for alias in node.names}
            names |= {node.module for node in ast.walk(ast.parse(text))
                      if isinstance(node, ast.ImportFrom) and node.module and not node.level}
            names |= set(re.findall(r"\b(?:from|import)\s+([a-z_]+)[.\s]", text))
            names |= set(re.findall(r"import_module\(\s*[\"']([a-z_]+)", text))
            for name in names:
                top = name.split(".")[0]
                if top in ours and top != package and top not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)}: imports {name}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_wheel_builds_without_setuptools_warnings_and_holds_every_asset(tmp_path):
    """pyproject.toml lists the assets folders as packages: setuptools printed a 40-line "Package would be ignored"
    warning for each (about 160 lines in every install, `make docs` included), and the wheel holds each asset."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(root),
                             "-w", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Package would be ignored" not in result.stdout + result.stderr
    names = set(zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist())
    assets = {p.relative_to(root).as_posix() for folder in ("data_prep", "train", "eval") for p in
              (root / folder).glob("**/assets/*") if p.is_file()}
    assert assets and assets <= names, sorted(assets - names)
