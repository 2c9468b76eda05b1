"""The tuned study's tables (markdown): the compute plan, the sweep, the held-out bench per budget, the frontier, the
paired differences (another platform's verdicts beside, where given) and the verdict, with the platform and the wall
time; what `study.md` and docs/study.md's generated block hold.

May import: eval (its markdown table), train (the method names); the study's results, verdict, pins and text.
"""

from __future__ import annotations

from study.pins import machine_line
from study.results import GOAL, METRICS, budget_names, budget_runs, references
from study.text import ci, fmt, p_value, point_text
from study.verdict import verdict_text, verdicts
from train.common import METHOD_NAMES


def plan_table(report: dict) -> str:
    from eval.report import markdown_table

    plan = report["plan"]
    dpo = plan.get("dpo", {}).get("compute")
    rows = [{"method": METHOD_NAMES[m], "cases per step": (f"{p['prompts']:g} prompts x G {p['generations']}"
                                                           if "generations" in p else f"{p['cases']}"),
             "tokens per case": fmt(p["case_tokens"]), "trained": fmt(p["trained"], 0),
             "reference": fmt(p["reference"], 0), "generated (one round)": fmt(p["generated"], 0),
             "compute per step (k tok)": fmt(p["compute"] / 1000, 2),
             "x DPO's": fmt(p["compute"] / dpo, 2) if dpo else "n/a"} for m, p in plan.items()]
    return markdown_table(rows, ["method", "cases per step", "tokens per case", "trained", "reference",
                                 "generated (one round)", "compute per step (k tok)", "x DPO's"])


def sweep_table(report: dict) -> str:
    from eval.report import markdown_table

    budgets = budget_names(report)
    rows = []
    for m in report["methods"]:
        entry = report["sweep"][m]
        for p in entry["points"]:
            row = {"method": METHOD_NAMES[m], "setting": point_text(p["point"]), "stage": p["stage"]}
            for b in budgets:
                r = p["budgets"][b]
                row[f"{b} val ICS / general / overall"] = (f"{fmt(r['ics'])} / {fmt(r['general'])} / "
                                                           f"{ci(r['overall'])}")
                row[f"{b} moved"] = {True: "yes", False: "no", None: "n/a"}[r["moved"]]
                if p["point"] == entry["kept"][b]:
                    row[f"{b} kept"] = "yes" if entry["moved"][b] is not False else "yes (no point moved)"
            computes = [[s[b].get("compute_k") for s in p["seeds"].values()] for b in budgets]
            row["compute"] = " / ".join(fmt(sum(c) / len(c), 0) if None not in c else "n/a" for c in computes)
            rows.append(row)
        if "from" in entry:
            for b in budgets:
                rows.append({"method": METHOD_NAMES[m], "setting": point_text(entry["kept"][b]),
                             "stage": f"kept in {entry['from']}", f"{b} kept": "yes"})
    columns = ["method", "setting", "stage"]
    for b in budgets:
        columns += [f"{b} val ICS / general / overall", f"{b} moved", f"{b} kept"]
    label = f"compute ({' / '.join(budgets)}, k tok)"
    return markdown_table([{**r, label: r.get("compute")} for r in rows], columns + [label])


def frontier_table(report: dict) -> str:
    from eval.report import markdown_table

    budgets = budget_names(report)
    rows = []
    for r in report["frontier"]:
        if r["budget"] is None:
            row = {"method": f"{r['name']} (reference)", "budget": "–", "ICS": fmt(r["ics"]),
                   "general acc.": fmt(r["general"]), "overall": fmt(references(report)[r["name"]]["overall"])}
        else:
            s = report["summary"][r["budget"]][r["method"]]
            row = {"method": METHOD_NAMES[r["method"]], "budget": r["budget"], "ICS": ci(s.get("ics")),
                   "general acc.": ci(s.get("general")), "overall": ci(s.get("overall")),
                   "compute (k tok)": ci(s.get("compute_k"), 0), "train time (s)": ci(s.get("train_seconds"), 0)}
            if r["budget"] == budgets[-1]:
                e = report["goal"]["methods"].get(r["method"])
                row["goal"] = "n/a" if e is None else ("met" if e["reached"] else "short: " + ", ".join(
                    f"{METRICS[k]} {v:.1f}" for k, v in e["short"].items() if v > 0))
        row["on the frontier"] = "yes" if r.get("front") else ""
        rows.append(row)
    return markdown_table(rows, ["method", "budget", "ICS", "general acc.", "overall", "compute (k tok)",
                                 "train time (s)", "on the frontier", "goal"])


