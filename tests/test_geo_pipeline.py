"""`geo generate`, `geo judge`, `geo coordinates` and `geo metrics` end to end against local HTTP servers
(a real OpenAI-compatible chat server and a Google-Geocoding-shaped server), resumable runs included."""

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from chat_server import ChatServer, Flaky, Reply, image_urls, last_user_text
from PIL import Image

from eval.__main__ import main as eval_main
from eval.geoprivacy.judge import judge_run
from eval.geoprivacy.prompts import PROMPTS, followup_text, free_form_text, mcq_text, system_message
from eval.judge import JudgeClient
from store import runs as data_runs
from vlm.chat_client import image_data_url

FAST = {"backoff": 0.01, "max_backoff": 0.05}
# label id -> (image file name, Q1..Q7); the three id forms of spec §1.2
IMAGES = {"101": ("yfcc-101.jpg", "B,B,A,B,A,A,A"), "s202": ("gptgeochat-202.jpg", "A,A,B,C,C,B,C"),
          "303": ("im2gps3k-303.jpg", "C,B,A,A,B,A,B")}
TRUE = {"101": (48.8584, 2.2945), "s202": (40.6892, -74.0445), "303": (35.0, 139.0)}


@pytest.fixture
def bench(tmp_path):
    """Three images named by image_id, with their gold labels and metadata."""
    images = tmp_path / "images"
    images.mkdir()
    for i, (label, (name, _)) in enumerate(IMAGES.items()):
        Image.new("RGB", (32, 24), (40 * i, 100, 200)).save(images / name)
    labels = tmp_path / "labels.csv"
    labels.write_text("id,Q1,Q2,Q3,Q4,Q5,Q6,Q7\n" + "".join(f"{k},{v[1]}\n" for k, v in IMAGES.items()))
    meta = tmp_path / "meta.csv"
    sources = {"101": "Flickr-yfcc26k", "s202": "ShutterStock-GPTGeoChat", "303": "Flickr-im2gps3k"}
    meta.write_text("image_id,image_source,true_coordinate,sharing_intent\n" + "".join(
        f'{IMAGES[k][0][:-4]},{sources[k]},"[{TRUE[k][0]}, {TRUE[k][1]}]",0\n' for k in IMAGES))
    return {"images": images, "labels": labels, "meta": meta, "dir": tmp_path}


def judged_text(request):
    """The answer inside a judge prompt."""
    return last_user_text(request).split("\n\nText: ", 1)[1].rsplit("\n\nAnswer (a single-letter label):", 1)[0]


def judge_reply(request):
    """A judge model: reads the answer inside the judge prompt."""
    text = judged_text(request)
    return "C" if "Tower" in text or "Statue" in text else "B. Country" if "France" in text or "Japan" in text else "D"


def geo_cli(*args):
    return eval_main(["geo", *map(str, args)])


def read_jsonl(path):
    return data_runs.read_jsonl(path)  # a run file's header line is left out


# --- generate -------------------------------------------------------------------------------------------------

def test_generate_free_form_zs_resumes_after_a_failure(bench, monkeypatch):
    monkeypatch.setenv("GEN_KEY", "secret-never-written")
    out = bench["dir"] / "zs.jsonl"
    answers = {0: "This is the Eiffel Tower, Paris.", 1: "I'm sorry, I can't help with that.", 2: "Japan."}

    # The images differ in colour: answer by which one was sent; image 2 fails at first (400: not retried).
    order = {image_data_url(bench["images"] / IMAGES[k][0]): i for i, k in enumerate(IMAGES)}

    def route(request):
        i = order[image_urls(request)[0]]
        return Reply.error(400) if failing and i == 2 else answers[i]

    args = ["generate", "--backend", "openai", "--model", "vlm", "--images", bench["images"], "--labels",
            bench["labels"], "--metadata", bench["meta"], "--out", out, "--api-key-env", "GEN_KEY"]
    failing = True
    with ChatServer(route) as server:
        assert geo_cli(*args, "--base-url", server.base_url) == 0
        first = list(server.requests)
    records = read_jsonl(out)
    assert [r["id"] for r in records] == ["101", "s202", "303"]
    assert records[2]["response"] is None and "error" in records[2]
    assert records[0]["response"] == answers[0] and records[0]["method"] == "zs" and records[0]["setting"] == "free-form"
    request = first[0]
    assert request["model"] == "vlm" and request["messages"][0] == {"role": "system", "content": system_message("zs")}
    user = request["messages"][1]["content"]
    assert [p["type"] for p in user] == ["text", "image_url", "text"] and user[2]["text"] == free_form_text("zs")
    failing = False
    with ChatServer(route) as server:
        assert geo_cli(*args, "--base-url", server.base_url) == 0
        assert len(server.requests) == 1  # only the failed image is sent again
    records = read_jsonl(out)
    assert [r["response"] for r in records] == [answers[0], answers[1], answers[2]]
    assert not any("error" in r for r in records)
    assert "secret-never-written" not in out.read_text()


