"""Bad input to the training side: every case exits 2 with one line naming the file (and the line or record, and the
field), before any work, and no file that existed before has changed (sha256 of every file, before and after).

Cases run the entry scripts as a user does (`python train/sft.py RECIPE ...`, `python -m data_prep.spy_tune
validate ...`, the synthetic data, tiny model and demo commands); more run under the real `accelerate launch`
and through the demo, and every recipe is parsed with the strict parser.
"""

import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

import forked_python
import pytest
import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # else accelerate warns that it picked a thread count


class Case:
    """A small SPY-Tune folder (two items and their images), a copy of the demo SFT recipe, the tiny model."""

    def __init__(self, root: Path, synthetic_dir: Path, model: Path):
        self.root, self.model = root, model
        self.images = root / "data"
        self.data = self.images / "train.json"
        items = json.loads((synthetic_dir / "train_data.json").read_text())["data_list"][:2]
        for item in items:
            image = self.images / item["question_item"]["image_path"]
            image.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(synthetic_dir / item["question_item"]["image_path"], image)
        self.items = items
        self.write_items()
        self.recipe = root / "sft.yaml"
        shutil.copy(ROOT / "recipes" / "demo" / "sft.yaml", self.recipe)
        self.out = root / "out"
        self.script, self.args = "sft", []

    def write_items(self):
        self.data.write_text(json.dumps({"data_list": self.items}, indent=1))

    def image(self, index: int) -> Path:
        return self.images / self.items[index]["question_item"]["image_path"]

    def train_command(self):
        return [sys.executable, str(ROOT / "train" / f"{self.script}.py"), str(self.recipe),
                "--model_name_or_path", str(self.model), "--train_data_path", str(self.data),
                "--image_folder", str(self.images), "--output_dir", str(self.out), *self.args]

    def synthetic_command(self):
        return [sys.executable, "-m", "data_prep.synthetic", "--out", str(self.out), *self.args]

    def tiny_model_command(self):
        return [sys.executable, "-m", "train.tiny_model", str(self.out), *self.args]

    def demo_command(self):
        return [sys.executable, "-m", "train.demo", "--out", str(self.out), *self.args]

    def validate_command(self):
        return [sys.executable, "-m", "data_prep.spy_tune", "validate", str(self.data), "--images", str(self.images)]


_DELETE = object()


def _set(case, index, dotted, value):
    *parents, last = dotted.split(".")
    target = case.items[index]
    for key in parents:
        target = target[key]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    case.write_items()


def _bad_json(case):
    case.data.write_text('{"data_list": [\n  {"label": }\n]}')


def _not_utf8(case):
    text = json.dumps({"data_list": case.items}, indent=1)  # ASCII: one byte per character
    case.offset = text.index("?") + 1
    case.line = text.count("\n", 0, case.offset) + 1
    case.data.write_bytes(text.replace("?", "?\xe9", 1).encode("latin-1"))


def _corrupt_image(case):
    case.image(1).write_bytes(b"these bytes are not an image")


def _truncated_image(case):
    path = case.image(0)
    Image.new("RGB", (256, 256), (200, 40, 40)).save(path, format="PNG")
    path.write_bytes(path.read_bytes()[:300])


def _recipe_key(case):
    case.recipe.write_text(case.recipe.read_text() + "max_stepz: 3\n")


def _recipe_latin1(case):
    case.recipe.write_bytes(case.recipe.read_bytes() + "# réglages\n".encode("latin-1"))


def _under_file(case):
    case.args = ["--output_dir", str(case.data / "run")]


