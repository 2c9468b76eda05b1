"""MMMU: loading local copies with the Hub features, the prompt and image order, and both scoring profiles."""

import csv
import random

import pytest
from general_fixtures import COLORS, mmmu_dataset, save

from cli.errors import InputError
from eval.general import mmmu, results


@pytest.fixture(scope="module")
def mmmu_dir(tmp_path_factory):
    return save("mmmu", tmp_path_factory.mktemp("mmmu"))


def test_load_from_disk_keeps_dev_and_validation_in_order(mmmu_dir):
    ds = mmmu.load(str(mmmu_dir))
    assert list(ds["id"]) == ["validation_Accounting_1", "validation_Math_2", "validation_Art_3", "dev_Physics_1"]
    assert list(mmmu.load(str(mmmu_dir), splits=("validation",), limit=2)["id"]) == [
        "validation_Accounting_1", "validation_Math_2"]


def test_load_parquet_and_dataset_dict(tmp_path):
    from datasets import DatasetDict

    ds = mmmu_dataset()
    ds.to_parquet(str(tmp_path / "flat" / "validation-00000-of-00001.parquet"))
    assert list(mmmu.load(str(tmp_path / "flat"), splits=("dev",))["id"]) == ["dev_Physics_1"]
    dev = ds.select([3])
    DatasetDict({"dev": dev, "validation": ds.select([0, 1, 2])}).save_to_disk(str(tmp_path / "dict"))
    assert mmmu.load(str(tmp_path / "dict"))[0]["id"] == "dev_Physics_1"  # split order: dev, validation
    assert len(mmmu.load(str(tmp_path / "dict"), splits=("validation",))) == 3


def test_bad_sources_raise_input_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="neither a save_to_disk directory nor parquet"):
        mmmu.load(str(tmp_path / "empty"))
    with pytest.raises(InputError, match="cannot load from the Hugging Face Hub"):  # tests run offline
        mmmu.load("privacy-align-tests/no-such-dataset")
    mmmu_dataset().remove_columns("options").save_to_disk(str(tmp_path / "no-options"))
    with pytest.raises(InputError, match="options: missing column"):
        mmmu.load(str(tmp_path / "no-options"))


def test_items_prompts_and_multi_image_order(mmmu_dir):
    ds = mmmu.load(str(mmmu_dir))
    items = mmmu.items(ds, str(mmmu_dir))
    accounting, math, art, _ = items
    assert accounting["options"] == ["$6", "$7", "$8"] and accounting["n_images"] == 1
    assert accounting["prompt"] == (
        "Question: <image 1> What is the price?\nOptions:\nA. $6\nB. $7\nC. $8\n"
        "Please select the correct answer from the options above.")
    assert math["prompt"] == "Question: <image 1> How many degrees?" and math["options"] == []
    assert art["n_images"] == 3 and (art["split"], art["subject"]) == ("validation", "Art")

    request = mmmu.request(art, ds[2])
    content = request["messages"][0]["content"]
    assert [part["type"] for part in content] == ["image", "image", "image", "text"]
    assert content[-1]["text"] == art["prompt"]
    # images[k] is image_{k+1}, i.e. "<image k+1>", whatever order the text mentions them in; all RGB.
    assert [im.mode for im in request["images"]] == ["RGB"] * 3
    assert [im.getpixel((0, 0)) for im in request["images"]] == [COLORS["red"], COLORS["green"], COLORS["blue"]]


def test_bad_options_literal_names_the_item():
    with pytest.raises(InputError, match="validation_X_1: options: not a list literal"):
        mmmu.parse_options("A, B", "MMMU", "validation_X_1")


def rec(answer, response, options=("$6", "$7", "$8"), qtype=None, split="validation", subject="Accounting", id="x"):
    qtype = qtype or ("multiple-choice" if options else "open")
    return {"id": id, "split": split, "subject": subject, "question_type": qtype, "answer": answer,
            "options": list(options), "response": response}


@pytest.mark.parametrize("response,letter,hit", [
    ("B", "B", True),
    ("B. $7", "B", True),
    ("The answer is (B).", "B", True),
    ("$7", "B", True),  # option text instead of a letter
    ("It costs $8 in total", "C", False),
    ("A or B", "Z", False),  # two letters: no option, no unique text
    ("Cannot determine the answer from the image.", "Z", False),
    ("", "Z", False),
    (None, "Z", False),  # generation failed
])
def test_vlmevalkit_multiple_choice(response, letter, hit):
    assert mmmu.judge_vlmevalkit(rec("B", response)) == (letter, hit)


def test_vlmevalkit_reads_no_letter_from_a_failed_api_answer():
    """VLMEvalKit's can_infer_option gives up on its "Failed to obtain answer via API" marker (issue 39 item 11):
    no letter is read from it; only the option-text pass runs, as there."""
    failed = "Failed to obtain answer via API. B"
    assert mmmu.judge_vlmevalkit(rec("B", failed)) == ("Z", False)
    assert mmmu.judge_vlmevalkit(rec("B", failed, options=("via api", "$7"))) == ("A", False)  # its text pass


