"""The miniature alignment study, shortened (one seed, few steps, few samples): the three files with every method
and key, a second run reuses every finished run, and a run with other settings is refused."""

import json
import sys
from pathlib import Path

import forked_python
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
SHORT = ["--seeds", "0", "--backbone-steps", "2", "--steps", "1", "--train-per-label", "1", "--test-per-label", "1",
         "--general-train", "8", "--general-test", "8", "--max-new-tokens", "4", "--eval-limit", "30",
         "--eval-batch-size", "30"]
TRAIN_ARGS = ["--train-args", "--logging_steps", "1", "--per_device_train_batch_size", "2"]


def run_study(out, *extra):
    command = [sys.executable, "-m", "study", "--out", str(out), *SHORT, *extra, *TRAIN_ARGS]
    return forked_python.run(command, cwd=ROOT, capture_output=True, text=True)


def test_study_end_to_end_and_reuse(tmp_path):
    from study.quick import ROWS, SPY
    from train.demo import METHODS

    out = tmp_path / "study"
    result = run_study(out)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((out / "study.json").read_text())
    assert set(report) == {"methods", "paper", "seeds", "settings", "wall_seconds", "train_seconds"}
    assert set(report["methods"]) == set(ROWS)
    for row in ROWS:
        runs = report["methods"][row]["runs"]
        assert set(runs) == ({"seed0"} if row in METHODS else {"deterministic"})
        for values in runs.values():
            assert 0 <= values["general"] <= 100
            for setting in ("without_distractors", "with_distractors"):
                assert set(SPY) | {"ata_conflict"} <= set(values[setting])
        summary = report["methods"][row]["summary"]
        assert set(summary["general"]) == {"mean", "std"}
    for method in METHODS:
        assert "loss" in report["methods"][method]["runs"]["seed0"]["training"]
        assert (out / "runs" / f"{method}-seed0" / "model.safetensors").exists()
    # the self-moderation row went through the two reflection turns
    assert (out / "suite" / "backbone" / "spy" / "without_distractors" / "self_moderation_judged.jsonl").exists()
    text = (out / "study.md").read_text()
    assert "Table 6 layout" in text and "Table 7 layout" in text and "NCA-P" in text and "78.61" in text
    assert (out / "study.png").stat().st_size > 10_000

    # a second run trains and generates nothing again, and reports the same numbers
    again = run_study(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "backbone: reusing" in again.stdout and all(f"{m}-seed0: reusing" in again.stdout for m in METHODS)
    assert "loading" not in again.stdout  # every suite section was read back without loading a model
    assert json.loads((out / "study.json").read_text())["methods"] == report["methods"]

    # other settings in the same folder: one error line, exit 2, nothing trained
    refused = run_study(out, "--max-new-tokens", "5")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: {out / 'study_config.json'}: a study run with other settings is here; use another --out or delete it"]
