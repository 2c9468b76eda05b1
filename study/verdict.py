"""The study's verdict and recommendation in sentences made from its numbers: the paired verdicts read as words; the
goal counted per seed (who reached it on enough seeds, or how many seeds came how close and what limited the rest,
with the GRPOs' logged group statistics from these runs); the GRPOs against the offline methods; the compute match;
and which method to use at which budget, how reliably, at what cost, and what that says about a 7B model.

May import: the study's methods, results and text.
"""

from __future__ import annotations

from study.methods import NAMES
from study.results import (
    COMPUTE_TOLERANCE,
    GOAL,
    GOAL_HMS,
    GRPO_METHODS,
    METRICS,
    budget_names,
    references,
    seeds_needed,
)
from study.text import ci, fmt, p_value

# Which rows a GRPO run's reference tokens were counted on (train/compute.py's reference_rule, recorded per run)
REFERENCE_RULES = {"trained": "the trained rows (the rule before issue 45: its reference ran on every generation "
                              "round's rows, so this undercounts it)",
                   "every round": "every generation round's rows", "logged": "the rows it logged scoring"}
# The GRPOs' logged group statistics the verdict names (runs.py's group_statistics keys), in this order
NAMED_STATISTICS = {"groups/reject_with_refusal": "refusal-expected groups holding a refusal",
                    "guidance/guided_share": "groups guided", "kl": "KL to the reference",
                    "frac_reward_zero_std": "groups without reward spread",
                    "dynamic_sampling/extra_rounds": "extra generation rounds per step"}


def verdicts(report: dict) -> dict:
    """(budget, pair, metric) -> verdict, readable."""
    result = {}
    for budget, pairs in report["paired"].items():
        for pair, metrics in pairs.items():
            a, b = pair.split(" - ")
            for k, d in metrics.items():
                word = {"first higher": f"{NAMES[a]} higher", "second higher": f"{NAMES[b]} higher"}
                result[(budget, pair, k)] = word.get(d["verdict"], d["verdict"])
    return result


def _values(misses: list[dict], key: str) -> str:
    return ", ".join(fmt(o[key]) for o in sorted(misses, key=lambda o: o[key]))


def misses_text(entry: dict) -> str:
    """What limited the seeds that missed the goal: how many fell short on each metric, at which values."""
    misses = list(entry["misses"].values())
    if not misses:
        return ""
    ics = [o for o in misses if "ics" in o["short"]]
    general = [o for o in misses if "general" in o["short"]]
    parts = []
    if ics:
        parts.append(f"{len(ics)} short on ICS (at {_values(ics, 'ics')})")
    if general:
        wrong = ", ".join(f"{METRICS[k].replace(' %', '')} {v:.1f}%" for k, v in entry["wrong"].items())
        parts.append(f"{len(general)} short on general accuracy (at {_values(general, 'general')}"
                     + (f"; of all its general answers: {wrong}" if wrong else "") + ")")
    return f"The other {len(misses)}: " + "; ".join(parts) + "."


def statistics_text(logged: dict, budget: str) -> str:
    named = [(k, label) for k, label in NAMED_STATISTICS.items() if k in logged]
    named += [(k, k) for k in logged if k.startswith(("guidance/", "guided/")) and k not in NAMED_STATISTICS]
    if not named:
        return ""
    return (f" Its runs' logged group statistics (these final runs up to {budget}: mean over the logged steps, "
            "range over seeds): " + ", ".join(f"{label} {logged[k]['mean']:.3g} ({logged[k]['low']:.3g}-"
                                              f"{logged[k]['high']:.3g})" for k, label in named) + ".")


def goal_lines(report: dict) -> list[str]:
    g = report["goal"]
    budget, lines = g["budget"], []
    order = sorted(g["methods"], key=lambda m: (-g["methods"][m]["met"], g["methods"][m]["ics"]["median"] < GOAL["ics"],
                                                -g["methods"][m]["general"]["median"]))
    if g["reached"]:
        lines.append(f"**Reached at {budget} by " + ", ".join(
            f"{NAMES[m]} ({g['methods'][m]['met']} of {g['methods'][m]['n']} seeds)" for m in g["reached"])
            + ".** Every method, most seeds at the goal first:")
    else:
        lines.append(f"**No method reached it at {budget}.** Every method, most seeds at the goal first (how many "
                     "met it, the medians, and what limited the others):")
    for m in order:
        e = g["methods"][m]
        hms = f", {e['met_hms']} of them with HMS >= {GOAL_HMS:g}" if "met_hms" in e and e["met"] else ""
        lines.append(f"- {NAMES[m]}: {e['met']} of {e['n']} seeds met it (needed {e['needed']}{hms}); ICS median "
                     f"{fmt(e['ics']['median'])}, mean {ci(e['ics'])}; general median {fmt(e['general']['median'])}, "
                     f"mean {ci(e['general'])}. " + misses_text(e) + statistics_text(e["logged"], budget))
    common = report["success"].get("1x", {})
    if common and budget != "1x":
        moved = {m: c for m, c in common.items() if c["moved_kept"]}
        lines += ["", "**At 1x** (privacy moved beyond the backbone's noise band with general accuracy >= "
                  f"{GOAL['general']:g}, per seed): " + ", ".join(
                      f"{NAMES[m]} {c['moved_kept']}/{c['n']}" for m, c in common.items()) + "; "
                  + ("no method moved privacy while keeping general ability on any seed." if not moved else
                     "most often " + NAMES[max(moved, key=lambda m: moved[m]["moved_kept"])] + ".")]
    return lines


