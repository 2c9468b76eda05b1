"""`python -m eval suite`: one checkpoint on every benchmark a suite YAML names, one results.json, report.md and
summary PNG (the model's privacy report card).

    python -m eval suite --config eval/suites/demo.yaml --model PATH_OR_ID --out DIR \\
        [--root DIR] [--set KEY=VALUE ...] [--push-to-hub REPO] [--wandb [--wandb-project NAME] [--wandb-samples N]]
        [--no-view]

The suite drives the per-benchmark steps through their Python functions (eval/spy/cli.py, eval/spatialtrust/...),
with one model load shared by all sections. Each step writes its run file under --out and resumes from it, so
running the suite again continues where it stopped, and a finished section is read back without loading the
model. `--push-to-hub` writes the headline metrics into the repo's card as model-index
(huggingface_hub.metadata_update; the token comes from HF_TOKEN). OUT/view/index.html is the per-sample viewer
(`python -m eval view`, docs/evaluation/viewer.md); `--wandb` also logs a table of samples. `--set KEY=VALUE`
changes one key of the YAML for this run (a dotted path, a YAML value: `--set backend_options.batch_size=8
--set sections.spy.limit=40`), checked as the file is. The suite YAML (see eval/suites/):

    name: demo
    root: outputs/demo            # relative paths below start here (--root overrides; default: the cwd)
    backend: hf                   # hf | vllm | openai; options for it under backend_options
    backend_options: {batch_size: 16, max_new_tokens: 32}
    judge: rule                   # rule (offline), or {model: NAME, base_url: URL, api_key_env: VAR}
    sections:
      spy: {items: .../questions.json, images: DIR, settings: [without_distractors, with_distractors],
            categories: FILE}    # the category file the items were made with (default: SPY's 67 categories)
      spatialtrust: {data: .../data.jsonl, modes: [one-pass, guard], synthetic_images: 8}
      general: {benchmarks: [mmmu, ocrbench, mme], datasets: {mmmu: local copy or Hub id}}   (+ the SPY composite)
      synthetic_general: {data: .../general_test.json, images: DIR}   (the study's general task, exact match)
      geo: {images: .../geo_images, settings: [mcq, free-form]}   (free-form needs an LLM judge)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cli.entry import ArgumentParser
from cli.errors import InputError, read_json
from cli.numbers import int_at_least
from eval.suite_config import SPY_SETTINGS, load_config
from store.runs import nonempty, write_json, write_text

SPY_HEADLINE = {"ics": "ICS", "hms": "HMS", "rta_nonconflict": "RtA", "ata_nonconflict": "AtA",
                "ata_conflict": "AtA conflict"}
SPATIAL_HEADLINE = {"q1": "Q1", "q2": "Q2", "q3": "Q3", "q4": "Q4", "q5": "Q5", "overall": "overall"}
GEO_HEADLINE = {"q7_accuracy": "Q7 accuracy", "q7_macro_f1": "Q7 macro-F1", "over_disclosure": "over-disclosure",
                "abstention_violation": "abstention violation"}


# ----------------------------------------------------------------------------------------------- sections
class Model:
    """The model under evaluation, loaded on first use and shared by every section."""

    def __init__(self, model: str, backend: str, options: dict):
        self.model, self.backend, self.options, self.generator = model, backend, options, None

    def get(self):
        if self.generator is None:
            from eval.backends import load_generator

            print(f"loading {self.model} ({self.backend})", flush=True)
            self.generator = load_generator(self.backend, self.model, **self.options)
        return self.generator

    def close(self):
        if self.generator is not None:
            self.generator.close()


def run_spy(section: dict, judge, model: Model, out: Path) -> dict:
    """Each setting's metrics; with `self_moderation: true` also `<setting>_self_moderation`: the same answers
    after the two reflection turns of the training-free baseline (paper §4.1), judged on the last one."""
    from eval.spy import cli

    categories = section.get("categories")
    answer_options = {k: model.options.get(k) for k in cli.ANSWER_OPTIONS if k in model.options}

    def judge_run(run, judged, resp_key="response"):
        if judge == "rule":
            cli.judge(run, judged, rule=True, resp_key=resp_key, categories=categories)
        else:
            cli.judge(run, judged, judge_model=judge["model"], base_url=judge.get("base_url"), resp_key=resp_key,
                      api_key_env=judge.get("api_key_env", "OPENAI_API_KEY"), categories=categories)

    results = {}
    for setting in section["settings"]:
        folder = out / "spy" / setting
        metrics_path = folder / "metrics.json"
        run, judged = folder / "run.jsonl", folder / "judged.jsonl"
        if not metrics_path.exists():
            cli.generate(section["items"], section["images"], run, generator=model.get(), backend=model.backend,
                         distractors=SPY_SETTINGS[setting], limit=section.get("limit"), categories=categories,
                         **answer_options)
            judge_run(run, judged)
            cli.metrics(judged, metrics_path, categories=categories)
        results[setting] = read_json(metrics_path)
        selfmod_metrics = folder / "metrics_self_moderation.json"
        if section.get("self_moderation") and not selfmod_metrics.exists():
            selfmod, selfmod_judged = folder / "self_moderation.jsonl", folder / "self_moderation_judged.jsonl"
            cli.self_moderate(run, section["images"], selfmod, generator=model.get(), backend=model.backend,
                              progress=False, **answer_options)
            judge_run(selfmod, selfmod_judged, resp_key="resp_3")
            cli.metrics(selfmod_judged, selfmod_metrics, key="eval_3", categories=categories)
        if section.get("self_moderation"):
            results[f"{setting}_self_moderation"] = read_json(selfmod_metrics)
    return results


def run_synthetic_general(section: dict, model: Model, out: Path) -> dict:
    """The synthetic general task's accuracy (eval/general/synthetic.py); read back when already scored."""
    from eval.general import synthetic

    folder = out / "synthetic_general"
    if not (folder / "score.json").exists():
        options = {k: model.options.get(k) for k in ("max_new_tokens", "dtype") if k in model.options}
        synthetic.run(model.get(), section["data"], section["images"], folder, model.backend,
                      limit=section.get("limit"), options=options)
    return read_json(folder / "score.json")


