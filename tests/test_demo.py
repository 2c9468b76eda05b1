"""The demo pipeline, `make demo` as written (tests/conftest.py's `demo_outputs`, once per session; the docs' blocks
run on the same outputs, tests/test_docs_run.py): every stage leaves its outputs, the report has every key, and a
second run reuses what is built and reports the same numbers."""

import json
import sys
from pathlib import Path

import forked_python
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
SHORT = ["--sft-steps", "3", "--nca-p-steps", "2", "--train-per-label", "1", "--train-absolute-per-label", "1",
         "--test-per-label", "1", "--max-new-tokens", "6", "--eval-limit", "40", "--eval-batch-size", "20",
         "--train-args", "--logging_steps", "1"]


def test_demo_pipeline_end_to_end(demo_outputs):
    from eval.spy.metrics import spy_metrics
    from store.runs import read_jsonl

    out = demo_outputs
    for stage in ("sft", "nca_p"):
        assert (out / stage / "model.safetensors").exists() and (out / stage / "README.md").exists()
        assert (out / stage / "train_metrics.json").exists()
        card = (out / stage / "README.md").read_text()
        assert card.index("## Evaluation: held-out synthetic SPY-Bench") < card.index("## Recipe")
    assert (out / "tiny-qwen2vl" / "config.json").exists()
    assert (out / "synthetic-spy-tune" / "questions.json").exists()
    assert (out / "report.png").stat().st_size > 10_000
    assert "SFT + NCA-P" in (out / "report.md").read_text() and "| ICS |" in (out / "report.md").read_text()

    report = json.loads((out / "report.json").read_text())
    metric_keys = set(spy_metrics([]))
    assert set(report) == {"base", "sft", "nca_p", "wall_seconds", "with_distractors"}
    for stage in ("base", "sft", "nca_p"):
        assert metric_keys <= set(report[stage]) and metric_keys <= set(report["with_distractors"][stage])
        assert report[stage]["total"] == 327  # 67 categories x 5 cases, less the scenarios some categories lack
    # each stage went through the evaluation suite (eval/suites/demo.yaml), and the leaderboard compares them
    suite = json.loads((out / "suite" / "nca_p" / "results.json").read_text())
    assert {r["benchmark"] for r in suite["headline"]} == {"SPY-Bench", "SpatialTrust"}
    assert (out / "suite" / "base" / "report.png").exists() and (out / "leaderboard" / "compare.md").exists()
    assert report["nca_p"]["spatialtrust_overall"] == next(r["value"] for r in suite["headline"]
                                                           if r["metric"] == "overall")
    judged = read_jsonl(out / "suite" / "nca_p" / "spy" / "with_distractors" / "judged.jsonl")  # no header line
    assert len(judged) == 327 and all(r["eval_resp"] in ("respond", "reject") for r in judged)
    assert all(len(r["input_question"].split("\n\n")[0].split("\n")) == 6 for r in judged)

    # a second `make demo` reuses everything and reports the same numbers
    import docs_run

    result = docs_run.make(out.parents[1], "demo")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    stdout = result.stdout
    assert "sft: reusing" in stdout and "nca_p: reusing" in stdout
    again = json.loads((out / "report.json").read_text())
    for stage in ("base", "sft", "nca_p"):
        assert again[stage] == report[stage] and again["with_distractors"][stage] == report["with_distractors"][stage]


def test_demo_refuses_to_mix_settings(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "demo_config.json").write_text(json.dumps({"sft_steps": 1}))
    result = forked_python.run([sys.executable, "-m", "train.demo", "--out", str(out), *SHORT], cwd=ROOT)
    assert result.returncode != 0 and "other settings" in result.stderr
