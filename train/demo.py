"""The embedded demo: privacy alignment of a tiny Qwen2-VL on a laptop CPU, no GPU, no downloads.

    python -m train.demo --out outputs/demo        (or `make demo`)

1. builds the tiny random Qwen2-VL and the synthetic SPY-Tune / held-out SPY-Bench (if absent);
2. SFT warm-up, then NCA-P, each through `accelerate launch train/... recipes/demo/...`, the path a GPU user runs;
3. evaluates the base, SFT and NCA-P checkpoints (each while the next stage starts) with the evaluation suite (`python -m eval suite --config
   eval/suites/demo.yaml`): the held-out SPY-Bench (new items, question phrasings never seen in training) with
   the transformers backend and the offline rule judge, without distractors (one instruction line: what the
   demo trains) and with them (six lines: reported, not expected to work at this scale), and a synthetic
   SpatialTrust set; each stage's results.json / report.md / PNG under suite/<stage>, and the three compared in
   leaderboard/ (`python -m eval compare`);
4. prints a table and writes report.json, report.md and report.png (the three stages and the training curves).

Everything lands in --out; running the command again reuses what is already there (fixed seeds).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cli import strict_yaml
from cli.command import shown
from cli.entry import ArgumentParser
from cli.errors import InputError
from cli.numbers import option
from store.runs import claim_folder, write_json, write_text
from train.common import run
from train.resume import FINISHED

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "eval" / "suites" / "demo.yaml"
STAGES = ("base", "sft", "nca_p")
STAGE_NAMES = {"base": "base (untrained)", "sft": "SFT", "nca_p": "SFT + NCA-P"}
SETTINGS = {"without_distractors": False, "with_distractors": True}
TABLE = {"ics": "ICS", "hms": "HMS", "rta_nonconflict": "RtA", "ata_nonconflict": "AtA", "ata_conflict": "AtA conflict"}
OFFLINE_QIDS = ("q1", "q2", "q3")  # SpatialTrust's questions scored without an LLM judge
SPATIAL_COLUMN = "SpatialTrust Q1-Q3"
PRIVACY_SLICE = 40  # held-out SPY-Bench samples scored while each stage trains
METHODS = {"sft": "sft", "dpo": "dpo", "nca": "dpo", "nca_p": "nca_p"}  # method -> training script (the studies)


class Clock:
    def __init__(self):
        self.start = time.time()

    def __call__(self, message: str) -> None:
        minutes, seconds = divmod(int(time.time() - self.start), 60)
        print(f"[{minutes:02d}:{seconds:02d}] {message}", flush=True)


def build_once(target: Path, build) -> None:
    """Build into a temporary folder and rename it, so an interrupted build is never mistaken for a finished one."""
    if target.exists():
        return
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    tmp.rename(target)


def open_out(out: Path, kind: str, settings: dict) -> None:
    """Create --out and record the run's settings in <kind>_config.json; a folder holding a run with other settings
    is refused (a resumed run must not mix two configurations)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # under a file, or no permission
        raise InputError(out, None, "--out", f"cannot create the folder ({err.strerror})") from None
    # a folder of the user's files is refused; the tiny model and the data may be there already (built once)
    claim_folder(out, f"train.{kind}", own=("tiny-qwen2vl", "synthetic-spy-tune", f"{kind}_config.json"))
    config = out / f"{kind}_config.json"
    if config.exists() and json.loads(config.read_text()) != settings:
        raise InputError(config, None, None, f"a {kind} run with other settings is here; use another --out or delete it")
    write_json(config, settings)


def train(script: str, model: Path, data: Path, out: Path, steps: int | None, log, extra: list[str],
          recipe: Path | None = None, privacy: bool = False) -> None:
    """One stage through accelerate launch (`recipe`, default recipes/demo/<script>.yaml; its log is
    logs/<out's name>.log next to `out`); skipped when finished, resumed from its last checkpoint otherwise."""
    finish(start(script, model, data, out, steps, log, extra, recipe, privacy), log)