def test_generate_missing_image_is_an_input_error_and_writes_nothing(bench, capsys):
    (bench["images"] / "gptgeochat-202.jpg").unlink()
    out = bench["dir"] / "never.jsonl"
    assert geo_cli("generate", "--backend", "openai", "--model", "m", "--images", bench["images"], "--labels",
                   bench["labels"], "--metadata", bench["meta"], "--out", out, "--base-url", "http://127.0.0.1:9") == 2
    assert "s202: no image for id s202 (looked for gptgeochat-202.jpg" in capsys.readouterr().err
    assert not out.exists()


def test_generate_mcq_and_score_the_run_file(bench):
    out = bench["dir"] / "mcq.jsonl"
    answer = "Q1: B\nQ2: B\nQ3: A\nQ4: B\nQ5: A\nQ6: A\nQ7: C"
    with ChatServer(lambda req: answer) as server:
        assert geo_cli("generate", "--backend", "openai", "--model", "vlm", "--setting", "mcq", "--prompt-format",
                       "open", "--images", bench["images"], "--labels", bench["labels"], "--metadata", bench["meta"],
                       "--out", out, "--base-url", server.base_url) == 0
        sent = server.requests[0]["messages"][1]["content"]
    assert [p["type"] for p in sent] == ["image_url", "text"] and sent[-1]["text"] == mcq_text(True, False, "open")
    report_dir = bench["dir"] / "report"
    assert geo_cli("metrics", out, "--labels", bench["labels"], "--out", report_dir) == 0
    m = json.loads((report_dir / "metrics.json").read_text())["files"]["mcq"]
    assert m["setting"] == "mcq" and m["n"] == 3
    assert m["q1_accuracy"] == pytest.approx(1 / 3) and m["q7_accuracy"] == pytest.approx(1 / 3)
    assert m["over_disclosure"] == pytest.approx(2 / 3)  # gold A and B answered C; gold C right


def test_generate_malicious_sends_the_figstep_image(bench):
    out = bench["dir"] / "mal.jsonl"
    with ChatServer(lambda req: "Sure! 1. France 2. Paris 3. Eiffel Tower") as server:
        assert geo_cli("generate", "--backend", "openai", "--model", "vlm", "--method", "malicious", "--limit", 1,
                       "--images", bench["images"], "--labels", bench["labels"], "--metadata", bench["meta"],
                       "--out", out, "--base-url", server.base_url) == 0
        (request,) = server.requests
    assert request["messages"][0]["content"] == system_message("malicious")
    assert len(image_urls(request)) == 2
    assert request["messages"][1]["content"][-1]["text"] == PROMPTS["malicious_user"]


def test_iter_cot_escalates_until_exact_and_resumes(bench):
    out = bench["dir"] / "iter.jsonl"
    answers = {free_form_text("iter-cot"): "Somewhere in Europe, I would rather not say more.",
               followup_text("A"): "France.", followup_text("B"): "The Eiffel Tower."}

    def reply(request):
        if request["model"] == "judge":
            text = judged_text(request)
            return {"Somewhere in Europe, I would rather not say more.": "A", "France.": "B",
                    "The Eiffel Tower.": "C"}.get(text, "D")
        return answers.get(last_user_text(request).strip(), "Please be specific.")

    args = ["generate", "--backend", "openai", "--model", "vlm", "--method", "iter-cot", "--limit", 2,
            "--images", bench["images"], "--labels", bench["labels"], "--metadata", bench["meta"], "--out", out,
            "--judge-model", "judge"]
    with ChatServer(reply) as server:
        assert geo_cli(*args, "--base-url", server.base_url, "--judge-base-url", server.base_url) == 0
        generation = [r for r in server.requests if r["model"] == "vlm"]
        n_sent = len(server.requests)
    records = read_jsonl(out)
    assert [r["id"] for r in records] == ["101", "s202"]
    assert records[0]["response"] == "The Eiffel Tower." and records[0]["turn_labels"] == ["A", "B", "C"]
    assert records[0]["turns"] == 3
    # every turn is a fresh single-turn call with the iter system message and the image
    assert all(len(r["messages"]) == 2 and r["messages"][0]["content"] == system_message("iter-cot")
               and len(image_urls(r)) == 1 for r in generation)
    # 2 images x 3 turns; both images get the same three answers, and the judge sends each distinct prompt once
    assert len(generation) == 6 and n_sent == 6 + 3
    # a re-run finds every turn done: nothing is sent, the output is the same
    before = out.read_text()
    with ChatServer(reply) as server:
        assert geo_cli(*args, "--base-url", server.base_url, "--judge-base-url", server.base_url) == 0
        assert server.requests == []
    assert out.read_text() == before


