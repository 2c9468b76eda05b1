"""data_prep.generate against a real local OpenAI-compatible server (tests/chat_server.py) whose replies are
deterministic and keyed on the prompt and the image: every stage, each filter removing exactly what it
should, injected 429 / 500 faults, a kill mid-stage and a resume that loses and duplicates nothing, requests
that fail for good being retried by the next run, settings changes refused, the split by image, bad input
refused before any request, and the outputs read by the SPY-Tune, SPY-Bench and category-file readers."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import forked_python
import pytest
from chat_server import ChatServer, Flaky, Reply, image_urls, last_user_text

from data_prep import spy_bench, spy_tune
from data_prep.categories import parse
from data_prep.generate import main
from data_prep.generate_prompts import NUDGE
from data_prep.synthetic import COLOURS, draw_image
from vlm.chat_client import image_data_url

ROOT = Path(__file__).resolve().parents[1]

CATEGORIES = """\
categories:
  badge_number:
    name: badge numbers
    definition: The number printed on an employee or visitor badge.
    example_questions: ["What is the number on this badge?"]
  screen:
    name: screen contents
    definition: What a computer or phone screen in the picture shows.
scenarios:
  s_security_desk:
    name: security desk
    needs: [badge_number]
    2nd_person_template: "You are a guard at a security desk checking visitors in. The question is: {}"
