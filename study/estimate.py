"""How long the tuned protocol takes, estimated from a recorded study (`python -m study.tuned estimate`): never from
this machine. What it reads from the recorded study.json:

- each method's training time per step: its final runs' mean train_runtime over their long budget; a method the
  recorded study lacks, from the method whose steps stand for its own (STEPS_OF: a method with the general task
  mixed in, from the same method without; SFT then guided GRPO, from guided GRPO, and its first stage from SFT); a
  GRPO recipe that changed since, or a GRPO method timed from another, scaled by the samples per step;
- what a run costs besides its training (the launch, each checkpoint's evaluation): the benchmark's parts
  (OVERHEAD_SECONDS, benchmarks/study_overhead.py) times one factor calibrated on the recorded study: from its runs'
  own wall times (layout 3 records them) or else from its measured wall time, when that invocation ran the whole
  study (layout 2: every final run trained, the sweep assumed with it); the factor 1 (the benchmark as measured) where
  neither can say;
- the phase before the sweep (data, tiny model, backbone) from its record (layout 3, not resumed), else
  OVERHEAD_SECONDS.

The protocol's runs are counted from its settings (the sweep's stages, the refinement, the seeds, the methods that
keep another setting for 1x), and the parallel phases divided by --jobs. `check` holds the estimate of another
recorded study's own runs against its measured wall time.

May import: cli, train (the repository's root); the study's methods, protocol, selection and results.
"""

from __future__ import annotations

from study.methods import NAMES, TWO_STAGE, first_steps, offset, script, with_first_stages
from study.protocol import TUNED_STEPS
from study.results import budget_names
from study.selection import BETA_METHODS

# What a run costs besides its training steps, in seconds, measured on the development machine with two runs at once
# (benchmarks/study_overhead.py, benchmarks/results/study_overhead.json, load average 2-5): a training launch
# (accelerate, imports, data, model, saving checkpoints) and one checkpoint's evaluation on the validation split, on
# the held-out bench without distractors, and with both settings; the backbone's phase (366 s in the log of issue
# 33's cross-machine check plus the validation evaluation).
OVERHEAD_SECONDS = {"launch": 15.5, "val": 11.5, "test": 7.4, "test_both": 16.7, "backbone": 378.0}
RECORDED_JOBS = 2  # a layout-2 study does not record --jobs; both published ones ran with 2 (the Makefile's)
# method -> the recorded methods whose training steps stand for its own, in order of preference (a general-task row is
# shorter than a SPY row, so the general variants' steps are if anything cheaper; the GRPOs are scaled by their samples)
STEPS_OF = {"sft": ["sft"], "dpo": ["dpo"], "nca": ["nca"], "nca_p": ["nca_p"], "grpo": ["grpo"],
            "grpo_guided": ["grpo_guided", "grpo"], "sft_general": ["sft_general", "sft"],
            "dpo_general": ["dpo_general", "dpo"], "nca_p_general": ["nca_p_general", "nca_p"],
            "sft_grpo_guided": ["sft_grpo_guided", "grpo_guided", "grpo"], "sft_cold_start": ["sft_general", "sft"]}


def _samples(method: str) -> int:
    from cli import strict_yaml
    from train.demo import ROOT

    recipe = strict_yaml.load(ROOT / "recipes" / "study" / f"{method}.yaml")
    return recipe["per_device_train_batch_size"] * recipe.get("gradient_accumulation_steps", 1)


def step_seconds(recorded: dict, methods: list[str], samples: dict | None = None) -> dict:
    """method -> seconds of training per step in the recorded study's final runs (long budget) of the first method
    of STEPS_OF it has, a GRPO scaled by its samples per step now (`samples`, default: its recipe's) against the
    recorded plan's; the two-stage methods' first stages too."""
    long_steps = recorded["budgets"][budget_names(recorded)[-1]]
    result = {}
    for m in with_first_stages(methods):
        source = next((s for s in STEPS_OF[m] if s in recorded["final"]), None)
        if source is None:
            raise ValueError(f"the recorded study has no runs of {' or '.join(STEPS_OF[m])} to time {m} by")
        runs = recorded["final"][source]["runs"].values()
        # a two-stage run's train_runtime is its second stage's (its record's time adds the first stage's)
        own = long_steps - offset(source, recorded["budgets"]["1x"])
        result[m] = sum(r["training"]["train_runtime"] for r in runs) / len(runs) / own
        if script(m) == "grpo":
            now = (samples or {}).get(m) or _samples(m)
            result[m] *= now / recorded["plan"][source]["cases"]
    return result


