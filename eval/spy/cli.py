"""`python -m eval spy <step>`: SPY-Bench generation, self-moderation, judging, metrics and report.

    python -m eval spy generate --model PATH_OR_ID --backend hf|vllm|openai --items questions.json \\
        --images DIR [--distractors] [--categories FILE] --out RUN.jsonl
    python -m eval spy self-moderate RUN.jsonl --model ... --backend ... --images DIR --out SELFMOD.jsonl
    python -m eval spy judge RUN.jsonl --judge-model NAME [--base-url URL | --judge rule] [--categories FILE] \\
        --out JUDGED.jsonl
    python -m eval spy metrics JUDGED.jsonl [--categories FILE] --out METRICS.json
    python -m eval spy report METRICS.json [MORE.json ...] --out-dir DIR

Each step reads the previous step's file, validates all of it before doing anything (bad input: one line
naming file, line and field, exit status 2, nothing written), and the long steps (generate,
self-moderate, judge) are resumable: run the same command again after a kill or after failures. Their run
files record the model and settings: resuming with others refuses, `--new-run` starts the file over.
`--categories FILE` is the category file the items were made with (data_prep/categories.py; default: SPY's 67
categories): label texts, instruction templates, the judge's topic and which categories are absolute come from
it, and run files record its sha256, so a resume with another file refuses.
The same steps are plain functions here (`generate`, `self_moderate`, `judge`, `metrics`, `report`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import InputError, read_json
from cli.numbers import int_at_least, option, positive_float
from data_prep.categories import CategorySet, as_categories
from data_prep.spy_bench import build_samples, sample_id
from store.runs import (
    RunFile,
    check_outputs,
    claim_files,
    nonempty,
    read_jsonl,
    read_run,
    warn_if_empty,
    warn_unequal_counts,
    write_json,
    write_text,
)

logger = logging.getLogger(__name__)

SUMMARY_COLUMNS = ["model", "total", "exceptions", "accuracy", "abs_accuracy", "ics", "abs_ics", "rta_nonconflict",
                   "ata_nonconflict", "ics_nonconflict", "ata_conflict", "hms"]
# Which command-line options each backend takes.
BACKEND_OPTIONS = {
    "hf": ("max_new_tokens", "batch_size", "dtype", "device", "min_pixels", "max_pixels", "trust_remote_code"),
    "vllm": ("max_new_tokens", "dtype", "min_pixels", "max_pixels", "trust_remote_code", "tensor_parallel_size",
             "data_parallel_size", "max_model_len", "gpu_memory_utilization", "kv_cache_gib", "enforce_eager",
             "chunk_size"),
    "openai": ("max_new_tokens", "base_url", "api_key_env", "concurrency", "max_retries", "timeout",
               "max_connection_failures"),
}
# The options that change answers: a run file records them and a resume must use the same.
ANSWER_OPTIONS = ("max_new_tokens", "dtype", "min_pixels", "max_pixels")


def answer_settings(backend: str, options: dict, generator=None) -> dict:
    """The ANSWER_OPTIONS a run header records, with the dtype the backend actually runs in."""
    from eval.backends import resolved_dtype

    dtype = generator.dtype if generator is not None else resolved_dtype(backend, options.get("dtype"),
                                                                          options.get("device"))
    return {**{k: options.get(k) for k in ANSWER_OPTIONS}, "dtype": dtype}


# --------------------------------------------------------------------------------------------------------------
# Steps as functions


def _path(categories):
    """A category file given as a path (an input no output may overwrite), else None."""
    return None if categories is None or isinstance(categories, CategorySet) else categories


def categories_header(cats: CategorySet) -> dict:
    """What a run header records of the category set: its sha256, left out for SPY's default file so that run
    files from before category files resume."""
    return {} if cats.is_default() else {"categories": cats.digest}


def images_entry(images, out, run=None) -> dict:
    """The run header's `images`: the folder the samples' image paths start in, relative to the run file's folder
    (eval view finds the images there when it lies inside that folder). `run`: a run file whose header carries it
    (spy judge), relative to that file's folder."""
    import os

    if images is None and run is not None:
        header = read_run(run)[0] or {}
        images = header.get("images") if isinstance(header.get("images"), str) else None
        images = None if images is None else Path(run).parent / images
    if images is None:
        return {}
    # abspath, not resolve: a symlinked images folder inside the run's folder stays inside it
    return {"images": os.path.relpath(os.path.abspath(images), os.path.dirname(os.path.abspath(out)))}


