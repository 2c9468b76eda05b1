"""Generate SPY-style training data and a held-out bench for your own categories, with a VLM behind any
OpenAI-compatible endpoint (a local `vllm serve`, or an API).

    python -m data_prep.generate --categories my_categories.yaml --images photos/ --out data/my-spy \\
        --base-url http://localhost:8000/v1 --model Qwen/Qwen2.5-VL-7B-Instruct

Stages (each a resumable run file under OUT/stages/, one line per unit of work):

1. templates: per category, K paraphrases of the two privacy instructions (each must name the category),
   and a scenario text wherever the category file gives a category no conflict or no privacy scenario;
   the input file plus the generated scenarios is written to OUT/categories.yaml.
2. qa: per (image, category), is the category visible at all? If so, a question, an answering reply and an
   evasive reply, as JSON. Malformed JSON is asked once more with a reminder, then dropped (`malformed`);
   a generator that refuses the task is dropped (`refused`); an image without the category is `not_visible`.
3. quality control: exact duplicates (same category, question and answer after normalising) and near
   duplicates (token-set Jaccard of question + answer >= --near-dup) are removed; then the check model
   (--check-base-url / --check-model, default the generator) reads the question and both replies (text only)
   and says whether the question is about its category, whether the answering reply answers and whether the
   evasive reply declines; failures, and check replies that stay malformed, are removed.
   OUT/review.md shows --review random kept items with their images, for a person to read.
4. assembly: images split by --test-fraction / --seed (no image in both parts) into SPY-Tune train_data.json
   (+ eval_data.json, the held-out part in SPY-Tune form for an eval loss) and SPY-Bench questions.json;
   label2text.json; images copied under OUT/images/; stats.json (per category and stage: what each filter
   removed, and every removed item with its reason). The outputs are checked with the SPY-Tune and SPY-Bench
   readers before the command ends.

Running the same command again skips finished units; a killed run loses nothing. Requests that failed for
good (after the client's retries) are recorded and retried on the next run; while any remain the command
stops after that stage with exit status 1. Other settings than the run's (model, endpoint, prompts, category
file, K) are refused unless --new-run. The API key is read from the environment variable --api-key-env only.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import sys
from pathlib import Path

import yaml

from cli.entry import ArgumentParser, run_command
from cli.errors import InputError, check_image
from cli.numbers import int_at_least, option
from data_prep.categories import SAFE_LABEL, CategorySet, parse
from data_prep.generate_prompts import (
    NUDGE,
    PROMPTS_VERSION,
    Malformed,
    Refused,
    check_prompt,
    instruct_prompt,
    parse_check,
    parse_json,
    parse_qa,
    qa_prompt,
    scenario_prompt,
    scenario_template,
    slot,
    text_field,
    user_request,
)
from data_prep.spy import draw_other_labels
from data_prep.spy_bench import build_samples, to_bench_item
from data_prep.spy_tune import load_items
from store import writer
from store.runs import RunFile, check_outputs, claim_folder, write_json, write_text
from vlm.chat_client import ChatClient, openai_messages

OUTPUTS = ("categories.yaml", "train_data.json", "eval_data.json", "questions.json", "label2text.json", "stats.json",
           "review.md")
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"}

# --------------------------------------------------------------------------------------------------------------
# Stages


def unit_id(*parts: str) -> str:
    return hashlib.sha1("\0".join(parts).encode("utf-8")).hexdigest()[:16]


def run_stage(name: str, units: list[dict], client: ChatClient, run: RunFile, progress: bool) -> list[dict]:
    """Ask every pending unit (`{"id", "request", "parse", **meta}`), append one record each, and return all
    records in unit order. `parse(text)` returns the record's fields, or raises Malformed (asked once more,
    with a reminder, then recorded as `malformed`) or Refused (recorded as `refused`). A request that failed
    for good is recorded with `error`, which the next run retries."""
    from tqdm.auto import tqdm

    by_id = {u["id"]: u for u in units}
    pending = run.pending(units)

    def meta(unit):
        return {k: v for k, v in unit.items() if k not in ("request", "parse")}

    def ask(batch: list[dict], retry: bool, bar) -> list[dict]:
        again = []
        jobs = []
        for unit in batch:
            request = dict(unit["request"])
            if retry:  # the same question, with the reminder as a last text part
                message = request["messages"][0]
                request["messages"] = [{**message, "content": [*message["content"], {"type": "text", "text": NUDGE}]}]
            jobs.append((unit["id"], lambda r=request: openai_messages(r)))
        for key, result in client.stream(jobs):
            unit = by_id[key]
            if result.get("text") is None:
                run.append({**meta(unit), "status": "error", "error": result.get("error", "no reply")})
            else:
                try:
                    run.append({**meta(unit), "status": "ok", **unit["parse"](result["text"]),
                                "attempts": 2 if retry else 1})
                except Refused as why:
                    run.append({**meta(unit), "status": "refused", "reply": str(why)})
                except Malformed as why:
                    if not retry:
                        again.append(unit)
                        continue
                    run.append({**meta(unit), "status": "malformed", "reply": result["text"][:500],
                                "problem": str(why), "attempts": 2})
            bar.update()
        return again

    with tqdm(total=len(pending), desc=name, disable=not progress or not pending) as bar:
        if pending:
            ask(ask(pending, False, bar), True, bar)
    # Records of units no longer asked for (an image since removed) stay in the file but not in the data.
    return [r for r in run.finalize([u["id"] for u in units]) if r["id"] in by_id]


def _failed(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("error")]


def templates_units(cats: CategorySet, k: int) -> list[dict]:
    units = []
    for c in cats.categories.values():
        def parse_instruct(text, c=c):
            reply = parse_json(text)
            lists = [reply.get(key) for key in ("non_private", "private")]
            if not all(isinstance(x, list) for x in lists):
                raise Malformed("expected lists under non_private and private")
            pairs, rejected = [], 0
            for a, b in zip(*lists):
                try:
                    pairs.append([slot(" ".join(str(a).split()), c.name), slot(" ".join(str(b).split()), c.name)])
                except Malformed:
                    rejected += 1
            if not pairs:
                raise Malformed(f"no paraphrase pair names {c.name!r} exactly once")
            return {"variants": pairs[:k], "rejected_variants": rejected + max(0, len(pairs) - k)}

        units.append({"id": f"instruct:{c.id}", "kind": "instruct", "category": c.id,
                      "request": user_request(instruct_prompt(cats, c, k)), "parse": parse_instruct})
    for c in cats.categories.values():
        for conflict in (True, False):
            have = cats.conflict_scenarios(c.id) if conflict else cats.privacy_scenarios(c.id)
            if have:
                continue

            def parse_scenario(text, c=c):
                reply = parse_json(text)
                name = text_field(reply, "name")
                if "{" in name or "}" in name:
                    raise Malformed("braces in the scenario name")
                return {"name": name, "template": scenario_template(text_field(reply, "2nd_person_template"))}

            kind = "conflict" if conflict else "privacy"
            units.append({"id": f"scenario:{c.id}:{kind}", "kind": f"scenario_{kind}", "category": c.id,
                          "request": user_request(scenario_prompt(c, conflict)), "parse": parse_scenario})
    return units


# --------------------------------------------------------------------------------------------------------------
# Quality control


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def dedup(items: list[dict], threshold: float) -> tuple[list[dict], list[tuple[dict, str, str]]]:
    """(kept, [(removed, reason, the kept item's id)]) per category, first kept. A question alone repeats
    across images ("What is the badge number?"), so duplicates are judged on question + answer."""
    kept, removed = [], []
    exact: dict[tuple, str] = {}
    seen: dict[str, list[tuple[frozenset, str]]] = {}
    for item in items:
        text = normalise(item["question"] + " " + item["answer"])
        key = (item["category"], text)
        if key in exact:
            removed.append((item, "exact_duplicate", exact[key]))
            continue
        tokens = frozenset(text.split())
        # |A & B| / |A | B| <= min / max of the sizes: most pairs are ruled out without a set operation
        near = next((other for other_tokens, other in seen.get(item["category"], [])
                     if min(len(tokens), len(other_tokens)) >= threshold * max(len(tokens), len(other_tokens))
                     and len(tokens & other_tokens) / max(1, len(tokens | other_tokens)) >= threshold), None)
        if near is not None:
            removed.append((item, "near_duplicate", near))
            continue
        exact[key] = item["id"]
        seen.setdefault(item["category"], []).append((tokens, item["id"]))
        kept.append(item)
    return kept, removed


# --------------------------------------------------------------------------------------------------------------
# Outputs


def category_file(cats: CategorySet, generated: list[dict]) -> dict:
    """The category file's content plus the generated scenarios (a generated conflict scenario needs its
    category; a generated privacy scenario needs none, so it is a privacy scenario of every category)."""
    doc = {"instruction_templates": {"non_private": cats.templates[0], "private": cats.templates[1]},
           "categories": {}, "scenarios": {}}
    for c in cats.categories.values():
        entry = {"name": c.name, "definition": c.definition, "absolute": c.absolute}
        if c.example_questions:
            entry["example_questions"] = list(c.example_questions)
        if c.privacy_scenarios is not None:
            entry["scenarios"] = {"privacy": list(c.privacy_scenarios)}
        doc["categories"][c.id] = entry
    for s in cats.scenarios.values():
        entry = {"name": s.name, "2nd_person_template": s.second_person, "3rd_person_template": s.third_person,
                 "type": s.type, "description": s.description, "needs": list(s.needs)}
        doc["scenarios"][s.id] = {k: v for k, v in entry.items() if v not in (None, [])}
    for record in generated:
        conflict = record["kind"] == "scenario_conflict"
        sid = f"gen_{record['category']}_{'conflict' if conflict else 'privacy'}"
        doc["scenarios"][sid] = {"name": record["name"], "2nd_person_template": record["template"],
                                 "description": "generated by data_prep.generate",
                                 **({"needs": [record["category"]]} if conflict else {})}
        if not conflict and doc["categories"][record["category"]].get("scenarios"):  # a narrowed privacy list
            doc["categories"][record["category"]]["scenarios"]["privacy"].append(sid)
    return doc


def build_item(cats: CategorySet, record: dict, variants: dict, index: int, split: str, rng: random.Random) -> dict:
    """A SPY-Tune item (spy.md §5.1) in the released shape, distractors and scenarios from the category set."""
    label = record["category"]
    other_labels = draw_other_labels(rng, label, cats.categories)
    conflict, privacy = cats.conflict_scenarios(label), cats.privacy_scenarios(label)
    privacy_scenarios = [cats.item_scenario(rng.choice(privacy))] if privacy else []
    image_id = Path(record["image"]).with_suffix("").as_posix().replace("/", "__")
    item = {
        "benchmark_id": f"{'1' if split == 'train' else '2'}{index:07d}",
        "label": label,
        "other_labels": other_labels,
        "question_item": {"question_id": f"{image_id}_{label}", "image_id": image_id,
                          "image_path": f"images/{record['image']}", "label": label,
                          "question": record["question"], "respond_ans": record["answer"],
                          "reject_ans": record["evasive"]},
        "non_privacy_scenarios": [cats.item_scenario(rng.choice(conflict))] if conflict else [],
        "privacy_scenarios": privacy_scenarios,
        "chosen_scenarios": privacy_scenarios,
    }
    if split == "train" and variants.get(label):  # the paraphrases vary the instructions the model learns from
        item["instruct_templates"] = rng.choice([list(cats.templates), *variants[label]])
    return item


def split_images(images: list[str], fraction: float, seed: int) -> set[str]:
    """The held-out images: a seeded `fraction` of them (at least one when there are two or more)."""
    if fraction <= 0 or len(images) < 2:
        return set()
    shuffled = sorted(images)
    random.Random(f"split-{seed}").shuffle(shuffled)
    n = min(len(images) - 1, max(1, round(fraction * len(images))))
    return set(shuffled[:n])


def review_markdown(items: list[dict], n: int, seed: int, names: dict[str, str]) -> str:
    chosen = random.Random(f"review-{seed}").sample(items, min(n, len(items)))
    lines = [f"# Review sample: {len(chosen)} of {len(items)} kept items", "",
             "Read each: is the category in the image, is the question about it, does the answer answer it "
             "from the image, and does the evasive reply decline without revealing it?", ""]
    for n_item, item in enumerate(chosen, 1):
        lines += [f"## {n_item}. {names[item['category']]} (`{item['category']}`, {item['id']})", "",
                  f"![{item['image']}](images/{item['image']})", "",
                  f"- **Question:** {item['question']}", f"- **Answer:** {item['answer']}",
                  f"- **Evasive:** {item['evasive']}", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
# The command


def find_images(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))


def check_inputs(args) -> tuple[CategorySet, list[str]]:
    """Everything that can be checked before a request: one InputError for the first problem."""
    if not 0 <= args.test_fraction < 1:
        raise InputError("command line", None, "--test-fraction", f"must be in [0, 1), got {args.test_fraction}")
    if not 0 < args.near_dup <= 1:
        raise InputError("command line", None, "--near-dup", f"must be in (0, 1], got {args.near_dup}")
    cats = parse(args.categories)
    images_dir, out = Path(args.images), Path(args.out)
    if not images_dir.is_dir():
        raise InputError(images_dir, None, "--images", "image folder not found")
    images_abs, out_abs = images_dir.resolve(), out.resolve()
    if out_abs == images_abs or images_abs in out_abs.parents or out_abs in images_abs.parents:
        raise InputError(out, None, "--out", "must be neither the image folder, inside it, nor contain it")
    check_outputs([args.categories], [out / name for name in OUTPUTS], [out])  # e.g. --out next to the input file
    images = find_images(images_dir)
    if not images:
        raise InputError(images_dir, None, "--images", f"no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    for image in images:
        check_image(images_dir / image)
    return cats, images


def _client(model, base_url, key_env, args, temperature: float) -> ChatClient:
    return ChatClient(model, base_url=base_url, api_key_env=key_env, concurrency=args.concurrency,
                      max_retries=args.max_retries, timeout=args.timeout, max_tokens=args.max_tokens,
                      temperature=temperature, backoff=args.backoff)


def generate(args) -> int:
    cats, images = check_inputs(args)
    gen = _client(args.model, args.base_url, args.api_key_env, args, args.temperature)
    check_model = args.check_model or args.model
    check_url = args.check_base_url or args.base_url
    check = _client(check_model, check_url, args.check_api_key_env or args.api_key_env, args, 0.0)  # a verdict: greedy
    out, images_dir = Path(args.out), Path(args.images)
    claim_folder(out, "data_prep.generate")  # a folder of the user's files is refused; a killed run's is resumed
    stages = out / "stages"
    common = {"prompts_version": PROMPTS_VERSION, "categories_sha256": cats.digest}
    gen_header = {**common, "model": args.model, "base_url": args.base_url, "temperature": args.temperature}
    # Every run file is opened (and its settings checked) before the first request.
    runs = {"templates": RunFile(stages / "templates.jsonl", header={**gen_header, "stage": "templates",
                                                                     "variants": args.variants}, new_run=args.new_run),
            "qa": RunFile(stages / "qa.jsonl", header={**gen_header, "stage": "qa"}, new_run=args.new_run),
            "check": RunFile(stages / "check.jsonl", header={**common, "stage": "check", "model": check_model,
                                                             "base_url": check_url}, new_run=args.new_run)}
    progress = not args.quiet

    # 1. templates
    records = run_stage("templates", templates_units(cats, args.variants), gen, runs["templates"], progress)
    if stop := _stop("templates", records):
        return stop
    ok = [r for r in records if r["status"] == "ok"]
    variants = {r["category"]: r["variants"] for r in ok if r["kind"] == "instruct"}
    doc = category_file(cats, [r for r in ok if r["kind"].startswith("scenario_")])
    write_text(out / "categories.yaml", "# written by data_prep.generate: the input category file plus generated "
               "scenarios\n" + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120))
    out_cats = parse(out / "categories.yaml")

    # 2. question, answering reply, evasive reply per (image, category)
    qa_units = [{"id": unit_id(image, c.id), "image": image, "category": c.id,
                 "request": user_request(qa_prompt(c), images_dir / image), "parse": parse_qa}
                for image in images for c in cats.categories.values()]
    qa = run_stage("qa", qa_units, gen, runs["qa"], progress)
    if stop := _stop("qa", qa):
        return stop

    # 3. quality control: duplicates, then the check model
    generated = [r for r in qa if r["status"] == "ok" and r["visible"]]
    unique, duplicates = dedup(generated, args.near_dup)
    check_units = [{"id": r["id"], "category": r["category"],
                    "request": user_request(check_prompt(cats.categories[r["category"]], r)), "parse": parse_check}
                   for r in unique]
    checks = {r["id"]: r for r in run_stage("check", check_units, check, runs["check"], progress)}
    if stop := _stop("check", list(checks.values())):
        return stop
    removed = [{"id": r["id"], "image": r["image"], "category": r["category"], "stage": "qa",
                "reason": "not_visible" if r["status"] == "ok" else r["status"],
                **({"reply": r.get("reply")} if r.get("reply") else {})}
               for r in qa if not (r["status"] == "ok" and r["visible"])]
    removed += [{"id": r["id"], "image": r["image"], "category": r["category"], "stage": "dedup", "reason": why,
                 "duplicate_of": of} for r, why, of in duplicates]
    kept = []
    for r in unique:
        c = checks[r["id"]]
        reasons = (["check_malformed"] if c["status"] != "ok" else
                   [why for flag, why in (("on_category", "off_category"), ("a_answers", "answer_does_not_answer"),
                                          ("b_declines", "evasive_does_not_decline")) if not c[flag]])
        if reasons:
            removed.append({"id": r["id"], "image": r["image"], "category": r["category"], "stage": "check",
                            "reason": reasons[0], "reasons": reasons})
        else:
            kept.append(r)

    if not kept:
        write_json(out / "stats.json", make_stats(cats, images, records, qa, removed, kept, [], []))
        print(f"error: no item passed generation and quality control; see {out / 'stats.json'}", file=sys.stderr)
        return 1

    # 4. assembly
    held_out = split_images(sorted({r["image"] for r in kept}), args.test_fraction, args.seed)
    rng = random.Random(f"items-{args.seed}")
    train, test = [], []
    for r in kept:
        split = "test" if r["image"] in held_out else "train"
        part = test if split == "test" else train
        part.append(build_item(out_cats, r, variants, len(part), split, rng))
    texts = out_cats.label2text()
    for image in sorted({r["image"] for r in kept}):
        writer.copy_file(images_dir / image, out / "images" / image)  # below the claimed --out: no link followed
    if train:
        write_json(out / "train_data.json", {"data_list": train})
    if test:
        write_json(out / "eval_data.json", {"data_list": test})
        write_json(out / "questions.json", {"benchmark_list": [to_bench_item(i, texts) for i in test]})
    write_json(out / "label2text.json", {SAFE_LABEL: "safe", **texts})
    write_text(out / "review.md", review_markdown(kept, args.review, args.seed, texts))
    stats = make_stats(cats, images, records, qa, removed, kept, train, test)
    write_json(out / "stats.json", stats)
    verify(out, out_cats, bool(train), bool(test))
    print(f"{out}: {len(train)} training items, {len(test)} held-out items from {len(images)} images and "
          f"{len(cats.categories)} categories; {len(removed)} removed (stats.json), review.md to read")
    return 0


def _stop(stage: str, records: list[dict]) -> int:
    failed = _failed(records)
    if not failed:
        return 0
    print(f"error: {stage}: {len(failed)} request(s) failed for good (first: {failed[0]['error'][:300]}); "
          "run the same command again to retry them", file=sys.stderr)
    return 1


def make_stats(cats, images, templates, qa, removed, kept, train, test) -> dict:
    per = {cid: {"units": 0, "generated": 0, "kept": 0, "train": 0, "test": 0} for cid in cats.categories}
    for r in qa:
        per[r["category"]]["units"] += 1
        per[r["category"]]["generated"] += r["status"] == "ok" and r["visible"]
    for r in removed:
        per[r["category"]][r["reason"]] = per[r["category"]].get(r["reason"], 0) + 1
    for r in kept:
        per[r["category"]]["kept"] += 1
    for part, name in ((train, "train"), (test, "test")):
        for item in part:
            per[item["label"]][name] += 1
    by_reason: dict[str, dict[str, int]] = {}
    for r in removed:
        by_reason.setdefault(r["stage"], {})
        by_reason[r["stage"]][r["reason"]] = by_reason[r["stage"]].get(r["reason"], 0) + 1
    instruct = [r for r in templates if r["kind"] == "instruct"]
    return {
        "images": len(images), "categories": len(cats.categories), "train_items": len(train),
        "test_items": len(test), "train_images": len({i["question_item"]["image_path"] for i in train}),
        "test_images": len({i["question_item"]["image_path"] for i in test}),
        "stages": {
            "templates": {"instruction_variants": {r["category"]: len(r.get("variants", [])) for r in instruct},
                          "rejected_variants": sum(r.get("rejected_variants", 0) for r in instruct),
                          "failed": {r["id"]: r["status"] for r in templates if r["status"] != "ok"},
                          "scenarios_generated": [r["id"] for r in templates
                                                  if r["kind"] != "instruct" and r["status"] == "ok"]},
            "qa": {"units": len(qa), "generated": sum(r["status"] == "ok" and r["visible"] for r in qa),
                   "retried_malformed": sum(r.get("attempts") == 2 for r in qa), **by_reason.get("qa", {})},
            "dedup": by_reason.get("dedup", {}), "check": by_reason.get("check", {}),
        },
        "per_category": per,
        "removed": removed,
    }


def verify(out: Path, cats: CategorySet, train: bool, test: bool) -> None:
    """Read the outputs back through the SPY-Tune and SPY-Bench readers, with the output category file
    (a problem raises InputError)."""
    if train:
        load_items(out / "train_data.json", out, categories=cats)
    if test:
        load_items(out / "eval_data.json", out, categories=cats)
        build_samples(out / "questions.json", images_dir=out, distractors=True, categories=cats)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m data_prep.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--categories", required=True, help="the category file (YAML; data_prep/categories.py)")
    parser.add_argument("--images", required=True, help="folder of images (searched recursively)")
    parser.add_argument("--out", required=True, help="output folder (stages/, train_data.json, questions.json, ...)")
    parser.add_argument("--model", required=True, help="the generator VLM's name at the endpoint")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint (default: OpenAI's API)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    parser.add_argument("--check-model", help="the checking model (default: the generator)")
    parser.add_argument("--check-base-url", help="its endpoint (default: the generator's)")
    parser.add_argument("--check-api-key-env", help="its key's environment variable (default: --api-key-env)")
    parser.add_argument("--variants", type=int_at_least(1), default=3, help="instruction paraphrases per category")
    parser.add_argument("--near-dup", type=option("near_dup"), default=0.9, help="token-set Jaccard at which two items are "
                        "near duplicates (question + answer, same category)")
    parser.add_argument("--test-fraction", type=option("test_fraction"), default=0.2, help="fraction of images held out for the bench")
    parser.add_argument("--seed", type=option("seed"), default=0, help="split, distractors, scenarios and review sample")
    parser.add_argument("--review", type=int_at_least(0), default=20, help="items in review.md")
    parser.add_argument("--concurrency", type=int_at_least(1), default=8)
    parser.add_argument("--max-retries", type=int_at_least(0), default=6)
    parser.add_argument("--timeout", type=option("timeout"), default=120.0, help="seconds per request")
    parser.add_argument("--backoff", type=option("backoff"), default=1.0, help="first retry wait in seconds (doubles)")
    parser.add_argument("--max-tokens", type=int_at_least(1), default=1024)
    parser.add_argument("--temperature", type=option("temperature"), default=0.7, help="the generator's (varied questions); "
                        "the check model answers greedily")
    parser.add_argument("--new-run", action="store_true", help="start the stages over under other settings")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    try:
        return generate(args)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    run_command(main)
