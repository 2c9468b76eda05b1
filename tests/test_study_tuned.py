"""The study's tuned protocol: the statistics against hand computations on fixed numbers, the paired differences,
the general-task breakdown, the sweep's rule (a point that does not move loses to one that does; each budget keeps
its own setting), the compute formula and the counts it reads from a run's log, GRPO's compute matched to DPO's on
the study's data, the frontier and the verdict; and the protocol shortened end to end (one method, two sweep
points, two seeds, a few steps): the files, the validation split, reuse and refusal of other settings."""

import json
import math
import os
import sys
from pathlib import Path

import forked_python
import pytest

from eval.general.synthetic import breakdown
from eval.stats import interval, paired_difference, pareto_front, proportion_noise, t_cdf, t_quantile
from train.compute import logged_tokens, measured_rounds, run_compute, step_plan, training_compute
from train.study_tuned import (
    FORMAT,
    NUMERICS,
    elapsed_at,
    frontier,
    goal,
    kept_settings,
    moved,
    paired,
    point_result,
    select,
    summarize,
    tables,
    verdict_text,
)

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




def test_general_answer_breakdown():
    records = [{"answer": "red", "response": "Red."}, {"answer": "red", "response": " blue "},
               {"answer": "red", "response": "I'm sorry, but I can't share the colour."},
               {"answer": "red", "response": "The background is red."}, {"answer": "red", "response": ""}]
    assert breakdown(records) == {"correct": 20.0, "refusal": 20.0, "wrong_colour": 20.0, "malformed": 40.0}
    assert breakdown([]) == {"correct": None, "refusal": None, "wrong_colour": None, "malformed": None}


# ------------------------------------------------------------------------------------------ the sweep's rule
BACKBONE_VAL = {"ics": 7.5, "general": 100.0, "n_ics": 67, "n_general": 100}


def _swept(lr: float, by_budget: dict, stage: str = "learning_rate") -> dict:
    """A sweep point of one seed: budget -> (validation ICS, general accuracy, overall)."""
    seeds = {"100": {b: {"ics": i, "general": g, "overall": o} for b, (i, g, o) in by_budget.items()}}
    return point_result({"learning_rate": lr}, stage, seeds, list(by_budget), BACKBONE_VAL)


def test_a_run_moves_beyond_its_measurement_noise():
    # ICS 7.5% over 67 pairs: binomial error sqrt(0.075 x 0.925 / 67) = 3.218 points; 100% over 100: one item, 1 point
    assert proportion_noise(7.5, 67) == pytest.approx(100 * math.sqrt(0.075 * 0.925 / 67))
    assert proportion_noise(100.0, 100) == 1.0 and proportion_noise(0.0, 50) == 2.0
    assert moved({"ics": 7.5, "general": 98.0}, BACKBONE_VAL) is False  # two answers: within 2 x 1 point
    assert moved({"ics": 7.5, "general": 97.0}, BACKBONE_VAL) is True
    assert moved({"ics": 13.9, "general": 100.0}, BACKBONE_VAL) is False  # 6.4 points, within 2 x 3.218
    assert moved({"ics": 14.0, "general": 100.0}, BACKBONE_VAL) is True
    assert moved({"ics": None, "general": None}, BACKBONE_VAL) is None  # tiny test sets: cannot say


def test_a_point_that_does_not_move_loses_to_one_that_moves():
    still = _swept(1e-4, {"1x": (7.5, 100.0, 19.3)})  # the backbone's own answers: the best validation composite
    mover = _swept(3e-4, {"1x": (40.0, 60.0, 18.9)})  # left the backbone, with a lower composite
    assert still["budgets"]["1x"]["moved"] is False and mover["budgets"]["1x"]["moved"] is True
    assert select([still, mover], "1x") == {"point": {"learning_rate": 3e-4}, "moved": True}
    # it wins only when nothing moves: then the best composite among all points (the earlier of equals), flagged
    within_noise = _swept(9e-4, {"1x": (9.0, 99.0, 18.0)})
    assert within_noise["budgets"]["1x"]["moved"] is False
    assert select([within_noise, still], "1x") == {"point": {"learning_rate": 1e-4}, "moved": False}
    assert select([still, _swept(9e-4, {"1x": (7.5, 99.0, 19.3)})], "1x")["point"] == {"learning_rate": 1e-4}


