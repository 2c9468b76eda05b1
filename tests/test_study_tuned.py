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
from eval.stats import bootstrap, interval, paired_difference, pareto_front, proportion_noise, t_cdf, t_quantile
from study.pins import NUMERICS
from study.protocol import FORMAT, kept_settings
from study.results import analyse, seed_outcome, seeds_needed
from study.runs import elapsed_at
from study.selection import RULES, keeps_general, moved, point_result, refinement_points, same_point, select
from study.tables import tables
from study.verdict import recommendation_text, verdict_text
from train.compute import logged_tokens, measured_rounds, run_compute, step_plan, training_compute

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




def test_mann_whitney_against_hand_counts():
    """Exact two-sided U test by enumeration: [1, 2, 3] below [4, 5, 6] is 2 of the C(6, 3) = 20 splits as extreme
    (p 0.1, as printed tables give); two seeds above ten distinct values, 2 of C(12, 2) = 66; equal samples, p 1;
    ties by midranks (U counts a tie a half)."""
    from eval.stats import mann_whitney

    assert mann_whitney([1, 2, 3], [4, 5, 6]) == {"u": 0.0, "n_a": 3, "n_b": 3, "p": pytest.approx(0.1)}
    assert mann_whitney([70.1, 64.2], [float(x) for x in range(10)])["p"] == pytest.approx(2 / 66)
    assert mann_whitney([1, 2], [1, 2])["p"] == 1.0
    assert mann_whitney([1, 2, 2], [2, 3])["u"] == 1.0  # pairs a > b: none; ties (2, 2) twice: 2 x 0.5


def test_general_answer_breakdown():
    records = [{"answer": "red", "response": "Red."}, {"answer": "red", "response": " blue "},
               {"answer": "red", "response": "I'm sorry, but I can't share the colour."},
               {"answer": "red", "response": "The background is red."}, {"answer": "red", "response": ""}]
    assert breakdown(records) == {"correct": 20.0, "refusal": 20.0, "wrong_colour": 20.0, "malformed": 40.0}
    assert breakdown([]) == {"correct": None, "refusal": None, "wrong_colour": None, "malformed": None}


# ------------------------------------------------------------------------------------------ the sweep's rule
BACKBONE_VAL = {"ics": 7.5, "general": 100.0, "n_ics": 67, "n_general": 100}


def _swept(lr: float, by_budget: dict, stage: str = "learning_rate", seeds: dict | None = None) -> dict:
    """A sweep point: budget -> (validation ICS, general accuracy, overall) of one seed, or `seeds`: seed -> that."""
    seeds = seeds or {"100": by_budget}
    runs = {s: {b: {"ics": i, "general": g, "overall": o} for b, (i, g, o) in v.items()} for s, v in seeds.items()}
    return point_result({"learning_rate": lr}, stage, runs, list(next(iter(seeds.values()))), BACKBONE_VAL)


def test_a_run_moves_privacy_beyond_its_measurement_noise():
    # ICS 7.5% over 67 pairs: binomial error sqrt(0.075 x 0.925 / 67) = 3.218 points; 100% over 100: one item, 1 point
    assert proportion_noise(7.5, 67) == pytest.approx(100 * math.sqrt(0.075 * 0.925 / 67))
    assert proportion_noise(100.0, 100) == 1.0 and proportion_noise(0.0, 50) == 2.0
    assert moved({"ics": 13.9, "general": 100.0}, BACKBONE_VAL) is False  # 6.4 points, within 2 x 3.218
    assert moved({"ics": 14.0, "general": 100.0}, BACKBONE_VAL) is True
    assert moved({"ics": 1.0, "general": 100.0}, BACKBONE_VAL) is False  # privacy fell: not the methods' purpose
    assert moved({"ics": None, "general": None}, BACKBONE_VAL) is None  # tiny test sets: cannot say
    # the goal's floor: general accuracy within two answers of the backbone's 100 keeps general ability
    assert keeps_general({"ics": 7.5, "general": 98.0}, BACKBONE_VAL) is True
    assert keeps_general({"ics": 7.5, "general": 97.0}, BACKBONE_VAL) is False
    assert keeps_general({"ics": 7.5, "general": None}, BACKBONE_VAL) is None


def test_a_point_that_only_loses_general_accuracy_does_not_move():
    """Issue 47: SFT's 1x setting was kept at a validation composite of 10.3 (ICS 7.5, general 10) over a point at 19.3,
    because losing general accuracy counted as moving. Now it does not move, and with nothing moved the best
    composite is kept, the rule named."""
    loser = _swept(1.8e-3, {"1x": (7.5, 10.0, 10.3)})
    still = _swept(6e-4, {"1x": (7.5, 100.0, 19.3)})
    assert loser["budgets"]["1x"]["moved"] is False and loser["budgets"]["1x"]["keeps_general"] is False
    assert select([loser, still], "1x") == {"point": {"learning_rate": 6e-4}, "moved": False, "rule": "still"}
    # a point whose ICS rose beats both, however low its composite (here it also lost general ability)
    mover = _swept(5.4e-3, {"1x": (34.3, 0.0, 0.0)})
    assert select([loser, still, mover], "1x") == {"point": {"learning_rate": 5.4e-3}, "moved": True,
                                                    "rule": "composite"}


def test_the_goal_floor_keeps_the_highest_ics_that_keeps_general_ability_and_falls_back_saying_so():
    """Among the points that moved and kept general ability, the highest ICS, even against a better composite (the
    harmonic mean that a point with 100 ICS and 55 general can win), where no sweep seed met the goal; none keeps it:
    the best composite among the movers (rule 'composite'); none moved: the best composite among all (rule 'still');
    the rule is recorded."""
    high_ics_low_general = _swept(1e-3, {"3x": (100.0, 55.0, 71.0)})
    kept_general = _swept(3e-4, {"3x": (80.0, 99.0, 60.0)})
    best = _swept(6e-4, {"3x": (87.0, 98.0, 68.0)})
    assert select([high_ics_low_general, kept_general, best], "3x") == {
        "point": {"learning_rate": 6e-4}, "moved": True, "rule": "floor"}
    assert select([high_ics_low_general, kept_general], "3x")["point"] == {"learning_rate": 3e-4}
    # equal ICS: the higher general accuracy; then the earlier point
    twin = _swept(9e-4, {"3x": (87.0, 100.0, 66.0)})
    assert select([best, twin], "3x")["point"] == {"learning_rate": 9e-4}
    assert select([best, _swept(9e-4, {"3x": (87.0, 98.0, 70.0)})], "3x")["point"] == {"learning_rate": 6e-4}
    # no mover keeps general ability: the best composite among the movers, said so
    other = _swept(2e-3, {"3x": (92.0, 40.0, 56.0)})
    assert select([other, high_ics_low_general], "3x") == {"point": {"learning_rate": 1e-3}, "moved": True,
                                                           "rule": "composite"}
    assert RULES["floor"] == "highest ICS keeping general" and "none kept general" in RULES["composite"]


