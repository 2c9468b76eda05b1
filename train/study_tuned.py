"""The miniature study's tuned protocol (`python -m train.study --protocol tuned`, `make study-tuned`): every method
tuned on its own, more seeds, intervals, paired comparisons and a verdict; docs/study.md describes it.

1. sweep, per method, on the validation split (data_prep/synthetic.py's val_questions.json / general_val.json:
   the training distribution, items and images not in the held-out split; one instruction line): coordinate-wise,
   the learning rate (the recipe's times each --lr-factors) at the paper's beta, then beta (the paper's times each
   --beta-factors) at the best learning rate; --sweep-seeds per point, --steps steps each; the point with the best
   mean validation composite (overall without distractors) is kept, ties to the earlier (the paper's) point;
2. final: --seeds runs per method at the kept setting for --long-factor x --steps steps, a checkpoint every
   --curve-every steps, each checkpoint evaluated on the held-out bench (the learning curves); the learning rate
   is constant after warm-up, so the checkpoint at --steps is the common budget (1x) and the last one the long
   budget, from one run;
3. report: mean and Student t 95% interval over seeds of every metric (eval/stats.py), the general task's answers
   as correct / refusal / wrong colour / malformed, paired differences NCA-P - NCA, NCA-P - DPO, NCA - DPO on the
   same seeds (t interval, paired t-test; "indistinguishable" where the interval covers 0), the platform;
   study.json, study.md, study_curves.png.

`--kept-from OTHER/study.json` skips the sweep and uses that study's kept settings (the cross-machine check: the
final phase under another CPU capability); `python -m train.study_tuned tables STUDY.json [--alt OTHER.json]`
prints the tables again, with the alternative platform's verdicts beside.
"""

from __future__ import annotations

import os
import platform as platform_module
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import read_json
from cli.numbers import int_at_least, option, positive_float
from train.common import METHOD_NAMES

PAIRS = (("nca_p", "nca"), ("nca_p", "dpo"), ("nca", "dpo"), ("grpo", "nca_p"), ("grpo", "dpo"))
# GRPO (online RL: train/grpo.py, recipes/study/grpo.yaml) is a method of this protocol only, by choice
# (`--methods sft dpo nca nca_p grpo`): its learning rate and KL beta swept like the others', budgets in optimizer steps
EXTRA_METHODS = {"grpo": "grpo"}  # method -> training script, beside train/demo.py's METHODS
# metric key -> label; the keys of one evaluated checkpoint (held-out or validation), without distractors unless named
METRICS = {"ics": "ICS", "hms": "HMS", "rta": "RtA", "ata": "AtA", "general": "general acc.", "priv": "priv",
           "overall": "overall", "ics_distr": "ICS with distr.", "hms_distr": "HMS with distr.",
           "overall_distr": "overall with distr.", "refusal": "refusal %", "wrong_colour": "wrong colour %",
           "malformed": "malformed %"}
