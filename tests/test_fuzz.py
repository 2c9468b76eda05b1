"""Issue 46 item 5 (the scrubber's and the number table's share): Hypothesis looks for the next case.

* `test_hostile_values_in_any_recipe_field`: for each trainer (sft, dpo, nca, nca_p, grpo), a few fields of its
  configs (any of them, drawn from the dataclasses) set to hostile values (null, booleans, huge and non-finite
  numbers, odd text, lists, mappings, the key), in the recipe or on the command line. Property: the run stops with
  exit 2 and one line, or reaches the model load; never a traceback; the key in no line printed and no file; no file
  changed in the run's folder, the data's or the model's.
* `test_a_secret_in_any_string_field_or_url_part_is_refused`: a secret placed in a string field (any of them) and in
  any URL part the class covers: the known key (as it is, inside text, percent-encoded), an unknown one as URL
  userinfo, as a key-named parameter of any spelling and separator, as the query or fragment of a URL value.
  Property: exit 2 with one line, neither secret printed, nothing written.
* `test_scrub_keeps_every_placed_secret_out`: the same placements through cli.secrets.scrub, as text, inside JSON,
  in a config dataclass: neither secret's bytes survive (scrub is what every writer calls).

The runs stop before the model loads (its loader is replaced by one that raises `Validated`), so an example costs
what the checks cost. Seeded (`derandomize`) and bounded so `make test` stays in budget; a release runs many more:

    PRIVACY_ALIGN_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -q -n 4 tests/test_fuzz.py

(random seeds then, and Hypothesis prints the seed and the example of any failure).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import string
import sys
import tempfile
import typing
from pathlib import Path
from unittest import mock
from urllib.parse import quote

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hardening_runtime import in_process, without_progress
from trl import ModelConfig, SFTConfig

from cli import secrets
from losses.grpo_trainer import VisionGRPOConfig
from losses.nca_p_trainer import NCAPConfig
from losses.vision_dpo_trainer import VisionDPOConfig
from train import dpo, grpo, nca_p, sft
from train.common import SpyTuneArguments
from train.ranges import _parts, fields_of

ROOT = Path(__file__).resolve().parents[1]
RELEASE = int(os.environ.get("PRIVACY_ALIGN_FUZZ_EXAMPLES", "0"))
K = "Kfz9-the-judge-key-31d4"  # OPENAI_API_KEY's value during these tests


def bounded(examples: int):
    """CI: `examples` examples, the same ones every run (derandomize); a release run: PRIVACY_ALIGN_FUZZ_EXAMPLES
    random ones."""
    return settings(max_examples=RELEASE or examples, derandomize=not RELEASE, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=bool(RELEASE))


TRAINERS = {"sft": (SFTConfig, sft, "sft"), "dpo": (VisionDPOConfig, dpo, "dpo"), "nca": (VisionDPOConfig, dpo, "nca"),
            "nca_p": (NCAPConfig, nca_p, "nca_p"), "grpo": (VisionGRPOConfig, grpo, "grpo")}
OUTPUTS = {"output_dir", "logging_dir", "judge_cache"}  # where a run writes: kept relative, inside the example


def fields(method) -> list[str]:
    return sorted(fields_of(SpyTuneArguments, TRAINERS[method][0], ModelConfig))


def string_fields(method) -> list[str]:
    hints = {}
    for config in (SpyTuneArguments, TRAINERS[method][0], ModelConfig):
        hints.update({k: v for k, v in typing.get_type_hints(config).items() if k not in hints})
    return [name for name in fields(method) if any(
        p is str or (typing.get_origin(p) is list and str in typing.get_args(p)) for p in _parts(hints[name]))]


class Validated(Exception):
    """The run passed every check and would load the model now."""


@pytest.fixture(scope="module")
def small_data(tmp_path_factory, synthetic_dir):
    """Three SPY-Tune items and their images (each example reads them)."""
    folder = tmp_path_factory.mktemp("fuzz-data")
    items = json.loads((synthetic_dir / "train_data.json").read_text())["data_list"][:3]
    for item in items:
        image = folder / item["question_item"]["image_path"]
        image.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(synthetic_dir / item["question_item"]["image_path"], image)
    (folder / "train_data.json").write_text(json.dumps({"data_list": items}))
    return folder


def files_of(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def run_example(method, recipe_values: dict, argv: list[str], data: Path, model: Path):
    """The trainer's main in this process, in a fresh folder, on the demo recipe with `recipe_values` over it and
    `argv` after it; the model loader raises Validated. Returns (result, folder, files before, files after)."""
    _, module, recipe_name = TRAINERS[method]
    recipe = yaml.safe_load((ROOT / "recipes" / "demo" / f"{recipe_name}.yaml").read_text())
    recipe.update({"model_name_or_path": str(model), "train_data_path": str(data / "train_data.json"),
                   "image_folder": str(data), "output_dir": "out", "per_device_train_batch_size": 2,
                   **({"num_generations": 2} if method == "grpo" else {})})
    recipe.update(recipe_values)
    folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe, allow_unicode=True))
    before = files_of(folder)

    def loaded(*args, **kwargs):
        raise Validated

    cwd = os.getcwd()
    try:
        with mock.patch.dict(os.environ, {"OPENAI_API_KEY": K}), mock.patch.object(module, "load_model_and_processor",
                                                                                   loaded), \
                mock.patch.object(sys, "argv", ["train/x.py", str(folder / "recipe.yaml"), *argv]):
            os.chdir(folder)
            try:
                result = without_progress(in_process(module.main))
            except Validated:
                result = None
    finally:
        os.chdir(cwd)
        from store import locks

        locks._release_all()  # an in-process run keeps its locks until the process ends
    after = files_of(folder)
    shutil.rmtree(folder, ignore_errors=True)
    return result, before, after


def assert_property(result, before, after, *secret_values):
    """Exit 2 with one line (or the model load reached: result None); no traceback; no secret printed or in a
    file; nothing written."""
    if result is not None:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), \
            f"exit {result.returncode}: {result.stderr[-2000:]}"
        for value in secret_values:
            assert value not in result.stdout + result.stderr, f"a secret was printed: {lines[0]}"
    assert after == before, f"files changed: {sorted(set(after) ^ set(before))}"
    for value in secret_values:  # (the recipe is the user's input: it may hold what the fuzz put there)
        assert not [name for name, data in after.items() if value.encode() in data and name != "recipe.yaml"]


SPECIAL_TEXT = ["", " ", "null", "None", "nan", "inf", "-inf", "1e999", "-1", "0", "1.5", str(10**29), "true", "no",
                "~", "[]", "{}", "a: b", "\t", "é", "\u202e", "x" * 300, "%s", "{0}", "${HOME}", "*", "a\nb", K,
                f"run-{K}", "http://u:p@127.0.0.1:9/v1", "http://127.0.0.1:9/v1?key=v", "-", "--output_dir",
                "/dev/zero", "/proc/self/environ", "/nonexistent/file.json", "out", "."]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                    st.text(max_size=12), st.sampled_from(SPECIAL_TEXT))
HOSTILE = st.one_of(SCALARS, st.lists(st.one_of(st.integers(-9, 2**40), st.floats(), st.text(max_size=6)),
                                      max_size=3),
                    st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=6), st.integers(), max_size=2))


DEFAULTS = {method: {f.name: f.default for config in (SpyTuneArguments, cls, ModelConfig)
                     for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING}
            for method, (cls, _, _) in TRAINERS.items()}


@functools.cache
def options(method) -> dict:
    """The trainer's parser actions by field: what a plausible value of each looks like."""
    from trl import TrlParser

    return {a.dest: a for a in TrlParser((SpyTuneArguments, TRAINERS[method][0], ModelConfig))._actions}


