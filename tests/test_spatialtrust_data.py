"""SpatialTrust data: the validator names file, line and field; the synthetic generator writes valid data."""

import copy
import json

import pytest
from PIL import Image

from cli.errors import InputError
from eval.spatialtrust import data


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return data.build_synthetic(tmp_path_factory.mktemp("st"), n_images=8, width=240, height=160)


def test_synthetic_dataset_is_valid_and_covers_every_kind(synthetic):
    records = data.load(synthetic, check_images=True)
    assert len(records) == 8
    s = data.summary(records)
    assert s["qa_items"] == 40 and s["with_none"] == 2 and s["with_direct"] >= 4 and s["with_indirect"] >= 4
    assert s["with_both"] >= 2 and s["type_short"] == 16
    for r in records:
        assert [q["qid"] for q in r["questions"]] == list(data.QIDS)
        with Image.open(r["image_path"]) as im:
            assert im.size == (r["width"], r["height"]) == (240, 160)
        q1, q2, q3, q4, q5 = r["questions"]
        assert q1["answer"] == (["A"] if q4["evidence"] or q5["evidence"] else ["B"])
        # q2 boxes and q4 boxes are the same objects
        assert sorted(map(tuple, (e["box"] for e in q2["evidence"]))) == sorted(
            map(tuple, (e["box"] for e in q4["evidence"])))
        assert len(q3["evidence"]) == len(q5["evidence"])
        if not q2["evidence"]:
            assert q2["options"][q2["answer"][0]] == "None of the above"


def test_synthetic_objects_are_drawn_where_their_boxes_say(synthetic):
    # a factor changes pixels inside its box, against the plain wall colour around it
    for r in data.load(synthetic):
        with Image.open(r["image_path"]) as im:
            for q in r["questions"][1:3]:
                for ev in q["evidence"]:
                    x1, y1, x2, y2 = ev["box"]
                    inside = im.crop((x1, y1, x2, y2)).getcolors(maxcolors=10_000)
                    assert len(inside) >= 2, (r["image_id"], ev)


def test_synthetic_is_deterministic(tmp_path):
    a = data.build_synthetic(tmp_path / "a", n_images=4, width=120, height=80, seed=3)
    b = data.build_synthetic(tmp_path / "b", n_images=4, width=120, height=80, seed=3)
    assert a.read_text() == b.read_text()
    assert (a.parent / "images/st_00002.png").read_bytes() == (b.parent / "images/st_00002.png").read_bytes()


def _write(tmp_path, records, extra_lines=()):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def _q(record, qid):
    return next(q for q in record["questions"] if q["qid"] == qid)


def _with_direct(records):
    return next(r for r in records if _q(r, "q2")["evidence"])


BAD = {
    "box outside the image": (lambda r: _q(r, "q2")["evidence"][0].update(box=[0, 0, 10_000, 10]),
                              "questions.q2.evidence[0].box"),
    "x1 >= x2": (lambda r: _q(r, "q4")["evidence"][0].update(box=[50, 10, 40, 20]), "questions.q4.evidence[0].box"),
    "box of three numbers": (lambda r: _q(r, "q2")["evidence"][0].update(box=[1, 2, 3]),
                             "questions.q2.evidence[0].box"),
    "answer not an option": (lambda r: _q(r, "q2").update(answer=["Z"]), "questions.q2.answer"),
    "exclusive option combined": (lambda r: _q(r, "q2").update(answer=["A", "D"], type="multi"),
                                  "questions.q2.answer"),
    "two answers to a single choice": (lambda r: _q(r, "q1").update(answer=["A", "B"]), "questions.q1.answer"),
    "evidence for an unchosen option": (lambda r: _q(r, "q2")["evidence"][0].update(
        option=next(k for k in "ABC" if k not in _q(r, "q2")["answer"])),
                                        "questions.q2.evidence[0].option"),
    "q5 missing": (lambda r: r["questions"].pop(), "questions"),
    "unknown qid": (lambda r: r["questions"][4].update(qid="q9"), "questions"),
    "free answer not text": (lambda r: _q(r, "q4").update(answer=["A"]), "questions.q4.answer"),
    "factor without name": (lambda r: _q(r, "q4")["evidence"][0].pop("factor"), "questions.q4.evidence[0].factor"),
    "wrong type": (lambda r: _q(r, "q4").update(type="single"), "questions.q4.type"),
    "no width": (lambda r: r.pop("width"), "width"),
    # issue 39 item 7: answers that are not option keys were a TypeError (unhashable), not one line
    "answer of objects": (lambda r: _q(r, "q2").update(answer=[{"a": 2}]), "questions.q2.answer"),
    "answer of lists": (lambda r: _q(r, "q1").update(answer=[["B"]]), "questions.q1.answer"),
    "coordinate past a float": (lambda r: _q(r, "q2")["evidence"][0].update(box=[0, 0, 10**400, 10]),
                                "questions.q2.evidence[0].box"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_record_names_file_line_and_field(tmp_path, synthetic, case):
    records = [json.loads(line) for line in synthetic.read_text().splitlines()]
    bad = copy.deepcopy(_with_direct(records))
    BAD[case][0](bad)
    path = _write(tmp_path, [records[0], bad])
    with pytest.raises(InputError) as err:
        data.load(path)
    assert str(err.value).startswith(f"{path}:2: {BAD[case][1]}: ")


def test_duplicate_ids_bad_json_and_missing_images(tmp_path, synthetic):
    records = [json.loads(line) for line in synthetic.read_text().splitlines()]
    with pytest.raises(InputError, match=r"bad.jsonl:2: image_id: duplicate"):
        data.load(_write(tmp_path, [records[0], records[0]]))
    with pytest.raises(InputError, match=r"bad.jsonl:2: not valid JSON"):
        data.load(_write(tmp_path, [records[0]], ["{oops"]))
    path = _write(tmp_path, [records[0]])  # images/ is not next to this copy
    assert data.load(path)[0]["image_path"] == str(tmp_path / records[0]["image"])
    with pytest.raises(InputError, match=r"bad.jsonl:1: image: image not found"):
        data.load(path, check_images=True)
    assert data.load(path, image_root=synthetic.parent, check_images=True)


def test_normalise_box_rejects_boxes_outside_the_image_and_clips_only_when_asked():
    assert data.normalise_box([0, 5, 100, 60], 100, 60) == [0.0, 5.0, 100.0, 60.0]  # the border is inside
    assert data.normalise_box([-3, 5, 103, 50], 100, 60) is None  # the spec: not inside the image = malformed
    assert data.normalise_box([-3, 5, 103, 50], 100, 60, clip=True) == [0.0, 5.0, 100.0, 50.0]
    for bad in ([1, 2, 3], [5, 5, 5, 9], [200, 0, 300, 10], ["1", 2, 3, 4], [0, 0, float("nan"), 4], None, [True, 0, 3, 4]):
        assert data.normalise_box(bad, 100, 60) is None
        assert data.normalise_box(bad, 100, 60, clip=True) is None
