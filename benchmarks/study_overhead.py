"""What a run of the tuned study costs besides its training steps, on this machine: the numbers behind
study/estimate.py's OVERHEAD_SECONDS and `python -m study.tuned estimate` (docs/study.md, "Sizing").

    python benchmarks/study_overhead.py OUT [--jobs 2] [--json benchmarks/results/study_overhead.json]

In OUT (a new folder, or one this script made), with the tuned study's own functions and defaults: builds the data,
the tiny model and the helpful backbone (timed: the backbone phase, with its evaluations with self-moderation and on
the validation split, and the compute plan), then `--jobs` DPO runs at once, each as a final run is (90 steps of the
study's recipe, a checkpoint every 30), timing the launch (the run's wall time less its train_runtime) and one
evaluation of each kind (validation split; held-out bench without distractors; both settings). Prints the means as
JSON. It is not a test: its times depend on the machine's load, which it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def measured_run(ctx: dict, seed: int) -> dict:
    """One final-like DPO run, timed part by part (runs in a spawned worker as the study's runs do)."""
    from study.runs import _clock, evaluate, train_run

    out = Path(ctx["out"])
    folder = out / "runs" / f"dpo-seed{seed}"
    point = {"learning_rate": 3e-4, "beta": 0.5}
    start = time.time()
    train_run(ctx, "dpo", point, seed, folder, ctx["long_steps"], ctx["steps"], _clock(ctx))
    wall = time.time() - start
    runtime = next(e["train_runtime"] for e in json.loads((folder / "train_metrics.json").read_text())[::-1]
                   if "train_runtime" in e)
    times = {"launch": wall - runtime, "train_runtime": runtime}
    for kind, step, split, both in (("val", 30, "val", False), ("test", 60, "test", False),
                                    ("test_both", 90, "test", True)):
        start = time.time()
        evaluate(ctx, folder / f"checkpoint-{step}", f"runs/dpo-seed{seed}/{kind}", split, both)
        times[kind] = time.time() - start
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    from study.pins import pin_numerics

    pin_numerics()
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from study.__main__ import build_start, parse
    from study.protocol import PLAN_SAMPLE, TUNED_STEPS
    from study.quick import evaluate as evaluate_backbone
    from study.runs import evaluate
    from train.compute import study_plan
    from train.demo import ROOT, Clock

    out = Path(args.out)
    study_args, _ = parse(["--protocol", "tuned", "--out", str(out)])
    log = Clock()
    load = open("/proc/loadavg").read().split()[:3]
    start = time.time()
    data, backbone = build_start(study_args, out, log)
    model = out / "tiny-qwen2vl"
    evaluate_backbone("backbone", backbone, out, study_args, log, self_moderation=True)
    ctx = {"out": str(out), "backbone": str(backbone), "data": str(data), "start": log.start, "steps": TUNED_STEPS,
           "long_steps": 3 * TUNED_STEPS, "eval_limit": None, "eval_batch_size": study_args.eval_batch_size,
           "max_new_tokens": study_args.max_new_tokens, "train_args": []}
    evaluate(ctx, backbone, "sweep/backbone", "val", False)
    study_plan(data, model, ROOT / "recipes" / "study", ["sft", "dpo", "nca", "nca_p", "grpo"], sample=PLAN_SAMPLE)
    backbone_phase = time.time() - start
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        runs = list(pool.map(measured_run, [ctx] * args.jobs, range(args.jobs)))
    result = {"jobs": args.jobs, "load_before": load, "load_after": open("/proc/loadavg").read().split()[:3],
              "backbone": backbone_phase, "runs": runs,
              **{k: sum(r[k] for r in runs) / len(runs) for k in ("launch", "train_runtime", "val", "test",
                                                                    "test_both")}}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