def plausible(method, name):
    """Values a user might really give a field: one of its choices, a flag, a number near its default (so that
    examples also get past the refusals, into the checks that follow them)."""
    action = options(method).get(name)
    if action is None:
        return st.nothing()
    if action.choices:
        return st.sampled_from(sorted(action.choices, key=str))
    default = DEFAULTS[method].get(name, action.default)
    if isinstance(default, bool) or getattr(action.type, "__name__", "") == "string_to_bool":
        return st.booleans()
    if isinstance(default, int):
        return st.integers(0, max(2 * default, 4))
    if isinstance(default, float):
        return st.floats(0, max(2 * default, 1.0))
    return st.sampled_from([default, "out3"]) if isinstance(default, str) else st.just(default)


def contained(value) -> bool:
    """Whether a value used as an output path stays inside the example's folder."""
    return not (isinstance(value, str) and (value.startswith(("/", "~")) or ".." in value or "\\" in value))


def as_argument(name, value) -> list[str]:
    if isinstance(value, list):
        return [f"--{name}", *map(str, value)] if value else [f"--{name}"]
    if isinstance(value, dict):
        return [f"--{name}", json.dumps(value)]
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return [f"--{name}={text}"] if text.startswith("-") else [f"--{name}", text]


@pytest.mark.parametrize("method", TRAINERS)
def test_hostile_values_in_any_recipe_field(method, small_data, tiny_model_dir):
    names = fields(method) + ["env"]

    @st.composite
    def change(draw):
        name = draw(st.sampled_from(names))
        # a usual value first (Hypothesis starts from the first branch), hostile ones as often: examples that pass
        # the refusals go on into the checks after them
        value = draw(st.one_of(plausible(method, name), HOSTILE) if name != "env" else HOSTILE)
        return name, value, draw(st.booleans())

    @bounded(30)
    @given(st.lists(change(), min_size=1, max_size=3, unique_by=lambda t: t[0]))
    def check(changes):
        recipe_values, argv = {}, []
        for name, value, on_command_line in changes:
            if name in OUTPUTS and not contained(value):
                value = "out2"
            if on_command_line and name != "env":
                argv += as_argument(name, value)
            else:
                recipe_values[name] = value
        result, before, after = run_example(method, recipe_values, argv, small_data, tiny_model_dir)
        assert_property(result, before, after, K)

    inputs = files_of(small_data), files_of(tiny_model_dir)
    check()
    assert (files_of(small_data), files_of(tiny_model_dir)) == inputs  # the data and the model: never written