COMPARED = ("ics", "hms", "general", "overall")
CURVES = ("ics", "hms", "general")
BETA_METHODS = ("dpo", "nca", "nca_p", "grpo")  # GRPO's beta: the KL coefficient against the reference
# The common budget: 30 steps of 16 cases (the quick protocol's recipes have 80, cosine); the long one is 3x. Sized so
# that the whole protocol fits in an evening on a shared 2-core machine (docs/study.md, "Sizing").
TUNED_STEPS = 30
# Ten seeds: with five, NCA-P's 1x ICS lead was distinguishable on one machine and not on a second one of the same kind
# (issue 33); the verdicts docs/study.md states are to hold on both.
SEEDS = 10


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
    (vendor, family, model, flags, caches: MKL's and oneDNN's dispatch reads them) and the pinned settings."""
    import torch

    config = torch.__config__.show()
    blas = [line.strip() for line in config.splitlines() if "BLAS" in line or "LAPACK" in line or "MKL" in line]
    cpu = cpu_record()
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"), "threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads(), "blas": blas, "python": sys.version.split()[0],
            "machine": platform_module.machine(), "processor": cpu.get("model name"), "cpu": cpu,
            "numerics": {k: os.environ.get(k) for k in NUMERICS}}


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
    group.add_argument("--sweep-seeds", type=option("seed"), nargs="+", default=[100, 101], help="seeds of every sweep point")
    group.add_argument("--lr-factors", type=positive_float, nargs="+", default=[1 / 3, 1, 3],
                       help="learning rates swept: the recipe's times each (1 = the recipe's)")
    group.add_argument("--beta-factors", type=positive_float, nargs="+", default=[1 / 3, 1, 3],
                       help="betas swept at the best learning rate (DPO, NCA, NCA-P): the paper's times each")
    group.add_argument("--long-factor", type=int_at_least(1), default=3, help="the long budget: this times --steps")
    group.add_argument("--curve-every", type=int_at_least(1), default=None, help="a checkpoint (a curve point) every N steps; "
                       "must divide --steps (default: --steps)")
    group.add_argument("--val-per-label", type=int_at_least(1), default=1, help="validation SPY items per category")
    group.add_argument("--general-val", type=int_at_least(1), default=100, help="validation general-task questions")
    group.add_argument("--kept-from", help="skip the sweep: the kept settings of this tuned study.json")
    group.add_argument("--jobs", type=int_at_least(1), default=1, help="runs at once (one thread each)")


def tuned_settings(args) -> dict:
    """Complete and check the tuned protocol's arguments and pin the numerics; its settings (what a resumed run must
    share), with the platform's torch version, CPU capability, thread count and pinned settings (floats differ
    across them)."""
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
    if args.kept_from and not Path(args.kept_from).is_file():
        raise InputError(args.kept_from, None, "--kept-from", "no such file")
    pin_numerics()  # before platform() loads torch: this process evaluates the checkpoints
    machine = platform()
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "seeds", "jobs")}
    return {**settings, **{k: machine[k] for k in ("torch", "cpu_capability", "threads", "numerics")}}


def recipe_value(method: str, key: str) -> float:
    import yaml

    from train.demo import ROOT

    return float(yaml.safe_load((ROOT / "recipes" / "study" / f"{method}.yaml").read_text())[key])


def point_name(method: str, point: dict, seed: int) -> str:
    beta = f"-beta{point['beta']:.3g}" if "beta" in point else ""
    return f"{method}-lr{point['learning_rate']:.3g}{beta}-seed{seed}"


def flat_metrics(sections: dict) -> dict:
    """One evaluated checkpoint as METRICS keys (those its sections hold)."""
    from eval.general.composite import composite_from_general

    general = sections["synthetic_general"]
    values = {"general": general["accuracy"], **{k: general["breakdown"][k] for k in ("refusal", "wrong_colour",
                                                                                        "malformed")}}
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
            values.update({"rta": m["rta_nonconflict"], "ata": m["ata_nonconflict"]})
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


def train_run(ctx: dict, method: str, point: dict, seed: int, folder: Path, steps: int, save_every: int, log):
    from train.demo import METHODS, ROOT, train

    extra = ["--seed", str(seed), "--learning_rate", repr(point["learning_rate"]),
             "--lr_scheduler_type", "constant_with_warmup", "--save_steps", str(save_every),
             "--save_total_limit", "1000", *(["--beta", repr(point["beta"])] if "beta" in point else []),
             *(["--general_data_path", str(Path(ctx["data"]) / "general_train.json")] if method == "grpo" else []),
             *ctx["train_args"]]
    train({**METHODS, **EXTRA_METHODS}[method], Path(ctx["backbone"]), Path(ctx["data"]), folder, steps, log, extra,
          ROOT / "recipes" / "study" / f"{method}.yaml")


def sweep_task(ctx: dict, method: str, point: dict, seed: int) -> dict:
    """One sweep run: --steps steps, evaluated on the validation split."""
    log = _clock(ctx)
    name = point_name(method, point, seed)
    folder = Path(ctx["out"]) / "sweep" / name
    train_run(ctx, method, point, seed, folder, ctx["steps"], ctx["steps"], log)
    values = evaluate(ctx, folder, f"sweep/{name}", "val", both_settings=False)
    log(f"sweep {name}: validation overall {_fmt(values.get('overall'))}")
    return values


def final_task(ctx: dict, method: str, point: dict, seed: int) -> dict:
    """One final run: long budget, every checkpoint on the held-out bench (both settings at 1x and at the end)."""
    from train.demo import training_summary

    log = _clock(ctx)
    name = f"{method}-seed{seed}"
    folder = Path(ctx["out"]) / "runs" / name
    train_run(ctx, method, point, seed, folder, ctx["long_steps"], ctx["curve_every"], log)
    steps = {}
    for step in curve_steps(ctx):
        both = step in (ctx["steps"], ctx["long_steps"])
        steps[str(step)] = evaluate(ctx, folder / f"checkpoint-{step}", f"runs/{name}/step{step}", "test", both)
    log(f"final {name}: held-out overall {_fmt(steps[str(ctx['steps'])].get('overall'))} at {ctx['steps']} steps, "
        f"{_fmt(steps[str(ctx['long_steps'])].get('overall'))} at {ctx['long_steps']}")
    return {"steps": steps, "training": training_summary(folder)}


def curve_steps(ctx: dict) -> list[int]:
    return sorted({*range(ctx["curve_every"], ctx["long_steps"] + 1, ctx["curve_every"]), ctx["steps"],
                   ctx["long_steps"]})


def _call(task):
    kind, ctx, *rest = task
    try:
        return {"sweep": sweep_task, "final": final_task}[kind](ctx, *rest)
    except SystemExit as stop:  # train()'s failure line: carried to the parent, which exits with it
        return {"exit": stop.code}


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


def sweep_points(method: str, factors: list[float], best_lr: float | None = None) -> list[dict]:
    """The learning-rate points (best_lr None) or the beta points at best_lr, the paper's value first."""
    ordered = sorted(factors, key=lambda f: f != 1)
    if best_lr is None:
        lr = recipe_value(method, "learning_rate")
        return [{"learning_rate": lr * f, **({"beta": recipe_value(method, "beta")} if method in BETA_METHODS
                                              else {})} for f in ordered]
    return [{"learning_rate": best_lr, "beta": recipe_value(method, "beta") * f} for f in ordered]