def test_each_budget_keeps_the_setting_its_own_validation_numbers_choose():
    early = _swept(3e-4, {"1x": (60.0, 90.0, 60.0), "3x": (70.0, 50.0, 45.0)})  # best at 30 steps, overtrained at 90
    late = _swept(1e-4, {"1x": (20.0, 97.0, 30.0), "3x": (95.0, 90.0, 70.0)})
    assert select([early, late], "1x")["point"] == {"learning_rate": 3e-4}
    assert select([early, late], "3x")["point"] == {"learning_rate": 1e-4}


def test_the_sweep_chooses_each_budget_on_its_own_numbers(monkeypatch):
    """The sweep's own loop, each run replaced by fixed validation numbers (no training): the learning rates first, the
    beta at the learning rate the long budget keeps, and each budget's kept point from its own numbers."""
    from train import study_tuned

    def fixed(lr: float, beta: float) -> dict:  # DPO's recipe: lr 3e-4, beta 0.5
        return {(1e-4, 0.5): {"1x": (7.5, 100.0, 19.3), "3x": (7.5, 100.0, 19.3)},  # never moves
                (3e-4, 0.5): {"1x": (30.0, 95.0, 40.0), "3x": (80.0, 60.0, 50.0)},
                (9e-4, 0.5): {"1x": (50.0, 20.0, 25.0), "3x": (92.0, 85.0, 75.0)},
                (9e-4, 1.5): {"1x": (40.0, 30.0, 30.0), "3x": (94.0, 88.0, 78.0)}}[(round(lr, 8), beta)]

    def run(ctx, method, point, seed):
        return {b: {"ics": i, "general": g, "overall": o}
                for b, (i, g, o) in fixed(point["learning_rate"], point["beta"]).items()}

    monkeypatch.setattr(study_tuned, "sweep_task", run)
    ctx = {"budgets": {"1x": 30, "3x": 90}, "lr_factors": [1 / 3, 1, 3], "beta_factors": [1, 3],
           "sweep_seeds": [100], "jobs": 1, "steps": 30, "long_steps": 90}
    swept = study_tuned.sweep(ctx, ["dpo"], BACKBONE_VAL, log=lambda message: None)["dpo"]
    tried = [(round(p["point"]["learning_rate"], 8), p["point"]["beta"]) for p in swept["points"]]
    assert tried == [(3e-4, 0.5), (1e-4, 0.5), (9e-4, 0.5), (9e-4, 1.5)]  # beta at 3x's lr (9e-4), not 1x's (3e-4)
    assert swept["kept"]["1x"] == {"learning_rate": 3e-4, "beta": 0.5}
    assert swept["kept"]["3x"] == {"learning_rate": 9e-4, "beta": 1.5} and swept["moved"] == {"1x": True, "3x": True}


def test_kept_settings_from_either_layout(tmp_path):
    point = {"learning_rate": 1e-3, "beta": 0.03}
    old = tmp_path / "old.json"  # before issue 40: one kept point for every budget
    old.write_text(json.dumps({"budgets": {"1x": 30, "3x": 90}, "sweep": {"nca": {"kept": point}}}))
    assert kept_settings(old, ["nca"]) == {"nca": {"1x": point, "3x": point}}
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"budgets": {"1x": 30, "3x": 90}, "sweep": {"nca": {"kept": {"1x": point, "3x": {}}}}}))
    assert kept_settings(new, ["nca"]) == {"nca": {"1x": point, "3x": {}}}
    from cli.errors import InputError

    with pytest.raises(InputError, match="sweep.dpo.kept"):
        kept_settings(new, ["nca", "dpo"])
    with pytest.raises(InputError, match="no setting for the 2x budget"):
        kept_settings(old, ["nca"], ["1x", "2x"])


