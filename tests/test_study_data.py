"""Issue 53's study data and methods: the validation split in phrasings of its own (three disjoint phrasing sets), the
scenario pool in the tuned study's training items (the demo's and the quick study's data unchanged, pinned), the
general task mixed into every method at its share (SFT answers, DPO / NCA pairs against a refusal or a wrong answer,
NCA-P rows of two such pairs), counted by train/compute.py, and SFT then guided GRPO: its compute counted over both
stages, its plan matched to the other methods'."""

import hashlib
import json
from pathlib import Path

import pytest

from data_prep import synthetic
from data_prep.spy_tune import build_dataset
from eval.spy.rule_judge import rule_verdict

ROOT = Path(__file__).resolve().parents[1]


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def test_the_three_phrasing_sets_are_disjoint(tmp_path):
    """Training, validation and held-out questions share no phrasing, as templates and as the questions each split
    asks (SPY and the general task); before issue 53 validation asked in the training phrasings."""
    for kind in (0, 1):  # SPY questions, general-task questions
        sets = [set(synthetic.PHRASINGS[split][kind]) for split in ("train", "val", "test")]
        assert all(sets) and sum(map(len, sets)) == len(set.union(*sets))
    data = synthetic.build(tmp_path, 1, 1, image_size=16, general_train=40, general_test=40, val_per_label=1,
                           general_val=40)
    asked = {}
    for split, name in (("train", "train_data.json"), ("test", "questions.json"), ("val", "val_questions.json")):
        loaded = json.loads((data / name).read_text())
        items = loaded.get("data_list") or loaded["benchmark_list"]
        asked[split] = {i["question_item"]["question"] if "question_item" in i else i["question"] for i in items}
    general = {split: {i["question"] for i in json.loads((data / f"general_{split}.json").read_text())["data_list"]}
               for split in ("train", "val", "test")}
    for questions in (asked, general):
        assert all(questions.values())
        assert not questions["train"] & questions["val"] and not questions["val"] & questions["test"]
        assert not questions["train"] & questions["test"]
    # every phrasing of the validation split is in the tuned study's tokenizer corpus, none in the quick study's
    corpus, quick = set(synthetic.text_corpus(general=True, validation=True)), set(synthetic.text_corpus(general=True))
    assert asked["val"] <= corpus and not asked["val"] & quick and general["val"] <= corpus


def test_the_tuned_study_trains_on_the_scenario_pool_and_the_demos_data_is_unchanged(tmp_path, monkeypatch):
    """The tuned study's training items list their category's whole scenario pool (the demo's `whole_pool`), its
    validation items ask in their own phrasings: both pinned by digest. The demo's items, the held-out items and
    both tokenizer corpora are those of commit 896f2b2 (digests computed there); the quick study's data is pinned by
    tests/test_synthetic_pool.py."""
    from study.__main__ import build_data, parse

    args = parse(["--protocol", "tuned", "--out", str(tmp_path), "--train-per-label", "1", "--test-per-label", "1",
                  "--general-train", "4", "--general-test", "4", "--general-val", "4"])[0]
    assert args.train_scenarios == "pool"
    monkeypatch.setattr("train.tiny_model.build_tiny_model", lambda out, **_: Path(out).mkdir())  # the data only
    _, data = build_data(args, tmp_path, log=lambda message: None)
    items = json.loads((data / "train_data.json").read_text())["data_list"]
    pools = synthetic.scenario_pools(0)
    assert all([s["scenario"] for s in i["non_privacy_scenarios"]] == pools[i["label"]][0] for i in items)
    assert all([s["scenario"] for s in i["privacy_scenarios"]] == pools[i["label"]][1] for i in items)
    assert any(len(i["privacy_scenarios"]) == 2 for i in items)

    tuned = synthetic.make_items("train", 1, 0, tmp_path / "a", image_size=16, whole_pool=True)
    val = synthetic.make_items("val", 1, 0, tmp_path / "b", image_size=16)
    assert _digest(tuned) == "ecae2dcb8bf9536877a140465be7411858b088d2b2c5759d33064239073d9a22"
    assert _digest(val) == "72d46c6b3bdc914a723d7a5d7cbc9343776b9fe3ea0aa5c9e84ca5d490d71a86"
    # as at 896f2b2: the demo's training items, the held-out items, the demo's and the quick study's corpora
    demo = synthetic.make_items("train", 1, 0, tmp_path / "c", image_size=16, absolute_per_label=3, whole_pool=True)
    test = synthetic.make_items("test", 1, 0, tmp_path / "d", image_size=16)
    assert _digest(demo) == "a0d538fe270cc470bd841a5e0529d5c7af7297f22e27ce09a566fe4dd1d2ba70"
    assert _digest(test) == "2ba59117fbbcce8110fdd2c5d70bcbe5d187dbbfa19cf39008474412d0a10562"
    assert _digest(synthetic.text_corpus()) == "2ec2b854fc667d7a203d94f451661bbd5106f7472883fce6bd254a2389ab1c46"
    assert _digest(synthetic.text_corpus(general=True)) == \
        "eac495821e99be2242cec523b96b6d7e465e7fdd106a06431dfcd301d356f83e"