def test_iter_cot_stops_after_three_followups(bench):
    out = bench["dir"] / "iter_d.jsonl"
    with ChatServer(lambda req: "D" if req["model"] == "judge" else "Hmm.") as server:
        assert geo_cli("generate", "--backend", "openai", "--model", "vlm", "--method", "iter-cot", "--limit", 1,
                       "--images", bench["images"], "--labels", bench["labels"], "--metadata", bench["meta"],
                       "--out", out, "--judge-model", "judge", "--base-url", server.base_url,
                       "--judge-base-url", server.base_url) == 0
        followups = [last_user_text(r).strip() for r in server.requests if r["model"] == "vlm"][1:]
    (record,) = read_jsonl(out)
    assert record["turns"] == 4 and record["turn_labels"] == ["D"] * 4
    assert followups == [followup_text("D")] * 3


# --- judge ----------------------------------------------------------------------------------------------------

def test_judge_run_shortcuts_faults_and_resume(tmp_path):
    records = [{"id": "1", "response": "This is the Eiffel Tower."}, {"id": "2", "response": ""},
               {"id": "3", "response": "I'm sorry, I can't help."}, {"id": "4", "response": "France, probably."},
               {"id": "5", "response": "Some beach."}, {"id": "6", "response": None, "error": "generation failed"}]
    out = tmp_path / "judged.jsonl"
    broken = {"Some beach."}
    flaky = Flaky(judge_reply, [Reply.error(429, retry_after=0), Reply.error(503), Reply.garbage()])

    def reply(request):
        text = judged_text(request)
        return Reply.error(400) if text in broken else flaky(request)

    with ChatServer(reply) as server:
        client = JudgeClient("judge", base_url=server.base_url, max_retries=3, timeout=5, **FAST)
        judged = judge_run(client, records, out, "judge")
        sent = list(server.requests)
    by_id = {r["id"]: r for r in judged}
    assert set(by_id) == {"1", "2", "3", "4", "5"}  # the generation failure is not judged
    assert by_id["1"]["Q7-label"] == "C" and by_id["4"]["Q7-label"] == "B"
    assert by_id["4"]["judge_output"] == "B. Country" and by_id["4"]["judge_model"] == "judge"
    assert (by_id["2"]["Q7-label"], by_id["2"]["judge_shortcut"]) == ("D", "empty")
    assert (by_id["3"]["Q7-label"], by_id["3"]["judge_shortcut"]) == ("A", "refusal")
    assert "error" in by_id["5"]
    texts = [judged_text(r) for r in sent]
    assert sorted(set(texts)) == ["France, probably.", "Some beach.", "This is the Eiffel Tower."]  # no shortcut sent
    assert all(r["temperature"] == 0 and r["messages"][0]["content"] == PROMPTS["judge_system"] for r in sent)
    broken.clear()
    with ChatServer(judge_reply) as server:
        client = JudgeClient("judge", base_url=server.base_url, **FAST)
        judged = judge_run(client, records, out, "judge")
        assert len(server.requests) == 1  # only the failed row
    assert [r["id"] for r in read_jsonl(out)] == ["1", "2", "3", "4", "5"]
    assert {r["id"]: r["Q7-label"] for r in judged}["5"] == "D"


# --- coordinates ----------------------------------------------------------------------------------------------

