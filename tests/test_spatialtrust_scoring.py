"""SpatialTrust scoring on hand-computed cases (../shared/specs/spatialtrust.md, "Scoring")."""

import pytest

from eval.spatialtrust.data import iou
from eval.spatialtrust.scoring import compute_metrics, score_choice_set, score_free, score_q1

W = H = 100
DIRECT = {"A": "A second person looking at the camera or screen", "B": "A phone or camera aimed at the scene",
          "C": "A surveillance camera facing the user", "D": "None of the above"}


def choice_q(answer, evidence, qid="q2"):
    return {"qid": qid, "type": "multi", "text": "?", "options": DIRECT, "answer": answer, "evidence": evidence}


def free_q(evidence, qid="q4"):
    return {"qid": qid, "type": "short", "text": "?", "answer": "...", "evidence": evidence}


def verdict(factors=(), unsupported=False, states_absence=False):
    return {"unsupported": unsupported, "states_absence": states_absence,
            "factors": [{"identified": a, "explanation_correct": e, "box_index": i} for a, e, i in factors]}


def test_iou_is_continuous_without_plus_one():
    assert iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert iou([0, 0, 10, 10], [10, 0, 20, 10]) == 0.0  # touching edges share no area


def test_q1_exact_match():
    q = {"qid": "q1", "options": {"A": "Yes", "B": "No"}, "answer": ["A"], "evidence": []}
    assert score_q1(q, {"choices": ["A"]}) == 1.0
    assert score_q1(q, {"choices": ["B"]}) == 0.0
    assert score_q1(q, {"choices": ["A", "B"]}) == 0.0
    assert score_q1(q, {"choices": [], "error": "no JSON object"}) == 0.0
    assert score_q1(q, None) == 0.0


def test_q1_compares_the_normalised_chosen_option():
    # spec "Scoring": q1 is an exact match of the *normalised* option, as the parser normalises answers
    q = {"qid": "q1", "options": {"A": "Yes", "B": "No"}, "answer": ["A"], "evidence": []}
    for same in (["a"], [" A "], ["(A)"], ["Yes"], ["yes."]):
        assert score_q1(q, {"choices": same}) == 1.0, same
    for other in (["b"], ["No"], ["Z"], ["a", "b"], [""]):
        assert score_q1(q, {"choices": other}) == 0.0, other


def test_a_box_outside_the_image_is_malformed_unless_clipping_is_asked_for():
    q = choice_q(["A"], [{"option": "A", "box": [90, 90, 100, 100]}])
    overshoot = {"choices": ["A"], "boxes": {"A": [[90, 90, 101, 100]]}}  # one pixel past the border
    assert score_choice_set(q, overshoot, W, H) == (0.0, 1)
    assert score_choice_set(q, overshoot, W, H, clip=True) == (1.0, 0)
    inside = {"choices": ["A"], "boxes": {"A": [[90, 90, 100, 100]]}}  # touching the border is inside
    assert score_choice_set(q, inside, W, H) == (1.0, 0)
    fq = free_q([{"factor": "second person", "box": [0, 0, 10, 10]}])
    pred = {"text": "a person", "boxes": [[-1, 0, 10, 10]]}
    assert score_free(fq, pred, verdict([(True, True, 0)]), W, H) == (0.0, 1)
    assert score_free(fq, pred, verdict([(True, True, 0)]), W, H, clip=True) == (1.0, 0)


def test_an_extra_wrong_option_zeroes_the_question():
    q = choice_q(["A", "B"], [{"option": "A", "box": [0, 0, 10, 10]}, {"option": "B", "box": [50, 50, 70, 70]}])
    perfect_boxes = {"A": [[0, 0, 10, 10]], "B": [[50, 50, 70, 70]]}
    assert score_choice_set(q, {"choices": ["A", "B"], "boxes": perfect_boxes}, W, H)[0] == 1.0
    assert score_choice_set(q, {"choices": ["A", "B", "C"], "boxes": perfect_boxes}, W, H)[0] == 0.0
    # a subset scores per ground-truth option: one of two found and grounded = 1/2
    assert score_choice_set(q, {"choices": ["A"], "boxes": perfect_boxes}, W, H)[0] == 0.5


def test_none_of_the_above_scores_without_boxes():
    q = choice_q(["D"], [])
    assert score_choice_set(q, {"choices": ["D"], "boxes": {}}, W, H)[0] == 1.0
    assert score_choice_set(q, {"choices": ["D"]}, W, H)[0] == 1.0
    assert score_choice_set(q, {"choices": ["A"], "boxes": {"A": [[0, 0, 10, 10]]}}, W, H)[0] == 0.0


def test_max_iou_over_several_boxes_without_one_to_one_matching():
    q = choice_q(["A"], [{"option": "A", "box": [0, 0, 10, 10]}, {"option": "A", "box": [20, 20, 30, 30]}])
    # the second predicted box matches the second ground-truth box exactly; the first matches nothing
    assert score_choice_set(q, {"choices": ["A"], "boxes": {"A": [[60, 60, 70, 70], [20, 20, 30, 30]]}}, W, H)[0] == 1
    assert score_choice_set(q, {"choices": ["A"], "boxes": {"A": [[60, 60, 70, 70], [0, 0, 4, 4]]}}, W, H)[0] == 0


def test_iou_exactly_at_the_threshold_counts():
    q = choice_q(["A"], [{"option": "A", "box": [0, 0, 10, 10]}])
    assert iou([0, 0, 10, 5], [0, 0, 10, 10]) == 0.5
    assert score_choice_set(q, {"choices": ["A"], "boxes": {"A": [[0, 0, 10, 5]]}}, W, H)[0] == 1.0
    assert score_choice_set(q, {"choices": ["A"], "boxes": {"A": [[0, 0, 10, 4.9]]}}, W, H)[0] == 0.0


