"""The demo pipeline, `make demo` as written (tests/conftest.py's `demo_outputs`, once per session; the docs' blocks
run on the same outputs, tests/test_docs_run.py): every stage leaves its outputs, the report has every key, and a
second run reuses what is built and reports the same numbers."""

import json
import shlex
import sys
from pathlib import Path

import forked_python
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
SHORT = ["--sft-steps", "3", "--nca-p-steps", "2", "--train-per-label", "1", "--train-absolute-per-label", "1",
         "--test-per-label", "1", "--max-new-tokens", "6", "--eval-limit", "40", "--eval-batch-size", "20",
         "--train-args", "--logging_steps", "1"]


def test_demo_pipeline_end_to_end(demo_outputs, tmp_path):
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
    # the SpatialTrust column: what scores offline (Q1-Q3), and why it is 0 where the answers had nothing to score
    spatial = suite["sections"]["spatialtrust"]["one-pass"]
    bad = max(spatial["unparsable"][q] for q in ("q1", "q2", "q3"))
    cell = f"{sum(spatial[q] for q in ('q1', 'q2', 'q3')) / 3:.1f}" + (f" ({bad}/{spatial['n_images']} unparsable)"
                                                                      if bad else "")
    report_md = (out / "report.md").read_text()
    assert "SpatialTrust Q1-Q3 |" in report_md and f"| {cell} |" in report_md
    assert "Q4/Q5 need an LLM judge" in report_md and "no JSON to read scores 0 (unparsable)" in report_md
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

    # the suite command the demo prints for a stage is the one it runs (eval/suites/demo.yaml as it is, the
    # documented command): run as printed into another --out, the same numbers, and `eval compare` finds no
    # setting that differs
    printed = suite_command(stdout, "nca_p")
    assert printed == ["--config", "eval/suites/demo.yaml", "--model", "outputs/demo/nca_p", "--out",
                       "outputs/demo/suite/nca_p"]
    printed[-1] = str(tmp_path / "printed")
    clone = out.parents[1]
    result = forked_python.run([sys.executable, "-m", "eval", "suite", *printed, "--no-view"], cwd=clone,
                               env=docs_run.environment())
    assert result.returncode == 0, result.stderr[-3000:]
    rerun = json.loads((tmp_path / "printed" / "results.json").read_text())
    assert rerun["headline"] == suite["headline"] and rerun["sections"] == suite["sections"]
    result = forked_python.run([sys.executable, "-m", "eval", "compare", "outputs/demo/suite/nca_p",
                                str(tmp_path / "printed"), "--no-view", "--out", str(tmp_path / "board")], cwd=clone,
                               env=docs_run.environment())
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr


def suite_command(stdout: str, stage: str) -> list[str]:
    """The arguments of the `.venv/bin/privacy-align eval suite` command the demo printed for a stage (the
    documented form: the installed command's path from the clone)."""
    line = next(line for line in stdout.splitlines() if f"] eval {stage}: .venv/bin/privacy-align eval suite " in line)
    return shlex.split(line.split("privacy-align eval suite ", 1)[1])


def test_the_demo_keeps_its_promise(demo_outputs):
    """`make demo` as written: from an untrained ICS near 0, SFT + NCA-P reaches ICS >= 80 and HMS >= 60 on the
    held-out items without distractors (docs/getting-started.md's table)."""
    report = json.loads((demo_outputs / "report.json").read_text())
    assert report["base"]["ics"] <= 10 and report["base"]["hms"] <= 10, report["base"]
    assert report["nca_p"]["ics"] >= 80, report["nca_p"]
    assert report["nca_p"]["hms"] >= 60, report["nca_p"]


def test_getting_started_shows_the_demo_table(demo_outputs):
    """docs/getting-started.md's table is the demo's report to the digit (its columns, the SpatialTrust one left out)."""
    report = json.loads((demo_outputs / "report.json").read_text())
    names = {"base (untrained)": "base", "SFT": "sft", "SFT + NCA-P": "nca_p"}
    keys = ("ics", "hms", "rta_nonconflict", "ata_nonconflict", "ata_conflict")
    shown = [line.strip("|").split(" | ") for line in (ROOT / "docs" / "getting-started.md").read_text().splitlines()
             if line.startswith(("| without distractors |", "| with distractors |"))]
    assert len(shown) == 6
    for setting, model, *cells in shown:
        metrics = report[names[model.strip()]] if setting.strip() == "without distractors" else \
            report["with_distractors"][names[model.strip()]]
        assert [c.strip() for c in cells] == [f"{metrics[k]:.1f}" for k in keys], (setting, model)


