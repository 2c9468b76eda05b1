"""`python -m eval view`, driven in a real headless browser (Debian's Chromium through Playwright; no browser
download): a viewer of the tiny model's suite run (SPY-Bench both settings, SpatialTrust) and one of a synthetic
two-run comparison. The page loads from file:// with no request leaving its folder, its rows are the run files',
every filter shows the count computed here from the run files, the changed-outcome filter finds exactly the flipped
samples, a SpatialTrust sample shows its boxes, and a screenshot is taken. One browser for the module."""

import json
import random
import shutil
from pathlib import Path

import pytest

from data_prep.spy import expected_verdict
from eval.view.browser import CHROMIUM, chromium
from store.runs import read_jsonl, write_jsonl

pytestmark = pytest.mark.skipif(not CHROMIUM.is_file(), reason="needs Debian's Chromium at /usr/bin/chromium "
                                "(apt-get install chromium chromium-driver; .ci/run installs it)")

SUITE = """name: viewer
backend: hf
backend_options: {batch_size: 24, max_new_tokens: 4, device: cpu}
judge: rule
sections:
  spy: {items: spy/questions.json, images: spy, limit: 24}
  spatialtrust: {data: spatialtrust/data.jsonl, synthetic_images: 3, modes: [one-pass]}
"""


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
    with chromium() as context:
        yield context


@pytest.fixture(scope="module")
def suite_run(tiny_model_dir, synthetic_dir, tmp_path_factory):
    """The tiny model through the suite: its own view/ is the viewer under test."""
    from eval.suite import run_suite

    root = tmp_path_factory.mktemp("viewer-data")
    (root / "spy").symlink_to(synthetic_dir)
    config = root / "suite.yaml"
    config.write_text(SUITE)
    out = tmp_path_factory.mktemp("viewer-suite") / "suite"
    run_suite(config, str(tiny_model_dir), out, root=str(root))
    return out


def open_view(browser, index: Path, fragment: str = ""):
    page = browser.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(index.resolve().as_uri() + fragment)
    page.wait_for_selector("#status[data-done='1']", timeout=15_000)
    return page, requests, errors


def shown(page) -> int:
    return int(page.get_attribute("#count", "data-n"))


def choose(page, facet: str, value: str, *more: tuple[str, str]) -> int:
    """The count shown with these filters (and no other)."""
    page.click("#clear")
    for name, chosen in [(facet, value), *more]:
        page.select_option(f"select[data-facet='{name}']", chosen)
    return shown(page)


def filtered_keys(page) -> set:
    return set(page.evaluate("VIEWER.state.rows.filter(r => VIEWER.passes(r, null)).map(r => r.key)"))


def spy_records(out: Path) -> dict:
    """key -> judged record, of the suite's SPY-Bench run files."""
    return {f"spy/{setting}/{r['id']}": {**r, "setting": setting}
            for setting in ("without_distractors", "with_distractors")
            for r in read_jsonl(out / "spy" / setting / "judged.jsonl")}


def scenario_kind(r: dict) -> str:
    return "none" if r.get("scenario") is None else "conflict" if r["scenario"]["is_privacy"] == 0 else "privacy"


def is_right(r: dict) -> bool:
    scenario = r.get("scenario")
    return r["eval_resp"] == expected_verdict(r["label"], r["is_privacy"], scenario and scenario["is_privacy"])


