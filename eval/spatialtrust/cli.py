"""`python -m eval spatialtrust <step>`: SpatialTrust and the SpatialTrustGuard pipeline.

    synthetic  draw an offline synthetic dataset in the SpatialTrust format
    validate   check a dataset file and print its counts
    generate   images -> predictions, --mode one-pass | staged | guard (resumable run file beside the output)
    judge      q4/q5 predictions -> structured verdicts through an OpenAI-compatible judge (cached, resumable)
    score      data + predictions + verdicts -> metrics JSON, markdown table and bar chart
    report     several metrics files (and the paper's numbers) -> one table and one chart
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import InputError, read_json
from cli.numbers import int_at_least, option
from eval.spatialtrust import data
from eval.spatialtrust.guard import DEFAULT_RETRIES, MODES
from eval.spatialtrust.parsing import BOX_SCALES
from store.runs import (
    RunFile,
    check_outputs,
    claim_folder,
    nonempty,
    read_jsonl,
    warn_if_empty,
    warn_unequal_counts,
    write_json,
    write_jsonl,
)

logger = logging.getLogger(__name__)


def _load(args, check_images: bool = False) -> list[dict]:
    records = data.load(args.data, image_root=args.image_root, check_images=check_images)
    return records[: args.limit] if getattr(args, "limit", None) else records


def _predictions(path, records) -> list[dict]:
    from eval.spatialtrust.scoring import PREDICTION_TYPES, validate_predictions

    predictions = read_jsonl(path, required=("image_id",), types=PREDICTION_TYPES)
    validate_predictions(path, predictions, records)
    return predictions


def default_run_path(out) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}.run.jsonl")


# ----------------------------------------------------------------------------------------------- steps
def cmd_synthetic(args) -> int:
    check_outputs([], [Path(args.out) / "data.jsonl"], folders=[args.out])
    claim_folder(args.out, "eval spatialtrust synthetic")  # a folder of the user's files is refused
    path = data.build_synthetic(args.out, n_images=args.n_images, seed=args.seed, width=args.width, height=args.height)
    print(f"wrote {path} ({args.n_images} images) and {Path(args.out) / 'images'}")
    return 0


def cmd_validate(args) -> int:
    records = _load(args, check_images=not args.skip_images)
    print(json.dumps({"file": str(args.data), **data.summary(records)}, indent=2))
    return 0


def backend_options(args) -> dict:
    options = {"max_new_tokens": args.max_new_tokens}
    pixels = {k: v for k, v in (("min_pixels", args.min_pixels), ("max_pixels", args.max_pixels)) if v is not None}
    if args.backend == "hf":
        options.update(batch_size=args.batch_size, **pixels)
    elif args.backend == "vllm":
        options.update(tensor_parallel_size=args.tensor_parallel_size, data_parallel_size=args.data_parallel_size,
                       max_model_len=args.max_model_len, **pixels)
    else:
        options.update(base_url=args.base_url, api_key_env=args.api_key_env, concurrency=args.concurrency)
    return options


def cmd_generate(args) -> int:
    from eval.backends import load_generator
    from eval.spatialtrust.guard import check_run_file, generate_predictions, run_header

    run_path = Path(args.run) if args.run else default_run_path(args.out)
    if run_path.resolve() == Path(args.out).resolve():
        raise InputError(args.out, None, None, "--out and --run must be different files")
    check_outputs([args.data], [args.out, run_path])
    records = _load(args, check_images=True)
    options = backend_options(args)
    header = run_header(args.mode, args.model, args.backend, args.box_scale, args.retries, options)
    run = RunFile(run_path, header=header, new_run=args.new_run)  # before loading a model
    if not args.new_run:
        check_run_file(run_path, args.mode, args.model)
    with load_generator(args.backend, args.model, **options) as generator:
        run.begin()
        predictions = generate_predictions(generator, records, args.mode, run_path, retries=args.retries,
                                           box_scale=args.box_scale, model=args.model)
    write_jsonl(args.out, predictions)
    failed = sum(1 for line in read_jsonl(run_path) if line.get("stage") == "result" and line.get("error"))
    unreadable = {q: sum(1 for p in predictions if p[q].get("error")) for q in data.QIDS}
    print(f"wrote {args.out} ({len(predictions)} images; unreadable answers per question {unreadable}) and the run "
          f"file {run_path}" + (f"; {failed} images failed in the backend: re-run the same command to retry them"
                                if failed else ""))
    return 0


def cmd_judge(args) -> int:
    from eval.judge import JudgeClient
    from eval.spatialtrust.judge import judge_run

    cache = args.cache or f"{args.out}.cache.jsonl"
    check_outputs([args.data, args.predictions], [args.out, cache])
    records = _load(args)
    predictions = _predictions(args.predictions, records)
    warn_if_empty(args.predictions, predictions, "spatialtrust judge")
    RunFile(args.out, header={"step": "spatialtrust judge", "judge_model": args.judge_model}, new_run=args.new_run)
    client = JudgeClient(args.judge_model, base_url=args.base_url, api_key_env=args.api_key_env,
                         concurrency=args.concurrency, cache_path=cache)
    lines = judge_run(client, records, predictions, args.out, new_run=args.new_run)
    errors = sum(1 for line in lines if line.get("error"))
    print(f"wrote {args.out}: {len(lines)} verdicts" + (f", {errors} failed (re-run to retry)" if errors else ""))
    return 0


def cmd_score(args) -> int:
    from eval.spatialtrust.report import write_report
    from eval.spatialtrust.scoring import JUDGMENT_TYPES, compute_metrics, validate_judgments

    stem = Path(args.out).with_suffix("")
    check_outputs([args.data, args.predictions, args.judgments],
                  [args.out, stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".png")])
    records = _load(args)
    predictions = _predictions(args.predictions, records)
    judgments = []
    if args.judgments:
        judgments = read_jsonl(args.judgments, types=JUDGMENT_TYPES)
        validate_judgments(args.judgments, judgments, records, predictions)
    metrics = compute_metrics(records, predictions, judgments, clip_boxes=args.clip_boxes)
    write_json(args.out, metrics)
    md, png = write_report(stem, {args.name or Path(args.predictions).stem: metrics}, published=not args.no_published)
    print(json.dumps(metrics))
    print(f"wrote {args.out}, {md} and {png}" + ("" if args.judgments else
                                                "; without --judgments q4 and q5 count as 0"))
    unjudged = sum(metrics["unjudged"].values()) if args.judgments else 0
    if metrics["missing_predictions"] or unjudged:
        logger.warning(f"{metrics['missing_predictions']} images without a prediction and {unjudged} q4/q5 answers "
                       "without a verdict; they score 0")
    return 0


def cmd_report(args) -> int:
    from eval.spatialtrust.report import write_report

    names = args.names or [Path(p).stem for p in args.metrics]
    if len(names) != len(args.metrics):
        raise InputError("--names", None, None, f"{len(names)} names for {len(args.metrics)} metrics files")
    out = Path(args.out)
    check_outputs(args.metrics, [out.with_name(out.name + ".md"), out.with_name(out.name + ".png")])
    runs = {}
    from eval.spatialtrust.scoring import METRICS_TYPES

    for name, path in zip(names, args.metrics):
        metrics = read_json(path, types=METRICS_TYPES)  # a list where a count goes: one line
        if not isinstance(metrics, dict):
            raise InputError(path, None, None, "expected a JSON object (a SpatialTrust metrics file)")
        missing = [k for k in ("q1", "q2", "q3", "q4", "q5", "overall") if not isinstance(metrics.get(k), (int, float))]
        if missing:
            raise InputError(path, None, missing[0], "missing score (not a SpatialTrust metrics file?)")
        runs[name] = metrics
    warn_unequal_counts({name: m.get("n_images") for name, m in runs.items()}, "images")
    md, png = write_report(args.out, runs, published=not args.no_published)
    print(f"wrote {md} and {png}")
    return 0


# ----------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m eval spatialtrust", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)

    def with_data(p):
        p.add_argument("--data", required=True, help="SpatialTrust JSON Lines file (one record per image)")
        p.add_argument("--image-root", default=None, help="where image paths start (default: the data file's folder)")
        return p

    p = steps.add_parser("synthetic", help="draw a synthetic dataset")
    p.add_argument("--out", required=True)
    p.add_argument("--n-images", type=int_at_least(1), default=24)
    p.add_argument("--seed", type=option("seed"), default=0)
    p.add_argument("--width", type=int_at_least(32), default=480)
    p.add_argument("--height", type=int_at_least(32), default=320)
    p.set_defaults(func=cmd_synthetic)

    p = with_data(steps.add_parser("validate", help="check a dataset and print its counts"))
    p.add_argument("--skip-images", action="store_true", help="do not check that image files exist")
    p.set_defaults(func=cmd_validate)

    p = with_data(steps.add_parser("generate", help="predictions with one of the three modes"))
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--backend", choices=("hf", "vllm", "openai"), default="hf")
    p.add_argument("--model", required=True, type=nonempty, help="model path or name (served name for --backend openai)")
    p.add_argument("--out", required=True, help="predictions JSON Lines file")
    p.add_argument("--run", default=None, help="run file with every request and stage (default: <out>.run.jsonl)")
    p.add_argument("--limit", type=int_at_least(1), default=None, help="only the first N images")
    p.add_argument("--retries", type=int_at_least(0), default=DEFAULT_RETRIES,
                   help="final-stage retries after a violation")
    p.add_argument("--box-scale", choices=BOX_SCALES, default="pixels",
                   help="coordinates the model is asked for: absolute pixels, or a 0-1000 grid (Qwen2-VL/Qwen3-VL style)")
    p.add_argument("--max-new-tokens", type=option("max_new_tokens"), default=512)
    p.add_argument("--batch-size", type=int_at_least(1), default=8, help="hf backend")
    p.add_argument("--min-pixels", type=option("min_pixels"), default=None)
    p.add_argument("--max-pixels", type=option("max_pixels"), default=None)
    p.add_argument("--tensor-parallel-size", type=int_at_least(1), default=1, help="vllm backend")
    p.add_argument("--data-parallel-size", type=int_at_least(1), default=1, help="vllm backend: engine replicas")
    p.add_argument("--max-model-len", type=int_at_least(1), default=8192, help="vllm backend")
    p.add_argument("--base-url", default=None, help="openai backend: OpenAI-compatible endpoint")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="openai backend: variable holding the key")
    p.add_argument("--concurrency", type=int_at_least(1), default=8, help="openai backend")
    p.add_argument("--new-run", action="store_true",
                   help="start the run file over when another model or settings made it (default: refuse)")
    p.set_defaults(func=cmd_generate)

    p = with_data(steps.add_parser("judge", help="q4/q5 verdicts from an LLM judge"))
    p.add_argument("--predictions", required=True)
    p.add_argument("--out", required=True, help="judgments JSON Lines file")
    p.add_argument("--judge-model", required=True, type=nonempty)
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default: OpenAI)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable with the key")
    p.add_argument("--concurrency", type=int_at_least(1), default=8)
    p.add_argument("--cache", default=None, help="judge cache (default: <out>.cache.jsonl)")
    p.add_argument("--new-run", action="store_true",
                   help="start --out over when another judge model made it (default: refuse)")
    p.set_defaults(func=cmd_judge)

    p = with_data(steps.add_parser("score", help="metrics from predictions and verdicts"))
    p.add_argument("--predictions", required=True)
    p.add_argument("--judgments", default=None, help="verdicts from the judge step (without them q4/q5 score 0)")
    p.add_argument("--out", required=True, help="metrics JSON; the .md table and .png chart go beside it")
    p.add_argument("--name", default=None, help="row name in the table (default: the predictions file name)")
    p.add_argument("--no-published", action="store_true", help="leave the paper's numbers out of the table")
    p.add_argument("--clip-boxes", action="store_true",
                   help="clip predicted boxes to the image (default, as the spec says: a box not inside the "
                        "image is malformed and scores 0)")
    p.set_defaults(func=cmd_score)

    p = steps.add_parser("report", help="compare several metrics files")
    p.add_argument("--metrics", nargs="+", required=True)
    p.add_argument("--names", nargs="+", default=None)
    p.add_argument("--out", required=True, help="output stem: writes <out>.md and <out>.png")
    p.add_argument("--no-published", action="store_true")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