def test_demo_refuses_to_mix_settings(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "demo_config.json").write_text(json.dumps({"sft_steps": 1}))
    result = forked_python.run([sys.executable, "-m", "train.demo", "--out", str(out), *SHORT], cwd=ROOT)
    assert result.returncode != 0 and "other settings" in result.stderr


def test_the_demo_recipes_read_what_make_demo_wrote(demo_outputs):
    """recipes/demo/*.yaml name the folders `make demo` writes (outputs/demo/...), relative to the clone's root."""
    import yaml

    clone = demo_outputs.parents[1]
    for recipe in sorted((ROOT / "recipes" / "demo").glob("*.yaml")):
        config = yaml.safe_load(recipe.read_text())
        for key in ("model_name_or_path", "train_data_path", "image_folder", "output_dir"):
            assert config[key].startswith("outputs/demo/"), (recipe.name, key)
        for key in ("model_name_or_path", "train_data_path", "image_folder"):
            assert (clone / config[key]).exists(), (recipe.name, key, config[key])
    # each stage the demo trains says what data it was trained on (train/resume.py)
    for stage in ("sft", "nca_p"):
        record = json.loads((demo_outputs / stage / "training_data.json").read_text())
        assert record["train_data_path (sha256)"] == sha256_of(demo_outputs / "synthetic-spy-tune" / "train_data.json")


def sha256_of(path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_grpo_from_the_demo_sft_refuses_other_data_in_one_line(demo_outputs, tmp_path):
    """The issue's case: an older outputs/synthetic-spy-tune (other items) beside the demo's; GRPO from the demo's
    SFT model on it stops before the model loads, with one line naming the data file, and exit status 2."""
    import docs_run

    from data_prep.synthetic import build

    clone = docs_run.folder(tmp_path / "clone", demo_outputs)
    build(clone / "outputs" / "synthetic-spy-tune", train_per_label=1, test_per_label=1)
    result = forked_python.run([sys.executable, "train/grpo.py", "recipes/demo/grpo.yaml",
                                "--train_data_path", "outputs/synthetic-spy-tune/train_data.json",
                                "--image_folder", "outputs/synthetic-spy-tune", "--max_steps", "1"],  # 1: if it trains
                               cwd=clone, env=docs_run.environment())
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "error: command line: train_data_path: outputs/synthetic-spy-tune/train_data.json is not the data "
        "outputs/demo/sft was trained on (another sha256 than its training_data.json); give that model's data, or "
        "--base_with_other_data true to train it on other data"], result.stderr[-3000:]
    assert not (clone / "outputs" / "demo" / "grpo").exists()  # nothing written


def test_a_base_model_is_checked_against_its_own_data_only_when_it_says_what_it_was(tmp_path):
    from types import SimpleNamespace

    from cli.errors import InputError
    from train.common import option_error
    from train.resume import DATA_RECORD, check_base_data

    data, other, model = tmp_path / "data.json", tmp_path / "other.json", tmp_path / "model"
    data.write_text('{"data_list": []}')
    other.write_text('{"data_list": [] }')
    model.mkdir()

    def check(train_data, consent=False):
        def fail(name, message):
            raise option_error(name, message)
        check_base_data(SimpleNamespace(train_data_path=str(train_data), base_with_other_data=consent),
                        SimpleNamespace(model_name_or_path=str(model)), fail)

    check(other)  # no record (a Hub model, an untrained one): not checked
    (model / DATA_RECORD).write_text(json.dumps({"train_data_path (sha256)": sha256_of(data)}))
    check(data)  # its own data
    check(other, consent=True)  # other data, meant
    with pytest.raises(InputError, match="train_data_path: .*other.json is not the data .*model was trained on"):
        check(other)
    check(tmp_path / "missing.json")  # a missing file: the data checks say so, with their own line


def test_the_stage_progress_line_says_the_time_left():
    """train/demo.py's progress lines: the remaining steps at the rate since the first step seen (loading excluded)."""
    from train.demo import eta

    assert eta((100.0, 2), (100.0, 2), 120) == ""  # one point: no rate yet
    assert eta((100.0, 2), (110.0, 4), 120) == ", about 9:40 left"  # 116 steps at 5 s
    assert eta((100.0, 2), (160.0, 120), 120) == ", about 0:00 left"