def _check_run_matches(out, samples: list[dict], header: dict, new_run: bool) -> None:
    """Refuse to resume into a run file made by another model or settings, or from other items (the ids
    would collide)."""
    run = RunFile(out, header=header, new_run=new_run)
    for sample in samples:
        previous = run.get(sample["id"])
        if previous is not None and previous.get("input_question") != sample["input_question"]:
            raise InputError(out, None, "input_question",
                             f"sample {sample['id']!r} was generated from another prompt (other items or "
                             "--distractors setting); choose another --out")


def generate(items, images, out, model=None, backend: str = "hf", distractors: bool = False, generator=None,
             limit: int | None = None, progress: bool = True, new_run: bool = False, categories=None,
             **options) -> list[dict]:
    """Expand the SPY-Bench items and generate every sample's answer into the run file `out`.

    `categories`: the category file the items were made with (a path or CategorySet; default SPY's).
    Pass a loaded `generator` (eval.backends) to evaluate several item files with one model load; otherwise
    `backend`, `model` and `options` (e.g. batch_size, max_new_tokens) make one and close it after.
    `new_run` starts an existing run file over instead of refusing one made with other settings."""
    from eval.backends import generate_run, load_generator
    from eval.spy.prompts import spy_request

    if generator is None and model is None:
        raise ValueError("generate needs a model or a generator")
    check_outputs([items, _path(categories)], [out])
    cats = as_categories(categories)
    samples = build_samples(items, images_dir=images, distractors=distractors, categories=cats)
    samples = samples[:limit] if limit else samples
    header = {"step": "spy generate", "model": str(model) if generator is None else generator.name,
              "backend": backend, "distractors": distractors, **answer_settings(backend, options, generator),
              **categories_header(cats), **images_entry(images, out)}
    _check_run_matches(out, samples, header, new_run)
    own = generator is None
    generator = generator or load_generator(backend, model, **options)
    try:
        requests = [spy_request(s, images) for s in samples]
        meta = {s["id"]: {**s, "model": generator.name} for s in samples}
        return generate_run(generator, requests, out, meta=meta, progress=progress, header=header,
                            new_run=new_run)
    finally:
        if own:
            generator.close()


def self_moderate(run, images, out, model=None, backend: str = "hf", generator=None, progress: bool = True,
                  new_run: bool = False, **options) -> list[dict]:
    """Add the two self-moderation turns (`resp_2`, `resp_3`) to a finished generation run."""
    from eval.backends import load_generator
    from eval.spy.self_moderation import load_answered
    from eval.spy.self_moderation import self_moderate as run_turns

    check_outputs([run], [out])
    records = load_answered(run, images)
    header = {"step": "spy self-moderate", "model": str(model) if generator is None else generator.name,
              "backend": backend, **answer_settings(backend, options, generator), **images_entry(images, out)}
    RunFile(out, header=header, new_run=new_run)  # refuses another run's file before the model loads
    own = generator is None
    generator = generator or load_generator(backend, model, **options)
    try:
        return run_turns(generator, records, images, out, progress=progress, header=header, new_run=new_run)
    finally:
        if own:
            generator.close()


def _judge_inputs(run, resp_key: str, cats: CategorySet) -> list[dict]:
    records = read_jsonl(run)
    texts, seen = cats.label2text(), set()
    for n, record in enumerate(records, 1):
        for field in ("label", "question"):
            if field not in record:
                raise InputError(run, n, field, "missing field")
        if record["label"] not in texts:
            raise InputError(run, n, "label", cats.unknown_label(record["label"]))
        if not isinstance(record["question"], str):
            raise InputError(run, n, "question", "expected a string")
        if resp_key in record and record[resp_key] is not None and not isinstance(record[resp_key], str):
            raise InputError(run, n, resp_key, "expected a string or null")
        if record.get("error") is not None and not isinstance(record["error"], str):
            raise InputError(run, n, "error", "expected a string or null")
        if "id" not in record:  # the reference's result files have none
            try:
                record["id"] = sample_id(record)
            except (KeyError, TypeError, ValueError):
                raise InputError(run, n, "id", "missing, and not derivable from benchmark_id / is_privacy / "
                                 "scenario") from None
        if str(record["id"]) in seen:
            raise InputError(run, n, "id", f"duplicate id {record['id']!r}")
        seen.add(str(record["id"]))
    if records and not any(resp_key in r for r in records):
        raise InputError(run, None, resp_key, "no record has this field: is --resp-key right, is this a run file?")
    return records


