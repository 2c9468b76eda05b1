"""The miniature study's tuned protocol (`python -m study --protocol tuned`, `make study-tuned`): every method
tuned on its own for each budget, ten seeds, compute counted in tokens, the privacy-ability frontier, paired tests
and a verdict; docs/study.md describes it.

1. sweep, per method, on the validation split (data_prep/synthetic.py's val_questions.json / general_val.json:
   the training distribution, items and images not in the held-out split; one instruction line): coordinate-wise,
   the learning rate (the recipe's times each --lr-factors) at the paper's beta, then beta (the paper's times each
   --beta-factors) at the learning rate kept for the long budget; --sweep-seeds per point. Every sweep run trains
   to the long budget (--long-factor x --steps) with a checkpoint at the common one (--steps), both evaluated.
   Per budget, the kept point is the best mean validation composite (overall without distractors) among the points
   that moved off the backbone (validation ICS or general accuracy beyond two of one run's measurement noise on
   those items: `moved`); only when no point moved is a point that did not move kept, and the tables say so;
2. final: --seeds runs per method at the long budget's kept setting, a checkpoint every --curve-every steps, each
   evaluated on the held-out bench (the learning curves); the learning rate is constant after warm-up, so where the
   common budget kept the same setting its checkpoint at --steps is the 1x result, and where it kept another one
   --seeds runs of --steps steps at that setting give it;
3. report: per budget the mean and Student t 95% interval over seeds of every metric (eval/stats.py), the compute
   of each run in tokens through the model (train/compute.py) and its training time, the general task's answers as
   correct / refusal / wrong colour / malformed, paired differences (NCA-P - NCA, NCA-P - DPO, NCA - DPO, GRPO -
   NCA-P, GRPO - DPO) on the same seeds (t interval, paired t-test; "indistinguishable" where the interval covers
   0), the privacy-ability frontier (held-out ICS against general accuracy, Pareto front), the verdict on the
   goal (at the long budget ICS >= 90 with general accuracy >= 95) and the platform; study.json, study.md,
   study_curves.png, study_frontier.png.

`--kept-from OTHER/study.json` skips the sweep and uses that study's kept settings (the cross-machine check: the
final phase under another CPU; a subset by --methods / --seeds keeps it cheap); `python -m study.tuned tables
STUDY.json [--alt OTHER.json]` prints the tables again, with the alternative platform's verdicts beside, and
`python -m study.tuned estimate` the time the protocol's settings would take here.

This file holds the protocol's order (its options and settings, the sweep's stages, the final runs, the report's
assembly); the pieces are its neighbours: runs.py (one run trained and evaluated), selection.py (which point a stage
keeps), results.py (the statistics over seeds), pins.py (the numerics).

May import: cli, train (the launcher, the compute plan) and the study's methods, runs, selection, results and pins.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from cli.errors import read_json
from cli.numbers import int_at_least, option, positive_float
from study import runs
from study.methods import EXTRA_METHODS, NAMES, TWO_STAGE, script, with_first_stages
from study.pins import pin_numerics, platform
from study.results import analyse, budget_names
from study.selection import BETA_METHODS, point_result, refinement_points, same_point, select, sweep_points

# study.json's layout: 4 = a sweep point's seeds at the goal and the rule that ranks by them, the two-stage methods'
# first stages counted in their runs' compute and time (issue 53); 3 = the goal's floor in the sweep, two sweep seeds and
# the refinement, success per seed, bootstrap intervals, the wall time of the sweep's runs too (issue 47); 2 =
# per-budget sweep and kept settings, compute (issue 40)
FORMAT = 4
# The common budget: 30 steps of 16 cases (the quick protocol's recipes have 80, cosine); the long one is 3x
# (docs/study.md, "Sizing").
TUNED_STEPS = 30
# Ten seeds: with five, NCA-P's 1x ICS lead was distinguishable on one machine and not on a second one of the same kind
# (issue 33); the verdicts docs/study.md states are to hold on both.
SEEDS = 10
# The tuned protocol's methods by default (issue 53): SFT, DPO and NCA-P with and without the general task, guided
# GRPO and SFT then guided GRPO. NCA and plain GRPO stay available (`--methods ... nca grpo`): both met the goal on 0
# of 10 seeds in the studies of issues 40 and 47.
TUNED_METHODS = ["sft", "sft_general", "dpo", "dpo_general", "nca_p", "nca_p_general", "grpo_guided",
                 "sft_grpo_guided"]
SWEEP_SEEDS = [100, 101, 102]  # three: a point is ranked by how many of them meet the goal (selection.py)
PLAN_SAMPLE = 600  # training cases per method the per-step plan is measured on (evenly spread over the data)


def add_arguments(parser, methods: list[str]) -> None:
    group = parser.add_argument_group("the tuned protocol (--protocol tuned; study/protocol.py)")
    group.add_argument("--methods", nargs="+", choices=[*methods, *EXTRA_METHODS], default=None,
                       help="the methods compared (default: the quick protocol's four; the tuned protocol's "
                            f"{' '.join(TUNED_METHODS)})")
    group.add_argument("--sweep-seeds", type=option("seed"), nargs="+", default=SWEEP_SEEDS,
                       help="seeds of every sweep point: a point is ranked by how many of them meet the goal on "
                            "validation, then by its means over them (default: three)")
    group.add_argument("--lr-factors", type=positive_float, nargs="+", default=[1 / 3, 1, 3],
                       help="learning rates swept: the recipe's times each (1 = the recipe's)")
    group.add_argument("--beta-factors", type=positive_float, nargs="+", default=[1, 3],
                       help="betas swept at the long budget's learning rate (DPO, NCA, NCA-P, the GRPOs): the "
                            "paper's times each")
    group.add_argument("--refine-lr-factors", type=positive_float, nargs="+", default=[1 / 1.5, 1, 1.5],
                       help="the 2-D refinement around each method's long-budget choice after the coordinate stages: "
                            "its learning rate times each, by each of --refine-beta-factors (1 alone: none)")
    group.add_argument("--refine-beta-factors", type=positive_float, nargs="+", default=[1 / 3, 1, 3],
                       help="the refinement's betas: the choice's times each")
    group.add_argument("--long-factor", type=int_at_least(1), default=3, help="the long budget: this times --steps")
    group.add_argument("--curve-every", type=int_at_least(1), default=None, help="a checkpoint (a curve point) every N steps; "
                       "must divide --steps (default: --steps)")
    group.add_argument("--val-per-label", type=int_at_least(1), default=1, help="validation SPY items per category")
    group.add_argument("--general-val", type=int_at_least(1), default=100, help="validation general-task questions")
    group.add_argument("--train-scenarios", choices=["pool", "one"], default="pool",
                       help="each training item's scenarios: its category's whole pool (the demo's), or one drawn "
                            "of each kind (the studies before issue 53)")
    group.add_argument("--kept-from", help="skip the sweep: the kept settings of this tuned study.json (the cross-machine "
                       "check)")
    group.add_argument("--jobs", type=int_at_least(1), default=1, help="runs at once (one thread each)")


def recipe_digest(path) -> str:
    """sha256 of a recipe's parsed values (keys sorted): an edit that changes a setting changes it, a comment or a
    reordering does not."""
    from cli import strict_yaml

    values = json.dumps(strict_yaml.load(path), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(values.encode()).hexdigest()


def recipe_digests(methods: list[str]) -> dict:
    """method -> the digest of its study recipe (and the backbone's): a resume under other settings is another
    study."""
    from train.demo import ROOT

    return {name: recipe_digest(ROOT / "recipes" / "study" / f"{name}.yaml")
            for name in ("backbone", *with_first_stages(methods))}


def tuned_settings(args) -> dict:
    """Complete and check the tuned protocol's arguments and pin the numerics; its settings (what a resumed run must
    share), with the recipes' digests and the platform's torch version, CPU capability, thread count and pinned
    settings (floats differ across them)."""
    from cli.errors import InputError

    args.seeds = args.seeds or list(range(SEEDS))
    args.methods = args.methods or list(TUNED_METHODS)
    args.steps = args.steps or TUNED_STEPS
    args.curve_every = args.curve_every or args.steps
    for name in ("steps", "long_factor", "curve_every", "jobs", "val_per_label", "general_val"):
        if getattr(args, name) < 1:
            raise InputError("command line", None, f"--{name.replace('_', '-')}", "must be at least 1")
    if args.steps % args.curve_every:
        raise InputError("command line", None, "--curve-every", f"must divide --steps ({args.steps}), got "
                         f"{args.curve_every}")
    from train.demo import ROOT

    for name in ("backbone", *with_first_stages(args.methods)):  # a method without its recipe
        if not (ROOT / "recipes" / "study" / f"{name}.yaml").is_file():
            raise InputError(ROOT / "recipes" / "study" / f"{name}.yaml", None, "--methods", f"{name}: no recipe")
    if args.kept_from:  # a method it lacks, or other budgets: one line now, not after the backbone
        kept_settings(args.kept_from, args.methods, ["1x", f"{args.long_factor}x"])
    pin_numerics()  # before platform() loads torch: this process evaluates the checkpoints
    machine = platform()
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "seeds", "jobs")}
    return {**settings, "recipes": recipe_digests(args.methods),
            **{k: machine[k] for k in ("torch", "cpu_capability", "threads", "numerics")}}


def kept_settings(path, methods: list[str], budgets: list[str] | None = None) -> dict:
    """method -> {budget: point} kept by another tuned study.json (before issue 40 one point served every budget);
    `budgets`: the names this study needs."""
    from cli.errors import InputError

    if not Path(path).is_file():
        raise InputError(path, None, "--kept-from", "no such file")
    report = read_json(path, finite=False)  # a study.json (ours): json writes NaN where a statistic has none
    sweep = report.get("sweep") if isinstance(report, dict) else None
    kept = {}
    for m in methods:
        entry = sweep.get(m) if isinstance(sweep, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("kept"), dict):
            raise InputError(path, None, f"sweep.{m}.kept", "missing: that study did not tune this method")
        point = entry["kept"]
        kept[m] = dict(point) if "learning_rate" not in point else {b: point for b in budget_names(report)}
        lacking = [b for b in budgets or [] if b not in kept[m]]
        if lacking:
            raise InputError(path, None, f"sweep.{m}.kept", f"no setting for the {lacking[0]} budget (that study's "
                             f"budgets: {', '.join(kept[m])}); use its --long-factor")
    return kept


def sweep(ctx: dict, methods: list[str], backbone: dict, log) -> dict:
    """Every method's learning rates at once, then the betas at each one's learning rate kept for the long budget,
    then the 2-D refinement around each one's long-budget choice (selection.py's refinement_points; a point tried
    before is not run again); each budget's kept point chosen among all of a method's points on its own validation
    numbers (`select`)."""
    budgets, long = list(ctx["budgets"]), list(ctx["budgets"])[-1]
    results = {m: [] for m in methods}

    def new(m: str, candidates: list[dict]) -> list[dict]:
        tried = [r["point"] for r in results[m]]
        return [p for i, p in enumerate(candidates)
                if not any(same_point(p, q) for q in tried + candidates[:i])]

    for stage in ("learning_rate", "beta", "refine"):
        if stage == "learning_rate":
            points = {m: sweep_points(m, ctx["lr_factors"]) for m in methods}
        elif stage == "beta":
            points = {m: new(m, sweep_points(m, ctx["beta_factors"], select(results[m], long)["point"]["learning_rate"]))
                      for m in methods if m in BETA_METHODS}
        else:
            points = {m: new(m, refinement_points(select(results[m], long)["point"], ctx["refine_lr_factors"],
                                                  ctx["refine_beta_factors"])) for m in methods}
        tasks = [("sweep", ctx, m, p, s) for m in points for p in points[m] for s in ctx["sweep_seeds"]]
        if not tasks:
            continue
        train_first_stages(ctx, list(points), ctx["sweep_seeds"], log)
        log(f"sweep ({stage}): {len(tasks)} runs of {ctx['long_steps']} steps (checkpoint at {ctx['steps']}), "
            f"{ctx['jobs']} at a time")
        values = iter(runs.run_tasks(tasks, ctx["jobs"]))
        for m in points:
            for p in points[m]:
                seeds = {str(s): next(values) for s in ctx["sweep_seeds"]}
                results[m].append(point_result(p, stage, seeds, budgets, backbone))
    swept = {}
    for m in methods:
        chosen = {b: select(results[m], b) for b in budgets}
        swept[m] = {"points": results[m], "kept": {b: c["point"] for b, c in chosen.items()},
                    "moved": {b: c["moved"] for b, c in chosen.items()}, "rule": {b: c["rule"] for b, c in chosen.items()}}
    return swept


def train_first_stages(ctx: dict, methods: list[str], seeds: list[int], log) -> None:
    """The two-stage methods' first stages for these seeds, each once (before the runs that start from them)."""
    tasks = [("first_stage", ctx, m, s) for m in methods if m in TWO_STAGE for s in seeds]
    if tasks:
        log(f"first stages: {len(tasks)} runs ({', '.join(sorted({TWO_STAGE[t[2]]['first'] for t in tasks}))}), "
            f"{ctx['jobs']} at a time")
        runs.run_tasks(tasks, ctx["jobs"])


