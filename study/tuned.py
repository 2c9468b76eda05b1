"""`python -m study.tuned`: the tuned study's tables again from its study.json, `publish` into docs/study.md, `compare`
(the cross-machine check: two studies' shared values bit for bit) and `estimate` (its time from a recorded study).

May import: cli, train (the one way a command ends); the study's tables, plots, publish, pins and estimate.
"""

from __future__ import annotations

from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import read_json
from cli.numbers import int_at_least
from study.estimate import estimate, estimate_text
from study.pins import compare_runs
from study.plots import plot_frontier
from study.protocol import SEEDS
from study.publish import publish, read_study
from study.tables import tables


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m study.tuned", description="The tuned study's tables from its "
                            "study.json (markdown on stdout), or the time its settings would take here.")
    commands = parser.add_subparsers(dest="command", required=True)
    shown = commands.add_parser("tables", help="the tables, the frontier and the verdict again")
    shown.add_argument("study", help="study.json of `python -m study --protocol tuned`")
    shown.add_argument("--alt", help="the same study on another platform (--kept-from): its verdicts beside ours")
    shown.add_argument("--frontier", help="also draw the frontier plot to this PNG")
    shown_in_docs = commands.add_parser("publish", help="a finished study's tables into docs/study.md, its JSON and "
                                                          "plots beside it")
    shown_in_docs.add_argument("study", help="the study's --out folder")
    shown_in_docs.add_argument("--docs", default="docs", help="the folder of study.md")
    check = commands.add_parser("compare", help="the numbers two studies share, bit for bit (the backbone and the "
                                                "final runs both have: e.g. a --kept-from run on another machine)")
    check.add_argument("study")
    check.add_argument("other")
    guess = commands.add_parser("estimate", help="the protocol's runs and their time, from a recorded study")
    guess.add_argument("recorded", help="a tuned study.json whose final runs' train_runtime is the evidence "
                                        "(docs/study_tuned_issue33.json)")
    guess.add_argument("--methods", nargs="+", default=["sft", "dpo", "nca", "nca_p", "grpo"])
    guess.add_argument("--sweep-seeds", type=int_at_least(1), default=1, help="seeds per sweep point")
    guess.add_argument("--seeds", type=int_at_least(1), default=SEEDS)
    guess.add_argument("--jobs", type=int_at_least(1), default=2)
    args = parser.parse_args(argv)
    if args.command == "tables":
        report = read_study(args.study)
        print(tables(report, read_study(args.alt) if args.alt else None))
        if args.frontier:
            plot_frontier(report, Path(args.frontier))
        return
    if args.command == "publish":
        publish(Path(args.study), Path(args.docs))
        return

    if args.command == "compare":
        result = compare_runs(read_json(args.study), read_json(args.other))
        print(f"{result['equal']} of {result['equal'] + len(result['different'])} values bitwise equal"
              + "".join(f"\n  {path}: {x!r} here, {y!r} there" for path, x, y in result["different"]))
        return

    print(estimate_text(estimate(read_json(args.recorded), args.methods, args.sweep_seeds, args.seeds, args.jobs)))


if __name__ == "__main__":
    from train.common import run

    run(main)