def run_counts(methods: list[str], sweep_seeds: int, seeds: int, lr_points: int = 3, beta_new: int = 1,
               refine_new: dict | None = None, own_1x: list[str] = ()) -> dict:
    """The protocol's runs per method: sweep runs (points x sweep seeds: lr_points, the betas new beside the paper's,
    `refine_new` refinement points, default 7 per beta method and 2 for SFT: the 3 x 3 grid less its centre and the
    point the coordinate stages already tried), final runs at the long budget, and 1x runs of their own for the
    methods in `own_1x`."""
    refine = refine_new if refine_new is not None else {m: 7 if m in BETA_METHODS else 2 for m in methods}
    points = {m: lr_points + (beta_new if m in BETA_METHODS else 0) + refine.get(m, 0) for m in methods}
    return {"points": points, "sweep": {m: points[m] * sweep_seeds for m in methods},
            "final": {m: seeds for m in methods}, "common": {m: seeds if m in own_1x else 0 for m in methods},
            "first": {m: sweep_seeds + seeds for m in methods if m in TWO_STAGE}}


def run_seconds(kind: str, steps: int, per_step: float, overhead: dict, curve_points: int = 3,
                serves_1x: bool = True) -> dict:
    """One run's seconds: its training, and its overhead (launch and evaluations) at OVERHEAD_SECONDS' scale."""
    if kind == "sweep":  # both budgets' checkpoints on the validation split
        extra = overhead["launch"] + 2 * overhead["val"]
    elif kind == "final":  # every curve checkpoint; both settings at the budgets it serves
        both = 2 if serves_1x else 1
        extra = overhead["launch"] + (curve_points - both) * overhead["test"] + both * overhead["test_both"]
    elif kind == "common":  # a 1x run of its own
        extra = overhead["launch"] + overhead["test_both"]
    else:  # a two-stage method's first stage: trained, not evaluated
        extra = overhead["launch"]
    return {"train": steps * per_step, "overhead": extra}


def resumed_phase(study: dict) -> tuple[str, dict] | None:
    """(phase, its counts) of the first phase of which the invocation that wrote `study` trained only a part (its
    other runs reused from an earlier one), or None: a resumed study's wall time and phases are its last part's."""
    for phase in ("final_runs", "sweep_runs"):
        counted = study.get(phase)
        if counted and counted["trained"] < counted["all"]:
            return phase, counted
    return None


def backbone_seconds(recorded: dict) -> float:
    """The phase before the sweep: as the recorded study measured it, unless that study was resumed (its backbone
    then reused, its phase a few seconds): the benchmark's figure."""
    phases = recorded.get("phases", {})
    if "backbone" in phases and resumed_phase(recorded) is None:
        return phases["backbone"]
    return OVERHEAD_SECONDS["backbone"]


def calibration(recorded: dict) -> tuple[float, str]:
    """The factor on OVERHEAD_SECONDS that the recorded study supports, and how it was found."""
    long, curve_points = budget_names(recorded)[-1], len(recorded["curve_steps"])
    runs = []  # (trained here, measured wall or None, training seconds, overhead at the benchmark's scale)
    for entry in recorded["sweep"].values():
        for p in entry.get("points", []):
            for run in p["seeds"].values():
                seconds = (run[long].get("train_seconds") or 0.0) - run[long].get("first_stage_seconds", 0.0)
                runs.append((run.get("trained", True), run.get("wall_seconds"), seconds,
                             run_seconds("sweep", 0, 0, OVERHEAD_SECONDS)["overhead"]))
    for entry in recorded["final"].values():
        serves = entry["kept"]["1x"] == entry["kept"][long]
        for key, kind in (("runs", "final"), ("runs_1x", "common")):
            for run in entry.get(key, {}).values():
                runs.append((run.get("trained", True), run.get("wall_seconds"),
                             run["training"].get("train_runtime", 0.0),
                             run_seconds(kind, 0, 0, OVERHEAD_SECONDS, curve_points, serves)["overhead"]))
    timed = [(w, t, o) for trained, w, t, o in runs if trained and w is not None]
    if timed:
        return sum(w - t for w, t, _ in timed) / sum(o for *_, o in timed), f"its {len(timed)} runs' own wall times"
    if recorded.get("final_runs") and resumed_phase(recorded) is None and runs:
        jobs = recorded.get("jobs", RECORDED_JOBS)
        backbone = backbone_seconds(recorded)
        spare = (recorded["wall_seconds"] - backbone) * jobs - sum(t for _, _, t, _ in runs)
        if spare > 0:
            return spare / sum(o for *_, o in runs), (
                f"its measured wall time ({recorded['wall_seconds']:.0f} s with --jobs {jobs}"
                f"{'' if 'jobs' in recorded else ' (assumed)'}; every final run trained, the sweep assumed too)")
    return 1.0, "none (the benchmark's parts as measured)"