def failed_generation(record: dict, resp_key: str) -> bool:
    """A sample whose generation failed for good: there is no answer to judge."""
    response = record.get(resp_key)
    return bool(record.get("error")) or not isinstance(response, str) or response.startswith("Request failed after")


def judge(run, out, judge_model: str | None = None, base_url: str | None = None, rule: bool = False,
          resp_key: str = "response", cache=None, progress: bool = True, new_run: bool = False, categories=None,
          **client_options) -> list[dict]:
    """Judge every answer of a run file as respond / reject into `out` (resumable).

    `rule=True` uses the offline refusal-phrase judge (an approximation, see eval/spy/rule_judge.py);
    otherwise the SPY judge prompt goes to `judge_model` at `base_url` (an OpenAI-compatible server; the
    default is the OpenAI API) through JudgeClient, cached in `cache` (default: `<out>.cache.jsonl`).
    A failed generation is not judged: its record is copied without a verdict (metrics count it as failed;
    re-run `spy generate` to retry it). An unparsable judge answer is kept raw. `categories`: the category file
    of the items (the judge's topic is the label's name there; default SPY's)."""
    from tqdm.auto import tqdm

    from eval.spy.prompts import eval_key, judge_prompt, parse_verdict
    from eval.spy.rule_judge import rule_verdict

    if not rule and not judge_model:
        raise ValueError("judge needs judge_model, or rule=True")
    name = "rule" if rule else judge_model
    key = eval_key(resp_key)
    cache = cache or Path(str(out) + ".cache.jsonl")
    check_outputs([run, _path(categories)], [out, None if rule else cache])
    cats = as_categories(categories)
    records = _judge_inputs(run, resp_key, cats)
    warn_if_empty(run, records, "spy judge")
    done = RunFile(out, header={"step": "spy judge", "judge": name, "resp_key": resp_key, **categories_header(cats),
                                **images_entry(None, out, run)}, new_run=new_run)
    todo = []
    for record in records:
        previous = done.get(record["id"])
        if previous is None or "judge_error" in previous or previous.get(resp_key) != record.get(resp_key):
            todo.append(record)

    def judged(record, verdict, **extra):
        return {**{k: v for k, v in record.items() if k not in (key, "judge", "judge_output", "judge_error")},
                key: verdict, "judge": name, **extra}

    immediate, jobs = [], []
    for record in todo:
        response = record.get(resp_key)
        if failed_generation(record, resp_key):
            failed = {k: v for k, v in record.items() if k not in (key, "judge", "judge_output", "judge_error")}
            immediate.append({**failed, "error": record.get("error") or "no answer (generation failed)"})
        elif rule:
            immediate.append(judged(record, rule_verdict(response)))
        else:
            jobs.append((record["id"], judge_prompt(record["label"], record["question"], response, cats)))
    client = None
    if jobs:
        from eval.judge import JudgeClient

        client = JudgeClient(judge_model, base_url=base_url, cache_path=cache, **client_options)
        if any(client.cached(prompt) is None for _, prompt in jobs):
            client.client  # noqa: B018 - a missing API key fails here, before anything is written
    with tqdm(total=len(todo), desc=f"judge {Path(run).name}", disable=not progress or not todo) as bar:
        done.append_many(immediate)
        bar.update(len(immediate))
        by_id = {r["id"]: r for r in todo}
        for record_id, result in client.stream(jobs) if client else ():
            if result.get("text") is None:
                done.append(judged(by_id[record_id], None, judge_error=result["error"]))
            else:
                done.append(judged(by_id[record_id], parse_verdict(result["text"]), judge_output=result["text"]))
            bar.update()
    return done.finalize([r["id"] for r in records])