# (id, command, setup, the expected stderr line: a regex where {name} is the case's attribute `name`)
CASES = [
    # data, checked by `python -m data_prep.spy_tune validate`
    ("bad-json", "validate", _bad_json, r"{data}:2: not valid JSON \(Expecting value\)"),
    ("not-utf8", "validate", _not_utf8, r"{data}:{line}: not UTF-8 text \(byte offset {offset}\)"),
    ("no-data-list", "validate", lambda c: c.data.write_text('{"items": []}'), r"{data}: data_list: missing.*"),
    ("not-an-object", "validate", lambda c: c.data.write_text('{"data_list": [7]}'),
     r"{data}:record 0: expected a JSON object"),
    ("missing-field", "validate", lambda c: _set(c, 1, "question_item.reject_ans", _DELETE),
     r"{data}:record 1: question_item\.reject_ans: missing field"),
    ("null-question", "validate", lambda c: _set(c, 0, "question_item.question", None),
     r"{data}:record 0: question_item\.question: expected a non-empty string, got null"),
    ("empty-answer", "validate", lambda c: _set(c, 1, "question_item.respond_ans", "  "),
     r'{data}:record 1: question_item\.respond_ans: expected a non-empty string, got "  "'),
    ("number-question", "validate", lambda c: _set(c, 0, "question_item.question", 42),
     r"{data}:record 0: question_item\.question: expected a non-empty string, got 42"),
    ("unknown-label", "validate", lambda c: _set(c, 1, "label", "a999_mystery"),
     r"{data}:record 1: label: unknown label 'a999_mystery'"),
    ("bad-distractor", "validate", lambda c: _set(c, 0, "other_labels.a11_tattoo", 2),
     r"{data}:record 0: other_labels\.a11_tattoo: expected 0 or 1, got 2"),
    ("template-without-slot", "validate",
     lambda c: _set(c, 0, "non_privacy_scenarios", [{"scenario": "s1", "2nd_person_template": "No slot."}]),
     r"{data}:record 0: non_privacy_scenarios\[0\]\.2nd_person_template: expected a string with one \{{\}} slot"),
    ("missing-image", "validate", lambda c: c.image(1).unlink(),
     r"{data}:record 1: question_item\.image_path: image not found: {images}/images/train/\S+\.png"),
    ("corrupt-image", "validate", _corrupt_image,
     r"{data}:record 1: question_item\.image_path: not a readable image \(UnidentifiedImageError\): {images}/\S+\.png"),
    ("truncated-image", "validate", _truncated_image,
     r"{data}:record 0: question_item\.image_path: not a readable image \(OSError\): {images}/\S+\.png"),
    # recipes and options, through the training scripts
    ("missing-recipe", "train", lambda c: setattr(c, "recipe", c.root / "nope.yaml"), r"{root}/nope\.yaml: file not found"),
    ("unknown-recipe-key", "train", _recipe_key,
     r"{recipe}:\d+: max_stepz: unknown key \(did you mean max_steps\?\)"),
    ("recipe-value-type", "train", lambda c: c.recipe.write_text(re.sub(r"max_steps: \d+", "max_steps: 1.5", c.recipe.read_text())),
     r"{recipe}: argument --max_steps/--max-steps: invalid int value: '1\.5'"),
    ("recipe-not-utf8", "train", _recipe_latin1, r"{recipe}:\d+: not UTF-8 text \(byte offset \d+\)"),
    ("flag-abbreviation", "train", lambda c: setattr(c, "args", ["--max_step", "1"]),
     r"command line: --max_step: unknown option \(did you mean --max_steps\?\)"),
    ("negative-learning-rate", "train", lambda c: setattr(c, "args", ["--learning_rate=-1e-4"]),
     r"command line: learning_rate: must be > 0, got -0\.0001"),
    ("zero-batch", "train", lambda c: setattr(c, "args", ["--per_device_train_batch_size", "0"]),
     r"command line: per_device_train_batch_size: must be at least 1, got 0"),
    ("output-is-data-folder", "train", lambda c: setattr(c, "args", ["--output_dir", str(c.images)]),
     r"command line: output_dir: is the image_folder \({images}\); an output never overwrites an input"),
    ("output-is-model", "train", lambda c: setattr(c, "args", ["--output_dir", str(c.model)]),
     r"command line: output_dir: is the model_name_or_path \({model}\); an output never overwrites an input"),
    ("output-under-a-file", "train", _under_file, r"command line: output_dir: \S+ cannot be created: {data} is a file, not a folder"),
    ("synthetic-out-under-a-file", "synthetic", lambda c: setattr(c, "out", c.data / "synthetic"),
     r"{data}/synthetic: --out: cannot create the folder \(Not a directory\)"),
    ("synthetic-zero-items", "synthetic", lambda c: setattr(c, "args", ["--train-per-label", "0"]),
     r"command line: --train-per-label: must be at least 1, got 0"),
    ("tiny-model-out-under-a-file", "tiny_model", lambda c: setattr(c, "out", c.data / "model"),
     r"{data}/model: out_dir: cannot create the folder \(Not a directory\)"),
    ("demo-out-under-a-file", "demo", lambda c: setattr(c, "out", c.data / "demo"),
     r"{data}/demo: --out: cannot create the folder \(Not a directory\)"),
    # the data is checked before the model loads, in every training script
    ("null-question-nca-p", "train", lambda c: (_set(c, 0, "question_item.question", None), setattr(c, "script", "nca_p"),
                                                setattr(c, "recipe", ROOT / "recipes" / "demo" / "nca_p.yaml")),
     r"{data}:record 0: question_item\.question: expected a non-empty string, got null"),
    ("corrupt-image-dpo", "train", lambda c: (_corrupt_image(c), setattr(c, "script", "dpo"),
                                              setattr(c, "recipe", ROOT / "recipes" / "demo" / "dpo.yaml")),
     r"{data}:record 1: question_item\.image_path: not a readable image \(UnidentifiedImageError\): .*"),
]


def _hashes(*folders) -> dict[str, str]:
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest()
            for folder in folders for path in sorted(Path(folder).rglob("*")) if path.is_file()}


