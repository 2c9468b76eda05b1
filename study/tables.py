"""The tuned study's tables (markdown): the machine and the measured wall time, the compute plan, the sweep (which
rule kept each point), the held-out bench per budget with the seeds that meet the goal and the medians, every seed's
ICS and general accuracy, the frontier, the paired differences (another platform's verdicts beside, where given),
then the verdict and the recommendation; what `study.md` and docs/study.md's generated block hold.

May import: eval (its markdown table); the study's methods, results, verdict, pins, selection and text.
"""

from __future__ import annotations

from study.methods import NAMES
from study.pins import machine_line
from study.results import GOAL, GOAL_HMS, METRICS, budget_names, budget_runs, references
from study.selection import RULES, at_goal
from study.text import ci, fmt, p_value, point_text
from study.verdict import recommendation_text, verdict_text, verdicts

# The rule of a study from before issue 47 (layout 2), which did not record it
OLD_RULE = "issue 40's rule"
OLD_RULE_TEXT = ("*Issue 40's rule* (this study's): moved = validation ICS *or* general accuracy beyond the band, in "
                 "either direction; kept = the best mean validation composite among the points that moved.")
HMS_COLUMN = f"at goal, HMS >= {GOAL_HMS:g}"
MAIN = ("ics", "hms", "rta", "ata", "general", "priv", "overall", "ics_distr", "hms_distr", "overall_distr",
        "compute_k", "train_seconds")


def plan_table(report: dict) -> str:
    from eval.report import markdown_table

    plan = report["plan"]
    dpo = plan.get("dpo", {}).get("compute")
    rows = [{"method": NAMES[m], "cases per step": (f"{p['prompts']:g} prompts x G {p['generations']}"
                                                           if "generations" in p else f"{p['cases']}"),
             "tokens per case": fmt(p["case_tokens"]), "trained": fmt(p["trained"], 0),
             "reference": fmt(p["reference"], 0), "generated (one round)": fmt(p["generated"], 0),
             "compute per step (k tok)": fmt(p["compute"] / 1000, 2),
             "x DPO's": fmt(p["compute"] / dpo, 2) if dpo else "n/a"} for m, p in plan.items()]
    return markdown_table(rows, ["method", "cases per step", "tokens per case", "trained", "reference",
                                 "generated (one round)", "compute per step (k tok)", "x DPO's"])


def _yes(value) -> str:
    return {True: "yes", False: "no", None: "n/a"}[value]


def sweep_overall(summary: dict | None, seeds: dict, budget: str) -> str:
    """A sweep point's validation composite: the mean over its sweep seeds and, with more than one, each seed's value
    (a t interval over two seeds spans hundreds of points, outside the metric's range)."""
    values = [s[budget].get("overall") for s in seeds.values()]
    if not summary:
        return "n/a"
    text = fmt(summary["mean"])
    return text + (f" ({', '.join(fmt(v) for v in values)})" if len(values) > 1 and None not in values else "")


def seed_cells(seeds: dict, budget: str) -> str:
    """Each sweep seed's validation ICS / general accuracy at a budget, * marking a seed at the goal."""
    return ", ".join(f"{fmt(s[budget].get('ics'))}/{fmt(s[budget].get('general'))}" + ("*" if at_goal(s[budget]) else "")
                     for s in seeds.values())