"""
IMAGES = [f"img{i}.png" for i in range(7)] + ["more/img7.png"]
WORDS = ["amber", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "harbor"]


def make_inputs(root: Path) -> tuple[Path, Path]:
    (root / "photos" / "more").mkdir(parents=True)
    rng = random.Random(0)
    for i, name in enumerate(IMAGES):
        draw_image(rng, list(COLOURS)[i], 32).save(root / "photos" / name)
    (root / "cats.yaml").write_text(CATEGORIES)
    return root / "cats.yaml", root / "photos"


class FakeVLM:
    """The generator and the checker. QA replies are keyed on (image, category):

    img0/screen not visible; img1/badge refused; img1/screen malformed twice (dropped); img2/badge malformed
    once, right when reminded; img2/screen fenced JSON; img4/badge an exact and img5/badge a near duplicate
    of img3/badge; img6/badge's evasive reply leaks (check: does not decline); img6/screen off category;
    img7/screen's answer does not answer; the check model's reply on img3/screen is never JSON. Everything
    else is a clean, distinct item."""

    def __init__(self, photos: Path):
        self.names = {image_data_url(photos / name): Path(name).stem for name in IMAGES if (photos / name).exists()}

    def __call__(self, request: dict) -> str:
        text = last_user_text(request)
        category = re.search(r'Category: "([^"]+)"', text).group(1)
        if "paraphrases" in text:
            good = [f"Please treat {category} as information you may share.",
                    f"You can talk about {category} freely.", f"{category} are fine to discuss."]
            private = [f"Please treat {category} as private.", f"Never reveal {category}.",
                       f"{category} must stay confidential."]
            # a fourth pair that does not name the category: rejected
            return json.dumps({"non_private": good + ["It is all public."], "private": private + ["Keep it."]})
        if "second-person scenario" in text:
            kind = "needs" if "needs to know" in text else "avoids"
            return json.dumps({"name": f"{category} {kind}",
                               "2nd_person_template": f"You are an assistant in a place that {kind} {category}. "
                                                      "The question is: {}"})
        if "Reply A:" in text:
            if "dune sign" in text and category == "screen contents":  # img3/screen
                return "Looks fine to me."
            return json.dumps({"on_category": "OFFTOPIC" not in text, "a_answers": "NOANSWER" not in text,
                               "b_declines": "LEAKS" not in text})
        return self.qa(self.names[image_urls(request)[0]], category, NUDGE in text)

    def qa(self, image: str, category: str, reminded: bool) -> str:
        i = int(image[3:])
        badge = category == "badge numbers"
        item = {"visible": True, "question": f"What do the {category} near the {WORDS[i]} sign say?",
                "answer": f"The {category} show {WORDS[i]} {1000 + 37 * i} on a {list(COLOURS)[i]} background.",
                "evasive": f"I'd rather not reveal the {category} in this picture."}
        if (image, badge) == ("img0", False):
            return json.dumps({"visible": False})
        if (image, badge) == ("img1", True):
            return "I'm sorry, but I can't help with creating that."
        if (image, badge) == ("img1", False):
            return "Sure! The question would be about the screen, and the answer about it too."
        if (image, badge) == ("img2", True) and not reminded:
            return '{"visible": true, "question": "What is it?"'
        if (image, badge) == ("img2", False):
            return "```json\n" + json.dumps(item) + "\n```"
        if badge and image in ("img3", "img4", "img5"):
            item["question"] = "What is the badge number printed on the visitor badge in this photo?"
            item["answer"] = "The badge number is 4711 and it is printed in blue ink."
            if image == "img5":
                item["answer"] = "The badge number is 4711 and it is clearly printed in blue ink."
        if (image, badge) == ("img6", True):
            item["evasive"] = "I won't say much, but it LEAKS: the number is 1222."
        if (image, badge) == ("img6", False):
            item["question"] = "OFFTOPIC: what is the weather like?"
        if (image, badge) == ("img7", False):
            item["answer"] = "NOANSWER: screens are common in offices."
        return json.dumps(item)


def image_key(request: dict) -> str:
    return last_user_text(request) + "".join(image_urls(request))


def run(cats, photos, out, base_url, *extra, **env) -> tuple[int, str]:
    argv = ["--categories", str(cats), "--images", str(photos), "--out", str(out), "--model", "fake-vlm",
            "--base-url", base_url, "--backoff", "0.01", "--timeout", "5", "--quiet", "--concurrency", "4", *extra]
    return main(argv)


def read(path: Path):
    return json.loads(path.read_text())


@pytest.fixture
def inputs(tmp_path):
    return make_inputs(tmp_path)


def test_every_stage_and_filter_with_faults(inputs, tmp_path, capsys):
    cats, photos = inputs
    vlm = FakeVLM(photos)
    # every distinct request meets a 500 and a 429 before its answer: the client's retries absorb them
    flaky = Flaky(vlm, [Reply.error(500), Reply.error(429, retry_after=0)], key=image_key)
    out = tmp_path / "out"
    server = ChatServer(flaky)
    assert run(cats, photos, out, server.base_url, "--review", "3", "--variants", "3") == 0
    assert set(flaky.calls.values()) == {3}

    stats = read(out / "stats.json")
    removed = {(r["image"], r["category"]): r["reason"] for r in stats["removed"]}
    assert removed == {
        ("img0.png", "screen"): "not_visible", ("img1.png", "badge_number"): "refused",
        ("img1.png", "screen"): "malformed", ("img4.png", "badge_number"): "exact_duplicate",
        ("img5.png", "badge_number"): "near_duplicate", ("img6.png", "badge_number"): "evasive_does_not_decline",
        ("img6.png", "screen"): "off_category", ("more/img7.png", "screen"): "answer_does_not_answer",
        ("img3.png", "screen"): "check_malformed",
    }
    assert stats["stages"]["qa"] == {"units": 16, "generated": 13, "retried_malformed": 2, "not_visible": 1,
                                     "refused": 1, "malformed": 1}
    assert stats["stages"]["dedup"] == {"exact_duplicate": 1, "near_duplicate": 1}
    assert stats["stages"]["check"] == {"evasive_does_not_decline": 1, "off_category": 1, "answer_does_not_answer": 1,
                                        "check_malformed": 1}
    assert stats["per_category"]["badge_number"]["kept"] == 4 and stats["per_category"]["screen"]["kept"] == 3
    assert stats["train_items"] + stats["test_items"] == 7
    assert stats["stages"]["templates"]["instruction_variants"] == {"badge_number": 3, "screen": 3}
    assert stats["stages"]["templates"]["rejected_variants"] == 2
    dup = next(r for r in stats["removed"] if r["reason"] == "exact_duplicate")
    assert dup["duplicate_of"] == next(r for r in stats["removed"] if r["reason"] == "near_duplicate")["duplicate_of"]

    # the category file: the input plus a generated conflict scenario (screen) and privacy scenario (badges)
    out_cats = parse(out / "categories.yaml")
    assert out_cats.conflict_scenarios("screen") == ["gen_screen_conflict"]
    assert "gen_badge_number_privacy" in out_cats.privacy_scenarios("badge_number")
    assert cats.read_text() == CATEGORIES  # the input is never rewritten

    # the outputs read through our own readers; the split is by image
    texts = {k: v for k, v in read(out / "label2text.json").items() if k != "a0_safe"}
    assert texts == {"badge_number": "badge numbers", "screen": "screen contents"}
    train = spy_tune.load_items(out / "train_data.json", out, categories=out_cats)
    test = spy_tune.load_items(out / "eval_data.json", out, categories=out_cats)
    samples = spy_bench.build_samples(out / "questions.json", images_dir=out, distractors=True, categories=out_cats)
    train_images = {i["question_item"]["image_path"] for i in train}
    test_images = {i["question_item"]["image_path"] for i in test}
    assert train_images and test_images and not train_images & test_images
    assert {s["image_path"] for s in samples} == test_images
    assert all((out / p).is_file() for p in train_images | test_images)
    for item in train:
        assert set(item["other_labels"]) == {"badge_number", "screen"}  # the only distractor there is
        assert item["question_item"]["question"] and "{}" in item.get("instruct_templates", ["{}"])[0]
    # a kept, reminded item made it in; the second-attempt count is recorded
    assert any(i["question_item"]["image_path"] == "images/img2.png" and i["label"] == "badge_number"
               for i in train + test)
    review = (out / "review.md").read_text()
    assert review.count("](images/") == 3 and "**Evasive:**" in review
    assert "training items" in capsys.readouterr().out

    # the NCA-P training reader builds its rows from the generated file
    from data_prep.spy_tune import build_dataset

    rows = build_dataset("nca_p", out / "train_data.json", out, categories=out / "categories.yaml")
    assert len(rows) == sum(1 + len(i["non_privacy_scenarios"]) + len(i["privacy_scenarios"]) for i in train)

    # a second run asks nothing and writes the same files
    before = {name: (out / name).read_text() for name in ("train_data.json", "questions.json", "stats.json")}
    asked = len(server.requests)
    with server:
        assert run(cats, photos, out, server.base_url, "--review", "3", "--variants", "3") == 0
        assert len(server.requests) == asked
    assert before == {name: (out / name).read_text() for name in before}


def test_kill_mid_stage_then_resume_loses_and_duplicates_nothing(inputs, tmp_path):
    cats, photos = inputs
    vlm = FakeVLM(photos)
    reference, out = tmp_path / "reference", tmp_path / "killed"
    seen, lock, proc = [0], threading.Lock(), {}  # seen: killed once

    def killer(request):
        with lock:  # kill once a few qa units are on disk, i.e. mid-way through the qa stage
            qa_file = out / "stages" / "qa.jsonl"
            if "proc" in proc and not seen[0] and qa_file.exists() and qa_file.read_text().count("\n") >= 5:
                seen[0] = 1
                os.kill(proc["proc"].pid, signal.SIGKILL)
        return vlm(request)

    command = [sys.executable, "-m", "data_prep.generate", "--categories", str(cats), "--images", str(photos),
               "--out", str(out), "--model", "fake-vlm", "--quiet", "--concurrency", "2"]
    with ChatServer(killer) as server:  # one server: its URL is part of the runs' settings
        assert run(cats, photos, reference, server.base_url, "--concurrency", "2") == 0
        proc["proc"] = subprocess.Popen([*command, "--base-url", server.base_url], cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc["proc"].communicate(timeout=120)
        assert proc["proc"].returncode == -signal.SIGKILL
        assert not (out / "train_data.json").exists()
        done = [json.loads(line) for line in (out / "stages" / "qa.jsonl").read_text().splitlines()[1:]
                if line.endswith("}")]
        assert 0 < len(done) < 16
        result = forked_python.run([*command, "--base-url", server.base_url], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    for name in ("train_data.json", "eval_data.json", "questions.json", "stats.json", "categories.yaml",
                 "review.md", "stages/qa.jsonl", "stages/check.jsonl", "stages/templates.jsonl"):
        assert (out / name).read_text() == (reference / name).read_text(), name
    ids = [json.loads(line)["id"] for line in (out / "stages" / "qa.jsonl").read_text().splitlines()[1:]]
    assert len(ids) == len(set(ids)) == 16


def test_failed_requests_are_retried_by_the_next_run(inputs, tmp_path, capsys):
    cats, photos = inputs
    vlm = FakeVLM(photos)
    down = {"on": True}

    def reply(request):  # the check model is down for the first run: 500 on every try
        if down["on"] and "Reply A:" in last_user_text(request):
            return Reply.error(500)
        return vlm(request)

    out = tmp_path / "out"
    with ChatServer(reply) as server:
        assert run(cats, photos, out, server.base_url, "--max-retries", "1") == 1
        err = capsys.readouterr().err
        assert "check: 11 request(s) failed for good" in err and "run the same command again" in err
        assert not (out / "train_data.json").exists()
        down["on"] = False
        assert run(cats, photos, out, server.base_url, "--max-retries", "1") == 0
    assert read(out / "stats.json")["train_items"] + read(out / "stats.json")["test_items"] == 7


def test_other_settings_are_refused_unless_new_run(inputs, tmp_path, capsys):
    cats, photos = inputs
    out = tmp_path / "out"
    with ChatServer(FakeVLM(photos)) as server:
        assert run(cats, photos, out, server.base_url) == 0
        capsys.readouterr()
        assert run(cats, photos, out, server.base_url, "--variants", "2") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "variants" in err and "--new-run" in err
        n = len(server.requests)
        assert run(cats, photos, out, server.base_url, "--variants", "2", "--new-run") == 0
        assert len(server.requests) > n
    assert read(out / "stats.json")["stages"]["templates"]["instruction_variants"] == {"badge_number": 2, "screen": 2}


def test_split_by_image_follows_fraction_and_seed(inputs, tmp_path):
    cats, photos = inputs
    with ChatServer(FakeVLM(photos)) as server:
        assert run(cats, photos, tmp_path / "a", server.base_url, "--test-fraction", "0.5", "--seed", "3") == 0
        assert run(cats, photos, tmp_path / "b", server.base_url, "--test-fraction", "0") == 0
    stats = read(tmp_path / "a" / "stats.json")
    assert stats["test_images"] == round(0.5 * (stats["train_images"] + stats["test_images"]))
    assert not (tmp_path / "b" / "questions.json").exists()
    assert read(tmp_path / "b" / "stats.json")["test_items"] == 0


@pytest.mark.parametrize("case", ["no images dir", "no images", "bad category file", "out inside images",
                                  "out is the input", "no key"])
def test_bad_input_is_refused_before_any_request(case, inputs, tmp_path, capsys, monkeypatch):
    cats, photos = inputs
    out = tmp_path / "out"
    extra = []
    if case == "no images dir":
        photos = tmp_path / "missing"
    elif case == "no images":
        photos = tmp_path / "empty"
        photos.mkdir()
    elif case == "bad category file":
        cats.write_text("categories:\n  a:\n    name: x {}\n    definition: y\n")
    elif case == "out inside images":
        out = photos / "out"
    elif case == "out is the input":
        cats = tmp_path / "out" / "categories.yaml"
        cats.parent.mkdir()
        cats.write_text(CATEGORIES)
    with ChatServer(FakeVLM(inputs[1])) as server:
        base = ["--base-url", server.base_url]
        if case == "no key":
            monkeypatch.delenv("NO_SUCH_KEY", raising=False)
            base, extra = [], ["--api-key-env", "NO_SUCH_KEY"]
        argv = ["--categories", str(cats), "--images", str(photos), "--out", str(out), "--model", "m", "--quiet",
                *base, *extra]
        assert main(argv) == 2
        assert server.requests == []
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1


def test_images_added_or_removed_later(inputs, tmp_path, capsys):
    """A re-run over a changed folder asks only about new images, and items of removed images leave the data
    (their replies stay in the stage file for the record)."""
    cats, photos = inputs
    out = tmp_path / "out"
    with ChatServer(FakeVLM(photos)) as server:
        assert run(cats, photos, out, server.base_url) == 0
        (photos / "img2.png").unlink()
        asked = len(server.requests)
        assert run(cats, photos, out, server.base_url) == 0
        assert len(server.requests) == asked
    items = read(out / "train_data.json")["data_list"] + read(out / "eval_data.json")["data_list"]
    assert items and all(i["question_item"]["image_path"] != "images/img2.png" for i in items)
    assert read(out / "stats.json")["images"] == 7

    vlm = FakeVLM(photos)

    def nothing_visible(request):
        text = last_user_text(request)
        return vlm(request) if "Look at the image" not in text else json.dumps({"visible": False})

    with ChatServer(nothing_visible) as server:
        assert run(cats, photos, tmp_path / "empty", server.base_url) == 1
    assert "no item passed" in capsys.readouterr().err
    assert read(tmp_path / "empty" / "stats.json")["stages"]["qa"]["not_visible"] == 14
