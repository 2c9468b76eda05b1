"""The tuned study's statistics over seeds, from its final runs' per-seed values: per budget and method every metric's
summary (eval/stats.py), the learning curves, the paired differences of PAIRS, the references, the privacy-ability
frontier, GRPO's compute against DPO's and the goal. Pure functions of a study.json's values.

May import: eval (its statistics), train (the method names, the compute's tolerance rule); nothing of the study.
"""

from __future__ import annotations

from train.common import METHOD_NAMES

# metric key -> label; the keys of one evaluated checkpoint (held-out or validation), without distractors unless named
METRICS = {"ics": "ICS", "hms": "HMS", "rta": "RtA", "ata": "AtA", "general": "general acc.", "priv": "priv",
           "overall": "overall", "ics_distr": "ICS with distr.", "hms_distr": "HMS with distr.",
           "overall_distr": "overall with distr.", "refusal": "refusal %", "wrong_colour": "wrong colour %",
           "malformed": "malformed %", "compute_k": "compute (k tok)", "train_seconds": "train time (s)"}
PAIRS = (("nca_p", "nca"), ("nca_p", "dpo"), ("nca", "dpo"), ("grpo", "nca_p"), ("grpo", "dpo"))
COMPARED = ("ics", "hms", "general", "overall")
CURVES = ("ics", "hms", "general")
GOAL = {"ics": 90.0, "general": 95.0}  # issue 40's "beyond the paper", at the long budget, means over the seeds
COMPUTE_TOLERANCE = 0.2  # GRPO's compute per budget within 20% of DPO's


def budget_runs(final_m: dict, budget: str, step: int) -> dict:
    """seed -> the held-out values of a method's final runs at a budget: its own common-budget runs where it has
    them, else the long runs' checkpoint at that step."""
    runs = final_m.get("runs_1x") if budget == "1x" and final_m.get("runs_1x") else final_m["runs"]
    return {seed: r["steps"][str(step)] for seed, r in runs.items()}


def summarize(final: dict, methods: list[str], budgets: dict) -> dict:
    """budget -> method -> metric -> interval over seeds (every metric all seeds have)."""
    from eval.stats import interval

    summary = {}
    for budget, step in budgets.items():
        for m in methods:
            runs = list(budget_runs(final[m], budget, step).values())
            summary.setdefault(budget, {})[m] = {
                k: interval([r[k] for r in runs]) for k in METRICS
                if all(isinstance(r.get(k), (int, float)) for r in runs)}
    return summary


def curves(final: dict, methods: list[str], steps: list[int]) -> dict:
    """str(step) -> method -> curve metric -> interval over seeds, along the long runs (the long budget's setting)."""
    from eval.stats import interval

    result = {}
    for step in steps:
        for m in methods:
            runs = [r["steps"][str(step)] for r in final[m]["runs"].values()]
            result.setdefault(str(step), {})[m] = {k: interval([r[k] for r in runs]) for k in CURVES
                                                   if all(isinstance(r.get(k), (int, float)) for r in runs)}
    return result


def paired(final: dict, methods: list[str], budgets: dict) -> dict:
    """budget -> "a - b" -> metric -> paired difference over the seeds both have."""
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
                rows.append({"name": f"{METHOD_NAMES[m]} {budget}", "method": m, "budget": budget,
                             "general": s["general"]["mean"], "ics": s["ics"]["mean"]})
    scored = [r for r in rows if r["general"] is not None and r["ics"] is not None]
    front = set(pareto_front([(r["general"], r["ics"]) for r in scored]))
    for i, r in enumerate(scored):
        r["front"] = i in front
    return rows


def compute_match(report: dict) -> dict:
    """budget -> GRPO's mean compute against DPO's (ratio, and whether within COMPUTE_TOLERANCE), where both ran
    and their logs say it."""
    from train.compute import within

    result = {}
    for budget in budget_names(report):
        s = report["summary"][budget]
        if "grpo" not in s or "dpo" not in s or "compute_k" not in s["grpo"] or "compute_k" not in s["dpo"]:
            continue
        grpo, dpo = s["grpo"]["compute_k"]["mean"], s["dpo"]["compute_k"]["mean"]
        result[budget] = {"grpo": grpo, "dpo": dpo, "ratio": grpo / dpo, "within": within(grpo, dpo, COMPUTE_TOLERANCE)}
    return result


def goal(report: dict) -> dict:
    """Issue 40's goal at the long budget: ICS >= GOAL["ics"] with general accuracy >= GOAL["general"], means over
    the seeds. Per method: the two intervals, whether the means reach the goal (and the intervals' lower ends too),
    the shortfall of each mean, the general task's wrong answers, and GRPO's logged group statistics."""
    budget = budget_names(report)[-1]
    step = report["budgets"][budget]
    result = {"budget": budget, "goal": dict(GOAL), "methods": {}}
    for m in report["methods"]:
        s = report["summary"][budget][m]
        if "ics" not in s or "general" not in s:
            continue
        entry = {k: s[k] for k in ("ics", "general")}
        entry["reached"] = all(s[k]["mean"] >= GOAL[k] for k in GOAL)
        entry["reached_low"] = all(s[k]["low"] is not None and s[k]["low"] >= GOAL[k] for k in GOAL)
        entry["short"] = {k: max(0.0, GOAL[k] - s[k]["mean"]) for k in GOAL}
        entry["wrong"] = {k: s[k]["mean"] for k in ("refusal", "wrong_colour", "malformed") if k in s}
        logged = [r.get("logged") for r in budget_runs(report["final"][m], budget, step).values()]
        if logged and all(logged):
            keys = set.intersection(*(set(g) for g in logged))
            entry["logged"] = {k: {"mean": sum(g[k] for g in logged) / len(logged),
                                   "low": min(g[k] for g in logged), "high": max(g[k] for g in logged)}
                               for k in sorted(keys)}
        entry["n"] = s["ics"]["n"]
        result["methods"][m] = entry
    result["reached"] = [m for m, e in result["methods"].items() if e["reached"]]
    return result




def budget_names(report_or_ctx: dict) -> list[str]:
    """The budgets' names, the common one first ("1x", then e.g. "3x"; one name where the long factor is 1)."""
    return list(report_or_ctx["budgets"])