def sweep(ctx: dict, methods: list[str], log) -> dict:
    """Coordinate-wise: every method's learning rates at once, then the betas at each one's best learning rate."""
    from eval.stats import interval

    points = {m: sweep_points(m, ctx["lr_factors"]) for m in methods}
    results = {m: [] for m in methods}
    for stage in ("learning_rate", "beta"):
        if stage == "beta":
            points = {m: [p for p in sweep_points(m, ctx["beta_factors"], best(results[m])["learning_rate"])
                          if p not in [r["point"] for r in results[m]]] for m in methods if m in BETA_METHODS}
        tasks = [("sweep", ctx, m, p, s) for m in points for p in points[m] for s in ctx["sweep_seeds"]]
        if not tasks:
            continue
        log(f"sweep ({stage}): {len(tasks)} runs of {ctx['steps']} steps, {ctx['jobs']} at a time")
        values = iter(run_tasks(tasks, ctx["jobs"]))
        for m in points:
            for p in points[m]:
                seeds = {str(s): next(values) for s in ctx["sweep_seeds"]}
                overall = [v.get("overall") for v in seeds.values()]
                results[m].append({"point": p, "seeds": seeds, "stage": stage,
                                   "overall": interval(overall) if None not in overall else None})
    return {m: {"points": results[m], "kept": best(results[m])} for m in methods}


def best(points: list[dict]) -> dict:
    scored = [p for p in points if p["overall"] is not None]
    if not scored:
        return points[0]["point"]  # nothing to choose by (tiny test sets): the paper's
    return max(scored, key=lambda p: p["overall"]["mean"])["point"]  # max keeps the first of equals


