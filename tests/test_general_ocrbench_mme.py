"""OCRBench and MME: loading local copies with the Hub features, prompts, and the official scores."""

import json

import pytest
from general_fixtures import ocrbench_dataset, save

from cli.errors import InputError
from eval.general import mme, ocrbench, results

HME = ocrbench.HME


# ---------------------------------------------------------------------------------------------------- OCRBench
def test_ocrbench_load_items_request(tmp_path):
    directory = save("ocrbench", tmp_path / "ocr")
    ds = ocrbench.load(str(directory))
    assert ds.features["answer"].feature.dtype == "string"  # Sequence(Value("string")), as on the Hub
    items = ocrbench.items(ds, str(directory))
    assert [i["id"] for i in items] == ["0", "1", "2"]
    assert items[2]["answers"] == ["March 3", "3 March"] and items[1]["dataset"] == "HME100k"
    assert items[0]["prompt"] == ("what is written in the image?\n"
                                  "Please try to answer the question with short words or phrases if possible.")
    request = ocrbench.request(items[0], ds[0])
    assert [p["type"] for p in request["messages"][0]["content"]] == ["image", "text"]
    assert len(request["images"]) == 1


def test_ocrbench_unknown_category_is_an_input_error(tmp_path):
    ds = ocrbench_dataset().map(lambda row: {"question_type": "Poetry"})
    with pytest.raises(InputError, match="row 0: question_type: unknown category 'Poetry'"):
        ocrbench.items(ds, "x")


@pytest.mark.parametrize("category,answers,response,hit", [
    # Handwritten maths: spaces removed on both sides, case kept.
    (HME, ["\\frac { a } { b }"], "$\\frac{a}{b}$", True),
    (HME, ["\\frac { a } { b }"], "\\frac {a}\n{ b }", True),
    (HME, ["\\frac { a } { b }"], "\\FRAC{a}{b}", False),
    (HME, ["x ^ { 2 }"], "X^{2}", False),
    # Everything else: case-insensitive substring.
    ("Regular Text Recognition", ["Hello"], "The word is HELLO.", True),
    ("Regular Text Recognition", ["Hello World"], "hello\nworld", True),
    ("Regular Text Recognition", ["Hello World"], "helloworld", False),
    ("Doc-oriented VQA", ["March 3", "3 March"], "It is 3 march", True),
    ("Doc-oriented VQA", ["March 3"], None, False),
])
def test_ocrbench_item_rules(category, answers, response, hit):
    assert ocrbench.is_hit(category, answers, response) is hit


def test_ocrbench_score_caps_each_category(tmp_path):
    records = [{"id": str(i), "category": "Regular Text Recognition", "answers": ["cat", "CAT"], "response": "cat"}
               for i in range(53)]  # both answers match: still one point per item
    records += [{"id": "h1", "category": HME, "answers": ["a + b"], "response": "a+b"},
                {"id": "h2", "category": HME, "answers": ["a + b"], "response": "A+B"},
                {"id": "k1", "category": "Key Information Extraction", "answers": ["42"], "response": "total: 42"}]
    scored = ocrbench.score(records)
    regular = scored["categories"]["Regular Text Recognition"]
    assert (regular["hits"], regular["score"]) == (53, 50)
    assert scored["over_cap"] == ["Regular Text Recognition"]
    assert scored["groups"] == {"Text Recognition": 50, "Scene Text-centric VQA": 0, "Doc-oriented VQA": 0,
                                "Key Information Extraction": 1, HME: 1}
    assert scored["score"] == 52 and scored["final_score_norm"] == 5.2

    directory = tmp_path / "model-x"
    (path,) = results.write_vlmeval(scored, directory)
    assert path.name == "model-x_OCRBench_score.json"
    data = json.loads(path.read_text())
    assert data["Final Score"] == 52 and data["Final Score Norm"] == 5.2 and data["Text Recognition"] == 50
    assert results.read_result(path, "ocrbench")["value"] == pytest.approx(52)


