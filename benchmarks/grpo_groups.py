"""Where GRPO's signal is, from the study's helpful backbone: one GRPO run of recipes/study/grpo.yaml (as the tuned
study runs it: constant learning rate after warm-up, the general task's data, one thread, the study's pinned
numerics), its logged group statistics summarised, and its checkpoints evaluated on the held-out bench with
eval/suites/study.yaml (without distractors) as the study evaluates them.

    python benchmarks/grpo_groups.py build --study outputs/study-tuned     # the tuned study's data and backbone only
    python benchmarks/grpo_groups.py run NAME --study outputs/study-tuned [--steps 90] [--seed 0] \
        [--eval-steps 30 90] [--splits val test] [--train-args --dynamic_sampling false --temperature 1.2 ...]
    python benchmarks/grpo_groups.py table             # every run's row, markdown

Each run lands in --out (default outputs/grpo-groups)/NAME: the training folder, summary.json, the suite's answers;
a finished run is reused. The summary holds, over the logged steps: TRL's `frac_reward_zero_std` (the share of
groups with zero spread among those generated), dynamic sampling's drops, rounds and prompts drawn, the group
statistics VisionGRPOTrainer logs (`groups/...`: zero spread per kind of prompt, refusal-expected groups holding a
refusal, which reward alone varies in the groups with spread), the tokens generated, the KL at the end; and per
evaluated step ICS, HMS and the general task's accuracy and refusals.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the study runs (study/__main__.py)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEANS = ("frac_reward_zero_std", "dynamic_sampling/dropped_share", "dynamic_sampling/padded_share",
         "dynamic_sampling/extra_rounds", "dynamic_sampling/prompts_drawn", "dynamic_sampling/anchor_share",
         "generation/prompt_tokens", "generation/completion_tokens", "reference/tokens", "reward",
         "rewards/privacy_compliance/mean", "rewards/helpfulness/mean")
PREFIXES = ("groups/", "guidance/")


def summarize(history: list[dict], eval_steps: list[int] = ()) -> dict:
    """The logged steps' means of MEANS and of every `groups/` and `guidance/` key, the first and last logged
    privacy compliance and KL, the mean KL up to each of `eval_steps`, the training time."""
    steps = [e for e in history if "loss" in e]
    keys = [k for k in MEANS if any(k in e for e in steps)]
    keys += sorted({k for e in steps for k in e if k.startswith(PREFIXES)})
    summary = {k: statistics.fmean(e[k] for e in steps if k in e) for k in keys}
    for key in ("rewards/privacy_compliance/mean", "kl"):
        values = [e[key] for e in steps if key in e]
        if values:
            summary[f"{key} first"], summary[f"{key} last"] = values[0], values[-1]
    for step in eval_steps:
        values = [e["kl"] for e in steps if "kl" in e and e["step"] <= step]
        if values:
            summary[f"kl mean to {step}"] = statistics.fmean(values)
    summary["train_runtime"] = next((e["train_runtime"] for e in history if "train_runtime" in e), None)
    return summary


def compute_per_step(history: list[dict], step: int, beta: float, dpo_step: float) -> dict:
    """The run's measured compute per optimizer step up to `step` (train/compute.py, the reference counted where it
    ran), in k tokens and as a multiple of DPO's planned step (`dpo_step` tokens: the study's recipe on its data)."""
    from train.compute import run_compute

    compute = run_compute(history, step, "grpo", beta)
    if compute["compute"] is None:
        return {}
    return {"k_tokens": compute["compute"] / step / 1000, "x_dpo": compute["compute"] / step / dpo_step,
            "reference_rule": compute["reference_rule"]}


def evaluate(model: Path, study: Path, out: Path, split: str) -> dict:
    """ICS, HMS (without distractors), the general task's accuracy and refusals: on the validation split (what the
    study's sweep chooses by) or the held-out bench (what it reports)."""
    from eval.suite import run_suite

    spy, general = {"settings": ["without_distractors"]}, {}
    if split == "val":
        spy["items"], general["data"] = "synthetic-spy-tune/val_questions.json", "synthetic-spy-tune/general_val.json"
    overrides = {"backend_options": {"batch_size": 64, "max_new_tokens": 32},
                 "sections": {"spy": spy, "synthetic_general": general}}
    sections = run_suite(ROOT / "eval" / "suites" / "study.yaml", str(model), out, root=str(study),
                         overrides=overrides)["sections"]
    spy, general = sections["spy"]["without_distractors"], sections["synthetic_general"]
    return {"ics": spy["ics"], "hms": spy["hms"], "general": general["accuracy"],
            "general_refusal": general["breakdown"]["refusal"]}


def build(args) -> None:
    """The tuned study's data, tiny model and helpful backbone, built exactly as `python -m study --protocol tuned
    --out STUDY` builds them (its own defaults, its pinned numerics; each step skipped when done), without the
    study's evaluations and runs; READY marks a finished folder (that study reuses all of it)."""
    from study.__main__ import build_start, parse
    from study.pins import pin_numerics
    from train.demo import Clock

    pin_numerics()
    study = Path(args.study)
    options = parse(["--protocol", "tuned", "--out", str(study)])[0]
    study.mkdir(parents=True, exist_ok=True)
    log = Clock()
    build_start(options, study, log)
    (study / "READY").write_text("the tuned study's data, tiny model and backbone (benchmarks/grpo_groups.py build)\n")
    log(f"built {study}")