def summarize(final: dict, methods: list[str], steps: list[int]) -> dict:
    """step -> method -> metric -> interval over seeds (every metric all seeds have)."""
    from eval.stats import interval

    summary = {}
    for step in steps:
        for m in methods:
            runs = [r["steps"][str(step)] for r in final[m]["runs"].values()]
            summary.setdefault(str(step), {})[m] = {
                k: interval([r[k] for r in runs]) for k in METRICS
                if all(isinstance(r.get(k), (int, float)) for r in runs)}
    return summary


def paired(final: dict, methods: list[str], steps: list[int]) -> dict:
    """step -> "a - b" -> metric -> paired difference over the seeds both have."""
    from eval.stats import paired_difference

    result = {}
    for step in steps:
        for a, b in PAIRS:
            if a not in methods or b not in methods:
                continue
            runs_a, runs_b = final[a]["runs"], final[b]["runs"]
            for k in COMPARED:
                va = {s: r["steps"][str(step)].get(k) for s, r in runs_a.items()}
                vb = {s: r["steps"][str(step)].get(k) for s, r in runs_b.items()}
                if None in va.values() or None in vb.values():
                    continue
                result.setdefault(str(step), {}).setdefault(f"{a} - {b}", {})[k] = paired_difference(va, vb)
    return result


def run_protocol(args, out: Path, backbone: Path, data: Path, backbone_rows: dict, log) -> dict:
    ctx = {"out": str(out), "backbone": str(backbone), "data": str(data), "start": log.start,
           "steps": args.steps, "long_steps": args.steps * args.long_factor, "curve_every": args.curve_every,
           "lr_factors": args.lr_factors, "beta_factors": args.beta_factors, "sweep_seeds": args.sweep_seeds,
           "jobs": args.jobs, "eval_limit": args.eval_limit, "eval_batch_size": args.eval_batch_size,
           "max_new_tokens": args.max_new_tokens, "train_args": args.train_args}
    methods = args.methods
    if args.kept_from:
        kept_report = read_json(args.kept_from)
        swept = {m: {"points": [], "kept": kept_report["sweep"][m]["kept"], "from": args.kept_from} for m in methods}
    else:
        swept = sweep(ctx, methods, log)
    tasks = [("final", ctx, m, swept[m]["kept"], s) for s in args.seeds for m in methods]
    log(f"final: {len(tasks)} runs of {ctx['long_steps']} steps at the kept settings, {args.jobs} at a time")
    final = {m: {"kept": swept[m]["kept"], "runs": {}} for m in methods}
    for (_, _, m, _, s), result in zip(tasks, run_tasks(tasks, args.jobs)):
        final[m]["runs"][f"seed{s}"] = result
    steps = curve_steps(ctx)
    return {"protocol": "tuned", "platform": platform(), "methods": methods, "seeds": args.seeds,
            "budgets": {"1x": ctx["steps"], f"{args.long_factor}x": ctx["long_steps"]}, "curve_steps": steps,
            "backbone": backbone_rows, "sweep": swept, "final": final,
            "summary": summarize(final, methods, steps), "paired": paired(final, methods, steps),
            "wall_seconds": round(time.time() - log.start, 1),
            "train_seconds": round(sum(r["training"].get("train_runtime", 0) for m in methods
                                       for r in final[m]["runs"].values()), 1),
            "train_seconds_by_method": {m: round(sum(r["training"].get("train_runtime", 0)
                                                     for r in final[m]["runs"].values()), 1) for m in methods}}


# ------------------------------------------------------------------------------------------------- report
def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _ci(summary: dict | None) -> str:
    if not summary:
        return "n/a"
    if summary["low"] is None:
        return f"{summary['mean']:.1f}"
    return f"{summary['mean']:.1f} [{summary['low']:.1f}, {summary['high']:.1f}]"


def _point(point: dict) -> str:
    return f"lr {point['learning_rate']:.3g}" + (f", beta {point['beta']:.3g}" if "beta" in point else "")


