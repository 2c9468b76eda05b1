"""Privacy measured while training (train/privacy_eval.py): the ICS / HMS a run logs at its last step are the ones the
evaluation gives for its saved model on the same held-out slice; every run leaves training_curves.png beside its model.

NCA-P from the session's `make demo` SFT model (tests/conftest.py's demo_outputs: a model whose scores are not 0)."""

import json
import os
import sys
from pathlib import Path

import forked_python
import pytest
from PIL import Image

from train.privacy_eval import CURVES, METRICS, plot_curves

ROOT = Path(__file__).resolve().parents[1]


def python(*args, cwd=ROOT):
    result = forked_python.run([sys.executable, *map(str, args)], cwd=cwd, env=dict(os.environ))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def is_png(path: Path) -> bool:
    with Image.open(path) as image:
        image.verify()
        return image.format == "PNG"


@pytest.mark.slow
def test_the_logged_privacy_is_the_evaluations_on_the_saved_model(demo_outputs, tmp_path):
    data, out = demo_outputs / "synthetic-spy-tune", tmp_path / "nca_p"
    slice_ = ["--limit", "16"]
    python(ROOT / "train/nca_p.py", ROOT / "recipes/demo/nca_p.yaml", "--model_name_or_path", demo_outputs / "sft",
           "--train_data_path", data / "train_data.json", "--image_folder", data, "--output_dir", out,
           "--max_steps", "2", "--eval_steps", "1", "--save_steps", "2", "--per_device_eval_batch_size", "16",
           "--eval_privacy_items", data / "questions.json", "--eval_privacy_limit", "16")
    history = json.loads((out / "train_metrics.json").read_text())
    logged = [e for e in history if METRICS["ics"] in e]
    assert [e["step"] for e in logged] == [1, 2]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert [e for e in state["log_history"] if METRICS["hms"] in e] == logged  # in the trainer's state, as eval metrics

    # the evaluation of the saved model, on the same slice with the same batching and answer length
    python("-m", "eval", "spy", "generate", "--backend", "hf", "--model", out, "--items", data / "questions.json",
           "--images", data, "--out", tmp_path / "run.jsonl", "--batch-size", "16", "--max-new-tokens", "24",
           "--device", "cpu", *slice_)
    python("-m", "eval", "spy", "judge", tmp_path / "run.jsonl", "--judge", "rule", "--out", tmp_path / "judged.jsonl")
    python("-m", "eval", "spy", "metrics", tmp_path / "judged.jsonl", "--out", tmp_path / "metrics.json")
    measured = json.loads((tmp_path / "metrics.json").read_text())
    assert {key: logged[-1][name] for key, name in METRICS.items()} == {key: measured[key] for key in METRICS}
    assert measured["ics"] > 0 and measured["hms"] > 0  # a model that has learnt something: not 0 == 0
    assert is_png(out / CURVES)


def test_the_curves_are_a_png_with_what_was_logged(tmp_path):
    history = [{"step": 1, "loss": 2.0, "rewards/margins": 0.1}, {"step": 2, "loss": 1.5, "rewards/margins": 0.3},
               {"step": 2, METRICS["ics"]: 50.0, METRICS["hms"]: 40.0}]
    assert is_png(plot_curves(history, tmp_path / CURVES))
    assert not list(tmp_path.glob("*.partial*"))
    assert is_png(plot_curves([{"step": 1, "loss": 1.0}], tmp_path / CURVES))  # nothing but a loss: still drawn