def test_suite_viewer_rows_filters_metrics_and_boxes(browser, suite_run, tmp_path):
    view = suite_run / "view"
    page, requests, errors = open_view(browser, view / "index.html")
    assert not errors
    assert requests and all(url.startswith(view.resolve().as_uri() + "/") for url in requests), requests
    for asset in ("index.html", "viewer.js", "viewer.css"):  # nothing that could reach a network
        assert "http:" not in (view / asset).read_text() and "https:" not in (view / asset).read_text()

    records = spy_records(suite_run)
    predictions = read_jsonl(suite_run / "spatialtrust" / "one-pass" / "predictions.jsonl")
    rows = page.evaluate("VIEWER.state.rows.map(r => [r.key, r.runs[0].answer, r.runs[0].verdict, r.runs[0].score])")
    spy = {key: (answer, verdict) for key, answer, verdict, _ in rows if key.startswith("spy/")}
    assert spy == {key: (r["response"], r["eval_resp"]) for key, r in records.items()}
    assert sorted(k for k, *_ in rows if k.startswith("st/")) == sorted(f"st/one-pass/{p['image_id']}"
                                                                           for p in predictions)
    assert shown(page) == len(records) + len(predictions) == int(page.inner_text("#total"))

    # every filter alone shows the number of samples the run files have for it
    values = list(records.values())
    label = values[0]["label"]
    verdict = max(("respond", "reject"), key=lambda v: sum(r["eval_resp"] == v for r in values))
    expected = {
        ("section", "with_distractors"): sum(r["setting"] == "with_distractors" for r in values),
        ("category", f"spy:{label}"): sum(r["label"] == label for r in values),
        ("scenario", "conflict"): sum(scenario_kind(r) == "conflict" for r in values),
        ("scenario", "privacy"): sum(scenario_kind(r) == "privacy" for r in values),
        ("variant", "private"): sum(r["is_privacy"] == 1 for r in values),
        ("verdict", verdict): sum(r["eval_resp"] == verdict for r in values),
        ("correct", "right"): sum(is_right(r) for r in values),  # SpatialTrust's 3 images (all wrong) aside
        ("problem", "ok"): len(values) + len(predictions),  # nothing failed or unjudged in this run
    }
    assert 0 < expected["correct", "right"] < len(values)
    for (facet, value), n in expected.items():
        assert choose(page, facet, value) == n, (facet, value)
        assert page.get_attribute(f"select[data-facet='{facet}'] option[value='{value}']", "data-count") == str(n)
    wrong = [r for r in values if r["setting"] == "without_distractors" and not is_right(r)]
    assert choose(page, "section", "without_distractors", ("correct", "wrong")) == len(wrong)
    page.click("#clear")
    word = values[0]["question"].split()[-1].lower()
    page.fill("#text", word)
    names = page.evaluate("VIEWER.state.meta.categories")
    assert shown(page) == sum(any(word in str(t).lower() for t in (k, r["label"], names[f"spy:{r['label']}"], r["question"],
                                                                    r["response"], r["eval_resp"]))
                              for k, r in records.items())

    # the headline metrics of a filtered set are the metrics module's numbers for those samples
    choose(page, "section", "without_distractors")
    metrics = json.loads((suite_run / "spy" / "without_distractors" / "metrics.json").read_text())
    for name, key in (("HMS", "hms"), ("ICS", "ics"), ("RtA", "rta_nonconflict"), ("AtA conflict", "ata_conflict"),
                      ("accuracy", "accuracy")):
        value = page.get_attribute(f".metric[data-run='0'][data-name='{name}']", "data-value")
        assert (None if value == "" else float(value)) == pytest.approx(metrics[key]), name
    choose(page, "category", f"spy:{label}")
    for setting in ("without_distractors", "with_distractors"):  # the category's samples, per setting
        mine = [r for r in values if r["label"] == label and r["setting"] == setting]
        value = page.get_attribute(f".metric[data-run='0'][data-group='spy/{setting}'][data-name='right']", "data-value")
        assert float(value) == pytest.approx(100 * sum(map(is_right, mine)) / len(mine))

    # one sample by its link: the instruction lines with the asked-about private one highlighted, its answer
    key, record = next((k, r) for k, r in records.items() if r["is_privacy"] == 1 and r.get("other_labels"))
    page.goto((view / "index.html").resolve().as_uri() + "#id=" + key)
    page.wait_for_selector(f".card[data-key='{key}']")
    assert shown(page) == 1
    target = page.inner_text(".instr li.private.target")
    assert record["input_question"].split("\n")[list(record["other_labels"]).index(record["label"])] == target
    assert page.inner_text(".answer[data-run='0'] pre") == record["response"]

    # a SpatialTrust sample: its gold boxes and the predicted ones drawn on the image, also at full size. The tiny
    # model draws no box, so beside it a second run that predicts the gold answers and boxes (same keys: one-pass)
    from eval.view import build_view

    inputs = json.loads((suite_run / "results.json").read_text())["inputs"]["spatialtrust"]
    data = read_jsonl((suite_run / inputs["data"]).resolve())
    write_jsonl(tmp_path / "one-pass.jsonl", [gold_prediction(r) for r in data])
    both = build_view([suite_run, tmp_path / "one-pass.jsonl"], tmp_path / "view", names=["tiny", "gold"],
                      spatialtrust_data=(suite_run / inputs["data"]).resolve(), progress=False)
    record = next(r for r in data if any(q.get("evidence") for q in r["questions"]))
    gold = sum(len(q.get("evidence") or []) for q in record["questions"])
    page.goto(both.resolve().as_uri() + f"#id=st/one-pass/{record['image_id']}")
    page.wait_for_selector(".card .frame svg")
    assert gold > 0 and page.locator(".card rect[data-kind='gold']").count() == gold
    assert page.locator(".card rect[data-kind='pred']").count() == gold  # the gold run's, none of the tiny model's
    assert page.locator(".card table.st tr").count() == 6  # header + the five questions
    page.click(".card .frame")
    assert page.locator("#lightbox rect[data-kind='gold']").count() == gold
    full = page.get_attribute("#lightbox img", "src")
    assert (tmp_path / "view" / full).is_file() and not full.endswith("_t.jpg")
    page.screenshot(path=tmp_path / "viewer.png")
    assert (tmp_path / "viewer.png").stat().st_size > 10_000
    page.close()