def start(script: str, model: Path, data: Path, out: Path, steps: int | None, log, extra: list[str],
          recipe: Path | None = None, privacy: bool = False) -> dict | None:
    """Start `train`'s stage in the background; None when it is finished already. `finish` waits for it. `privacy`:
    ICS and HMS measured while it trains (the demo's stages; the studies' runs leave it off)."""
    recipe = recipe or ROOT / "recipes" / "demo" / f"{script}.yaml"
    if (out / FINISHED).exists():
        log(f"{out.name}: reusing {out}")
        return None
    # launch/run.py, the documented launcher: accelerate's, a failed stage ending in its own line (in the log)
    command = [
        sys.executable, str(ROOT / "launch" / "run.py"), "--config_file", str(ROOT / "accelerate_configs/cpu.yaml"),
        str(ROOT / "train" / f"{script}.py"), str(recipe),
        "--model_name_or_path", str(model), "--train_data_path", str(data / "train_data.json"),
        "--image_folder", str(data), "--output_dir", str(out), *extra,
    ]
    if privacy:  # ICS / HMS while training, on the held-out bench (train/privacy_eval.py), at each save
        command += ["--eval_privacy_items", str(data / "questions.json"), "--eval_privacy_limit", str(PRIVACY_SLICE),
                    "--per_device_eval_batch_size", str(PRIVACY_SLICE),
                    "--eval_steps", str(strict_yaml.load(recipe)["save_steps"])]
    if steps is None:  # the recipe's
        steps = strict_yaml.load(recipe)["max_steps"]
    else:
        command += ["--max_steps", str(steps)]
    if any(out.glob("checkpoint-*")):
        command += ["--resume_from_checkpoint", "true"]
    log(f"{out.name}: {steps} steps -> {out}   (as {shown()} train {script} {recipe.relative_to(ROOT)})")
    (out.parent / "logs").mkdir(parents=True, exist_ok=True)
    log_path = out.parent / "logs" / f"{out.name}.log"
    with open(log_path, "w") as log_file:
        # in the demo's own folder: a relative --out names the same folder for the stage (its script, recipe and
        # launch config are named by absolute paths)
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    return {"process": process, "log_path": log_path, "name": out.name, "steps": steps, "started": time.time()}


def eta(first: tuple[float, int], now: tuple[float, int], steps: int) -> str:
    """", about M:SS left": the remaining steps at the rate since the first step seen ("" before two points)."""
    (t0, s0), (t1, s1) = first, now
    if s1 <= s0:
        return ""
    minutes, seconds = divmod(round((steps - s1) * (t1 - t0) / (s1 - s0)), 60)
    return f", about {minutes}:{seconds:02d} left"


def check_stage_options(extra: list[str]) -> None:
    """The demo's recipes with `--train-args`, through each stage's own parser (train.common.parse_recipe with the
    script's configuration classes): a bad option is the stage's own one line, raised here before any evaluation."""
    from trl import ModelConfig, SFTConfig

    from losses.nca_p_trainer import NCAPConfig
    from train.common import SpyTuneArguments, parse_recipe

    argv = sys.argv
    try:
        for script, config in (("sft", SFTConfig), ("nca_p", NCAPConfig)):
            sys.argv = [f"{script}.py", str(ROOT / "recipes" / "demo" / f"{script}.yaml"), *extra]
            parse_recipe(SpyTuneArguments, config, ModelConfig)
    finally:
        sys.argv = argv