def run_spatialtrust(section: dict, judge, model: Model, out: Path) -> dict:
    from eval.spatialtrust import data
    from eval.spatialtrust.guard import DEFAULT_RETRIES, check_run_file, generate_predictions, run_header
    from eval.spatialtrust.scoring import compute_metrics
    from store.runs import RunFile, write_jsonl

    if not Path(section["data"]).exists():  # synthetic_images: N -> draw the offline synthetic set once
        data.build_synthetic(Path(section["data"]).parent, n_images=section["synthetic_images"])
    records = data.load(section["data"], image_root=section.get("image_root"), check_images=True)
    records = records[: section["limit"]] if section.get("limit") else records
    results = {}
    for mode in section["modes"]:
        folder = out / "spatialtrust" / mode
        metrics_path = folder / "metrics.json"
        if not metrics_path.exists():
            run_path, predictions_path = folder / "run.jsonl", folder / "predictions.jsonl"
            generator = model.get()
            header = run_header(mode, model.model, model.backend, section.get("box_scale", "pixels"),
                                section.get("retries", DEFAULT_RETRIES), model.options)
            run = RunFile(run_path, header=header)
            check_run_file(run_path, mode, model.model)
            run.begin()
            predictions = generate_predictions(generator, records, mode, run_path, retries=header["retries"],
                                               box_scale=header["box_scale"], model=model.model)
            write_jsonl(predictions_path, predictions)
            judgments = []
            if judge != "rule":  # q4/q5 need the LLM judge; the rule judge has none (they score 0)
                from eval.judge import JudgeClient
                from eval.spatialtrust.judge import judge_run

                client = JudgeClient(judge["model"], base_url=judge.get("base_url"),
                                     api_key_env=judge.get("api_key_env", "OPENAI_API_KEY"),
                                     cache_path=folder / "judgments.jsonl.cache.jsonl")
                judgments = [j for j in judge_run(client, records, predictions, folder / "judgments.jsonl")]
            write_json(metrics_path, {**compute_metrics(records, predictions, judgments),
                                      "judged": judge != "rule"})
        results[mode] = read_json(metrics_path)
    return results