def pair_lines(report: dict, pairs: list[str], heading: str) -> list[str]:
    """The paired differences of these pairs ("a - b") at every budget, one line each, under a heading."""
    lines = []
    for b in budget_names(report):
        for pair in pairs:
            d = report["paired"].get(b, {}).get(pair)
            if not d:
                continue
            a, o = pair.split(" - ")
            said = verdicts({"paired": {b: {pair: d}}})
            lines.append(f"- {b}, {NAMES[a]} - {NAMES[o]}: " + "; ".join(
                f"{METRICS[k]} {ci(d[k])} (p {p_value(d[k]['p'])}, {said[(b, pair, k)]})"
                for k in ("ics", "hms", "general", "overall") if k in d) + ".")
    return [heading, *lines] if lines else []


def grpo_lines(report: dict) -> list[str]:
    others = (*GRPO_METHODS, "nca_p", "dpo", "sft_general", "nca_p_general")
    return pair_lines(report, [f"{a} - {b}" for a in GRPO_METHODS for b in others if a != b],
                      "**The GRPOs** (each at its kept setting per budget) against each other and the offline "
                      "methods, paired over the seeds (difference [95% t interval], p):")


def general_lines(report: dict) -> list[str]:
    return pair_lines(report, [f"{m}_general - {m}" for m in ("sft", "dpo", "nca_p")],
                      "**The general task** (each method with a quarter of its training rows from the general task "
                      "against the same method on SPY data alone, each at its own kept setting, paired over the "
                      "seeds):")


def verdict_text(report: dict) -> str:
    """The verdict on the goal, the GRPOs against the others, the compute match, and the settings kept although
    they did not move, in sentences made from the numbers."""
    g = report["goal"]
    lines = [f"**The goal** (issues 40, 47 and 53): at {g['budget']}, held-out ICS >= {GOAL['ics']:g} with general-task "
             f"accuracy >= {GOAL['general']:g} on at least {g['share']:.0%} of the seeds (a seed counts when its own "
             f"run meets both), and how many of those seeds also reach HMS >= {GOAL_HMS:g}; at 1x, privacy moved with "
             "general accuracy >= 95.", "", *goal_lines(report)]
    for extra in (general_lines(report), grpo_lines(report)):
        if extra:
            lines += ["", *extra]
    match = report.get("compute_match", {})
    if match:
        lines += ["", "**Compute** (train/compute.py, read from each run's log): " + "; ".join(
            f"{NAMES[m]} {v['ratio']:.2f}x DPO's at {b} ({v['compute']:.0f}k against {v['dpo']:.0f}k "
            f"tokens: {'within' if v['within'] else 'outside'} the {COMPUTE_TOLERANCE:.0%} the protocol matches them "
            f"to; its reference counted on {' and '.join(REFERENCE_RULES.get(r, r) for r in v.get('rules', ['trained']))})"
            for b, methods in match.items() for m, v in methods.items()) + "."]
    still = [(m, b) for m in report["methods"] for b in budget_names(report)
             if report["sweep"][m].get("rule", {}).get(b) == "still"
             or ("rule" not in report["sweep"][m] and report["sweep"][m].get("moved", {}).get(b) is False)]
    if still:
        lines += ["", "**Kept although they did not move** (no sweep point of theirs moved privacy at that budget): "
                  + ", ".join(f"{NAMES[m]} at {b}" for m, b in still) + "."]
    return "\n".join(lines) + "\n"


def _cell(report: dict, m: str, budget: str) -> dict:
    s, c = report["summary"][budget][m], report["success"][budget][m]
    return {"method": m, "budget": budget, "goal": c["goal"], "n": c["n"], "s": s,
            "compute": s.get("compute_k", {}).get("mean"), "seeds": c["seeds"]}