def test_two_sweep_seeds_average_before_selection():
    """Each seed's run counts once: the means over the sweep seeds are what moved, keeps_general and the rules see.
    Seed 100 alone would keep the first point (ICS 89, general 100), seed 101 alone the second; averaged, the first
    (ICS 87, general 98.5) keeps general ability and the second (ICS 85, general 96) does not."""
    first = _swept(3e-4, {}, seeds={"100": {"3x": (89.0, 100.0, 70.0)}, "101": {"3x": (85.0, 97.0, 60.0)}})
    second = _swept(9e-4, {}, seeds={"100": {"3x": (81.0, 92.0, 65.0)}, "101": {"3x": (89.0, 100.0, 72.0)}})
    assert first["budgets"]["3x"]["ics"] == 87.0 and first["budgets"]["3x"]["general"] == 98.5
    assert first["budgets"]["3x"]["keeps_general"] is True and second["budgets"]["3x"]["keeps_general"] is False
    assert first["budgets"]["3x"]["overall"]["mean"] == 65.0 and first["budgets"]["3x"]["overall"]["n"] == 2
    assert select([first, second], "3x") == {"point": {"learning_rate": 3e-4}, "moved": True, "rule": "floor"}


def test_a_point_is_ranked_by_how_many_sweep_seeds_meet_the_goal():
    """Issue 53: a bimodal outcome (a seed flips to the goal or does not) lost on its mean (lr 3e-4: validation ICS
    98.5 and 9.0, mean 53.7, against 70.1 and 64.2). Now a point is ranked by how many of its sweep seeds meet the goal
    on validation (ICS >= 90 with general >= 95), then by its mean ICS, then general accuracy: 2 of 3 seeds at 98 and
    one at 9 beat 67, 68, 66, and beat a steady point closer to the goal (80, 85, 84) whose mean is higher."""
    def three(lr, *ics, general=100.0):
        return _swept(lr, {}, seeds={str(100 + i): {"3x": (x, general, 50.0)} for i, x in enumerate(ics)})

    flips = three(3e-4, 98.0, 98.0, 9.0)
    steady = three(1e-4, 67.0, 68.0, 66.0)
    closer = three(2e-4, 80.0, 85.0, 84.0)
    assert flips["budgets"]["3x"]["at_goal"] == 2 and steady["budgets"]["3x"]["at_goal"] == 0
    assert closer["budgets"]["3x"]["ics"] > flips["budgets"]["3x"]["ics"]
    assert select([steady, flips], "3x") == {"point": {"learning_rate": 3e-4}, "moved": True, "rule": "goal"}
    assert select([closer, steady, flips], "3x")["point"] == {"learning_rate": 3e-4}
    # more seeds at the goal first, then the mean ICS, then general accuracy
    all_three = three(9e-4, 92.0, 91.0, 90.0)
    assert select([flips, all_three], "3x")["point"] == {"learning_rate": 9e-4}
    one_high = three(6e-4, 100.0, 9.0, 9.0)
    two_low = three(7e-4, 90.0, 90.0, 9.0)
    assert select([one_high, two_low], "3x")["point"] == {"learning_rate": 7e-4}
    same_general = three(5e-4, 98.0, 98.0, 9.0, general=99.0)
    assert select([same_general, flips], "3x")["point"] == {"learning_rate": 3e-4}
    # a seed at 98 ICS but general 94 is not at the goal
    assert three(4e-4, 98.0, 98.0, 98.0, general=94.0)["budgets"]["3x"]["at_goal"] == 0
    assert RULES["goal"] == "most sweep seeds at goal"


def test_the_refinement_points_around_the_long_budgets_choice():
    grid = refinement_points({"learning_rate": 3e-4, "beta": 1.5}, [1 / 1.5, 1, 1.5], [1 / 3, 1, 3])
    assert [(round(p["learning_rate"], 10), round(p["beta"], 10)) for p in grid] == [
        (2e-4, 0.5), (2e-4, 1.5), (2e-4, 4.5), (3e-4, 0.5), (3e-4, 4.5), (4.5e-4, 0.5), (4.5e-4, 1.5), (4.5e-4, 4.5)]
    assert refinement_points({"learning_rate": 6e-4}, [1 / 1.5, 1, 1.5], [1 / 3, 1, 3]) == [
        {"learning_rate": pytest.approx(4e-4)}, {"learning_rate": pytest.approx(9e-4)}]  # SFT: no beta
    assert refinement_points({"learning_rate": 6e-4}, [1], [1 / 3, 1, 3]) == []
    assert same_point({"learning_rate": 3e-4 * 3 / 1.5}, {"learning_rate": 6e-4})  # rounding is not another point


def _fixed_sweep(monkeypatch, values: dict, ctx: dict, seen: list | None = None) -> dict:
    """The sweep's own loop for DPO, each run replaced by fixed validation numbers (no training): values[(lr, beta)]
    is budget -> (ICS, general, overall), or seed -> that."""
    from study import protocol, runs

    def run(ctx, method, point, seed):
        v = values[(round(point["learning_rate"], 10), round(point["beta"], 10))]
        v = v.get(seed, v)
        if seen is not None:
            seen.append((round(point["learning_rate"], 10), round(point["beta"], 10), seed))
        return {b: {"ics": i, "general": g, "overall": o} for b, (i, g, o) in v.items()}

    monkeypatch.setattr(runs, "sweep_task", run)
    ctx = {"budgets": {"1x": 30, "3x": 90}, "lr_factors": [1 / 3, 1, 3], "beta_factors": [1, 3], "sweep_seeds": [100],
           "refine_lr_factors": [1], "refine_beta_factors": [1], "jobs": 1, "steps": 30, "long_steps": 90, **ctx}
    return protocol.sweep(ctx, ["dpo"], BACKBONE_VAL, log=lambda message: None)["dpo"]


def test_the_sweep_chooses_each_budget_on_its_own_numbers(monkeypatch):
    """The learning rates first, the beta at the learning rate the long budget keeps, and each budget's kept point
    from its own numbers."""
    values = {(1e-4, 0.5): {"1x": (7.5, 100.0, 19.3), "3x": (7.5, 100.0, 19.3)},  # never moves
              (3e-4, 0.5): {"1x": (30.0, 95.0, 40.0), "3x": (80.0, 60.0, 50.0)},
              (9e-4, 0.5): {"1x": (50.0, 20.0, 25.0), "3x": (92.0, 85.0, 75.0)},
              (9e-4, 1.5): {"1x": (40.0, 30.0, 30.0), "3x": (94.0, 88.0, 78.0)}}
    swept = _fixed_sweep(monkeypatch, values, {})
    tried = [(round(p["point"]["learning_rate"], 8), p["point"]["beta"]) for p in swept["points"]]
    assert tried == [(3e-4, 0.5), (1e-4, 0.5), (9e-4, 0.5), (9e-4, 1.5)]  # beta at 3x's lr (9e-4), not 1x's (3e-4)
    assert swept["kept"]["1x"] == {"learning_rate": 3e-4, "beta": 0.5}
    assert swept["kept"]["3x"] == {"learning_rate": 9e-4, "beta": 1.5} and swept["moved"] == {"1x": True, "3x": True}
    assert swept["rule"] == {"1x": "composite", "3x": "composite"}


