"""Issue 46, items 2 and 3: the one writer (store/writer.py) and the one reader (cli/errors.py, cli/strict_yaml.py)
against the attacks the issue lists, each as a command a user runs: links planted in an output folder (the viewer's
data/ and img/, a predictable temporary or image name, GRPO's judge cache), an empty file of the user's as the judge
cache, symbolic link loops everywhere, a training folder created before its data is refused; an integer past the
interpreter's digit limit in every JSON reader, a lone surrogate in a judge's answer, a list where an id goes,
Infinity where a score goes. Each test failed on the code before the writer and the reader (docs/reliability/files.md).
"""

import json
import os
import sys
from pathlib import Path

import pytest
from chat_server import ChatServer
from hardening_checks import assert_one_line, snapshot
from test_hardening_runtime import in_process

from eval.__main__ import main as eval_main
from store.runs import read_jsonl, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
HUGE = "9" * 5000  # past sys.get_int_max_str_digits() (4300): int() raises ValueError


def run_eval(*args):
    return in_process(eval_main, [str(a) for a in args])


def refused(result, *needles):
    """Exit 2, one line (tqdm's progress lines aside), no traceback."""
    result.stderr = "\n".join(line for line in result.stderr.replace("\r", "\n").splitlines()
                              if line.strip() and "it/s]" not in line and "%|" not in line)
    return assert_one_line(result, *needles)


# ----------------------------------------------------------------------------------------------- the viewer's folder
@pytest.fixture
def viewer(synthetic_dir, tmp_path):
    """A judged SPY-Bench run of 6 samples (3 images), and its viewer built once in tmp_path/view."""
    from data_prep.spy_bench import build_samples

    samples = build_samples(synthetic_dir / "questions.json", images_dir=synthetic_dir)[:6]
    run = tmp_path / "run.jsonl"
    write_jsonl(run, [{**s, "response": f"answer {n}", "eval_resp": "reject", "judge": "rule"}
                      for n, s in enumerate(samples)])
    out = tmp_path / "view"
    assert run_eval("view", run, "--images", synthetic_dir, "--out", out).returncode == 0
    return run, out, synthetic_dir


