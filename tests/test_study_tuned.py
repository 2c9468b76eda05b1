"""The study's tuned protocol: the statistics against hand computations on fixed numbers, the paired differences,
the general-task breakdown, and the protocol shortened end to end (one method, two sweep points, two seeds, a
few steps): the files, the validation split, reuse and refusal of other settings."""

import json
import math
import os
import sys
from pathlib import Path

import forked_python
import pytest

from eval.general.synthetic import breakdown
from eval.stats import interval, paired_difference, t_cdf, t_quantile
from train.study_tuned import NUMERICS, paired, summarize, tables

ROOT = Path(__file__).resolve().parents[1]
# Student t 0.975 quantiles from a printed table (df 1, 2, 4, 9, 30)
T_TABLE = {1: 12.7062, 2: 4.3027, 4: 2.7764, 9: 2.2622, 30: 2.0423}


def test_t_distribution_against_the_table():
    for df, t in T_TABLE.items():
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)
        assert t_cdf(t, df) == pytest.approx(0.975, abs=1e-5)
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(-1.0, 3) == pytest.approx(1 - t_cdf(1.0, 3))


def test_interval_by_hand():
    # 5 seeds: mean 60, s^2 = (100 + 25 + 0 + 25 + 100) / 4 = 62.5, half width = 2.7764 * sqrt(62.5 / 5)
    result = interval([50, 55, 60, 65, 70])
    half = 2.776445 * math.sqrt(62.5 / 5)
    assert result["mean"] == 60 and result["n"] == 5
    assert result["std"] == pytest.approx(math.sqrt(62.5))
    assert (result["low"], result["high"]) == pytest.approx((60 - half, 60 + half), abs=1e-4)
    assert interval([42.0]) == {"mean": 42.0, "std": 0.0, "n": 1, "low": None, "high": None}


def test_paired_difference_by_hand():
    a = {"seed0": 90, "seed1": 80, "seed2": 85, "seed3": 95, "seed4": 88}
    b = {"seed0": 70, "seed1": 75, "seed2": 60, "seed3": 80, "seed4": 71, "seed9": 0}  # seed9: not paired
    d = paired_difference(a, b)
    # differences 20, 5, 25, 15, 17: mean 16.4, s^2 = (12.96 + 129.96 + 73.96 + 1.96 + 0.36) / 4 = 54.8
    s = math.sqrt(54.8)
    assert d["seeds"] == ["seed0", "seed1", "seed2", "seed3", "seed4"]
    assert d["mean"] == pytest.approx(16.4) and d["std"] == pytest.approx(s)
    assert d["low"] == pytest.approx(16.4 - 2.776445 * s / math.sqrt(5), abs=1e-4)
    t = 16.4 / (s / math.sqrt(5))  # 4.954: two-sided p of t(4), between the table's 0.01 (4.604) and 0.005 (5.598)
    assert d["p"] == pytest.approx(2 * (1 - t_cdf(t, 4)))
    assert 0.005 < d["p"] < 0.01 and d["verdict"] == "first higher"
    close = paired_difference({"s0": 50, "s1": 60, "s2": 40}, {"s0": 52, "s1": 55, "s2": 41})
    assert close["low"] < 0 < close["high"] and close["verdict"] == "indistinguishable" and close["p"] > 0.05
    assert paired_difference({"s0": 1, "s1": 2}, {"s0": 3, "s1": 4})["verdict"] == "second higher"  # constant -2


def _final(values: dict) -> dict:
    """method -> [ics per seed] as the protocol's final runs at step 10."""
    return {m: {"runs": {f"seed{i}": {"steps": {"10": {"ics": v, "hms": v / 2, "general": 100 - v, "overall": v}}}
                         for i, v in enumerate(vs)}} for m, vs in values.items()}


def test_paired_comparisons_of_the_three_pairs():
    final = _final({"nca_p": [90, 92, 94], "nca": [80, 95, 70], "dpo": [10, 12, 14]})
    result = paired(final, ["dpo", "nca", "nca_p"], [10])["10"]
    assert set(result) == {"nca_p - nca", "nca_p - dpo", "nca - dpo"}
    assert result["nca_p - dpo"]["ics"]["mean"] == pytest.approx(80) and result["nca_p - dpo"]["ics"]["std"] == 0
    assert result["nca_p - dpo"]["ics"]["verdict"] == "first higher"
    assert result["nca_p - dpo"]["general"]["verdict"] == "second higher"
    assert result["nca_p - nca"]["ics"]["verdict"] == "indistinguishable"  # differences 10, -3, 24
    summary = summarize(final, ["dpo", "nca", "nca_p"], [10])["10"]
    assert summary["nca"]["ics"]["mean"] == pytest.approx(245 / 3)
    assert summary["dpo"]["ics"]["low"] == pytest.approx(12 - 4.302653 * 2 / math.sqrt(3), abs=1e-4)