def sweep_table(report: dict) -> str:
    from eval.report import markdown_table

    budgets = budget_names(report)
    rows = []
    for m in report["methods"]:
        entry = report["sweep"][m]
        for p in entry["points"]:
            row = {"method": NAMES[m], "setting": point_text(p["point"]), "stage": p["stage"]}
            for b in budgets:
                r = p["budgets"][b]
                row[f"{b} val ICS / general / overall"] = (f"{fmt(r['ics'])} / {fmt(r['general'])} / "
                                                           f"{sweep_overall(r['overall'], p['seeds'], b)}")
                row[f"{b} each seed ICS/general"] = seed_cells(p["seeds"], b)
                at = sum(at_goal(s[b]) for s in p["seeds"].values())  # layouts before 4 did not record it
                row[f"{b} seeds at goal"] = f"{at}/{len(p['seeds'])}"
                row[f"{b} moved / keeps general"] = f"{_yes(r['moved'])} / {_yes(r.get('keeps_general'))}"
                if p["point"] == entry["kept"][b]:
                    rule = entry.get("rule", {}).get(b)
                    row[f"{b} kept by"] = RULES[rule] if rule else OLD_RULE
            seeds = [s for s in p["seeds"].values()]
            computes = [[s[b].get("compute_k") for s in seeds] for b in budgets]
            row["compute"] = " / ".join(fmt(sum(c) / len(c), 0) if None not in c else "n/a" for c in computes)
            rows.append(row)
        if "from" in entry:
            for b in budgets:
                rows.append({"method": NAMES[m], "setting": point_text(entry["kept"][b]),
                             "stage": f"kept in {entry['from']}", f"{b} kept by": "--kept-from"})
    columns = ["method", "setting", "stage"]
    for b in budgets:
        columns += [f"{b} val ICS / general / overall", f"{b} each seed ICS/general", f"{b} seeds at goal",
                    f"{b} moved / keeps general", f"{b} kept by"]
    label = f"compute ({' / '.join(budgets)}, k tok)"
    return markdown_table([{**r, label: r.get("compute")} for r in rows], columns + [label])


def _counts(report: dict, budget: str, m: str) -> dict:
    c = report["success"][budget][m]
    return {"seeds at goal": f"{c['goal']}/{c['n']}", HMS_COLUMN: f"{c['goal_hms']}/{c['n']}",
            "moved, general >= 95": f"{c['moved_kept']}/{c['n']}"}


def bench_tables(report: dict, budget: str, step: int) -> list[str]:
    """The held-out bench at one budget: the references, each method's summaries with its seed counts and medians;
    why the general task's answers are wrong."""
    from eval.report import markdown_table

    summary, base = report["summary"][budget], references(report)
    rows = [{"method": f"{name} (deterministic)", "n": 1, **{METRICS[k]: fmt(v) for k, v in b.items()}}
            for name, b in base.items()]
    for m in report["methods"]:
        final, s = report["final"][m], summary[m]
        own = budget == "1x" and final.get("runs_1x")
        rows.append({"method": NAMES[m], "n": len(budget_runs(final, budget, step)),
                     "kept setting": point_text(final["kept"][budget]),
                     "runs": f"own {step}-step runs" if own else f"{report['curve_steps'][-1]}-step runs",
                     **_counts(report, budget, m),
                     "ICS median": fmt(s["ics"]["median"]) if "ics" in s else "n/a",
                     "general median": fmt(s["general"]["median"]) if "general" in s else "n/a",
                     **{METRICS[k]: ci(s.get(k), 0 if k in ("compute_k", "train_seconds") else 1) for k in METRICS}})
    columns = ["method", "n", "kept setting", "runs", "seeds at goal", HMS_COLUMN, "moved, general >= 95", "ICS",
               "ICS median",
               "general acc.", "general median", *[METRICS[k] for k in MAIN if k not in ("ics", "general")]]
    return [markdown_table(rows, columns), "", "Why general-task answers are wrong (share of answers, %):", "",
            markdown_table(rows[len(base):], ["method", "n", *[METRICS[k] for k in
                                                               ("general", "refusal", "wrong_colour", "malformed")]])]


def seeds_table(report: dict) -> str:
    """Every seed's held-out ICS / general accuracy per method and budget; * marks a seed that meets the goal."""
    from eval.report import markdown_table

    seeds = [f"seed{s}" for s in report["seeds"]]
    rows = []
    for budget in budget_names(report):
        for m in report["methods"]:
            outcome = report["success"][budget][m]["seeds"]
            row = {"method": NAMES[m], "budget": budget}
            for s in seeds:
                o = outcome.get(s)
                row[s] = "–" if o is None else f"{fmt(o['ics'])} / {fmt(o['general'])}" + (" *" if o["goal"] else "")
            rows.append(row)
    return markdown_table(rows, ["method", "budget", *seeds])