def test_a_missing_or_malformed_box_scores_zero_for_that_option():
    q = choice_q(["A", "B"], [{"option": "A", "box": [0, 0, 10, 10]}, {"option": "B", "box": [50, 50, 70, 70]}])
    pred = {"choices": ["A", "B"], "boxes": {"A": [[0, 0, 10, 10]], "B": [[70, 70, 50, 50]]}}
    assert score_choice_set(q, pred, W, H) == (0.5, 1)  # B's box has x1 > x2: malformed, counted
    assert score_choice_set(q, {"choices": ["A", "B"], "boxes": {"A": [[0, 0, 10, 10]]}}, W, H) == (0.5, 0)


def test_q4_with_an_unsupported_claim_scores_zero():
    q = free_q([{"factor": "second person", "box": [0, 0, 10, 10]}])
    pred = {"text": "A second person ... and a camera on the wall.", "boxes": [[0, 0, 10, 10], [80, 0, 90, 10]]}
    assert score_free(q, pred, verdict([(True, True, 0)]), W, H)[0] == 1.0
    assert score_free(q, pred, verdict([(True, True, 0)], unsupported=True), W, H)[0] == 0.0


def test_q4_averages_identified_explained_and_grounded_factors():
    q = free_q([{"factor": "second person", "box": [0, 0, 10, 10]}, {"factor": "phone", "box": [50, 50, 60, 60]},
                {"factor": "camera", "box": [80, 0, 90, 10]}, {"factor": "watcher 2", "box": [20, 20, 30, 30]}])
    pred = {"text": "...", "boxes": [[0, 0, 10, 10], [50, 50, 60, 60], [80, 0, 90, 10], [20, 20, 30, 30]]}
    # factor 0 fully right; factor 1 explanation wrong; factor 2 box points at factor 0's box; factor 3 not found
    v = verdict([(True, True, 0), (True, False, 1), (True, True, 0), (False, False, None)])
    assert score_free(q, pred, v, W, H)[0] == 0.25


def test_q4_a_missing_box_gives_r_zero():
    q = free_q([{"factor": "second person", "box": [0, 0, 10, 10]}, {"factor": "phone", "box": [50, 50, 60, 60]}])
    pred = {"text": "...", "boxes": [[0, 0, 10, 10], None]}
    assert score_free(q, pred, verdict([(True, True, 0), (True, True, None)]), W, H)[0] == 0.5  # no box given
    assert score_free(q, pred, verdict([(True, True, 0), (True, True, 5)]), W, H)[0] == 0.5  # index past the list
    assert score_free(q, pred, verdict([(True, True, 0), (True, True, 1)]), W, H) == (0.5, 1)  # malformed box


def test_n_zero_needs_a_clear_absence_statement_and_no_box():
    q = free_q([])
    no_box = {"text": "No direct sensitive factor is visible.", "boxes": []}
    assert score_free(q, no_box, verdict(states_absence=True), W, H)[0] == 1.0
    assert score_free(q, no_box, verdict(states_absence=False), W, H)[0] == 0.0
    with_box = {"text": "No direct sensitive factor is visible.", "boxes": [[0, 0, 10, 10]]}
    assert score_free(q, with_box, verdict(states_absence=True), W, H)[0] == 0.0
    assert score_free(q, no_box, verdict(states_absence=True, unsupported=True), W, H)[0] == 0.0


def test_free_text_without_verdict_or_unparsable_scores_zero():
    q = free_q([])
    assert score_free(q, {"text": "none", "boxes": []}, None, W, H)[0] == 0.0
    assert score_free(q, {"text": "", "boxes": [], "error": "unparsable"}, verdict(states_absence=True), W, H)[0] == 0


def test_compute_metrics_percentages_overall_and_counts():
    record = {"image_id": "a", "width": W, "height": H, "questions": [
        {"qid": "q1", "options": {"A": "Yes", "B": "No"}, "answer": ["A"], "evidence": []},
        choice_q(["A"], [{"option": "A", "box": [0, 0, 10, 10]}], "q2"),
        choice_q(["D"], [], "q3"),
        free_q([{"factor": "second person", "box": [0, 0, 10, 10]}], "q4"),
        free_q([], "q5"),
    ]}
    empty = {**record, "image_id": "b"}
    prediction = {"image_id": "a", "q1": {"choices": ["A"]}, "q2": {"choices": ["A"], "boxes": {"A": [[0, 0, 10, 10]]}},
                  "q3": {"choices": ["A", "D"], "boxes": {}, "error": "exclusive option combined"},
                  "q4": {"text": "a person", "boxes": [[0, 0, 10, 10]]},
                  "q5": {"text": "nothing indirect", "boxes": []}}
    judgments = [{"image_id": "a", "qid": "q4", **verdict([(True, True, 0)])},
                 {"image_id": "a", "qid": "q5", **verdict(states_absence=True)}]
    metrics = compute_metrics([record, empty], [prediction], judgments)
    # image a: 1, 1, 0, 1, 1; image b has no prediction: all 0
    assert metrics == {"q1": 50.0, "q2": 50.0, "q3": 0.0, "q4": 50.0, "q5": 50.0, "overall": 40.0, "n_images": 2,
                       "unparsable": {"q1": 1, "q2": 1, "q3": 2, "q4": 1, "q5": 1},
                       "malformed_boxes": {"q2": 0, "q3": 0, "q4": 0, "q5": 0},
                       "unjudged": {"q4": 0, "q5": 0}, "missing_predictions": 1, "clip_boxes": False}
