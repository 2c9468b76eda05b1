"""One run of the tuned study: trained through the study's launcher (train/demo.py's `train`, resumed from its last
checkpoint, reused once finished), its checkpoints evaluated on the validation split or the held-out bench
(eval/suites/study.yaml), and what its log says it processed (compute, time, GRPO's group statistics); the sweep's
and the final phase's tasks, and the pool that runs them `--jobs` at a time.

May import: eval, train and the study's methods and text; no other file of the study (they sit above this one).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from study.methods import TWO_STAGE, first_steps, offset, script
from study.text import fmt
from train.resume import FINISHED

# What a GRPO run's logs say about its groups (means over the logged steps of a run up to a budget): TRL's share of
# groups whose rewards do not vary, the KL to the reference, the mean reward and completion length, and every key
# logged under these prefixes (losses/grpo_trainer.py): dynamic sampling, generation counts, the group statistics
# per kind of prompt (groups/reject_with_refusal: refusal-expected groups holding a refusal), the guidance (the
# share of groups guided, the guides' advantage, the supervised term)
GROUP_KEYS = ("frac_reward_zero_std", "kl", "reward", "reward_std", "completions/mean_length")
GROUP_PREFIXES = ("dynamic_sampling/", "generation/", "groups/", "guidance/", "guided/")


def point_name(method: str, point: dict, seed: int) -> str:
    beta = f"-beta{point['beta']:.3g}" if "beta" in point else ""
    return f"{method}-lr{point['learning_rate']:.3g}{beta}-seed{seed}"


def flat_metrics(sections: dict) -> dict:
    """One evaluated checkpoint as METRICS keys (those its sections hold), with the item counts behind ICS and the
    general accuracy (`n_ics`, `n_general`: a score's measurement noise)."""
    from eval.general.composite import composite_from_general

    general = sections["synthetic_general"]
    values = {"general": general["accuracy"], "n_general": general.get("n"),
              **{k: general["breakdown"][k] for k in ("refusal", "wrong_colour", "malformed")}}
    for setting, suffix in (("without_distractors", ""), ("with_distractors", "_distr")):
        m = sections["spy"].get(setting)
        if m is None:
            continue
        values.update({f"ics{suffix}": m["ics"], f"hms{suffix}": m["hms"]})
        if m["ics"] is not None and m["hms"] is not None:  # undefined on tiny test sets
            scores = composite_from_general(m["ics"], m["hms"], values["general"])
            values[f"overall{suffix}"] = scores["overall"]
            if not suffix:
                values["priv"] = scores["priv"]
        if not suffix:
            values.update({"rta": m["rta_nonconflict"], "ata": m["ata_nonconflict"],
                           "n_ics": m.get("counts", {}).get("ics", {}).get("all")})
    return values


def evaluate(ctx: dict, model: Path, name: str, split: str, both_settings: bool) -> dict:
    """A checkpoint through eval/suites/study.yaml on the validation split or the held-out bench (resumable)."""
    from eval.suite import run_suite
    from train.demo import ROOT

    data = "synthetic-spy-tune"
    spy = {"limit": ctx["eval_limit"],
           "settings": ["without_distractors", "with_distractors"] if both_settings else ["without_distractors"]}
    general = {"limit": ctx["eval_limit"]}
    if split == "val":
        spy["items"], general["data"] = f"{data}/val_questions.json", f"{data}/general_val.json"
    overrides = {"backend_options": {"batch_size": ctx["eval_batch_size"], "max_new_tokens": ctx["max_new_tokens"]},
                 "sections": {"spy": spy, "synthetic_general": general}}
    sections = run_suite(ROOT / "eval" / "suites" / "study.yaml", str(model), Path(ctx["out"]) / "suite" / name,
                         root=ctx["out"], overrides=overrides)["sections"]
    return flat_metrics(sections)


def _clock(ctx: dict):
    from train.demo import Clock

    log = Clock()
    log.start = ctx["start"]
    return log


def train_run(ctx: dict, method: str, point: dict, seed: int, folder: Path, steps: int, save_every: int, log) -> bool:
    """One training run through the study's launcher (resumed from its last checkpoint, reused once finished), from
    the backbone or, for a two-stage method, from its first stage's run of this seed; True where this call
    trained."""
    from train.demo import ROOT, train

    trained = not (folder / FINISHED).exists()
    extra = ["--seed", str(seed), "--learning_rate", repr(point["learning_rate"]),
             "--lr_scheduler_type", "constant_with_warmup", "--save_steps", str(save_every),
             "--save_total_limit", "1000", *(["--beta", repr(point["beta"])] if "beta" in point else []),
             *general_data(ctx, method), *ctx["train_args"]]
    start = first_stage(ctx, method, seed) if method in TWO_STAGE else Path(ctx["backbone"])
    train(script(method), start, Path(ctx["data"]), folder, steps, log, extra,
          ROOT / "recipes" / "study" / f"{method}.yaml")
    return trained


def general_data(ctx: dict, method: str) -> list[str]:
    """The study data's general-task file, for a recipe that mixes it in (its general_data_path names the default
    study folder's)."""
    from cli import strict_yaml
    from train.demo import ROOT

    recipe = strict_yaml.load(ROOT / "recipes" / "study" / f"{method}.yaml")
    return ["--general_data_path", str(Path(ctx["data"]) / "general_train.json")] if recipe.get("general_data_path") \
        else []


def first_stage(ctx: dict, method: str, seed: int) -> Path:
    """A two-stage method's first stage for a seed (TWO_STAGE): its recipe trained from the backbone, once per seed,
    shared by every sweep point of that seed."""
    first = TWO_STAGE[method]["first"]
    return Path(ctx["out"]) / "first_stage" / f"{first}-seed{seed}"


def first_stage_task(ctx: dict, method: str, seed: int) -> dict:
    """Train a two-stage method's first stage for a seed (before the runs that start from it: two jobs never train
    the same folder)."""
    from train.demo import ROOT, train

    first, folder = TWO_STAGE[method]["first"], first_stage(ctx, method, seed)
    trained = not (folder / FINISHED).exists()
    train("sft", Path(ctx["backbone"]), Path(ctx["data"]), folder, first_steps(method, ctx["steps"]), _clock(ctx),
          ["--seed", str(seed), *general_data(ctx, first), *ctx["train_args"]],
          ROOT / "recipes" / "study" / f"{first}.yaml")
    return {"trained": trained}


def stage_steps(ctx: dict, method: str, steps: list[int]) -> tuple[list[int], int]:
    """The steps of a method's own run at these budget steps (a two-stage method's second stage trains `offset`
    fewer) and the checkpoint interval that saves each of them."""
    own = [s - offset(method, ctx["steps"]) for s in steps]
    return own, math.gcd(*own)


# --------------------------------------------------------------------------------------- what a run processed
def elapsed_at(log_text: str, step: int, total: int) -> float | None:
    """Seconds of training when the progress bar of a `total`-step run first reached `step` (its log); None where the
    bar never showed it there (a run resumed past it: its log holds the resumed part only)."""
    found = re.search(rf"(?<!\d){step}/{total} \[(?:(\d+):)?(\d+):(\d+)[<\]]", log_text)
    if not found:
        return None
    hours, minutes, seconds = (int(g) if g else 0 for g in found.groups())
    return float(hours * 3600 + minutes * 60 + seconds)


def group_statistics(history: list[dict], step: int) -> dict:
    """GRPO's logged group statistics (GROUP_KEYS, GROUP_PREFIXES), each the mean over its entries up to `step`."""
    values: dict[str, list[float]] = {}
    for entry in history:
        if not isinstance(entry.get("step"), int) or entry["step"] > step:
            continue
        for key, value in entry.items():
            if (key in GROUP_KEYS or key.startswith(GROUP_PREFIXES)) and isinstance(value, (int, float)) \
                    and math.isfinite(value):
                values.setdefault(key, []).append(float(value))
    return {k: sum(v) / len(v) for k, v in values.items()}


def run_record(folder: Path, method: str, point: dict, total: int, steps: list[int], first: Path | None = None,
               skip: int = 0) -> dict:
    """str(step) -> what a finished run of `total` steps had processed by each of `steps`: its compute (thousands of
    forward-token equivalents, train/compute.py; None where its log cannot say), its training time (train_runtime at
    its last step, the progress bar's elapsed time before) and, for the GRPOs, their group statistics. `first`: a
    two-stage method's first-stage run, whose whole compute and time count at every step; the keys are the budget
    steps, each step plus `skip` (the method's offset)."""
    from train.compute import run_compute

    before = {"compute": 0.0, "seconds": 0.0}
    if first is not None:
        history = json.loads((first / "train_metrics.json").read_text())
        last = max(e["step"] for e in history if isinstance(e.get("step"), int))
        before = {"compute": run_compute(history, last, "sft", None)["compute"],
                  "seconds": next((e["train_runtime"] for e in reversed(history) if "train_runtime" in e), None)}
    history = json.loads((folder / "train_metrics.json").read_text())
    log_path = folder.parent / "logs" / f"{folder.name}.log"
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    runtime = next((e["train_runtime"] for e in reversed(history) if "train_runtime" in e), None)
    record = {}
    for step in steps:
        counted = run_compute(history, step, script(method), point.get("beta"))
        compute = counted["compute"]
        seconds = runtime if step == total else elapsed_at(log_text, step, total)
        known = None not in (compute, before["compute"])
        entry = {"compute_k": (compute + before["compute"]) / 1000 if known else None,
                 "train_seconds": seconds + before["seconds"] if None not in (seconds, before["seconds"]) else None}
        if "reference_rule" in counted:  # which rows the reference was counted on (train/compute.py)
            entry["compute_rule"] = counted["reference_rule"]
        if first is not None:  # trained before this run, in its own launch (the estimate's calibration)
            entry["first_stage_seconds"] = before["seconds"]
        if script(method) == "grpo":
            entry["logged"] = group_statistics(history, step)
        record[str(step + skip)] = entry
    return record


# ------------------------------------------------------------------------------------------------- the runs
def sweep_task(ctx: dict, method: str, point: dict, seed: int) -> dict:
    """One sweep run: trained to the long budget with a checkpoint at the common one, both evaluated on the
    validation split; budget -> values, with whether this call trained it and its wall time (training and
    evaluations)."""
    start = time.time()
    log = _clock(ctx)
    name = point_name(method, point, seed)
    folder = Path(ctx["out"]) / "sweep" / name
    budgets = ctx["budgets"]
    own, every = stage_steps(ctx, method, list(budgets.values()))
    trained = train_run(ctx, method, point, seed, folder, own[-1], every, log)
    processed = run_record(folder, method, point, own[-1], own, first_of(ctx, method, seed),
                           offset(method, ctx["steps"]))
    values = {}
    for (budget, step), at in zip(budgets.items(), own):
        values[budget] = {**evaluate(ctx, folder / f"checkpoint-{at}", f"sweep/{name}/step{step}", "val", False),
                          **processed[str(step)]}
    log(f"sweep {name}: validation overall " + ", ".join(f"{fmt(v.get('overall'))} at {b}" for b, v in values.items()))
    return {**values, "trained": trained, "wall_seconds": round(time.time() - start, 1)}


def first_of(ctx: dict, method: str, seed: int) -> Path | None:
    return first_stage(ctx, method, seed) if method in TWO_STAGE else None


def final_task(ctx: dict, method: str, point: dict, seed: int, total: int) -> dict:
    """One final run of `total` budget steps (the long budget: every curve checkpoint evaluated on the held-out
    bench; the common budget at a setting of its own: its last checkpoint), both settings at each budget it serves."""
    from train.demo import training_summary

    start = time.time()
    log = _clock(ctx)
    own_1x = total == ctx["steps"] and ctx["steps"] != ctx["long_steps"]  # the common budget's own run
    name = f"{method}-1x-seed{seed}" if own_1x else f"{method}-seed{seed}"
    folder = Path(ctx["out"]) / "runs" / name
    steps = [total] if own_1x else [s for s in curve_steps(ctx) if s > offset(method, ctx["steps"])]
    serves = [total] if own_1x else [ctx["long_steps"], *([ctx["steps"]] if ctx["common_from_long"][method] else [])]
    own, every = stage_steps(ctx, method, steps)
    trained = train_run(ctx, method, point, seed, folder, own[-1], every, log)
    processed = run_record(folder, method, point, own[-1], own, first_of(ctx, method, seed),
                           offset(method, ctx["steps"]))
    values = {}
    for step, at in zip(steps, own):
        values[str(step)] = {**evaluate(ctx, folder / f"checkpoint-{at}", f"runs/{name}/step{step}", "test",
                                        step in serves), **processed[str(step)]}
    log(f"final {name}: held-out overall " + ", ".join(f"{fmt(values[str(s)].get('overall'))} at {s} steps"
                                                      for s in serves))
    return {"steps": values, "training": training_summary(folder), "run": name, "trained": trained,
            "wall_seconds": round(time.time() - start, 1)}


def curve_steps(ctx: dict) -> list[int]:
    return sorted({*range(ctx["curve_every"], ctx["long_steps"] + 1, ctx["curve_every"]), ctx["steps"],
                   ctx["long_steps"]})


def _call(task):
    kind, ctx, *rest = task
    try:
        return {"sweep": sweep_task, "final": final_task, "backbone": backbone_task,
                "first_stage": first_stage_task}[kind](ctx, *rest)
    except SystemExit as stop:  # train()'s failure line: carried to the parent, which exits with it
        return {"exit": stop.code}


def backbone_task(ctx: dict) -> dict:
    """The backbone on the validation split: where every sweep point starts, and what `moved` measures from."""
    return evaluate(ctx, Path(ctx["backbone"]), "sweep/backbone", "val", False)


def run_tasks(tasks: list[tuple], jobs: int) -> list[dict]:
    """The tasks in order, `jobs` at a time (spawned processes: each imports torch once and evaluates in-process)."""
    if jobs == 1:
        results = [_call(t) for t in tasks]
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            results = list(pool.map(_call, tasks))
    for result in results:
        if "exit" in result:
            sys.exit(result["exit"])
    return results


