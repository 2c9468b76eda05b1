"""The quick protocol of the miniature study (`python -m study`, `make study`): SFT, DPO, NCA and NCA-P aligned from
the helpful backbone at the recipes' settings, once per seed; evaluated with eval/suites/study.yaml (the backbone also
with the self-moderation turns); study.json (every method and seed, mean and std), study.md (the paper's Table 6 / 7
layouts, the paper's numbers beside ours) and study.png (privacy against general ability).

May import: eval, store, train (the launcher); the study's methods.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from study.methods import NAMES
from train.demo import METHODS, ROOT, SETTINGS, train, training_summary

ROWS = {"backbone": "backbone (helpful)", "self_moderation": "self-moderation (training-free)",
        **{m: NAMES[m] for m in METHODS}}
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


def run_quick(args, out: Path, data: Path, backbone: Path, backbone_rows: dict, settings: dict, log) -> None:
    """The quick protocol's runs from the backbone, seed-major (each run evaluated once trained: a stopped study has
    whole seeds); writes its report and prints its tables."""
    from store.runs import write_json, write_text

    recipes = ROOT / "recipes" / "study"
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
    write_json(out / "study.json", report)
    text = tables(report)
    write_text(out / "study.md", text)
    plot(report, out / "study.png")
    print("\n" + text)
    log(f"done in {report['wall_seconds']} s: {out / 'study.json'}, {out / 'study.md'}, {out / 'study.png'}")