def test_the_sweep_refines_in_two_dimensions_around_the_long_budgets_choice(monkeypatch):
    """After the coordinate stages, the grid lr x {1/1.5, 1, 1.5} by beta x {1/3, 1, 3} around the 3x choice, on both
    sweep seeds, without the points already tried (NCA's beta: 0.01 x 3 / 3 is 0.009999999999999998 in floats, the
    same point); the kept point is chosen among all stages. Issue 47's case: lr 9e-4 with the larger beta was never
    tried coordinate-wise, and the refinement around (6e-4, 0.03) finds it."""
    back = {"1x": (7.5, 100.0, 19.3), "3x": (7.5, 100.0, 19.3)}
    values = {(2e-4, 0.01): back, (6e-4, 0.01): {"1x": (7.5, 100.0, 19.3), "3x": (79.0, 100.0, 63.5)},
              (1.8e-3, 0.01): {"1x": (4.5, 74.0, 14.2), "3x": (7.5, 50.0, 23.6)},
              (6e-4, 0.03): {"1x": (7.5, 91.0, 19.1), "3x": (90.0, 100.0, 71.3)}}
    values.update({(round(6e-4 * a, 10), round(0.03 * b, 10)): back for a in (1 / 1.5, 1, 1.5) for b in (1 / 3, 1, 3)
                   if (a, b) != (1, 1) and (a, b) != (1, 1 / 3)})
    values[(9e-4, 0.03)] = {"1x": (7.5, 100.0, 19.3), "3x": {100: (99.0, 100.0, 72.0), 101: (97.0, 99.0, 71.0)}}
    values = {k: {s: {b: (v[b][s] if isinstance(v[b], dict) else v[b]) for b in v} for s in (100, 101)}
              for k, v in values.items()}
    seen = []
    monkeypatch.setattr("study.selection.recipe_value", lambda m, k: {"learning_rate": 6e-4, "beta": 0.01}[k])
    swept = _fixed_sweep(monkeypatch, values, {"sweep_seeds": [100, 101], "refine_lr_factors": [1 / 1.5, 1, 1.5],
                                               "refine_beta_factors": [1 / 3, 1, 3]}, seen)
    stages = [p["stage"] for p in swept["points"]]
    assert stages == ["learning_rate"] * 3 + ["beta"] + ["refine"] * 7  # (6e-4, 0.01) was tried: 8 - 1
    refined = [(round(p["point"]["learning_rate"], 10), round(p["point"]["beta"], 10)) for p in swept["points"][4:]]
    assert (9e-4, 0.03) in refined and (6e-4, 0.01) not in refined and len(set(refined)) == 7
    assert len(seen) == 2 * 11 and {s for *_, s in seen} == {100, 101}
    assert swept["kept"]["3x"] == {"learning_rate": pytest.approx(9e-4), "beta": pytest.approx(0.03)}
    assert swept["rule"]["3x"] == "goal" and swept["rule"]["1x"] == "still"  # both sweep seeds of (9e-4, 0.03) at it


