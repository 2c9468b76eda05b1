"""`python -m study.tuned`: the tuned study's tables again from its study.json, `publish` into docs/study.md, `compare`
(the cross-machine check: two studies' shared values bit for bit) and `estimate` (its time from a recorded study).

May import: cli, train (the one way a command ends); the study's methods, protocol, selection, tables, plots,
publish, pins and estimate.
"""

from __future__ import annotations

from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import read_json
from cli.numbers import int_at_least, option, positive_float
from study.estimate import STEPS_OF, check, estimate, estimate_text, resumed_phase
from study.methods import NAMES, TWO_STAGE
from study.pins import compare_runs
from study.plots import plot_frontier
from study.protocol import SEEDS, SWEEP_SEEDS, TUNED_METHODS
from study.publish import READABLE, publish, read_study
from study.selection import BETA_METHODS
from study.tables import tables


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m study.tuned", description="The tuned study's tables from its "
                            "study.json (markdown on stdout), its page, the cross-machine comparison, or the time its "
                            "settings would take, estimated from a recorded study.")
    commands = parser.add_subparsers(dest="command", required=True)
    shown = commands.add_parser("tables", help="the tables, the frontier and the verdict again")
    shown.add_argument("study", help="study.json of `python -m study --protocol tuned`")
    shown.add_argument("--alt", help="the same study on another platform (--kept-from): its verdicts beside ours")
    shown.add_argument("--frontier", help="also draw the frontier plot to this PNG")
    shown_in_docs = commands.add_parser("publish", help="a finished study's tables into docs/study.md, its JSON and "
                                                          "plots beside it")
    shown_in_docs.add_argument("study", help="the study's --out folder")
    shown_in_docs.add_argument("--docs", default="docs", help="the folder of study.md")
    compare = commands.add_parser("compare", help="the numbers two studies share, bit for bit (the backbone and the "
                                                "final runs both have: e.g. a --kept-from run on another machine)")
    compare.add_argument("study", help="a tuned study.json")
    compare.add_argument("other", help="another tuned study.json (e.g. a --kept-from run on another machine)")
    guess = commands.add_parser("estimate", help="the protocol's runs and their time, estimated from a recorded "
                                "study's timings (not this machine's)")
    guess.add_argument("recorded", help="a tuned study.json whose runs' times are the evidence (docs/study_tuned.json)")
    firsts = {t["first"] for t in TWO_STAGE.values()}
    guess.add_argument("--methods", nargs="+", choices=[m for m in STEPS_OF if m not in firsts], default=TUNED_METHODS,
                       help="the methods of the study estimated (default: the protocol's, as the Makefile runs them)")
    guess.add_argument("--sweep-seeds", type=option("seed"), nargs="+", default=SWEEP_SEEDS,
                       help=f"the seeds of every sweep point, as the study takes them (default: "
                            f"{' '.join(map(str, SWEEP_SEEDS))})")
    guess.add_argument("--seeds", type=option("seed"), nargs="+", default=list(range(SEEDS)),
                       help="the final runs' seeds, as the study takes them (default: 0-9)")
    guess.add_argument("--jobs", type=int_at_least(1), default=2, help="runs at once (default: 2)")
    guess.add_argument("--refine-lr-factors", type=positive_float, nargs="+", default=[1],
                       help="the refinement's learning-rate factors, as the study takes them (default: 1 alone, no "
                            "refinement, as the Makefile's; the protocol's grid: 0.6667 1 1.5)")
    guess.add_argument("--refine-beta-factors", type=positive_float, nargs="+", default=[1],
                       help="the refinement's beta factors, as the study takes them (default: 1, the Makefile's; the "
                            "protocol's grid: 0.3333 1 3)")
    guess.add_argument("--own-1x", nargs="*", choices=list(NAMES), default=[],
                       help="the methods assumed to keep another setting for 1x (ten runs of their own each); the "
                            "others' cost of doing so is printed")
    guess.add_argument("--check", metavar="OTHER", help="instead: the estimate of what the study of OTHER (a study.json) ran (its "
                       "own runs and jobs), against its measured wall time")
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
        result = compare_runs(read_json(args.study, finite=False), read_json(args.other, finite=False))  # NaN: ours
        print(f"{result['equal']} of {result['equal'] + len(result['different'])} values bitwise equal"
              + "".join(f"\n  {path}: {x!r} here, {y!r} there" for path, x, y in result["different"]))
        return

    from cli.errors import InputError

    recorded = read_recorded(args.recorded)
    lr, beta = len(args.refine_lr_factors), len(args.refine_beta_factors)
    refine = {m: (lr * beta - 1 - (beta > 1) if m in BETA_METHODS else lr - 1) for m in args.methods}
    if args.check:
        other = read_recorded(args.check)
        try:
            result = check(recorded, other)
        except ValueError as err:  # the checked study was resumed, or the recorded one lacks a method it ran
            resumed = resumed_phase(other) is not None
            raise InputError(args.check if resumed else args.recorded, None, "wall_seconds" if resumed else "final",
                             str(err)) from None
    else:
        try:
            result = estimate(recorded, args.methods, len(args.sweep_seeds), len(args.seeds), args.jobs, args.own_1x,
                              refine)
        except ValueError as err:  # a method the recorded study has no runs of
            raise InputError(args.recorded, None, "final", str(err)) from None
    print(estimate_text(result, args.recorded))


def read_recorded(path) -> dict:
    """A tuned study.json whose runs can be timed (issue 40's layout or later); one line naming the file otherwise."""
    from cli.errors import InputError

    report = read_json(path, finite=False)  # a study.json (ours): json writes NaN where a statistic has none
    if not isinstance(report, dict) or report.get("format") not in READABLE:
        raise InputError(path, None, "format", "not a tuned study.json of layout 2 or later: its runs cannot be timed")
    return report


if __name__ == "__main__":
    from train.common import run

    run(main)