# ------------------------------------------------------------------------------------------ compute
def test_compute_formula_and_the_counts_it_reads_from_a_log():
    assert training_compute(1000) == 3000  # forward + backward (two forwards)
    assert training_compute(1000, reference=1000, generated=1500) == 5500  # forward only
    # DPO: TRL's running num_tokens every 5 steps, restarted by a resume after step 10
    history = [{"step": 5, "num_tokens": 500.0}, {"step": 10, "num_tokens": 1000.0},
               {"step": 15, "num_tokens": 480.0}, {"step": 20, "num_tokens": 1000.0}, {"step": 20, "train_runtime": 3.0}]
    assert logged_tokens(history, 10) == {"trained": 1000.0, "generated": None}
    assert logged_tokens(history, 20)["trained"] == 2000.0
    assert logged_tokens(history, 12)["trained"] is None  # nothing logged at step 12: not guessed
    assert run_compute(history, 20, "dpo", 0.5) == {"trained": 2000.0, "reference": 2000.0, "generated": 0.0,
                                                    "compute": 8000.0, "reference_rule": "trained"}
    assert run_compute(history, 20, "sft", None)["compute"] == 6000.0
    # GRPO: generation logged per step (every round), averaged by TRL over each 5-step logging window
    grpo = [{"step": 5, "num_tokens": 800.0, "generation/prompt_tokens": 200.0, "generation/completion_tokens": 40.0},
            {"step": 10, "num_tokens": 1700.0, "generation/prompt_tokens": 260.0,
             "generation/completion_tokens": 60.0}]
    # generated (200 + 40) x 5 + (260 + 60) x 5 = 2800; trained 1700. A run from before issue 45 logs no
    # reference/tokens: its reference ran in every generation round, on the 2800 generated tokens
    assert run_compute(grpo, 10, "grpo", 0.04) == {"trained": 1700.0, "reference": 2800.0, "generated": 2800.0,
                                                   "compute": 3 * 1700 + 2800 + 2800, "reference_rule": "every round"}
    assert run_compute(grpo, 10, "grpo", 0.0)["compute"] == 3 * 1700 + 2800  # no KL term: no reference pass
    # since issue 45 the run logs what its reference scored (the kept rows, after dynamic sampling's rounds)
    after = [{**e, "reference/tokens": t} for e, t in zip(grpo, (160.0, 180.0))]
    assert run_compute(after, 10, "grpo", 0.04) == {"trained": 1700.0, "reference": 1700.0, "generated": 2800.0,
                                                    "compute": 3 * 1700 + 1700 + 2800, "reference_rule": "logged"}
    before = [{k: v for k, v in e.items() if not k.startswith("generation/")} for e in grpo]
    assert run_compute(before, 10, "grpo", 0.04)["compute"] is None  # a run before the counts: n/a
    # planned per step: 16 DPO pairs of 200 tokens; 8 prompts x G 4 of 100 tokens, one or two generation rounds
    assert step_plan("dpo", {"per_device_train_batch_size": 16, "beta": 0.5}, 200.0)["compute"] == 4 * 3200
    grpo_step = {"per_device_train_batch_size": 32, "num_generations": 4, "beta": 0.04}
    assert step_plan("grpo", grpo_step, 100.0)["compute"] == 5 * 3200 and step_plan("grpo", grpo_step, 100.0)["prompts"] == 8
    assert step_plan("grpo", grpo_step, 100.0, rounds=2)["generated"] == 6400
    # the rounds a study's GRPO took: 1 + logged extra rounds, mean over its final runs at the long budget
    report = {"budgets": {"1x": 30, "3x": 90}, "final": {"grpo": {"runs": {
        f"seed{i}": {"steps": {"30": {"logged": {"dynamic_sampling/extra_rounds": 9.0}},
                               "90": {"logged": {"dynamic_sampling/extra_rounds": x}}}} for i, x in enumerate((1.0, 2.0))}}}}
    assert measured_rounds(report) == 2.5 and measured_rounds(report, "dpo") is None