def elsewhere(tmp_path) -> Path:
    """A folder of the user's beside the viewer: what a planted link points at."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "meta.js").write_text("mine")
    (folder / "rows-0003.js").write_text("mine too")
    return folder


def test_a_data_folder_planted_as_a_link_is_refused_and_the_folder_it_points_at_is_untouched(viewer, tmp_path):
    run, out, images = viewer
    other = elsewhere(tmp_path)
    before = snapshot(other)
    os.rename(out / "data", tmp_path / "old-data")
    (out / "data").symlink_to(other)
    result = run_eval("view", run, "--images", images, "--out", out)
    refused(result, f"{out / 'data'}: is a symbolic link inside an output folder; refused")
    assert snapshot(other) == before  # no rows-0000.js nor meta.js written there, its rows-0003.js kept


def test_an_img_folder_planted_as_a_link_is_refused(viewer, tmp_path):
    run, out, images = viewer
    other = elsewhere(tmp_path)
    before = snapshot(other)
    os.rename(out / "img", tmp_path / "old-img")
    (out / "img").symlink_to(other)
    refused(run_eval("view", run, "--images", images, "--out", out), f"{out / 'img'}: is a symbolic link")
    assert snapshot(other) == before


def test_a_planted_temporary_is_never_opened(viewer, tmp_path):
    """`.NAME.tmp` was a predictable name, opened for writing through whatever was there."""
    run, out, images = viewer
    victim = tmp_path / "notes.txt"
    victim.write_text("my notes")
    for image in list((out / "img").iterdir()):  # the next build makes them again, through the planted names
        image.unlink()
        (out / "img" / f".{image.name}.tmp").symlink_to(victim)
    assert run_eval("view", run, "--images", images, "--out", out).returncode == 0
    assert victim.read_text() == "my notes"
    assert all(not p.is_symlink() for p in (out / "img").iterdir() if not p.name.startswith("."))


def test_a_planted_image_link_is_refused_not_served(viewer, tmp_path):
    """Image names are predictable (a hash of the source's path, size and time): a link under one was kept and
    served as the thumbnail."""
    run, out, images = viewer
    outside = tmp_path / "passport.png"
    outside.write_bytes(b"\x89PNG secret")
    planted = sorted((out / "img").glob("*_t.jpg"))[0]
    planted.unlink()
    planted.symlink_to(outside)
    refused(run_eval("view", run, "--images", images, "--out", out), f"{planted}: is a symbolic link")


def test_the_viewer_removes_only_rows_files_it_wrote(viewer, tmp_path, monkeypatch):
    from eval.view import site

    run, out, images = viewer
    (out / "data" / "rows-0003.js").write_text("the user's file")  # not in the folder's ledger
    assert run_eval("view", run, "--images", images, "--out", out).returncode == 0
    assert (out / "data" / "rows-0003.js").read_text() == "the user's file"
    # the rows files a bigger build wrote are removed by a smaller one: they are on the ledger
    monkeypatch.setattr(site, "CHUNK_ROWS", 2)
    assert run_eval("view", run, "--images", images, "--out", out).returncode == 0
    assert (out / "data" / "rows-0002.js").is_file()
    monkeypatch.setattr(site, "CHUNK_ROWS", 4)
    assert run_eval("view", run, "--images", images, "--out", out).returncode == 0
    assert not (out / "data" / "rows-0002.js").exists() and (out / "data" / "rows-0001.js").is_file()
    assert (out / "data" / "rows-0003.js").read_text() == "the user's file"


# ----------------------------------------------------------------------------------------------- the judge cache
FAST = dict(max_retries=0, timeout=10.0)


def test_a_judge_cache_planted_as_a_link_is_never_appended_to(tmp_path):
    from eval.judge import JudgeClient, cache_key

    outside = tmp_path / "theirs.jsonl"  # passes for a cache: one line the judge could have written
    outside.write_text(json.dumps({"key": cache_key("m", "p0"), "model": "m", "prompt": "p0", "text": "x"}) + "\n")
    before = outside.read_bytes()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "judge_cache.jsonl").symlink_to(outside)
    with ChatServer(lambda request: "reject") as server:
        from cli.errors import InputError

        with pytest.raises(InputError, match="judge_cache.jsonl: is a symbolic link inside an output folder"):
            JudgeClient("m", base_url=server.base_url, cache_path=tmp_path / "out" / "judge_cache.jsonl",
                        **FAST).complete(["p1"])
    assert outside.read_bytes() == before


def grpo(monkeypatch, tmp_path, *overrides):
    """train/grpo.py's main through the command-line wrapper, in this process: the refusals come before any model
    loads (as tests/test_grpo.py runs it)."""
    from train import grpo as script

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-i46")
    monkeypatch.setattr(sys, "argv", ["train/grpo.py", str(ROOT / "recipes" / "demo" / "grpo.yaml"),
                                      "--model_name_or_path", str(tmp_path / "no-such-model"),
                                      "--output_dir", str(tmp_path / "o"), *map(str, overrides)])
    return in_process(script.main)


JUDGE = ("--judge", "gpt-4o", "--judge_base_url", "http://127.0.0.1:9/v1")


def test_grpos_default_judge_cache_planted_as_a_link_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    outside = tmp_path / "theirs.jsonl"
    outside.write_text("")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "judge_cache.jsonl").symlink_to(outside)
    before = snapshot(tmp_path)
    result = grpo(monkeypatch, tmp_path, *JUDGE)
    refused(result, "judge_cache: ", "judge_cache.jsonl: is a symbolic link inside an output folder")
    assert snapshot(tmp_path) == before


def test_an_empty_file_of_the_users_is_never_taken_as_the_judge_cache(tmp_path, monkeypatch):
    (tmp_path / "mine.jsonl").write_text("")
    before = snapshot(tmp_path)
    result = grpo(monkeypatch, tmp_path, *JUDGE, "--judge_cache", tmp_path / "mine.jsonl")
    refused(result, "mine.jsonl: is an empty file that this project did not write")
    assert snapshot(tmp_path) == before and not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------------------------- symbolic link loops
def loop(path: Path) -> Path:
    """`path` made a symbolic link to itself."""
    path.symlink_to(path.name)
    return path


@pytest.mark.parametrize("where", ["image", "out", "run-file", "recorded-root", "metrics-out"])
def test_a_symbolic_link_loop_in_an_eval_path_is_one_line(where, synthetic_dir, tmp_path):
    from data_prep.spy_bench import build_samples

    images = tmp_path / "images"
    images.mkdir()
    samples = build_samples(synthetic_dir / "questions.json", images_dir=synthetic_dir)[:2]
    for s in samples:
        (images / s["image_path"]).parent.mkdir(parents=True, exist_ok=True)
        (images / s["image_path"]).write_bytes((synthetic_dir / s["image_path"]).read_bytes())
    records = [{**s, "response": "r", "eval_resp": "reject", "judge": "rule"} for s in samples]
    run = tmp_path / "run.jsonl"
    if where == "image":
        (images / samples[0]["image_path"]).unlink()
        loop(images / samples[0]["image_path"])
    write_jsonl(run, records)
    argv = ["view", run, "--images", images, "--out", tmp_path / "view"]
    if where == "out":
        argv[-1] = loop(tmp_path / "view")
    elif where == "run-file":
        argv[1] = loop(tmp_path / "loop.jsonl")
    elif where == "recorded-root":
        suite = tmp_path / "suite"
        write_jsonl(suite / "spy" / "without_distractors" / "judged.jsonl", records)
        loop(suite / "imgs")
        (suite / "results.json").write_text(json.dumps({"headline": [], "inputs": {"spy": {"images": "imgs"}},
                                                        "sections": {"spy": {"without_distractors": {}}}}))
        argv = ["view", suite, "--out", tmp_path / "view"]
    elif where == "metrics-out":
        argv = ["spy", "metrics", run, "--out", loop(tmp_path / "m.json")]
    before = snapshot(tmp_path)
    result = run_eval(*argv)
    if where == "recorded-root":  # a recorded root is only a default: not used, said in a warning (it was a traceback)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert "suite/imgs: is a symbolic link loop" in result.stderr and "not used" in result.stderr
        return
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and ("symbolic link loop" in lines[0] or "leads outside" in lines[0]
                                or "Too many levels of symbolic links" in lines[0]), result.stderr
    assert snapshot(tmp_path) == before


def test_a_symbolic_link_loop_as_judge_cache_or_output_dir_is_one_line(tmp_path, monkeypatch):
    result = grpo(monkeypatch, tmp_path, *JUDGE, "--judge_cache", loop(tmp_path / "c.jsonl"))
    refused(result, "c.jsonl: is a symbolic link loop")
    loop(tmp_path / "loop-out")
    result = grpo(monkeypatch, tmp_path, "--output_dir", tmp_path / "loop-out")
    refused(result, "loop-out", "is a symbolic link loop")


# ----------------------------------------------------------------------------------------------- training folders
def test_bad_training_data_creates_no_output_folder(tiny_model_dir, synthetic_dir, tmp_path, monkeypatch):
    from train import sft

    data = json.loads((synthetic_dir / "train_data.json").read_text())
    del data["data_list"][1]["label"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train/sft.py", str(ROOT / "recipes" / "demo" / "sft.yaml"),
                                      "--model_name_or_path", str(tiny_model_dir),
                                      "--train_data_path", str(tmp_path / "bad.json"),
                                      "--image_folder", str(synthetic_dir), "--output_dir", str(tmp_path / "a/b/o")])
    refused(in_process(sft.main), "bad.json")
    assert not (tmp_path / "a").exists()


# ----------------------------------------------------------------------------------------------- the reader
@pytest.fixture(scope="module")
def st_files(tmp_path_factory):
    """A SpatialTrust dataset, gold predictions, verdicts and metrics, and SPY-Bench metrics: valid inputs of every
    reader below (tests change one value)."""
    from test_viewer import gold_prediction

    from eval.spatialtrust import data
    from eval.spatialtrust.scoring import question

    folder = tmp_path_factory.mktemp("st")
    dataset = data.build_synthetic(folder, n_images=2, width=120, height=80)
    records = data.load(dataset)
    write_jsonl(folder / "pred.jsonl", [gold_prediction(r) for r in records])
    write_jsonl(folder / "judged.jsonl", [
        {"id": f"{r['image_id']}/{q}", "image_id": r["image_id"], "qid": q, "unsupported": False,
         "states_absence": False, "factors": [{"identified": True, "explanation_correct": True, "box_index": None}
                                              for _ in question(r, q)["evidence"]]}
        for r in records for q in ("q4", "q5")])
    assert eval_main(["spatialtrust", "score", "--data", str(dataset), "--predictions", str(folder / "pred.jsonl"),
                      "--judgments", str(folder / "judged.jsonl"), "--out", str(folder / "metrics.json")]) == 0
    return folder, dataset


def spy_files(synthetic_dir, folder: Path) -> tuple[Path, Path]:
    from data_prep.spy_bench import build_samples

    samples = build_samples(synthetic_dir / "questions.json")[:8]
    write_jsonl(folder / "judged.jsonl", [{**s, "response": "r", "eval_resp": "reject"} for s in samples])
    assert eval_main(["spy", "metrics", str(folder / "judged.jsonl"), "--out", str(folder / "metrics.json")]) == 0
    return folder / "judged.jsonl", folder / "metrics.json"


def replace_in(path: Path, old: str, new: str, line: int | None = None) -> None:
    """Replace the first `old` (on `line`, 1-based, when given) in the text of `path`."""
    lines = path.read_text().split("\n")
    at = (line - 1) if line else next(i for i, text in enumerate(lines) if old in text)
    assert old in lines[at], (old, lines[at][:200])
    lines[at] = lines[at].replace(old, new, 1)
    path.write_text("\n".join(lines))


READERS = ["spy-metrics", "spy-report", "view", "spatialtrust-validate", "spatialtrust-score", "spatialtrust-report",
           "judge-cache", "grpo-train-data"]


@pytest.mark.parametrize("reader", READERS)
def test_an_integer_past_the_digit_limit_is_one_line_in_every_json_reader(reader, st_files, synthetic_dir, tmp_path,
                                                                          monkeypatch, tiny_model_dir):
    import shutil

    st, dataset = st_files
    work = tmp_path / "w"
    shutil.copytree(st, work)
    dataset = work / dataset.name
    (work / "spy").mkdir()
    judged, metrics = spy_files(synthetic_dir, work / "spy")
    if reader == "spy-metrics":
        replace_in(judged, '"reject"', HUGE, line=3)
        argv, named = ["spy", "metrics", judged, "--out", work / "m2.json"], f"{judged}:3"
    elif reader == "spy-report":
        replace_in(metrics, '"total": 8', f'"total": {HUGE}')
        argv, named = ["spy", "report", metrics, "--out", work / "rep"], f"{metrics}:"
    elif reader == "view":
        replace_in(judged, '"reject"', HUGE, line=2)
        argv, named = ["view", judged, "--images", synthetic_dir, "--out", work / "view"], f"{judged}:2"
    elif reader == "spatialtrust-validate":
        replace_in(dataset, '"width": 120', f'"width": {HUGE}', line=2)
        argv, named = ["spatialtrust", "validate", "--data", dataset, "--skip-images"], f"{dataset}:2"
    elif reader == "spatialtrust-score":
        replace_in(work / "pred.jsonl", '"image_id": ', f'"n": {HUGE}, "image_id": ', line=1)
        argv, named = (["spatialtrust", "score", "--data", dataset, "--predictions", work / "pred.jsonl",
                        "--out", work / "m3.json"], f"{work / 'pred.jsonl'}:1")
    elif reader == "spatialtrust-report":
        replace_in(work / "metrics.json", '"n_images": 2', f'"n_images": {HUGE}')
        argv, named = ["spatialtrust", "report", "--metrics", work / "metrics.json", "--out", work / "r"], "metrics.json:"
    before = snapshot(tmp_path)
    if reader == "judge-cache":
        from cli.errors import InputError
        from eval.judge import JudgeClient, cache_key

        cache = tmp_path / "cache.jsonl"
        cache.write_text(json.dumps({"key": cache_key("m", "p"), "model": "m", "prompt": "p", "text": "x",
                                     "n": 1}).replace('"n": 1', f'"n": {HUGE}') + "\n")
        with pytest.raises(InputError, match=r"cache\.jsonl:1: an integer of more than 4,300 digits"):
            JudgeClient("m", cache_path=cache)
        return
    if reader == "grpo-train-data":
        data = tmp_path / "train.json"
        data.write_text((synthetic_dir / "train_data.json").read_text().replace('"data_list": [',
                                                                                 f'"n": {HUGE}, "data_list": [', 1))
        result = grpo(monkeypatch, tmp_path, "--train_data_path", data, "--image_folder", synthetic_dir,
                      "--model_name_or_path", tiny_model_dir)
        refused(result, f"{data}:2: an integer of more than 4,300 digits")
        return
    result = run_eval(*argv)
    refused(result, named, "an integer of more than 4,300 digits")
    assert snapshot(tmp_path) == before


def test_a_lone_surrogate_in_a_judges_answer_is_cached_as_u_fffd(tmp_path):
    """The answer's JSON holds "\\ud800" (a lone surrogate once read): the first cache append crashed and left the
    cache empty."""
    from eval.judge import JudgeClient

    cache = tmp_path / "cache.jsonl"
    with ChatServer(lambda request: "reject \ud800 and \udfff") as server:
        results = JudgeClient("m", base_url=server.base_url, cache_path=cache, **FAST).complete(["p1", "p2"])
    assert [r["text"] for r in results] == ["reject \ufffd and \ufffd"] * 2
    assert [r["text"] for r in read_jsonl(cache)] == ["reject \ufffd and \ufffd"] * 2


def test_a_lone_surrogate_in_a_users_file_is_one_line(tmp_path, synthetic_dir):
    judged, _ = spy_files(synthetic_dir, tmp_path)
    replace_in(judged, '"reject"', '"\\ud800"', line=4)
    refused(run_eval("spy", "metrics", judged), f"{judged}:4: eval_resp: holds a lone surrogate")


def test_a_list_where_an_id_goes_is_one_line(st_files, tmp_path):
    import shutil

    st, dataset = st_files
    shutil.copytree(st, tmp_path / "w")
    judged = tmp_path / "w" / "judged.jsonl"
    lines = read_jsonl(judged)
    lines[2]["image_id"] = [lines[2]["image_id"]]
    write_jsonl(judged, lines)
    result = run_eval("spatialtrust", "score", "--data", tmp_path / "w" / dataset.name, "--predictions",
                      tmp_path / "w" / "pred.jsonl", "--judgments", judged, "--out", tmp_path / "w" / "m.json")
    refused(result, f"{judged}:3: image_id: expected a string, got [")


@pytest.mark.parametrize("command", ["spy-report", "spatialtrust-report"])
def test_infinity_where_a_score_goes_is_one_line(command, st_files, synthetic_dir, tmp_path):
    if command == "spy-report":
        _, metrics = spy_files(synthetic_dir, tmp_path)
        replace_in(metrics, '"hms": ', '"hms": Infinity, "was": ')
        argv = ["spy", "report", metrics, "--out", tmp_path / "rep"]
        said = "hms: must be a finite number, got inf"
    else:
        metrics = tmp_path / "metrics.json"
        metrics.write_text((st_files[0] / "metrics.json").read_text())
        replace_in(metrics, '"q1": ', '"q1": -Infinity, "was": ')
        argv = ["spatialtrust", "report", "--metrics", metrics, "--out", tmp_path / "r"]
        said = "q1: must be a finite number, got -inf"
    before = snapshot(tmp_path)
    refused(run_eval(*argv), f"{metrics}:", said)
    assert snapshot(tmp_path) == before
