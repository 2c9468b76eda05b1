"""Every supported family (vlm/families.py), on its tiny random model:

- `python -m train.tiny_model DIR --family F` writes a model and processor that load through the Auto classes,
  with the family's own chat template and architecture (Qwen3-VL's deepstack, Qwen3-VL-MoE's experts);
- every (method, family) pair trains through its entry script's `main` (in process; tests/test_train_methods.py
  launches the other pairs with `accelerate launch`), and the saved model loads;
- `min_pixels` / `max_pixels` reach the Qwen image processors, and Gemma 3 refuses them with one line and
  exit status 2.
"""

import json
import sys
from pathlib import Path

import forked_python
import pytest
from PIL import Image

from cli.errors import InputError
from train.tiny_model import ASSETS, FAMILIES
from vlm.families import FAMILIES as FAMILY_FACTS
from vlm.families import pixel_kwargs

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl", "qwen3_vl": "qwen3_vl", "qwen3_vl_moe": "qwen3_vl",
             "gemma3": "gemma3"}
ENTRY = {"sft": ("sft", "sft"), "dpo": ("dpo", "dpo"), "nca": ("dpo", "nca"), "nca_p": ("nca_p", "nca_p")}
LAUNCHED = {("sft", "qwen2_vl"), ("dpo", "qwen2_vl"), ("nca", "qwen2_vl"), ("sft", "gemma3"),
            *(("nca_p", family) for family in FAMILIES)}  # tests/test_train_methods.py::LAUNCHED


def test_every_family_has_its_facts():
    assert set(FAMILIES) == set(FAMILY_FACTS) == set(TEMPLATES)


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_loads_like_the_real_family(family, tiny_family_dir):
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    directory = tiny_family_dir(family)
    config = AutoConfig.from_pretrained(directory)
    processor = AutoProcessor.from_pretrained(directory)
    assert config.model_type == family
    assert processor.chat_template == (ASSETS / f"{TEMPLATES[family]}_chat_template.jinja").read_text()
    model = AutoModelForImageTextToText.from_pretrained(directory)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    # the image reaches the logits (Gemma 3's zero-initialised projection would hide it)
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    text = processor.apply_chat_template(conversation, add_generation_prompt=True)
    logits = [model(**processor(text=[text], images=[Image.new("RGB", (64, 48), colour)], return_tensors="pt")).logits
              for colour in ("red", "blue")]
    assert (logits[0] - logits[1]).abs().max() > 1e-4
    if family.startswith("qwen3_vl"):
        assert config.vision_config.deepstack_visual_indexes  # deepstack features reach the language model
    if family == "qwen3_vl_moe":
        assert config.text_config.num_experts > config.text_config.num_experts_per_tok > 1
    if FAMILY_FACTS[family]["pixel_bounds"]:
        size = processor.image_processor.size
        assert size["shortest_edge"] < size["longest_edge"]