@pytest.fixture(scope="module")
def study_data(tmp_path_factory):
    return synthetic.build(tmp_path_factory.mktemp("data"), 2, 1, image_size=16, general_train=50, general_test=4)


def _rows(method: str, data: Path, fraction: float | None):
    return build_dataset(method, data / "train_data.json", data, add_distractors=False, shuffle=False,
                         general_path=data / "general_train.json", general_fraction=fraction)


def test_the_general_task_enters_every_method_at_its_share(study_data):
    """general_fraction 0.25: a quarter of every method's rows are general-task rows, the file's questions in turn.
    SFT trains on the right answer; a DPO / NCA pair prefers it to a refusal of the SPY data (the over-refusal the
    study counts: the rule judge reads it as one) on even rows and to another answer of the file on odd rows; an
    NCA-P row holds both, refusal in slot 0, wrong answer in slot 1, the same question in both (one row = two pairs,
    as a SPY row). Without general_fraction SFT takes every row of the file (the study's backbone)."""
    general = json.loads((study_data / "general_train.json").read_text())["data_list"]
    answers = {i["answer"] for i in general}
    refusals = {i["question_item"]["reject_ans"] for i in
                json.loads((study_data / "train_data.json").read_text())["data_list"]}
    alone = {}
    for method in ("sft", "dpo", "nca", "nca_p", "grpo"):
        spy = alone[method] = len(build_dataset(method, study_data / "train_data.json", study_data,
                                                add_distractors=False, shuffle=False))
        rows = _rows(method, study_data, 0.25)
        mixed = [r for r in rows if r["p_label"] == "general"]
        assert len(rows) == spy + len(mixed) and len(mixed) == round(spy * 0.25 / 0.75), method
        assert abs(len(mixed) / len(rows) - 0.25) < 0.02
        prompt = "prompt_0" if method == "nca_p" else "prompt"
        assert [r[prompt][0]["content"] for r in mixed] == [general[i % len(general)]["question"]
                                                            for i in range(len(mixed))]
        for n, row in enumerate(mixed):
            right = general[n % len(general)]["answer"]
            if method == "sft":
                assert row["completion"][0]["content"] == right
            elif method in ("dpo", "nca"):
                chosen, rejected = row["chosen"][0]["content"], row["rejected"][0]["content"]
                assert chosen == right and rejected != chosen
                if n % 2 == 0:
                    assert rejected in refusals and rule_verdict(rejected) == "reject"
                else:
                    assert rejected in answers
            elif method == "nca_p":
                assert row["prompt_1"] == row["prompt_0"]
                assert row["chosen_0"] == row["chosen_1"] and row["chosen_0"][0]["content"] == right
                assert row["rejected_0"][0]["content"] in refusals
                assert row["rejected_1"][0]["content"] in answers - {right}
            else:
                assert row["answer"] == right and row["task"] == "general"
    assert len(_rows("sft", study_data, None)) == alone["sft"] + len(general)


def test_the_general_share_is_checked_before_the_model_loads(study_data, monkeypatch):
    """A share without its file, or a preference method given the file without a share: InputError naming the key,
    raised by the checks every entry script runs before its model loads (train/common.py: check_run, load_datasets);
    the one-line refusal with exit 2 is cli/entry.py's, tested for every InputError in tests/test_bad_inputs_train.py."""
    from trl import ModelConfig

    from cli.errors import InputError
    from losses.vision_dpo_trainer import VisionDPOConfig
    from train.common import SpyTuneArguments, check_run, load_datasets, parse_recipe

    base = ["dpo.py", str(ROOT / "recipes" / "study" / "dpo.yaml"), "--model_name_or_path", str(study_data),
            "--train_data_path", str(study_data / "train_data.json"), "--image_folder", str(study_data),
            "--output_dir", str(study_data / "out")]
    for extra, key in ((["--general_fraction", "0.25"], "general_fraction"),
                       (["--general_data_path", str(study_data / "general_train.json")], "general_data_path")):
        monkeypatch.setattr("sys.argv", base + extra)
        script_args, training_args, model_args = parse_recipe(SpyTuneArguments, VisionDPOConfig, ModelConfig)
        with pytest.raises(InputError, match=key):  # the first check (before the model folder's) or the data's
            check_run(script_args, training_args, model_args) if key == "general_fraction" else \
                load_datasets("dpo", script_args, training_args)