def metrics(judged, out=None, key: str = "eval_resp", reference_out=None, categories=None) -> dict:
    """SPY-Bench metrics of a judged file (ours or the reference's); written to `out` if given.
    `reference_out` also writes them in the reference's own layout and key names. `categories`: the category
    file that says which categories are absolute (default SPY's); `by_label` holds each category's scores."""
    from eval.spy.metrics import record_problems, spy_metrics, to_reference

    check_outputs([judged, _path(categories)], [out, reference_out])
    cats = as_categories(categories)
    records = read_jsonl(judged)
    problems = record_problems(records, key, judged)
    result = {**spy_metrics(records, key=key, source=judged, categories=cats), **problems}
    if any(problems.values()):
        logger.warning(f"{judged}: {problems['n_failed']} failed generations, {problems['n_unjudged']} unjudged "
                       f"and {problems['n_missing']} missing samples; failed and unjudged ones count as exceptions")
    if out:
        write_json(out, result)
    if reference_out:
        write_json(reference_out, {"metrics": to_reference(result),
                                   "metrics group by label": {k: to_reference(v) for k, v in result["by_label"].items()}})
    return result


def report(metrics_files: list, out_dir, names: list[str] | None = None, metric: str = "accuracy") -> str:
    """A markdown table of the overall scores of one or more metrics files (one row each), an overall bar
    chart and a per-category bar chart of `metric`; returns the table."""
    from eval.report import bar_chart, markdown_table
    from eval.spy.metrics import METRICS_TYPES, SCORES, label_order

    if metric not in SCORES + ("hms",):
        raise InputError("command line", None, "--metric", f"choose one of {', '.join(SCORES + ('hms',))}")
    names = names or [Path(f).stem for f in metrics_files]
    if len(names) != len(metrics_files):
        raise InputError("command line", None, "--names", "give one name per metrics file")
    out_dir = Path(out_dir)
    outputs = [out_dir / name for name in ("spy_report.md", "spy_report.json", "spy_overall.png",
                                           f"spy_by_label_{metric}.png")]
    check_outputs(metrics_files, outputs, folders=[out_dir])
    claim_files(out_dir, [p.name for p in outputs])  # a user's spy_report.md there is refused, not overwritten
    loaded = []
    for path in metrics_files:
        data = read_json(path, types=METRICS_TYPES)  # a list or text where a score goes: one line
        for field in ("total", "hms", "by_label", *SCORES):
            if not isinstance(data, dict) or field not in data:
                raise InputError(path, None, field, "missing field (expected the output of `spy metrics`)")
        loaded.append(data)
    warn_unequal_counts({name: m["total"] for name, m in zip(names, loaded)}, "records")
    rows = [{"model": name, **{c: m.get(c) for c in SUMMARY_COLUMNS[1:]}} for name, m in zip(names, loaded)]
    table = markdown_table(rows, SUMMARY_COLUMNS)
    score_names = [*SCORES, "hms"]
    claim_files(out_dir, [p.name for p in outputs], mark=True)
    bar_chart(out_dir / "spy_overall.png", score_names, {n: [m[s] for s in score_names] for n, m in zip(names, loaded)},
              "SPY-Bench", "score (%)")
    labels = sorted({label for m in loaded for label in m["by_label"]}, key=label_order)
    bar_chart(out_dir / f"spy_by_label_{metric}.png", labels,
              {n: [m["by_label"].get(label, {}).get(metric) for label in labels] for n, m in zip(names, loaded)},
              f"SPY-Bench {metric} per category", f"{metric} (%)")
    by_label = [{"label": label, **{n: m["by_label"].get(label, {}).get(metric) for n, m in zip(names, loaded)}}
                for label in labels]
    text = (f"# SPY-Bench\n\n{table}\n![overall](spy_overall.png)\n\n## {metric} per category\n\n"
            f"{markdown_table(by_label, ['label', *names])}\n![per category](spy_by_label_{metric}.png)\n")
    write_text(out_dir / "spy_report.md", text)
    write_json(out_dir / "spy_report.json", {"overall": rows, f"{metric}_by_label": by_label})
    return table


