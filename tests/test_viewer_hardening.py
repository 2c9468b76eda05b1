"""The viewer against a crafted or careless input (issue 32, items 1-7), in Debian's Chromium like test_viewer.py:
markup payloads in every field a run file carries, for every benchmark, leave the DOM free of injected elements and
the location unchanged; box coordinates that are not numbers are refused when the site is built; a crafted
results.json copies nothing from outside its folder (any section's roots), the roots a user names win over the
recorded ones section by section, and a moved suite folder is viewed with them; the site makes no request that
leaves its folder with the network off; no machine path in the page; a malformed link, a lone surrogate, four 1 MB answers; duplicate ids
counted as `spy metrics` counts them; partial scores labelled as score changes; line numbers; a Hugging Face
snapshot as the images folder; our own site recognised by its marker; the images folder carried by the headers."""

import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest
from test_viewer import browser, gold_prediction, open_view, shown, two_runs  # noqa: F401 - the fixture is shared

from eval.view.browser import CHROMIUM
from store.runs import read_jsonl, read_run, write_jsonl

pytestmark = pytest.mark.skipif(not CHROMIUM.is_file(), reason="needs Debian's Chromium at /usr/bin/chromium")

PAYLOADS = [
    '"/></svg><meta http-equiv="refresh" content="1;url=file:///etc/passwd"><style>body{display:none}</style>',
    '<img src=x onerror="window.__pwned=1">',
    '<svg><foreignObject><img src=x onerror="window.__pwned=1"><a href="javascript:window.__pwned=1">x</a>'
    '</foreignObject></svg>',
    "' onmouseover='window.__pwned=1' data-x='",
    '</pre></div><script>window.__pwned=1</script>',
    '${window.__pwned=1}"><iframe src="file:///etc/passwd"></iframe>',
    '<a href="javascript:window.__pwned=1">link</a><object data="x"></object><embed src="x">',
]
# Elements or attributes no page of ours has: any of them in the DOM was injected.
INJECTED = ("meta[http-equiv='refresh'], style, iframe, object, embed, foreignObject, [onerror], [onload], [onmouseover], "
            "[data-x], a[href^='javascript'], img[src='x'], script:not([src])")


def payload(n: int) -> str:
    return PAYLOADS[n % len(PAYLOADS)]


def main(*args) -> int:
    from eval.__main__ import main as eval_main

    return eval_main(["view", *map(str, args)])


def assert_clean(page, index: Path):
    """No injected element, no script of another name than ours, the page where it was, nothing run."""
    page.wait_for_timeout(1500)  # a meta refresh of 1 s would have fired
    assert page.url.startswith(index.resolve().as_uri()), page.url
    assert page.locator(INJECTED).count() == 0, page.evaluate(
        f"[...document.querySelectorAll({json.dumps(INJECTED)})].map(e => e.outerHTML.slice(0, 200))")
    sources = page.evaluate("[...document.scripts].map(s => s.getAttribute('src'))")
    assert all(s == "viewer.js" or s == "data/meta.js" or s.startswith("data/rows-") for s in sources), sources
    assert page.evaluate("window.__pwned") is None
    assert page.locator("svg rect").count() == page.locator("svg rect.box").count()


# ----------------------------------------------------------------------------------------------- item 1
def spy_payload_run(synthetic_dir, folder: Path) -> Path:
    """A judged SPY-Bench run whose every text field is a payload (the scenario, the judge's raw text, ids)."""
    from data_prep.spy_bench import build_samples

    samples = build_samples(synthetic_dir / "questions.json", images_dir=synthetic_dir, distractors=True)[:16]
    records = []
    for n, s in enumerate(samples):
        r = {**s, "id": f"{s['id']}{payload(n)}", "input_question": s["input_question"] + payload(n + 1),
             "question": payload(n + 2), "ref_answer": payload(n + 3), "response": payload(n + 4),
             "eval_resp": ["respond", "reject", payload(n + 5)][n % 3], "judge": payload(n),
             "judge_output": payload(n + 6), "benchmark_id": f"{s['benchmark_id']}{payload(n)}"}
        if r.get("scenario"):
            r["scenario"] = {**r["scenario"], "id": payload(n + 1)}
        records.append(r)
    path = folder / "spy.jsonl"
    write_jsonl(path, records)
    return path


def geo_payload_runs(folder: Path) -> list[Path]:
    """GeoPrivacy runs whose answers are payloads: MCQ raw responses and parsed answers, a failed record's error,
    free-form answers and judged labels."""
    from eval.geoprivacy import data

    ids = list(data.load_labels())[:8]
    mcq = [{"id": i, "setting": "mcq", "response": "Q1: A\nQ7: B " + payload(n)} for n, i in enumerate(ids[:3])]
    mcq += [{"id": i, "setting": "mcq", **{f"Q{q}": payload(n + q) for q in range(1, 8)}} for n, i in enumerate(ids[3:6])]
    mcq += [{"id": i, "setting": "mcq", "error": payload(n)} for n, i in enumerate(ids[6:])]
    free = [{"id": i, "setting": "free-form", "Q7-gen": payload(n), "Q7-label": ["A", payload(n)][n % 2]}
            for n, i in enumerate(ids)]
    write_jsonl(folder / "geo_mcq.jsonl", mcq)
    write_jsonl(folder / "geo_free-form.jsonl", free)
    return [folder / "geo_mcq.jsonl", folder / "geo_free-form.jsonl"]


