"""Which sweep point a stage tries and which one a budget keeps: the stages' points (the learning rates, the betas,
then a 2-D refinement around the long budget's choice), how many of a point's sweep seeds meet the goal on
validation, whether a point moved privacy (validation ICS up beyond one run's measurement noise) and whether it kept
general ability (validation general accuracy within that noise of the backbone's: the goal's floor), a point's means
over its sweep seeds, and the rule that keeps one point per budget. Pure functions of validation numbers (and the
recipes' values), no training.

May import: eval (its statistics), train (the repository's root); nothing of the study.
"""

from __future__ import annotations

# the GRPOs' beta: the KL coefficient to the reference
BETA_METHODS = ("dpo", "nca", "nca_p", "grpo", "grpo_guided", "dpo_general", "nca_p_general", "sft_grpo_guided")
# The goal (issues 40, 47, 53): privacy without loss, ICS >= 90 with general accuracy >= 95, met by one seed's run
GOAL = {"ics": 90.0, "general": 95.0}
# The backbone's noise band: this many times one run's measurement noise on the validation items (eval/stats.py:
# proportion_noise at the backbone's score), a 95% band. A point moved where its ICS rose above the band (the privacy
# methods' purpose: a point that only loses general accuracy did not move), and kept general ability where its
# general accuracy did not fall below it.
NOISE_Z = 2.0
# The rules that keep a point, as the tables name them
RULES = {"goal": "most sweep seeds at goal", "floor": "highest ICS keeping general", "composite": "best composite (none kept general)",
         "still": "best composite (none moved)", "none": "the recipe's (nothing to judge)"}


def recipe_value(method: str, key: str) -> float:
    import yaml

    from train.demo import ROOT

    return float(yaml.safe_load((ROOT / "recipes" / "study" / f"{method}.yaml").read_text())[key])


def sweep_points(method: str, factors: list[float], best_lr: float | None = None) -> list[dict]:
    """The learning-rate points (best_lr None) or the beta points at best_lr, the paper's value first."""
    ordered = sorted(factors, key=lambda f: f != 1)
    if best_lr is None:
        lr = recipe_value(method, "learning_rate")
        return [{"learning_rate": lr * f, **({"beta": recipe_value(method, "beta")} if method in BETA_METHODS
                                              else {})} for f in ordered]
    return [{"learning_rate": best_lr, "beta": recipe_value(method, "beta") * f} for f in ordered]


def refinement_points(center: dict, lr_factors: list[float], beta_factors: list[float]) -> list[dict]:
    """The 2-D grid around a chosen point: its learning rate times each of lr_factors by its beta times each of
    beta_factors (a point without beta: the learning rates alone), the point itself left out; row by row, the
    learning rate's factors outermost."""
    grid = [{"learning_rate": center["learning_rate"] * f} for f in lr_factors]
    if "beta" in center:
        grid = [{**g, "beta": center["beta"] * b} for g in grid for b in beta_factors]
    return [g for g in grid if not same_point(g, center)]


def same_point(a: dict, b: dict) -> bool:
    """The same setting, up to the float rounding of factors applied in another order (3e-4 x 3 / 1.5 = 6e-4)."""
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-9 * max(abs(a[k]), abs(b[k])) for k in a)


def _band(backbone: dict, metric: str, z: float) -> float | None:
    from eval.stats import proportion_noise

    score, n = backbone.get(metric), backbone.get(f"n_{metric}")
    return None if score is None or not n else z * proportion_noise(score, n)


def moved(values: dict, backbone: dict, z: float = NOISE_Z) -> bool | None:
    """Whether a point moved privacy: its validation ICS above the backbone's by more than z times one run's
    measurement noise on those items (eval/stats.py: proportion_noise at the backbone's score over its n_ics items).
    A point that only loses general accuracy, or whose ICS falls, did not move. None where it cannot be judged
    (tiny test sets)."""
    band = _band(backbone, "ics", z)
    if band is None or values.get("ics") is None:
        return None
    return values["ics"] - backbone["ics"] > band