# --------------------------------------------------------------------------------------------------------------
# Command line


def _add_backend_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=nonempty, help="local path or Hub id (hf, vllm); model name (openai)")
    parser.add_argument("--backend", choices=sorted(BACKEND_OPTIONS), default="hf")
    parser.add_argument("--images", required=True, help="folder the items' image_path values are relative to")
    parser.add_argument("--out", required=True)
    group = parser.add_argument_group("backend options (each backend takes the ones it uses)")
    group.add_argument("--max-new-tokens", type=option("max_new_tokens"), help="default 512")
    group.add_argument("--batch-size", type=int_at_least(1), help="hf: samples per generate call (default 8)")
    group.add_argument("--dtype", help="hf/vllm: e.g. bfloat16, float32 (default: bf16 on GPU, fp32 on CPU)")
    group.add_argument("--device", help="hf: cpu, cuda, cuda:1 (default: cuda if available)")
    group.add_argument("--min-pixels", type=option("min_pixels"))
    group.add_argument("--max-pixels", type=option("max_pixels"))
    group.add_argument("--trust-remote-code", action="store_true", default=None,
                       help="hf/vllm: run the model repository's own code (off by default)")
    group.add_argument("--tensor-parallel-size", type=int_at_least(1), help="vllm")
    group.add_argument("--data-parallel-size", type=int_at_least(1),
                       help="vllm: engines, one per process: run under `accelerate launch --num_processes N`")
    group.add_argument("--max-model-len", type=int_at_least(1),
                       help="vllm (default 4096); a longer prompt is that sample's error")
    group.add_argument("--gpu-memory-utilization", type=positive_float,
                       help="vllm: share of GPU memory (on CPU: of RAM) for weights and KV cache (default 0.9)")
    group.add_argument("--kv-cache-gib", type=positive_float, help="vllm: KV cache size in GiB (what to set on CPU)")
    group.add_argument("--enforce-eager", action="store_true", default=None,
                       help="vllm: no torch.compile / CUDA graphs (faster start, slower generation)")
    group.add_argument("--chunk-size", type=int_at_least(1),
                       help="vllm: requests per engine call; results are written after each (default 1024)")
    group.add_argument("--base-url", help="openai: the server's /v1 URL (default: the OpenAI API)")
    group.add_argument("--api-key-env", help="openai: environment variable holding the API key (OPENAI_API_KEY)")
    group.add_argument("--concurrency", type=int_at_least(1), help="openai: requests in flight (default 8)")
    group.add_argument("--max-retries", type=int_at_least(0), help="openai: retries on 429/5xx/timeouts (default 6)")
    group.add_argument("--timeout", type=positive_float, help="openai: seconds per request (default 60)")
    group.add_argument("--max-connection-failures", type=option("max_connection_failures"),
                       help="openai: stop (what was finished is kept) after this many requests in a row found no "
                            "server, each after its retries (default 3)")
    parser.add_argument("--new-run", action="store_true",
                        help="start --out over when it holds a run made with another model or settings "
                             "(default: refuse, and say which setting differs)")


def _backend_options(args) -> dict:
    allowed = BACKEND_OPTIONS[args.backend]
    options = {}
    for name in {n for opts in BACKEND_OPTIONS.values() for n in opts}:
        value = getattr(args, name)
        if value is None:
            continue
        if name not in allowed:
            raise InputError("command line", None, f"--{name.replace('_', '-')}",
                             f"not used by the {args.backend} backend")
        options[name] = value
    return options


