"""Does the tuned study's validation split stand for its held-out bench? Per method and budget, the kept sweep point's
validation scores (each sweep seed) against the final runs' held-out scores at that setting (each final seed): the
means, their difference, and the two-sided exact Mann-Whitney p-value (eval/stats.py), for ICS and general accuracy.
A large gap with a small p means the sweep chose on numbers the held-out bench does not repeat (issue 53: guided
GRPO at lr 1e-4 in issue 47's study, validation ICS 70.1 and 64.2 on its two sweep seeds, held-out 7.5-41.0 on ten).

    python benchmarks/val_heldout.py docs/study_tuned.json [--json benchmarks/results/val_heldout.json]

Reads a study.json of layout 3 or later (its sweep records every sweep seed); no training, a second or two.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.stats import mann_whitney  # noqa: E402
from study.methods import NAMES  # noqa: E402
from study.results import budget_names, budget_runs  # noqa: E402
from study.selection import same_point  # noqa: E402

METRICS = {"ics": "ICS", "general": "general"}


def agreement(report: dict) -> list[dict]:
    """One row per method, budget and metric: the kept point's validation values over its sweep seeds against the
    final runs' held-out values at that budget."""
    rows = []
    for m in report["methods"]:
        entry = report["sweep"][m]
        for budget in budget_names(report):
            point = next((p for p in entry.get("points", []) if same_point(p["point"], entry["kept"][budget])), None)
            if point is None:  # a --kept-from study: no sweep of its own
                continue
            held = budget_runs(report["final"][m], budget, report["budgets"][budget]).values()
            for k in METRICS:
                val = [s[budget][k] for s in point["seeds"].values() if s[budget].get(k) is not None]
                test = [r[k] for r in held if r.get(k) is not None]
                if not val or not test:
                    continue
                mean_val, mean_test = sum(val) / len(val), sum(test) / len(test)
                rows.append({"method": m, "budget": budget, "metric": k, "validation": val, "held_out": test,
                             "mean_validation": mean_val, "mean_held_out": mean_test,
                             "held_out_minus_validation": mean_test - mean_val, **mann_whitney(test, val)})
    return rows


def table(rows: list[dict]) -> str:
    from eval.report import markdown_table

    shown = [{"method": NAMES[r["method"]], "budget": r["budget"], "metric": METRICS[r["metric"]],
              "validation (sweep seeds)": ", ".join(f"{v:.1f}" for v in r["validation"]),
              "held-out mean (final seeds)": f"{r['mean_held_out']:.1f} (n {r['n_a']}, "
                                             f"{min(r['held_out']):.1f}-{max(r['held_out']):.1f})",
              "held-out - validation": f"{r['held_out_minus_validation']:+.1f}",
              "Mann-Whitney p": f"{r['p']:.3f}"} for r in rows]
    return markdown_table(shown, list(shown[0]) if shown else ["method"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", help="a tuned study.json (layout 3 or later)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    report = json.loads(Path(args.study).read_text())
    if report.get("format", 0) < 3:
        sys.exit(f"error: {args.study}: format: layout {report.get('format')} records one sweep seed's values; 3 or "
                 "later needed")
    rows = agreement(report)
    print(f"{args.study}: validation (the kept sweep point, each sweep seed) against the held-out bench (the final "
          "runs at that setting)\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"study": args.study, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