def _machine(platform: dict) -> str:
    """The CPU and the pinned settings, for the tables' platform lines (empty for a study.json from before they were
    recorded)."""
    cpu, pins = platform.get("cpu"), platform.get("numerics")
    text = ""
    if cpu:
        text += (f"; CPU {cpu.get('vendor_id')} family {cpu.get('cpu family')} model {cpu.get('model')} "
                 f"({cpu.get('model name')})")
    if pins:
        text += "; pinned " + ", ".join(f"{k}={v}" for k, v in pins.items())
    return text


def verdicts(report: dict) -> dict:
    """(budget, pair, metric) -> verdict, readable."""
    names = {v: k for k, v in report["budgets"].items()}
    result = {}
    for step, pairs in report["paired"].items():
        if int(step) not in names:
            continue
        for pair, metrics in pairs.items():
            a, b = pair.split(" - ")
            for k, d in metrics.items():
                word = {"first higher": f"{METHOD_NAMES[a]} higher", "second higher": f"{METHOD_NAMES[b]} higher"}
                result[(names[int(step)], pair, k)] = word.get(d["verdict"], d["verdict"])
    return result


def tables(report: dict, alt: dict | None = None) -> str:
    from eval.report import markdown_table

    methods, budgets = report["methods"], report["budgets"]
    lines = ["# The miniature study, tuned protocol (held-out synthetic SPY-Bench, rule judge; held-out general "
             "task)", "", f"mean [95% Student t interval] over seeds {report['seeds']}; platform: "
             f"torch {report['platform']['torch']}, CPU capability {report['platform']['cpu_capability']}, "
             f"{report['platform']['threads']} thread(s) per process{_machine(report['platform'])}.", "",
             "## Sweep (validation split)", ""]
    rows = []
    for m in methods:
        for p in report["sweep"][m]["points"]:
            rows.append({"method": METHOD_NAMES[m], "setting": _point(p["point"]), "stage": p["stage"],
                         "val overall per seed": ", ".join(_fmt(v.get("overall")) for v in p["seeds"].values()),
                         "val overall": _ci(p["overall"]), "kept": "yes" if p["point"] == report["sweep"][m]["kept"]
                         else ""})
        if "from" in report["sweep"][m]:
            rows.append({"method": METHOD_NAMES[m], "setting": _point(report["sweep"][m]["kept"]),
                         "stage": f"kept in {report['sweep'][m]['from']}", "kept": "yes"})
    lines += [markdown_table(rows, ["method", "setting", "stage", "val overall per seed", "val overall", "kept"])]
    back = report["backbone"]
    baseline = {name: {"ics": r["without_distractors"]["ics"], "hms": r["without_distractors"]["hms"],
                       "general": r["general"], "overall": r["without_distractors"].get("overall")}
                for name, r in ((n, back[n]) for n in ("backbone", "self_moderation"))}
    for budget, step in budgets.items():
        summary = report["summary"][str(step)]
        lines += ["", f"## Held-out bench at the {budget} budget ({step} steps)", ""]
        rows = [{"method": f"{name} (deterministic)", "n": 1, **{METRICS[k]: _fmt(v) for k, v in b.items()}}
                for name, b in baseline.items()]
        rows += [{"method": METHOD_NAMES[m], "n": len(report["final"][m]["runs"]),
                  "kept setting": _point(report["final"][m]["kept"]),
                  **{METRICS[k]: _ci(summary[m].get(k)) for k in METRICS}} for m in methods]
        main = ["ics", "hms", "rta", "ata", "general", "priv", "overall", "ics_distr", "hms_distr", "overall_distr"]
        lines += [markdown_table(rows, ["method", "n", "kept setting", *[METRICS[k] for k in main]])]
        lines += ["", "Why general-task answers are wrong (share of answers, %):", "",
                  markdown_table(rows[len(baseline):], ["method", "n", *[METRICS[k] for k in
                                                                          ("general", "refusal", "wrong_colour",
                                                                           "malformed")]])]
    lines += ["", "## Paired differences (same seeds, same held-out items)", "",
              "difference of the means [95% t interval of the paired differences]; p: two-sided paired t-test; "
              "indistinguishable where the interval covers 0.", ""]
    ours, theirs = verdicts(report), verdicts(alt) if alt else {}
    rows = []
    for step, pairs in report["paired"].items():
        budget = {v: k for k, v in budgets.items()}.get(int(step))
        if budget is None:
            continue
        for pair, metrics in pairs.items():
            a, b = pair.split(" - ")
            for k, d in metrics.items():
                row = {"budget": budget, "difference": f"{METHOD_NAMES[a]} - {METHOD_NAMES[b]}",
                       "metric": METRICS[k], "mean [95% CI]": _ci(d), "p": "n/a" if d["p"] is None else f"{d['p']:.3f}",
                       "verdict": ours[(budget, pair, k)]}
                if alt:
                    row["verdict on the other platform"] = theirs.get((budget, pair, k), "n/a")
                rows.append(row)
    columns = ["budget", "difference", "metric", "mean [95% CI]", "p", "verdict"]
    lines += [markdown_table(rows, columns + (["verdict on the other platform"] if alt else []))]
    if alt:
        compared = [key for key in ours if key in theirs]
        same = [key for key in compared if theirs[key] == ours[key]]
        p = alt["platform"]
        lines += ["", f"Other platform: CPU capability {p['cpu_capability']}, {p['threads']} thread(s), torch "
                  f"{p['torch']}{_machine(p)}, seeds {alt['seeds']}: {len(same)} of {len(compared)} verdicts the same"
                  + (f" ({len(ours) - len(compared)} not compared: missing there)." if len(compared) < len(ours)
                     else ".")]
    lines += ["", f"wall time: {report['wall_seconds']} s (this invocation; finished runs are reused); training time "
              f"of the final runs: {report['train_seconds']} s"
              + ("".join(f"; {METHOD_NAMES[m]} {t} s" for m, t in report["train_seconds_by_method"].items())
                 if "train_seconds_by_method" in report else ""), ""]
    return "\n".join(lines)