def run_general(section: dict, model: Model, out: Path) -> dict:
    """MMMU / OCRBench / MME through eval.general's steps (images at the model processor's sizes: one model load
    serves every section), each scored with its first profile."""
    from eval.general import common, mmmu
    from eval.general.cli import BENCHES, read_run
    from eval.general.results import write_score
    from store.runs import RunFile

    scores = {}
    for name in section["benchmarks"]:
        bench, folder = BENCHES[name], out / "general" / name
        score_path = folder / "score.json"
        if not score_path.exists():
            source = section["datasets"].get(name) or bench.HUB_ID
            limit = section.get("limit")
            if bench is mmmu:
                ds = mmmu.load(source, tuple(section.get("mmmu_splits", mmmu.SPLITS)), limit)
            else:
                ds = bench.load(source, limit)
            items = bench.items(ds, source)
            run_path = folder / "run.jsonl"
            header = {"step": f"general {name}", "model": model.model, "backend": model.backend,
                      "max_new_tokens": model.options.get("max_new_tokens"), "pixels": "model", "backend_options": []}
            run = RunFile(run_path, header=header)
            if run.pending(items):
                generator = model.get()
                run.begin()
                common.generate(bench, ds, items, generator, run_path)
            else:
                run.finalize([item["id"] for item in items])
            records = read_run(bench, run_path)
            profiles = getattr(bench, "PROFILES", None)
            write_score(bench.score(records, profiles[0]) if profiles else bench.score(records), score_path)
        scores[name] = read_json(score_path)
    return scores


def run_geo(section: dict, judge, model: Model, out: Path) -> dict:
    """VLM-GeoPrivacy through `eval geo`'s own steps: generate (the suite's model), the granularity judge for
    free-form answers, metrics."""
    from eval.geoprivacy import cli as geo

    results = {}
    for setting in section["settings"]:
        folder = out / "geo" / setting
        metrics_path = folder / "metrics" / "metrics.json"
        if not metrics_path.exists():
            files = [f"--{k}={section[k]}" for k in ("labels", "metadata") if section.get(k)]
            run = folder / "run.jsonl"
            argv = ["generate", "--backend", model.backend, "--model", model.model, "--images", section["images"],
                    "--setting", setting, "--out", str(run), *files,
                    *(["--limit", str(section["limit"])] if section.get("limit") else []),
                    *(["--max-new-tokens", str(model.options["max_new_tokens"])]
                      if model.options.get("max_new_tokens") else [])]
            geo.cmd_generate(geo.build_parser().parse_args(argv), generator=model.get())
            if setting == "free-form":
                judged = folder / "judged.jsonl"
                geo.cmd_judge(geo.build_parser().parse_args(
                    ["judge", str(run), "--out", str(judged), "--judge-model", judge["model"],
                     *(["--base-url", judge["base_url"]] if judge.get("base_url") else []),
                     "--api-key-env", judge.get("api_key_env", "OPENAI_API_KEY")]))
                run = judged
            geo.cmd_metrics(geo.build_parser().parse_args(
                ["metrics", str(run), "--setting", setting, "--out", str(folder / "metrics"), *files]))
        (report,) = read_json(metrics_path)["files"].values()
        results[setting] = report
    return results


def general_rows(general: dict, spy: dict) -> list[dict]:
    from eval.general.composite import composite

    rows, values = [], {}
    if "mmmu" in general:
        splits = general["mmmu"]["splits"]
        split = "validation" if "validation" in splits else next(iter(splits))
        values["mmmu"] = 100 * splits[split]["accuracy"]
        rows.append({"benchmark": "MMMU", "setting": split, "metric": "accuracy", "key": "mmmu",
                     "value": values["mmmu"], "n": splits[split]["n"]})
    if "ocrbench" in general:
        values["ocrbench"] = general["ocrbench"]["score"]
        rows.append({"benchmark": "OCRBench", "setting": "score of 1000", "metric": "score", "key": "ocrbench",
                     "value": values["ocrbench"], "n": general["ocrbench"]["n"]})
    if "mme" in general:
        values["mme"] = general["mme"]["score"]
        rows.append({"benchmark": "MME", "setting": "perception + cognition", "metric": "score", "key": "mme",
                     "value": values["mme"], "n": general["mme"]["n"]})
    plain = spy.get("without_distractors")
    if len(values) == 3 and plain and plain.get("ics") is not None and plain.get("hms") is not None:
        for key, value in composite(plain["ics"], plain["hms"], values["mmmu"], values["ocrbench"],
                                    values["mme"]).items():
            rows.append({"benchmark": "SPY composite", "setting": "without distractors", "metric": key,
                         "key": f"composite_{key}", "value": value, "n": plain.get("total")})
    return rows