def test_a_comment_only_recipe_edit_keeps_the_digest(tmp_path):
    """Issue 47: the published study recorded the raw bytes' digest of recipes/study/grpo.yaml, so a comment-only edit
    since refused its resumption. The digest is over the parsed values: comments and key order leave it, a value
    changes it."""
    from study.protocol import recipe_digest

    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 3.0e-4\nbeta: 0.04  # the KL\n")
    digest = recipe_digest(recipe)
    recipe.write_text("# a comment about why\nbeta: 0.04\nlearning_rate: 3.0e-4  # moved, reworded\n")
    assert recipe_digest(recipe) == digest
    recipe.write_text("learning_rate: 3.0e-4\nbeta: 0.05\n")
    assert recipe_digest(recipe) != digest


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
    generation rounds per step issue 47's study's GRPO took with dynamic sampling (docs/study_tuned_issue47.json: the
    last study that ran plain GRPO)."""
    from data_prep import synthetic
    from train.compute import study_plan
    from train.tiny_model import DEMO_CONFIG, build_tiny_model

    rounds = measured_rounds(json.loads((ROOT / "docs" / "study_tuned_issue47.json").read_text()))
    assert rounds is not None and rounds > 1  # dynamic sampling is on in the study and drew more prompts
    data = synthetic.build(tmp_path / "data", 2, 1, general_train=100, general_test=8)
    model = build_tiny_model(tmp_path / "model", corpus=synthetic.text_corpus(general=True), **DEMO_CONFIG)
    plan = study_plan(data, model, ROOT / "recipes" / "study", ["dpo", "grpo"], sample=300, rounds=rounds)
    assert plan["dpo"]["cases"] == 16 and plan["dpo"]["case_tokens"] > 100
    assert abs(plan["grpo"]["ratio_to_dpo"] - 1) <= 0.2, (rounds, plan)


def _recorded(wall: float, **extra) -> dict:
    """A recorded study of layout 2 with fixed timings: DPO (two final runs of 30 steps, 30 and 36 s: 1.1 s a step;
    one sweep run, 33 s) and GRPO (one final run, 60 s: 2 s a step at the plan's 24 samples)."""
    point = {"learning_rate": 1e-3, "beta": 0.1}
    run = lambda seconds: {"training": {"train_runtime": seconds}, "steps": {}}  # noqa: E731
    return {"format": 2, "budgets": {"1x": 10, "3x": 30}, "curve_steps": [10, 20, 30], "methods": ["dpo", "grpo"],
            "plan": {"grpo": {"cases": 24}}, "wall_seconds": wall, "final_runs": {"trained": 3, "all": 3},
            "sweep": {"dpo": {"points": [{"seeds": {"100": {"3x": {"train_seconds": 33.0}}}}]}},
            "final": {"dpo": {"kept": {"1x": point, "3x": point}, "runs": {"seed0": run(30.0), "seed1": run(36.0)}},
                      "grpo": {"kept": {"1x": point, "3x": point}, "runs": {"seed0": run(60.0)}}}, **extra}


def test_the_estimate_reads_a_recorded_study_against_hand_computations():
    """Training per step from the recorded final runs; the overhead (OVERHEAD_SECONDS: per sweep run a launch and two
    validation evaluations, 38.5 s; per final run of 3 curve points serving both budgets a launch, one evaluation
    without and two with distractors, 56.3 s) scaled by the factor the recorded wall time leaves for it: with --jobs 2
    and 378 s before the sweep, (509.35 - 378) x 2 - 159 s of training = 103.7 s = 0.5 x 207.4."""
    from study.estimate import OVERHEAD_SECONDS, calibration, estimate, step_seconds

    assert OVERHEAD_SECONDS["backbone"] == 378.0
    recorded = _recorded(509.35)
    scale, basis = calibration(recorded)
    assert scale == pytest.approx(0.5) and "measured wall time (509 s with --jobs 2 (assumed)" in basis
    assert step_seconds(recorded, ["dpo", "grpo"], {"grpo": 48}) == {"dpo": pytest.approx(1.1),
                                                                     "grpo": pytest.approx(4.0)}
    assert step_seconds(recorded, ["grpo_guided"], {"grpo_guided": 12})["grpo_guided"] == pytest.approx(1.0)
    # DPO: 3 learning rates + 1 beta, two sweep seeds: 8 runs of 30 x 1.1 + 0.5 x 38.5 s; 3 final runs of
    # 33 + 0.5 x 56.3 s; 378 + (418 + 183.45) / 2
    e = estimate(recorded, ["dpo"], 2, 3, 2, refine_new={"dpo": 0}, steps=10, factor=3)
    assert e["counts"]["sweep"] == {"dpo": 8} and e["counts"]["final"] == {"dpo": 3}
    assert e["total"] == pytest.approx(378 + (8 * 52.25 + 3 * 61.15) / 2)
    assert e["each_common"] == {"dpo": pytest.approx(3 * (11 + 0.5 * (15.5 + 16.7)) / 2)}
    assert estimate(recorded, ["dpo"], 2, 3, 2, steps=10, factor=3)["counts"]["points"] == {"dpo": 11}  # + 7 refined
    # a study that records its runs' wall times (layout 3) is calibrated on the runs it trained, not on reused ones
    timed = _recorded(1.0, format=3)
    timed["final"]["dpo"]["runs"]["seed0"].update(trained=True, wall_seconds=30.0 + 56.3 * 0.8)
    timed["final"]["dpo"]["runs"]["seed1"].update(trained=False, wall_seconds=1.0)
    timed["final"]["grpo"]["runs"]["seed0"].update(trained=False, wall_seconds=1.0)
    timed["sweep"]["dpo"]["points"][0]["seeds"]["100"].update(trained=False, wall_seconds=0.5)
    assert calibration(timed) == (pytest.approx(0.8), "its 1 runs' own wall times")
    assert calibration({**_recorded(100.0), "final_runs": {"trained": 1, "all": 3}})[0] == 1.0  # partial: as measured


def test_the_estimate_comes_within_25_percent_of_a_study_it_did_not_read():
    """Issue 47: from the published file the estimate printed 58 / 73 min for a study that ran in 38. Now, from each of
    the two complete studies recorded in one invocation each on the development machine of issue 40
    (docs/study_tuned_issue40.json: GRPO at 24 samples, 2288 s; docs/study_tuned_32samples.json: commit b57f87b's, GRPO
    at 32, 2669 s), the other's own runs are estimated within 25% of its measured wall time (0.93x and 1.06x)."""
    from study.estimate import check

    published = json.loads((ROOT / "docs" / "study_tuned_issue40.json").read_text())
    earlier = json.loads((ROOT / "docs" / "study_tuned_32samples.json").read_text())
    assert earlier["plan"]["grpo"]["cases"] == 32 and earlier["wall_seconds"] == pytest.approx(2668.8)
    for evidence, other in ((published, earlier), (earlier, published)):
        assert abs(check(evidence, other)["ratio"] - 1) <= 0.25


def test_the_estimate_is_not_checked_against_a_resumed_study(tmp_path):
    """A resumed study's wall_seconds is its last invocation's: `check` against it would compare the whole protocol's
    estimate with a part of it, so it refuses, naming the study checked and what its last invocation trained; and its
    phase before the sweep (the backbone reused) is not taken as that phase's time."""
    from cli.errors import InputError
    from study import tuned
    from study.estimate import OVERHEAD_SECONDS, backbone_seconds, check

    resumed = _recorded(500.0, format=3, sweep_runs={"trained": 0, "all": 1}, phases={"backbone": 0.2})
    assert backbone_seconds(resumed) == OVERHEAD_SECONDS["backbone"]  # reused there: not a measure of the phase
    assert backbone_seconds({**resumed, "sweep_runs": {"trained": 1, "all": 1}}) == 0.2
    with pytest.raises(ValueError, match="trained 0 of its 1 sweep runs"):
        check(_recorded(500.0), resumed)
    (tmp_path / "recorded.json").write_text(json.dumps(_recorded(500.0)))
    (tmp_path / "resumed.json").write_text(json.dumps(resumed))
    with pytest.raises(InputError, match="resumed.json.*wall_seconds.*was resumed"):
        tuned.main(["estimate", str(tmp_path / "recorded.json"), "--check", str(tmp_path / "resumed.json")])


def test_the_estimate_command_names_its_source_and_takes_seeds_as_a_list(capsys):
    from study import tuned

    tuned.main(["estimate", str(ROOT / "docs" / "study_tuned_issue47.json"), "--seeds", "0", "1", "2", "--sweep-seeds", "100",
                "--methods", "dpo", "nca_p", "--own-1x", "dpo"])
    out = capsys.readouterr().out
    assert "reads" in out and "a recorded study" in out and "not this machine" in out
    assert "final: 9 runs" in out and "sweep: 8 runs (8 points)" in out  # 6 long + DPO's 3 at 1x; no refinement
    tuned.main(["estimate", str(ROOT / "docs" / "study_tuned_issue47.json"), "--sweep-seeds", "100", "--methods", "dpo",
                "nca_p",
                "--refine-lr-factors", "0.6667", "1", "1.5", "--refine-beta-factors", "0.3333", "1", "3"])
    assert "sweep: 22 runs (22 points)" in capsys.readouterr().out  # the protocol's grid: 7 more points each
    parser = None
    import argparse

    def catch(self, *args, **kwargs):
        nonlocal parser
        parser = self
        raise SystemExit(0)

    original = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = catch
    try:
        with pytest.raises(SystemExit):
            tuned.main(["estimate"])
    finally:
        argparse.ArgumentParser.parse_known_args = original
    estimate_parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["estimate"]
    assert all(action.help for action in estimate_parser._actions), "an option of estimate without help"
    assert estimate_parser._option_string_actions["--seeds"].nargs == "+"


def test_guided_grpo_is_a_method_with_its_group_statistics_and_compute_match():
    """Guided GRPO (issue 45; recipes/study/grpo_guided.yaml, train/grpo.py) as the study's sixth method: GRPO's script
    and kind, swept on its KL beta, paired with GRPO, DPO and NCA-P; its logged group statistics per run (the share of
    groups guided, refusal-expected groups holding a refusal, the KL: means over the logged steps up to a budget) and
    its compute against DPO's with the rule that counted its reference."""
    from study.methods import NAMES, script
    from study.results import PAIRS, compute_match
    from study.runs import group_statistics
    from study.selection import BETA_METHODS

    assert script("grpo_guided") == "grpo" and NAMES["grpo_guided"] == "Guided GRPO" and "grpo_guided" in BETA_METHODS
    assert {("grpo_guided", "grpo"), ("grpo_guided", "dpo"), ("grpo_guided", "nca_p")} <= set(PAIRS)
    history = [{"step": 5, "kl": 0.1, "guidance/guided_share": 0.5, "groups/reject_with_refusal": 0.2, "loss": 1.0},
               {"step": 10, "kl": 0.3, "guidance/guided_share": 0.25, "groups/reject_with_refusal": 0.6,
                "guidance/supervised_nll": float("nan")},
               {"step": 15, "kl": 9.0, "guidance/guided_share": 1.0}]
    assert group_statistics(history, 10) == {"kl": pytest.approx(0.2), "guidance/guided_share": 0.375,
                                             "groups/reject_with_refusal": pytest.approx(0.4)}
    report = _report({"dpo": [(8, 100, {"compute_k": 1000.0}), (8, 100, {"compute_k": 1000.0})],
                      "grpo_guided": [(8, 100, {"compute_k": 1150.0, "compute_rule": "logged"}),
                                      (8, 100, {"compute_k": 1250.0, "compute_rule": "logged"})],
                      "grpo": [(8, 100, {"compute_k": 1400.0}), (8, 100, {"compute_k": 1500.0})]})
    match = compute_match(report)["1x"]
    assert match["grpo_guided"] == {"compute": 1200.0, "dpo": 1000.0, "ratio": 1.2, "rules": ["logged"],
                                    "within": True}
    assert match["grpo"]["ratio"] == 1.45 and not match["grpo"]["within"] and match["grpo"]["rules"] == ["trained"]
    text = verdict_text(report)
    assert "Guided GRPO 1.20x DPO's at 1x" in text and "its reference counted on the rows it logged scoring" in text
    assert "GRPO 1.45x DPO's at 1x" in text and "outside the 20%" in text


def test_elapsed_time_from_the_progress_bar():
    log = (" 32%|###2      | 29/90 [00:11<00:24,  2.4it/s]\r 33%|###3      | 30/90 [00:12<00:25,  2.35it/s]\r"
           " 33%|###3      | 30/90 [00:13<00:25,  2.35it/s]\r100%|##########| 90/90 [1:02:03<00:00,  1.0it/s]")
    assert elapsed_at(log, 30, 90) == 12.0 and elapsed_at(log, 90, 90) == 3723.0
    assert elapsed_at(log, 60, 90) is None and elapsed_at("130/900 [00:09<01:00]", 30, 900) is None


# ------------------------------------------------------------------------------------------ results
def _runs(values: list, budget_step: int = 10) -> dict:
    """Final runs at one step from per-seed (ics, general) or (ics, general, extra) values (67 held-out ICS pairs)."""
    runs = {}
    for i, v in enumerate(values):
        ics, general, *extra = v
        runs[f"seed{i}"] = {"steps": {str(budget_step): {"ics": ics, "hms": ics / 2, "general": general, "n_ics": 67,
                                                         "overall": (ics + general) / 2, **(extra[0] if extra else {})}}}
    return runs


def _report(values: dict, budgets: dict | None = None) -> dict:
    """A tuned study.json with fixed numbers: method -> per-seed values at the budgets' one step, analysed."""
    budgets = budgets or {"1x": 10}
    step = list(budgets.values())[0]
    methods = list(values)
    point = {"learning_rate": 1e-3, "beta": 0.1}
    final = {m: {"kept": {b: point for b in budgets}, "runs": _runs(v, step)} for m, v in values.items()}
    back = {"general": 100.0, "without_distractors": {"ics": 7.5, "hms": 13.9, "overall": 19.3}}
    selfmod = {"general": 100.0, "without_distractors": {"ics": 4.5, "hms": 4.4, "overall": 8.5}}
    swept = point_result(point, "learning_rate", {"100": {b: {"ics": 7.5, "general": 100.0, "overall": 19.3}
                                                          for b in budgets}}, list(budgets), BACKBONE_VAL)
    report = {"format": FORMAT, "methods": methods, "seeds": list(range(len(next(iter(values.values()))))),
              "budgets": budgets, "curve_steps": [step], "wall_seconds": 1, "train_seconds": 1,
              "train_seconds_by_method": {m: 1 for m in methods}, "final_runs": {"trained": 1, "all": 1},
              "platform": {"torch": "x", "cpu_capability": "AVX2", "threads": "1"},
              "plan": {"dpo": step_plan("dpo", {"per_device_train_batch_size": 16, "beta": 0.5}, 200.0)},
              "backbone": {"backbone": back, "self_moderation": selfmod}, "backbone_val": BACKBONE_VAL,
              "sweep": {m: {"points": [swept], "kept": {b: point for b in budgets}, "moved": {b: False for b in budgets},
                            "rule": {b: "still" for b in budgets}} for m in methods},
              "final": final}
    return analyse(report)


def test_paired_comparisons_of_the_pairs():
    report = _report({"nca_p": [(90, 0), (92, 0), (94, 0)], "nca": [(80, 0), (95, 0), (70, 0)],
                      "dpo": [(10, 100), (12, 90), (14, 80)]})
    result = report["paired"]["1x"]
    assert set(result) == {"nca_p - nca", "nca_p - dpo", "nca - dpo"}
    assert result["nca_p - dpo"]["ics"]["mean"] == pytest.approx(80) and result["nca_p - dpo"]["ics"]["std"] == 0
    assert result["nca_p - dpo"]["ics"]["verdict"] == "first higher"
    assert result["nca_p - dpo"]["general"]["verdict"] == "second higher"
    assert result["nca_p - nca"]["ics"]["verdict"] == "indistinguishable"  # differences 10, -3, 24
    assert result["nca_p - dpo"]["ics"]["low"] == pytest.approx(80)  # the paired differences keep the t interval
    close = report["paired"]["1x"]["nca - dpo"]["general"]  # differences -100, -90, -80: t(2) half width 24.85
    assert (close["low"], close["high"]) == pytest.approx((-90 - 4.302653 * 10 / math.sqrt(3),
                                                           -90 + 4.302653 * 10 / math.sqrt(3)), abs=1e-4)
    summary = report["summary"]["1x"]
    assert summary["nca"]["ics"]["mean"] == pytest.approx(245 / 3) and summary["nca"]["ics"]["median"] == 80
    # a score's own interval: the percentile bootstrap (3 seeds: each value is a resampled mean with probability
    # 1/27 > 2.5%, so the 2.5th and 97.5th percentiles are the smallest and the largest seed's value)
    assert (summary["dpo"]["ics"]["low"], summary["dpo"]["ics"]["high"]) == (10, 14)


def test_bootstrap_intervals_respect_the_range_against_hand_computations():
    """Issue 47: at 3x DPO's mean ICS was 87.3 [70.6, 104.0] (Student t over bimodal seeds crosses 100). The
    percentile bootstrap over the same ten seeds stays inside [0, 100]; on small sets its quantiles are known exactly:
    two values -> each is a resampled mean with probability 1/4; {0, 0, 0, 100} -> P(mean = 100) = 1/256 < 2.5% but
    P(mean >= 75) = 13/256 > 2.5%, so [0, 75]. Seeded: the same values give the same interval."""
    dpo_3x = [100.0, 85.1, 100.0, 100.0, 25.4, 97.8, 100.0, 89.6, 100.0, 75.4]  # study_tuned_issue47.json, seeds 0-9
    t = interval(dpo_3x)
    assert round(t["mean"], 1) == 87.3 and t["high"] > 100
    b = bootstrap(dpo_3x)
    assert b["mean"] == t["mean"] and b["median"] == pytest.approx(98.9) and b["interval"] == "percentile bootstrap"
    assert 25.4 <= b["low"] < b["mean"] < b["high"] <= 100
    assert bootstrap(dpo_3x) == b and bootstrap(dpo_3x, seed=1) != b
    two = bootstrap([40.0, 90.0])
    assert (two["low"], two["high"], two["median"]) == (40.0, 90.0, 65.0)
    assert (bootstrap([0, 0, 0, 100])["low"], bootstrap([0, 0, 0, 100])["high"]) == (0.0, 75.0)
    assert bootstrap([100.0] * 10)["low"] == bootstrap([100.0] * 10)["high"] == 100.0
    assert bootstrap([42.0])["low"] is None and bootstrap([42.0])["median"] == 42.0


def test_success_per_seed_against_hand_counts():
    """Seeds meeting the goal (ICS >= 90 and general >= 95, each seed's own run) and, for the common budget, seeds that
    moved privacy (held-out ICS above the backbone's 7.5 by more than 2 x 3.218 over 67 pairs) with general >= 95;
    what each missing seed lacked; the goal reached at 9 of 10 seeds."""
    assert seed_outcome({"ics": 90.0, "general": 95.0, "n_ics": 67}, 7.5) == {
        "ics": 90.0, "general": 95.0, "hms": None, "goal": True, "goal_hms": False, "moved": True, "kept": True,
        "short": {}}
    # issue 53: of the seeds at the goal, those whose scenario privacy reaches HMS 80 too
    assert seed_outcome({"ics": 96.9, "general": 95.0, "hms": 88.1, "n_ics": 67}, 7.5)["goal_hms"] is True
    assert seed_outcome({"ics": 96.9, "general": 95.0, "hms": 79.9, "n_ics": 67}, 7.5)["goal_hms"] is False
    assert seed_outcome({"ics": 89.9, "general": 95.0, "hms": 88.1, "n_ics": 67}, 7.5)["goal_hms"] is False
    assert seed_outcome({"ics": 89.9, "general": 100.0, "n_ics": 67}, 7.5)["short"] == {"ics": pytest.approx(0.1)}
    low = seed_outcome({"ics": 13.9, "general": 99.0, "n_ics": 67}, 7.5)
    assert low["moved"] is False and low["kept"] and not low["goal"]  # 6.4 points: inside the band
    assert seed_outcome({"ics": 14.0, "general": 95.0, "n_ics": 67}, 7.5)["moved"] is True
    assert seed_outcome({"ics": 14.0, "general": 95.0}, 7.5)["moved"] is None  # no item count: cannot say
    dpo = [(100, 100), (85.1, 100), (100, 100), (100, 99.5), (25.4, 100), (97.8, 100), (100, 100), (89.6, 100),
           (100, 100), (75.4, 100)]
    sft = [(97, 100), (97.8, 100), (97, 19), (95.5, 0), (100, 99), (100, 100), (98.5, 84.5), (100, 100), (100, 39.5),
           (97.8, 100)]
    nine = [(95, 96)] * 9 + [(50, 100)]
    report = _report({"dpo": dpo, "sft": sft, "nca_p": nine}, {"1x": 10, "3x": 10})
    counted = report["success"]["3x"]
    assert (counted["dpo"]["goal"], counted["sft"]["goal"], counted["nca_p"]["goal"]) == (6, 6, 9)
    assert (counted["dpo"]["moved_kept"], counted["sft"]["moved_kept"]) == (10, 6)
    assert seeds_needed(10) == 9 and seeds_needed(5) == 5 and seeds_needed(2) == 2
    g = report["goal"]
    assert g["reached"] == ["nca_p"] and g["methods"]["dpo"]["met"] == 6 and g["methods"]["dpo"]["needed"] == 9
    assert sorted(o["ics"] for o in g["methods"]["dpo"]["misses"].values()) == [25.4, 75.4, 85.1, 89.6]
    assert report["summary"]["3x"]["dpo"]["ics"]["median"] == pytest.approx(98.9)


def test_the_frontier_through_the_best():
    points = [(100, 7.5), (100, 7.5), (64, 91), (23, 95), (74, 98), (10, 50), (100, 5)]
    assert pareto_front(points) == [4, 0, 1]  # (74, 98) and the two equal (100, 7.5); the rest dominated
    report = _report({"nca_p": [(90, 60), (92, 64), (94, 62)], "grpo": [(8, 100), (7, 100), (7.5, 100)],
                      "dpo": [(7.5, 100), (7.5, 99), (7.5, 98)]})
    front = {r["name"]: r["front"] for r in report["frontier"]}
    # the backbone (100, 7.5) beats DPO and GRPO (100, 7.5 means; DPO's general is lower); NCA-P is the best on ICS
    assert front == {"backbone": True, "self_moderation": False, "NCA-P 1x": True, "GRPO 1x": True, "DPO 1x": False}


def test_the_verdict_and_the_recommendation_come_from_the_numbers():
    budgets = {"1x": 10, "3x": 10}
    logged = {"logged": {"frac_reward_zero_std": 0.5, "kl": 0.02, "groups/reject_with_refusal": 0.4,
                         "guidance/guided_share": 0.3}}
    other = {"logged": {"frac_reward_zero_std": 0.7, "kl": 0.04, "groups/reject_with_refusal": 0.6,
                        "guidance/guided_share": 0.5}}
    report = _report({"grpo_guided": [(8, 100, logged), (7, 100, other)],
                      "nca_p": [(90, 60, {"refusal": 30.0, "wrong_colour": 2.0, "malformed": 8.0}),
                                (92, 96, {"refusal": 26.0, "wrong_colour": 2.0, "malformed": 8.0})],
                      "dpo": [(99, 100), (25, 100)]}, budgets)
    g = report["goal"]
    assert g["budget"] == "3x" and g["reached"] == [] and g["methods"]["nca_p"]["met"] == 1
    assert g["methods"]["grpo_guided"]["logged"]["kl"] == {"mean": pytest.approx(0.03), "low": 0.02, "high": 0.04}
    text = verdict_text(report)
    assert "**No method reached it at 3x.**" in text and "at least 90% of the seeds" in text
    assert "- NCA-P: 1 of 2 seeds met it (needed 2, 0 of them with HMS >= 80); ICS median 91.0" in text
    assert "The other 1: 1 short on general accuracy (at 60.0; of all its general answers: refusal 28.0%" in text
    assert "- DPO: 1 of 2 seeds met it" in text and "1 short on ICS (at 25.0)" in text
    assert "refusal-expected groups holding a refusal 0.5 (0.4-0.6)" in text and "groups guided 0.4 (0.3-0.5)" in text
    assert "KL to the reference 0.03 (0.02-0.04)" in text and "these final runs up to 3x" in text
    assert "**At 1x**" in text and "Guided GRPO 0/2" in text
    assert "3x, Guided GRPO - NCA-P: ICS" in text and "3x, Guided GRPO - DPO" in text
    assert "**Kept although they did not move**" in text
    # the recommendation: the most seeds at the goal, then the cheaper budget, then the higher general accuracy:
    # DPO and NCA-P both 1 of 2 at 1x (the runs serve both budgets here); DPO keeps general ability (100 against 78)
    advice = recommendation_text(report)
    assert advice.startswith("**Best here: DPO at 1x**: 1 of 2 seeds met the goal (short of the 2 it asks)")
    assert "**Next: NCA-P at 1x**" in advice and "worst seed 60.0" in advice
    assert "What this says about a 7B model" in advice and "does not say" in advice
    none = recommendation_text(_report({"dpo": [(7.5, 100), (8, 100)]}, budgets))
    assert none.startswith("**No method met the goal on any seed at any budget**") and "DPO at 1x, seed1" in none
    reached = _report({"sft": [(96, 97), (98, 99)], "grpo": [(8, 100), (7, 100)]}, budgets)
    assert "**Reached at 3x by SFT (2 of 2 seeds).**" in verdict_text(reached)
    assert recommendation_text(reached).startswith("**Use: SFT at 1x**: 2 of 2 seeds met the goal, 0 of them with "
                                                   "scenario privacy too (HMS >= 80); ICS median 97.0")


def test_tables_mark_verdicts_across_platforms():
    report = _report({"nca_p": [(90, 0), (92, 0), (94, 0)], "nca": [(80, 0), (95, 0), (70, 0)],
                      "dpo": [(10, 100), (12, 90), (14, 80)]})
    flipped = json.loads(json.dumps(report))
    flipped["paired"]["1x"]["nca_p - nca"]["ics"]["verdict"] = "first higher"
    text = tables(report, flipped)
    assert "| 1x | NCA-P - DPO | ICS | 80.0 [80.0, 80.0] | < 0.001 | NCA-P higher | NCA-P higher |" in text
    assert "| 1x | NCA-P - NCA | ICS |" in text and "indistinguishable | NCA-P higher |" in text
    assert "11 of 12 verdicts the same" in text
    assert "best composite (none moved)" in text and "## The privacy-ability frontier" in text
    assert "## Verdict" in text and "## Recommendation" in text and "## Every seed" in text
    assert "| backbone (reference) | – | 7.5 | 100.0 | 19.3 |" in text
    assert "| NCA-P | 1x | 90.0 / 0.0 | 92.0 / 0.0 | 94.0 / 0.0 |" in text
    assert "| NCA-P | 3 | lr 0.001, beta 0.1 | 10-step runs | 0/3 | 0/3 | 0/3 | 92.0 [90.0, 94.0] | 92.0 |" in text
    assert "percentile bootstrap" in text and "**Measured wall time**" in text


SHORT = ["--protocol", "tuned", "--methods", "nca_p", "--lr-factors", "1", "3", "--beta-factors", "1",
         "--refine-lr-factors", "1", "--refine-beta-factors", "1", "--sweep-seeds", "100", "--seeds", "0", "1", "--backbone-steps", "2", "--steps", "2", "--long-factor", "2",
         "--curve-every", "1", "--train-per-label", "1", "--test-per-label", "1", "--general-train", "8",
         "--general-test", "8", "--general-val", "8", "--max-new-tokens", "4", "--eval-limit", "30",
         "--eval-batch-size", "30", "--jobs", "2"]
TRAIN_ARGS = ["--train-args", "--logging_steps", "1", "--per_device_train_batch_size", "2"]


def run_study(out, *extra, env=None):
    command = [sys.executable, "-m", "study", "--out", str(out), *SHORT, *extra, *TRAIN_ARGS]
    return forked_python.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_tuned_study_end_to_end_reuse_and_refusal(tmp_path):
    out = tmp_path / "tuned"
    result = run_study(out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "study.json").read_text())
    assert report["protocol"] == "tuned" and report["format"] == FORMAT == 4 and report["methods"] == ["nca_p"]
    assert report["seeds"] == [0, 1] and report["budgets"] == {"1x": 2, "2x": 4} and report["curve_steps"] == [1, 2, 3, 4]
    assert {"torch", "cpu_capability", "threads", "blas"} <= set(report["platform"])
    assert report["platform"]["threads"] == "1"
    assert report["platform"]["numerics"] == NUMERICS and report["platform"]["cpu_capability"] == "AVX2"
    assert "avx512" in report["platform"] and "lscpu_model" in report["platform"]
    assert report["plan"]["nca_p"]["cases"] == 2 and report["plan"]["nca_p"]["case_tokens"] > 0

    # the validation split: items, images and phrasings of its own (not the training ones, not the held-out bench's)
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
        assert set(p["seeds"]["100"]) == {"1x", "2x", "trained", "wall_seconds"} and p["seeds"]["100"]["trained"]
        assert set(p["budgets"]["2x"]) == {"ics", "general", "overall", "moved", "keeps_general", "at_goal", "n"}
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
    assert set(summary) == {"mean", "median", "std", "n", "low", "high", "interval"} and summary["n"] == 2
    assert summary["interval"] == "percentile bootstrap" and report["success"]["2x"]["nca_p"]["n"] == 2
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
    from study.tuned import main as tables_main

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
    from study.pins import compare_runs

    same = compare_runs(report, checked)
    moved = [path for path, _, _ in same["different"] if not path.startswith("runs_1x.")]  # 1x: another setting
    assert same["equal"] >= 80 and {path.rsplit(".", 1)[-1] for path in moved} <= {"train_runtime", "train_seconds"}

    # a second run trains and generates nothing, and reports the same numbers
    again = run_study(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "backbone: reusing" in again.stdout and "loading" not in again.stdout
    assert all(f"{name}: reusing" in again.stdout for name in ("nca_p-lr0.0027-beta0.01-seed100", "nca_p-seed1"))
    again_report = json.loads((out / "study.json").read_text())

    def untimed(final: dict) -> dict:  # the same runs, their wall time (this invocation's) left out
        return {key: {s: {k: v for k, v in r.items() if k != "wall_seconds"} for s, r in runs.items()}
                if key.startswith("runs") else runs for key, runs in final.items()}

    assert untimed(again_report["final"]["nca_p"]) == untimed({**report["final"]["nca_p"], **{
        key: {s: {**r, "trained": False} for s, r in runs.items()} for key, runs in report["final"]["nca_p"].items()
        if key.startswith("runs")}})
    assert again_report["final_runs"] == {"trained": 0, "all": report["final_runs"]["all"]}
    assert again_report["sweep_runs"] == {"trained": 0, "all": report["sweep_runs"]["all"]} == {"trained": 0, "all": 2}
    assert report["sweep_runs"]["trained"] == 2 and set(report["phases"]) == {"backbone", "sweep", "final"}

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
    quick = forked_python.run([sys.executable, "-m", "study", "--out", str(out), "--seeds", "0"], cwd=ROOT,
                           capture_output=True, text=True)
    assert quick.returncode == 2 and quick.stderr.strip().splitlines() == [error]


TWO_STAGE_SHORT = ["--protocol", "tuned", "--methods", "sft_grpo_guided", "--lr-factors", "1", "--beta-factors", "1",
                   "--refine-lr-factors", "1", "--refine-beta-factors", "1", "--sweep-seeds", "100", "--seeds", "0",
                   "--backbone-steps", "2", "--steps", "3", "--long-factor", "2", "--curve-every", "1",
                   *SHORT[SHORT.index("--train-per-label"):]]


@pytest.mark.slow
def test_the_two_stage_method_end_to_end(tmp_path):
    """SFT then guided GRPO through the protocol, shortened (budgets of 3 and 6 steps: its first stage stands for 1
    and trains 2 SFT steps; its second stage 2 and 5): each seed's first stage trained once from the backbone, before
    the runs that start from it; a run's checkpoints at its own steps reported at the budget steps, with both stages'
    compute and time; its curve from the offset on."""
    out = tmp_path / "two"
    # a GRPO step takes whole groups: four samples, guided GRPO's num_generations
    train_args = [*TRAIN_ARGS[:-1], "4"]
    result = forked_python.run([sys.executable, "-m", "study", "--out", str(out), *TWO_STAGE_SHORT, *train_args],
                               cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "study.json").read_text())
    assert report["methods"] == ["sft_grpo_guided"] and report["budgets"] == {"1x": 3, "2x": 6}
    for seed in ("100", "0"):
        first = out / "first_stage" / f"sft_cold_start-seed{seed}"
        assert json.loads((first / "train_metrics.json").read_text())[-1]["step"] == 2
        assert result.stdout.count(f"sft_cold_start-seed{seed}: 2 steps") == 1
    log = (out / "runs" / "logs" / "sft_grpo_guided-seed0.log").read_text()
    assert str(out / "first_stage" / "sft_cold_start-seed0") in log  # the second stage starts from its seed's first
    run = report["final"]["sft_grpo_guided"]["runs"]["seed0"]
    assert set(run["steps"]) == {"2", "3", "4", "5", "6"}  # curve steps past the offset, at budget steps
    folder = out / "runs" / "sft_grpo_guided-seed0"
    assert (folder / "checkpoint-5").is_dir() and not (folder / "checkpoint-6").exists()
    assert all(v["first_stage_seconds"] > 0 for v in run["steps"].values())
    first = run_compute(json.loads((out / "first_stage" / "sft_cold_start-seed0" / "train_metrics.json").read_text()),
                        2, "sft", None)["compute"]
    beta = report["final"]["sft_grpo_guided"]["kept"]["2x"]["beta"]
    for budget, own in (("2", 1), ("6", 5)):  # each budget step: both stages' compute
        second = run_compute(json.loads((folder / "train_metrics.json").read_text()), own, "grpo", beta)["compute"]
        assert first > 0 and run["steps"][budget]["compute_k"] == pytest.approx((first + second) / 1000)
    sweep = report["sweep"]["sft_grpo_guided"]["points"][0]["seeds"]["100"]
    assert set(sweep) >= {"1x", "2x"} and sweep["1x"]["first_stage_seconds"] > 0
    assert report["plan"]["sft_cold_start"]["cases"] == 4 and "SFT then guided GRPO" in (out / "study.md").read_text()