def payload_suite(spy: Path, folder: Path) -> Path:
    """A suite folder: the SPY-Bench payload run, and a general section (which the viewer does not show) whose
    setting names are payloads."""
    (folder / "spy" / "with_distractors").mkdir(parents=True)
    shutil.copyfile(spy, folder / "spy" / "with_distractors" / "judged.jsonl")
    (folder / "results.json").write_text(json.dumps({"headline": [], "inputs": {"spy": {"images": payload(0)}},
                                                     "sections": {"spy": {"with_distractors": {}},
                                                                  "general": {payload(n): {} for n in range(7)}}}))
    return folder


def st_payload_run(folder: Path) -> tuple[Path, Path]:
    """SpatialTrust data whose texts are payloads and predictions whose choices, texts, errors and box keys are."""
    from eval.spatialtrust import data

    path = data.build_synthetic(folder / "st", n_images=2)
    records = read_jsonl(path)
    for n, r in enumerate(records):
        for q in r["questions"]:
            q["text"] = q["text"] + payload(n)
            if "options" in q:
                q["options"] = {k: v + payload(n + 1) for k, v in q["options"].items()}
    write_jsonl(path, records)
    predictions = []
    for n, r in enumerate(records):
        p = gold_prediction(r)
        p["q1"]["choices"] = p["q1"]["choices"] + [payload(n)]
        p["q2"]["boxes"] = {payload(n + 2): [[1, 1, 5, 5]], **p["q2"]["boxes"]}
        p["q4"] = {**p["q4"], "text": payload(n + 3)}
        p["q5"] = {"text": "", "boxes": [None], "error": payload(n + 4)}
        predictions.append(p)
    write_jsonl(folder / "one-pass.jsonl", predictions)
    return path, folder / "one-pass.jsonl"


def test_payloads_in_every_field_of_every_benchmark_stay_text(browser, synthetic_dir, tmp_path):  # noqa: F811
    from eval.view import build_view

    spy = spy_payload_run(synthetic_dir, tmp_path)
    geo = geo_payload_runs(tmp_path)
    st_data, st = st_payload_run(tmp_path)
    suite = payload_suite(spy, tmp_path / "suite")
    runs = [spy, *geo, st, suite]
    names = [payload(n) + str(n) for n in range(len(runs))]
    index = build_view(runs, tmp_path / "view", names=names, images=synthetic_dir,
                       spatialtrust_data=st_data, title=payload(0), progress=False)
    page, requests, errors = open_view(browser, index)
    assert not errors, errors
    assert_clean(page, index)
    text = page.inner_text("body")
    assert payload(1) in text and page.title() == payload(0)  # shown, as text
    assert page.evaluate("VIEWER.state.rows.filter(r => r.bench === 'geo' && r.runs[2]).length") == 8
    assert shown(page) == page.evaluate("VIEWER.state.rows.length") == 16 + 8 + 8 + 2  # the suite's are the first's
    # every card of every page, each lightbox, each single-sample link
    page.select_option("select[data-facet='section']", "one-pass")
    assert page.locator(".card rect[data-kind='pred']").count() > 0
    page.click(".card .frame")
    assert_clean(page, index)
    page.click("#lightbox")
    for key in page.evaluate("VIEWER.state.rows.map(r => r.key)")[::5]:
        page.goto(index.resolve().as_uri() + "#id=" + page.evaluate("k => encodeURIComponent(k)", key))
        page.wait_for_selector(".card")
        assert shown(page) == 1
        assert_clean(page, index)
    for facet in ("verdict", "category"):  # options whose texts are payloads
        page.click("#clear")
        for value in page.locator(f"select[data-facet='{facet}'] option").evaluate_all("os => os.map(o => o.value)"):
            page.select_option(f"select[data-facet='{facet}']", value)
    assert_clean(page, index)
    page.close()


@pytest.mark.parametrize("box", ['"/></svg><meta http-equiv="refresh" content="1;url=file:///etc/passwd">',
                                 [1, 2, "3", 4], [1, 2, 3], [True, 1, 2, 3], [1, 2, 3, float("nan")],
                                 {"x": 1}, [1, 2, 10**400, 4]])  # issue 39 item 7: past a float (OverflowError)
@pytest.mark.parametrize("where", ["q4", "q2"])
def test_box_coordinates_that_are_not_numbers_are_refused(tmp_path, capsys, box, where):
    st_data, st = st_payload_run(tmp_path)
    predictions = read_jsonl(st)
    if where == "q4":
        predictions[1]["q4"]["boxes"] = [box]
        field = "q4.boxes[0]"
    else:
        predictions[1]["q2"]["boxes"] = {"A": [[1, 1, 4, 4], box]}
        field = "q2.boxes.A[1]"
    write_jsonl(st, predictions)
    assert main(st, "--spatialtrust-data", st_data, "--out", tmp_path / "view") == 2
    err = capsys.readouterr().err
    said = f"{field}: expected [x1, y1, x2, y2]" if box.__class__ is not list or box[-1] == box[-1] else \
        f"{field}[3]: must be a finite number, got nan"  # NaN: refused by the one reader (issue 46), as it is read
    assert err.count("\n") == 1 and f"one-pass.jsonl:2: {said}" in err, err
    assert not (tmp_path / "view").exists()