def frontier_table(report: dict) -> str:
    from eval.report import markdown_table

    rows = []
    for r in report["frontier"]:
        if r["budget"] is None:
            row = {"method": f"{r['name']} (reference)", "budget": "–", "ICS": fmt(r["ics"]),
                   "general acc.": fmt(r["general"]), "overall": fmt(references(report)[r["name"]]["overall"])}
        else:
            s = report["summary"][r["budget"]][r["method"]]
            row = {"method": NAMES[r["method"]], "budget": r["budget"], "ICS": ci(s.get("ics")),
                   "general acc.": ci(s.get("general")), "overall": ci(s.get("overall")),
                   "compute (k tok)": ci(s.get("compute_k"), 0), "train time (s)": ci(s.get("train_seconds"), 0),
                   "seeds at goal": _counts(report, r["budget"], r["method"])["seeds at goal"]}
        row["on the frontier"] = "yes" if r.get("front") else ""
        rows.append(row)
    return markdown_table(rows, ["method", "budget", "ICS", "general acc.", "overall", "seeds at goal",
                                 "compute (k tok)", "train time (s)", "on the frontier"])


def paired_table(report: dict, alt: dict | None) -> list[str]:
    from eval.report import markdown_table

    ours, theirs = verdicts(report), verdicts(alt) if alt else {}
    rows = []
    for budget, pairs in report["paired"].items():
        for pair, metrics in pairs.items():
            a, b = pair.split(" - ")
            for k, d in metrics.items():
                row = {"budget": budget, "difference": f"{NAMES[a]} - {NAMES[b]}",
                       "metric": METRICS[k], "mean [95% CI]": ci(d), "p": p_value(d["p"]),
                       "verdict": ours[(budget, pair, k)]}
                if alt:
                    row["verdict on the other platform"] = theirs.get((budget, pair, k), "n/a")
                rows.append(row)
    columns = ["budget", "difference", "metric", "mean [95% CI]", "p", "verdict"]
    lines = [markdown_table(rows, columns + (["verdict on the other platform"] if alt else []))]
    if alt:
        compared = [key for key in ours if key in theirs]
        same = [key for key in compared if theirs[key] == ours[key]]
        q = alt["platform"]
        lines += ["", f"Other platform: CPU capability {q['cpu_capability']}, {q['threads']} thread(s), torch "
                  f"{q['torch']}{machine_line(q)}, seeds {alt['seeds']}: {len(same)} of {len(compared)} verdicts "
                  "the same" + (f" ({len(ours) - len(compared)} not compared: missing there)."
                                if len(compared) < len(ours) else ".")]
    return lines


def wall_text(report: dict) -> str:
    """The measured wall time of the invocation that wrote the study, its phases, and what it trained."""
    final, sweep = report.get("final_runs", {}), report.get("sweep_runs")
    text = (f"**Measured wall time**: {report['wall_seconds']:.0f} s ({report['wall_seconds'] / 60:.0f} min) for this "
            f"invocation" + (f" with --jobs {report['jobs']}" if "jobs" in report else "")
            + (" (" + ", ".join(f"{k} {v / 60:.1f} min" for k, v in report["phases"].items()) + ")"
               if "phases" in report else "")
            + f", which trained {final.get('trained', 'n/a')} of the {final.get('all', 'n/a')} final runs"
            + (f" and {sweep['trained']} of the {sweep['all']} sweep runs" if sweep else "")
            + " (finished runs are reused); training time of the final runs: "
            f"{report['train_seconds']} s" + "".join(f"; {NAMES[m]} {t} s"
                                                     for m, t in report["train_seconds_by_method"].items()) + ".")
    return text


def head_text(report: dict) -> list[str]:
    p = report["platform"]
    lines = [f"Seeds {report['seeds']}. **Ran on**: {machine_sentence(p)}; torch {p['torch']}, CPU capability "
             f"{p['cpu_capability']}, {p['threads']} thread(s) per process{machine_line(p, cpu=False)}.", "",
             "Every score's interval is a 95% percentile bootstrap over the seeds (10,000 resamples, seeded: the "
             "same values give the same interval; it stays inside [0, 100]); the median beside it; *seeds at goal*: "
             f"the seeds whose run meets ICS >= {GOAL['ics']:g} with general accuracy >= {GOAL['general']:g}; "
             f"*at goal, HMS >= {GOAL_HMS:g}*: those of them whose scenario privacy (HMS) reaches {GOAL_HMS:g} too (the "
             "paper's NCA-P: ICS 96.9, HMS 88.1); "
             "*moved, general >= 95*: the seeds whose held-out ICS rose beyond two of one run's measurement noise "
             "from the backbone's, with general accuracy >= 95. Paired differences: Student t interval and paired "
             "t-test."]
    if report.get("format", 0) < 3:
        lines += ["", f"*This study.json is of layout {report.get('format')} (issue 40's protocol: one sweep seed, no "
                  "refinement, the sweep's rule below); its statistics here are recomputed from its per-seed values "
                  "by today's code.*"]
    return lines