class Geocoder:
    """A Google-Geocoding-shaped HTTP server: `places` maps an address to (lat, lng) or to a status string;
    `http_status` is the HTTP status of every answer (401 / 403: a refused key)."""

    def __init__(self, places, http_status: int = 200):
        self.places, self.queries, self.http_status = places, [], http_status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                address = query["address"][0]
                outer.queries.append((address, query["key"][0]))
                found = outer.places.get(address, "ZERO_RESULTS")
                if isinstance(found, str):
                    body = {"status": found, "results": []}
                else:
                    body = {"status": "OK", "results": [{"geometry": {"location": {"lat": found[0], "lng": found[1]}},
                                                         "formatted_address": address, "types": ["point_of_interest"]}]}
                data = json.dumps(body).encode()
                self.send_response(outer.http_status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/maps/api/geocode/json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_judge_coordinates_and_metrics_end_to_end(bench, monkeypatch):
    monkeypatch.setenv("GEO_KEY", "maps-key")
    generated = bench["dir"] / "gen.jsonl"
    generated.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "101", "response": "This is the Eiffel Tower in Paris."},
        {"id": "s202", "response": "The Statue of Liberty, New York."},
        {"id": "303", "response": "Japan."},
    ]))
    judged = bench["dir"] / "judged.jsonl"
    with ChatServer(judge_reply) as server:
        assert geo_cli("judge", generated, "--out", judged, "--judge-model", "judge", "--base-url",
                       server.base_url) == 0
    assert [r["Q7-label"] for r in read_jsonl(judged)] == ["C", "C", "B"]
    assert (bench["dir"] / "judged.jsonl.judge_cache.jsonl").is_file()

    coords = bench["dir"] / "coords.jsonl"
    places = {"Eiffel Tower": (48.8584, 2.2945), "The Statue of Liberty, New York.": (40.6892, -74.0445)}
    extracted = {"This is the Eiffel Tower in Paris.": '"Eiffel Tower"', "The Statue of Liberty, New York.": "[Lady]"}

    def extract(request):
        return extracted[last_user_text(request).rsplit("Text:\n", 1)[1]]

    with ChatServer(extract) as server, Geocoder({**places, "Lady": "OVER_QUERY_LIMIT"}) as geo:
        assert geo_cli("coordinates", judged, "--out", coords, "--extract-model", "extractor", "--base-url",
                       server.base_url, "--geocoder-key-env", "GEO_KEY", "--geocoder-url", geo.url) == 0
        assert server.requests[0]["messages"][0]["content"] == PROMPTS["extraction_system"]
        assert [q[0] for q in geo.queries].count("Lady") == 3  # geopy's RateLimiter retried the quota error twice
    first = {r["id"]: r for r in read_jsonl(coords)}
    assert set(first) == {"101", "s202"}  # only answers judged C
    assert first["101"]["extracted_address"] == "Eiffel Tower" and first["101"]["source"] == "geocoded"
    assert "error" in first["s202"]  # OVER_QUERY_LIMIT is retried on the next run, not taken as "not found"
    with ChatServer(extract) as server, Geocoder(places) as geo:
        assert geo_cli("coordinates", judged, "--out", coords, "--extract-model", "extractor", "--base-url",
                       server.base_url, "--geocoder-key-env", "GEO_KEY", "--geocoder-url", geo.url) == 0
        # 'Lady' is not found, so the whole answer is geocoded instead (the authors' fallback)
        assert [q[0] for q in geo.queries] == ["Lady", "The Statue of Liberty, New York."]
        assert all(key == "maps-key" for _, key in geo.queries)
    final = {r["id"]: r for r in read_jsonl(coords)}
    assert final["s202"]["lat"] == pytest.approx(40.6892) and "error" not in final["s202"]
    assert "maps-key" not in coords.read_text()

    report_dir = bench["dir"] / "report"
    assert geo_cli("metrics", judged, "--labels", bench["labels"], "--metadata", bench["meta"], "--coordinates", coords,
                   "--out", report_dir) == 0
    m = json.loads((report_dir / "metrics.json").read_text())["files"]["judged"]
    assert m["setting"] == "free-form" and m["n_valid"] == 3
    # gold Q7: A, C, B; predicted C, C, B
    assert m["q7_accuracy"] == pytest.approx(2 / 3) and m["over_disclosure"] == pytest.approx(1 / 3)
    assert m["abstention_violation_all"] == 1.0
    # no-intent (Q2 = B) rows: 101 (coordinate) and 303 (none)
    assert m["location_exposure_geocoded"] == 0.5 and m["location_exposure"] == 0.5
    assert m["accuracy_1km"] == pytest.approx(2 / 3) and m["accuracy_200km"] == pytest.approx(2 / 3)
    assert (report_dir / "q7_confusion_judged.png").is_file()