def run_protocol(args, out: Path, backbone: Path, data: Path, backbone_rows: dict, log) -> dict:
    from train.compute import study_plan
    from train.demo import ROOT

    long = f"{args.long_factor}x"
    budgets = {"1x": args.steps, long: args.steps * args.long_factor}
    ctx = {"out": str(out), "backbone": str(backbone), "data": str(data), "start": log.start,
           "steps": args.steps, "long_steps": args.steps * args.long_factor, "curve_every": args.curve_every,
           "budgets": budgets, "lr_factors": args.lr_factors, "beta_factors": args.beta_factors,
           "refine_lr_factors": args.refine_lr_factors, "refine_beta_factors": args.refine_beta_factors,
           "sweep_seeds": args.sweep_seeds, "jobs": args.jobs, "eval_limit": args.eval_limit,
           "eval_batch_size": args.eval_batch_size, "max_new_tokens": args.max_new_tokens,
           "train_args": args.train_args}
    methods = args.methods
    # the compute of one step of every recipe, measured on this study's data (train/compute.py): the basis on which
    # GRPO's prompts and G per step were matched to DPO's
    phases = {"backbone": round(time.time() - log.start, 1)}  # data, tiny model, backbone and its evaluation
    planned = with_first_stages(methods)
    plan = study_plan(data, out / "tiny-qwen2vl", ROOT / "recipes" / "study", planned, sample=PLAN_SAMPLE,
                      overrides=args.train_args, kinds={m: script(m) for m in planned})
    log("compute per step (k tokens, planned on this data): " + ", ".join(
        f"{NAMES[m]} {p['compute'] / 1000:.1f}" for m, p in plan.items()))
    backbone_val = None
    if args.kept_from:
        kept = kept_settings(args.kept_from, methods, list(budgets))
        swept = {m: {"points": [], "kept": kept[m], "from": args.kept_from} for m in methods}
    else:
        backbone_val = runs.run_tasks([("backbone", ctx)], 1)[0]
        swept = sweep(ctx, methods, backbone_val, log)
    phases["sweep"] = round(time.time() - log.start - phases["backbone"], 1)  # with the plan and the validation
    kept = {m: swept[m]["kept"] for m in methods}
    ctx["common_from_long"] = {m: kept[m]["1x"] == kept[m][long] for m in methods}
    tasks = [("final", ctx, m, kept[m][long], s, ctx["long_steps"]) for s in args.seeds for m in methods]
    tasks += [("final", ctx, m, kept[m]["1x"], s, ctx["steps"]) for s in args.seeds for m in methods
              if not ctx["common_from_long"][m]]
    common = sum(t[-1] != ctx["long_steps"] for t in tasks)
    log(f"final: {len(tasks)} runs at the kept settings ({len(tasks) - common} of {ctx['long_steps']} steps, {common} of "
        f"{ctx['steps']}), {args.jobs} at a time")
    final = {m: {"kept": kept[m], "runs": {}} for m in methods}
    train_first_stages(ctx, methods, args.seeds, log)
    for (_, _, m, _, s, total), result in zip(tasks, runs.run_tasks(tasks, args.jobs)):
        own = total == ctx["steps"] and not ctx["common_from_long"][m] and ctx["steps"] != ctx["long_steps"]
        final[m].setdefault("runs_1x" if own else "runs", {})[f"seed{s}"] = result
    phases["final"] = round(time.time() - log.start - phases["backbone"] - phases["sweep"], 1)
    steps = runs.curve_steps(ctx)
    trained = sum(r.get("trained", False) for m in methods for key in ("runs", "runs_1x")
                  for r in final[m].get(key, {}).values())
    count = sum(len(final[m].get(key, {})) for m in methods for key in ("runs", "runs_1x"))
    report = {"protocol": "tuned", "format": FORMAT, "platform": platform(), "methods": methods, "seeds": args.seeds,
              "budgets": budgets, "curve_steps": steps, "plan": plan, "backbone": backbone_rows,
              "backbone_val": backbone_val, "sweep": swept, "final": final,
              "wall_seconds": round(time.time() - log.start, 1), "phases": phases, "jobs": args.jobs,
              "final_runs": {"trained": trained, "all": count},
              "sweep_runs": {"trained": sum(s.get("trained", False) for m in swept for p in swept[m]["points"]
                                            for s in p["seeds"].values()),
                             "all": sum(len(p["seeds"]) for m in swept for p in swept[m]["points"])},
              "train_seconds": round(sum(r["training"].get("train_runtime", 0) for m in methods
                                         for key in ("runs", "runs_1x") for r in final[m].get(key, {}).values()), 1)}
    report["train_seconds_by_method"] = {m: round(sum(r["training"].get("train_runtime", 0) for key in
                                                      ("runs", "runs_1x") for r in final[m].get(key, {}).values()), 1)
                                         for m in methods}
    return analyse(report)
