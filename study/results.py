"""The tuned study's statistics over seeds, from its final runs' per-seed values: per budget and method every metric's
summary (mean with its percentile-bootstrap interval, median: eval/stats.py), the learning curves, the paired
differences of PAIRS (Student t, as before), the references, the privacy-ability frontier, the GRPOs' compute
against DPO's, and the goal counted per seed. `analyse` computes all of them from a study.json's per-seed values, so
a study of an earlier layout is read with today's statistics. Pure functions of a study.json's values.

May import: eval (its statistics), train (the compute's tolerance rule); the study's methods and selection (the
noise band).
"""

from __future__ import annotations

import math

from study.methods import NAMES
from study.selection import GOAL, NOISE_Z

# metric key -> label; the keys of one evaluated checkpoint (held-out or validation), without distractors unless named
METRICS = {"ics": "ICS", "hms": "HMS", "rta": "RtA", "ata": "AtA", "general": "general acc.", "priv": "priv",
           "overall": "overall", "ics_distr": "ICS with distr.", "hms_distr": "HMS with distr.",
           "overall_distr": "overall with distr.", "refusal": "refusal %", "wrong_colour": "wrong colour %",
           "malformed": "malformed %", "compute_k": "compute (k tok)", "train_seconds": "train time (s)"}
PAIRS = (("nca_p", "nca"), ("nca_p", "dpo"), ("nca", "dpo"), ("grpo", "nca_p"), ("grpo", "dpo"),
         ("grpo_guided", "grpo"), ("grpo_guided", "dpo"), ("grpo_guided", "nca_p"),
         # issue 53: what the general task gives each method, and what the cold start gives guided GRPO
         ("sft_general", "sft"), ("dpo_general", "dpo"), ("nca_p_general", "nca_p"),
         ("sft_grpo_guided", "grpo_guided"), ("sft_grpo_guided", "sft_general"), ("sft_grpo_guided", "nca_p_general"))
COMPARED = ("ics", "hms", "general", "overall")
CURVES = ("ics", "hms", "general")
# The goal (selection.py's GOAL: held-out ICS >= 90 with general accuracy >= 95, met by one seed's run): a method
# reaches it at a budget where at least GOAL_SHARE of its seeds meet it (9 of 10); of those seeds, how many also
# reach the paper's scenario privacy (HMS >= GOAL_HMS: NCA-P's 88.1 in the paper)
GOAL_SHARE = 0.9
GOAL_HMS = 80.0
COMPUTE_TOLERANCE = 0.2  # the GRPOs' compute per budget within 20% of DPO's
GRPO_METHODS = ("grpo", "grpo_guided", "sft_grpo_guided")  # online methods whose compute is matched to DPO's


def budget_names(report_or_ctx: dict) -> list[str]:
    """The budgets' names, the common one first ("1x", then e.g. "3x"; one name where the long factor is 1)."""
    return list(report_or_ctx["budgets"])


def budget_runs(final_m: dict, budget: str, step: int) -> dict:
    """seed -> the held-out values of a method's final runs at a budget: its own common-budget runs where it has
    them, else the long runs' checkpoint at that step."""
    runs = final_m.get("runs_1x") if budget == "1x" and final_m.get("runs_1x") else final_m["runs"]
    return {seed: r["steps"][str(step)] for seed, r in runs.items()}


def _numbers(runs: list[dict], keys) -> dict:
    """key -> every run's value, for the keys all runs hold as numbers."""
    return {k: [r[k] for r in runs] for k in keys
            if runs and all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) for r in runs)}


def summarize(final: dict, methods: list[str], budgets: dict) -> dict:
    """budget -> method -> metric -> mean, median, std, n and the 95% percentile-bootstrap interval over seeds
    (every metric all seeds have)."""
    from eval.stats import bootstrap

    summary = {}
    for budget, step in budgets.items():
        for m in methods:
            runs = list(budget_runs(final[m], budget, step).values())
            summary.setdefault(budget, {})[m] = {k: bootstrap(v) for k, v in _numbers(runs, METRICS).items()}
    return summary