def recommendation_text(report: dict) -> str:
    """Which method at which budget: the most seeds at the goal, then the cheaper budget, then the higher mean
    general accuracy, then the less compute;
    how reliably, at what cost in general ability and compute; the runner-up of another method; what this does and
    does not say about a 7B model."""
    budgets = budget_names(report)
    cells = [_cell(report, m, b) for b in budgets for m in report["methods"]]
    ranked = sorted(cells, key=lambda c: (-c["goal"], budgets.index(c["budget"]),
                                          -c["s"].get("general", {}).get("mean", 0.0), c["compute"] or 0.0))
    backbone = references(report)["backbone"]
    lines = []
    best = ranked[0] if ranked and ranked[0]["goal"] else None
    if best:
        lines.append(_choice(report, best, backbone, "Use" if best["goal"] >= seeds_needed(best["n"]) else "Best here"))
        other = next((c for c in ranked if c["goal"] and c["method"] != best["method"]), None)
        if other:
            lines += ["", _choice(report, other, backbone, "Next")]
    else:
        near = max(((c, s, o) for c in cells for s, o in c["seeds"].items() if o["ics"] is not None
                    and o["general"] is not None), key=lambda x: min(x[2]["ics"] - GOAL["ics"],
                                                                     x[2]["general"] - GOAL["general"]), default=None)
        lines.append("**No method met the goal on any seed at any budget**, so this study recommends none for privacy "
                     "without loss" + (f"; the closest single run: {NAMES[near[0]['method']]} at "
                                       f"{near[0]['budget']}, {near[1]}: ICS {fmt(near[2]['ics'])}, general "
                                       f"{fmt(near[2]['general'])}" if near else "") + ".")
    distr = [report["summary"][budgets[-1]][m].get("ics_distr", {}).get("mean") for m in report["methods"]]
    distr = [d for d in distr if d is not None]
    lines += ["", "**What this says about a 7B model**: which method moves *this* backbone (a tiny random-weight "
              f"Qwen2-VL on synthetic SPY-Tune, the rule judge, {report['budgets']['1x']} and "
              f"{report['budgets'][budgets[-1]]} steps at learning rates tuned here) and how reliably across seeds. "
              "It does not say that the settings, the budgets or the order carry over to Qwen2-VL-7B on the real "
              "SPY-Tune; what carries over is the protocol (tune each method per budget, count the seeds that meet "
              "the goal, pair the seeds). The paper's main setting, with distractors, is not reproduced at this "
              "scale" + (f" (held-out ICS with distractors at most {max(distr):.1f} on average at {budgets[-1]})"
                         if distr else "") + "."]
    return "\n".join(lines) + "\n"


def _choice(report: dict, c: dict, backbone: dict, word: str) -> str:
    s, name, b = c["s"], NAMES[c["method"]], c["budget"]
    general = [o["general"] for o in c["seeds"].values() if o["general"] is not None]
    dpo = report["summary"][b].get("dpo", {}).get("compute_k", {}).get("mean")
    needed = seeds_needed(c["n"])
    hms = sum(o.get("goal_hms", False) for o in c["seeds"].values())
    text = (f"**{word}: {name} at {b}**: {c['goal']} of {c['n']} seeds met the goal"
            + (f" (short of the {needed} it asks)" if c["goal"] < needed else "")
            + (f", {hms} of them with scenario privacy too (HMS >= {GOAL_HMS:g})" if "hms" in s else "")
            + f"; ICS median {fmt(s['ics']['median'])}, "
            f"general median {fmt(s['general']['median'])}. Its cost in general ability: mean {fmt(s['general']['mean'])}"
            f" against the backbone's {fmt(backbone['general'])}, worst seed {fmt(min(general))}. Its compute: "
            f"{fmt(c['compute'], 0)}k tokens per run"
            + (f" ({c['compute'] / dpo:.2f}x DPO's at {b})" if dpo and c["compute"] and c["method"] != "dpo" else "")
            + (f", {fmt(s['train_seconds']['mean'], 0)} s of training per run on the machine above"
               if "train_seconds" in s else "")
            + ".")
    if c["goal"] < c["n"]:
        text += f" Expect about {c['n'] - c['goal']} run(s) in {c['n']} to miss it: " + misses_text(
            {"misses": {k: o for k, o in c["seeds"].items() if not o["goal"]},
             "wrong": {k: s[k]["mean"] for k in ("refusal", "wrong_colour", "malformed") if k in s}}).removeprefix(
                 f"The other {c['n'] - c['goal']}: ")
    return text
