"""Issue 46 item 5 (the reader's and the writer's share): Hypothesis generates hostile input files for every reader
and hostile output trees for the writer, and checks the two properties the issue names, through the commands a user
runs (in this process, through the command-line wrapper):

- the command succeeds, or exits 2 with one `error:` line; never a traceback (an exception out of the wrapper);
- no file outside the folders the command was told to write changes (a link's target, the inputs).

Readers: `spy metrics` (a judged run file), `spy report` (metrics JSON), `eval view` (a judged run file),
`spatialtrust validate` (the data), `spatialtrust score` (predictions, verdicts), `spatialtrust report` (metrics),
`data_prep.spy_tune validate` (SPY-Tune JSON, what training reads), the judge cache (eval/judge.py) and a category
file (YAML). Each gets one value replaced by a hostile one, at any field of any record, nested or not: deep nesting,
an integer past the interpreter's digit limit, NaN and infinities, lone surrogates, text / numbers / booleans / null /
lists / objects where another kind goes; or its text changed: a key given twice, bytes that are not UTF-8, cut short.
Writer: a viewer's folder, a run file's folder and a judge cache's, each with planted symbolic links (to a victim
folder and file), loops, FIFOs, files where folders go and folders where files go, and planted temporaries.

Seeded and bounded (`derandomize`, `max_examples`), so `make test` runs the same examples every time, in budget.
For a release, run longer: PRIVACY_ALIGN_FUZZ_EXAMPLES=2000 (docs/reliability/files.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest
from hardening_checks import snapshot
from test_hardening_runtime import in_process

pytest.importorskip("hypothesis", reason="hypothesis is in the dev extra")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from eval.__main__ import main as eval_main  # noqa: E402
from store.runs import read_jsonl, write_jsonl  # noqa: E402

EXAMPLES = int(os.environ.get("PRIVACY_ALIGN_FUZZ_EXAMPLES", "0")) or None
FUZZ = dict(derandomize=True, database=None, deadline=None, print_blob=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                   HealthCheck.data_too_large])


def fuzz(examples: int):
    """Hypothesis settings: `examples` per `make test` run (PRIVACY_ALIGN_FUZZ_EXAMPLES overrides, for a release)."""
    return settings(max_examples=EXAMPLES or examples, **FUZZ)


# ---------------------------------------------------------------------------------------------------- hostile values
HUGE = "__HUGE_INT__"  # written as an integer of 5,000 digits (json.dumps cannot make one: it has no str() form)


def nested(depth: int, leaf=0):
    value = leaf
    for n in range(depth):
        value = [value] if n % 2 else {"k": value}
    return value


SURROGATES = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
# one kind of hostile value, each kind as likely as the others (a plain one_of would make the rare ones rarer)
KINDS = {
    "huge-integer": st.just(HUGE),
    "past-a-float": st.integers(min_value=10**300, max_value=10**400),
    "not-finite": st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    "lone-surrogate": st.builds(lambda a, s, b: a + s + b, st.text(max_size=4), SURROGATES, st.text(max_size=4)),
    "text": st.text(max_size=12),
    "integer": st.integers(),
    "float": st.floats(),
    "boolean": st.booleans(),
    "null": st.none(),
    "list": st.lists(st.one_of(st.integers(), st.text(max_size=4), st.none()), max_size=3),
    "object": st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=4)), max_size=2),
    "deep": st.integers(90, 130).map(nested),
}
HOSTILE = st.sampled_from(sorted(KINDS)).flatmap(KINDS.get)


def dumps(value) -> str:
    """JSON as a careless tool writes it: NaN and Infinity as words, a lone surrogate as its \\u escape."""
    return json.dumps(value).replace(json.dumps(HUGE), "9" * 5000)


def paths_of(value, prefix=()):
    """Every (key path) inside a record, its own keys and one level of what they hold."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*prefix, key)
            if len(prefix) < 2:
                yield from paths_of(child, (*prefix, key))
    elif isinstance(value, list) and value and len(prefix) < 3:
        yield (*prefix, 0)
        yield from paths_of(value[0], (*prefix, 0))