def test_general_answer_breakdown():
    records = [{"answer": "red", "response": "Red."}, {"answer": "red", "response": " blue "},
               {"answer": "red", "response": "I'm sorry, but I can't share the colour."},
               {"answer": "red", "response": "The background is red."}, {"answer": "red", "response": ""}]
    assert breakdown(records) == {"correct": 20.0, "refusal": 20.0, "wrong_colour": 20.0, "malformed": 40.0}
    assert breakdown([]) == {"correct": None, "refusal": None, "wrong_colour": None, "malformed": None}


SHORT = ["--protocol", "tuned", "--methods", "nca_p", "--lr-factors", "1", "3", "--beta-factors", "1",
         "--sweep-seeds", "100", "--seeds", "0", "1", "--backbone-steps", "2", "--steps", "2", "--long-factor", "2",
         "--curve-every", "1", "--train-per-label", "1", "--test-per-label", "1", "--general-train", "8",
         "--general-test", "8", "--general-val", "8", "--max-new-tokens", "4", "--eval-limit", "30",
         "--eval-batch-size", "30", "--jobs", "2"]
TRAIN_ARGS = ["--train-args", "--logging_steps", "1", "--per_device_train_batch_size", "2"]


def run_study(out, *extra, env=None):
    command = [sys.executable, "-m", "train.study", "--out", str(out), *SHORT, *extra, *TRAIN_ARGS]
    return forked_python.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_tuned_study_end_to_end_reuse_and_refusal(tmp_path):
    out = tmp_path / "tuned"
    result = run_study(out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "study.json").read_text())
    assert report["protocol"] == "tuned" and report["methods"] == ["nca_p"] and report["seeds"] == [0, 1]
    assert report["budgets"] == {"1x": 2, "2x": 4} and report["curve_steps"] == [1, 2, 3, 4]
    assert {"torch", "cpu_capability", "threads", "blas"} <= set(report["platform"])
    assert report["platform"]["threads"] == "1"
    assert report["platform"]["numerics"] == NUMERICS and report["platform"]["cpu_capability"] == "AVX2"

    # the validation split: the training phrasings, items and images of its own (not the held-out bench's)
    data = out / "synthetic-spy-tune"
    val = json.loads((data / "val_questions.json").read_text())["benchmark_list"]
    test = json.loads((data / "questions.json").read_text())["benchmark_list"]
    assert val and {i["benchmark_id"][0] for i in val} == {"3"}
    assert not {i["benchmark_id"] for i in val} & {i["benchmark_id"] for i in test}
    assert all("/val/" in json.dumps(i) and "/test/" not in json.dumps(i) for i in val)
    general_val = json.loads((data / "general_val.json").read_text())["data_list"]
    assert len(general_val) == 8 and all(i["image_path"].startswith("images/general_val/") for i in general_val)

    # the sweep: two learning rates, the paper's beta, evaluated on the validation split; one kept
    points = report["sweep"]["nca_p"]["points"]
    assert [p["point"]["learning_rate"] for p in points] == pytest.approx([9e-4, 2.7e-3])
    assert all(p["point"]["beta"] == 0.01 for p in points)
    assert report["sweep"]["nca_p"]["kept"] in [p["point"] for p in points]
    suite = out / "suite" / "sweep" / "nca_p-lr0.0009-beta0.01-seed100"
    answered = [json.loads(line) for line in (suite / "spy" / "without_distractors" / "run.jsonl").open()][1:]
    assert answered and all(r["image_path"].startswith("images/val/") for r in answered)
    assert not (suite / "spy" / "with_distractors").exists()
    general = [json.loads(line) for line in (suite / "synthetic_general" / "run.jsonl").open()][1:]
    assert general and all(r["id"].startswith("general_val_") for r in general)

    # the final runs: every checkpoint evaluated (a learning curve), both settings at 1x and at the end
    runs = report["final"]["nca_p"]["runs"]
    assert set(runs) == {"seed0", "seed1"}
    for run in runs.values():
        assert set(run["steps"]) == {"1", "2", "3", "4"}
        assert "ics_distr" in run["steps"]["2"] and "ics_distr" not in run["steps"]["1"]
        assert 0 <= run["steps"]["4"]["general"] <= 100
        shares = [run["steps"]["4"][k] for k in ("refusal", "wrong_colour", "malformed")]
        assert sum(shares) == pytest.approx(100 - run["steps"]["4"]["general"])
    summary = report["summary"]["4"]["nca_p"]["general"]
    assert set(summary) == {"mean", "std", "n", "low", "high"} and summary["n"] == 2
    assert (out / "runs" / "nca_p-seed1" / "checkpoint-2" / "model.safetensors").exists()
    text = (out / "study.md").read_text()
    assert "## Sweep (validation split)" in text and "Why general-task answers are wrong" in text
    assert (out / "study_curves.png").stat().st_size > 10_000

    # the tables again from study.json, with another platform's verdicts beside
    alt = json.loads(json.dumps(report))
    alt["platform"]["cpu_capability"] = "default"
    alt_path = tmp_path / "alt.json"
    alt_path.write_text(json.dumps(alt))
    from train.study_tuned import main as tables_main

    tables_main(["tables", str(out / "study.json"), "--alt", str(alt_path)])

    # a second run trains and generates nothing, and reports the same numbers
    again = run_study(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "backbone: reusing" in again.stdout and "loading" not in again.stdout
    assert all(f"{name}: reusing" in again.stdout for name in ("nca_p-lr0.0027-beta0.01-seed100", "nca_p-seed1"))
    assert json.loads((out / "study.json").read_text())["final"] == report["final"]

    # the machine's own CPU dispatch does not reach the study (the pins): under another capability it is the same
    # platform and reuses everything
    same = run_study(out, env={"ATEN_CPU_CAPABILITY": "default", "DNNL_MAX_CPU_ISA": "SSE41"})
    assert same.returncode == 0 and "nca_p-seed1: reusing" in same.stdout, same.stderr[-3000:]

    # other settings in the same folder, or a folder made under other pinned numerics: one line, exit 2
    error = f"error: {out / 'study_config.json'}: a study run with other settings is here; use another --out or delete it"
    config = out / "study_config.json"
    kept = config.read_text()
    config.write_text(json.dumps({**json.loads(kept), "numerics": {**NUMERICS, "ATEN_CPU_CAPABILITY": "avx512"}}))
    other_pins = run_study(out)
    config.write_text(kept)
    for refused in (run_study(out, "--lr-factors", "1"), other_pins):
        assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [error]
    quick = forked_python.run([sys.executable, "-m", "train.study", "--out", str(out), "--seeds", "0"], cwd=ROOT,
                           capture_output=True, text=True)
    assert quick.returncode == 2 and quick.stderr.strip().splitlines() == [error]


def test_tables_mark_verdicts_across_platforms(capsys):
    final = _final({"nca_p": [90, 92, 94], "nca": [80, 95, 70], "dpo": [10, 12, 14]})
    methods = ["dpo", "nca", "nca_p"]
    point = {"learning_rate": 1e-3, "beta": 0.1}
    back = {"general": 100.0, "without_distractors": {"ics": 7.5, "hms": 13.9, "overall": 19.3}}
    report = {"methods": methods, "seeds": [0, 1, 2], "budgets": {"1x": 10}, "wall_seconds": 1, "train_seconds": 1,
              "platform": {"torch": "x", "cpu_capability": "AVX2", "threads": "1"},
              "backbone": {"backbone": back, "self_moderation": back},
              "sweep": {m: {"points": [{"point": point, "stage": "learning_rate", "seeds": {"100": {"overall": 5}},
                                        "overall": interval([5])}], "kept": point} for m in methods},
              "final": {m: {**final[m], "kept": point} for m in methods},
              "summary": summarize(final, methods, [10]), "paired": paired(final, methods, [10])}
    flipped = json.loads(json.dumps(report))
    flipped["paired"]["10"]["nca_p - nca"]["ics"]["verdict"] = "first higher"
    text = tables(report, flipped)
    assert "| 1x | NCA-P - DPO | ICS | 80.0 [80.0, 80.0] | 0.000 | NCA-P higher | NCA-P higher |" in text
    assert "| 1x | NCA-P - NCA | ICS |" in text and "indistinguishable | NCA-P higher |" in text
    assert "11 of 12 verdicts the same" in text