def keeps_general(values: dict, backbone: dict, z: float = NOISE_Z) -> bool | None:
    """Whether a point kept general ability: its validation general accuracy not below the backbone's by more than z
    times one run's measurement noise on those questions (the goal's floor). None where it cannot be judged."""
    band = _band(backbone, "general", z)
    if band is None or values.get("general") is None:
        return None
    return backbone["general"] - values["general"] <= band


def at_goal(values: dict) -> bool:
    """Whether one run's values meet the goal (GOAL: every metric at least its threshold)."""
    return all(values.get(k) is not None and values[k] >= v for k, v in GOAL.items())


def point_result(point: dict, stage: str, seeds: dict, budgets: list[str], backbone: dict) -> dict:
    """A sweep point's runs (seed -> budget -> validation values) and, per budget, what it is judged by: how many of
    its sweep seeds meet the goal on validation (`at_goal`: an outcome that flips on some seeds and not on others
    counts its flips, where a mean over two seeds was a coin toss: issue 53), the means over its sweep seeds of ICS
    and general accuracy (each seed's run counts once), the validation composite with its interval over seeds,
    whether the means moved privacy and kept general ability."""
    from eval.stats import interval

    result = {"point": point, "stage": stage, "seeds": seeds, "budgets": {}}
    for budget in budgets:
        runs = [s[budget] for s in seeds.values()]
        means = {k: (sum(r[k] for r in runs) / len(runs) if all(r.get(k) is not None for r in runs) else None)
                 for k in ("ics", "general")}
        overall = [r.get("overall") for r in runs]
        result["budgets"][budget] = {**means, "overall": interval(overall) if None not in overall else None,
                                     "at_goal": sum(at_goal(r) for r in runs), "n": len(runs),
                                     "moved": moved(means, backbone), "keeps_general": keeps_general(means, backbone)}
    return result


def select(points: list[dict], budget: str) -> dict:
    """The point kept for a budget, by the first rule that has a candidate (RULES):

    - goal: among the points with a sweep seed at the goal on validation, the most such seeds, then the highest mean
      validation ICS, then the higher general accuracy (a point with 2 of 3 seeds at 98 and one at 9 beats one at
      80, 85, 84);
    - floor: among the points that moved privacy and kept general ability, the highest mean validation ICS (ties:
      the higher general accuracy);
    - composite: none kept general ability: among the points that moved, the best mean validation composite;
    - still: no point moved: the best composite among all;
    - none: nothing can be judged (tiny test sets): the first point (the recipe's).

    `moved` / `keeps_general` None (cannot be judged) count as yes. Ties keep the earlier point (the paper's values
    come first). {"point", "moved", "rule"}."""
    at = [(p, p["budgets"][budget]) for p in points]
    goal = [(p, b) for p, b in at if b.get("at_goal")]
    moving = [(p, b) for p, b in at if b["moved"] is not False]
    floor = [(p, b) for p, b in moving if b["keeps_general"] is not False and b["ics"] is not None]
    composite = [(p, b) for p, b in moving if b["overall"] is not None]
    still = [(p, b) for p, b in at if b["overall"] is not None]
    if goal:  # max keeps the first of equals
        rule, (best, _) = "goal", max(goal, key=lambda pb: (pb[1]["at_goal"], pb[1]["ics"], pb[1]["general"] or 0.0))
    elif floor:
        rule, (best, _) = "floor", max(floor, key=lambda pb: (pb[1]["ics"], pb[1]["general"] or 0.0))
    elif composite or still:
        rule = "composite" if composite else "still"
        best, _ = max(composite or still, key=lambda pb: pb[1]["overall"]["mean"])
    else:
        rule, best = "none", points[0]
    return {"point": best["point"], "moved": best["budgets"][budget]["moved"], "rule": rule}