def plot_curves(report: dict, path: Path) -> None:
    """Held-out ICS, HMS and general accuracy against the step (0: the backbone, where every method starts), one
    line per method, band = 95% interval over seeds."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.4), layout="constrained")
    steps = report["curve_steps"]
    backbone = report["backbone"]["backbone"]
    for ax, k in zip(fig.subplots(1, len(CURVES)), CURVES):
        start = backbone["general"] if k == "general" else backbone["without_distractors"][k]
        for m in report["methods"]:
            points = [(s, report["summary"][str(s)][m].get(k)) for s in steps]
            points = [(0, {"mean": start, "low": start, "high": start})] * (start is not None) + [
                (s, v) for s, v in points if v]
            if not points:
                continue
            x = [s for s, _ in points]
            ax.plot(x, [v["mean"] for _, v in points], marker="o", label=METHOD_NAMES[m])
            if all(v["low"] is not None for _, v in points):
                ax.fill_between(x, [v["low"] for _, v in points], [v["high"] for _, v in points], alpha=0.2)
        for step in report["budgets"].values():
            ax.axvline(step, color="grey", lw=0.8, ls=":")
        ax.set_ylim(-5, 105)
        ax.set_xlabel("alignment step")
        ax.set_title(f"held-out {METRICS[k]} (without distractors)")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=100)


def write_report(report: dict, out: Path) -> str:
    from store.runs import write_json, write_text

    write_json(out / "study.json", report)
    text = tables(report)
    write_text(out / "study.md", text)
    plot_curves(report, out / "study_curves.png")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m train.study_tuned", description="The tuned study's tables "
                                     "from its study.json (markdown on stdout).")
    parser.add_argument("command", choices=["tables"])
    parser.add_argument("study", help="study.json of `python -m train.study --protocol tuned`")
    parser.add_argument("--alt", help="the same study on another platform (--kept-from): its verdicts beside ours")
    args = parser.parse_args(argv)
    from cli.errors import read_json

    print(tables(read_json(args.study), read_json(args.alt) if args.alt else None))


if __name__ == "__main__":
    from train.common import run

    run(main)