def run(args) -> None:
    from study.pins import pin_numerics
    from train.demo import Clock, train

    pin_numerics()
    study, folder = Path(args.study), Path(args.out) / args.name
    data, backbone = study / "synthetic-spy-tune", study / "backbone"
    for needed in (data / "train_data.json", backbone / "config.json"):
        if not needed.exists():
            sys.exit(f"error: {needed}: missing; build the study's backbone first (python benchmarks/grpo_groups.py "
                     f"build --study {study})")
    log = Clock()
    save = min(args.eval_steps)
    extra = ["--seed", str(args.seed), "--lr_scheduler_type", "constant_with_warmup", "--save_steps", str(save),
             "--save_total_limit", "1000", "--logging_steps", "1",
             "--general_data_path", str(data / "general_train.json"), *args.train_args]
    recipe = ROOT / args.recipe
    train("grpo", backbone, data, folder / "train", args.steps, log, extra, recipe)
    history = json.loads((folder / "train" / "train_metrics.json").read_text())
    summary = {"name": args.name, "recipe": args.recipe, "steps": args.steps, "seed": args.seed,
               "train_args": args.train_args, **summarize(history, args.eval_steps)}
    from cli import strict_yaml
    from train.compute import study_plan

    beta = float(dict(zip(args.train_args, args.train_args[1:])).get("--beta", strict_yaml.load(recipe)["beta"]))
    dpo_step = study_plan(data, backbone, ROOT / "recipes" / "study", ["dpo"])["dpo"]["compute"]
    for step in args.eval_steps:
        summary[f"compute {step}"] = compute_per_step(history, step, beta, dpo_step)
    for step in args.eval_steps:
        model = folder / "train" / (f"checkpoint-{step}" if step < args.steps else "")
        for split in args.splits:
            summary[f"{split} {step}"] = evaluate(model, study, folder / "suite" / f"{split}-step{step}", split)
            log(f"{args.name} step {step} ({split}): {summary[f'{split} {step}']}")
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


def table(args) -> None:
    rows = [json.loads(p.read_text()) for p in sorted(Path(args.out).glob("*/summary.json"))]
    if not rows:  # a mistyped --out is not an empty table
        print(f"error: {args.out}: no run's summary.json in it (write them with `run NAME`)", file=sys.stderr)
        sys.exit(2)
    rows = [r for r in rows if not args.runs or r["name"] in args.runs]
    columns = args.columns or COLUMNS
    evals = sorted({k for r in rows for k in r if k.split()[0] in ("val", "test")},
                   key=lambda k: (k.split()[0], int(k.split()[1])))
    metrics = {"ics": "ICS", "hms": "HMS", "general": "general"} if args.hms else {"ics": "ICS", "general": "general"}
    head = ["run", "settings", *columns, *[f"{k}: {m}" for k in evals for m in metrics.values()]]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        settings = " ".join([*([r["recipe"].removeprefix("recipes/study/")] if r.get("recipe", DEFAULT_RECIPE)
                               != DEFAULT_RECIPE else []), *r["train_args"]])
        cells = [r["name"], settings or "recipe", *[_fmt(_value(r, c)) for c in columns]]
        cells += [_fmt(r[k][m]) if k in r else "–" for k in evals for m in metrics]
        print("| " + " | ".join(cells) + " |")


def _value(row: dict, column: str):
    """A summary's value; `compute 90` names the k tokens per step to step 90."""
    if column.startswith("compute "):
        return row.get(column, {}).get("k_tokens")
    if column.startswith("x DPO "):
        return row.get(f"compute {column.split()[-1]}", {}).get("x_dpo")
    return row.get(column)


DEFAULT_RECIPE = "recipes/study/grpo.yaml"
COLUMNS = ["frac_reward_zero_std", "dynamic_sampling/dropped_share", "dynamic_sampling/extra_rounds",
           "groups/zero_spread/reject", "groups/reject_with_refusal", "groups/zero_spread/respond",
           "groups/zero_spread/general", "groups/spread_only/helpfulness", "kl last"]


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/grpo-groups")
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run", help="one GRPO run from the study's backbone, summarised and evaluated")
    one.add_argument("name")
    one.add_argument("--study", default="outputs/study-tuned", help="a tuned study's --out (its backbone and data)")
    one.add_argument("--steps", type=int, default=90)
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--eval-steps", type=int, nargs="+", default=[90])
    one.add_argument("--splits", nargs="+", choices=["val", "test"], default=["val"],
                     help="val: the validation split (to choose by); test: the held-out bench (to report)")
    one.add_argument("--recipe", default=DEFAULT_RECIPE, help="the GRPO recipe, relative to the repository")
    one.add_argument("--train-args", nargs=argparse.REMAINDER, default=[])
    made = commands.add_parser("build", help="the tuned study's data and backbone, without the study")
    made.add_argument("--study", default="outputs/study-tuned")
    listed = commands.add_parser("table", help="every run's row")
    listed.add_argument("--runs", nargs="+", help="these runs only, in their file order")
    listed.add_argument("--hms", action="store_true", help="HMS beside ICS and general accuracy")
    listed.add_argument("--columns", nargs="+", help=f"summary keys (default: {' '.join(COLUMNS)}; `compute N`: k "
                                                     "tokens per step to step N, `x DPO N`: that over DPO's step)")
    args = parser.parse_args(argv)
    if args.command == "run" and (any(s < 1 or s > args.steps for s in args.eval_steps)
                                  or any(s % min(args.eval_steps) for s in [*args.eval_steps, args.steps])):
        parser.error("--eval-steps: steps within --steps, each (and --steps) a multiple of the first")
    {"run": run, "build": build, "table": table}[args.command](args)


if __name__ == "__main__":
    main()