CATEGORIES_HELP = "category file the items were made with (default: SPY's 67 categories; data_prep/categories.py)"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m eval spy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)

    p = steps.add_parser("generate", help="answer every SPY-Bench sample with a model")
    p.add_argument("--items", required=True, help="SPY-Bench questions.json ({\"benchmark_list\": [...]}) or .jsonl")
    p.add_argument("--distractors", action="store_true", help="add the 5 distractor instructions")
    p.add_argument("--limit", type=int_at_least(1), help="only the first N samples (smoke runs)")
    p.add_argument("--categories", help=CATEGORIES_HELP)
    _add_backend_args(p)

    p = steps.add_parser("self-moderate", help="the self-moderation baseline: two reflection turns")
    p.add_argument("run", help="a finished `spy generate` run file")
    _add_backend_args(p)

    p = steps.add_parser("judge", help="judge each answer as respond / reject")
    p.add_argument("run")
    p.add_argument("--out", required=True)
    p.add_argument("--judge", choices=("llm", "rule"), default="llm",
                   help="rule: offline refusal-phrase approximation (smoke runs, demo)")
    p.add_argument("--judge-model", type=nonempty, help="e.g. gpt-4o, or the model a local vLLM server serves")
    p.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://localhost:8000/v1 (default: OpenAI)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY")
    p.add_argument("--resp-key", default="response", help="resp_3 for self-moderation runs (writes eval_3)")
    p.add_argument("--cache", help="judge cache file (default: OUT.cache.jsonl)")
    p.add_argument("--concurrency", type=int_at_least(1), default=8)
    p.add_argument("--max-retries", type=int_at_least(0), default=6)
    p.add_argument("--timeout", type=positive_float, default=60.0)
    p.add_argument("--categories", help=CATEGORIES_HELP + " (the judge's topic is the category's name)")
    p.add_argument("--new-run", action="store_true",
                   help="start --out over when another judge, --resp-key or category file made it (default: refuse)")

    p = steps.add_parser("metrics", help="SPY-Bench metrics of a judged file")
    p.add_argument("judged")
    p.add_argument("--out", help="METRICS.json")
    p.add_argument("--key", default="eval_resp", help="the verdict field (eval_3 for self-moderation)")
    p.add_argument("--reference-out", help="also write the metrics in the reference code's layout")
    p.add_argument("--categories", help=CATEGORIES_HELP + " (which categories are absolute)")

    p = steps.add_parser("report", help="table + PNG bar charts from metrics files")
    p.add_argument("metrics", nargs="+")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--names", nargs="+", help="one row name per metrics file (default: file names)")
    p.add_argument("--metric", default="accuracy", help="the score plotted per category")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.step == "generate":
        records = generate(args.items, args.images, args.out, model=args.model, backend=args.backend,
                           distractors=args.distractors, limit=args.limit, new_run=args.new_run,
                           categories=args.categories, **_backend_options(args))
        failed = sum(1 for r in records if r.get("error"))
        print(f"{len(records)} samples in {args.out}" + (f"; {failed} failed (run again to retry)" if failed else ""))
    elif args.step == "self-moderate":
        records = self_moderate(args.run, args.images, args.out, model=args.model, backend=args.backend,
                                new_run=args.new_run, **_backend_options(args))
        failed = sum(1 for r in records if r.get("error"))
        print(f"{len(records)} samples in {args.out}" + (f"; {failed} failed (run again to retry)" if failed else ""))
    elif args.step == "judge":
        if args.judge == "llm" and not args.judge_model:
            raise InputError("command line", None, "--judge-model", "required unless --judge rule")
        records = judge(args.run, args.out, judge_model=args.judge_model, base_url=args.base_url,
                        rule=args.judge == "rule", resp_key=args.resp_key, cache=args.cache,
                        api_key_env=args.api_key_env, concurrency=args.concurrency, max_retries=args.max_retries,
                        timeout=args.timeout, new_run=args.new_run, categories=args.categories)
        skipped = sum(1 for r in records if r.get("error"))
        failed = sum(1 for r in records if "judge_error" in r)
        print(f"{len(records) - skipped - failed} judged in {args.out}"
              + (f"; {failed} judge requests failed (run again to retry)" if failed else "")
              + (f"; {skipped} failed generations not judged (re-run `spy generate` to retry them)"
                 if skipped else ""))
    elif args.step == "metrics":
        from eval.report import markdown_table

        result = metrics(args.judged, args.out, key=args.key, reference_out=args.reference_out,
                         categories=args.categories)
        print(markdown_table([{"model": Path(args.judged).stem, **result}], SUMMARY_COLUMNS), end="")
    elif args.step == "report":
        print(report(args.metrics, args.out_dir, names=args.names, metric=args.metric), end="")
        print(f"wrote {Path(args.out_dir) / 'spy_report.md'} and its PNG charts")
    return 0