def test_publish_puts_the_study_on_the_page(tmp_path):
    from cli.errors import InputError
    from study.publish import PAGE_BEGIN, PAGE_END, PENDING, page_block, publish

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


def test_the_sweep_table_shows_each_sweep_seed_not_an_interval_outside_the_range():
    """Issue 47: intervals stay inside [0, 100]. A Student t interval over a point's two sweep seeds (12.2 and 27.6:
    19.9 [-77.9, 117.7]) does not; the sweep's cell is the mean and each seed's value. Every number of the published
    study's sweep table lies in [0, 100]."""
    import re

    from eval.stats import interval
    from study.publish import read_study
    from study.tables import sweep_overall, sweep_table

    seeds = {"100": {"3x": {"overall": 12.2}}, "101": {"3x": {"overall": 27.6}}}
    assert sweep_overall(interval([12.2, 27.6]), seeds, "3x") == "19.9 (12.2, 27.6)"
    assert sweep_overall(interval([12.2]), {"100": seeds["100"]}, "3x") == "12.2"
    published = read_study(ROOT / "docs" / "study_tuned.json")
    cells = [c for line in sweep_table(published).splitlines()[2:] for c in line.split("|")[4:-2]]
    numbers = [float(x) for c in cells for x in re.findall(r"-?\d+\.\d+", c)]
    assert numbers and all(0 <= x <= 100 for x in numbers), [x for x in numbers if not 0 <= x <= 100]