def finish(stage: dict | None, log) -> None:
    """Wait for a started stage, saying its progress; its bad input is the command's one line and exit 2."""
    if stage is None:
        return
    process, log_path, name, steps = stage["process"], stage["log_path"], stage["name"], stage["steps"]
    first, said = None, 0  # (time, step) when a step was first seen: the rate excludes the stage's loading
    while True:
        try:
            process.wait(timeout=10)  # returns as soon as the stage ends
            break
        except subprocess.TimeoutExpired:
            done = re.findall(rf"(\d+)/{steps} \[", log_path.read_text(errors="replace")[-4000:])
            step = int(done[-1]) if done else 0
            if step > said:  # a line when the stage moves on, with the time its remaining steps take at its rate
                first = first or (time.time(), step)
                log(f"{name}: step {step}/{steps}" + eta(first, (time.time(), step), steps))
                said = step
    if process.returncode:
        # bad input: the script's own line (accelerate's report follows it in the log)
        bad = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith("error: ")]
        if bad:
            print(bad[0], file=sys.stderr)
            sys.exit(2)
        sys.exit(f"{name} failed (exit {process.returncode}); see {log_path}")


def training_summary(folder: Path) -> dict:
    """The last logged loss and, for preference methods, reward margin and accuracy (is it converged?), and the
    training time in seconds, from a finished `train` run's folder."""
    logged = json.loads((folder / "train_metrics.json").read_text())
    last = {}
    for entry in logged:
        for key in ("loss", "rewards/margins", "rewards/accuracies", "train_runtime"):
            if key in entry:
                last[key] = entry[key]
    return last


def suite_command(model: Path, suite_out: Path, out: Path, args) -> list[str]:
    """The `python -m eval suite` arguments that evaluate one checkpoint: eval/suites/demo.yaml (its root is
    outputs/demo: --root when --out is elsewhere), and a --set for each evaluation option given to the demo."""
    import os

    typed = Path("eval/suites/demo.yaml")  # as a user types it in the checkout (the demo may run from a link to it)
    config = str(typed) if typed.is_file() and os.path.samefile(typed, SUITE) else str(SUITE)
    argv = ["--config", config, "--model", str(model), "--out", str(suite_out)]
    if Path(out) != Path(strict_yaml.load(SUITE)["root"]):
        argv += ["--root", str(out)]
    for key, value in (("backend_options.batch_size", args.eval_batch_size),
                       ("backend_options.max_new_tokens", args.max_new_tokens), ("sections.spy.limit", args.eval_limit)):
        if value is not None:
            argv += ["--set", f"{key}={value}"]
    return argv


def evaluate(stage: str, model: Path, out: Path, args, log) -> dict:
    """One checkpoint through the evaluation suite (eval/suites/demo.yaml: held-out SPY-Bench in both settings,
    synthetic SpatialTrust): the command it prints, run through that command's own parser; resumable."""
    import shlex

    from eval import suite

    argv = suite_command(model, out / "suite" / stage, out, args)
    log(f"eval {stage}: {shown()} eval suite {shlex.join(argv)}")
    results = suite.run_args(suite.parser().parse_args(argv))
    spy = results["sections"]["spy"]
    spatial = results["sections"]["spatialtrust"]["one-pass"]
    for setting in SETTINGS:
        spy[setting].update(spatialtrust_overall=spatial["overall"], spatialtrust_images=spatial["n_images"],
                            spatialtrust_offline=sum(spatial[q] for q in OFFLINE_QIDS) / len(OFFLINE_QIDS),
                            spatialtrust_unparsable=max(spatial["unparsable"][q] for q in OFFLINE_QIDS))
        log(f"eval {stage} {setting}: " + ", ".join(f"{TABLE[k]} {_fmt(spy[setting][k])}" for k in TABLE))
    return spy


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def spatialtrust_cell(metrics: dict) -> str:
    """The SpatialTrust column: what scores offline (Q1-Q3) and, where answers had nothing to score, how many."""
    bad = metrics["spatialtrust_unparsable"]
    return _fmt(metrics["spatialtrust_offline"]) + (f" ({bad}/{metrics['spatialtrust_images']} unparsable)" if bad
                                                    else "")