def test_the_summary_is_per_benchmark_and_setting_and_categories_per_benchmark(browser, suite_run):
    """The opening summary (every sample shown): one block per benchmark and setting, each the numbers results.json
    has for it, never one ICS over both SPY settings or a share right over SPY-Bench and SpatialTrust; the
    category filter lists each benchmark's categories under its own name."""
    page, _, errors = open_view(browser, suite_run / "view" / "index.html")
    assert not errors
    groups = page.locator("#metrics .group").evaluate_all("gs => gs.map(g => g.dataset.group)")
    assert groups == ["spy/without_distractors", "spy/with_distractors", "st/one-pass"]
    results = json.loads((suite_run / "results.json").read_text())["sections"]
    for setting in ("without_distractors", "with_distractors"):
        metrics = results["spy"][setting]
        for name, key in (("ICS", "ics"), ("HMS", "hms"), ("RtA", "rta_nonconflict"), ("accuracy", "accuracy")):
            value = page.get_attribute(f".metric[data-group='spy/{setting}'][data-name='{name}']", "data-value")
            assert (None if value == "" else float(value)) == pytest.approx(metrics[key]), (setting, name)
    assert page.locator(".metric[data-group='st/one-pass'][data-name='ICS']").count() == 0
    n_images = results["spatialtrust"]["one-pass"]["n_images"]
    assert f"(n={n_images})" in page.inner_text("#metrics .group[data-group='st/one-pass']")
    assert page.locator(".metric[data-name='ICS']").count() == 2  # one per SPY setting, none over both
    groups = page.locator("select[data-facet='category'] optgroup").evaluate_all(
        "gs => gs.map(g => [g.label, [...g.querySelectorAll('option')].map(o => o.value)])")
    assert [label for label, _ in groups] == ["SPY-Bench", "SpatialTrust"]
    assert all(v.startswith("spy:a") for v in groups[0][1]) and all(v.startswith("st:") for v in groups[1][1])
    page.close()


def gold_prediction(record: dict) -> dict:
    """A SpatialTrust prediction that gives the gold answers and boxes."""
    prediction = {"image_id": record["image_id"]}
    for q in record["questions"]:
        boxes = [e["box"] for e in q.get("evidence") or []]
        if q["qid"] == "q1":
            prediction["q1"] = {"choices": q["answer"]}
        elif q["qid"] in ("q2", "q3"):
            grouped = {}
            for e in q.get("evidence") or []:
                grouped.setdefault(e["option"], []).append(e["box"])
            prediction[q["qid"]] = {"choices": q["answer"], "boxes": grouped}
        else:
            prediction[q["qid"]] = {"text": q["answer"], "boxes": boxes}
    return prediction