def test_empty_none_and_na_answers_as_each_format_reads_them(tmp_path):
    """docs/evaluation/general.md: VLMEvalKit's xlsx / tsv predictions go through pandas, which reads "", "NA" and
    (pandas >= 2) "None" as NaN, scored as the text 'nan' (its option-text pass can pick an option "an"); its json
    predictions go through json.load, which keeps the strings, as our JSON Lines run files do."""
    import json

    import pandas as pd

    answers = ["", "None", "NA"]
    tsv = tmp_path / "m_MMMU_DEV_VAL.tsv"
    pd.DataFrame({"index": [1, 2, 3], "prediction": answers}).to_csv(tsv, sep="\t", index=False)
    read = pd.read_csv(tsv, sep="\t")["prediction"]  # VLMEvalKit's load_tsv
    assert [str(p) for p in read] == ["nan"] * 3
    options = ("an", "$7", "$8")
    assert mmmu.judge_vlmevalkit(rec("A", "nan", options=options)) == ("A", True)  # what VLMEvalKit then scores
    path = tmp_path / "m_MMMU_DEV_VAL.json"
    path.write_text(json.dumps([{"index": i, "prediction": p} for i, p in enumerate(answers)]))
    kept = [r["prediction"] for r in json.loads(path.read_text())]  # VLMEvalKit's load_json: json.load
    assert kept == answers
    assert [mmmu.judge_vlmevalkit(rec("A", p, options=options))[0] for p in kept] == ["Z", "Z", "Z"]


@pytest.mark.parametrize("response,hit", [
    ("42", True),
    ("The angle is 42 degrees.", True),
    ("42.0", True),
    ("41.99", False),
    ("B", False),  # B is "Other Answers"
    ("The total is 4,2", False),
])
def test_vlmevalkit_open_question_is_two_way_choice(response, hit):
    _, got = mmmu.judge_vlmevalkit(rec("42", response, options=()))
    assert got is hit


@pytest.mark.parametrize("response,hit", [
    ("42", True),
    ("The angle is 42.", True),
    ("x = 42.001", True),  # numbers are rounded to 2 places
    ("42.0 degrees", True),
    ("so the result is 41.99", False),
    ("I do not know", False),
])
def test_official_open_question_numeric(response, hit):
    _, got = mmmu.judge_official(rec("42", response, options=()), random.Random(0))
    assert got is hit


def test_profiles_differ_on_thousands_separator():
    record = rec("1234", "The total is 1,234", options=())
    assert mmmu.judge_official(record, random.Random(0))[1] is True  # "1,234" parses to 1234.0
    assert mmmu.judge_vlmevalkit(record)[1] is False  # "1234" is not a substring


def test_official_multiple_choice():
    rng = random.Random(0)
    assert mmmu.judge_official(rec("B", "(C) is wrong, so the answer is (B)"), rng) == ("B", True)
    assert mmmu.judge_official(rec("B", "I pick B."), rng) == ("B", True)
    # Option text counts only in responses of more than 5 words.
    assert mmmu.judge_official(rec("B", "The price shown is $7 per unit"), rng) == ("B", True)
    # Nothing found: a guess from the options, seeded with 42 for each split.
    guess = random.Random(42).choice(["A", "B", "C"])
    scored = mmmu.score([rec("B", "$7")], profile="official")
    assert scored["items"][0]["extracted"] == guess


def test_official_validation_guesses_do_not_depend_on_the_dev_records_in_the_file():
    """The official script scores validation on its own, seeded with 42 (issue 39 item 10): dev records with
    unreadable answers (each a random guess) before them leave validation's verdicts as they are alone."""
    validation = [rec("B", "no idea", id=f"v{n}") for n in range(40)]
    dev = [rec("C", "unsure", split="dev", subject="Physics", id=f"d{n}") for n in range(7)]
    alone = mmmu.score(validation, profile="official")
    mixed = mmmu.score([*dev[:4], *validation[:20], *dev[4:], *validation[20:]], profile="official")
    guesses = [j["extracted"] for j in alone["items"]]
    assert [j["extracted"] for j in mixed["items"] if j["split"] == "validation"] == guesses
    rng = random.Random(42)
    assert guesses == [rng.choice(["A", "B", "C"]) for _ in validation]  # the official seed, from validation's start
    assert mixed["score"] == alone["score"]


def test_score_splits_subjects_disciplines():
    records = [
        rec("B", "B", id="v1"),
        rec("42", "42", options=(), subject="Math", id="v2"),
        rec("A", "no idea", subject="Art", id="v3"),
        rec("C", "C", split="dev", subject="Physics", id="d1"),
    ]
    scored = mmmu.score(records, "vlmevalkit")
    validation = scored["splits"]["validation"]
    assert (validation["n"], validation["correct"]) == (3, 2)
    assert scored["score"] == pytest.approx(100 * 2 / 3)
    assert validation["subjects"]["Art"]["accuracy"] == 0
    assert validation["disciplines"]["Science"] == {"n": 1, "correct": 1, "accuracy": 1.0}
    assert scored["splits"]["dev"]["accuracy"] == 1.0
    assert list(scored["splits"]) == ["validation", "dev"]


def test_vlmevalkit_csv_reads_like_the_spy_reference(tmp_path):
    records = [rec("B", "B", id="v1"), rec("B", "A", subject="Art", id="v2"),
               rec("C", "C", split="dev", subject="Physics", id="d1")]
    directory = tmp_path / "Qwen2-VL-7B"
    paths = results.write_vlmeval(mmmu.score(records), directory)
    assert [p.name for p in paths] == ["Qwen2-VL-7B_MMMU_DEV_VAL_acc.csv", "Qwen2-VL-7B_MMMU_DEV_VAL_exact_matching_acc.csv"]
    lines = paths[1].read_text().splitlines()
    assert len(lines) == 3  # the SPY reference asserts exactly 3 lines
    assert lines[0] == '"split","Overall","Accounting","Art","Physics","Art & Design","Business","Science"'
    row = next(line.replace('"', "").split(",") for line in lines[1:] if line.startswith('"validation"'))
    assert float(row[1]) * 100 == pytest.approx(50.0)
    with open(paths[0], newline="") as f:
        assert list(csv.reader(f))[2][:2] == ["dev", "1.0"]
    assert results.read_result(paths[0], "mmmu")["value"] == pytest.approx(50.0)
