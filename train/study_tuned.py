"""The miniature study's tuned protocol (`python -m train.study --protocol tuned`, `make study-tuned`): every method
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
final phase under another CPU; a subset by --methods / --seeds keeps it cheap); `python -m train.study_tuned tables
STUDY.json [--alt OTHER.json]` prints the tables again, with the alternative platform's verdicts beside, and
`python -m train.study_tuned estimate` the time the protocol's settings would take here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform as platform_module
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import read_json
from cli.numbers import int_at_least, option, positive_float
from train.common import METHOD_NAMES

FORMAT = 2  # study.json's layout: 2 = per-budget sweep and kept settings, compute (issue 40); none before
PAIRS = (("nca_p", "nca"), ("nca_p", "dpo"), ("nca", "dpo"), ("grpo", "nca_p"), ("grpo", "dpo"))
# GRPO (online RL: train/grpo.py, recipes/study/grpo.yaml) is a method of this protocol only, by choice
# (`--methods sft dpo nca nca_p grpo`): its learning rate and KL beta swept like the others', budgets in optimizer steps
EXTRA_METHODS = {"grpo": "grpo"}  # method -> training script, beside train/demo.py's METHODS
# metric key -> label; the keys of one evaluated checkpoint (held-out or validation), without distractors unless named
METRICS = {"ics": "ICS", "hms": "HMS", "rta": "RtA", "ata": "AtA", "general": "general acc.", "priv": "priv",
           "overall": "overall", "ics_distr": "ICS with distr.", "hms_distr": "HMS with distr.",
           "overall_distr": "overall with distr.", "refusal": "refusal %", "wrong_colour": "wrong colour %",
           "malformed": "malformed %", "compute_k": "compute (k tok)", "train_seconds": "train time (s)"}
COMPARED = ("ics", "hms", "general", "overall")
CURVES = ("ics", "hms", "general")
BETA_METHODS = ("dpo", "nca", "nca_p", "grpo")  # GRPO's beta: the KL coefficient against the reference
# The common budget: 30 steps of 16 cases (the quick protocol's recipes have 80, cosine); the long one is 3x
# (docs/study.md, "Sizing").
TUNED_STEPS = 30
# Ten seeds: with five, NCA-P's 1x ICS lead was distinguishable on one machine and not on a second one of the same kind
# (issue 33); the verdicts docs/study.md states are to hold on both.
SEEDS = 10
# A sweep point moved off the backbone when its validation ICS or general accuracy is further from the backbone's than
# this many times one run's measurement noise on those items (eval/stats.py: proportion_noise): a 95% band.
NOISE_Z = 2.0
GOAL = {"ics": 90.0, "general": 95.0}  # issue 40's "beyond the paper", at the long budget, means over the seeds
COMPUTE_TOLERANCE = 0.2  # GRPO's compute per budget within 20% of DPO's
# What GRPO's logs say about its groups (means over the logged steps of a run up to a budget): TRL's share of groups
# whose rewards do not vary, the KL to the reference, the mean reward and completion length, and every key the
# dynamic sampling logs under its prefix (losses/grpo_trainer.py)
GROUP_KEYS = ("frac_reward_zero_std", "kl", "reward", "reward_std", "completions/mean_length")
GROUP_PREFIXES = ("dynamic_sampling/", "generation/")


# The numeric settings of every process of the tuned study, set in its environment before torch loads (the training
# subprocesses and the spawned --jobs workers inherit them) and recorded in its platform. Why each (docs/study.md,
# "Reproducibility across machines": the op-level measurements): on one machine the preference path's first step
# changes in exactly three kernels when a library's CPU dispatch is varied, each the same kernel as in SFT:
NUMERICS = {
    # MKL, every float matmul. Its default blocks a GEMM by the cache sizes the machine reports; CNR mode AUTO keeps
    # the ISA dispatch but fixes the cache sizes, the reductions and the scheduling (Intel's CNR guide), so two CPUs
    # of one kind that report other caches block alike. Bitwise equal to the default here; on AMD every named
    # branch but COMPATIBLE falls back to AUTO (measured: AVX2 ... AVX512_E4 all equal the default). COMPATIBLE
    # (SSE2, the same code on every x86) also changes the first step's addmm here and doubled the training time.
    "MKL_CBWR": "AUTO",
    # MKL's ISA capped at AVX2 as the other two libraries' are; equal to the default here (measured).
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    # oneDNN: the vision tower's patch convolution and GELU. It dispatches on every extension it finds (AVX-512
    # with bf16 and VNNI here, AMX on newer Xeons), beyond ATen's capability; DNNL_MAX_CPU_ISA=AVX2 changes the
    # GELU's result, so every machine gets the AVX2 kernels.
    "DNNL_MAX_CPU_ISA": "AVX2",
    # ATen's own kernels: the packed rows' flash attention (sdpa with the boolean tree mask picks the CPU flash
    # kernel, as SFT's padded batches do; its blocks are fixed by the sequence length, its vector maths by the
    # capability), soft-max, the element-wise maths. AVX2 changes the flash attention's output; AVX2 everywhere.
    "ATEN_CPU_CAPABILITY": "avx2",
}


def pin_numerics() -> dict:
    """Put NUMERICS into this process's environment (before torch loads here; every process started later inherits
    it) and return it. Set, not defaulted: a machine's own values are what must not reach the study's floats."""
    os.environ.update(NUMERICS)
    return dict(NUMERICS)


def platform() -> dict:
    """What decides the floating-point results: torch and its BLAS, the CPU kernels chosen, the thread count, the CPU
    (vendor, family, model, flags, caches: MKL's and oneDNN's dispatch reads them; lscpu's model name and whether it
    has AVX-512, for the page) and the pinned settings."""
    import torch

    config = torch.__config__.show()
    blas = [line.strip() for line in config.splitlines() if "BLAS" in line or "LAPACK" in line or "MKL" in line]
    cpu = cpu_record()
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"), "threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads(), "blas": blas, "python": sys.version.split()[0],
            "machine": platform_module.machine(), "processor": cpu.get("model name"), "cpu": cpu,
            "lscpu_model": lscpu_model(), "avx512": "avx512f" in cpu.get("flags", []) if cpu else None,
            "numerics": {k: os.environ.get(k) for k in NUMERICS}}


def lscpu_model() -> str | None:
    """lscpu's "Model name" (None where lscpu is missing): the machine's name as the page states it."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name:")), None)


CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "microcode", "cache size")


