"""Which sweep point a stage keeps: the points a stage tries (the learning rates, then the betas), whether a point
moved off the backbone beyond one run's measurement noise, a point's means over its sweep seeds, and the rule that
keeps one point per budget. Pure functions of validation numbers (and the recipes' values), no training.

May import: eval (its statistics), train (the repository's root); nothing of the study.
"""

from __future__ import annotations

BETA_METHODS = ("dpo", "nca", "nca_p", "grpo")  # GRPO's beta: the KL coefficient against the reference
# A sweep point moved off the backbone when its validation ICS or general accuracy is further from the backbone's than
# this many times one run's measurement noise on those items (eval/stats.py: proportion_noise): a 95% band.
NOISE_Z = 2.0


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


def moved(values: dict, backbone: dict, z: float = NOISE_Z) -> bool | None:
    """Whether validation numbers left the backbone's: ICS or general accuracy further from the backbone's than z
    times one run's measurement noise on those items (eval/stats.py: proportion_noise at the backbone's score, over
    its item counts n_ics / n_general). None where neither can be judged (tiny test sets)."""
    from eval.stats import proportion_noise

    judged = []
    for metric, count in (("ics", "n_ics"), ("general", "n_general")):
        ours, theirs, n = values.get(metric), backbone.get(metric), backbone.get(count)
        if ours is None or theirs is None or not n:
            continue
        judged.append(abs(ours - theirs) > z * proportion_noise(theirs, n))
    return any(judged) if judged else None


def point_result(point: dict, stage: str, seeds: dict, budgets: list[str], backbone: dict) -> dict:
    """A sweep point's runs (seed -> budget -> validation values) and, per budget, the means it is judged by: the
    validation composite (with its interval over seeds), ICS, general accuracy, and whether it moved."""
    from eval.stats import interval

    result = {"point": point, "stage": stage, "seeds": seeds, "budgets": {}}
    for budget in budgets:
        runs = [s[budget] for s in seeds.values()]
        means = {k: (sum(r[k] for r in runs) / len(runs) if all(r.get(k) is not None for r in runs) else None)
                 for k in ("ics", "general")}
        overall = [r.get("overall") for r in runs]
        result["budgets"][budget] = {**means, "overall": interval(overall) if None not in overall else None,
                                     "moved": moved(means, backbone)}
    return result


def select(points: list[dict], budget: str) -> dict:
    """The point kept for a budget: the best mean validation composite among the points that moved off the backbone
    (`moved`: True, or None where it cannot be judged); among all points only when none moved. Ties keep the
    earlier point (the paper's values come first). {"point", "moved"}: moved False says the kept point did not
    move because nothing did."""
    scored = [p for p in points if p["budgets"][budget]["overall"] is not None]
    if not scored:  # nothing to choose by (tiny test sets): the paper's
        return {"point": points[0]["point"], "moved": points[0]["budgets"][budget]["moved"]}
    moving = [p for p in scored if p["budgets"][budget]["moved"] is not False]
    best = max(moving or scored, key=lambda p: p["budgets"][budget]["overall"]["mean"])  # max keeps the first of equals
    return {"point": best["point"], "moved": best["budgets"][budget]["moved"]}