def put(value, path, new):
    """A copy of `value` with the item at `path` replaced by `new`."""
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = put(copy[path[0]], path[1:], new)
    return copy


@st.composite
def hostile_json(draw, records: list, lines: bool):
    """The text (bytes) of `records` (JSON Lines) or of `records[0]` (a whole JSON file) with one hostile change."""
    docs = records if lines else records[:1]
    at = draw(st.integers(0, len(docs) - 1))
    kind = draw(st.sampled_from(["value"] * 6 + ["duplicate", "bytes", "cut"]))
    docs = list(docs)
    if kind == "value":  # one to three values, anywhere in the record
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(list(paths_of(docs[at])) or [()]))
            docs[at] = put(docs[at], path, draw(HOSTILE))
    texts = [dumps(d) for d in docs]
    if kind == "duplicate" and isinstance(docs[at], dict) and docs[at]:
        key = draw(st.sampled_from(sorted(docs[at])))
        texts[at] = texts[at].replace("{", "{" + json.dumps(key) + ": 0, ", 1)
    data = ("\n".join(texts) + "\n").encode()
    if kind == "bytes":
        where = draw(st.integers(0, len(data)))
        data = data[:where] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + data[where:]
    elif kind == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    return data


# ---------------------------------------------------------------------------------------------------- the properties
@contextmanager
def no_hang(seconds: int = 15):
    """A command that blocks (a FIFO opened for writing, for ever) fails the example instead of the suite."""
    def stop(*_):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def ends_well(result, many_lines: bool = False) -> None:
    """Success, or exit 2 with one `error:` line (`many_lines`: a validator that lists every bad item); a traceback
    would have come out of in_process as an exception."""
    assert result.returncode in (0, 2), (result.returncode, result.stderr[-2000:])
    if result.returncode == 2:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert errors and (many_lines or len(errors) == 1), result.stderr[-2000:]


def unchanged_outside(before: dict, root: Path, out: Path) -> None:
    """No file below `root` changed, but those below `out` (the folder the command writes)."""
    after = {k: v for k, v in snapshot(root).items() if not (root / k).is_relative_to(out)}
    before = {k: v for k, v in before.items() if not (root / k).is_relative_to(out)}
    assert after == before, sorted(set(after.items()) ^ set(before.items()))


# ---------------------------------------------------------------------------------------------------- the readers
@pytest.fixture(scope="module")
def inputs(tmp_path_factory, synthetic_dir):
    """Valid inputs of every reader, made by the commands themselves (tests write a hostile copy of one)."""
    from test_viewer import gold_prediction

    from data_prep.spy_bench import build_samples
    from eval.judge import cache_key
    from eval.spatialtrust import data
    from eval.spatialtrust.scoring import question

    folder = tmp_path_factory.mktemp("fuzz-inputs")
    samples = build_samples(synthetic_dir / "questions.json", images_dir=synthetic_dir)[:4]
    write_jsonl(folder / "judged.jsonl", [{**s, "response": "r", "eval_resp": "reject", "judge": "rule"}
                                          for s in samples])
    assert eval_main(["spy", "metrics", str(folder / "judged.jsonl"), "--out", str(folder / "spy_metrics.json")]) == 0
    dataset = data.build_synthetic(folder / "st", n_images=2, width=120, height=80)
    records = data.load(dataset)
    write_jsonl(folder / "pred.jsonl", [gold_prediction(r) for r in records])
    write_jsonl(folder / "verdicts.jsonl", [
        {"id": f"{r['image_id']}/{q}", "image_id": r["image_id"], "qid": q, "unsupported": False,
         "states_absence": False, "factors": [{"identified": True, "explanation_correct": True, "box_index": None}
                                              for _ in question(r, q)["evidence"]]}
        for r in records for q in ("q4", "q5")])
    assert eval_main(["spatialtrust", "score", "--data", str(dataset), "--predictions", str(folder / "pred.jsonl"),
                      "--judgments", str(folder / "verdicts.jsonl"), "--out", str(folder / "st_metrics.json")]) == 0
    write_jsonl(folder / "cache.jsonl", [{"key": cache_key("m", f"p{n}"), "model": "m", "prompt": f"p{n}",
                                          "text": "reject"} for n in range(3)])
    spy_tune = json.loads((synthetic_dir / "train_data.json").read_text())
    spy_tune["data_list"] = spy_tune["data_list"][:3]
    (folder / "train_data.json").write_text(json.dumps(spy_tune))
    return folder, synthetic_dir