def plot(report: dict, out: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for ax, (title, metrics) in zip(axes[:2], (("held-out, one instruction line (trained)", report),
                                               ("held-out, with 5 distractor lines", report["with_distractors"]))):
        width = 0.8 / len(STAGES)
        for s, stage in enumerate(STAGES):
            values = [metrics[stage][k] or 0 for k in TABLE]
            ax.bar([i + s * width for i in range(len(TABLE))], values, width, label=STAGE_NAMES[stage])
        ax.set_xticks([i + width for i in range(len(TABLE))], list(TABLE.values()))
        ax.set_ylim(0, 105)
        ax.set_title(title)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(STAGES), frameon=False)
    # SFT loss, then NCA-P's reward margin (its loss sits near 4 log 2 by construction and says little)
    ax = axes[2]
    sft = json.loads((out / "sft" / "train_metrics.json").read_text())
    ncap = json.loads((out / "nca_p" / "train_metrics.json").read_text())
    sft_points = [(e["step"], e["loss"]) for e in sft if "loss" in e]
    ax.plot(*zip(*sft_points or [(0, 1)]), color="tab:orange", label="SFT loss")
    ax.set_yscale("log")
    ax.set_xlabel("training step (SFT, then NCA-P)")
    ax.set_ylabel("SFT loss")
    twin = ax.twinx()
    offset = max((e.get("step", 0) for e in sft), default=0)
    points = [(offset + e["step"], e["rewards/margins"]) for e in ncap if "rewards/margins" in e]
    twin.plot(*zip(*points or [(offset, 0)]), color="tab:green", label="NCA-P reward margin")
    twin.set_ylabel("NCA-P reward margin (chosen - rejected)")
    ax.set_title("training curves")
    ax.legend(handles=ax.get_lines() + twin.get_lines(), fontsize=8, loc="upper center")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/demo")
    parser.add_argument("--sft-steps", type=option("sft_steps"), default=None, help="default: recipes/demo/sft.yaml (120)")
    parser.add_argument("--nca-p-steps", type=option("nca_p_steps"), default=None, help="default: recipes/demo/nca_p.yaml (10)")
    parser.add_argument("--train-per-label", type=option("train_per_label"), default=30, help="synthetic SPY-Tune items per category")
    parser.add_argument("--train-absolute-per-label", type=option("train_per_label"), default=60,
                        help="synthetic SPY-Tune items per absolute category (always refused: 5 of SPY's 67)")
    parser.add_argument("--train-scenarios", choices=("one", "pool"), default="pool",
                        help="scenarios per synthetic SPY-Tune item: one conflict and one privacy scenario, or its "
                             "category's whole pool (two of each: more of the rows are scenario cases)")
    parser.add_argument("--test-per-label", type=option("test_per_label"), default=1, help="held-out SPY-Bench items per category")
    parser.add_argument("--eval-batch-size", type=option("eval_batch_size"), default=None,
                        help="default: eval/suites/demo.yaml's (given: --set on the printed suite command)")
    parser.add_argument("--max-new-tokens", type=option("max_new_tokens"), default=None,
                        help="default: eval/suites/demo.yaml's (given: --set on the printed suite command)")
    parser.add_argument("--eval-limit", type=option("eval_limit"), default=None,
                        help="evaluate only the first N SPY-Bench samples (tests)")
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                        help="extra recipe overrides for both stages, e.g. --train-args --logging_steps 5")
    args = parser.parse_args(argv)
    from cli.log import quiet_third_party

    quiet_third_party()  # before building the tiny model imports DeepSpeed (its CPU notice)
    log = Clock()
    out = Path(args.out)
    open_out(out, "demo", {k: v for k, v in vars(args).items() if k != "out"})

    from data_prep import synthetic
    from train.tiny_model import DEMO_CONFIG, build_tiny_model

    model_dir, data_dir = out / "tiny-qwen2vl", out / "synthetic-spy-tune"
    build_once(model_dir, lambda d: build_tiny_model(d, **DEMO_CONFIG))
    build_once(data_dir, lambda d: synthetic.build(d, args.train_per_label, args.test_per_label,
                                                   train_absolute_per_label=args.train_absolute_per_label,
                                                   train_whole_pool=args.train_scenarios == "pool"))
    log(f"tiny Qwen2-VL in {model_dir}, synthetic SPY-Tune / held-out SPY-Bench in {data_dir}")

    # Each checkpoint is evaluated while the next stage starts (its imports and set-up leave a core idle): the base
    # model during SFT's start, SFT during NCA-P's. One thread here meanwhile, so the two never spin against each other.
    import torch

    checkpoints = {"base": model_dir, "sft": out / "sft", "nca_p": out / "nca_p"}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    sft = start("sft", model_dir, data_dir, out / "sft", args.sft_steps, log, args.train_args, privacy=True)
    try:  # while SFT starts: both stages' options checked here, before the evaluation writes anything
        check_stage_options(args.train_args)
    except InputError:
        if sft is not None:
            sft["process"].kill()
            sft["process"].wait()
        raise
    results = {"base": evaluate("base", model_dir, out, args, log)}
    finish(sft, log)
    nca_p = start("nca_p", out / "sft", data_dir, out / "nca_p", args.nca_p_steps, log, args.train_args, privacy=True)
    results["sft"] = evaluate("sft", checkpoints["sft"], out, args, log)
    finish(nca_p, log)
    torch.set_num_threads(threads)
    results["nca_p"] = evaluate("nca_p", checkpoints["nca_p"], out, args, log)

    from eval.compare import compare
    from eval.report import markdown_table
    from eval.suite_config import load_config
    from eval.view.records import suite_inputs
    from train.card import add_card_evaluation

    # the demo's suites share one config: the viewer is told its inputs (not trusting results.json's, which lie
    # outside each suite folder)
    inputs = suite_inputs(load_config(SUITE, root=str(out)))
    compare([out / "suite" / stage for stage in STAGES], out / "leaderboard", names=[STAGE_NAMES[s] for s in STAGES],
            inputs=inputs)
    report = {stage: results[stage]["without_distractors"] for stage in STAGES}
    report["wall_seconds"] = round(time.time() - log.start, 1)
    report["with_distractors"] = {stage: results[stage]["with_distractors"] for stage in STAGES}
    for stage in ("sft", "nca_p"):
        card = (checkpoints[stage] / "README.md").read_text()
        if "## Evaluation" not in card:
            add_card_evaluation(checkpoints[stage], "held-out synthetic SPY-Bench, rule judge, one instruction line",
                                {TABLE[k]: report[stage][k] for k in TABLE})

    rows = []
    for setting, metrics in (("without distractors", report), ("with distractors", report["with_distractors"])):
        for stage in STAGES:
            rows.append({"setting": setting, "model": STAGE_NAMES[stage],
                         **{TABLE[k]: _fmt(metrics[stage][k]) for k in TABLE},
                         SPATIAL_COLUMN: spatialtrust_cell(metrics[stage])})
    table = markdown_table(rows, ["setting", "model", *TABLE.values(), SPATIAL_COLUMN])
    note = (f"{SPATIAL_COLUMN}: the synthetic SpatialTrust set ({report['base']['spatialtrust_images']} images, "
            "one-pass), the mean of Q1-Q3, which score offline (Q4/Q5 need an LLM judge and score 0 with the rule "
            "judge). The demo trains on SPY-Tune only: an answer with no JSON to read scores 0 (unparsable).")
    write_json(out / "report.json", report)
    write_text(out / "report.md", f"# privacy-align demo (held-out synthetic SPY-Bench, rule judge)\n\n{table}\n"
                                  f"\n{note}\n\nwall time of this run: {report['wall_seconds']} s\n")
    plot(report, out, out / "report.png")
    print("\n" + table + "\n" + note)
    log(f"done in {report['wall_seconds']} s: {out / 'report.json'}, {out / 'report.md'}, {out / 'report.png'}")


if __name__ == "__main__":
    run(main)
