"""Where GRPO's signal is, from the study's helpful backbone: one GRPO run of recipes/study/grpo.yaml (as the tuned
study runs it: constant learning rate after warm-up, the general task's data, one thread, the study's pinned
numerics), its logged group statistics summarised, and its checkpoints evaluated on the held-out bench with
eval/suites/study.yaml (without distractors) as the study evaluates them.

    python -m study --protocol tuned ... --out outputs/study-tuned       # builds and caches the backbone
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
         "dynamic_sampling/extra_rounds", "dynamic_sampling/prompts_drawn", "generation/prompt_tokens",
         "generation/completion_tokens", "reward", "rewards/privacy_compliance/mean", "rewards/helpfulness/mean")


def summarize(history: list[dict]) -> dict:
    """The logged steps' means of MEANS and of every `groups/` key, the first and last logged privacy compliance and
    KL, the training time."""
    steps = [e for e in history if "loss" in e]
    keys = [k for k in MEANS if any(k in e for e in steps)]
    keys += sorted({k for e in steps for k in e if k.startswith("groups/")})
    summary = {k: statistics.fmean(e[k] for e in steps if k in e) for k in keys}
    for key in ("rewards/privacy_compliance/mean", "kl"):
        values = [e[key] for e in steps if key in e]
        if values:
            summary[f"{key} first"], summary[f"{key} last"] = values[0], values[-1]
    summary["train_runtime"] = next((e["train_runtime"] for e in history if "train_runtime" in e), None)
    return summary


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


def run(args) -> None:
    from study.pins import pin_numerics
    from train.demo import Clock, train

    pin_numerics()
    study, folder = Path(args.study), Path(args.out) / args.name
    data, backbone = study / "synthetic-spy-tune", study / "backbone"
    for needed in (data / "train_data.json", backbone / "config.json"):
        if not needed.exists():
            sys.exit(f"error: {needed}: missing; build the study's backbone first (python -m study --protocol "
                     f"tuned --out {study})")
    log = Clock()
    save = min(args.eval_steps)
    extra = ["--seed", str(args.seed), "--lr_scheduler_type", "constant_with_warmup", "--save_steps", str(save),
             "--save_total_limit", "1000", "--logging_steps", "1",
             "--general_data_path", str(data / "general_train.json"), *args.train_args]
    train("grpo", backbone, data, folder / "train", args.steps, log, extra, ROOT / "recipes" / "study" / "grpo.yaml")
    summary = {"name": args.name, "steps": args.steps, "seed": args.seed, "train_args": args.train_args,
               **summarize(json.loads((folder / "train" / "train_metrics.json").read_text()))}
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
    columns = ["frac_reward_zero_std", "dynamic_sampling/dropped_share", "dynamic_sampling/extra_rounds",
               "groups/zero_spread/reject", "groups/reject_with_refusal", "groups/zero_spread/respond",
               "groups/zero_spread/general", "groups/spread_only/helpfulness", "kl last"]
    evals = sorted({k for r in rows for k in r if k.split()[0] in ("val", "test")},
                   key=lambda k: (k.split()[0], int(k.split()[1])))
    head = ["run", "settings", *columns, *[f"{k}: {m}" for k in evals for m in ("ICS", "general")]]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        cells = [r["name"], " ".join(r["train_args"]) or "recipe", *[_fmt(r.get(c)) for c in columns]]
        cells += [_fmt(r[k][m]) if k in r else "–" for k in evals for m in ("ics", "general")]
        print("| " + " | ".join(cells) + " |")


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
    one.add_argument("--train-args", nargs=argparse.REMAINDER, default=[])
    commands.add_parser("table", help="every run's row")
    args = parser.parse_args(argv)
    if args.command == "run" and (any(s < 1 or s > args.steps for s in args.eval_steps)
                                  or any(s % min(args.eval_steps) for s in [*args.eval_steps, args.steps])):
        parser.error("--eval-steps: steps within --steps, each (and --steps) a multiple of the first")
    {"run": run, "table": table}[args.command](args)


if __name__ == "__main__":
    main()