# ----------------------------------------------------------------------------------------------- item 2
def crafted_suite(synthetic_dir, folder: Path, secret: Path, roots: dict) -> Path:
    """A suite folder whose results.json records `roots` and whose run names the secret image."""
    from data_prep.spy_bench import build_samples

    samples = build_samples(synthetic_dir / "questions.json", images_dir=synthetic_dir)[:6]
    relative_secret = os.path.relpath(secret, "/")
    records = [{**s, "image_path": relative_secret if n % 2 else s["image_path"], "response": "r",
                "eval_resp": "reject", "judge": "rule"} for n, s in enumerate(samples)]
    write_jsonl(folder / "spy" / "without_distractors" / "judged.jsonl", records)
    (folder / "results.json").write_text(json.dumps({"headline": [], "sections": {
        "spy": {"without_distractors": {}}, "spatialtrust": {"one-pass": {}}}, "inputs": roots}))
    return folder


@pytest.mark.parametrize("roots", [
    {"spy": {"images": "/"}},
    {"spy": {"images": "../../.."}},
    {"spy": {"images": "SECRET"}, "spatialtrust": {"data": "SECRET/data.jsonl", "image_root": "/"}},
    {"spy": {"images": "sub/../../x"}, "spatialtrust": {"data": "../st/data.jsonl"}},
])
def test_a_crafted_results_json_copies_nothing_from_outside(synthetic_dir, tmp_path, caplog, roots):
    from PIL import Image

    from eval.view import build_view

    secret = tmp_path / "secret" / "passport.png"
    secret.parent.mkdir()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(secret)
    from eval.spatialtrust import data

    data.build_synthetic(tmp_path / "secret", n_images=1)  # a SpatialTrust set beside it, also outside
    roots = json.loads(json.dumps(roots).replace("SECRET", str(secret.parent)))
    suite = crafted_suite(synthetic_dir, tmp_path / "suite", secret, roots)
    with caplog.at_level(logging.WARNING):
        build_view([suite], tmp_path / "view", progress=False)
    assert not (tmp_path / "view" / "img").exists()  # no image at all: the recorded roots lead outside
    said = caplog.text
    assert "inputs.spy.images" in said and "not used; pass --images" in said and "shown without their image" in said
    everything = b"".join(p.read_bytes() for p in (tmp_path / "view").rglob("*") if p.is_file())
    assert secret.read_bytes() not in everything and str(tmp_path).encode() not in everything
    # the user's --images wins over the recorded root: the moved or crafted folder is viewed with its own images
    build_view([suite], tmp_path / "view", images=synthetic_dir, progress=False)
    copied = {p.read_bytes() for p in (tmp_path / "view" / "img").iterdir()}
    assert copied and secret.read_bytes() not in copied  # the odd rows name the secret relative to synthetic_dir:
    # not found there (it is not inside), so shown without an image


# A suite run through every section the viewer shows, its inputs beside its folder (not inside it), as users lay
# them out: the model is a local endpoint, the judge the rule one.
USER_SUITE = """name: roots
backend: openai
backend_options: {{base_url: "{url}", max_new_tokens: 8}}
judge: rule
sections:
  spy: {{items: spy/questions.json, images: spy, limit: 2, settings: [without_distractors]}}
  geo: {{images: geo, limit: 2, settings: [mcq]}}
  spatialtrust: {{data: st/data.jsonl, modes: [one-pass]}}
"""


def recoloured_copy(source: Path, target: Path) -> Path:
    """`source` copied to `target` with every image's colours inverted: the same layout, other bytes."""
    from PIL import Image, ImageOps

    shutil.copytree(source, target)
    for path in target.rglob("*.png"):
        with Image.open(path) as image:
            ImageOps.invert(image.convert("RGB")).save(path)
    return target


def image_bytes(folder: Path) -> set[bytes]:
    return {p.read_bytes() for p in folder.rglob("*.png")}


def copied_images(view: Path) -> set[bytes]:
    """The full-size copies in a site (the thumbnails are made anew; a small PNG is copied as it is)."""
    return {p.read_bytes() for p in (view / "img").glob("*.png")} if (view / "img").is_dir() else set()


@pytest.fixture(scope="module")
def user_suite(synthetic_dir, tmp_path_factory):
    """(suite folder, data folder): a real `eval suite` run (SPY-Bench, GeoPrivacy mcq, SpatialTrust) whose
    results.json records its inputs relative to it; both then moved elsewhere, as a user copies results around."""
    from chat_server import ChatServer
    from PIL import Image

    from eval.geoprivacy import data as geo_data
    from eval.spatialtrust import data as st_data
    from eval.suite import run_suite

    root = tmp_path_factory.mktemp("roots")
    first = root / "before"
    shutil.copytree(synthetic_dir, first / "data" / "spy")
    (first / "data" / "geo").mkdir()
    for n, label in enumerate(list(geo_data.load_labels())[:2]):
        Image.new("RGB", (24, 16), (30 + 90 * n, 160, 60)).save(first / "data" / "geo" / f"{label}.png")
    st_data.build_synthetic(first / "data" / "st", n_images=2)
    answer = json.dumps({"q1": {"choices": ["B"]}, "q4": {"text": "none", "boxes": []}})
    with ChatServer(lambda request: answer) as server:
        (first / "data" / "suite.yaml").write_text(USER_SUITE.format(url=server.base_url))
        run_suite(first / "data" / "suite.yaml", "m", first / "suite", root=str(first / "data"), view=False)
    inputs = json.loads((first / "suite" / "results.json").read_text())["inputs"]
    assert inputs["spy"]["images"] == "../data/spy" and inputs["spatialtrust"]["data"] == "../data/st/data.jsonl"
    moved = root / "after"
    moved.mkdir()
    shutil.move(first / "suite", moved / "suite")
    shutil.move(first / "data", moved / "inputs")
    return moved / "suite", moved / "inputs"