def two_runs(synthetic_dir, folder: Path):
    """Two judged runs of the same samples: B flips some of A's verdicts, fails one sample, leaves one unjudged."""
    from data_prep.spy_bench import build_samples

    samples = build_samples(synthetic_dir / "questions.json", images_dir=synthetic_dir)[:120]
    rng = random.Random(0)
    a, b = [], []
    for n, s in enumerate(samples):
        verdict = rng.choice(["respond", "reject"])
        a.append({**s, "response": f"A answers {n}", "eval_resp": verdict, "judge": "rule"})
        flipped = {"respond": "reject", "reject": "respond"}[verdict] if rng.random() < 0.3 else verdict
        b.append({**s, "response": f"B answers {n}", "eval_resp": flipped, "judge": "rule"})
    b[5] = {k: v for k, v in b[5].items() if k != "eval_resp"} | {"error": "no answer (generation failed)"}
    b[6] = {**b[6], "eval_resp": "I cannot tell"}  # the judge's raw text: unjudged
    folder.mkdir(parents=True)
    write_jsonl(folder / "a.jsonl", a)
    write_jsonl(folder / "b.jsonl", b)
    return a, b


def test_two_runs_changed_outcomes_and_counts_per_category(browser, synthetic_dir, tmp_path):
    from eval.view import build_view

    a, b = two_runs(synthetic_dir, tmp_path / "runs")
    index = build_view([tmp_path / "runs" / "a.jsonl", tmp_path / "runs" / "b.jsonl"], tmp_path / "view",
                       names=["A", "B"], images=synthetic_dir, progress=False)
    page, requests, errors = open_view(browser, index)
    assert not errors and all(url.startswith((tmp_path / "view").resolve().as_uri()) for url in requests)

    def right(r):
        return r.get("eval_resp") == expected_verdict(r["label"], r["is_privacy"], (r.get("scenario") or {}).get(
            "is_privacy")) if r.get("eval_resp") in ("respond", "reject") and not r.get("error") else None

    key = "spy/without_distractors/{}".format
    better = {key(x["id"]) for x, y in zip(a, b) if right(x) is False and right(y) is True}
    worse = {key(x["id"]) for x, y in zip(a, b) if right(x) is True and right(y) is False}
    assert better and worse
    assert choose(page, "changed", "improved") == len(better) and filtered_keys(page) == better
    assert {c.get_attribute("data-key") for c in page.locator(".card").all()} <= better
    assert choose(page, "changed", "worsened") == len(worse) and filtered_keys(page) == worse
    assert int(page.inner_text("#n-improved")) == len(better) and int(page.inner_text("#n-worsened")) == len(worse)
    page.click("#clear")
    per_category = {}
    for x, y in zip(a, b):
        if key(x["id"]) in better | worse:
            per_category.setdefault(x["label"], [0, 0])[key(x["id"]) in worse] += 1
    label, (n_better, n_worse) = max(per_category.items(), key=lambda kv: sum(kv[1]))
    cells = page.locator(f"#per-category tr[data-category='spy:{label}'] td").all_inner_texts()
    assert cells[1:] == [str(n_better), str(n_worse)]
    assert choose(page, "problem", "failed") == 1 and choose(page, "problem", "unjudged") == 1
    page.click("#clear")
    page.select_option("#base", "1")  # B as the baseline, A in focus: the same flips, the other way round
    page.select_option("#focus", "0")
    page.select_option("select[data-facet='changed']", "improved")
    assert filtered_keys(page) == worse

    flipped = sorted(worse)[0]
    n = next(i for i, x in enumerate(a) if key(x["id"]) == flipped)
    page.goto(index.resolve().as_uri() + "#id=" + flipped)
    page.wait_for_selector(f".card[data-key='{flipped}']")
    assert page.locator(".answer[data-run='0'] pre").inner_text() == a[n]["response"]
    assert page.locator(".answer[data-run='1'] pre").inner_text() == b[n]["response"]
    assert page.locator(".answer.changed").count() == 1
    page.screenshot(path=tmp_path / "two_runs.png", full_page=False)
    assert (tmp_path / "two_runs.png").stat().st_size > 10_000
    page.close()


