"""`python -m eval general ...`: generate, score and report MMMU (dev + val), OCRBench and MME.

    python -m eval general {mmmu,ocrbench,mme} --model PATH_OR_ID --backend hf|vllm|openai --out RUN.jsonl
    python -m eval general score {mmmu,ocrbench,mme} RUN.jsonl --out SCORE.json [--profile P]
    python -m eval general report (--general-dir DIR | --mmmu F --ocrbench F --mme F) --out DIR

Generation is resumable: run the same command again after a crash and only the missing samples are generated.
`score` writes our JSON (plus `<stem>.items.jsonl`, the verdict per item) and VLMEvalKit-format score files
next to it, under both VLMEvalKit's and the SPY reference's names, for `python -m eval composite`.
"""

from __future__ import annotations

import argparse
import ast
import logging
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import InputError
from cli.numbers import int_at_least, option
from eval.general import mme, mmmu, ocrbench, results
from store.runs import RunFile, check_outputs, claim_files, nonempty

logger = logging.getLogger(__name__)

BENCHES = {"mmmu": mmmu, "ocrbench": ocrbench, "mme": mme}
# VLMEvalKit's Qwen2-VL-7B-Instruct image resolution (its config, and the OCRBench override in its model code).
VLMEVAL_PIXELS = {
    "mmmu": {"min_pixels": 1280 * 28 * 28, "max_pixels": 16384 * 28 * 28},
    "mme": {"min_pixels": 1280 * 28 * 28, "max_pixels": 16384 * 28 * 28},
    "ocrbench": {"min_pixels": 10 * 10 * 28 * 28, "max_pixels": 16384 * 28 * 28},
}


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise InputError("--backend-option", None, None, f"expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def generator_options(args, items: list[dict]) -> dict:
    options = {"max_new_tokens": args.max_new_tokens}
    if args.backend == "hf":
        options["batch_size"] = args.batch_size
    if args.backend in ("hf", "vllm") and args.pixels == "vlmevalkit":
        options.update(VLMEVAL_PIXELS[args.benchmark])
    if args.backend == "vllm":
        # At VLMEvalKit's resolution an image is 1280 tokens or more; Qwen2-VL's context is 32768.
        options["max_model_len"] = 32768
        options["images_per_prompt"] = max([1, *(item.get("n_images", 1) for item in items)])
    if args.backend == "openai":
        options.update({"base_url": args.base_url, "api_key_env": args.api_key_env})
    options.update(dict(_option(o) for o in args.backend_option))
    return options


def generate(args) -> int:
    from eval.backends import load_generator
    from eval.general import common

    bench = BENCHES[args.benchmark]
    check_outputs([args.dataset] if args.dataset and Path(args.dataset).exists() else [], [args.out])
    header = {"step": f"general {args.benchmark}", "model": args.model, "backend": args.backend,
              "max_new_tokens": args.max_new_tokens, "pixels": args.pixels,
              "backend_options": sorted(args.backend_option)}
    # another run's file, or a damaged one, fails here, before the model loads
    run = RunFile(args.out, header=header, new_run=args.new_run)
    source = args.dataset or bench.HUB_ID
    if bench is mmmu:
        ds = mmmu.load(source, tuple(s.strip() for s in args.split.split(",")), args.limit)
    else:
        ds = bench.load(source, args.limit)
    items = bench.items(ds, source)
    if not items:
        raise InputError(source, None, None, "no samples to run")
    if not run.pending(items):  # nothing left: no need to load the model
        run.finalize([item["id"] for item in items])
        print(f"{args.benchmark}: all {len(items)} samples already in {args.out}")
        return 0
    generator = load_generator(args.backend, args.model, **generator_options(args, items))
    try:
        run.begin()
        records = common.generate(bench, ds, items, generator, args.out, chunk_size=args.chunk_size)
    finally:
        generator.close()
    failed = common.count_failed(records)
    note = f"; {failed} failed, run the same command again to retry them" if failed else ""
    print(f"{args.benchmark}: {len(records)} samples in {args.out}{note}")
    return 0


def read_run(bench, path) -> list[dict]:
    from store.runs import read_jsonl

    records = read_jsonl(path, required=("id", "response", *bench.RUN_FIELDS))
    if not records:
        raise InputError(path, None, None, "no records")
    for lineno, record in enumerate(records, 1):
        problem = bench.check(record)
        if problem:
            raise InputError(path, lineno, *problem)
    return records


def describe(score: dict) -> str:
    if score["benchmark"] == "mmmu":
        splits = ", ".join(f"{s} {100 * v['accuracy']:.2f}% of {v['n']}" for s, v in score["splits"].items())
        return f"MMMU ({score['profile']}): {splits}"
    if score["benchmark"] == "ocrbench":
        return f"OCRBench: {score['score']} of {score['n']} ({', '.join(f'{g} {v}' for g, v in score['groups'].items())})"
    return (f"MME ({score['profile']}): perception {score['perception']:.2f} + cognition {score['cognition']:.2f} "
            f"= {score['score']:.2f} ({score['n_unknown']} answers neither yes nor no)")


def score(args) -> int:
    bench = BENCHES[args.benchmark]
    profiles = getattr(bench, "PROFILES", ("official",))
    profile = args.profile or profiles[0]
    if profile not in profiles:
        raise InputError("--profile", None, None, f"{args.benchmark} has the profiles {', '.join(profiles)}")
    out = Path(args.out)
    check_outputs([args.run], [out, out.with_name(out.stem + ".items.jsonl")],
                  folders=[] if args.no_vlmeval else [args.vlmeval_dir or out.parent])
    records = read_run(bench, args.run)
    result = bench.score(records, profile) if hasattr(bench, "PROFILES") else bench.score(records)
    items_path = results.write_score(result, args.out)
    written = [Path(args.out), items_path]
    if profile == "vlmevalkit" or bench is ocrbench:
        if not args.no_vlmeval:
            written += results.write_vlmeval(result, args.vlmeval_dir or Path(args.out).parent, args.model_name)
    else:
        logger.info(f"note: no VLMEvalKit-format files for the {profile} profile (they hold VLMEvalKit's rules)")
    if bench is mmmu and set(result["splits"]) != {"dev", "validation"}:
        logger.info("note: the SPY reference reads an MMMU CSV with both a dev and a validation row; run --split dev,validation")
    if result.get("images_without_two_questions"):
        logger.warning(f"{len(result['images_without_two_questions'])} MME images do not have exactly 2 questions "
                       "(a --limit cut?); acc+ then counts an image whose questions present are all right")
    if result.get("over_cap"):
        logger.warning(f"more items than the benchmark has in {', '.join(result['over_cap'])}; capped")
    if result["n_failed"]:
        logger.warning(f"{result['n_failed']} samples have no response (generation failed); they count as wrong")
    print(describe(result))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def report(args) -> int:
    from eval.general.composite import resolve_general
    from eval.general.report import write_report

    general = resolve_general(args.general_dir, {b: getattr(args, b) for b in BENCHES})
    out = Path(args.out)
    names = [f"general_report.{ext}" for ext in ("md", "json", "png")]
    check_outputs([r["path"] for r in general.values()], [out / name for name in names], folders=[out])
    claim_files(out, names)  # a user's file of one of these names is refused, not overwritten
    claim_files(out, names, mark=True)
    write_report(general, args.out, label=args.label)
    print(f"wrote {Path(args.out) / 'general_report.md'} (.json, .png)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m eval general", description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    for name, bench in BENCHES.items():
        p = steps.add_parser(name, help=f"generate {name} answers into a resumable run file")
        p.set_defaults(benchmark=name, run_step=generate)
        p.add_argument("--model", required=True, type=nonempty, help="model path or Hub id (the API model name for openai)")
        p.add_argument("--backend", required=True, choices=["hf", "vllm", "openai"])
        p.add_argument("--out", required=True, help="run file (JSON Lines), resumed if it exists")
        p.add_argument("--dataset", help=f"Hub id or local copy (save_to_disk dir or parquet); default {bench.HUB_ID}")
        if bench is mmmu:
            p.add_argument("--split", default="dev,validation",
                           help="comma-separated MMMU splits (default dev,validation, as VLMEvalKit's MMMU_DEV_VAL)")
        p.add_argument("--limit", type=int_at_least(1), help="only the first N samples (smoke tests)")
        p.add_argument("--max-new-tokens", type=option("max_new_tokens"), default=2048,
                       help="default 2048, VLMEvalKit's for Qwen2-VL")
        p.add_argument("--batch-size", type=int_at_least(1), default=8, help="hf backend batch size")
        p.add_argument("--pixels", choices=["vlmevalkit", "model"], default="vlmevalkit",
                       help="image resolution: VLMEvalKit's Qwen2-VL-7B settings (default) or the processor's own")
        p.add_argument("--base-url", help="openai backend: server URL (e.g. a vLLM server)")
        p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="openai backend: env variable with the key")
        p.add_argument("--backend-option", action="append", default=[], metavar="KEY=VALUE",
                       help="extra generator option, e.g. tensor_parallel_size=2 (repeatable)")
        p.add_argument("--chunk-size", type=int_at_least(1), default=256, help="samples whose images are decoded at once")
        p.add_argument("--new-run", action="store_true",
                       help="start --out over when another model or settings made it (default: refuse)")
    p = steps.add_parser("score", help="score a run file")
    p.set_defaults(run_step=score)
    p.add_argument("benchmark", choices=list(BENCHES))
    p.add_argument("run", help="run file written by the generation step")
    p.add_argument("--out", required=True, help="score JSON")
    p.add_argument("--profile", help="mmmu: vlmevalkit (default, as the SPY paper) | official; "
                                     "mme: vlmevalkit (default) | lmms-eval")
    p.add_argument("--vlmeval-dir", help="where the VLMEvalKit-format files go (default: beside --out)")
    p.add_argument("--model-name", help="their name prefix (default: that directory's name, as SPY expects)")
    p.add_argument("--no-vlmeval", action="store_true", help="write only our JSON")
    p = steps.add_parser("report", help="our scores next to the published Qwen2-VL-7B-Instruct numbers")
    p.set_defaults(run_step=report)
    p.add_argument("--general-dir", help="directory with the three result files")
    for name in BENCHES:
        p.add_argument(f"--{name}", help=f"{name} result file (ours, VLMEvalKit or lmms-eval)")
    p.add_argument("--label", default="ours", help="name of our model in the table and chart")
    p.add_argument("--out", required=True, help="output directory")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return args.run_step(args)
