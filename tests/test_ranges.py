"""Issue 46 item 4: one table of every number a training run takes (train/ranges.py), derived from the config
dataclasses, checked before any dataclass is built and before anything is written; `null` only where a field can
be unset; a batch the training data cannot fill refused before the model loads. The issue's commands are cases."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hardening_checks import assert_one_line, snapshot
from test_hardening_runtime import in_process, without_progress
from trl import ModelConfig, SFTConfig

from cli.errors import InputError
from losses.grpo_trainer import VisionGRPOConfig
from losses.nca_p_trainer import NCAPConfig
from losses.vision_dpo_trainer import VisionDPOConfig
from train import dpo, grpo, nca_p, sft
from train.common import SpyTuneArguments, parse_recipe
from train.ranges import COUNTS, LARGEST, RANGES, check_values, fields_of

ROOT = Path(__file__).resolve().parents[1]
# What each entry script parses (train/*.py main): the config classes, its module and its demo recipe.
TRAINERS = {"sft": (SFTConfig, sft, "sft"), "dpo": (VisionDPOConfig, dpo, "dpo"), "nca": (VisionDPOConfig, dpo, "nca"),
            "nca_p": (NCAPConfig, nca_p, "nca_p"), "grpo": (VisionGRPOConfig, grpo, "grpo")}


def config_types(method):
    return SpyTuneArguments, TRAINERS[method][0], ModelConfig


def test_every_numeric_field_of_every_accepted_config_is_in_the_table():
    """A numeric field a new TRL (or transformers) adds to a config we accept fails here until the table names its
    range; and the table names no field that no config has."""
    numeric = {name for method in TRAINERS for name, f in fields_of(*config_types(method)).items() if f.rule}
    assert sorted(numeric - set(RANGES)) == []
    assert sorted(set(RANGES) - numeric) == []


HOSTILE = [math.nan, math.inf, -math.inf, True]
HUGE = [10**29, -10**29, 2**63, float(LARGEST) * 4]  # for whole numbers and counts (COUNTS)


@pytest.mark.parametrize("method", TRAINERS)
def test_every_numeric_field_refuses_what_no_range_holds(method):
    """Every numeric field of each trainer's configs against NaN, +-inf and a bool, and every whole number and
    count against +-10**29, 2**63 and past LARGEST: each refused, naming the field (the pure check parse_recipe
    runs on the parsed values)."""
    for name, spec in fields_of(*config_types(method)).items():
        if spec.rule is None:
            continue
        for value in HOSTILE + (HUGE if spec.rule.whole or name in COUNTS else []):
            with pytest.raises(InputError, match=rf"^where: {name}: "):
                check_values({name: [value] if spec.items else value}, config_types(method), fail)


def fail(name, message):
    raise InputError("where", None, name, message)


@pytest.mark.parametrize("method", TRAINERS)
def test_null_is_refused_exactly_where_a_field_cannot_be_unset(method):
    """`key: null` (or `--key null`) for every field of each trainer: refused where the dataclass does not type it
    Optional (or where the library divides by it), accepted where it does."""
    types = config_types(method)
    for name, spec in fields_of(*types).items():
        if spec.null:
            check_values({name: None}, types, fail, nulls={name})
        else:
            with pytest.raises(InputError, match=rf"^where: {name}: expected .*, got null"):
                check_values({name: None}, types, fail, nulls={name})
    assert not fields_of(*types)["learning_rate"].null and fields_of(*types)["max_length" if method != "grpo" else
                                                                          "max_completion_length"].null


def parse(tmp_path, monkeypatch, method, recipe_text=None, *argv):
    recipe = ROOT / "recipes" / "demo" / f"{TRAINERS[method][2]}.yaml"
    if recipe_text is not None:
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(recipe_text)
    monkeypatch.setattr(sys, "argv", ["script.py", str(recipe), *argv])
    return lambda: parse_recipe(*config_types(method))


GRPO_RECIPE = (ROOT / "recipes" / "demo" / "grpo.yaml").read_text()
NOT_OPTIONAL_GRPO = sorted(name for name, f in fields_of(*config_types("grpo")).items() if f.rule and not f.null)


def test_null_in_a_grpo_recipe_is_one_line_naming_the_recipe_and_field(tmp_path, monkeypatch):
    """The issue: `null` in a GRPO recipe was a traceback for six fields before the model loaded and a TypeError
    after it for five more. Every numeric GRPO field that cannot be unset, through the real parser: refused at
    parse time, naming the recipe and the field."""
    for name in NOT_OPTIONAL_GRPO:
        kept = "\n".join(line for line in GRPO_RECIPE.splitlines() if not line.startswith(f"{name}:"))
        with pytest.raises(InputError, match=rf"recipe\.yaml: {name}: expected a (whole )?number, got null"):
            parse(tmp_path, monkeypatch, "grpo", f"{kept}\n{name}: null\n")()
    with pytest.raises(InputError, match=r"command line: num_generations: expected a whole number, got null"):
        parse(tmp_path, monkeypatch, "grpo", None, "--num_generations", "null")()  # Optional in TRL, divided by


def in_grpo(monkeypatch, tmp_path, synthetic_dir, model, *overrides, method="grpo"):
    """An entry script's main in this process, on the synthetic data, output in tmp_path/o; the model is never
    loaded (these refusals come before it): the result, and that nothing was written."""
    _, module, recipe = TRAINERS[method]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, "load_model_and_processor", lambda *a: pytest.fail("the model was loaded"))
    monkeypatch.setattr(sys, "argv", [f"train/{module.__name__.split('.')[-1]}.py",
                                      str(ROOT / "recipes" / "demo" / f"{recipe}.yaml"),
                                      "--model_name_or_path", str(model), "--output_dir", str(tmp_path / "o"),
                                      "--train_data_path", str(synthetic_dir / "train_data.json"),
                                      "--image_folder", str(synthetic_dir), *overrides])
    before = snapshot(tmp_path)
    result = without_progress(in_process(module.main))  # the data's progress bars are no message
    from store import locks

    locks._release_all()  # a refused in-process run keeps its lock until this process ends
    assert snapshot(tmp_path) == before and not (tmp_path / "o").exists()
    return result


@pytest.mark.parametrize("overrides, method, said", [
    (("--steps_per_generation", str(10**29)), "grpo", f"steps_per_generation: must be at most {LARGEST}"),
    (("--top_entropy_quantile", "-0.5"), "grpo", "top_entropy_quantile: must be in [0, 1], got -0.5"),
    (("--sync_ref_model", "true", "--ref_model_sync_steps", "0"), "dpo", "ref_model_sync_steps: must be at least 1"),
    (("--ref_model_mixup_alpha", "1.5"), "nca_p", "ref_model_mixup_alpha: must be in [0, 1]"),
    (("--max_steps", str(2**40)), "sft", f"max_steps: must be at most {LARGEST}"),
    (("--seed", str(2**32)), "sft", "seed: must be in [0, 4294967295]"),
], ids=["steps-per-generation-1e29", "top-entropy-quantile", "ref-model-sync-steps-0", "mixup-alpha", "max-steps",
        "seed"])
def test_trl_fields_outside_the_old_table_are_one_line(overrides, method, said, tmp_path, monkeypatch,
                                                       synthetic_dir, tiny_model_dir):
    """TRL's own fields that crashed (OverflowError, ZeroDivisionError, a silent negative quantile): one line, at
    parse time, nothing written."""
    result = in_grpo(monkeypatch, tmp_path, synthetic_dir, tiny_model_dir, *overrides, method=method)
    assert_one_line(result, f"command line: {said}")


@pytest.mark.parametrize("method", TRAINERS)
def test_a_batch_larger_than_the_data_is_refused_before_the_model_loads(method, tmp_path, monkeypatch,
                                                                        synthetic_dir, tiny_model_dir):
    """`--per_device_train_batch_size 1000` on a small data set trained 0 steps (GRPO) and saved the unchanged
    model with exit 0: refused once the data is read, before the model loads, for every method."""
    extra = ("--num_generations", "2") if method == "grpo" else ()
    result = in_grpo(monkeypatch, tmp_path, synthetic_dir, tiny_model_dir, "--per_device_train_batch_size", "1000",
                     *extra, method=method)
    line = assert_one_line(result, "per_device_train_batch_size")
    assert ("it would train 0 steps" if method == "grpo" else "larger than the training data") in line


def test_a_generation_batch_larger_than_the_data_names_generation_batch_size(tmp_path, monkeypatch, synthetic_dir,
                                                                           tiny_model_dir):
    result = in_grpo(monkeypatch, tmp_path, synthetic_dir, tiny_model_dir, "--generation_batch_size", "4000",
                     "--num_generations", "2", "--per_device_train_batch_size", "2")
    assert_one_line(result, "command line: generation_batch_size: a generation batch takes 2000 prompts")


def test_settings_the_data_can_fill_still_pass(tmp_path, monkeypatch, synthetic_dir, tiny_model_dir):
    """The checks refuse only what cannot train: the demo's own settings reach the model load."""
    class Loaded(Exception):
        pass

    def loaded(*args):
        raise Loaded

    monkeypatch.chdir(tmp_path)
    for method, (_, module, recipe) in TRAINERS.items():
        monkeypatch.setattr(module, "load_model_and_processor", loaded)
        monkeypatch.setattr(sys, "argv", ["s.py", str(ROOT / "recipes" / "demo" / f"{recipe}.yaml"),
                                          "--model_name_or_path", str(tiny_model_dir), "--output_dir",
                                          str(tmp_path / method), "--train_data_path",
                                          str(synthetic_dir / "train_data.json"), "--image_folder", str(synthetic_dir),
                                          "--per_device_train_batch_size", "2", *(
                                              ("--num_generations", "2") if method == "grpo" else ())])
        with pytest.raises(Loaded):
            module.main()
    from store import locks

    locks._release_all()