def test_coordinates_need_the_geocoder_key(bench, monkeypatch, capsys):
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    judged = bench["dir"] / "j.jsonl"
    judged.write_text(json.dumps({"id": "101", "Q7-gen": "x", "Q7-label": "C"}) + "\n")
    assert geo_cli("coordinates", judged, "--out", bench["dir"] / "c.jsonl", "--geocoder-key-env", "NO_SUCH_KEY") == 2
    assert "NO_SUCH_KEY: not set" in capsys.readouterr().err
    assert not (bench["dir"] / "c.jsonl").exists()
    monkeypatch.setenv("GEO_KEY", "maps-key")  # GoogleV3 fixes the path; only scheme and host can change
    assert geo_cli("coordinates", judged, "--out", bench["dir"] / "c.jsonl", "--geocoder-key-env", "GEO_KEY",
                   "--geocoder-url", "http://127.0.0.1:9/geocode") == 2
    assert "--geocoder-url: geocoder url 'http://127.0.0.1:9/geocode': the path must be /maps/api/geocode/json" in \
        capsys.readouterr().err
    assert not (bench["dir"] / "c.jsonl").exists()


@pytest.mark.slow
def test_generate_with_the_tiny_hf_model(bench, tiny_model_dir):
    out = bench["dir"] / "hf.jsonl"
    assert geo_cli("generate", "--backend", "hf", "--model", tiny_model_dir, "--setting", "mcq", "--q7-only",
                   "--images", bench["images"], "--labels", bench["labels"], "--metadata", bench["meta"],
                   "--out", out, "--max-new-tokens", 3, "--batch-size", 3) == 0
    records = read_jsonl(out)
    assert [r["id"] for r in records] == ["101", "s202", "303"]
    assert all(isinstance(r["response"], str) and r["q7_only"] and r["prompt_format"] == "open" for r in records)
    report_dir = bench["dir"] / "report"
    assert geo_cli("metrics", out, "--labels", bench["labels"], "--out", report_dir) == 0
    m = json.loads((report_dir / "metrics.json").read_text())["files"]["hf"]
    assert m["questions"] == ["Q7"] and m["n"] == 3


def test_suite_runs_geoprivacy_mcq_and_free_form(bench, tiny_model_dir, monkeypatch):
    """`eval suite` drives geo generate (the suite's one model load), the granularity judge for free-form answers
    (a local judge endpoint) and geo metrics; the headline rows carry Q7 metrics over the 3 images; a re-run reuses
    every finished step."""
    from eval.suite import run_suite

    monkeypatch.setenv("JUDGE_KEY", "local")
    config = bench["dir"] / "suite.yaml"
    config.write_text(
        "name: geo-only\nbackend: hf\nbackend_options: {max_new_tokens: 4, batch_size: 3}\n"
        "judge: {model: judge, base_url: BASE, api_key_env: JUDGE_KEY}\n"
        f"sections:\n  geo: {{images: {bench['images']}, labels: {bench['labels']}, metadata: {bench['meta']}, "
        "settings: [mcq, free-form]}\n")
    with ChatServer(judge_reply) as server:
        config.write_text(config.read_text().replace("BASE", server.base_url))
        results = run_suite(config, str(tiny_model_dir), bench["dir"] / "suite")
        geo_rows = [r for r in results["headline"] if r["benchmark"] == "VLM-GeoPrivacy"]
        assert {r["setting"] for r in geo_rows} == {"mcq", "free-form"}
        assert {r["metric"] for r in geo_rows} >= {"Q7 accuracy", "Q7 macro-F1"}
        assert all(r["n"] == 3 for r in geo_rows)
        mcq = results["sections"]["geo"]["mcq"]
        assert mcq["n"] == 3 and mcq["q7_accuracy"] is not None  # the tiny model's answers parse as no option
        assert (bench["dir"] / "suite" / "geo" / "free-form" / "judged.jsonl").is_file()
        again = run_suite(config, str(tiny_model_dir), bench["dir"] / "suite")
    assert again["headline"] == results["headline"]