# ----------------------------------------------------------------------------------------------- results
def headline(sections: dict) -> list[dict]:
    """Every headline metric as one row: benchmark, setting, metric, value, n (samples it was computed over)."""
    rows = []
    for setting, m in sections.get("spy", {}).items():
        for key, name in SPY_HEADLINE.items():
            rows.append({"benchmark": "SPY-Bench", "setting": setting.replace("_", " "), "metric": name,
                         "key": key, "value": m.get(key), "n": m.get("total")})
    rows += general_rows(sections.get("general", {}), sections.get("spy", {}))
    if "synthetic_general" in sections:
        m = sections["synthetic_general"]
        rows.append({"benchmark": "synthetic general", "setting": "held-out", "metric": "accuracy",
                     "key": "synthetic_general_accuracy", "value": m["accuracy"], "n": m["n"]})
    for setting, m in sections.get("geo", {}).items():
        for key, name in GEO_HEADLINE.items():
            if key in m:
                rows.append({"benchmark": "VLM-GeoPrivacy", "setting": setting, "metric": name, "key": key,
                             "value": m[key], "n": m.get("n")})  # n_valid of them parsable: in the JSON
    for mode, m in sections.get("spatialtrust", {}).items():
        for key, name in SPATIAL_HEADLINE.items():
            rows.append({"benchmark": "SpatialTrust", "setting": mode + ("" if m.get("judged") else " (q4/q5 unjudged)"),
                         "metric": name, "key": key, "value": m.get(key), "n": m.get("n_images")})
    return rows


def settings_of(config: dict, model: str) -> dict:
    """What makes the numbers: compared runs with other settings get a warning from `eval compare`. A category
    file counts by its content (sha256), not its path."""
    from data_prep.categories import load_categories

    def entry_settings(entry: dict) -> dict:
        kept = {k: v for k, v in entry.items() if k not in ("items", "images", "data", "image_root", "datasets")}
        if kept.get("categories") is not None:
            kept["categories"] = load_categories(kept["categories"]).digest
        return kept

    return {"model": model, "backend": config["backend"], "backend_options": config["backend_options"],
            "judge": config["judge"], "sections": {name: entry_settings(entry)
                                                   for name, entry in config["sections"].items()}}


SPY_CATEGORY_SCORES = ("ics", "hms", "abs_ics", "accuracy", "rta_nonconflict", "ata_conflict")


def spy_by_category(spy: dict, categories=None) -> dict:
    """Per setting, one row per category: its name, whether it is absolute, ICS and HMS (and the scores they come
    from), over `total` samples; from the metrics' `by_label`, in the category file's order."""
    from data_prep.categories import as_categories

    cats = as_categories(categories)
    names, absolute = cats.label2text(), cats.absolute_labels()
    return {setting: [{"category": label, "name": names.get(label, label), "absolute": label in absolute,
                       **{k: m.get(k) for k in SPY_CATEGORY_SCORES}, "n": m.get("total")}
                      for label, m in metrics["by_label"].items()]
            for setting, metrics in spy.items()}


def category_table(by_category: dict) -> str:
    """One row per category, ICS and HMS per setting (markdown)."""
    from eval.report import markdown_table

    rows = {}
    for setting, entries in by_category.items():
        for e in entries:
            row = rows.setdefault(e["category"], {"category": e["category"], "name": e["name"],
                                                  "absolute": "yes" if e["absolute"] else ""})
            row.update({f"ICS {setting.replace('_', ' ')}": e["ics"], f"HMS {setting.replace('_', ' ')}": e["hms"]})
    columns = ["category", "name", "absolute", *[f"{m} {s.replace('_', ' ')}" for s in by_category
                                                 for m in ("ICS", "HMS")]]
    return markdown_table(list(rows.values()), columns)


def summary_png(path: Path, rows: list[dict], title: str) -> Path:
    from eval.report import bar_chart

    labels = [f"{r['benchmark']} {r['metric']}\n{r['setting']}" for r in rows]
    return bar_chart(path, labels, {title: [r["value"] for r in rows]}, f"privacy report card: {title}", "score (%)")