def test_grpo_compute_per_step_within_20_percent_of_dpo_on_the_study_data(tmp_path):
    """recipes/study/grpo.yaml's prompts and G per step against recipes/study/dpo.yaml's 16 pairs, in tokens measured
    on data built as the study builds it (every category, the general-task share) with the study's tokenizer, at the
    generation rounds per step the published study's GRPO took with dynamic sampling (docs/study_tuned.json)."""
    from data_prep import synthetic
    from train.compute import study_plan
    from train.tiny_model import DEMO_CONFIG, build_tiny_model

    rounds = measured_rounds(json.loads((ROOT / "docs" / "study_tuned.json").read_text()))
    assert rounds is not None and rounds > 1  # dynamic sampling is on in the study and drew more prompts
    data = synthetic.build(tmp_path / "data", 2, 1, general_train=100, general_test=8)
    model = build_tiny_model(tmp_path / "model", corpus=synthetic.text_corpus(general=True), **DEMO_CONFIG)
    plan = study_plan(data, model, ROOT / "recipes" / "study", ["dpo", "grpo"], sample=300, rounds=rounds)
    assert plan["dpo"]["cases"] == 16 and plan["dpo"]["case_tokens"] > 100
    assert abs(plan["grpo"]["ratio_to_dpo"] - 1) <= 0.2, (rounds, plan)


def test_elapsed_time_from_the_progress_bar():
    log = (" 32%|###2      | 29/90 [00:11<00:24,  2.4it/s]\r 33%|###3      | 30/90 [00:12<00:25,  2.35it/s]\r"
           " 33%|###3      | 30/90 [00:13<00:25,  2.35it/s]\r100%|##########| 90/90 [1:02:03<00:00,  1.0it/s]")
    assert elapsed_at(log, 30, 90) == 12.0 and elapsed_at(log, 90, 90) == 3723.0
    assert elapsed_at(log, 60, 90) is None and elapsed_at("130/900 [00:09<01:00]", 30, 900) is None


# ------------------------------------------------------------------------------------------ results
def _runs(values: list, budget_step: int = 10) -> dict:
    """Final runs at one step from per-seed (ics, general) or (ics, general, extra) values."""
    runs = {}
    for i, v in enumerate(values):
        ics, general, *extra = v
        runs[f"seed{i}"] = {"steps": {str(budget_step): {"ics": ics, "hms": ics / 2, "general": general,
                                                         "overall": (ics + general) / 2, **(extra[0] if extra else {})}}}
    return runs


def _report(values: dict, budgets: dict | None = None) -> dict:
    """A tuned study.json with fixed numbers: method -> per-seed values at the budgets' one step."""
    budgets = budgets or {"1x": 10}
    step = list(budgets.values())[0]
    methods = list(values)
    point = {"learning_rate": 1e-3, "beta": 0.1}
    final = {m: {"kept": {b: point for b in budgets}, "runs": _runs(v, step)} for m, v in values.items()}
    back = {"general": 100.0, "without_distractors": {"ics": 7.5, "hms": 13.9, "overall": 19.3}}
    selfmod = {"general": 100.0, "without_distractors": {"ics": 4.5, "hms": 4.4, "overall": 8.5}}
    swept = {"point": point, "stage": "learning_rate", "seeds": {"100": {b: {"ics": 7.5, "general": 100.0,
                                                                            "overall": 19.3} for b in budgets}},
             "budgets": {b: {"ics": 7.5, "general": 100.0, "overall": interval([19.3]), "moved": False}
                         for b in budgets}}
    report = {"format": FORMAT, "methods": methods, "seeds": list(range(len(next(iter(values.values()))))),
              "budgets": budgets, "curve_steps": [step], "wall_seconds": 1, "train_seconds": 1,
              "train_seconds_by_method": {m: 1 for m in methods}, "final_runs": {"trained": 1, "all": 1},
              "platform": {"torch": "x", "cpu_capability": "AVX2", "threads": "1"},
              "plan": {"dpo": step_plan("dpo", {"per_device_train_batch_size": 16, "beta": 0.5}, 200.0)},
              "backbone": {"backbone": back, "self_moderation": selfmod}, "backbone_val": BACKBONE_VAL,
              "sweep": {m: {"points": [swept], "kept": {b: point for b in budgets},
                            "moved": {b: False for b in budgets}} for m in methods},
              "final": final, "summary": summarize(final, methods, budgets), "paired": paired(final, methods, budgets)}
    report["frontier"] = frontier(report)
    report["goal"] = goal(report)
    report["compute_match"] = {}
    return report


