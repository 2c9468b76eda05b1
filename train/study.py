"""The SPY paper's alignment study in miniature, with repetitions: SFT, DPO, NCA and NCA-P from one helpful backbone.

    python -m train.study --out outputs/study        (or `make study`)
    python -m train.study --protocol tuned --jobs 2 --out outputs/study-tuned        (or `make study-tuned`)

1. builds the tiny random Qwen2-VL and the synthetic SPY-Tune / held-out SPY-Bench plus the synthetic general task
   (data_prep/synthetic.py), then the helpful backbone (recipes/study/backbone.yaml): SFT on every privacy question
   answered whatever the instruction says, and on the general task, a stand-in for an instruction-tuned VLM;
2. aligns that backbone with SFT, DPO, NCA and NCA-P (recipes/study/<method>.yaml: the paper's learning rates
   times one common factor, its betas, 16 cases per step for the same number of steps), once per seed, each
   through `accelerate launch`;
3. evaluates every model with eval/suites/study.yaml (held-out SPY-Bench with and without distractors, rule judge;
   the held-out general task, exact match) and the backbone also with the training-free self-moderation baseline;
   the composite is `eval composite`'s with the general task's accuracy as the general score;
4. writes study.json (every method and seed, mean and std), study.md (the paper's Table 6 / 7 layout, the paper's
   numbers beside ours) and study.png (privacy against general ability, error bars over seeds).

Everything lands in --out; running the command again reuses every finished run (fixed seeds). That is the quick
protocol; `--protocol tuned` sweeps each method's learning rate and beta on a validation split, then runs more
seeds at the kept settings with learning curves, intervals and paired tests (train/study_tuned.py, docs/study.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

# One thread per process, inherited by every training subprocess: the README's numbers were made so (another thread
# count rounds floats differently), and on a shared 2-core machine two threads per process ran 2x slower than one.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from cli.entry import ArgumentParser
from cli.numbers import option
from train.common import METHOD_NAMES, run  # noqa: E402
from train.demo import METHODS, ROOT, SETTINGS, Clock, build_once, open_out, train, training_summary  # noqa: E402

ROWS = {"backbone": "backbone (helpful)", "self_moderation": "self-moderation (training-free)",
        **{m: METHOD_NAMES[m] for m in METHODS}}
SPY = {"ics": "ICS", "rta_nonconflict": "RtA", "ata_nonconflict": "AtA", "hms": "HMS"}
# The quick protocol's settings (a folder it made stays usable); the tuned one adds its own and the platform.
QUICK_SETTINGS = ("backbone_steps", "steps", "train_per_label", "test_per_label", "general_train", "general_test",
                  "eval_batch_size", "max_new_tokens", "eval_limit", "train_args")
# The paper's numbers that we have (the issue, ../shared/specs): ICS / HMS of its main setting (with distractors),
# MMMU val accuracy and the composite; anything else is n/a.
PAPER = {"backbone": {"ICS": 3.06, "MMMU val": 50.44}, "sft": {"MMMU val": 5.56}, "dpo": {"overall": 75.99},
         "nca": {"overall": 75.51}, "nca_p": {"ICS": 96.88, "HMS": 88.11, "overall": 78.61}}


def evaluate(name: str, model: Path, out: Path, args, log, self_moderation: bool = False) -> dict:
    """One checkpoint through the suite (resumable: a finished section is read back); the backbone also with the
    self-moderation turns. Returns row -> {setting: metrics incl. priv / overall, "general": accuracy}."""
    from eval.general.composite import composite_from_general
    from eval.suite import run_suite

    spy = {"limit": args.eval_limit, **({"self_moderation": True} if self_moderation else {})}
    overrides = {"backend_options": {"batch_size": args.eval_batch_size, "max_new_tokens": args.max_new_tokens},
                 "sections": {"spy": spy, "synthetic_general": {"limit": args.eval_limit}}}
    log(f"eval {name}: python -m eval suite --config eval/suites/study.yaml --model {model}")
    sections = run_suite(ROOT / "eval" / "suites" / "study.yaml", str(model), out / "suite" / name, root=str(out),
                         overrides=overrides)["sections"]
    general = sections["synthetic_general"]["accuracy"]
    rows = {}
    for row, suffix in ((name, ""), ("self_moderation", "_self_moderation")) if self_moderation else ((name, ""),):
        rows[row] = {"general": general}
        for setting in SETTINGS:
            m = sections["spy"][setting + suffix]
            values = {k: m[k] for k in (*SPY, "ata_conflict")}
            if m["ics"] is not None and m["hms"] is not None:  # undefined on tiny test sets
                values.update({k: v for k, v in composite_from_general(m["ics"], m["hms"], general).items()
                               if k != "general"})
            rows[row][setting] = values
        log(f"eval {row}: general {general:.1f}, " + ", ".join(
            f"{SPY[k]} {_fmt(rows[row]['without_distractors'][k])}" for k in SPY) + " (without distractors)")
    return rows


def mean_std(runs: list[dict]) -> dict:
    """Every numeric leaf of the runs' dicts as {"mean", "std"} (sample std; 0 for one run)."""
    first = runs[0]
    result = {}
    for key, value in first.items():
        if isinstance(value, dict):
            result[key] = mean_std([r[key] for r in runs])
        elif all(isinstance(r.get(key), (int, float)) for r in runs):
            values = [r[key] for r in runs]
            result[key] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    return result


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _paper(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _pm(summary: dict, *keys) -> str:
    for key in keys:
        summary = summary.get(key, {}) if isinstance(summary, dict) else {}
    return f"{summary['mean']:.1f} ± {summary['std']:.1f}" if "mean" in summary else "n/a"


def tables(report: dict) -> str:
    """The paper's Table 6 (SPY-Bench, both settings) and Table 7 (general ability, composite) layouts."""
    from eval.report import markdown_table

    short = {"without_distractors": "w/o distr.", "with_distractors": "with distr."}
    privacy, general = [], []
    for row, name in ROWS.items():
        summary, paper = report["methods"][row]["summary"], PAPER.get(row, {})
        n = len(report["methods"][row]["runs"])
        cells = {"method": name, "n": n}
        for setting in SETTINGS:
            cells.update({f"{label} {short[setting]}": _pm(summary, setting, key) for key, label in SPY.items()})
        privacy.append({**cells, **{f"{k} (paper)": _paper(paper.get(k)) for k in ("ICS", "HMS")}})
        cells = {"method": name, "n": n, "general task acc.": _pm(summary, "general"),
                 "MMMU val (paper)": _paper(paper.get("MMMU val"))}
        for setting in SETTINGS:
            cells.update({f"{k} {short[setting]}": _pm(summary, setting, k) for k in ("priv", "overall")})
        general.append({**cells, "overall (paper)": _paper(paper.get("overall"))})
    spy_columns = [f"{label} {short[s]}" for s in SETTINGS for label in SPY.values()]
    return ("# The miniature alignment study (held-out synthetic SPY-Bench, rule judge; held-out synthetic general "
            f"task)\n\nmean ± std over seeds {report['seeds']} (n runs per row); the paper's numbers beside ours, "
            "n/a where we do not have them (its ICS / HMS are with distractors, its main setting).\n\n"
            "## Privacy (Table 6 layout)\n\n"
            + markdown_table(privacy, ["method", "n", *spy_columns, "ICS (paper)", "HMS (paper)"])
            + "\n## General ability and composite (Table 7 layout)\n\npriv = (ICS + HMS) / 2, overall = harmonic "
            "mean of priv and the general score (`eval composite`), with the general task's accuracy in place of "
            "MMMU / OCRBench / MME; self-moderation changes SPY answers only, so its general score is the "
            "backbone's.\n\n"
            + markdown_table(general, ["method", "n", "general task acc.", "MMMU val (paper)",
                                       *[f"{k} {short[s]}" for s in SETTINGS for k in ("priv", "overall")],
                                       "overall (paper)"])
            + f"\nwall time of this invocation: {report['wall_seconds']} s (finished runs are reused); training time "
            f"summed over the alignment runs: {report['train_seconds']} s\n")


def plot(report: dict, path: Path) -> None:
    """Privacy (priv) against general-task accuracy, one point per method, error bars = std over seeds."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.6), layout="constrained")
    for ax, setting in zip(fig.subplots(1, 2), SETTINGS):
        for row, name in ROWS.items():
            s = report["methods"][row]["summary"]
            if "priv" not in s[setting]:
                continue
            ax.errorbar(s["general"]["mean"], s[setting]["priv"]["mean"], xerr=s["general"]["std"],
                        yerr=s[setting]["priv"]["std"], fmt="o", capsize=4, label=name)
        ax.set_xlim(-5, 105)
        ax.set_ylim(-5, 105)
        ax.set_xlabel("held-out general-task accuracy (%)")
        ax.set_ylabel("priv = (ICS + HMS) / 2")
        ax.set_title(f"held-out SPY-Bench, {setting.replace('_', ' ')}")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8, loc="lower left")
    fig.savefig(path, dpi=100)


def parse(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/study")
    parser.add_argument("--protocol", choices=["quick", "tuned"], default="quick")
    parser.add_argument("--seeds", type=option("seed"), nargs="+", default=None,
                        help="default: 0 1 2 (quick), 0-9 (tuned)")
    parser.add_argument("--backbone-steps", type=option("backbone_steps"), default=None,
                        help="default: recipes/study/backbone.yaml")
    parser.add_argument("--steps", type=option("steps"), default=None, help="alignment steps of every method (default: "
                        "recipes, 80); the tuned protocol's common (1x) budget (default 30)")
    parser.add_argument("--train-per-label", type=option("train_per_label"), default=20,
                        help="synthetic SPY-Tune items per category")
    parser.add_argument("--test-per-label", type=option("test_per_label"), default=2,
                        help="held-out SPY-Bench items per category")
    parser.add_argument("--general-train", type=option("general_train"), default=2000,
                        help="general-task training questions")
    parser.add_argument("--general-test", type=option("general_test"), default=200, help="held-out general-task questions")
    parser.add_argument("--eval-batch-size", type=option("eval_batch_size"), default=64)
    parser.add_argument("--max-new-tokens", type=option("max_new_tokens"), default=32)
    parser.add_argument("--eval-limit", type=option("eval_limit"), default=None,
                        help="evaluate only the first N samples (tests)")
    from train.study_tuned import add_arguments, tuned_settings

    add_arguments(parser, list(METHODS))
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                        help="extra recipe overrides for every training run, e.g. --train-args --logging_steps 1")
    args = parser.parse_args(argv)
    if args.protocol == "quick":
        args.seeds = args.seeds or [0, 1, 2]
        return args, {k: getattr(args, k) for k in QUICK_SETTINGS}  # more seeds later is fine
    return args, tuned_settings(args)


def main(argv: list[str] | None = None) -> None:
    args, settings = parse(argv)
    log = Clock()
    out = Path(args.out)
    open_out(out, "study", settings)

    from data_prep import synthetic
    from train.tiny_model import DEMO_CONFIG, build_tiny_model

    model_dir, data = out / "tiny-qwen2vl", out / "synthetic-spy-tune"
    val = {"val_per_label": args.val_per_label, "general_val": args.general_val} if args.protocol == "tuned" else {}
    build_once(data, lambda d: synthetic.build(d, args.train_per_label, args.test_per_label,
                                               general_train=args.general_train, general_test=args.general_test,
                                               **val))
    build_once(model_dir, lambda d: build_tiny_model(d, corpus=synthetic.text_corpus(general=True), **DEMO_CONFIG))
    log(f"tiny Qwen2-VL in {model_dir}, synthetic SPY-Tune, SPY-Bench and general task in {data}")
    recipes = ROOT / "recipes" / "study"
    backbone = out / "backbone"
    train("sft", model_dir, data, backbone, args.backbone_steps, log,
          ["--general_data_path", str(data / "general_train.json"), *args.train_args], recipes / "backbone.yaml")
    backbone_rows = evaluate("backbone", backbone, out, args, log, self_moderation=True)
    if args.protocol == "tuned":
        from train import study_tuned

        report = study_tuned.run_protocol(args, out, backbone, data, backbone_rows, log)
        text = study_tuned.write_report({**report, "settings": settings}, out)
        print("\n" + text)
        log(f"done in {report['wall_seconds']} s: {out / 'study.json'}, {out / 'study.md'}, "
            f"{out / 'study_curves.png'}, {out / 'study_frontier.png'}")
        return
    per_seed = {row: {"deterministic": values} for row, values in backbone_rows.items()}
    for seed in args.seeds:  # seed-major, each run evaluated once trained: a stopped study has whole seeds
        for method, script in METHODS.items():
            folder = out / "runs" / f"{method}-seed{seed}"
            train(script, backbone, data, folder, args.steps, log, ["--seed", str(seed), *args.train_args],
                  recipes / f"{method}.yaml")
            result = evaluate(folder.name, folder, out, args, log)[folder.name]
            per_seed.setdefault(method, {})[f"seed{seed}"] = {**result, "training": training_summary(folder)}
    report = {"methods": {row: {"runs": per_seed[row], "summary": mean_std(list(per_seed[row].values()))}
                          for row in ROWS},
              "paper": PAPER, "seeds": args.seeds, "settings": settings,
              "wall_seconds": round(time.time() - log.start, 1),
              "train_seconds": round(sum(r["training"].get("train_runtime", 0) for m in METHODS
                                         for r in per_seed[m].values()), 1)}
    from store.runs import write_json, write_text

    write_json(out / "study.json", report)
    text = tables(report)
    write_text(out / "study.md", text)
    plot(report, out / "study.png")
    print("\n" + text)
    log(f"done in {report['wall_seconds']} s: {out / 'study.json'}, {out / 'study.md'}, {out / 'study.png'}")


if __name__ == "__main__":
    run(main)