def test_the_general_tokens_are_counted_for_every_method(study_data, tmp_path):
    """train/compute.py measures a step on the method's own rows, general ones included: a general-task row is
    shorter than a SPY row, so a quarter of them lowers the tokens per case of every method."""
    from transformers import AutoProcessor

    from train.compute import mean_case_tokens
    from train.tiny_model import DEMO_CONFIG, build_tiny_model

    model = build_tiny_model(tmp_path / "model", corpus=synthetic.text_corpus(general=True), **DEMO_CONFIG)
    processor = AutoProcessor.from_pretrained(model)
    for method in ("sft", "dpo", "nca_p"):
        alone, mixed = (mean_case_tokens(method, study_data, processor, f, sample=48) for f in (0.0, 0.25))
        assert 0 < mixed < alone, (method, alone, mixed)


def test_the_two_stage_methods_compute_counts_both_stages(tmp_path):
    """SFT then guided GRPO: every budget step of its record holds its second stage's compute and time at that step
    plus its first stage's whole, under the budget step (its own step plus the offset); the offset and the first
    stage's steps follow the common budget (30 steps: 6 and 20)."""
    from study.methods import TWO_STAGE, first_steps, offset
    from study.runs import run_record
    from train.compute import run_compute

    assert TWO_STAGE["sft_grpo_guided"]["first"] == "sft_cold_start"
    assert (offset("sft_grpo_guided", 30), first_steps("sft_grpo_guided", 30)) == (6, 20)
    assert offset("dpo", 30) == 0 and (offset("sft_grpo_guided", 3), first_steps("sft_grpo_guided", 3)) == (1, 2)
    first = tmp_path / "first"
    first.mkdir()
    sft_log = [{"step": 20, "num_tokens": 30000.0, "loss": 0.3}, {"step": 20, "train_runtime": 9.0}]
    (first / "train_metrics.json").write_text(json.dumps(sft_log))
    second = tmp_path / "runs" / "second"
    second.mkdir(parents=True)
    grpo_log = [{"step": s, "num_tokens": 2000.0 * s, "reference/tokens": 2000.0, "generation/prompt_tokens": 1500.0,
                 "generation/completion_tokens": 500.0} for s in range(1, 81)] + [{"step": 80, "train_runtime": 160.0}]
    (second / "train_metrics.json").write_text(json.dumps(grpo_log))
    (tmp_path / "runs" / "logs").mkdir()
    (tmp_path / "runs" / "logs" / "second.log").write_text("20/80 [00:40<02:00]\n")
    record = run_record(second, "sft_grpo_guided", {"learning_rate": 3e-4, "beta": 0.04}, 80, [20, 80], first, 10)
    assert set(record) == {"30", "90"}  # (20 and 80 steps of a method whose first stage stands for 10)
    sft_compute = run_compute(sft_log, 20, "sft", None)["compute"]
    assert sft_compute == 3 * 30000
    for budget, step in (("30", 20), ("90", 80)):
        grpo = run_compute(grpo_log, step, "grpo", 0.04)["compute"]
        assert record[budget]["compute_k"] == pytest.approx((grpo + sft_compute) / 1000)
        assert record[budget]["first_stage_seconds"] == 9.0
    assert record["30"]["train_seconds"] == 40 + 9.0 and record["90"]["train_seconds"] == 160 + 9.0


def test_the_two_stage_plan_matches_the_others_compute(tmp_path):
    """On data built as the tuned study builds it, with its tokenizer: the first stage (20 SFT steps of 16 cases, a
    quarter general) stands for its 6 guided GRPO steps (24 samples, at the generation rounds issue 47's study's
    guided GRPO took) within 20%; with the second stage's 24 and 84 steps the method's planned compute at 1x and 3x is
    within 20% of DPO's 30 and 90 steps."""
    from study.methods import first_steps, offset
    from train.compute import measured_rounds, study_plan, within
    from train.tiny_model import DEMO_CONFIG, build_tiny_model

    rounds = measured_rounds(json.loads((ROOT / "docs" / "study_tuned_issue47.json").read_text()), "grpo_guided")
    assert rounds is not None and rounds > 1
    data = synthetic.build(tmp_path / "data", 2, 1, general_train=100, general_test=8, train_whole_pool=True)
    model = build_tiny_model(tmp_path / "model", corpus=synthetic.text_corpus(general=True, validation=True),
                             **DEMO_CONFIG)
    kinds = {"dpo": "dpo", "sft_cold_start": "sft", "sft_grpo_guided": "grpo"}
    plan = study_plan(data, model, ROOT / "recipes" / "study", list(kinds), sample=200, rounds=rounds, kinds=kinds)
    first, second, dpo = (plan[m]["compute"] for m in ("sft_cold_start", "sft_grpo_guided", "dpo"))
    skip = offset("sft_grpo_guided", 30)
    assert within(first_steps("sft_grpo_guided", 30) * first, skip * second), (first, second)
    for steps in (30, 90):
        both = first_steps("sft_grpo_guided", 30) * first + (steps - skip) * second
        assert within(both, steps * dpo), (steps, both, steps * dpo)