def as_records(path: Path, lines: bool) -> list:
    return read_jsonl(path) if lines else [json.loads(path.read_text())]


# name -> (the file changed, JSON Lines or a whole file, argv given the work folder and the images, many lines)
READERS = {
    "spy-metrics": ("judged.jsonl", True, lambda w, i: ["spy", "metrics", w / "judged.jsonl", "--out", w / "out" / "m.json"]),
    "spy-report": ("spy_metrics.json", False, lambda w, i: ["spy", "report", w / "spy_metrics.json", "--out", w / "out"]),
    "view": ("judged.jsonl", True, lambda w, i: ["view", w / "judged.jsonl", "--images", i, "--out", w / "out"]),
    "spatialtrust-validate": ("st/data.jsonl", True,
                              lambda w, i: ["spatialtrust", "validate", "--data", w / "st" / "data.jsonl", "--skip-images"]),
    "spatialtrust-score-predictions": ("pred.jsonl", True, lambda w, i: [
        "spatialtrust", "score", "--data", w / "st" / "data.jsonl", "--predictions", w / "pred.jsonl", "--judgments",
        w / "verdicts.jsonl", "--out", w / "out" / "m.json"]),
    "spatialtrust-score-verdicts": ("verdicts.jsonl", True, lambda w, i: [
        "spatialtrust", "score", "--data", w / "st" / "data.jsonl", "--predictions", w / "pred.jsonl", "--judgments",
        w / "verdicts.jsonl", "--out", w / "out" / "m.json"]),
    "spatialtrust-report": ("st_metrics.json", False,
                            lambda w, i: ["spatialtrust", "report", "--metrics", w / "st_metrics.json", "--out", w / "out" / "r"]),
}


def fresh_work(inputs, tmp_path: Path) -> Path:
    folder, _ = inputs
    work = tmp_path / "w"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(folder, work)
    (work / "out").mkdir()
    return work


def reader_test(name: str, examples: int):
    relative, lines, argv = READERS[name]

    @fuzz(examples)
    @given(data=st.data())
    def test(inputs, tmp_path, data):
        work = fresh_work(inputs, tmp_path)
        target = work / relative
        target.write_bytes(data.draw(hostile_json(as_records(target, lines), lines)))
        before = snapshot(work)
        with no_hang():
            result = in_process(eval_main, [str(a) for a in argv(work, inputs[1])])
        ends_well(result)
        unchanged_outside(before, work, work / "out")

    test.__name__ = f"test_hostile_input_to_{name.replace('-', '_')}_is_one_line_or_success"
    return test


# the reports draw charts (about 0.8 s an example): fewer examples there; the view reads the most kinds of file
test_hostile_input_to_spy_metrics = reader_test("spy-metrics", 40)
test_hostile_input_to_spy_report = reader_test("spy-report", 12)
test_hostile_input_to_view = reader_test("view", 40)
test_hostile_input_to_spatialtrust_validate = reader_test("spatialtrust-validate", 40)
test_hostile_input_to_spatialtrust_score_predictions = reader_test("spatialtrust-score-predictions", 20)
test_hostile_input_to_spatialtrust_score_verdicts = reader_test("spatialtrust-score-verdicts", 40)
test_hostile_input_to_spatialtrust_report = reader_test("spatialtrust-report", 12)