def curves(final: dict, methods: list[str], steps: list[int]) -> dict:
    """str(step) -> method -> curve metric -> summary over seeds, along the long runs (the long budget's setting)."""
    from eval.stats import bootstrap

    result = {}
    for step in steps:
        for m in methods:  # a two-stage method has no checkpoint before its first stage's offset
            runs = [r["steps"][str(step)] for r in final[m]["runs"].values() if str(step) in r["steps"]]
            result.setdefault(str(step), {})[m] = {k: bootstrap(v) for k, v in _numbers(runs, CURVES).items()}
    return result


def paired(final: dict, methods: list[str], budgets: dict) -> dict:
    """budget -> "a - b" -> metric -> paired difference over the seeds both have (t interval, paired t-test)."""
    from eval.stats import paired_difference

    result = {}
    for budget, step in budgets.items():
        for a, b in PAIRS:
            if a not in methods or b not in methods:
                continue
            runs_a, runs_b = budget_runs(final[a], budget, step), budget_runs(final[b], budget, step)
            for k in COMPARED:
                va = {s: r.get(k) for s, r in runs_a.items()}
                vb = {s: r.get(k) for s, r in runs_b.items()}
                if None in va.values() or None in vb.values():
                    continue
                result.setdefault(budget, {}).setdefault(f"{a} - {b}", {})[k] = paired_difference(va, vb)
    return result


def references(report: dict) -> dict:
    """The backbone and self-moderation on the held-out bench (deterministic, one run each), as METRICS keys."""
    back = report["backbone"]
    return {name: {"ics": r["without_distractors"]["ics"], "hms": r["without_distractors"]["hms"],
                   "general": r["general"], "overall": r["without_distractors"].get("overall")}
            for name, r in ((n, back[n]) for n in ("backbone", "self_moderation"))}


def seed_outcome(values: dict, backbone_ics: float | None, z: float = NOISE_Z) -> dict:
    """One seed's held-out run against the goal: `goal` (ICS >= GOAL["ics"] and general >= GOAL["general"]),
    `goal_hms` (the goal, and HMS >= GOAL_HMS), `moved` (its ICS above the backbone's by more than z times one run's
    measurement noise over its n_ics items; None where it cannot be judged), `kept` (general >= GOAL["general"]),
    and what it lacks (`short`: the metrics below the goal, in points)."""
    from eval.stats import proportion_noise

    ics, general, n = values.get("ics"), values.get("general"), values.get("n_ics")
    short = {k: GOAL[k] - values[k] for k in GOAL if values.get(k) is not None and values[k] < GOAL[k]}
    moved = None
    if ics is not None and backbone_ics is not None and n:
        moved = ics - backbone_ics > z * proportion_noise(backbone_ics, n)
    goal = ics is not None and general is not None and not short
    hms = values.get("hms")
    return {"ics": ics, "general": general, "hms": hms, "goal": goal,
            "goal_hms": goal and hms is not None and hms >= GOAL_HMS, "moved": moved,
            "kept": general is not None and general >= GOAL["general"], "short": short}


def success(report: dict) -> dict:
    """budget -> method -> per seed `seed_outcome`, and the counts: `goal` (seeds meeting the goal), `goal_hms` (those
    of them with HMS >= GOAL_HMS), `moved_kept`
    (seeds that moved privacy with general >= GOAL["general"]: the common budget's goal), `n`."""
    backbone_ics = references(report)["backbone"]["ics"]
    result = {}
    for budget, step in report["budgets"].items():
        for m in report["methods"]:
            seeds = {s: seed_outcome(v, backbone_ics) for s, v in budget_runs(report["final"][m], budget, step).items()}
            result.setdefault(budget, {})[m] = {
                "n": len(seeds), "goal": sum(o["goal"] for o in seeds.values()),
                "goal_hms": sum(o.get("goal_hms", False) for o in seeds.values()),
                "moved_kept": sum(bool(o["moved"]) and o["kept"] for o in seeds.values()), "seeds": seeds}
    return result


def seeds_needed(n: int) -> int:
    """How many of n seeds must meet the goal: GOAL_SHARE of them, rounded up (9 of 10)."""
    return math.ceil(GOAL_SHARE * n - 1e-9)


