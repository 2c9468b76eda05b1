"""`python -m eval geo generate|judge|coordinates|metrics`: the VLM-GeoPrivacy evaluation steps.

    geo generate    images -> model answers (run file; MCQ or free-form zs / iter-cot / malicious), resumable
    geo judge       free-form answers -> granularity labels A/B/C/D through an LLM judge, resumable
    geo coordinates answers judged C -> place name (LLM) -> coordinates (Google Geocoding), resumable
    geo metrics     our run files or the authors' released files -> metrics.json, metrics.md, Q7 heatmaps
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import InputError, check_image, read_text
from cli.numbers import int_at_least, option
from eval.geoprivacy import data
from eval.geoprivacy.prompts import MAX_FOLLOWUPS, METHODS, PROMPT_FORMATS
from store.runs import RunFile, check_outputs, claim_files, nonempty, warn_if_empty, warn_unequal_counts

logger = logging.getLogger(__name__)


def _judge_client(model, base_url, api_key_env, concurrency, cache):
    from eval.judge import JudgeClient

    return JudgeClient(model, base_url=base_url, api_key_env=api_key_env, concurrency=concurrency,
                       cache_path=cache)


def _add_judge_args(p, prefix=""):
    p.add_argument(f"--{prefix}base-url", default=None, help="OpenAI-compatible endpoint (default: OpenAI)")
    p.add_argument(f"--{prefix}api-key-env", default="OPENAI_API_KEY", help="environment variable with the key")
    p.add_argument(f"--{prefix}concurrency", type=int_at_least(1), default=8)
    p.add_argument(f"--{prefix}cache", default=None, help="judge cache (default: <out>.judge_cache.jsonl)")


NEW_RUN_HELP = ("start --out over when it holds a run made with another model, judge or settings "
                "(default: refuse, and say which setting differs)")


# --- generate -------------------------------------------------------------------------------------------------

def select_ids(labels: dict, ids_file: str | None, limit: int | None) -> list[str]:
    ids = list(labels)
    if ids_file:
        path = Path(ids_file)
        wanted = [data.label_id(line) for line in read_text(path).split() if line.strip()]
        unknown = [i for i in wanted if i not in labels]
        if unknown:
            raise InputError(path, None, "id", f"{len(unknown)} id(s) not in the labels, e.g. {unknown[0]!r}")
        ids = wanted
    return ids[:limit] if limit else ids


def cmd_generate(args, generator=None) -> int:
    """`generator`: an already loaded one (the suite's), used and left open; else one is loaded for this run."""
    from eval.backends import generate_run, load_generator
    from eval.geoprivacy.prompts import build_request

    if args.setting == "mcq" and args.method != "zs":
        raise InputError("--method", None, None, "the MCQ setting has only the zs method")
    if args.method == "iter-cot" and not args.judge_model:
        raise InputError("--judge-model", None, None, "iter-cot needs a judge between turns")
    judge_cache = args.judge_cache or f"{args.out}.judge_cache.jsonl"
    iter_files = [f"{args.out}.turns.jsonl", f"{args.out}.turn_labels.jsonl", judge_cache]
    check_outputs([args.labels, args.metadata, args.ids_file],
                  [args.out, *(iter_files if args.method == "iter-cot" else [])])
    labels = data.load_labels(args.labels)
    meta = data.load_metadata(args.metadata)
    ids = select_ids(labels, args.ids_file, args.limit)
    images = {}
    for i in ids:
        path = data.find_image(args.images, i, meta.get(i))
        if path is None:
            raise InputError(args.images, None, i, f"no image for id {i} (looked for {data.image_id(i)}.jpg / {i}.jpg)")
        check_image(path, None, i, source=args.images)
        images[i] = str(path)
    prompt_format = args.prompt_format or ("api" if args.backend == "openai" else "open")
    options = {"max_new_tokens": args.max_new_tokens}
    if args.backend == "openai":
        options.update(base_url=args.base_url, api_key_env=args.api_key_env, concurrency=args.concurrency)
    elif args.backend == "hf":
        options.update(batch_size=args.batch_size)
    else:
        options.update(tensor_parallel_size=args.tensor_parallel_size, data_parallel_size=args.data_parallel_size,
                       **({"images_per_prompt": 2} if args.method == "malicious" else {}))
    judge = None
    if args.method == "iter-cot":
        judge = _judge_client(args.judge_model, args.judge_base_url, args.judge_api_key_env, args.judge_concurrency,
                              judge_cache)
    run_meta = {i: {"setting": args.setting, "method": args.method, "model": args.model,
                    "heuristics": args.setting == "mcq" and not args.no_heuristics,
                    "q7_only": args.q7_only, "prompt_format": prompt_format} for i in ids}

    def request(i, user_text=None, request_id=None):
        r = build_request(i, images[i], args.setting, args.method, heuristics=not args.no_heuristics,
                          q7_only=args.q7_only, prompt_format=prompt_format, user_text=user_text)
        return {**r, "id": request_id or i}

    header = {"step": "geo generate", "model": args.model, "backend": args.backend, "setting": args.setting,
              "method": args.method, "heuristics": args.setting == "mcq" and not args.no_heuristics,
              "q7_only": args.q7_only, "prompt_format": prompt_format, "max_new_tokens": args.max_new_tokens,
              "judge_model": args.judge_model if args.method == "iter-cot" else None}
    run_path = iter_files[0] if args.method == "iter-cot" else args.out
    RunFile(run_path, header=header, new_run=args.new_run)  # another model's run refuses before the model loads
    if args.method == "iter-cot":
        RunFile(iter_files[1], header={"step": "geo judge", "judge_model": args.judge_model}, new_run=args.new_run)
    import contextlib

    shared = generator is not None
    generator = generator or load_generator(args.backend, args.model, **options)
    with contextlib.nullcontext(generator) if shared else generator:
        if args.method == "iter-cot":
            from eval.geoprivacy.iterative import iter_cot_run

            records = iter_cot_run(generator, judge, ids, request, args.out, run_meta, args.judge_model,
                                   header=header, new_run=args.new_run)
        else:
            records = generate_run(generator, [request(i) for i in ids], args.out, meta=run_meta, header=header,
                                   new_run=args.new_run)
    failed = sum(1 for r in records if r.get("error"))
    print(f"wrote {args.out}: {len(records)} records, {failed} failed (re-run the same command to retry them)")
    return 0


# --- judge / coordinates --------------------------------------------------------------------------------------

def _read_run(path, required, made_by):
    """(records, the line of the first record) of the run file a step reads, made by the step before it."""
    from store.runs import read_run

    header, numbered = read_run(path, required=required, made_by=made_by)
    records = [r for _, r in numbered]
    for r in records:
        r["id"] = data.label_id(r["id"])
    return records, 1 if header is None else 2


# Fields of the other benchmarks' run files, which a GeoPrivacy answer never has: their runs hold a `response`
# too, and with no header to say which step made the file, these tell them apart.
OTHER_BENCHMARKS_FIELDS = {**dict.fromkeys(("label", "is_privacy", "other_labels", "input_question", "benchmark_id",
                                            "eval_resp", "resp_3"), "SPY-Bench"),
                           **dict.fromkeys(("image_id", "q1", "q2", "q3", "q4", "q5"), "SpatialTrust")}


def check_free_form_record(path, n: int, record: dict) -> None:
    """A record `geo judge` labels: a GeoPrivacy free-form answer (its id a GeoPrivacy id once data.label_id has
    read it, its setting free-form when it names one, no field of another benchmark's run), with the answer's
    text unless its generation failed. Checked on every record, header or not."""
    if record.get("setting", "free-form") != "free-form":  # also what the header says, for every record
        raise InputError(path, n, "setting", f"{record['setting']!r}: geo judge labels free-form answers "
                         "(geo metrics scores MCQ answers without a judge)")
    foreign = next((field for field in OTHER_BENCHMARKS_FIELDS if field in record), None)
    if foreign is not None:
        raise InputError(path, n, foreign, f"a {OTHER_BENCHMARKS_FIELDS[foreign]} field: geo judge labels "
                         "GeoPrivacy free-form answers (the run of `geo generate --setting free-form`)")
    if not data.is_label_id(record["id"]):
        raise InputError(path, n, "id", f"{record['id']!r} is not a GeoPrivacy image id (e.g. 1873728, "
                         "yfcc-1873728, s1234 or gptgeochat-1234): geo judge labels GeoPrivacy free-form answers")
    if not record.get("error") and not isinstance(record["response"], str):
        raise InputError(path, n, "response", f"expected the answer's text, got {record['response']!r} "
                         "(only a failed generation, with an error, has none)")


def cmd_judge(args) -> int:
    from eval.geoprivacy.judge import judge_run

    cache = args.cache or f"{args.out}.judge_cache.jsonl"
    check_outputs([args.input], [args.out, cache])
    records, first = _read_run(args.input, ("id", "response"), made_by=("geo generate",))
    for n, record in enumerate(records, first):  # a record without an error holds the answer to judge
        check_free_form_record(args.input, n, record)
    warn_if_empty(args.input, records, "geo judge")
    failed = [r["id"] for r in records if r.get("error")]
    RunFile(args.out, header={"step": "geo judge", "judge_model": args.judge_model}, new_run=args.new_run)
    client = _judge_client(args.judge_model, args.base_url, args.api_key_env, args.concurrency, cache)
    judged = judge_run(client, records, args.out, args.judge_model, new_run=args.new_run)
    errors = sum(1 for r in judged if r.get("error"))
    print(f"wrote {args.out}: {len(judged)} judged, {errors} judge errors (re-run to retry), "
          f"{len(failed)} generation failures skipped")
    return 0


def cmd_coordinates(args) -> int:
    import os

    from eval.geoprivacy.judge import GOOGLE_GEOCODE_URL, GoogleGeocoder, coordinates_run

    cache = args.cache or f"{args.out}.judge_cache.jsonl"
    check_outputs([args.input], [args.out, cache])
    records, _ = _read_run(args.input, ("id", "Q7-gen", "Q7-label"), made_by=("geo judge",))
    RunFile(args.out, header={"step": "geo coordinates", "extract_model": args.extract_model}, new_run=args.new_run)
    from cli.secrets import register

    register(args.geocoder_key_env)  # its value is redacted from everything written or printed
    key = os.environ.get(args.geocoder_key_env)
    if not key:
        raise InputError("environment", None, args.geocoder_key_env, "not set (the geocoder key is read from here)")
    try:
        geocoder = GoogleGeocoder(key, url=args.geocoder_url or GOOGLE_GEOCODE_URL, key_env=args.geocoder_key_env)
    except ValueError as err:
        raise InputError("--geocoder-url", None, None, str(err)) from None
    client = _judge_client(args.extract_model, args.base_url, args.api_key_env, args.concurrency, cache)
    out = coordinates_run(client, geocoder, records, args.out, new_run=args.new_run)
    found = sum(1 for r in out if r.get("source") == "geocoded")
    errors = sum(1 for r in out if r.get("error"))
    print(f"wrote {args.out}: {found} geocoded of {len(out)} answers judged C, {errors} errors (re-run to retry)")
    return 0


# --- metrics --------------------------------------------------------------------------------------------------

def infer_setting(path: Path, rows: list[dict]) -> str:
    if "free-form" in path.name or "context_fewshot" in path.name:
        return "free-form"
    done = [r for r in rows if not r.get("error")]
    if done and all("Q7-label" in r or r.get("setting") == "free-form" for r in done):
        return "free-form"
    return "mcq"


def coordinates_for(path: Path, coordinates: str | None, n_files: int) -> Path | None:
    """The coordinate file of a prediction file: `--coordinates` itself (one prediction file only), or in a
    `--coordinates` folder the file named after it (`<stem>_coord.json`, the authors' name, or ours)."""
    if not coordinates:
        return None
    target = Path(coordinates)
    if target.is_dir():
        for name in (f"{path.stem}_coord.json", f"{path.stem}_coord.jsonl", f"{path.stem}.coordinates.jsonl"):
            if (target / name).is_file():
                return target / name
        return None
    if not target.is_file():
        raise InputError(target, None, None, "file not found")
    if n_files > 1:
        raise InputError(target, None, None, "one coordinate file for several prediction files: pass a folder")
    return target


def cmd_metrics(args) -> int:
    from eval.geoprivacy.metrics import free_form_metrics, join, mcq_metrics, seed_summary
    from eval.geoprivacy.report import markdown_report, write_report

    out_files = [Path(args.out) / "metrics.json", Path(args.out) / "metrics.md"] if args.out else []
    check_outputs([*args.files, args.labels, args.metadata, args.coordinates], out_files,
                  folders=[args.out] if args.out else [])
    if args.out:
        claim_files(args.out, [p.name for p in out_files])  # a user's metrics.md there: refused before any work
    labels = data.load_labels(args.labels)
    truth = None
    results, groups = {}, {}
    # Read and check every input before computing or writing anything.
    loaded = []
    for name in args.files:
        path = Path(name)
        raw = data.read_records(path)
        records = [r for r in raw if isinstance(r, dict)] if isinstance(raw, list) else []
        setting = args.setting if args.setting != "auto" else infer_setting(path, records)
        rows = data.load_predictions(path, setting)
        failed = sum(1 for r in records if r.get("error"))
        if failed:
            logger.warning(f"{path}: {failed} record(s) failed for good and are left out; re-run the step that "
                           "wrote this file to retry them")
        coord_path = coordinates_for(path, args.coordinates, len(args.files))
        coords = data.load_coordinates(coord_path) if coord_path else None
        if coords is not None and truth is None:
            truth = {k: (v["lat"], v["lon"]) for k, v in data.load_metadata(args.metadata).items()}
        joined = join(rows, labels)
        if not joined:
            raise InputError(path, None, "id", f"none of the {len(rows)} ids matches the labels in {args.labels}")
        loaded.append((path, setting, rows, joined, coord_path, coords, failed))
    warn_unequal_counts({str(p): len(joined) for p, _, _, joined, *_ in loaded}, "samples matching the labels")
    stems = [p.stem for p, *_ in loaded]
    for path, setting, rows, joined, coord_path, coords, failed in loaded:
        key = path.stem if stems.count(path.stem) == 1 else str(path)
        report = free_form_metrics(joined, coords, truth) if setting == "free-form" else mcq_metrics(joined)
        results[key] = {"path": str(path), "setting": setting, "coordinates": str(coord_path) if coord_path else None,
                        "n_unmatched_ids": len(rows) - len(joined), "n_failed_records": failed, **report}
        groups.setdefault((setting, data.model_group(path)), []).append(key)
    seeds = {f"{group}": {"setting": setting, "files": keys, **seed_summary([results[k] for k in keys])}
             for (setting, group), keys in groups.items() if len(keys) > 1}
    out = {"labels": str(args.labels), "files": results, "seed_variation": seeds}
    if args.out:
        print(write_report(out, args.out))
        print(f"wrote {Path(args.out) / 'metrics.json'}, metrics.md and the Q7 heatmaps", file=sys.stderr)
    else:
        print(json.dumps(out, indent=2) if args.json else markdown_report(out))
    return 0


# --- argument parsing -----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m eval geo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="model answers for the benchmark images (resumable run file)")
    g.add_argument("--backend", choices=("hf", "vllm", "openai"), required=True)
    g.add_argument("--model", required=True, type=nonempty, help="model path / Hub id / API model name")
    g.add_argument("--images", required=True, help="folder of images named <image_id>.jpg or <label id>.jpg")
    g.add_argument("--out", required=True, help="run file (JSON Lines) to write or resume")
    g.add_argument("--setting", choices=("free-form", "mcq"), default="free-form")
    g.add_argument("--method", choices=METHODS, default="zs", help="free-form prompting strategy")
    g.add_argument("--no-heuristics", action="store_true", help="MCQ without the per-question heuristics")
    g.add_argument("--q7-only", action="store_true", help="MCQ with Q7 alone")
    g.add_argument("--prompt-format", choices=PROMPT_FORMATS, default=None,
                   help="api: newline-joined parts, bare labels; open: the strict `Q1: <label>` template "
                        "(default: api for --backend openai, open otherwise)")
    g.add_argument("--labels", default=str(data.DEFAULT_LABELS), help="annotation CSV (which ids to run)")
    g.add_argument("--metadata", default=str(data.DEFAULT_METADATA))
    g.add_argument("--ids-file", default=None, help="whitespace-separated ids to run (any id form)")
    g.add_argument("--limit", type=int_at_least(1), default=None)
    g.add_argument("--max-new-tokens", type=option("max_new_tokens"), default=512)
    g.add_argument("--batch-size", type=int_at_least(1), default=8, help="hf backend")
    g.add_argument("--tensor-parallel-size", type=int_at_least(1), default=1, help="vllm backend")
    g.add_argument("--data-parallel-size", type=int_at_least(1), default=1, help="vllm backend: engine replicas")
    g.add_argument("--base-url", default=None, help="openai backend endpoint")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY")
    g.add_argument("--concurrency", type=int_at_least(1), default=8)
    g.add_argument("--new-run", action="store_true", help=NEW_RUN_HELP)
    g.add_argument("--judge-model", default=None, type=nonempty, help=f"iter-cot: judge between turns (up to {MAX_FOLLOWUPS} more)")
    _add_judge_args(g, "judge-")
    g.set_defaults(func=cmd_generate)

    j = sub.add_parser("judge", help="granularity labels for free-form answers (resumable)")
    j.add_argument("input", help="run file from `geo generate --setting free-form`")
    j.add_argument("--out", required=True)
    j.add_argument("--judge-model", default="gpt-4.1-mini", type=nonempty, help="the authors used gpt-4.1-mini (at T=0.7; we use 0)")
    j.add_argument("--new-run", action="store_true", help=NEW_RUN_HELP)
    _add_judge_args(j)
    j.set_defaults(func=cmd_judge)

    c = sub.add_parser("coordinates", help="coordinates for answers judged C (place-name LLM + Google Geocoding)")
    c.add_argument("input", help="run file from `geo judge`")
    c.add_argument("--out", required=True, help="coordinate run file (JSON Lines)")
    c.add_argument("--extract-model", default="gpt-4o-mini", type=nonempty, help="the authors' place-name extractor")
    c.add_argument("--geocoder-key-env", default="GOOGLE_MAPS_API_KEY")
    c.add_argument("--geocoder-url", default=None, help="Geocoding API endpoint (default: Google's)")
    c.add_argument("--new-run", action="store_true", help=NEW_RUN_HELP)
    _add_judge_args(c)
    c.set_defaults(func=cmd_coordinates)

    m = sub.add_parser("metrics", help="metrics of run files or of the authors' released files")
    m.add_argument("files", nargs="+", help="prediction files: released JSON lists or our JSON Lines run files")
    m.add_argument("--setting", choices=("auto", "free-form", "mcq"), default="auto",
                   help="auto: free-form when the name says `free-form` or records carry `Q7-label`")
    m.add_argument("--labels", default=str(data.DEFAULT_LABELS), help="annotation CSV (gold labels)")
    m.add_argument("--metadata", default=str(data.DEFAULT_METADATA), help="true coordinates (for accuracy@km)")
    m.add_argument("--coordinates", default=None,
                   help="coordinate file (one prediction file) or folder of <stem>_coord.json files")
    m.add_argument("--out", default=None, help="folder for metrics.json, metrics.md and the Q7 heatmaps")
    m.add_argument("--json", action="store_true", help="without --out: print the JSON instead of the table")
    m.set_defaults(func=cmd_metrics)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
