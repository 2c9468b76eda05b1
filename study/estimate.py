"""How long the tuned protocol takes, estimated from a recorded study: its runs at the protocol's default settings and
their time (`python -m study.tuned estimate`).

May import: cli, train (the method names); the study's protocol, selection and results.
"""

from __future__ import annotations

from study.protocol import TUNED_STEPS
from study.results import budget_names
from study.selection import BETA_METHODS
from train.common import METHOD_NAMES

# What a run costs besides its training steps, in seconds, measured on the development machine with two runs at once
# (benchmarks/study_overhead.py, benchmarks/results/study_overhead.json): a training launch (accelerate, imports,
# data, model, saving checkpoints: the run's wall time less its train_runtime) and one checkpoint's evaluation on the
# validation split (the first after the launch: it loads the evaluation's code), on the held-out bench without
# distractors, and with both settings. The backbone's phase (building the data and the tiny model, its 300 steps,
# its evaluations with self-moderation and on the validation split, the compute plan) runs alone before the sweep:
# 366 s in the log of `--kept-from docs/study_tuned_issue33.json --methods nca_p nca --seeds 0` (docs/study.md) plus
# the validation evaluation.
OVERHEAD_SECONDS = {"launch": 15.5, "val": 11.5, "test": 7.4, "test_both": 16.7, "backbone": 378.0}
RECORDED_GRPO_SAMPLES = 16  # the recorded study's GRPO step: 4 prompts x G 4, one generation round


def estimate(recorded: dict, methods: list[str], sweep_seeds: int, seeds: int, jobs: int, rounds: float = 2.0,
             overhead: dict | None = None) -> dict:
    """The protocol's runs at its default settings and their time on this machine: each method's training step from
    the recorded study's final runs (their mean train_runtime over its steps, under --jobs 2 as recorded), GRPO's
    scaled by its recipe's compute per step now against then (recipes/study/grpo.yaml's samples, `rounds` generation
    rounds: dynamic sampling; one then), and OVERHEAD_SECONDS per launch and evaluation; the parallel phases divided
    by `jobs`. Where a method keeps another setting for 1x than for 3x, its 1x runs add `common_each`."""
    from cli import strict_yaml
    from train.demo import ROOT

    overhead = overhead or OVERHEAD_SECONDS
    long_steps = recorded["budgets"][budget_names(recorded)[-1]]
    steps, factor = TUNED_STEPS, 3
    step_seconds = {}
    for m in methods:
        runs = [r["training"]["train_runtime"] for r in recorded["final"][m]["runs"].values()]
        step_seconds[m] = sum(runs) / len(runs) / long_steps
    if "grpo" in step_seconds:
        recipe = strict_yaml.load(ROOT / "recipes" / "study" / "grpo.yaml")
        samples = recipe["per_device_train_batch_size"] * recipe.get("gradient_accumulation_steps", 1)
        step_seconds["grpo"] *= samples * (4 + rounds) / (RECORDED_GRPO_SAMPLES * 5)  # train/compute.py's weights
    n_lr, n_beta = 3, 1  # add_arguments' defaults: lr x 1/3, 1, 3; beta x 3 beside the paper's
    points = {m: n_lr + (n_beta if m in BETA_METHODS else 0) for m in methods}
    curve = factor  # checkpoints at 30, 60, 90
    sweep_run = {m: overhead["launch"] + factor * steps * step_seconds[m] + 2 * overhead["val"] for m in methods}
    long_run = {m: overhead["launch"] + factor * steps * step_seconds[m] + (curve - 2) * overhead["test"]
                + 2 * overhead["test_both"] for m in methods}
    # a method that keeps another 1x setting: its 1x runs, less the long runs' second both-settings evaluation
    common_run = {m: overhead["launch"] + steps * step_seconds[m] + overhead["test"] for m in methods}
    sweep_total = sum(points[m] * sweep_seeds * sweep_run[m] for m in methods)
    final_total = sum(seeds * long_run[m] for m in methods)
    serial = overhead["backbone"]
    base = serial + (sweep_total + final_total) / jobs
    common_each = {m: seeds * common_run[m] / jobs for m in methods}
    return {"step_seconds": step_seconds, "points": points, "sweep_runs": sum(points.values()) * sweep_seeds,
            "final_runs": seeds * len(methods), "serial": serial, "sweep": sweep_total / jobs,
            "final": final_total / jobs, "total": base, "common_each": common_each,
            "total_all_common": base + sum(common_each.values()), "overhead": overhead, "rounds": rounds,
            "jobs": jobs}


def estimate_text(e: dict) -> str:
    lines = ["training step (s): " + ", ".join(f"{METHOD_NAMES[m]} {s:.2f}" for m, s in e["step_seconds"].items())
             + f" (GRPO at {e['rounds']:g} generation rounds)",
             "overhead (s): " + ", ".join(f"{k} {v:.0f}" for k, v in e["overhead"].items()),
             f"backbone phase {e['serial'] / 60:.1f} min; sweep: {e['sweep_runs']} runs, {e['sweep'] / 60:.1f} min; "
             f"final: {e['final_runs']} runs, {e['final'] / 60:.1f} min (--jobs {e['jobs']})",
             f"total {e['total'] / 60:.0f} min where every method keeps one setting for both budgets; each method "
             "that keeps another one for 1x adds " + ", ".join(f"{METHOD_NAMES[m]} {s / 60:.1f}"
                                                             for m, s in e["common_each"].items())
             + f" min (all of them: {e['total_all_common'] / 60:.0f} min)"]
    return "\n".join(lines)


