"""The study's verdict in sentences made from its numbers: the paired verdicts read as words, and the verdict on the
goal (who reached it, or how close each came and what limited it), GRPO against NCA-P and DPO, the compute match.

May import: train (the method names); the study's results and text.
"""

from __future__ import annotations

from study.protocol import SEEDS
from study.results import COMPUTE_TOLERANCE, GOAL, METRICS, budget_names
from study.text import ci, p_value
from train.common import METHOD_NAMES


def verdicts(report: dict) -> dict:
    """(budget, pair, metric) -> verdict, readable."""
    result = {}
    for budget, pairs in report["paired"].items():
        for pair, metrics in pairs.items():
            a, b = pair.split(" - ")
            for k, d in metrics.items():
                word = {"first higher": f"{METHOD_NAMES[a]} higher", "second higher": f"{METHOD_NAMES[b]} higher"}
                result[(budget, pair, k)] = word.get(d["verdict"], d["verdict"])
    return result


def verdict_text(report: dict) -> str:
    """The verdict on issue 40's goal, the best GRPO against NCA-P and DPO, and the compute match, in sentences made
    from the numbers."""
    g = report["goal"]
    budget, lines = g["budget"], []
    n = sorted({e["n"] for e in g["methods"].values()})
    seeds = f"{'/'.join(map(str, n))} seeds" + ("" if n == [SEEDS] else f", not the {SEEDS} the goal asks for")
    lines.append(f"**The goal** (issue 40): at {budget}, held-out ICS >= {GOAL['ics']:g} with general-task accuracy >= "
                 f"{GOAL['general']:g}, means over the seeds ({seeds}).")
    lines.append("")
    entry_text = {}
    for m, e in g["methods"].items():
        parts = []
        for k in GOAL:
            parts.append(f"{METRICS[k]} {ci(e[k])}" + (" (met)" if not e["short"][k] else
                                                          f" ({e['short'][k]:.1f} short)"))
        limits = []
        if e["short"]["ics"]:
            limits.append("privacy (ICS)")
        if e["short"]["general"]:
            limits.append("general ability" + (" (of its general answers: " + ", ".join(
                f"{METRICS[k].replace(' %', '')} {v:.1f}%" for k, v in e["wrong"].items()) + ")" if e["wrong"] else ""))
        text = "; ".join(parts) + (". Limited by " + " and ".join(limits) if limits else "")
        if e.get("logged"):
            text += (". Its logged group statistics (mean over the logged steps, range over seeds): " + ", ".join(
                f"{k} {v['mean']:.3g} ({v['low']:.3g}-{v['high']:.3g})" for k, v in e["logged"].items()))
        entry_text[m] = text
    if g["reached"]:
        names = ", ".join(METHOD_NAMES[m] for m in g["reached"])
        lines.append(f"**Reached by {names}.**")
        for m in g["reached"]:
            e = g["methods"][m]
            sure = ("the lower ends of both 95% intervals clear the thresholds too" if e["reached_low"] else
                    "the means clear the thresholds, the 95% intervals reach below them")
            lines.append(f"- {METHOD_NAMES[m]}: {entry_text[m]}; {sure}.")
        others = [m for m in g["methods"] if m not in g["reached"]]
        if others:
            lines += ["", "The others:"]
    else:
        lines.append("**No method reached it.** How close each came (mean [95% interval]; shortfall from the goal), "
                     "closest first:")
        others = list(g["methods"])
    for m in sorted(others, key=lambda m: sum(g["methods"][m]["short"].values())):
        lines.append(f"- {METHOD_NAMES[m]}: {entry_text[m]}.")
    pairs = [p for p in ("grpo - nca_p", "grpo - dpo") if any(p in report["paired"].get(b, {})
                                                              for b in budget_names(report))]
    if pairs:
        lines += ["", "**The best GRPO** (its kept setting per budget) against NCA-P and DPO, paired over the seeds "
                      "(difference [95% interval], p):"]
        for b in budget_names(report):
            for pair in pairs:
                d = report["paired"].get(b, {}).get(pair)
                if not d:
                    continue
                a, o = pair.split(" - ")
                said = verdicts({"paired": {b: {pair: d}}})
                lines.append(f"- {b}, {METHOD_NAMES[a]} - {METHOD_NAMES[o]}: " + "; ".join(
                    f"{METRICS[k]} {ci(d[k])} (p {p_value(d[k]['p'])}, {said[(b, pair, k)]})"
                    for k in ("ics", "general", "overall") if k in d) + ".")
    match = report.get("compute_match", {})
    if match:
        lines += ["", "**Compute** (train/compute.py): GRPO's mean compute was " + "; ".join(
            f"{v['ratio']:.2f}x DPO's at {b} ({v['grpo']:.0f}k against {v['dpo']:.0f}k tokens: "
            f"{'within' if v['within'] else 'outside'} the {COMPUTE_TOLERANCE:.0%} the protocol matches them to)"
            for b, v in match.items()) + "."]
    still = [(m, b) for m in report["methods"] for b in budget_names(report)
             if report["sweep"][m].get("moved", {}).get(b) is False]
    if still:
        lines += ["", "**Kept although they did not move** (no sweep point of theirs left the backbone at that "
                      "budget): " + ", ".join(f"{METHOD_NAMES[m]} at {b}" for m, b in still) + "."]
    return "\n".join(lines) + "\n"