def user_roots(data: Path) -> dict:
    return {"images": data / "spy", "geo_images": data / "geo", "spatialtrust_data": data / "st" / "data.jsonl"}


def test_a_moved_suite_folder_is_viewed_with_the_roots_the_user_names(user_suite, tmp_path, caplog):
    from eval.view import build_view

    suite, data = user_suite
    with caplog.at_level(logging.WARNING):
        build_view([suite], tmp_path / "bare", progress=False)
    for field, flag in (("spy.images", "--images"), ("geo.images", "--geo-images"),
                        ("spatialtrust.data", "--spatialtrust-data")):
        assert f"inputs.{field}" in caplog.text and f"not used; pass {flag}" in caplog.text, field
    assert not copied_images(tmp_path / "bare")
    index = build_view([suite], tmp_path / "view", progress=False, **user_roots(data))
    copied = copied_images(tmp_path / "view")  # every section's images, from where the user named them
    assert copied <= image_bytes(data) and image_bytes(data / "geo") | image_bytes(data / "st" / "images") <= copied
    assert copied & image_bytes(data / "spy")
    meta = (tmp_path / "view" / "data" / "meta.js").read_text() + (index.parent / "data" / "rows-0000.js").read_text()
    assert all(f'"{bench}"' in meta for bench in ("spy", "geo", "st"))


@pytest.mark.parametrize("flag", ["images", "geo_images", "spatialtrust_data"])
def test_roots_the_user_names_win_over_recorded_ones_inside_the_folder(user_suite, tmp_path, flag):
    """results.json records roots inside the suite folder (usable: without options the site shows them); each root
    the user names replaces its section's recorded one, and only that one."""
    from eval.view import build_view

    moved, data = user_suite
    suite = tmp_path / "suite"
    shutil.copytree(moved, suite)
    recorded = recoloured_copy(data, suite / "recorded")
    results = json.loads((suite / "results.json").read_text())
    results["inputs"] = {"spy": {"images": "recorded/spy"}, "geo": {"images": "recorded/geo"},
                         "spatialtrust": {"data": "recorded/st/data.jsonl", "image_root": "recorded/st"}}
    (suite / "results.json").write_text(json.dumps(results))
    build_view([suite], tmp_path / "recorded-view", progress=False)
    copied = copied_images(tmp_path / "recorded-view")
    assert copied <= image_bytes(recorded) and all(copied & image_bytes(recorded / s) for s in ("spy", "geo", "st"))
    build_view([suite], tmp_path / "view", progress=False, **{flag: user_roots(data)[flag]})
    copied = copied_images(tmp_path / "view")
    named = {"images": "spy", "geo_images": "geo", "spatialtrust_data": "st"}[flag]
    for section in ("spy", "geo", "st"):
        used, unused = (data, recorded) if section == named else (recorded, data)
        assert copied & image_bytes(used / section) and not copied & image_bytes(unused / section), section


@pytest.mark.parametrize("roots, warned", [
    ({"geo": {"images": "SECRET/geo"}}, ["geo.images"]),
    ({"geo": {"images": "../secret/geo", "labels": "../secret/labels.csv", "metadata": "/etc/../SECRET/meta.csv"}},
     ["geo.images", "geo.labels", "geo.metadata"]),
    ({"geo": {"images": "/"}, "spatialtrust": {"data": "SECRET/st/data.jsonl"}}, ["geo.images", "spatialtrust.data"]),
    ({"spatialtrust": {"data": "../secret/st/data.jsonl", "image_root": "../secret/st"}}, ["spatialtrust.data"]),
    ({"spatialtrust": {"data": "inside/data.jsonl", "image_root": "SECRET/st"}}, ["spatialtrust.image_root"]),
], ids=["geo-absolute", "geo-dotdot", "geo-root-st-absolute", "st-dotdot", "st-image-root"])
def test_crafted_geo_and_spatialtrust_roots_copy_nothing_from_outside(user_suite, tmp_path, caplog, roots,
                                                                       warned):
    """The GeoPrivacy and SpatialTrust roots of a crafted results.json get the rule --images's has: a root outside
    the suite folder is not used (and said), so no image of the machine reaches the site."""
    from eval.view import build_view

    moved, data = user_suite
    secret = recoloured_copy(data, tmp_path / "secret")  # the same ids and names, outside the suite folder
    suite = tmp_path / "suite"
    shutil.copytree(moved, suite)
    (suite / "inside").mkdir()
    shutil.copyfile(data / "st" / "data.jsonl", suite / "inside" / "data.jsonl")  # its images are not beside it
    results = json.loads((suite / "results.json").read_text())
    results["inputs"] = json.loads(json.dumps(roots).replace("SECRET", str(tmp_path / "secret")))
    (suite / "results.json").write_text(json.dumps(results))
    with caplog.at_level(logging.WARNING):
        build_view([suite], tmp_path / "view", progress=False)
    assert not copied_images(tmp_path / "view") & image_bytes(secret)
    for field in warned:
        assert f"inputs.{field}:" in caplog.text and "not used" in caplog.text, field
    everything = b"".join(p.read_bytes() for p in (tmp_path / "view").rglob("*") if p.is_file())
    assert str(tmp_path).encode() not in everything