def tables(report: dict, alt: dict | None = None) -> str:
    from eval.report import markdown_table

    methods, budgets = report["methods"], report["budgets"]
    p = report["platform"]
    lines = ["# The miniature study, tuned protocol (held-out synthetic SPY-Bench, rule judge; held-out general "
             "task)", "", f"mean [95% Student t interval] over seeds {report['seeds']}; platform: "
             f"torch {p['torch']}, CPU capability {p['cpu_capability']}, {p['threads']} thread(s) per process"
             f"{machine_line(p)}.", "", "## Compute per step, planned on this study's data", "",
             "Tokens through the model per optimizer step (train/compute.py: compute = 3 x trained + reference + "
             "generated, forward-token equivalents), measured on this study's training data with its tokenizer; "
             "GRPO's generation at one round (dynamic sampling's extra rounds are in the measured compute below).",
             "", plan_table(report), "## Sweep (validation split)", "",
             f"Each point trained to {budgets[budget_names(report)[-1]]} steps with a checkpoint at {budgets['1x']}; "
             "moved: validation ICS or general accuracy beyond two of one run's measurement noise on those items "
             "(binomial, at the backbone's score, at least one item) from the backbone's"
             + (f" (ICS {fmt(report['backbone_val'].get('ics'))} over {report['backbone_val'].get('n_ics')} pairs, "
                f"general {fmt(report['backbone_val'].get('general'))} over "
                f"{report['backbone_val'].get('n_general')} questions)" if report.get("backbone_val") else "")
             + "; kept: the best mean validation overall among the points that moved, among all only when none did.",
             "", sweep_table(report)]
    base = references(report)
    for budget, step in budgets.items():
        summary = report["summary"][budget]
        lines += ["", f"## Held-out bench at the {budget} budget ({step} steps)", ""]
        rows = [{"method": f"{name} (deterministic)", "n": 1, **{METRICS[k]: fmt(v) for k, v in b.items()}}
                for name, b in base.items()]
        for m in methods:
            final = report["final"][m]
            own = budget == "1x" and final.get("runs_1x")
            rows.append({"method": METHOD_NAMES[m], "n": len(budget_runs(final, budget, step)),
                         "kept setting": point_text(final["kept"][budget]),
                         "runs": f"own {step}-step runs" if own else f"{report['curve_steps'][-1]}-step runs",
                         **{METRICS[k]: ci(summary[m].get(k), 0 if k in ("compute_k", "train_seconds") else 1)
                            for k in METRICS}})
        main = ["ics", "hms", "rta", "ata", "general", "priv", "overall", "ics_distr", "hms_distr", "overall_distr",
                "compute_k", "train_seconds"]
        lines += [markdown_table(rows, ["method", "n", "kept setting", "runs", *[METRICS[k] for k in main]])]
        lines += ["", "Why general-task answers are wrong (share of answers, %):", "",
                  markdown_table(rows[len(base):], ["method", "n", *[METRICS[k] for k in
                                                                      ("general", "refusal", "wrong_colour",
                                                                       "malformed")]])]
    lines += ["", "## Learning curves", "", "![held-out ICS, HMS and general accuracy against the alignment step, per "
              "method at its long budget's setting, bands = 95% t interval over seeds](study_curves.png)", "",
              "## The privacy-ability frontier", "",
              "Held-out ICS (without distractors) against general-task accuracy, mean [95% interval] over seeds; on "
              "the frontier: no other row (references included) is at least as high on both and higher on one; "
              f"goal: ICS >= {GOAL['ics']:g} with general accuracy >= {GOAL['general']:g} at "
              f"{budget_names(report)[-1]}.", "", frontier_table(report),
              "![held-out ICS against general-task accuracy, per method and budget, means with 95% intervals, seeds "
              "faint, the frontier dashed](study_frontier.png)", "",
              "## Paired differences (same seeds, same held-out items)", "",
              "difference of the means [95% t interval of the paired differences]; p: two-sided paired t-test; "
              "indistinguishable where the interval covers 0.", ""]
    ours, theirs = verdicts(report), verdicts(alt) if alt else {}
    rows = []
    for budget, pairs in report["paired"].items():
        for pair, metrics in pairs.items():
            a, b = pair.split(" - ")
            for k, d in metrics.items():
                row = {"budget": budget, "difference": f"{METHOD_NAMES[a]} - {METHOD_NAMES[b]}",
                       "metric": METRICS[k], "mean [95% CI]": ci(d), "p": p_value(d["p"]),
                       "verdict": ours[(budget, pair, k)]}
                if alt:
                    row["verdict on the other platform"] = theirs.get((budget, pair, k), "n/a")
                rows.append(row)
    columns = ["budget", "difference", "metric", "mean [95% CI]", "p", "verdict"]
    lines += [markdown_table(rows, columns + (["verdict on the other platform"] if alt else []))]
    if alt:
        compared = [key for key in ours if key in theirs]
        same = [key for key in compared if theirs[key] == ours[key]]
        q = alt["platform"]
        lines += ["", f"Other platform: CPU capability {q['cpu_capability']}, {q['threads']} thread(s), torch "
                  f"{q['torch']}{machine_line(q)}, seeds {alt['seeds']}: {len(same)} of {len(compared)} verdicts the same"
                  + (f" ({len(ours) - len(compared)} not compared: missing there)." if len(compared) < len(ours)
                     else ".")]
    lines += ["", "## Verdict", "", verdict_text(report)]
    runs = report.get("final_runs", {})
    lines += [f"wall time: {report['wall_seconds']} s (this invocation, which trained {runs.get('trained', 'n/a')} of "
              f"the {runs.get('all', 'n/a')} final runs; finished runs are reused); training time of the final runs: "
              f"{report['train_seconds']} s"
              + "".join(f"; {METHOD_NAMES[m]} {t} s" for m, t in report["train_seconds_by_method"].items()), ""]
    return "\n".join(lines)