def frontier(report: dict) -> list[dict]:
    """The privacy-ability plane: held-out ICS (without distractors) against general-task accuracy, one point per
    method and budget (means over seeds) and the two references; `front` marks the Pareto front (eval/stats.py)."""
    from eval.stats import pareto_front

    rows = [{"name": name, "method": name, "budget": None, "general": v["general"], "ics": v["ics"]}
            for name, v in references(report).items()]
    for budget in budget_names(report):
        for m in report["methods"]:
            s = report["summary"][budget][m]
            if "ics" in s and "general" in s:
                rows.append({"name": f"{NAMES[m]} {budget}", "method": m, "budget": budget,
                             "general": s["general"]["mean"], "ics": s["ics"]["mean"]})
    scored = [r for r in rows if r["general"] is not None and r["ics"] is not None]
    front = set(pareto_front([(r["general"], r["ics"]) for r in scored]))
    for i, r in enumerate(scored):
        r["front"] = i in front
    return rows


def compute_match(report: dict) -> dict:
    """budget -> GRPO method -> its mean compute against DPO's (ratio, and whether within COMPUTE_TOLERANCE), where
    both ran and their logs say it, with the rules that counted its reference tokens (train/compute.py's
    `reference_rule`; "trained" where a run recorded none: the rule before issue 45, the trained rows)."""
    from train.compute import within

    result = {}
    for budget in budget_names(report):
        s = report["summary"][budget]
        for m in GRPO_METHODS:
            if m not in s or "dpo" not in s or "compute_k" not in s[m] or "compute_k" not in s["dpo"]:
                continue
            ours, dpo = s[m]["compute_k"]["mean"], s["dpo"]["compute_k"]["mean"]
            runs = budget_runs(report["final"][m], budget, report["budgets"][budget]).values()
            rules = sorted({r.get("compute_rule", "trained") for r in runs})
            result.setdefault(budget, {})[m] = {"compute": ours, "dpo": dpo, "ratio": ours / dpo, "rules": rules,
                                                "within": within(ours, dpo, COMPUTE_TOLERANCE)}
    return result


def logged_statistics(runs: list[dict]) -> dict:
    """The GRPO runs' logged group statistics (runs.py's group_statistics: means over each run's logged steps), per
    key the mean over the runs and their range; {} where a run logged none."""
    logged = [r.get("logged") for r in runs]
    if not logged or not all(logged):
        return {}
    keys = set.intersection(*(set(g) for g in logged))
    return {k: {"mean": sum(g[k] for g in logged) / len(logged), "low": min(g[k] for g in logged),
                "high": max(g[k] for g in logged)} for k in sorted(keys)}


def goal(report: dict, counted: dict) -> dict:
    """The goal at the long budget, per seed (`counted`: `success`'s). Per method: the ICS and general summaries,
    how many seeds met it and whether that is enough (`seeds_needed`), the seeds that missed with what they lacked,
    the general task's wrong answers, and the GRPOs' logged group statistics."""
    budget = budget_names(report)[-1]
    step = report["budgets"][budget]
    result = {"budget": budget, "goal": dict(GOAL), "share": GOAL_SHARE, "methods": {}}
    for m in report["methods"]:
        s, c = report["summary"][budget][m], counted[budget][m]
        if "ics" not in s or "general" not in s:
            continue
        misses = {seed: o for seed, o in c["seeds"].items() if not o["goal"]}
        result["methods"][m] = {
            "ics": s["ics"], "general": s["general"], "n": c["n"], "met": c["goal"], "met_hms": c["goal_hms"],
            "needed": seeds_needed(c["n"]),
            "reached": c["goal"] >= seeds_needed(c["n"]), "misses": misses,
            "wrong": {k: s[k]["mean"] for k in ("refusal", "wrong_colour", "malformed") if k in s},
            "logged": logged_statistics(list(budget_runs(report["final"][m], budget, step).values()))}
    result["reached"] = [m for m, e in result["methods"].items() if e["reached"]]
    return result


def analyse(report: dict) -> dict:
    """The report with every statistic computed from its final runs' per-seed values: summary, curves, paired,
    success, frontier, compute_match, goal (a study.json of an earlier layout gets today's statistics)."""
    methods, budgets, final = report["methods"], report["budgets"], report["final"]
    report = {**report, "summary": summarize(final, methods, budgets),
              "curves": curves(final, methods, report["curve_steps"]), "paired": paired(final, methods, budgets)}
    report["success"] = success(report)
    report["frontier"] = frontier(report)
    report["compute_match"] = compute_match(report)
    report["goal"] = goal(report, report["success"])
    return report