@pytest.mark.parametrize("sections", [{"spy": 3}, {"spy": ["x"]}, {"spatialtrust": "one-pass"}])
def test_a_crafted_results_json_of_the_wrong_shape_is_one_line(tmp_path, capsys, sections):
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "results.json").write_text(json.dumps({"sections": sections, "inputs": {"spy": "/"}}))
    assert main(tmp_path / "suite", "--out", tmp_path / "view") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results.json: sections." in err and not (tmp_path / "view").exists(), err


# ----------------------------------------------------------------------------------------------- items 1, 3: requests
def test_no_request_leaves_the_folder_with_the_network_off(browser, synthetic_dir, tmp_path):  # noqa: F811
    from eval.view import build_view

    a, b = two_runs(synthetic_dir, tmp_path / "runs")
    st_data, st = st_payload_run(tmp_path)
    index = build_view([tmp_path / "runs" / "a.jsonl", tmp_path / "runs" / "b.jsonl", st], tmp_path / "view",
                       names=["A", "B", "one-pass"], images=synthetic_dir, spatialtrust_data=st_data, progress=False)
    for path in (tmp_path / "view" / "data").iterdir():  # item 3: no path of this machine in the page's data
        assert str(tmp_path) not in path.read_text() and "/tmp/" not in path.read_text(), path
    assert '"source"' not in (tmp_path / "view" / "data" / "meta.js").read_text()
    requests, failed = [], []

    def asked(request):
        requests.append(request.url)

    def refused(request):
        failed.append(request.url)

    browser.set_offline(True)
    browser.on("request", asked)
    browser.on("requestfailed", refused)
    try:
        page, _, errors = open_view(browser, index)
        page.click(".card .frame")  # the full-size image
        page.click("#lightbox")
        page.click(".pager button[data-go='1']")
        page.select_option("select[data-facet='section']", "one-pass")
        page.click(".card .frame")
        page.wait_for_timeout(300)
        page.close()
    finally:
        browser.set_offline(False)
        browser.remove_listener("request", asked)
        browser.remove_listener("requestfailed", refused)
    folder = (tmp_path / "view").resolve().as_uri() + "/"
    assert requests and not errors and not failed, (failed, errors)
    assert all(url.startswith(folder) for url in requests), [u for u in requests if not u.startswith(folder)]
    assert any("img/" in url and not url.endswith("_t.jpg") for url in requests)  # the full-size copy was asked for


# ----------------------------------------------------------------------------------------------- item 4
def test_a_malformed_link_shows_every_sample(browser, synthetic_dir, tmp_path):  # noqa: F811
    from eval.view import build_view

    two_runs(synthetic_dir, tmp_path / "runs")
    index = build_view([tmp_path / "runs" / "a.jsonl"], tmp_path / "view", images=synthetic_dir, progress=False)
    page, _, errors = open_view(browser, index, "#id=%E0%A4%A")
    assert not errors and shown(page) == int(page.inner_text("#total")) == 120
    assert page.is_visible("#badlink")
    page.goto(index.resolve().as_uri() + "#id=%")  # and once loaded
    page.wait_for_timeout(200)
    assert shown(page) == 120 and page.is_visible("#badlink")
    page.close()


def test_a_lone_surrogate_and_a_killed_build(browser, synthetic_dir, tmp_path, capsys):  # noqa: F811
    a, _ = two_runs(synthetic_dir, tmp_path / "runs")
    run = tmp_path / "runs" / "a.jsonl"
    original = run.read_text()
    lines = original.splitlines()
    lines[0] = lines[0].replace('"A answers 0"', '"A answers \\ud800 and \\udfff"')
    run.write_text("\n".join(lines) + "\n")
    # a lone surrogate (no UTF-8 form) is refused by the one reader as the file is read (issue 46), one line
    assert main(run, "--images", synthetic_dir, "--out", tmp_path / "view") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a.jsonl:1: response: holds a lone surrogate" in err, err
    assert not (tmp_path / "view").exists()
    run.write_text(original)
    # an image that does not decode is refused before the folder is touched (issue 39 item 9); a build killed
    # half-way (its marker written first) is rebuilt by the same command
    bad = tmp_path / "images"
    shutil.copytree(synthetic_dir, bad)
    victim = bad / a[3]["image_path"]
    victim.write_bytes(b"not a png")
    assert main(run, "--images", bad, "--out", tmp_path / "half") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]  # beside tqdm's bar
    assert len(err) == 1 and "not a readable image" in err[0], err
    assert not (tmp_path / "half").exists()
    shutil.copyfile(synthetic_dir / a[3]["image_path"], victim)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / ".privacy-align-output").write_text('{"command": "eval view"}')
    assert main(run, "--images", bad, "--out", tmp_path / "half") == 0
    assert (tmp_path / "half" / "index.html").is_file()