@fuzz(40)
@given(data=st.data())
def test_hostile_spy_tune_data_is_refused_by_line_or_read(inputs, tmp_path, data):
    """What training reads (`--train_data_path`), through `data_prep.spy_tune validate`, which lists every bad item."""
    from data_prep.spy_tune import main

    work = fresh_work(inputs, tmp_path)
    target = work / "train_data.json"
    target.write_bytes(data.draw(hostile_json(as_records(target, False), False)))
    before = snapshot(work)
    ends_well(in_process(main, ["validate", str(target), "--images", str(inputs[1])]), many_lines=True)
    unchanged_outside(before, work, work / "out")


@fuzz(40)
@given(data=st.data())
def test_a_hostile_judge_cache_is_refused_by_line_or_read(inputs, tmp_path, data):
    from cli.errors import InputError
    from eval.judge import JudgeClient

    work = fresh_work(inputs, tmp_path)
    target = work / "cache.jsonl"
    target.write_bytes(data.draw(hostile_json(as_records(target, True), True)))
    try:
        judge = JudgeClient("m", cache_path=target)
    except InputError as err:
        assert "\n" not in str(err) and str(err).startswith(str(target))
        return
    for n in range(3):
        assert judge.cached(f"p{n}") is None or isinstance(judge.cached(f"p{n}"), str)


CATEGORIES = Path(__file__).resolve().parents[1] / "data_prep" / "assets" / "categories.yaml"


@fuzz(20)
@given(data=st.data())
def test_a_hostile_category_file_is_refused_by_line_or_read(tmp_path, data):
    """YAML (strict_yaml.parse): the default category file with one hostile value, a key given twice, bad bytes."""
    import yaml

    from cli.errors import InputError
    from data_prep.categories import parse

    document = yaml.safe_load(CATEGORIES.read_text())
    kind = data.draw(st.sampled_from(["value", "value", "duplicate", "bytes"]))
    if kind == "value":
        for _ in range(data.draw(st.integers(1, 3))):
            path = data.draw(st.sampled_from(list(paths_of(document))))
            value = data.draw(HOSTILE)
            document = put(document, path, value)
    text = yaml.safe_dump(document, allow_unicode=False, width=10**9).replace(HUGE, "9" * 5000).encode()
    if kind == "duplicate":
        text = text + text.split(b"\n", 1)[0] + b"\n"
    elif kind == "bytes":
        where = data.draw(st.integers(0, len(text)))
        text = text[:where] + b"\xff" + text[where:]
    target = tmp_path / "categories.yaml"
    target.write_bytes(text)
    try:
        parse(target)
    except InputError as err:
        assert "\n" not in str(err) and str(err).startswith(str(target))


# ---------------------------------------------------------------------------------------------------- the writer
PLANTS = ["link-to-folder", "link-to-file", "loop", "fifo", "file", "folder", "dangling-link"]


