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

from study.methods import script
from study.text import fmt

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
    """One training run through the study's launcher (resumed from its last checkpoint, reused once finished);
    True where this call trained."""
    from train.demo import ROOT, train

    trained = not (folder / "train_metrics.json").exists()
    extra = ["--seed", str(seed), "--learning_rate", repr(point["learning_rate"]),
             "--lr_scheduler_type", "constant_with_warmup", "--save_steps", str(save_every),
             "--save_total_limit", "1000", *(["--beta", repr(point["beta"])] if "beta" in point else []),
             *(["--general_data_path", str(Path(ctx["data"]) / "general_train.json")] if script(method) == "grpo" else []),
             *ctx["train_args"]]
    train(script(method), Path(ctx["backbone"]), Path(ctx["data"]), folder, steps, log, extra,
          ROOT / "recipes" / "study" / f"{method}.yaml")
    return trained


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


def run_record(folder: Path, method: str, point: dict, total: int, steps: list[int]) -> dict:
    """str(step) -> what a finished run of `total` steps had processed by each of `steps`: its compute (thousands of
    forward-token equivalents, train/compute.py; None where its log cannot say), its training time (train_runtime at
    its last step, the progress bar's elapsed time before) and, for the GRPOs, their group statistics."""
    from train.compute import run_compute

    history = json.loads((folder / "train_metrics.json").read_text())
    log_path = folder.parent / "logs" / f"{folder.name}.log"
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    runtime = next((e["train_runtime"] for e in reversed(history) if "train_runtime" in e), None)
    record = {}
    for step in steps:
        counted = run_compute(history, step, script(method), point.get("beta"))
        compute = counted["compute"]
        record[str(step)] = {"compute_k": None if compute is None else compute / 1000,
                             "train_seconds": runtime if step == total else elapsed_at(log_text, step, total)}
        if "reference_rule" in counted:  # which rows the reference was counted on (train/compute.py)
            record[str(step)]["compute_rule"] = counted["reference_rule"]
        if script(method) == "grpo":
            record[str(step)]["logged"] = group_statistics(history, step)
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
    trained = train_run(ctx, method, point, seed, folder, ctx["long_steps"], ctx["steps"], log)
    processed = run_record(folder, method, point, ctx["long_steps"], list(budgets.values()))
    values = {}
    for budget, step in budgets.items():
        values[budget] = {**evaluate(ctx, folder / f"checkpoint-{step}", f"sweep/{name}/step{step}", "val", False),
                          **processed[str(step)]}
    log(f"sweep {name}: validation overall " + ", ".join(f"{fmt(v.get('overall'))} at {b}" for b, v in values.items()))
    return {**values, "trained": trained, "wall_seconds": round(time.time() - start, 1)}


def final_task(ctx: dict, method: str, point: dict, seed: int, total: int) -> dict:
    """One final run of `total` steps (the long budget: every curve checkpoint evaluated on the held-out bench; the
    common budget at a setting of its own: its last checkpoint), both settings at each budget it serves."""
    from train.demo import training_summary

    start = time.time()
    log = _clock(ctx)
    own = total == ctx["steps"] and ctx["steps"] != ctx["long_steps"]  # the common budget's own run
    name = f"{method}-1x-seed{seed}" if own else f"{method}-seed{seed}"
    folder = Path(ctx["out"]) / "runs" / name
    steps = [total] if own else curve_steps(ctx)
    serves = [total] if own else [ctx["long_steps"], *([ctx["steps"]] if ctx["common_from_long"][method] else [])]
    trained = train_run(ctx, method, point, seed, folder, total, ctx["steps"] if own else ctx["curve_every"], log)
    processed = run_record(folder, method, point, total, steps)
    values = {}
    for step in steps:
        values[str(step)] = {**evaluate(ctx, folder / f"checkpoint-{step}", f"runs/{name}/step{step}", "test",
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
        return {"sweep": sweep_task, "final": final_task, "backbone": backbone_task}[kind](ctx, *rest)
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


