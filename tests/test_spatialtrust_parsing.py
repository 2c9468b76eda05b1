"""Model output -> predictions: options normalised, exclusive option handled, boxes validated, never a crash."""

import json
import random

import pytest

from eval.spatialtrust.data import synthetic_record
from eval.spatialtrust.parsing import extract_json, option_key, parse_box_list, parse_choices, parse_one_pass

OPTIONS = {"A": "A second person looking at the camera or screen", "B": "A phone or camera aimed at the scene",
           "C": "A surveillance camera facing the user", "D": "None of the above"}


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    return synthetic_record(1, random.Random(0), 200, 100, tmp_path_factory.mktemp("img"))


def test_extract_json_from_fences_prose_and_trailing_commas():
    assert extract_json('```json\n{"q1": "A",}\n```') == {"q1": "A"}
    assert extract_json('Sure! Here it is: {"q1": "B"} hope this helps') == {"q1": "B"}
    # a first object without the wanted keys loses to a later one with them
    assert extract_json('{"note": 1} then {"q1": "A"}', keys=("q1",)) == {"q1": "A"}
    for garbage in ("", "no json here", "{{{", '{"q1": ', None, 17, "ĠtheĠ{ ] }"):
        assert extract_json(garbage) is None


@pytest.mark.parametrize("token,key", [
    ("B", "B"), ("b", "B"), ("(B)", "B"), ("B.", "B"), ("B) A phone or camera aimed at the scene", "B"),
    ("Option C", "C"), ("a phone or camera aimed at the scene", "B"), ("None of the above.", "D"),
    ("E", None), ("phone", None), (3, None), ("", None),
])
def test_option_key(token, key):
    assert option_key(token, OPTIONS) == key


def test_parse_choices_normalises_and_keeps_option_order():
    assert parse_choices(["C", "a"], OPTIONS, single=False) == (["A", "C"], None)
    assert parse_choices("A, C", OPTIONS, single=False) == (["A", "C"], None)
    assert parse_choices("A and C", OPTIONS, single=False) == (["A", "C"], None)
    assert parse_choices({"choices": ["B"]}, OPTIONS, single=False) == (["B"], None)
    assert parse_choices("Yes", {"A": "Yes", "B": "No"}, single=True) == (["A"], None)


@pytest.mark.parametrize("value,reason", [
    (["A", "D"], "exclusive option 'D' was combined"), ("A, None of the above", "exclusive option"),
    ([], "no option chosen"), (["A", "Q"], "not an option"), (None, "not an option"), ({"x": 1}, "not an option"),
])
def test_parse_choices_rejects(value, reason):
    keys, error = parse_choices(value, OPTIONS, single=False)
    assert keys == [] and reason in error


def test_single_choice_takes_one_option():
    assert parse_choices(["A", "B"], {"A": "Yes", "B": "No"}, single=True)[1] == "one option expected, got ['A', 'B']"


def test_boxes_validated_kept_as_written_and_scaled():
    assert parse_box_list([10, 10, 50, 60], 200, 100) == [[10.0, 10.0, 50.0, 60.0]]  # one bare box
    assert parse_box_list([[10, 10, 50, 60], [5, 5], "(1,2),(30,40)", [9, 9, 1, 1]], 200, 100) == [
        [10.0, 10.0, 50.0, 60.0], None, [1.0, 2.0, 30.0, 40.0], None]
    # reaching outside the image: kept as written, for the scorer to count as malformed (or clip, if asked)
    assert parse_box_list([[190, 90, 210, 120]], 200, 100) == [[190.0, 90.0, 210.0, 120.0]]
    assert parse_box_list([[500, 500, 1000, 1000]], 200, 100, box_scale="1000") == [[100.0, 50.0, 200.0, 100.0]]
    assert parse_box_list("nonsense", 200, 100) == [None]
    assert parse_box_list(None, 200, 100) == []


def test_parse_one_pass_full_answer(record):
    answer = {"q1": "A", "q2": {"choices": ["A", "B"], "boxes": {"A": [[1, 2, 30, 40]], "b": [5, 5, 20, 20]}},
              "q3": {"choices": "None of the above", "boxes": {}},
              "q4": {"text": "A person behind the user.", "boxes": [[1, 2, 30, 40], [0, 0, 0, 0]]},
              "q5": "Nothing indirect is visible."}
    p = parse_one_pass("Answer:\n```json\n" + json.dumps(answer) + "\n```", record)
    assert p == {"image_id": record["image_id"], "q1": {"choices": ["A"]},
                 "q2": {"choices": ["A", "B"], "boxes": {"A": [[1.0, 2.0, 30.0, 40.0]], "B": [[5.0, 5.0, 20.0, 20.0]]}},
                 "q3": {"choices": ["D"], "boxes": {}},
                 "q4": {"text": "A person behind the user.", "boxes": [[1.0, 2.0, 30.0, 40.0], None]},
                 "q5": {"text": "Nothing indirect is visible.", "boxes": []}}


def test_parse_one_pass_records_what_it_cannot_read(record):
    p = parse_one_pass('{"q1": "maybe", "q2": ["A", "D"], "q4": 5}', record)
    assert p["q1"] == {"choices": [], "error": "not an option: 'maybe'"}
    assert p["q2"]["choices"] == [] and "exclusive" in p["q2"]["error"]
    assert p["q3"]["error"] == "no q3 in the answer"
    assert p["q4"] == {"text": "", "boxes": [], "error": "expected text, got int"}
    for garbage in ("", "<|im_end|> ĠĠthe the {", None, "[1, 2, 3]", '{"q1": {"choices": [[1]]}}'):
        p = parse_one_pass(garbage, record)
        assert all(p[q].get("error") for q in ("q1", "q2", "q3", "q4", "q5")), (garbage, p)