SECRET_ALPHABET = string.ascii_letters + string.digits
KEY_NAMES = ["key", "api_key", "api-key", "x-api-key", "X-Goog-Api-Key", "access_key", "access_token", "client_secret",
             "password", "passwd", "secret", "token", "auth", "k%65y", "%6Bey", "apiKey", "sig"]


@st.composite
def placed_secret(draw, names):
    """(field, value, the secrets in it, how it was placed): a secret where the class says none passes."""
    name = draw(st.sampled_from(names))
    unknown = "S" + draw(st.text(SECRET_ALPHABET, min_size=10, max_size=14))
    prefix = draw(st.text(string.ascii_letters + "-_./:", max_size=6))
    suffix = draw(st.text(string.ascii_letters + "-_./", max_size=6))
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "Https", "s3", "ftp"]))
    host = draw(st.sampled_from(["127.0.0.1:9", "judge.example", "[::1]:8000", "h"]))
    kind = draw(st.sampled_from(["known", "known-encoded", "userinfo", "key-parameter", "url-query", "url-fragment"]))
    if kind == "known":
        return name, f"{prefix}{K}{suffix}", (K,), kind
    if kind == "known-encoded":
        encoded = "".join(quote(c, safe="") if c.isalnum() and draw(st.booleans()) else c for c in K)
        return name, f"{prefix}{encoded}{suffix}", (K,), kind
    if kind == "userinfo":
        user = draw(st.sampled_from(["u", "user", "", "a.b"]))
        url = f"{scheme}://{user}{':' if user else ''}{unknown}@{host}/v1{suffix}"
        return name, draw(st.sampled_from([url, f"{prefix} {url}", f"see {url} ok"])), (unknown,), kind
    if kind == "key-parameter":
        key = "".join(c.upper() if draw(st.booleans()) else c for c in draw(st.sampled_from(KEY_NAMES)))
        separator = draw(st.sampled_from("?&;#"))
        return name, f"{scheme}://{host}/v1{separator}{key}={unknown}", (unknown,), kind
    if kind == "url-query":
        parameter = draw(st.text(string.ascii_lowercase, min_size=1, max_size=6))
        return name, f"{scheme}://{host}/v1?{parameter}={unknown}", (unknown,), kind
    return name, f"{scheme}://{host}/v1#{unknown}", (unknown,), kind


@pytest.mark.parametrize("method", TRAINERS)
def test_a_secret_in_any_string_field_or_url_part_is_refused(method, small_data, tiny_model_dir):
    names = string_fields(method)

    @bounded(12)
    @given(placed_secret(names), st.booleans())
    def check(placement, on_command_line):
        name, value, placed, _ = placement
        recipe_values, argv = ({}, [f"--{name}={value}"]) if on_command_line else ({name: value}, [])
        result, before, after = run_example(method, recipe_values, argv, small_data, tiny_model_dir)
        assert result is not None, f"{name}={value!r} passed every check"
        assert_property(result, before, after, K, *placed)

    check()


@bounded(150)
@given(placed_secret(string_fields("grpo")))
def test_scrub_keeps_every_placed_secret_out(placement):
    name, value, placed, kind = placement
    with mock.patch.dict(os.environ, {"OPENAI_API_KEY": K}):
        config = VisionGRPOConfig(output_dir="o", use_cpu=True, bf16=False, report_to="none", num_generations=2,
                                  per_device_train_batch_size=2)
        object.__setattr__(config, name, value)
        # a URL's query or fragment goes where the URL is a value (whole, or quoted in JSON or a repr); inside free
        # text only credentials (userinfo, key-named parameters, known keys) are taken out
        free_text = [] if kind in ("url-query", "url-fragment") else [f"error: {name}: {value}"]
        for recorded in (secrets.scrub(value), json.dumps(secrets.scrub({name: value})),
                         secrets.scrub(json.dumps({name: value}, ensure_ascii=False)),
                         *map(secrets.scrub, free_text), repr(vars(secrets.scrub(config)))):
            for secret in placed:
                assert secret not in recorded and quote(secret, safe="") not in recorded, recorded