def test_paired_comparisons_of_the_pairs():
    report = _report({"nca_p": [(90, 0), (92, 0), (94, 0)], "nca": [(80, 0), (95, 0), (70, 0)],
                      "dpo": [(10, 100), (12, 90), (14, 80)]})
    result = report["paired"]["1x"]
    assert set(result) == {"nca_p - nca", "nca_p - dpo", "nca - dpo"}
    assert result["nca_p - dpo"]["ics"]["mean"] == pytest.approx(80) and result["nca_p - dpo"]["ics"]["std"] == 0
    assert result["nca_p - dpo"]["ics"]["verdict"] == "first higher"
    assert result["nca_p - dpo"]["general"]["verdict"] == "second higher"
    assert result["nca_p - nca"]["ics"]["verdict"] == "indistinguishable"  # differences 10, -3, 24
    summary = report["summary"]["1x"]
    assert summary["nca"]["ics"]["mean"] == pytest.approx(245 / 3)
    assert summary["dpo"]["ics"]["low"] == pytest.approx(12 - 4.302653 * 2 / math.sqrt(3), abs=1e-4)


def test_the_frontier_through_the_best():
    points = [(100, 7.5), (100, 7.5), (64, 91), (23, 95), (74, 98), (10, 50), (100, 5)]
    assert pareto_front(points) == [4, 0, 1]  # (74, 98) and the two equal (100, 7.5); the rest dominated
    report = _report({"nca_p": [(90, 60), (92, 64), (94, 62)], "grpo": [(8, 100), (7, 100), (7.5, 100)],
                      "dpo": [(7.5, 100), (7.5, 99), (7.5, 98)]})
    front = {r["name"]: r["front"] for r in report["frontier"]}
    # the backbone (100, 7.5) beats DPO and GRPO (100, 7.5 means; DPO's general is lower); NCA-P is the best on ICS
    assert front == {"backbone": True, "self_moderation": False, "NCA-P 1x": True, "GRPO 1x": True, "DPO 1x": False}


def test_the_verdict_comes_from_the_numbers():
    logged = {"logged": {"frac_reward_zero_std": 0.5, "kl": 0.02}}
    budgets = {"1x": 10, "3x": 10}
    report = _report({"grpo": [(8, 100, logged), (7, 100, {"logged": {"frac_reward_zero_std": 0.7, "kl": 0.04}})],
                      "nca_p": [(90, 60, {"refusal": 30.0, "wrong_colour": 2.0, "malformed": 8.0}),
                                (92, 64, {"refusal": 26.0, "wrong_colour": 2.0, "malformed": 8.0})]}, budgets)
    g = report["goal"]
    assert g["budget"] == "3x" and g["reached"] == []
    assert g["methods"]["nca_p"]["short"] == {"ics": 0.0, "general": pytest.approx(33.0)}
    assert g["methods"]["grpo"]["logged"]["frac_reward_zero_std"] == {"mean": pytest.approx(0.6), "low": 0.5,
                                                                      "high": 0.7}
    text = verdict_text(report)
    assert "**No method reached it.**" in text and "at 3x, held-out ICS >= 90" in text
    assert "general acc. 62.0 [36.6, 87.4] (33.0 short). Limited by general ability (of its general answers: " \
        "refusal 28.0%" in text
    assert "frac_reward_zero_std 0.6 (0.5-0.7)" in text and "2 seeds, not the 10 the goal asks for" in text
    assert text.index("NCA-P:") < text.index("GRPO:")  # closest first: 33 short against 82.5
    assert "**Kept although they did not move**" in text and "GRPO at 3x" in text
    reached = _report({"sft": [(96, 97), (98, 99)], "grpo": [(8, 100), (7, 100)]}, budgets)
    text = verdict_text(reached)
    assert "**Reached by SFT.**" in text and "the 95% intervals reach below them" in text