def test_the_page_shows_what_the_study_wrote():
    """docs/study.md's results block is the published study's tables exactly (nothing typed by hand), or the note
    that the protocol has not run yet where no study of this layout is published."""
    from study.publish import PAGE_BEGIN, PAGE_END, page_block, read_study

    text = (ROOT / "docs" / "study.md").read_text()
    block = text.split(PAGE_BEGIN)[1].split(PAGE_END)[0].strip()
    published = ROOT / "docs" / "study_tuned.json"
    assert block == page_block(read_study(published) if published.exists() else None)


def test_compare_counts_the_values_two_studies_share():
    """The cross-machine check's count on the issue-33 study: its backbone and two seed-0 runs hold 110 values (the
    count a second machine reproduced 108 of), each compared bit for bit; a value that moved is named."""
    from study.pins import compare_runs

    recorded = json.loads((ROOT / "docs" / "study_tuned_issue33.json").read_text())
    subset = json.loads(json.dumps(recorded))
    subset["final"] = {m: {"runs": {"seed0": subset["final"][m]["runs"]["seed0"]}} for m in ("nca_p", "nca")}
    assert compare_runs(recorded, subset) == {"equal": 110, "different": []}
    subset["final"]["nca"]["runs"]["seed0"]["steps"]["30"]["ics"] += 1e-12
    result = compare_runs(recorded, subset)
    assert result["equal"] == 109 and [path for path, _, _ in result["different"]] == ["runs.nca.seed0.steps.30.ics"]