def test_compare_writes_and_links_a_viewer_and_thumbnails_are_reused(suite_run, tmp_path):
    from eval.compare import compare

    shutil.copytree(suite_run, tmp_path / "other", ignore=shutil.ignore_patterns("view"))
    inputs = json.loads((suite_run / "results.json").read_text())["inputs"]  # outside the suite folder: given
    given = {"images": (suite_run / inputs["spy"]["images"]).resolve(),
             "spatialtrust_data": (suite_run / inputs["spatialtrust"]["data"]).resolve()}
    compare([suite_run, tmp_path / "other"], tmp_path / "board", names=["first", "second"], **given)
    assert "[the sample viewer](view/index.html)" in (tmp_path / "board" / "compare.md").read_text()
    meta = (tmp_path / "board" / "view" / "data" / "meta.js").read_text()
    assert '"name":"first"' in meta and '"name":"second"' in meta
    thumbs = sorted((tmp_path / "board" / "view" / "img").iterdir())
    times = [p.stat().st_mtime_ns for p in thumbs]
    compare([suite_run, tmp_path / "other"], tmp_path / "board", names=["first", "second"], **given)
    assert [p.stat().st_mtime_ns for p in sorted((tmp_path / "board" / "view" / "img").iterdir())] == times


def test_bad_input_is_one_line_and_writes_nothing(synthetic_dir, tmp_path, capsys):
    from eval.__main__ import main

    (tmp_path / "notes.jsonl").write_text('{"hello": 1}\n')
    assert main(["view", str(tmp_path / "notes.jsonl"), "--out", str(tmp_path / "v")]) == 2
    assert "not a judged SPY-Bench, GeoPrivacy or SpatialTrust run file" in capsys.readouterr().err
    a, _ = two_runs(synthetic_dir, tmp_path / "runs")
    write_jsonl(tmp_path / "runs" / "bad.jsonl", [a[0], {**a[1], "image_path": "../../../etc/passwd"}])
    assert main(["view", str(tmp_path / "runs" / "bad.jsonl"), "--images", str(synthetic_dir), "--out",
                 str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.jsonl:2: image_path" in err and "leaves its folder" in err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("mine")
    assert main(["view", str(tmp_path / "runs" / "a.jsonl"), "--out", str(tmp_path / "mine")]) == 2
    assert "holds files not made by this command (e.g. thesis.tex)" in capsys.readouterr().err
    assert not (tmp_path / "v").exists() and sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["thesis.tex"]


def test_geoprivacy_rows_score_q7_as_the_metrics_do(tmp_path):
    """An MCQ run file's rows: the seven parsed answers against the gold labels, right = Q7 right, whose share is
    `geo metrics`' q7_accuracy (no browser: the page draws these rows like any other)."""
    from eval.geoprivacy import data
    from eval.geoprivacy.metrics import join, mcq_metrics
    from eval.view.records import geo_rows

    gold = data.load_labels()
    rng = random.Random(0)
    run = [{"id": i, "setting": "mcq", "response": "\n".join(f"Q{q}: {rng.choice('ABC')}" for q in range(1, 8))}
           for i in list(gold)[:40]]
    write_jsonl(tmp_path / "mcq.jsonl", run)
    rows = geo_rows(tmp_path / "mcq.jsonl")
    metrics = mcq_metrics(join(data.load_predictions(tmp_path / "mcq.jsonl", "mcq"), gold))
    assert len(rows) == 40 and sum(o["score"] for _, o in rows.values()) / 40 == pytest.approx(metrics["q7_accuracy"])
    item, outcome = rows[f"geo/mcq/{run[0]['id']}"]
    assert item["detail"]["gold"] == gold[run[0]["id"]] and outcome["extra"]["answers"]["Q1"] == run[0]["response"][4]
