"""spy_metrics computes the overall as the sum of its per-label passes (half the work, benchmarks/
spy_metrics_speed.py); the numbers equal the direct overall pass and the authors' algorithm as the spec
describes it, and a benchmark_id spanning two labels still takes the direct pass (whose label check fires)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from spy_metrics_speed import judged_records, reference  # noqa: E402

from cli.errors import InputError  # noqa: E402
from eval.spy.metrics import _metrics, spy_metrics, to_reference  # noqa: E402


def test_overall_from_labels_equals_direct_and_reference():
    records = judged_records(400, seed=3)
    ours = spy_metrics(records)
    direct = _metrics(list(enumerate(records, 1)), "eval_resp", "records")
    assert {k: v for k, v in ours.items() if k != "by_label"} == direct
    theirs = reference(records)
    assert to_reference(ours) == theirs["metrics"]
    assert {k: to_reference(v) for k, v in ours["by_label"].items()} == theirs["metrics group by label"]
    assert ours["total"] == 2000 and ours["exceptions"] > 0


def test_benchmark_id_across_labels_is_paired_directly():
    records = judged_records(2, seed=1)
    other = next(label for label in ("a3_height_approx", "a25_nationality") if label != records[0]["label"])
    records[1]["label"] = other  # the no-scenario pair of item 0 now has two labels
    records[0]["eval_resp"], records[1]["eval_resp"] = "reject", "respond"
    with pytest.raises(InputError, match="pairs"):
        spy_metrics(records)