def test_four_long_answers_of_rtl_text_and_emoji_load_and_show_all_on_demand(browser, synthetic_dir, tmp_path):  # noqa: F811
    from eval.view import build_view

    a, _ = two_runs(synthetic_dir, tmp_path / "runs")
    long = ("مرحبا بالعالم שלום עולם 😀👍🏽🇫🇷 " * 40_000)[:1_000_000]
    for r in a[:4]:
        r["response"] = long
    write_jsonl(tmp_path / "runs" / "long.jsonl", a)
    index = build_view([tmp_path / "runs" / "long.jsonl"], tmp_path / "view", images=synthetic_dir, progress=False)
    start = time.monotonic()
    page, _, errors = open_view(browser, index)
    assert not errors and time.monotonic() - start < 20
    texts = page.locator(".answer pre").all_inner_texts()
    assert len(texts) == 50 and max(map(len, texts)) <= 2001
    buttons = page.locator(".answer .more")
    assert buttons.count() == 4 and "characters)" in buttons.first.inner_text()
    start = time.monotonic()
    buttons.first.click()
    assert page.locator(".answer pre").first.evaluate("n => n.textContent") == long
    assert time.monotonic() - start < 5  # one 1 MB paragraph took Chromium longer than the click's 10 s timeout
    page.fill("#text", "שלום")  # the search still sees the whole text
    assert shown(page) == 4
    page.close()


# ----------------------------------------------------------------------------------------------- item 5
def test_duplicate_ids_are_counted_as_spy_metrics_counts_them(browser, synthetic_dir, tmp_path, caplog):  # noqa: F811
    from eval.spy.cli import metrics
    from eval.view import build_view

    a, _ = two_runs(synthetic_dir, tmp_path / "runs")
    a = [r for r in a if "error" not in r]
    doubled = a + [{**r, "eval_resp": {"respond": "reject", "reject": "respond"}.get(r["eval_resp"], "respond")}
                   for r in a[:40]]  # 40 ids given twice, the second time with the other verdict
    write_jsonl(tmp_path / "runs" / "dup.jsonl", doubled)
    expected = metrics(tmp_path / "runs" / "dup.jsonl")
    with caplog.at_level(logging.WARNING):
        index = build_view([tmp_path / "runs" / "dup.jsonl"], tmp_path / "view", images=synthetic_dir,
                           progress=False)
    assert "40 ids appear more than once" in caplog.text and "counted, as `spy metrics` counts" in caplog.text
    page, _, errors = open_view(browser, index)
    assert shown(page) == len(doubled)
    got = {m.get_attribute("data-name"): m.get_attribute("data-value") for m in page.locator(".metric").all()}
    for name, key in (("HMS", "hms"), ("ICS", "ics"), ("RtA", "rta_nonconflict"), ("AtA conflict", "ata_conflict"),
                      ("accuracy", "accuracy")):
        assert (None if got[name] == "" else float(got[name])) == pytest.approx(expected[key]), name
    assert page.evaluate("VIEWER.runMetrics(VIEWER.state.rows, 0).n") == expected["total"] - expected["exceptions"]
    page.close()


def test_partial_score_changes_are_labelled_as_score_changes(browser, tmp_path):  # noqa: F811
    from eval.spatialtrust import data
    from eval.view import build_view

    st_data = data.build_synthetic(tmp_path / "st", n_images=4)
    records = read_jsonl(st_data)
    gold = [gold_prediction(r) for r in records]
    half = [{**p, "q2": {"choices": [], "boxes": {}}} for p in gold]  # fewer right: a lower partial score
    write_jsonl(tmp_path / "a" / "one-pass.jsonl", gold)
    write_jsonl(tmp_path / "b" / "one-pass.jsonl", half)
    index = build_view([tmp_path / "a" / "one-pass.jsonl", tmp_path / "b" / "one-pass.jsonl"], tmp_path / "view",
                       names=["gold", "less"], spatialtrust_data=st_data, progress=False)
    page, _, errors = open_view(browser, index)
    scores = page.evaluate("VIEWER.state.rows.map(r => [r.runs[0].score, r.runs[1].score])")
    down = sum(b < a for a, b in scores)
    assert down and all(0 < b < 1 or 0 < a < 1 for a, b in scores if b != a)
    options = page.locator("select[data-facet='changed'] option").evaluate_all(
        "os => Object.fromEntries(os.map(o => [o.value, o.textContent]))")
    assert "score down" in options and "improved" not in options and "worsened" not in options
    assert options["score down"].startswith("score down (partly right)")
    assert int(page.inner_text("#n-score-down")) == down and int(page.inner_text("#n-worsened")) == 0
    assert "right → wrong" in page.inner_text("#changes")  # the binary count is there, at 0
    page.close()


def test_error_lines_count_the_header_line(synthetic_dir, tmp_path, capsys):
    a, _ = two_runs(synthetic_dir, tmp_path / "runs")
    lines = [json.dumps({"run_header": {"step": "spy judge", "judge": "rule"}}), json.dumps(a[0]),
             json.dumps({**a[1], "is_privacy": "yes"})]
    (tmp_path / "runs" / "h.jsonl").write_text("\n".join(lines) + "\n")
    assert main(tmp_path / "runs" / "h.jsonl", "--out", tmp_path / "view") == 2
    err = capsys.readouterr().err
    assert "h.jsonl:3: is_privacy: expected 0 or 1" in err, err