def test_tables_mark_verdicts_across_platforms():
    report = _report({"nca_p": [(90, 0), (92, 0), (94, 0)], "nca": [(80, 0), (95, 0), (70, 0)],
                      "dpo": [(10, 100), (12, 90), (14, 80)]})
    flipped = json.loads(json.dumps(report))
    flipped["paired"]["1x"]["nca_p - nca"]["ics"]["verdict"] = "first higher"
    text = tables(report, flipped)
    assert "| 1x | NCA-P - DPO | ICS | 80.0 [80.0, 80.0] | < 0.001 | NCA-P higher | NCA-P higher |" in text
    assert "| 1x | NCA-P - NCA | ICS |" in text and "indistinguishable | NCA-P higher |" in text
    assert "11 of 12 verdicts the same" in text
    assert "yes (no point moved)" in text and "## The privacy-ability frontier" in text and "## Verdict" in text
    assert "| backbone (reference) | – | 7.5 | 100.0 | 19.3 |" in text


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
    assert report["protocol"] == "tuned" and report["format"] == 2 and report["methods"] == ["nca_p"]
    assert report["seeds"] == [0, 1] and report["budgets"] == {"1x": 2, "2x": 4} and report["curve_steps"] == [1, 2, 3, 4]
    assert {"torch", "cpu_capability", "threads", "blas"} <= set(report["platform"])
    assert report["platform"]["threads"] == "1"
    assert report["platform"]["numerics"] == NUMERICS and report["platform"]["cpu_capability"] == "AVX2"
    assert "avx512" in report["platform"] and "lscpu_model" in report["platform"]
    assert report["plan"]["nca_p"]["cases"] == 2 and report["plan"]["nca_p"]["case_tokens"] > 0

    # the validation split: the training phrasings, items and images of its own (not the held-out bench's)
    data = out / "synthetic-spy-tune"
    val = json.loads((data / "val_questions.json").read_text())["benchmark_list"]
    test = json.loads((data / "questions.json").read_text())["benchmark_list"]
    assert val and {i["benchmark_id"][0] for i in val} == {"3"}
    assert not {i["benchmark_id"] for i in val} & {i["benchmark_id"] for i in test}
    assert all("/val/" in json.dumps(i) and "/test/" not in json.dumps(i) for i in val)
    general_val = json.loads((data / "general_val.json").read_text())["data_list"]
    assert len(general_val) == 8 and all(i["image_path"].startswith("images/general_val/") for i in general_val)

    # the sweep: two learning rates, the paper's beta, each trained to the long budget and evaluated on the
    # validation split at both budgets; one kept per budget
    points = report["sweep"]["nca_p"]["points"]
    assert [p["point"]["learning_rate"] for p in points] == pytest.approx([9e-4, 2.7e-3])
    assert all(p["point"]["beta"] == 0.01 for p in points)
    assert set(report["sweep"]["nca_p"]["kept"]) == {"1x", "2x"}
    assert all(kept in [p["point"] for p in points] for kept in report["sweep"]["nca_p"]["kept"].values())
    assert report["backbone_val"]["n_general"] == 8 and report["backbone_val"]["n_ics"] >= 1
    for p in points:
        assert set(p["seeds"]["100"]) == {"1x", "2x"} and set(p["budgets"]["2x"]) == {"ics", "general", "overall",
                                                                                       "moved"}
        assert p["seeds"]["100"]["1x"]["compute_k"] < p["seeds"]["100"]["2x"]["compute_k"]  # NCA-P's logged tokens
    assert (out / "sweep" / "nca_p-lr0.0009-beta0.01-seed100" / "checkpoint-2").is_dir()
    suite = out / "suite" / "sweep" / "nca_p-lr0.0009-beta0.01-seed100" / "step4"
    answered = [json.loads(line) for line in (suite / "spy" / "without_distractors" / "run.jsonl").open()][1:]
    assert answered and all(r["image_path"].startswith("images/val/") for r in answered)
    assert not (suite / "spy" / "with_distractors").exists()
    general = [json.loads(line) for line in (suite / "synthetic_general" / "run.jsonl").open()][1:]
    assert general and all(r["id"].startswith("general_val_") for r in general)

    # the final runs: every checkpoint of the long runs evaluated (a learning curve), both settings at the end and
    # at 1x where 1x kept the same setting; else 1x has runs of its own at its setting
    final = report["final"]["nca_p"]
    runs, common = final["runs"], final.get("runs_1x")
    assert set(runs) == {"seed0", "seed1"} and final["kept"] == report["sweep"]["nca_p"]["kept"]
    assert (common is None) == (final["kept"]["1x"] == final["kept"]["2x"])
    for run in runs.values():
        assert set(run["steps"]) == {"1", "2", "3", "4"}
        assert "ics_distr" in run["steps"]["4"] and "ics_distr" not in run["steps"]["1"]
        assert ("ics_distr" in run["steps"]["2"]) == (common is None)
        assert 0 <= run["steps"]["4"]["general"] <= 100
        shares = [run["steps"]["4"][k] for k in ("refusal", "wrong_colour", "malformed")]
        assert sum(shares) == pytest.approx(100 - run["steps"]["4"]["general"])
        assert run["steps"]["4"]["train_seconds"] == run["training"]["train_runtime"]
        assert 0 < run["steps"]["2"]["compute_k"] < run["steps"]["4"]["compute_k"]
    for run in (common or {}).values():
        assert set(run["steps"]) == {"2"} and "ics_distr" in run["steps"]["2"]
    summary = report["summary"]["2x"]["nca_p"]["general"]
    assert set(summary) == {"mean", "std", "n", "low", "high"} and summary["n"] == 2
    assert report["summary"]["1x"]["nca_p"]["compute_k"]["n"] == 2
    assert (out / "runs" / "nca_p-seed1" / "checkpoint-2" / "model.safetensors").exists()
    assert {r["name"] for r in report["frontier"]} >= {"backbone", "self_moderation", "NCA-P 1x", "NCA-P 2x"}
    text = (out / "study.md").read_text()
    assert "## Sweep (validation split)" in text and "Why general-task answers are wrong" in text
    assert "## The privacy-ability frontier" in text and "## Verdict" in text and "compute (k tok)" in text
    assert (out / "study_curves.png").stat().st_size > 10_000 and (out / "study_frontier.png").stat().st_size > 10_000

    # the tables again from study.json, with another platform's verdicts beside
    alt = json.loads(json.dumps(report))
    alt["platform"]["cpu_capability"] = "default"
    alt_path = tmp_path / "alt.json"
    alt_path.write_text(json.dumps(alt))
    from train.study_tuned import main as tables_main

    tables_main(["tables", str(out / "study.json"), "--alt", str(alt_path)])

    # the cross-machine check, a cheap subset (--kept-from, one seed) in a new folder, here at the long budget's kept
    # setting and another one for 1x: the common budget gets a run of its own, and the long run repeats this study's
    # bit for bit (only the training times differ)
    kept = {"1x": {"learning_rate": 1e-5, "beta": 0.01}, "2x": report["sweep"]["nca_p"]["kept"]["2x"]}
    kept_path = tmp_path / "kept.json"
    kept_path.write_text(json.dumps({"budgets": report["budgets"], "sweep": {"nca_p": {"kept": kept}}}))
    check = run_study(tmp_path / "check", "--kept-from", str(kept_path), "--seeds", "0")
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    checked = json.loads((tmp_path / "check" / "study.json").read_text())
    final = checked["final"]["nca_p"]
    assert final["kept"] == kept and set(final["runs"]) == set(final["runs_1x"]) == {"seed0"}
    assert set(final["runs_1x"]["seed0"]["steps"]) == {"2"} and "ics_distr" in final["runs_1x"]["seed0"]["steps"]["2"]
    assert "ics_distr" not in final["runs"]["seed0"]["steps"]["2"]  # the long run does not serve 1x here
    assert checked["summary"]["1x"]["nca_p"]["ics"]["mean"] == final["runs_1x"]["seed0"]["steps"]["2"]["ics"]
    assert "own 2-step runs" in (tmp_path / "check" / "study.md").read_text()
    from train.study_tuned import compare_runs

    same = compare_runs(report, checked)
    moved = [path for path, _, _ in same["different"] if not path.startswith("runs_1x.")]  # 1x: another setting
    assert same["equal"] >= 80 and {path.rsplit(".", 1)[-1] for path in moved} <= {"train_runtime", "train_seconds"}

    # a second run trains and generates nothing, and reports the same numbers
    again = run_study(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "backbone: reusing" in again.stdout and "loading" not in again.stdout
    assert all(f"{name}: reusing" in again.stdout for name in ("nca_p-lr0.0027-beta0.01-seed100", "nca_p-seed1"))
    again_report = json.loads((out / "study.json").read_text())
    assert again_report["final"] == {"nca_p": {**report["final"]["nca_p"], **{
        key: {s: {**r, "trained": False} for s, r in runs.items()} for key, runs in report["final"]["nca_p"].items()
        if key.startswith("runs")}}}
    assert again_report["final_runs"] == {"trained": 0, "all": report["final_runs"]["all"]}

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


def test_publish_puts_the_study_on_the_page(tmp_path):
    from cli.errors import InputError
    from train.study_tuned import PAGE_BEGIN, PAGE_END, PENDING, page_block, publish

    study, docs = tmp_path / "study", tmp_path / "docs"
    study.mkdir()
    docs.mkdir()
    report = _report({"nca_p": [(90, 60), (92, 64)], "dpo": [(8, 100), (7, 100)]})
    (study / "study.json").write_text(json.dumps(report))
    for name in ("study_curves.png", "study_frontier.png"):
        (study / name).write_bytes(b"png " + name.encode())
    page = docs / "study.md"
    page.write_text(f"# The study\n\nbefore\n\n{PAGE_BEGIN}\n\n{PENDING}\n\n{PAGE_END}\n\nafter\n")
    publish(study, docs)
    text = page.read_text()
    block = text.split(PAGE_BEGIN)[1].split(PAGE_END)[0].strip()
    assert block == page_block(report) and "#### The miniature study, tuned protocol" in block
    assert "##### The privacy-ability frontier" in block and text.startswith("# The study\n\nbefore")
    assert text.endswith(f"{PAGE_END}\n\nafter\n") and json.loads((docs / "study_tuned.json").read_text()) == report
    assert (docs / "study_frontier.png").read_bytes() == b"png study_frontier.png"
    publish(study, docs)
    assert page.read_text() == text  # again: the same page
    page.write_text("no markers\n")
    with pytest.raises(InputError, match="PAGE_BEGIN"):
        publish(study, docs)
    (study / "study_frontier.png").unlink()
    with pytest.raises(InputError, match="study_frontier.png"):
        publish(study, docs)


def test_the_page_shows_what_the_study_wrote():
    """docs/study.md's results block is the published study's tables exactly (nothing typed by hand), or the note
    that the protocol has not run yet where no study of this layout is published."""
    from train.study_tuned import PAGE_BEGIN, PAGE_END, page_block, read_study

    text = (ROOT / "docs" / "study.md").read_text()
    block = text.split(PAGE_BEGIN)[1].split(PAGE_END)[0].strip()
    published = ROOT / "docs" / "study_tuned.json"
    assert block == page_block(read_study(published) if published.exists() else None)


def test_compare_counts_the_values_two_studies_share():
    """The cross-machine check's count on the issue-33 study: its backbone and two seed-0 runs hold 110 values (the
    count a second machine reproduced 108 of), each compared bit for bit; a value that moved is named."""
    from train.study_tuned import compare_runs

    recorded = json.loads((ROOT / "docs" / "study_tuned_issue33.json").read_text())
    subset = json.loads(json.dumps(recorded))
    subset["final"] = {m: {"runs": {"seed0": subset["final"][m]["runs"]["seed0"]}} for m in ("nca_p", "nca")}
    assert compare_runs(recorded, subset) == {"equal": 110, "different": []}
    subset["final"]["nca"]["runs"]["seed0"]["steps"]["30"]["ics"] += 1e-12
    result = compare_runs(recorded, subset)
    assert result["equal"] == 109 and [path for path, _, _ in result["different"]] == ["runs.nca.seed0.steps.30.ics"]