@pytest.mark.parametrize("command,setup,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(command, setup, expected, tmp_path, synthetic_dir, tiny_model_dir):
    case = Case(tmp_path, synthetic_dir, tiny_model_dir)
    setup(case)
    before = _hashes(tmp_path, tiny_model_dir, ROOT / "recipes")
    argv = getattr(case, f"{command}_command")()
    result = forked_python.run(argv, capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert re.fullmatch("error: " + expected.format(**{k: re.escape(str(v)) for k, v in vars(case).items()}), lines[0])
    assert _hashes(tmp_path, tiny_model_dir, ROOT / "recipes") == before  # nothing changed, nothing written


def test_validate_passes_a_good_file_and_lists_the_first_problems(tmp_path, synthetic_dir, tiny_model_dir):
    case = Case(tmp_path, synthetic_dir, tiny_model_dir)
    ok = forked_python.run(case.validate_command(), capture_output=True, text=True, env=ENV)
    assert ok.returncode == 0 and ok.stdout.strip() == f"{case.data}: 2 items, 2 images: OK" and not ok.stderr
    _set(case, 0, "label", "a999_mystery")
    _set(case, 1, "question_item.question", "")
    bad = forked_python.run(case.validate_command(), capture_output=True, text=True, env=ENV)
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [  # one line per bad item, all of them
        f"error: {case.data}:record 0: label: unknown label 'a999_mystery'",
        f'error: {case.data}:record 1: question_item.question: expected a non-empty string, got ""']
    usage = forked_python.run([sys.executable, "-m", "data_prep.spy_tune"], capture_output=True, text=True, env=ENV)
    assert usage.returncode == 2  # one line (cli/entry.py's parser), not a usage block
    assert usage.stderr == "error: command line: the following arguments are required: command\n"


def _launch(case, *launcher_flags):
    command = [sys.executable, "-m", "accelerate.commands.launch", *launcher_flags, "--config_file",
               str(ROOT / "accelerate_configs" / "cpu.yaml"), *case.train_command()[1:]]
    return forked_python.run(command, capture_output=True, text=True, cwd=case.root, env=ENV, timeout=300)


@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "default"])
def test_under_accelerate_launch(quiet, tmp_path, synthetic_dir, tiny_model_dir):
    """The script's line comes first. accelerate's one-process launcher then adds its own CalledProcessError
    traceback unless it runs with -q; either way its own exit status is 1 (README, "Bad input")."""
    case = Case(tmp_path, synthetic_dir, tiny_model_dir)
    case.args = ["--max_step", "1"]
    before = _hashes(tmp_path, tiny_model_dir)
    result = _launch(case, *(["-q"] if quiet else []))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1
    assert lines[0] == "error: command line: --max_step: unknown option (did you mean --max_steps?)"
    if quiet:
        assert len(lines) == 1, result.stderr
    else:
        assert "CalledProcessError" in lines[-1]
    assert _hashes(tmp_path, tiny_model_dir) == before


def test_demo_reports_a_stage_s_bad_input_in_one_line(tmp_path, synthetic_dir, tiny_model_dir):
    out = tmp_path / "demo"
    shutil.copytree(tiny_model_dir, out / "tiny-qwen2vl")  # built already: the demo goes straight to training
    shutil.copytree(synthetic_dir, out / "synthetic-spy-tune")
    result = forked_python.run([sys.executable, "-m", "train.demo", "--out", str(out), "--train-per-label", "1",
                             "--test-per-label", "1", "--train-args", "--max_step", "1"],
                            capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: command line: --max_step: unknown option (did you mean --max_steps?)"]
    assert not (out / "sft" / "model.safetensors").exists()


@pytest.mark.parametrize("recipe", sorted(ROOT.glob("recipes/**/*.yaml")), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_recipe_parses_and_passes_the_checks(recipe, monkeypatch, tmp_path):
    from trl import ModelConfig, SFTConfig

    from losses.grpo_trainer import VisionGRPOConfig
    from losses.nca_p_trainer import NCAPConfig
    from losses.vision_dpo_trainer import VisionDPOConfig
    from study.methods import script
    from train.common import SpyTuneArguments, check_run, parse_recipe
    from train.grpo import check_grpo

    kind = "sft" if recipe.stem == "backbone" else script(recipe.stem)  # the study's recipes are named by method
    config = {"sft": SFTConfig, "dpo": VisionDPOConfig, "nca": VisionDPOConfig, "nca_p": NCAPConfig,
              "grpo": VisionGRPOConfig}[kind]
    monkeypatch.chdir(tmp_path)
    model = yaml.safe_load(recipe.read_text())["model_name_or_path"]
    if model.startswith("outputs/"):  # a previous stage's output (the study's backbone): a model folder by then
        (tmp_path / model).mkdir(parents=True)
        (tmp_path / model / "config.json").write_text("{}")
    # the GPU recipes ask for bf16 and tf32, which TrainingArguments checks against the machine
    monkeypatch.setattr(sys, "argv", ["script.py", str(recipe), "--use_cpu", "true", "--tf32", "false"])
    script_args, training_args, model_args = parse_recipe(SpyTuneArguments, config, ModelConfig)
    if config is VisionGRPOConfig:
        check_grpo(script_args, training_args)
    check_run(script_args, training_args, model_args)
    assert training_args.output_dir.startswith("outputs/")