def test_geoprivacy_error_lines_count_the_header_line(tmp_path, capsys):
    from eval.geoprivacy import data

    known = list(data.load_labels())[0]
    lines = [json.dumps({"run_header": {"step": "geo generate"}}), json.dumps({"id": known, "setting": "mcq", "response": "Q7: A"}),
             json.dumps({"id": "no-such-id", "setting": "mcq", "response": "Q7: A"})]
    (tmp_path / "mcq.jsonl").write_text("\n".join(lines) + "\n")
    assert main(tmp_path / "mcq.jsonl", "--out", tmp_path / "view") == 2
    assert "mcq.jsonl:3: id: 'no-such-id' is not in the gold labels" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- item 6
def test_a_hugging_face_snapshot_is_an_images_folder(synthetic_dir, tmp_path):
    """Files of snapshots/<rev>/ are symlinks into the repo's blobs/, as huggingface_hub lays them out."""
    from data_prep.spy_bench import build_samples
    from eval.view import build_view

    repo = tmp_path / "hub" / "datasets--someone--spy-bench"
    snapshot = repo / "snapshots" / "0123abc"
    for n, path in enumerate(sorted(p for p in synthetic_dir.rglob("*") if p.is_file())):
        blob = repo / "blobs" / f"blob{n}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, blob)
        link = snapshot / path.relative_to(synthetic_dir)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    assert build_samples(snapshot / "questions.json", images_dir=snapshot)  # as spy generate reads it
    a, _ = two_runs(snapshot, tmp_path / "runs")
    build_view([tmp_path / "runs" / "a.jsonl"], tmp_path / "view", images=snapshot, progress=False)
    assert len(list((tmp_path / "view" / "img").glob("*_t.jpg"))) == len({r["image_path"] for r in a}) > 1


def test_an_out_with_a_meta_js_is_not_ours_without_the_marker(synthetic_dir, tmp_path, capsys):
    two_runs(synthetic_dir, tmp_path / "runs")
    site = tmp_path / "site"
    (site / "data").mkdir(parents=True)
    (site / "data" / "meta.js").write_text("// someone's")
    (site / "index.html").write_text("mine")
    assert main(tmp_path / "runs" / "a.jsonl", "--images", synthetic_dir, "--out", site) == 2
    assert "holds files not made by this command" in capsys.readouterr().err
    assert (site / "index.html").read_text() == "mine"
    assert main(tmp_path / "runs" / "a.jsonl", "--images", synthetic_dir, "--out", tmp_path / "ours") == 0
    assert main(tmp_path / "runs" / "a.jsonl", "--images", synthetic_dir, "--out", tmp_path / "ours") == 0  # rebuilt
    # a viewer built before the marker existed: our files only, our own script: still ours
    (tmp_path / "ours" / ".privacy-align-output").unlink()
    assert main(tmp_path / "runs" / "a.jsonl", "--images", synthetic_dir, "--out", tmp_path / "ours") == 0
    (tmp_path / "ours" / ".privacy-align-output").unlink()
    (tmp_path / "ours" / "notes.txt").write_text("mine")
    assert main(tmp_path / "runs" / "a.jsonl", "--images", synthetic_dir, "--out", tmp_path / "ours") == 2


# ----------------------------------------------------------------------------------------------- item 7
def test_the_images_folder_goes_through_generate_and_judge(tiny_model_dir, synthetic_dir, tmp_path, caplog):
    from eval.spy.cli import generate, judge
    from eval.view import build_view

    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(synthetic_dir, work / "spy")  # inside the run's folder (a link leading out would not be used)
    generate(work / "spy" / "questions.json", work / "spy", work / "gen.jsonl", model=str(tiny_model_dir),
             limit=4, progress=False, batch_size=4, max_new_tokens=2, device="cpu")
    judge(work / "gen.jsonl", work / "judged.jsonl", rule=True, progress=False)
    assert read_run(work / "gen.jsonl")[0]["images"] == read_run(work / "judged.jsonl")[0]["images"] == "spy"
    build_view([work / "judged.jsonl"], tmp_path / "view", progress=False)  # no --images: the header's
    assert len(list((tmp_path / "view" / "img").glob("*_t.jpg"))) > 0
    # judged into another folder: the header says where (relative to it), outside it: not used, and said
    judge(work / "gen.jsonl", tmp_path / "elsewhere" / "judged.jsonl", rule=True, progress=False)
    assert read_run(tmp_path / "elsewhere" / "judged.jsonl")[0]["images"] == "../work/spy"
    with caplog.at_level(logging.WARNING):
        build_view([tmp_path / "elsewhere" / "judged.jsonl"], tmp_path / "view2", progress=False)
    assert "run_header.images" in caplog.text and "not used; pass --images" in caplog.text
    assert "4 of 4 samples are shown without their image: no images folder is known (pass --images DIR)" in caplog.text


# ----------------------------------------------------------------------------------------------- issue 39
def spy_suite(synthetic_dir, folder: Path, images: str = "inputs/spy") -> tuple[Path, list[dict]]:
    """A suite folder of one SPY-Bench setting whose results.json records its images inside it (`images`)."""
    from data_prep.spy_bench import build_samples

    samples = build_samples(synthetic_dir / "questions.json", images_dir=synthetic_dir)[:4]
    records = [{**s, "response": "r", "eval_resp": "reject", "judge": "rule"} for s in samples]
    write_jsonl(folder / "spy" / "with_distractors" / "judged.jsonl", records)
    (folder / "results.json").write_text(json.dumps({"headline": [], "sections": {"spy": {"with_distractors": {}}},
                                                     "inputs": {"spy": {"images": images}}}))
    return folder, records