def test_tiny_model_cli(tmp_path):
    result = forked_python.run([sys.executable, "-m", "train.tiny_model", str(tmp_path / "m"), "--family", "qwen3_vl_moe",
                             "--hidden", "32", "--layers", "1"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl_moe" and config["text_config"]["hidden_size"] == 32
    assert (tmp_path / "m" / "processor_config.json").exists() or (tmp_path / "m" / "preprocessor_config.json").exists()
    bad = forked_python.run([sys.executable, "-m", "train.tiny_model", str(tmp_path / "x"), "--family", "llama9"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'llama9'" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("method,family", [(m, f) for f in FAMILIES for m in ENTRY if (m, f) not in LAUNCHED])
def test_method_trains_family_in_process(method, family, tiny_family_dir, synthetic_dir, tmp_path, monkeypatch):
    """The entry script's own `main`, as `accelerate launch` would run it on one process."""
    import importlib

    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    script, recipe = ENTRY[method]
    model_dir, out = tiny_family_dir(family), tmp_path / "out"
    monkeypatch.setattr(sys, "argv", [
        f"{script}.py", str(ROOT / "recipes" / "demo" / f"{recipe}.yaml"), "--model_name_or_path", str(model_dir),
        "--train_data_path", str(synthetic_dir / "train_data.json"), "--image_folder", str(synthetic_dir),
        "--output_dir", str(out), "--max_steps", "2", "--logging_steps", "1", "--per_device_train_batch_size", "2",
        "--save_strategy", "no",
    ])
    importlib.import_module(f"train.{script}").main()
    history = json.loads((out / "train_metrics.json").read_text())
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 2 and all(x == x for x in losses)
    before, after = load_file(model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys() and sum(not before[k].equal(after[k]) for k in before) > len(before) / 2
    assert AutoModelForImageTextToText.from_pretrained(out).config.model_type == family
    assert f"- {family}\n" in (out / "README.md").read_text()  # the card's tag: the saved config's model_type


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_pixel_bounds_reach_the_qwen_image_processor(family, tiny_family_dir):
    from transformers import AutoProcessor

    directory = tiny_family_dir(family)
    processor = AutoProcessor.from_pretrained(directory, **pixel_kwargs(directory, 32 * 32 * 4, 32 * 32 * 16))
    assert (processor.image_processor.size["shortest_edge"], processor.image_processor.size["longest_edge"]) == (
        32 * 32 * 4, 32 * 32 * 16)


def test_gemma3_refuses_pixel_bounds(tiny_family_dir, synthetic_dir, tmp_path):
    directory = tiny_family_dir("gemma3")
    assert pixel_kwargs(directory, None, None) == {}
    with pytest.raises(InputError, match="gemma3 resizes every image to one fixed size"):
        pixel_kwargs(directory, 200704, None)
    result = forked_python.run(
        [sys.executable, str(ROOT / "train" / "nca_p.py"), str(ROOT / "recipes/demo/nca_p.yaml"),
         "--model_name_or_path", str(directory), "--train_data_path", str(synthetic_dir / "train_data.json"),
         "--image_folder", str(synthetic_dir), "--output_dir", str(tmp_path / "out"), "--max_pixels", "1003520"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {directory}: max_pixels: gemma3 resizes every image to one fixed size and has no "
                      "min_pixels/max_pixels; remove them"]


RECIPE_PATCHES = {"recipes": 14, "qwen2.5-vl-7b": 14, "qwen3-vl-8b": 16}  # the base model's vision patch size


@pytest.mark.parametrize("recipe", sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("recipes/*/*.yaml")
                                          if p.parent.name not in ("demo", "study")) + sorted(
                                              str(p.relative_to(ROOT)) for p in ROOT.glob("recipes/*.yaml")))
def test_recipes_parse_and_keep_the_papers_image_tokens(recipe, monkeypatch):
    """Every base model's recipes parse with their entry script's arguments and give 256-1,280 image tokens."""
    from trl import ModelConfig, SFTConfig

    from losses.grpo_trainer import VisionGRPOConfig
    from losses.nca_p_trainer import NCAPConfig
    from losses.vision_dpo_trainer import VisionDPOConfig
    from train.common import SpyTuneArguments, parse_recipe

    path = ROOT / recipe
    config = {"sft": SFTConfig, "dpo": VisionDPOConfig, "nca": VisionDPOConfig, "nca_p": NCAPConfig,
              "grpo": VisionGRPOConfig}[path.stem]
    monkeypatch.setattr(sys, "argv", ["train.py", str(path), "--bf16", "false", "--tf32", "false"])  # no GPU here
    script_args, training_args, model_args = parse_recipe(SpyTuneArguments, config, ModelConfig)
    block = 2 * RECIPE_PATCHES[path.parent.name]
    assert (script_args.min_pixels // block**2, script_args.max_pixels // block**2) == (256, 1280)
    folder = path.parent.name if path.parent.name != "recipes" else "qwen2-vl-7b"
    assert model_args.model_name_or_path.lower().replace("-instruct", "").endswith(folder)
    assert folder in training_args.output_dir and folder in training_args.run_name
    if path.stem == "grpo":  # online RL: 8 prompts x G = 8 sampled answers per step, one pass over the prompts
        assert training_args.per_device_train_batch_size * 8 == 8 * training_args.num_generations
    else:
        assert training_args.per_device_train_batch_size == 4 and training_args.num_train_epochs == 3


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_vl", "gemma3"])
def test_spy_bench_generation_uses_each_familys_processor(family, tiny_family_dir, synthetic_dir, tmp_path, capsys):
    """`python -m eval spy generate` with the hf backend: the family's template and processor, its pixel bounds."""
    from eval.__main__ import main as eval_main
    from store.runs import read_jsonl

    directory, out = tiny_family_dir(family), tmp_path / "run.jsonl"
    base = ["spy", "generate", "--items", str(synthetic_dir / "questions.json"), "--images", str(synthetic_dir),
            "--model", str(directory), "--backend", "hf", "--limit", "6", "--max-new-tokens", "3", "--batch-size", "3",
            "--distractors"]
    if family == "gemma3":
        assert eval_main([*base, "--out", str(tmp_path / "refused.jsonl"), "--min-pixels", "200704"]) == 2
        assert "gemma3 resizes every image to one fixed size" in capsys.readouterr().err
        assert not (tmp_path / "refused.jsonl").exists()
    else:
        base += ["--min-pixels", str(64 * 64), "--max-pixels", str(128 * 128)]
    assert eval_main([*base, "--out", str(out)]) == 0
    records = read_jsonl(out)
    assert len(records) == 6 and all(isinstance(r["response"], str) and "error" not in r for r in records)