def estimate(recorded: dict, methods: list[str], sweep_seeds: int, seeds: int, jobs: int, own_1x: list[str] = (),
             refine_new: dict | None = None, beta_new: int = 1, steps: int = TUNED_STEPS, factor: int = 3,
             samples: dict | None = None, lr_points: int = 3) -> dict:
    """The protocol's runs at these settings and their time, from the recorded study (see the module's text)."""
    per_step = step_seconds(recorded, methods, samples)
    scale, basis = calibration(recorded)
    overhead = {k: v * scale for k, v in OVERHEAD_SECONDS.items() if k != "backbone"}
    counts = run_counts(methods, sweep_seeds, seeds, lr_points, beta_new, refine_new, own_1x)
    long_steps = steps * factor
    seconds = {"sweep": 0.0, "final": 0.0}
    each_common = {}
    for m in methods:
        skip = offset(m, steps)  # a two-stage method's second stage trains this many steps fewer
        sweep = run_seconds("sweep", long_steps - skip, per_step[m], overhead)
        final = run_seconds("final", long_steps - skip, per_step[m], overhead, factor, m not in own_1x)
        common = run_seconds("common", steps - skip, per_step[m], overhead)
        seconds["sweep"] += counts["sweep"][m] * sum(sweep.values())
        seconds["final"] += counts["final"][m] * sum(final.values()) + counts["common"][m] * sum(common.values())
        each_common[m] = seeds * sum(common.values()) / jobs
        if m in TWO_STAGE:  # its first stages: one per sweep seed before the sweep, one per seed before the final
            first = TWO_STAGE[m]["first"]
            one = sum(run_seconds("first", first_steps(m, steps), per_step[first], overhead).values())
            seconds["sweep"] += sweep_seeds * one
            seconds["final"] += seeds * one
    backbone = backbone_seconds(recorded)
    total = backbone + (seconds["sweep"] + seconds["final"]) / jobs
    return {"step_seconds": per_step, "scale": scale, "basis": basis, "overhead": overhead, "counts": counts,
            "backbone": backbone, "sweep": seconds["sweep"] / jobs, "final": seconds["final"] / jobs, "total": total,
            "each_common": {m: s for m, s in each_common.items() if m not in own_1x}, "jobs": jobs}


def recorded_structure(study: dict) -> dict:
    """What a recorded study ran, as `estimate`'s arguments: its methods, sweep seeds, seeds, the points each stage
    added, the methods that kept another 1x setting."""
    settings = study.get("settings", {})
    stages = {m: [p["stage"] for p in e.get("points", [])] for m, e in study["sweep"].items()}
    return {"methods": study["methods"], "sweep_seeds": len(settings.get("sweep_seeds", [100])),
            "seeds": len(study["seeds"]), "jobs": study.get("jobs", RECORDED_JOBS),
            "lr_points": max((s.count("learning_rate") for s in stages.values()), default=0),
            "beta_new": max((s.count("beta") for s in stages.values()), default=0),
            "refine_new": {m: s.count("refine") for m, s in stages.items()},
            "own_1x": [m for m, e in study["final"].items() if e.get("runs_1x")],
            "samples": {m: study["plan"][m]["cases"] for m in study["methods"] if script(m) == "grpo"}}


def check(recorded: dict, other: dict) -> dict:
    """The estimate, from `recorded`, of the study `other` ran (its own structure), against its measured wall time:
    only where the invocation that wrote `other` trained all of it (a resumed study's wall time is its last part's)."""
    if resumed := resumed_phase(other):
        phase, counted = resumed
        raise ValueError(f"the study checked was resumed: its last invocation trained {counted['trained']} of its "
                         f"{counted['all']} {phase.replace('_', ' ')}, so its wall time does not measure the whole")
    s = recorded_structure(other)
    e = estimate(recorded, s["methods"], s["sweep_seeds"], s["seeds"], s["jobs"], s["own_1x"], s["refine_new"],
                 s["beta_new"], samples=s["samples"], lr_points=s["lr_points"])
    return {**e, "measured": other["wall_seconds"], "ratio": e["total"] / other["wall_seconds"]}


def estimate_text(e: dict, source: str) -> str:
    lines = [f"reads {source}: a recorded study (its runs' training times; the overhead's scale from {e['basis']}: "
             f"x {e['scale']:.2f}), not this machine",
             "training step (s): " + ", ".join(f"{NAMES[m]} {s:.2f}" for m, s in e["step_seconds"].items()),
             "overhead per run (s): " + ", ".join(f"{k} {v:.1f}" for k, v in e["overhead"].items()),
             f"before the sweep {e['backbone'] / 60:.1f} min; sweep: {sum(e['counts']['sweep'].values())} runs "
             f"({sum(e['counts']['points'].values())} points), {e['sweep'] / 60:.1f} min; final: "
             f"{sum(e['counts']['final'].values()) + sum(e['counts']['common'].values())} runs"
             + (f" (first stages: {sum(e['counts']['first'].values())} runs)" if e["counts"]["first"] else "") + ", "
             f"{e['final'] / 60:.1f} min (--jobs {e['jobs']})",
             f"total {e['total'] / 60:.0f} min"]
    if e["each_common"]:
        lines[-1] += (" where these methods keep one setting for both budgets; each that keeps another one for 1x adds "
                      + ", ".join(f"{NAMES[m]} {s / 60:.1f}" for m, s in e["each_common"].items())
                      + f" min (all of them: {(e['total'] + sum(e['each_common'].values())) / 60:.0f} min)")
    if "measured" in e:
        lines.append(f"that study measured {e['measured'] / 60:.0f} min: the estimate is {e['ratio']:.2f}x it")
    return "\n".join(lines)
