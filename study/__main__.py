"""The SPY paper's alignment study in miniature, with repetitions: SFT, DPO, NCA and NCA-P from one helpful backbone.

    python -m study --out outputs/study        (or `make study`)
    python -m study --protocol tuned --jobs 2 --out outputs/study-tuned        (or `make study-tuned`)

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
seeds at the kept settings with learning curves, intervals and paired tests (study/protocol.py, docs/study.md).

This file is the command line and the common start (data, tiny model, backbone); quick.py and protocol.py are the two
protocols. May import: cli, data_prep, train; the study's quick and protocol files (and publish, for the report).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# One thread per process, inherited by every training subprocess: the README's numbers were made so (another thread
# count rounds floats differently), and on a shared 2-core machine two threads per process ran 2x slower than one.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from cli.entry import ArgumentParser  # noqa: E402
from cli.numbers import option  # noqa: E402
from study.protocol import add_arguments, tuned_settings  # noqa: E402
from study.quick import QUICK_SETTINGS, evaluate, run_quick  # noqa: E402
from train.common import run  # noqa: E402
from train.demo import METHODS, ROOT, Clock, build_once, open_out, train  # noqa: E402


def parse(argv: list[str] | None):
    # `python -m study` names itself __main__.py; through the console script sys.argv[0] is `privacy-align study`
    prog = sys.argv[0] if sys.argv[0].startswith("privacy-align") else "python -m study"
    parser = ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    add_arguments(parser, list(METHODS))
    parser.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                        help="extra recipe overrides for every training run, e.g. --train-args --logging_steps 1")
    args = parser.parse_args(argv)
    if args.protocol == "quick":
        args.seeds = args.seeds or [0, 1, 2]
        return args, {k: getattr(args, k) for k in QUICK_SETTINGS}  # more seeds later is fine
    return args, tuned_settings(args)


def build_data(args, out: Path, log) -> tuple[Path, Path]:
    """The synthetic data and the tiny model, built once into `out`; (model folder, data folder). The tuned protocol's
    data (issue 53) holds a validation split asked in phrasings of its own (its tokenizer knows them) and training
    items listing their category's whole scenario pool, as the demo's do (--train-scenarios); the quick protocol's
    data is the one its published table was made on."""
    from data_prep import synthetic
    from train.tiny_model import DEMO_CONFIG, build_tiny_model

    tuned = args.protocol == "tuned"
    model_dir, data = out / "tiny-qwen2vl", out / "synthetic-spy-tune"
    val = {"val_per_label": args.val_per_label, "general_val": args.general_val,
           "train_whole_pool": args.train_scenarios == "pool"} if tuned else {}
    build_once(data, lambda d: synthetic.build(d, args.train_per_label, args.test_per_label,
                                               general_train=args.general_train, general_test=args.general_test,
                                               **val))
    build_once(model_dir, lambda d: build_tiny_model(d, corpus=synthetic.text_corpus(general=True, validation=tuned),
                                                     **DEMO_CONFIG))
    log(f"tiny Qwen2-VL in {model_dir}, synthetic SPY-Tune, SPY-Bench and general task in {data}")
    return model_dir, data


def build_start(args, out: Path, log) -> tuple[Path, Path]:
    """The common start, built once into `out` (resumable): the data and the tiny model (build_data), and the helpful
    backbone; (data folder, backbone)."""
    model_dir, data = build_data(args, out, log)
    backbone = out / "backbone"
    train("sft", model_dir, data, backbone, args.backbone_steps, log,
          ["--general_data_path", str(data / "general_train.json"), *args.train_args],
          ROOT / "recipes" / "study" / "backbone.yaml")
    return data, backbone


def main(argv: list[str] | None = None) -> None:
    args, settings = parse(argv)
    log = Clock()
    out = Path(args.out)
    open_out(out, "study", settings)
    data, backbone = build_start(args, out, log)
    backbone_rows = evaluate("backbone", backbone, out, args, log, self_moderation=True)
    if args.protocol == "tuned":
        from study.protocol import run_protocol
        from study.publish import write_report

        report = run_protocol(args, out, backbone, data, backbone_rows, log)
        text = write_report({**report, "settings": settings}, out)
        print("\n" + text)
        log(f"done in {report['wall_seconds']} s: {out / 'study.json'}, {out / 'study.md'}, "
            f"{out / 'study_curves.png'}, {out / 'study_frontier.png'}")
        return
    run_quick(args, out, data, backbone, backbone_rows, settings, log)


if __name__ == "__main__":
    run(main)