# ---------------------------------------------------------------------------------------------------- MME
def test_mme_load_items_pair_ids(tmp_path):
    directory = save("mme", tmp_path / "mme")
    ds = mme.load(str(directory))
    items = mme.items(ds, str(directory))
    assert [i["id"] for i in items] == [
        "existence/000000006040.jpg#0", "existence/000000006040.jpg#1",
        "code_reasoning/0020.png#0", "code_reasoning/0020.png#1"]
    assert items[0]["prompt"] == "Is there a train in this image? Please answer yes or no."
    assert [p["type"] for p in mme.request(items[0], ds[0])["messages"][0]["content"]] == ["image", "text"]


@pytest.mark.parametrize("response,vlmevalkit,lmms_eval", [
    ("Yes", "Yes", "Yes"),
    ("yes.", "Yes", "Yes"),
    ("No, there is not.", "No", "No"),
    ("Yes, no doubt.", "Unknown", "Yes"),
    ("Yesterday", "Unknown", "Yes"),
    ("y", "Unknown", "Yes"),
    ("I think no", "No", "Unknown"),
    ("", "Unknown", "Unknown"),
])
def test_mme_answer_extraction(response, vlmevalkit, lmms_eval):
    assert mme.extract_vlmevalkit(response) == vlmevalkit
    assert mme.extract_lmms_eval(response) == lmms_eval


def mme_record(qid, category, answer, response, k):
    return {"id": f"{qid}#{k}", "question_id": qid, "category": category, "answer": answer, "response": response}


def test_mme_acc_counts_a_half_right_image_acc_plus_does_not(tmp_path):
    records = [
        mme_record("existence/1.jpg", "existence", "Yes", "Yes", 0),
        mme_record("existence/1.jpg", "existence", "No", "No.", 1),
        mme_record("existence/2.jpg", "existence", "Yes", "Yes", 0),
        mme_record("existence/2.jpg", "existence", "No", "Yes", 1),  # the one wrong answer
        mme_record("code_reasoning/1.png", "code_reasoning", "Yes", "yes, it is", 0),
        mme_record("code_reasoning/1.png", "code_reasoning", "No", "garbage %%", 1),
    ]
    scored = mme.score(records)
    existence = scored["subtasks"]["existence"]
    assert (existence["acc"], existence["acc_plus"], existence["score"]) == (75.0, 50.0, 125.0)
    assert scored["subtasks"]["code_reasoning"]["score"] == 50.0  # acc 50 + acc+ 0
    assert (scored["perception"], scored["cognition"], scored["score"]) == (125.0, 50.0, 175.0)
    assert scored["n_unknown"] == 1 and scored["images_without_two_questions"] == []
    assert "color" in scored["missing_subtasks"]

    paths = results.write_vlmeval(scored, tmp_path / "m")
    assert [p.name for p in paths] == ["m_MME_score.csv", "m_MME_exact_matching_score.csv"]
    lines = paths[1].read_text().splitlines()
    assert lines == ['"perception","reasoning","existence","code_reasoning"', '"125.0","50.0","125.0","50.0"']
    # The SPY reference: exactly 2 lines, (field 0 + field 1) / 28.
    fields = lines[1].replace('"', "").split(",")
    assert (float(fields[0]) + float(fields[1])) / 28 == pytest.approx(175 / 28)
    assert results.read_result(paths[0], "mme")["parts"] == {"perception": 125.0, "cognition": 50.0}


def test_garbage_answers_score_zero_everywhere():
    from eval.general import mmmu

    garbage = ["", None, "%%%% lorem ipsum", "\u0000\u00ff<|im_end|>", "qqqq " * 50]
    mme_records = [mme_record(f"color/{i}.jpg", "color", a, g, k) for i, g in enumerate(garbage)
                   for k, a in enumerate(("Yes", "No"))]
    assert mme.score(mme_records)["score"] == 0
    ocr_records = [{"id": str(i), "category": HME, "answers": ["x^{2}"], "response": g} for i, g in enumerate(garbage)]
    assert ocrbench.score(ocr_records)["score"] == 0
    mmmu_records = [{"id": str(i), "split": "validation", "subject": "Art", "question_type": "multiple-choice",
                     "answer": "B", "options": ["red", "green"], "response": g} for i, g in enumerate(garbage)]
    assert mmmu.score(mmmu_records, "vlmevalkit")["score"] == 0