def outside_png(folder: Path) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (20, 20), (7, 200, 7)).save(folder / "passport.png")
    return folder / "passport.png"


@pytest.mark.parametrize("link", ["images-folder", "image-file", "dotdot-through-a-link", "run-file"])
def test_symbolic_links_are_resolved_before_bounding(synthetic_dir, tmp_path, capsys, link):
    """Issue 39 item 6: what the viewer reads or copies must really lie in the folder it belongs to, links followed:
    a recorded images folder that is a link elsewhere is not used (said); an image that is a link to an outside
    file, an image_path `link/../passport.png` through a link, and a run file that is a link to another run are
    one line, exit 2, nothing written. (A Hugging Face snapshot's links into its blobs stay allowed:
    test_a_hugging_face_snapshot_is_an_images_folder.)"""
    secret = outside_png(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "deep").mkdir()
    suite, records = spy_suite(synthetic_dir, tmp_path / "suite")
    spy = suite / "inputs" / "spy"
    if link == "images-folder":
        spy.parent.mkdir()
        spy.symlink_to(synthetic_dir)
    else:
        shutil.copytree(synthetic_dir, spy)
    if link == "image-file":
        (spy / records[1]["image_path"]).unlink()
        (spy / records[1]["image_path"]).symlink_to(secret)
    elif link == "dotdot-through-a-link":
        (spy / "link").symlink_to(tmp_path / "elsewhere" / "deep", target_is_directory=True)
        records[1]["image_path"] = "link/../passport.png"  # lexically inputs/spy/passport.png: inside
        write_jsonl(suite / "spy" / "with_distractors" / "judged.jsonl", records)
    elif link == "run-file":
        other = tmp_path / "other.jsonl"
        write_jsonl(other, [{**r, "response": "another run's answer"} for r in records])
        (suite / "spy" / "with_distractors" / "judged.jsonl").unlink()
        (suite / "spy" / "with_distractors" / "judged.jsonl").symlink_to(other)
    status = main(suite, "--out", tmp_path / "view")
    err = capsys.readouterr().err
    if link == "images-folder":
        assert status == 0 and "inputs.spy.images: " in err and "leads outside" in err and "not used" in err, err
        assert not (tmp_path / "view" / "img").exists()  # nothing copied from the folder the link leads to
        return
    first = next(n for n, r in enumerate(records, 1) if r["image_path"] == records[1]["image_path"])
    expected = {"image-file": f"judged.jsonl:{first}: image_path: {records[1]['image_path']!r} leads outside",
                "dotdot-through-a-link": "judged.jsonl:2: image_path: 'link/../passport.png' leads outside",
                "run-file": "results.json: sections.spy.with_distractors: 'spy/with_distractors/judged.jsonl' leads "
                            "outside"}[link]
    assert status == 2 and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "view").exists()


def test_an_image_that_is_no_image_is_refused_before_the_out_folder_is_claimed(synthetic_dir, tmp_path, capsys):
    """Issue 39 item 9: the marker and an empty img/ stayed behind."""
    a, _ = two_runs(synthetic_dir, tmp_path / "runs")
    images = tmp_path / "images"
    shutil.copytree(synthetic_dir, images)
    (images / a[2]["image_path"]).write_text("not an image")
    assert main(tmp_path / "runs" / "a.jsonl", "--images", images, "--out", tmp_path / "view") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]  # beside tqdm's bar
    assert len(err) == 1 and "not a readable image (UnidentifiedImageError)" in err[0], err
    assert not (tmp_path / "view").exists()


@pytest.mark.parametrize("flag", ["--images", "--geo-images", "--spatialtrust-data", "--geo-labels"])
def test_a_named_input_that_does_not_exist_is_one_line(synthetic_dir, tmp_path, capsys, flag):
    """Issue 39 item 9: `--images /nonexistent` exited 0 with a warning."""
    two_runs(synthetic_dir, tmp_path / "runs")
    assert main(tmp_path / "runs" / "a.jsonl", flag, tmp_path / "nonexistent", "--out", tmp_path / "view") == 2
    err = capsys.readouterr().err
    assert err == f"error: command line: {flag}: {tmp_path / 'nonexistent'}: no such " \
                  f"{'folder' if 'images' in flag else 'file'}\n"
    assert not (tmp_path / "view").exists()


def test_warnings_say_warning_once_and_geoprivacy_lines_count_the_file(synthetic_dir, tmp_path, capsys):
    """Issue 39 item 9: every warning printed as "warning: warning:"; a GeoPrivacy record without Q7 on file line 2
    was reported as line 1."""
    from eval.geoprivacy import data

    two_runs(synthetic_dir, tmp_path / "runs")
    assert main(tmp_path / "runs" / "a.jsonl", "--out", tmp_path / "view") == 0  # no images folder known: a warning
    err = capsys.readouterr().err
    assert "warning: " in err and "warning: warning:" not in err, err
    known = list(data.load_labels())[0]
    lines = [json.dumps({"run_header": {"step": "geo generate"}}), json.dumps({"id": known, "setting": "mcq"})]
    (tmp_path / "mcq.jsonl").write_text("\n".join(lines) + "\n")
    assert main(tmp_path / "mcq.jsonl", "--out", tmp_path / "geo-view") == 2
    assert "mcq.jsonl:2: Q7: missing field" in capsys.readouterr().err