def cpu_record(cpuinfo: Path = Path("/proc/cpuinfo"), caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict:
    """The first CPU's /proc/cpuinfo fields (CPU_FIELDS, its flags as a sorted list) and its cache levels from sysfs;
    {} where they cannot be read (not Linux)."""
    try:
        first = Path(cpuinfo).read_text().split("\n\n")[0]
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    record = {k: fields[k] for k in CPU_FIELDS if k in fields}
    record["flags"] = sorted(fields.get("flags", "").split())
    levels = {}
    for index in sorted(Path(caches).glob("index*")):
        try:
            level, kind, size = ((index / n).read_text().strip() for n in ("level", "type", "size"))
        except OSError:
            continue
        levels[f"L{level} {kind}"] = size
    if levels:
        record["caches"] = levels
    return record




def add_arguments(parser, methods: list[str]) -> None:
    group = parser.add_argument_group("the tuned protocol (--protocol tuned; train/study_tuned.py)")
    group.add_argument("--methods", nargs="+", choices=[*methods, *EXTRA_METHODS], default=methods)
    group.add_argument("--sweep-seeds", type=option("seed"), nargs="+", default=[100],
                       help="seeds of every sweep point (default: one; docs/study.md, \"Sizing\")")
    group.add_argument("--lr-factors", type=positive_float, nargs="+", default=[1 / 3, 1, 3],
                       help="learning rates swept: the recipe's times each (1 = the recipe's)")
    group.add_argument("--beta-factors", type=positive_float, nargs="+", default=[1, 3],
                       help="betas swept at the long budget's learning rate (DPO, NCA, NCA-P, GRPO): the paper's "
                            "times each")
    group.add_argument("--long-factor", type=int_at_least(1), default=3, help="the long budget: this times --steps")
    group.add_argument("--curve-every", type=int_at_least(1), default=None, help="a checkpoint (a curve point) every N steps; "
                       "must divide --steps (default: --steps)")
    group.add_argument("--val-per-label", type=int_at_least(1), default=1, help="validation SPY items per category")
    group.add_argument("--general-val", type=int_at_least(1), default=100, help="validation general-task questions")
    group.add_argument("--kept-from", help="skip the sweep: the kept settings of this tuned study.json")
    group.add_argument("--jobs", type=int_at_least(1), default=1, help="runs at once (one thread each)")


def recipe_digests(methods: list[str]) -> dict:
    """method -> sha256 of its study recipe (and the backbone's): a resume under edited recipes is another study."""
    from train.demo import ROOT

    return {name: hashlib.sha256((ROOT / "recipes" / "study" / f"{name}.yaml").read_bytes()).hexdigest()
            for name in ("backbone", *methods)}


def tuned_settings(args) -> dict:
    """Complete and check the tuned protocol's arguments and pin the numerics; its settings (what a resumed run must
    share), with the recipes' digests and the platform's torch version, CPU capability, thread count and pinned
    settings (floats differ across them)."""
    from cli.errors import InputError

    args.seeds = args.seeds or list(range(SEEDS))
    args.steps = args.steps or TUNED_STEPS
    args.curve_every = args.curve_every or args.steps
    for name in ("steps", "long_factor", "curve_every", "jobs", "val_per_label", "general_val"):
        if getattr(args, name) < 1:
            raise InputError("command line", None, f"--{name.replace('_', '-')}", "must be at least 1")
    if args.steps % args.curve_every:
        raise InputError("command line", None, "--curve-every", f"must divide --steps ({args.steps}), got "
                         f"{args.curve_every}")
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
    report = read_json(path)
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


def budget_names(report_or_ctx: dict) -> list[str]:
    """The budgets' names, the common one first ("1x", then e.g. "3x"; one name where the long factor is 1)."""
    return list(report_or_ctx["budgets"])


def recipe_value(method: str, key: str) -> float:
    import yaml

    from train.demo import ROOT

    return float(yaml.safe_load((ROOT / "recipes" / "study" / f"{method}.yaml").read_text())[key])


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
    from train.demo import METHODS, ROOT, train

    trained = not (folder / "train_metrics.json").exists()
    extra = ["--seed", str(seed), "--learning_rate", repr(point["learning_rate"]),
             "--lr_scheduler_type", "constant_with_warmup", "--save_steps", str(save_every),
             "--save_total_limit", "1000", *(["--beta", repr(point["beta"])] if "beta" in point else []),
             *(["--general_data_path", str(Path(ctx["data"]) / "general_train.json")] if method == "grpo" else []),
             *ctx["train_args"]]
    train({**METHODS, **EXTRA_METHODS}[method], Path(ctx["backbone"]), Path(ctx["data"]), folder, steps, log, extra,
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
    its last step, the progress bar's elapsed time before) and, for GRPO, its group statistics."""
    from train.compute import run_compute

    history = json.loads((folder / "train_metrics.json").read_text())
    log_path = folder.parent / "logs" / f"{folder.name}.log"
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    runtime = next((e["train_runtime"] for e in reversed(history) if "train_runtime" in e), None)
    record = {}
    for step in steps:
        compute = run_compute(history, step, method, point.get("beta"))["compute"]
        record[str(step)] = {"compute_k": None if compute is None else compute / 1000,
                             "train_seconds": runtime if step == total else elapsed_at(log_text, step, total)}
        if method == "grpo":
            record[str(step)]["logged"] = group_statistics(history, step)
    return record


# ------------------------------------------------------------------------------------------------- the runs
def sweep_task(ctx: dict, method: str, point: dict, seed: int) -> dict:
    """One sweep run: trained to the long budget with a checkpoint at the common one, both evaluated on the
    validation split; budget -> values."""
    log = _clock(ctx)
    name = point_name(method, point, seed)
    folder = Path(ctx["out"]) / "sweep" / name
    budgets = ctx["budgets"]
    train_run(ctx, method, point, seed, folder, ctx["long_steps"], ctx["steps"], log)
    processed = run_record(folder, method, point, ctx["long_steps"], list(budgets.values()))
    values = {}
    for budget, step in budgets.items():
        values[budget] = {**evaluate(ctx, folder / f"checkpoint-{step}", f"sweep/{name}/step{step}", "val", False),
                          **processed[str(step)]}
    log(f"sweep {name}: validation overall " + ", ".join(f"{_fmt(v.get('overall'))} at {b}" for b, v in values.items()))
    return values


def final_task(ctx: dict, method: str, point: dict, seed: int, total: int) -> dict:
    """One final run of `total` steps (the long budget: every curve checkpoint evaluated on the held-out bench; the
    common budget at a setting of its own: its last checkpoint), both settings at each budget it serves."""
    from train.demo import training_summary

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
    log(f"final {name}: held-out overall " + ", ".join(f"{_fmt(values[str(s)].get('overall'))} at {s} steps"
                                                      for s in serves))
    return {"steps": values, "training": training_summary(folder), "run": name, "trained": trained}


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


# ------------------------------------------------------------------------------------------------- the sweep
def sweep_points(method: str, factors: list[float], best_lr: float | None = None) -> list[dict]:
    """The learning-rate points (best_lr None) or the beta points at best_lr, the paper's value first."""
    ordered = sorted(factors, key=lambda f: f != 1)
    if best_lr is None:
        lr = recipe_value(method, "learning_rate")
        return [{"learning_rate": lr * f, **({"beta": recipe_value(method, "beta")} if method in BETA_METHODS
                                              else {})} for f in ordered]
    return [{"learning_rate": best_lr, "beta": recipe_value(method, "beta") * f} for f in ordered]


def moved(values: dict, backbone: dict, z: float = NOISE_Z) -> bool | None:
    """Whether validation numbers left the backbone's: ICS or general accuracy further from the backbone's than z
    times one run's measurement noise on those items (eval/stats.py: proportion_noise at the backbone's score, over
    its item counts n_ics / n_general). None where neither can be judged (tiny test sets)."""
    from eval.stats import proportion_noise

    judged = []
    for metric, count in (("ics", "n_ics"), ("general", "n_general")):
        ours, theirs, n = values.get(metric), backbone.get(metric), backbone.get(count)
        if ours is None or theirs is None or not n:
            continue
        judged.append(abs(ours - theirs) > z * proportion_noise(theirs, n))
    return any(judged) if judged else None


def point_result(point: dict, stage: str, seeds: dict, budgets: list[str], backbone: dict) -> dict:
    """A sweep point's runs (seed -> budget -> validation values) and, per budget, the means it is judged by: the
    validation composite (with its interval over seeds), ICS, general accuracy, and whether it moved."""
    from eval.stats import interval

    result = {"point": point, "stage": stage, "seeds": seeds, "budgets": {}}
    for budget in budgets:
        runs = [s[budget] for s in seeds.values()]
        means = {k: (sum(r[k] for r in runs) / len(runs) if all(r.get(k) is not None for r in runs) else None)
                 for k in ("ics", "general")}
        overall = [r.get("overall") for r in runs]
        result["budgets"][budget] = {**means, "overall": interval(overall) if None not in overall else None,
                                     "moved": moved(means, backbone)}
    return result


def select(points: list[dict], budget: str) -> dict:
    """The point kept for a budget: the best mean validation composite among the points that moved off the backbone
    (`moved`: True, or None where it cannot be judged); among all points only when none moved. Ties keep the
    earlier point (the paper's values come first). {"point", "moved"}: moved False says the kept point did not
    move because nothing did."""
    scored = [p for p in points if p["budgets"][budget]["overall"] is not None]
    if not scored:  # nothing to choose by (tiny test sets): the paper's
        return {"point": points[0]["point"], "moved": points[0]["budgets"][budget]["moved"]}
    moving = [p for p in scored if p["budgets"][budget]["moved"] is not False]
    best = max(moving or scored, key=lambda p: p["budgets"][budget]["overall"]["mean"])  # max keeps the first of equals
    return {"point": best["point"], "moved": best["budgets"][budget]["moved"]}


def sweep(ctx: dict, methods: list[str], backbone: dict, log) -> dict:
    """Coordinate-wise: every method's learning rates at once, then the betas at each one's learning rate kept for
    the long budget; each budget's kept point chosen on its own validation numbers (`select`)."""
    budgets, long = list(ctx["budgets"]), list(ctx["budgets"])[-1]
    points = {m: sweep_points(m, ctx["lr_factors"]) for m in methods}
    results = {m: [] for m in methods}
    for stage in ("learning_rate", "beta"):
        if stage == "beta":
            points = {m: [p for p in sweep_points(m, ctx["beta_factors"],
                                                  select(results[m], long)["point"]["learning_rate"])
                          if p not in [r["point"] for r in results[m]]] for m in methods if m in BETA_METHODS}
        tasks = [("sweep", ctx, m, p, s) for m in points for p in points[m] for s in ctx["sweep_seeds"]]
        if not tasks:
            continue
        log(f"sweep ({stage}): {len(tasks)} runs of {ctx['long_steps']} steps (checkpoint at {ctx['steps']}), "
            f"{ctx['jobs']} at a time")
        values = iter(run_tasks(tasks, ctx["jobs"]))
        for m in points:
            for p in points[m]:
                seeds = {str(s): next(values) for s in ctx["sweep_seeds"]}
                results[m].append(point_result(p, stage, seeds, budgets, backbone))
    swept = {}
    for m in methods:
        chosen = {b: select(results[m], b) for b in budgets}
        swept[m] = {"points": results[m], "kept": {b: c["point"] for b, c in chosen.items()},
                    "moved": {b: c["moved"] for b, c in chosen.items()}}
    return swept


# ------------------------------------------------------------------------------------------------- the results
def budget_runs(final_m: dict, budget: str, step: int) -> dict:
    """seed -> the held-out values of a method's final runs at a budget: its own common-budget runs where it has
    them, else the long runs' checkpoint at that step."""
    runs = final_m.get("runs_1x") if budget == "1x" and final_m.get("runs_1x") else final_m["runs"]
    return {seed: r["steps"][str(step)] for seed, r in runs.items()}


def summarize(final: dict, methods: list[str], budgets: dict) -> dict:
    """budget -> method -> metric -> interval over seeds (every metric all seeds have)."""
    from eval.stats import interval

    summary = {}
    for budget, step in budgets.items():
        for m in methods:
            runs = list(budget_runs(final[m], budget, step).values())
            summary.setdefault(budget, {})[m] = {
                k: interval([r[k] for r in runs]) for k in METRICS
                if all(isinstance(r.get(k), (int, float)) for r in runs)}
    return summary


def curves(final: dict, methods: list[str], steps: list[int]) -> dict:
    """str(step) -> method -> curve metric -> interval over seeds, along the long runs (the long budget's setting)."""
    from eval.stats import interval

    result = {}
    for step in steps:
        for m in methods:
            runs = [r["steps"][str(step)] for r in final[m]["runs"].values()]
            result.setdefault(str(step), {})[m] = {k: interval([r[k] for r in runs]) for k in CURVES
                                                   if all(isinstance(r.get(k), (int, float)) for r in runs)}
    return result


def paired(final: dict, methods: list[str], budgets: dict) -> dict:
    """budget -> "a - b" -> metric -> paired difference over the seeds both have."""
    from eval.stats import paired_difference

    result = {}
    for budget, step in budgets.items():
        for a, b in PAIRS:
            if a not in methods or b not in methods:
                continue
            runs_a, runs_b = budget_runs(final[a], budget, step), budget_runs(final[b], budget, step)
            for k in COMPARED:
                va = {s: r.get(k) for s, r in runs_a.items()}
                vb = {s: r.get(k) for s, r in runs_b.items()}
                if None in va.values() or None in vb.values():
                    continue
                result.setdefault(budget, {}).setdefault(f"{a} - {b}", {})[k] = paired_difference(va, vb)
    return result


def references(report: dict) -> dict:
    """The backbone and self-moderation on the held-out bench (deterministic, one run each), as METRICS keys."""
    back = report["backbone"]
    return {name: {"ics": r["without_distractors"]["ics"], "hms": r["without_distractors"]["hms"],
                   "general": r["general"], "overall": r["without_distractors"].get("overall")}
            for name, r in ((n, back[n]) for n in ("backbone", "self_moderation"))}


def frontier(report: dict) -> list[dict]:
    """The privacy-ability plane: held-out ICS (without distractors) against general-task accuracy, one point per
    method and budget (means over seeds) and the two references; `front` marks the Pareto front (eval/stats.py)."""
    from eval.stats import pareto_front

    rows = [{"name": name, "method": name, "budget": None, "general": v["general"], "ics": v["ics"]}
            for name, v in references(report).items()]
    for budget in budget_names(report):
        for m in report["methods"]:
            s = report["summary"][budget][m]
            if "ics" in s and "general" in s:
                rows.append({"name": f"{METHOD_NAMES[m]} {budget}", "method": m, "budget": budget,
                             "general": s["general"]["mean"], "ics": s["ics"]["mean"]})
    scored = [r for r in rows if r["general"] is not None and r["ics"] is not None]
    front = set(pareto_front([(r["general"], r["ics"]) for r in scored]))
    for i, r in enumerate(scored):
        r["front"] = i in front
    return rows


def compute_match(report: dict) -> dict:
    """budget -> GRPO's mean compute against DPO's (ratio, and whether within COMPUTE_TOLERANCE), where both ran
    and their logs say it."""
    from train.compute import within

    result = {}
    for budget in budget_names(report):
        s = report["summary"][budget]
        if "grpo" not in s or "dpo" not in s or "compute_k" not in s["grpo"] or "compute_k" not in s["dpo"]:
            continue
        grpo, dpo = s["grpo"]["compute_k"]["mean"], s["dpo"]["compute_k"]["mean"]
        result[budget] = {"grpo": grpo, "dpo": dpo, "ratio": grpo / dpo, "within": within(grpo, dpo, COMPUTE_TOLERANCE)}
    return result


def goal(report: dict) -> dict:
    """Issue 40's goal at the long budget: ICS >= GOAL["ics"] with general accuracy >= GOAL["general"], means over
    the seeds. Per method: the two intervals, whether the means reach the goal (and the intervals' lower ends too),
    the shortfall of each mean, the general task's wrong answers, and GRPO's logged group statistics."""
    budget = budget_names(report)[-1]
    step = report["budgets"][budget]
    result = {"budget": budget, "goal": dict(GOAL), "methods": {}}
    for m in report["methods"]:
        s = report["summary"][budget][m]
        if "ics" not in s or "general" not in s:
            continue
        entry = {k: s[k] for k in ("ics", "general")}
        entry["reached"] = all(s[k]["mean"] >= GOAL[k] for k in GOAL)
        entry["reached_low"] = all(s[k]["low"] is not None and s[k]["low"] >= GOAL[k] for k in GOAL)
        entry["short"] = {k: max(0.0, GOAL[k] - s[k]["mean"]) for k in GOAL}
        entry["wrong"] = {k: s[k]["mean"] for k in ("refusal", "wrong_colour", "malformed") if k in s}
        logged = [r.get("logged") for r in budget_runs(report["final"][m], budget, step).values()]
        if logged and all(logged):
            keys = set.intersection(*(set(g) for g in logged))
            entry["logged"] = {k: {"mean": sum(g[k] for g in logged) / len(logged),
                                   "low": min(g[k] for g in logged), "high": max(g[k] for g in logged)}
                               for k in sorted(keys)}
        entry["n"] = s["ics"]["n"]
        result["methods"][m] = entry
    result["reached"] = [m for m, e in result["methods"].items() if e["reached"]]
    return result


def run_protocol(args, out: Path, backbone: Path, data: Path, backbone_rows: dict, log) -> dict:
    from train.compute import study_plan
    from train.demo import ROOT

    long = f"{args.long_factor}x"
    budgets = {"1x": args.steps, long: args.steps * args.long_factor}
    ctx = {"out": str(out), "backbone": str(backbone), "data": str(data), "start": log.start,
           "steps": args.steps, "long_steps": args.steps * args.long_factor, "curve_every": args.curve_every,
           "budgets": budgets, "lr_factors": args.lr_factors, "beta_factors": args.beta_factors,
           "sweep_seeds": args.sweep_seeds, "jobs": args.jobs, "eval_limit": args.eval_limit,
           "eval_batch_size": args.eval_batch_size, "max_new_tokens": args.max_new_tokens,
           "train_args": args.train_args}
    methods = args.methods
    # the compute of one step of every recipe, measured on this study's data (train/compute.py): the basis on which
    # GRPO's prompts and G per step were matched to DPO's
    plan = study_plan(data, out / "tiny-qwen2vl", ROOT / "recipes" / "study", methods, sample=PLAN_SAMPLE,
                      overrides=args.train_args)
    log("compute per step (k tokens, planned on this data): " + ", ".join(
        f"{METHOD_NAMES[m]} {p['compute'] / 1000:.1f}" for m, p in plan.items()))
    backbone_val = None
    if args.kept_from:
        kept = kept_settings(args.kept_from, methods, list(budgets))
        swept = {m: {"points": [], "kept": kept[m], "from": args.kept_from} for m in methods}
    else:
        backbone_val = run_tasks([("backbone", ctx)], 1)[0]
        swept = sweep(ctx, methods, backbone_val, log)
    kept = {m: swept[m]["kept"] for m in methods}
    ctx["common_from_long"] = {m: kept[m]["1x"] == kept[m][long] for m in methods}
    tasks = [("final", ctx, m, kept[m][long], s, ctx["long_steps"]) for s in args.seeds for m in methods]
    tasks += [("final", ctx, m, kept[m]["1x"], s, ctx["steps"]) for s in args.seeds for m in methods
              if not ctx["common_from_long"][m]]
    common = sum(t[-1] != ctx["long_steps"] for t in tasks)
    log(f"final: {len(tasks)} runs at the kept settings ({len(tasks) - common} of {ctx['long_steps']} steps, {common} of "
        f"{ctx['steps']}), {args.jobs} at a time")
    final = {m: {"kept": kept[m], "runs": {}} for m in methods}
    for (_, _, m, _, s, total), result in zip(tasks, run_tasks(tasks, args.jobs)):
        own = total == ctx["steps"] and not ctx["common_from_long"][m] and ctx["steps"] != ctx["long_steps"]
        final[m].setdefault("runs_1x" if own else "runs", {})[f"seed{s}"] = result
    steps = curve_steps(ctx)
    trained = sum(r.get("trained", False) for m in methods for key in ("runs", "runs_1x")
                  for r in final[m].get(key, {}).values())
    runs = sum(len(final[m].get(key, {})) for m in methods for key in ("runs", "runs_1x"))
    report = {"protocol": "tuned", "format": FORMAT, "platform": platform(), "methods": methods, "seeds": args.seeds,
              "budgets": budgets, "curve_steps": steps, "plan": plan, "backbone": backbone_rows,
              "backbone_val": backbone_val, "sweep": swept, "final": final,
              "summary": summarize(final, methods, budgets), "curves": curves(final, methods, steps),
              "paired": paired(final, methods, budgets), "wall_seconds": round(time.time() - log.start, 1),
              "final_runs": {"trained": trained, "all": runs},
              "train_seconds": round(sum(r["training"].get("train_runtime", 0) for m in methods
                                         for key in ("runs", "runs_1x") for r in final[m].get(key, {}).values()), 1)}
    report["train_seconds_by_method"] = {m: round(sum(r["training"].get("train_runtime", 0) for key in
                                                      ("runs", "runs_1x") for r in final[m].get(key, {}).values()), 1)
                                         for m in methods}
    report["frontier"] = frontier(report)
    report["compute_match"] = compute_match(report)
    report["goal"] = goal(report)
    return report


PLAN_SAMPLE = 600  # training cases per method the per-step plan is measured on (evenly spread over the data)


# ------------------------------------------------------------------------------------------------- report
def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and not float(text) else text  # no "-0.0"


def _ci(summary: dict | None, digits: int = 1) -> str:
    if not summary:
        return "n/a"
    if summary["low"] is None:
        return _fmt(summary["mean"], digits)
    return f"{_fmt(summary['mean'], digits)} [{_fmt(summary['low'], digits)}, {_fmt(summary['high'], digits)}]"


def _p(p: float | None) -> str:
    return "n/a" if p is None else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _point(point: dict) -> str:
    return f"lr {point['learning_rate']:.3g}" + (f", beta {point['beta']:.3g}" if "beta" in point else "")


def _machine(platform: dict) -> str:
    """The CPU and the pinned settings, for the tables' platform lines (empty for a study.json from before they were
    recorded)."""
    cpu, pins = platform.get("cpu"), platform.get("numerics")
    text = ""
    if cpu:
        text += (f"; CPU {cpu.get('vendor_id')} family {cpu.get('cpu family')} model {cpu.get('model')} "
                 f"({platform.get('lscpu_model') or cpu.get('model name')}"
                 + (f", AVX-512 {'yes' if platform['avx512'] else 'no'}" if platform.get("avx512") is not None else "")
                 + ")")
    if pins:
        text += "; pinned " + ", ".join(f"{k}={v}" for k, v in pins.items())
    return text


def verdicts(report: dict) -> dict:
    """(budget, pair, metric) -> verdict, readable."""
    result = {}
    for budget, pairs in report["paired"].items():
        for pair, metrics in pairs.items():
            a, b = pair.split(" - ")
            for k, d in metrics.items():
                word = {"first higher": f"{METHOD_NAMES[a]} higher", "second higher": f"{METHOD_NAMES[b]} higher"}
                result[(budget, pair, k)] = word.get(d["verdict"], d["verdict"])
    return result


def plan_table(report: dict) -> str:
    from eval.report import markdown_table

    plan = report["plan"]
    dpo = plan.get("dpo", {}).get("compute")
    rows = [{"method": METHOD_NAMES[m], "cases per step": (f"{p['prompts']:g} prompts x G {p['generations']}"
                                                           if "generations" in p else f"{p['cases']}"),
             "tokens per case": _fmt(p["case_tokens"]), "trained": _fmt(p["trained"], 0),
             "reference": _fmt(p["reference"], 0), "generated (one round)": _fmt(p["generated"], 0),
             "compute per step (k tok)": _fmt(p["compute"] / 1000, 2),
             "x DPO's": _fmt(p["compute"] / dpo, 2) if dpo else "n/a"} for m, p in plan.items()]
    return markdown_table(rows, ["method", "cases per step", "tokens per case", "trained", "reference",
                                 "generated (one round)", "compute per step (k tok)", "x DPO's"])


def sweep_table(report: dict) -> str:
    from eval.report import markdown_table

    budgets = budget_names(report)
    rows = []
    for m in report["methods"]:
        entry = report["sweep"][m]
        for p in entry["points"]:
            row = {"method": METHOD_NAMES[m], "setting": _point(p["point"]), "stage": p["stage"]}
            for b in budgets:
                r = p["budgets"][b]
                row[f"{b} val ICS / general / overall"] = (f"{_fmt(r['ics'])} / {_fmt(r['general'])} / "
                                                           f"{_ci(r['overall'])}")
                row[f"{b} moved"] = {True: "yes", False: "no", None: "n/a"}[r["moved"]]
                if p["point"] == entry["kept"][b]:
                    row[f"{b} kept"] = "yes" if entry["moved"][b] is not False else "yes (no point moved)"
            computes = [[s[b].get("compute_k") for s in p["seeds"].values()] for b in budgets]
            row["compute"] = " / ".join(_fmt(sum(c) / len(c), 0) if None not in c else "n/a" for c in computes)
            rows.append(row)
        if "from" in entry:
            for b in budgets:
                rows.append({"method": METHOD_NAMES[m], "setting": _point(entry["kept"][b]),
                             "stage": f"kept in {entry['from']}", f"{b} kept": "yes"})
    columns = ["method", "setting", "stage"]
    for b in budgets:
        columns += [f"{b} val ICS / general / overall", f"{b} moved", f"{b} kept"]
    label = f"compute ({' / '.join(budgets)}, k tok)"
    return markdown_table([{**r, label: r.get("compute")} for r in rows], columns + [label])


def frontier_table(report: dict) -> str:
    from eval.report import markdown_table

    budgets = budget_names(report)
    rows = []
    for r in report["frontier"]:
        if r["budget"] is None:
            row = {"method": f"{r['name']} (reference)", "budget": "–", "ICS": _fmt(r["ics"]),
                   "general acc.": _fmt(r["general"]), "overall": _fmt(references(report)[r["name"]]["overall"])}
        else:
            s = report["summary"][r["budget"]][r["method"]]
            row = {"method": METHOD_NAMES[r["method"]], "budget": r["budget"], "ICS": _ci(s.get("ics")),
                   "general acc.": _ci(s.get("general")), "overall": _ci(s.get("overall")),
                   "compute (k tok)": _ci(s.get("compute_k"), 0), "train time (s)": _ci(s.get("train_seconds"), 0)}
            if r["budget"] == budgets[-1]:
                e = report["goal"]["methods"].get(r["method"])
                row["goal"] = "n/a" if e is None else ("met" if e["reached"] else "short: " + ", ".join(
                    f"{METRICS[k]} {v:.1f}" for k, v in e["short"].items() if v > 0))
        row["on the frontier"] = "yes" if r.get("front") else ""
        rows.append(row)
    return markdown_table(rows, ["method", "budget", "ICS", "general acc.", "overall", "compute (k tok)",
                                 "train time (s)", "on the frontier", "goal"])


def verdict_text(report: dict) -> str:
    """The verdict on issue 40's goal, the best GRPO against NCA-P and DPO, and the compute match, in sentences made
    from the numbers."""
    g = report["goal"]
    budget, lines = g["budget"], []
    n = sorted({e["n"] for e in g["methods"].values()})
    seeds = f"{'/'.join(map(str, n))} seeds" + ("" if n == [SEEDS] else f", not the {SEEDS} the goal asks for")
    lines.append(f"**The goal** (issue 40): at {budget}, held-out ICS >= {GOAL['ics']:g} with general-task accuracy >= "
                 f"{GOAL['general']:g}, means over the seeds ({seeds}).")
    lines.append("")
    entry_text = {}
    for m, e in g["methods"].items():
        parts = []
        for k in GOAL:
            parts.append(f"{METRICS[k]} {_ci(e[k])}" + (" (met)" if not e["short"][k] else
                                                          f" ({e['short'][k]:.1f} short)"))
        limits = []
        if e["short"]["ics"]:
            limits.append("privacy (ICS)")
        if e["short"]["general"]:
            limits.append("general ability" + (" (of its general answers: " + ", ".join(
                f"{METRICS[k].replace(' %', '')} {v:.1f}%" for k, v in e["wrong"].items()) + ")" if e["wrong"] else ""))
        text = "; ".join(parts) + (". Limited by " + " and ".join(limits) if limits else "")
        if e.get("logged"):
            text += (". Its logged group statistics (mean over the logged steps, range over seeds): " + ", ".join(
                f"{k} {v['mean']:.3g} ({v['low']:.3g}-{v['high']:.3g})" for k, v in e["logged"].items()))
        entry_text[m] = text
    if g["reached"]:
        names = ", ".join(METHOD_NAMES[m] for m in g["reached"])
        lines.append(f"**Reached by {names}.**")
        for m in g["reached"]:
            e = g["methods"][m]
            sure = ("the lower ends of both 95% intervals clear the thresholds too" if e["reached_low"] else
                    "the means clear the thresholds, the 95% intervals reach below them")
            lines.append(f"- {METHOD_NAMES[m]}: {entry_text[m]}; {sure}.")
        others = [m for m in g["methods"] if m not in g["reached"]]
        if others:
            lines += ["", "The others:"]
    else:
        lines.append("**No method reached it.** How close each came (mean [95% interval]; shortfall from the goal), "
                     "closest first:")
        others = list(g["methods"])
    for m in sorted(others, key=lambda m: sum(g["methods"][m]["short"].values())):
        lines.append(f"- {METHOD_NAMES[m]}: {entry_text[m]}.")
    pairs = [p for p in ("grpo - nca_p", "grpo - dpo") if any(p in report["paired"].get(b, {})
                                                              for b in budget_names(report))]
    if pairs:
        lines += ["", "**The best GRPO** (its kept setting per budget) against NCA-P and DPO, paired over the seeds "
                      "(difference [95% interval], p):"]
        for b in budget_names(report):
            for pair in pairs:
                d = report["paired"].get(b, {}).get(pair)
                if not d:
                    continue
                a, o = pair.split(" - ")
                said = verdicts({"paired": {b: {pair: d}}})
                lines.append(f"- {b}, {METHOD_NAMES[a]} - {METHOD_NAMES[o]}: " + "; ".join(
                    f"{METRICS[k]} {_ci(d[k])} (p {_p(d[k]['p'])}, {said[(b, pair, k)]})"
                    for k in ("ics", "general", "overall") if k in d) + ".")
    match = report.get("compute_match", {})
    if match:
        lines += ["", "**Compute** (train/compute.py): GRPO's mean compute was " + "; ".join(
            f"{v['ratio']:.2f}x DPO's at {b} ({v['grpo']:.0f}k against {v['dpo']:.0f}k tokens: "
            f"{'within' if v['within'] else 'outside'} the {COMPUTE_TOLERANCE:.0%} the protocol matches them to)"
            for b, v in match.items()) + "."]
    still = [(m, b) for m in report["methods"] for b in budget_names(report)
             if report["sweep"][m].get("moved", {}).get(b) is False]
    if still:
        lines += ["", "**Kept although they did not move** (no sweep point of theirs left the backbone at that "
                      "budget): " + ", ".join(f"{METHOD_NAMES[m]} at {b}" for m, b in still) + "."]
    return "\n".join(lines) + "\n"


def tables(report: dict, alt: dict | None = None) -> str:
    from eval.report import markdown_table

    methods, budgets = report["methods"], report["budgets"]
    p = report["platform"]
    lines = ["# The miniature study, tuned protocol (held-out synthetic SPY-Bench, rule judge; held-out general "
             "task)", "", f"mean [95% Student t interval] over seeds {report['seeds']}; platform: "
             f"torch {p['torch']}, CPU capability {p['cpu_capability']}, {p['threads']} thread(s) per process"
             f"{_machine(p)}.", "", "## Compute per step, planned on this study's data", "",
             "Tokens through the model per optimizer step (train/compute.py: compute = 3 x trained + reference + "
             "generated, forward-token equivalents), measured on this study's training data with its tokenizer; "
             "GRPO's generation at one round (dynamic sampling's extra rounds are in the measured compute below).",
             "", plan_table(report), "## Sweep (validation split)", "",
             f"Each point trained to {budgets[budget_names(report)[-1]]} steps with a checkpoint at {budgets['1x']}; "
             "moved: validation ICS or general accuracy beyond two of one run's measurement noise on those items "
             "(binomial, at the backbone's score, at least one item) from the backbone's"
             + (f" (ICS {_fmt(report['backbone_val'].get('ics'))} over {report['backbone_val'].get('n_ics')} pairs, "
                f"general {_fmt(report['backbone_val'].get('general'))} over "
                f"{report['backbone_val'].get('n_general')} questions)" if report.get("backbone_val") else "")
             + "; kept: the best mean validation overall among the points that moved, among all only when none did.",
             "", sweep_table(report)]
    base = references(report)
    for budget, step in budgets.items():
        summary = report["summary"][budget]
        lines += ["", f"## Held-out bench at the {budget} budget ({step} steps)", ""]
        rows = [{"method": f"{name} (deterministic)", "n": 1, **{METRICS[k]: _fmt(v) for k, v in b.items()}}
                for name, b in base.items()]
        for m in methods:
            final = report["final"][m]
            own = budget == "1x" and final.get("runs_1x")
            rows.append({"method": METHOD_NAMES[m], "n": len(budget_runs(final, budget, step)),
                         "kept setting": _point(final["kept"][budget]),
                         "runs": f"own {step}-step runs" if own else f"{report['curve_steps'][-1]}-step runs",
                         **{METRICS[k]: _ci(summary[m].get(k), 0 if k in ("compute_k", "train_seconds") else 1)
                            for k in METRICS}})
        main = ["ics", "hms", "rta", "ata", "general", "priv", "overall", "ics_distr", "hms_distr", "overall_distr",
                "compute_k", "train_seconds"]
        lines += [markdown_table(rows, ["method", "n", "kept setting", "runs", *[METRICS[k] for k in main]])]
        lines += ["", "Why general-task answers are wrong (share of answers, %):", "",
                  markdown_table(rows[len(base):], ["method", "n", *[METRICS[k] for k in
                                                                      ("general", "refusal", "wrong_colour",
                                                                       "malformed")]])]
    lines += ["", "## Learning curves", "", "![held-out ICS, HMS and general accuracy against the alignment step, per "
              "method at its long budget's setting, bands = 95% t interval over seeds](study_curves.png)", "",
              "## The privacy-ability frontier", "",
              "Held-out ICS (without distractors) against general-task accuracy, mean [95% interval] over seeds; on "
              "the frontier: no other row (references included) is at least as high on both and higher on one; "
              f"goal: ICS >= {GOAL['ics']:g} with general accuracy >= {GOAL['general']:g} at "
              f"{budget_names(report)[-1]}.", "", frontier_table(report),
              "![held-out ICS against general-task accuracy, per method and budget, means with 95% intervals, seeds "
              "faint, the frontier dashed](study_frontier.png)", "",
              "## Paired differences (same seeds, same held-out items)", "",
              "difference of the means [95% t interval of the paired differences]; p: two-sided paired t-test; "
              "indistinguishable where the interval covers 0.", ""]
    ours, theirs = verdicts(report), verdicts(alt) if alt else {}
    rows = []
    for budget, pairs in report["paired"].items():
        for pair, metrics in pairs.items():
            a, b = pair.split(" - ")
            for k, d in metrics.items():
                row = {"budget": budget, "difference": f"{METHOD_NAMES[a]} - {METHOD_NAMES[b]}",
                       "metric": METRICS[k], "mean [95% CI]": _ci(d), "p": _p(d["p"]),
                       "verdict": ours[(budget, pair, k)]}
                if alt:
                    row["verdict on the other platform"] = theirs.get((budget, pair, k), "n/a")
                rows.append(row)
    columns = ["budget", "difference", "metric", "mean [95% CI]", "p", "verdict"]
    lines += [markdown_table(rows, columns + (["verdict on the other platform"] if alt else []))]
    if alt:
        compared = [key for key in ours if key in theirs]
        same = [key for key in compared if theirs[key] == ours[key]]
        q = alt["platform"]
        lines += ["", f"Other platform: CPU capability {q['cpu_capability']}, {q['threads']} thread(s), torch "
                  f"{q['torch']}{_machine(q)}, seeds {alt['seeds']}: {len(same)} of {len(compared)} verdicts the same"
                  + (f" ({len(ours) - len(compared)} not compared: missing there)." if len(compared) < len(ours)
                     else ".")]
    lines += ["", "## Verdict", "", verdict_text(report)]
    runs = report.get("final_runs", {})
    lines += [f"wall time: {report['wall_seconds']} s (this invocation, which trained {runs.get('trained', 'n/a')} of "
              f"the {runs.get('all', 'n/a')} final runs; finished runs are reused); training time of the final runs: "
              f"{report['train_seconds']} s"
              + "".join(f"; {METHOD_NAMES[m]} {t} s" for m, t in report["train_seconds_by_method"].items()), ""]
    return "\n".join(lines)


def _colours(methods: list[str]) -> dict:
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    return {m: palette(i) for i, m in enumerate(methods)}


def plot_curves(report: dict, path: Path) -> None:
    """Held-out ICS, HMS and general accuracy against the step (0: the backbone, where every method starts), one
    line per method at its long budget's setting, band = 95% interval over seeds."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.4), layout="constrained")
    steps = report["curve_steps"]
    backbone = report["backbone"]["backbone"]
    colours = _colours(report["methods"])
    for ax, k in zip(fig.subplots(1, len(CURVES)), CURVES):
        start = backbone["general"] if k == "general" else backbone["without_distractors"][k]
        for m in report["methods"]:
            points = [(s, report["curves"][str(s)][m].get(k)) for s in steps]
            points = [(0, {"mean": start, "low": start, "high": start})] * (start is not None) + [
                (s, v) for s, v in points if v]
            if not points:
                continue
            x = [s for s, _ in points]
            ax.plot(x, [v["mean"] for _, v in points], marker="o", color=colours[m], label=METHOD_NAMES[m])
            if all(v["low"] is not None for _, v in points):
                ax.fill_between(x, [v["low"] for _, v in points], [v["high"] for _, v in points], alpha=0.2,
                                color=colours[m])
        for step in report["budgets"].values():
            ax.axvline(step, color="grey", lw=0.8, ls=":")
        ax.set_ylim(-5, 105)
        ax.set_xlabel("alignment step (each method at its long budget's setting)")
        ax.set_title(f"held-out {METRICS[k]} (without distractors)")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=100)


def plot_frontier(report: dict, path: Path) -> None:
    """Held-out ICS against general-task accuracy: per method and budget the mean with its 95% intervals (1x hollow,
    the long budget filled) and each seed as a faint point, the backbone and self-moderation as references, the
    goal's corner shaded and the Pareto front dashed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 6.5), layout="constrained")
    ax = fig.subplots()
    budgets = budget_names(report)
    colours = _colours(report["methods"])
    long = budgets[-1]
    ax.fill_between([GOAL["general"], 105], GOAL["ics"], 105, color="tab:green", alpha=0.08,
                    label=f"goal at {long}: ICS >= {GOAL['ics']:g}, general >= {GOAL['general']:g}")
    for budget in budgets:
        marker, filled = ("s", True) if budget == long else ("o", False)
        for m in report["methods"]:
            s = report["summary"][budget][m]
            if "ics" not in s or "general" not in s:
                continue
            seeds = list(budget_runs(report["final"][m], budget, report["budgets"][budget]).values())
            ax.scatter([r["general"] for r in seeds], [r["ics"] for r in seeds], s=14, marker=marker,
                       color=colours[m], alpha=0.18, linewidths=0)
            x, y = s["general"], s["ics"]
            xerr = [[x["mean"] - x["low"]], [x["high"] - x["mean"]]] if x["low"] is not None else None
            yerr = [[y["mean"] - y["low"]], [y["high"] - y["mean"]]] if y["low"] is not None else None
            ax.errorbar(x["mean"], y["mean"], xerr=xerr, yerr=yerr, fmt=marker, ms=8, capsize=3, color=colours[m],
                        mfc=colours[m] if filled else "white", label=f"{METHOD_NAMES[m]} {budget}")
    for (name, v), marker in zip(references(report).items(), ("*", "D")):
        ax.scatter([v["general"]], [v["ics"]], marker=marker, s=120 if marker == "*" else 50, color="black",
                   zorder=5, label=f"{name.replace('_', '-')} (reference)")
    front = sorted((r["general"], r["ics"]) for r in report["frontier"] if r.get("front"))
    if front:
        ax.plot(*zip(*front), ls="--", color="black", lw=1, label="frontier (Pareto)")
    ax.set_xlim(-5, 105)
    ax.set_ylim(-5, 105)
    ax.set_xlabel("held-out general-task accuracy (%)")
    ax.set_ylabel("held-out ICS, without distractors (%)")
    ax.set_title("privacy against general ability")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    fig.savefig(path, dpi=100)


def write_report(report: dict, out: Path) -> str:
    from store.runs import write_json, write_text

    write_json(out / "study.json", report)
    text = tables(report)
    write_text(out / "study.md", text)
    plot_curves(report, out / "study_curves.png")
    plot_frontier(report, out / "study_frontier.png")
    return text


# ------------------------------------------------------------------------------------------------- sizing
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


# ------------------------------------------------------------------------------------------------- across machines
def _leaves(value, path: str = "") -> dict:
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _leaves(sub, f"{path}.{key}" if path else key).items()}
    return {path: value} if isinstance(value, (int, float)) and not isinstance(value, bool) else {}


def compare_runs(a: dict, b: dict) -> dict:
    """Every number two tuned study.json files (either layout) both hold for the backbone and the final runs they
    share, compared bit for bit: {"equal": count, "different": [(path, a's, b's)]} (the cross-machine check)."""
    def numbers(report: dict) -> dict:
        runs = {"backbone": report["backbone"]}
        for m, entry in report["final"].items():
            for key in ("runs", "runs_1x"):
                for seed, run in entry.get(key, {}).items():
                    runs[f"{key}.{m}.{seed}"] = {k: run[k] for k in ("steps", "training")}
        return _leaves(runs)

    ours, theirs = numbers(a), numbers(b)
    shared = [k for k in ours if k in theirs]
    return {"equal": sum(ours[k] == theirs[k] for k in shared),
            "different": [(k, ours[k], theirs[k]) for k in shared if ours[k] != theirs[k]]}


# ------------------------------------------------------------------------------------------------- the page
# docs/study.md's results come from the study's files only: `publish` puts the tables between these lines and the
# study's JSON and plots beside the page; tests/test_study_tuned.py checks that the page shows what the JSON holds.
PAGE_BEGIN = "<!-- generated by `python -m train.study_tuned publish`: do not edit by hand -->"
PAGE_END = "<!-- end of the generated results -->"
PENDING = ("*Not run yet under this protocol: `make study-tuned`, then `python -m train.study_tuned publish "
           "outputs/study-tuned` puts its results here.*")
PUBLISHED = {"study.json": "study_tuned.json", "study_curves.png": "study_curves.png",
             "study_frontier.png": "study_frontier.png"}  # the study's files -> their names beside the page


def page_block(report: dict | None) -> str:
    """What the page shows between its markers: the study's tables with their headings under the page's (### +), or
    the note that the protocol has not run."""
    if report is None:
        return PENDING
    return "\n".join("###" + line if line.startswith("#") else line for line in tables(report).splitlines()).strip()


def publish(study: Path, docs: Path) -> None:
    """A finished study's study.json and plots beside docs/study.md (PUBLISHED) and its tables in the page between
    PAGE_BEGIN and PAGE_END; everything checked before any file is written."""
    import shutil

    from cli.errors import InputError
    from store.runs import write_text

    study, docs = Path(study), Path(docs)
    report = read_study(study / "study.json")
    missing = [name for name in PUBLISHED if not (study / name).is_file()]
    if missing:
        raise InputError(study, None, missing[0], "missing: not a finished tuned study folder")
    page = docs / "study.md"
    text = page.read_text() if page.is_file() else ""
    if text.count(PAGE_BEGIN) != 1 or text.count(PAGE_END) != 1 or text.index(PAGE_BEGIN) > text.index(PAGE_END):
        raise InputError(page, None, None, "expected one PAGE_BEGIN line before one PAGE_END line (train/study_tuned.py)")
    head, rest = text.split(PAGE_BEGIN)
    _, tail = rest.split(PAGE_END)
    for name, target in PUBLISHED.items():
        tmp = docs / f".{target}.tmp"
        shutil.copyfile(study / name, tmp)
        os.replace(tmp, docs / target)
    write_text(page, f"{head}{PAGE_BEGIN}\n\n{page_block(report)}\n\n{PAGE_END}{tail}")


def read_study(path) -> dict:
    """A tuned study.json of this layout (FORMAT); one line naming the file otherwise."""
    from cli.errors import InputError

    report = read_json(path)
    if not isinstance(report, dict) or report.get("format") != FORMAT:
        raise InputError(path, None, "format", f"not a tuned study.json of layout {FORMAT} (issue 40); an earlier "
                         "study's tables are on docs/study.md, its kept settings still serve --kept-from")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m train.study_tuned", description="The tuned study's tables from its "
                            "study.json (markdown on stdout), or the time its settings would take here.")
    commands = parser.add_subparsers(dest="command", required=True)
    shown = commands.add_parser("tables", help="the tables, the frontier and the verdict again")
    shown.add_argument("study", help="study.json of `python -m train.study --protocol tuned`")
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