def eval_results(rows: list[dict]):
    """The rows as huggingface_hub EvalResults (a card's model-index)."""
    from huggingface_hub import EvalResult

    return [EvalResult(task_type="image-text-to-text", dataset_type=r["benchmark"].lower(),
                       dataset_name=r["benchmark"], dataset_config=r["setting"].replace(" ", "_"),
                       metric_type=r["key"], metric_name=f"{r['metric']} ({r['setting']})",
                       metric_value=r["value"]) for r in rows if r["value"] is not None]


def push_results(repo: str, rows: list[dict], model_name: str) -> None:
    """Write the results into the repo's card as model-index (kept: the rest of the card and other results)."""
    from huggingface_hub import metadata_update
    from huggingface_hub.repocard_data import eval_results_to_model_index

    index = eval_results_to_model_index(model_name, eval_results(rows))
    metadata_update(repo, {"model-index": index}, overwrite=True, token=os.environ.get("HF_TOKEN"),
                    commit_message="privacy-align: evaluation results (python -m eval suite)")


def log_wandb(project: str, name: str, rows: list[dict], settings: dict, out=None, samples: int = 100,
              inputs: dict | None = None) -> None:
    """The headline metrics, and beside them a table of the first `samples` samples of the suite folder `out`
    (image, prompt, answer, verdict: eval/view's rows; `inputs`: where its images are, eval.view.records.
    suite_inputs), as lmms-eval logs its samples."""
    import wandb

    from cli.secrets import redact_obj

    run = wandb.init(project=project, name=f"eval {name}", job_type="eval", config=redact_obj(settings),
                     tags=["eval", "suite"])
    logged = {f"eval/{r['benchmark']}/{r['setting']}/{r['metric']}": r["value"] for r in rows
              if r["value"] is not None}
    if out is not None and samples:
        from eval.view import load_rows, sample_table

        logged["eval/samples"] = sample_table(load_rows([out], inputs), limit=samples)
    run.log(logged)
    run.finish()


def run_suite(config_path, model: str, out, root: str | None = None, push_to_hub: str | None = None,
              wandb: bool = False, wandb_project: str | None = None, overrides: dict | None = None,
              view: bool = True, wandb_samples: int = 100) -> dict:
    """Every section, then results.json, report.md, report.png and (`view`) the per-sample viewer in out/view."""
    from store.runs import check_outputs, claim_folder

    config = load_config(config_path, root, overrides)
    out = Path(out)
    check_outputs([config_path], [], folders=[out])
    claim_folder(out, "eval suite")  # a folder of the user's files (their README.md, results.json) is refused
    settings = settings_of(config, model)
    previous = out / "suite_settings.json"
    if previous.exists() and read_json(previous) != json.loads(json.dumps(settings)):
        raise InputError(out, None, None, f"holds a suite run with other settings ({previous}); use another --out")
    write_json(previous, settings)
    runner = Model(model, config["backend"], config["backend_options"])
    sections = {}
    try:
        if "spy" in config["sections"]:
            sections["spy"] = run_spy(config["sections"]["spy"], config["judge"], runner, out)
        if "general" in config["sections"]:
            sections["general"] = run_general(config["sections"]["general"], runner, out)
        if "synthetic_general" in config["sections"]:
            sections["synthetic_general"] = run_synthetic_general(config["sections"]["synthetic_general"], runner, out)
        if "geo" in config["sections"]:
            sections["geo"] = run_geo(config["sections"]["geo"], config["judge"], runner, out)
        if "spatialtrust" in config["sections"]:
            sections["spatialtrust"] = run_spatialtrust(config["sections"]["spatialtrust"], config["judge"], runner, out)
    finally:
        runner.close()
    rows = headline(sections)
    name = config.get("name", Path(config_path).stem)
    from eval.view.records import suite_inputs

    results = {"suite": name, "model": model, "settings": settings, "headline": rows, "sections": sections,
               "inputs": suite_inputs(config, out)}  # where the samples' images and data are, for eval view
    per_category = ""
    if "spy" in sections:
        results["spy_by_category"] = spy_by_category(sections["spy"], config["sections"]["spy"].get("categories"))
        per_category = "\n## SPY-Bench per category\n\n" + category_table(results["spy_by_category"])
    write_json(out / "results.json", results)
    from eval.report import markdown_table

    png = summary_png(out / "report.png", rows, Path(model).name or model)
    notes = [f"- {r['benchmark']} {r['setting']}: q4/q5 need an LLM judge; with the rule judge they score 0"
             for r in rows if r["benchmark"] == "SpatialTrust" and "unjudged" in r["setting"] and r["key"] == "q4"]
    write_text(out / "report.md", f"# Privacy report card: {model}\n\nSuite `{name}` ({config_path}), backend "
                                  f"{config['backend']}, judge {config['judge'] if config['judge'] == 'rule' else config['judge']['model']}.\n\n"
                                  + markdown_table(rows, ["benchmark", "setting", "metric", "value", "n"])
                                  + ("\n" + "\n".join(notes) + "\n" if notes else "")
                                  + f"\n![summary]({png.name})\n" + per_category)
    if view:
        from eval.view import build_view

        # the suite knows its inputs (the YAML named them): its own viewer need not trust what results.json says
        build_view([out], out / "view", names=[Path(model).name or model], progress=False,
                   inputs=suite_inputs(config))
    if push_to_hub:
        push_results(push_to_hub, rows, push_to_hub.split("/")[-1])
    if wandb:
        log_wandb(wandb_project or config.get("wandb_project") or os.environ.get("WANDB_PROJECT", "privacy-align"),
                  name, rows, settings, out=out, samples=wandb_samples, inputs=suite_inputs(config))
    return results