def machine_sentence(p: dict) -> str:
    cpu = p.get("cpu") or {}
    name = p.get("lscpu_model") or cpu.get("model name") or p.get("processor") or "an unnamed CPU"
    kind = (f"{cpu.get('vendor_id')} family {cpu.get('cpu family')} model {cpu.get('model')}" if cpu else None)
    return (f"{name}" + (f" ({kind})" if kind else "") + (f", {p['cores']} cores" if p.get("cores") else "")
            + (f", AVX-512 {'yes' if p['avx512'] else 'no'}" if p.get("avx512") is not None else ""))


def tables(report: dict, alt: dict | None = None) -> str:
    budgets = report["budgets"]
    lines = ["# The miniature study, tuned protocol (held-out synthetic SPY-Bench, rule judge; held-out general "
             "task)", "", *head_text(report), "", wall_text(report), "",
             "## Compute per step, planned on this study's data", "",
             "Tokens through the model per optimizer step (train/compute.py: compute = 3 x trained + reference + "
             "generated, forward-token equivalents), measured on this study's training data with its tokenizer; "
             "GRPO's generation at one round (dynamic sampling's extra rounds are in the measured compute below).",
             "", plan_table(report), "## Sweep (validation split)", "",
             f"Each point trained to {budgets[budget_names(report)[-1]]} steps with a checkpoint at {budgets['1x']}, "
             "means over its sweep seeds (the composite's value per seed in parentheses) and each seed's ICS / "
             "general accuracy (* at the goal); the band: two of one "
             "run's measurement noise on those items (binomial, at the backbone's score, at least one item) around "
             "the backbone's"
             + (f" (ICS {fmt(report['backbone_val'].get('ics'))} over {report['backbone_val'].get('n_ics')} pairs, "
                f"general {fmt(report['backbone_val'].get('general'))} over "
                f"{report['backbone_val'].get('n_general')} questions)" if report.get("backbone_val") else "")
             + "; moved: ICS above the band; keeps general: general accuracy not below it; kept by: the rule that "
             "chose the point (study/selection.py): the most sweep seeds at the goal, then the highest mean ICS, then "
             "general accuracy; where no seed met it, the highest ICS among the points that moved and kept general "
             "ability, else the best composite among those that moved, else among all."
             + ("" if report.get("format", 0) >= 3 else " " + OLD_RULE_TEXT), "", sweep_table(report)]
    for budget, step in budgets.items():
        lines += ["", f"## Held-out bench at the {budget} budget ({step} steps)", "", *bench_tables(report, budget, step)]
    lines += ["", "## Every seed", "", "Held-out ICS / general accuracy of each seed's run; * meets the goal.", "",
              seeds_table(report), "## Learning curves", "",
              "![held-out ICS, HMS and general accuracy against the alignment step, per method at its long budget's "
              "setting, bands = 95% bootstrap interval over seeds](study_curves.png)", "",
              "## The privacy-ability frontier", "",
              "Held-out ICS (without distractors) against general-task accuracy, mean [95% interval] over seeds; on "
              "the frontier: no other row (references included) is at least as high on both means and higher on "
              "one.", "", frontier_table(report),
              "![held-out ICS against general-task accuracy, per method and budget, means with 95% intervals, seeds "
              "faint, the frontier dashed](study_frontier.png)", "",
              "## Paired differences (same seeds, same held-out items)", "",
              "difference of the means [95% t interval of the paired differences]; p: two-sided paired t-test; "
              "indistinguishable where the interval covers 0.", "", *paired_table(report, alt),
              "", "## Verdict", "", verdict_text(report), "## Recommendation", "", recommendation_text(report)]
    return "\n".join(lines)