def plant(path: Path, kind: str, victim: Path) -> None:
    """Put something hostile at `path` (whatever was there is moved aside)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or os.path.lexists(path):  # a link, a file, a FIFO planted before
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link-to-folder":
        path.symlink_to(victim)
    elif kind == "link-to-file":
        path.symlink_to(victim / "notes.txt")
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "dangling-link":
        path.symlink_to(victim / "missing" / "x")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "file":
        path.write_text("the user's")
    else:
        path.mkdir()
        (path / "keep.txt").write_text("the user's")


def victim_folder(root: Path) -> Path:
    victim = root / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("my notes")
    (victim / "meta.js").write_text("mine")
    (victim / "rows-0001.js").write_text("mine")
    return victim


@pytest.fixture(scope="module")
def built_view(tmp_path_factory, synthetic_dir):
    """A judged run and the viewer built from it once: the tree the writer fuzz plants things in."""
    from data_prep.spy_bench import build_samples

    folder = tmp_path_factory.mktemp("fuzz-view")
    samples = build_samples(synthetic_dir / "questions.json", images_dir=synthetic_dir)[:4]
    write_jsonl(folder / "run.jsonl", [{**s, "response": "r", "eval_resp": "reject", "judge": "rule"}
                                       for s in samples])
    assert eval_main(["view", str(folder / "run.jsonl"), "--images", str(synthetic_dir), "--out",
                      str(folder / "view")]) == 0
    return folder, synthetic_dir


@fuzz(20)
@given(data=st.data())
def test_a_hostile_viewer_folder_is_refused_or_rebuilt_and_nothing_outside_changes(built_view, tmp_path, data):
    folder, images = built_view
    work = tmp_path / "w"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(folder, work, symlinks=True)
    victim = victim_folder(work)
    out = work / "view"
    image = sorted(p.name for p in (out / "img").iterdir())[0]
    names = ["data", "img", "data/meta.js", "data/rows-0000.js", "data/rows-0003.js", "index.html", "viewer.js",
             f"img/{image}", f"img/.{image}.tmp", ".privacy-align-output"]
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(names))
        if not (out / name).parent.is_dir() or (out / name).parent.is_symlink():
            continue
        plant(out / name, data.draw(st.sampled_from(PLANTS + ["link-to-folder", "link-to-file"])), victim)
    before = snapshot(work)
    with no_hang():
        result = in_process(eval_main, ["view", str(work / "run.jsonl"), "--images", str(images), "--out", str(out)])
    ends_well(result)
    unchanged_outside(before, work, out)


@fuzz(25)
@given(data=st.data())
def test_hostile_run_file_and_cache_paths_are_refused_or_written_and_nothing_outside_changes(inputs, tmp_path, data):
    """`spy metrics --out`, run files and judge caches below a claimed folder (as a suite's, a data generator's or a
    training run's): a planted `sub/` link there is refused, never followed."""
    from cli.errors import InputError
    from eval.judge import JudgeClient
    from store import writer
    from store.runs import RunFile

    work = fresh_work(inputs, tmp_path)
    victim = victim_folder(work)
    out = work / "out"
    which = data.draw(st.sampled_from(["metrics", "run-file", "cache"]))
    name = data.draw(st.sampled_from({"metrics": ["m.json"],
                                      "run-file": ["run.jsonl", ".run.jsonl.lock", "sub"],
                                      "cache": ["cache.jsonl", "sub"]}[which]))
    plant(out / name, data.draw(st.sampled_from(PLANTS)), victim)
    before = snapshot(work)
    with no_hang():
        if which == "metrics":
            ends_well(in_process(eval_main, ["spy", "metrics", str(work / "judged.jsonl"), "--out", str(out / "m.json")]))
        else:
            writer.claim_root(out)
            path = out / ("sub/" if name == "sub" else "") / ("run.jsonl" if which == "run-file" else "cache.jsonl")
            try:
                if which == "run-file":
                    run = RunFile(path, header={"step": "fuzz"})
                    try:
                        run.append({"id": "1", "text": "x"})
                        run.finalize(["1"])
                    finally:
                        run.close()
                else:
                    JudgeClient("m", cache_path=path).cache.append({"key": "k", "model": "m", "prompt": "p",
                                                                    "text": "t"})
            except InputError as err:
                assert "\n" not in str(err)
    unchanged_outside(before, work, out)
    for p in out.rglob("*"):  # nothing we wrote became a link or lost its normal permissions
        if p.is_file() and not p.is_symlink() and p.name.endswith((".jsonl", ".json")) and p.stat().st_size:
            assert stat.S_IMODE(p.stat().st_mode) & 0o600 == 0o600