def set_overrides(pairs: list[str] | None) -> dict:
    """`--set KEY=VALUE` options as the nested overrides load_config merges into the YAML (`a.b=1` -> {a: {b: 1}});
    VALUE is read as YAML (`8`, `null`, `[one-pass]`, `{device: cpu}`)."""
    from cli import strict_yaml

    overrides: dict = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        names = key.split(".")
        if not sep or not all(n.strip() for n in names):
            raise InputError("command line", None, "--set", f"expected KEY=VALUE (e.g. sections.spy.limit=40), "
                             f"got {pair!r}")
        value = strict_yaml.parse(text, "--set " + key) if text.strip() else None
        node = overrides
        for name in names[:-1]:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise InputError("command line", None, "--set", f"{key}: {name} is set to a value above")
        node[names[-1]] = value
    return overrides


def parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m eval suite", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="suite YAML, e.g. eval/suites/demo.yaml")
    parser.add_argument("--model", required=True, type=nonempty, help="checkpoint folder or Hub id (served name for openai)")
    parser.add_argument("--out", required=True, help="folder for the run files, results.json, report.md, report.png")
    parser.add_argument("--root", help="where the YAML's relative data paths start (default: its root key, or the cwd)")
    parser.add_argument("--push-to-hub", metavar="REPO", help="write the results into this Hub repo's card (model-index)")
    parser.add_argument("--wandb", action="store_true", help="log the headline metrics to W&B (job_type eval)")
    parser.add_argument("--wandb-project", help="default: the YAML's wandb_project, WANDB_PROJECT, privacy-align")
    parser.add_argument("--wandb-samples", type=int_at_least(0), default=100,
                        help="with --wandb: samples in the logged sample table (wandb.Table with images; 0: none)")
    parser.add_argument("--no-view", action="store_true",
                        help="do not write the per-sample viewer (default: OUT/view/index.html, `python -m eval view`)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="one key of the YAML for this run, as a dotted path and a YAML value, e.g. "
                             "--set sections.spy.limit=40 (repeatable)")
    return parser


def run_args(args: argparse.Namespace) -> dict:
    """run_suite with the command line's arguments (the demo runs the command it prints through here)."""
    return run_suite(args.config, args.model, args.out, root=args.root, push_to_hub=args.push_to_hub,
                     wandb=args.wandb, wandb_project=args.wandb_project, view=not args.no_view,
                     wandb_samples=args.wandb_samples, overrides=set_overrides(args.set))


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    results = run_args(args)
    from eval.report import markdown_table

    print(markdown_table(results["headline"], ["benchmark", "setting", "metric", "value", "n"]), end="")
    print(f"wrote {Path(args.out) / 'results.json'}, report.md, report.png"
          + ("" if args.no_view else " and the sample viewer view/index.html"), file=sys.stderr)
    return 0
