"""SPY-Tune JSON -> training datasets: the cases, the targets, the distractors, and malformed input."""

import json
import shutil

import forked_python
import pytest

from cli.errors import InputError
from data_prep import spy
from data_prep.spy_tune import build_dataset, load_items

ABS = "a31_passport"
CUSTOM = "a25_nationality"


def _item(items, label):
    return next(i for i in items if i["label"] == label and i["non_privacy_scenarios"])


@pytest.fixture(scope="module")
def items(synthetic_dir):
    return load_items(synthetic_dir / "train_data.json", synthetic_dir)


def _one_item_dataset(tmp_path, synthetic_dir, item, method, **kwargs):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"data_list": [item]}))
    return build_dataset(method, path, synthetic_dir, shuffle=False, **kwargs)


def _text(messages):
    return messages[0]["content"]


def test_released_eval_items_load(tmp_path):
    """The three items the authors released parse with our loader (images faked: VISPR is not bundled)."""
    from pathlib import Path

    from PIL import Image

    released = Path(__file__).resolve().parents[1].parent / "shared" / "spy_data" / "eval_data.json"
    if not released.exists():
        pytest.skip("../shared/spy_data is not beside this checkout")
    data = json.loads(released.read_text())
    for item in data["data_list"]:
        image = tmp_path / item["question_item"]["image_path"]
        image.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32, 32)).save(image, format="JPEG")
    rows = build_dataset("nca_p", released, tmp_path, shuffle=False)
    assert len(rows) == 9  # 3 items x (no scenario, 1 non-privacy scenario, 1 privacy scenario)
    block = rows[0]["prompt_1"][0]["content"].split("\n\n")[0].split("\n")
    assert len(block) == 6 and "nationality is considered as private information." in block
    assert rows[0]["chosen_1"][0]["content"] == data["data_list"][0]["question_item"]["reject_ans"]


def test_sft_and_preference_cases(tmp_path, synthetic_dir, items):
    item = _item(items, CUSTOM)
    q = item["question_item"]
    pref = _one_item_dataset(tmp_path, synthetic_dir, item, "dpo", add_distractors=False)
    sft = _one_item_dataset(tmp_path, synthetic_dir, item, "sft", add_distractors=False)
    assert len(pref) == len(sft) == 5  # private, non-private, conflict, privacy scenario x2 instructions
    expected = [q["reject_ans"], q["respond_ans"], q["respond_ans"], q["reject_ans"], q["respond_ans"]]
    assert [r["chosen"][0]["content"] for r in pref] == expected
    assert [r["completion"][0]["content"] for r in sft] == expected
    assert all(r["rejected"][0]["content"] != r["chosen"][0]["content"] for r in pref)
    texts = spy.label2text()
    assert _text(pref[0]["prompt"]) == f"{texts[CUSTOM]} is considered as private information.\n\n{q['question']}"
    conflict = item["non_privacy_scenarios"][0]["2nd_person_template"].format(q["question"])
    assert _text(pref[2]["prompt"]).endswith(conflict)
    assert set(sft.column_names) == {"images", "prompt", "completion", "p_label"}


def test_absolute_labels_are_always_refused(tmp_path, synthetic_dir, items):
    item = _item(items, ABS)
    q = item["question_item"]
    pref = _one_item_dataset(tmp_path, synthetic_dir, item, "dpo", add_distractors=False)
    assert {r["chosen"][0]["content"] for r in pref} == {q["reject_ans"]}
    ncap = _one_item_dataset(tmp_path, synthetic_dir, item, "nca_p", add_distractors=False)
    assert {r[f"chosen_{j}"][0]["content"] for r in ncap for j in (0, 1)} == {q["reject_ans"]}


def test_nca_p_rows(tmp_path, synthetic_dir, items):
    item = _item(items, CUSTOM)
    q = item["question_item"]
    rows = _one_item_dataset(tmp_path, synthetic_dir, item, "nca_p", add_distractors=False)
    assert len(rows) == 3  # no scenario, the conflict scenario, the privacy scenario
    none, conflict, privacy = rows
    for row in rows:
        assert "non-private" in _text(row["prompt_0"]) and "non-private" not in _text(row["prompt_1"])
    assert (none["chosen_0"][0]["content"], none["chosen_1"][0]["content"]) == (q["respond_ans"], q["reject_ans"])
    assert (conflict["chosen_0"][0]["content"], conflict["chosen_1"][0]["content"]) == (q["respond_ans"],) * 2
    assert (privacy["chosen_0"][0]["content"], privacy["chosen_1"][0]["content"]) == (q["respond_ans"], q["reject_ans"])
    assert privacy["rejected_1"][0]["content"] == q["respond_ans"]


def test_distractor_lines(tmp_path, synthetic_dir, items):
    item = _item(items, CUSTOM)
    rows = _one_item_dataset(tmp_path, synthetic_dir, item, "nca_p", add_distractors=True)
    block_0 = _text(rows[0]["prompt_0"]).split("\n\n")[0].split("\n")
    block_1 = _text(rows[0]["prompt_1"]).split("\n\n")[0].split("\n")
    assert len(block_0) == 6
    position = list(item["other_labels"]).index(CUSTOM)
    differ = [k for k in range(6) if block_0[k] != block_1[k]]
    assert differ == [position]  # only the target line changes with the variant
    texts = spy.label2text()
    for k, (label, value) in enumerate(item["other_labels"].items()):
        if label != CUSTOM:
            assert block_0[k] == spy.INSTRUCT_TEMPLATES[int(value)].format(texts[label])


def test_shuffle_is_seeded(synthetic_dir):
    a = build_dataset("sft", synthetic_dir / "train_data.json", synthetic_dir, seed=1, num_samples=20)
    b = build_dataset("sft", synthetic_dir / "train_data.json", synthetic_dir, seed=1, num_samples=20)
    c = build_dataset("sft", synthetic_dir / "train_data.json", synthetic_dir, seed=2, num_samples=20)
    assert a["prompt"] == b["prompt"] != c["prompt"]
    assert len(a) == 20


def test_sft_trains_on_the_answer_only(synthetic_dir, tiny_model_dir):
    """Completion-only loss: no system / instruction / question / image token carries a label, in the batches
    SFTTrainer builds from our rows."""
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTConfig, SFTTrainer

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    rows = build_dataset("sft", synthetic_dir / "train_data.json", synthetic_dir, add_distractors=False,
                         num_samples=2)
    trainer = SFTTrainer(
        model=AutoModelForImageTextToText.from_pretrained(tiny_model_dir), processing_class=processor,
        train_dataset=rows, args=SFTConfig(output_dir=str(synthetic_dir / "sft-check"), use_cpu=True, bf16=False,
                                           report_to="none", max_length=None, activation_checkpointing=False),
    )
    batch = trainer.data_collator([dict(r) for r in rows])
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    labelled = batch["labels"] != -100
    assert not labelled[batch["input_ids"] == image_token].any()
    for k, row in enumerate(rows):
        answer = processor.tokenizer.decode(batch["labels"][k][labelled[k]])
        assert answer.strip().startswith(row["completion"][0]["content"])
        assert row["prompt"][0]["content"].split("\n\n")[-1] not in answer


# --- malformed input: one line naming the file, the record and the field --------------------------------------


def _write(tmp_path, items):
    path = tmp_path / "train.json"
    path.write_text(json.dumps({"data_list": items}))
    return path


def test_bad_json(tmp_path, synthetic_dir):
    path = tmp_path / "train.json"
    path.write_text('{"data_list": [\n{"label": }]}')
    with pytest.raises(InputError, match=r"train\.json:2: not valid JSON"):
        load_items(path, synthetic_dir)


def test_missing_field(tmp_path, synthetic_dir, items):
    broken = json.loads(json.dumps(items[:3]))
    del broken[2]["question_item"]["reject_ans"]
    with pytest.raises(InputError, match=r"train\.json:record 2: question_item\.reject_ans: missing field"):
        load_items(_write(tmp_path, broken), synthetic_dir)


def test_unknown_label(tmp_path, synthetic_dir, items):
    broken = json.loads(json.dumps(items[:2]))
    broken[1]["label"] = "a999_mystery"
    with pytest.raises(InputError, match=r"record 1: label: unknown label 'a999_mystery'"):
        load_items(_write(tmp_path, broken), synthetic_dir)


def test_missing_image(tmp_path, synthetic_dir, items):
    folder = tmp_path / "images_copy"
    shutil.copytree(synthetic_dir / "images", folder / "images")
    (folder / items[1]["question_item"]["image_path"]).unlink()
    with pytest.raises(InputError, match=r"record 1: question_item\.image_path: image not found"):
        load_items(_write(tmp_path, items[:2]), folder)


def test_entry_script_exits_2_with_one_line(tmp_path, synthetic_dir, tiny_model_dir, items):
    import sys
    from pathlib import Path

    broken = json.loads(json.dumps(items[:2]))
    broken[0]["label"] = "a999_mystery"
    data = _write(tmp_path, broken)
    root = Path(__file__).resolve().parents[1]
    result = forked_python.run(
        [sys.executable, str(root / "train" / "sft.py"), str(root / "recipes/demo/sft.yaml"), "--model_name_or_path",
         str(tiny_model_dir), "--train_data_path", str(data), "--image_folder", str(synthetic_dir),
         "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert result.returncode == 2
    assert f"error: {data}:record 0: label: unknown label 'a999_mystery'" in result.stderr.splitlines()
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_helpful_backbone_rows_answer_everything_and_add_the_general_task(tmp_path):
    """The study's backbone data: every case answered (respond_ans) whatever the instruction, plus the general task."""
    from data_prep.synthetic import COLOURS, build

    data = build(tmp_path, train_per_label=1, test_per_label=1, general_train=6, general_test=4)
    answers = {i["label"]: i["question_item"] for i in json.loads((data / "train_data.json").read_text())["data_list"]}
    rows = build_dataset("sft", data / "train_data.json", data, add_distractors=False, helpful=True,
                         general_path=data / "general_train.json")
    general = [r for r in rows if r["p_label"] == "general"]
    assert len(general) == 6 and all(r["completion"][0]["content"] in COLOURS for r in general)
    for row in rows:  # the absolute categories refused, every other question answered, whatever the instruction
        if row["p_label"] != "general":
            key = "reject_ans" if spy.is_abs(row["p_label"]) else "respond_ans"
            assert row["completion"][0]["content"] == answers[row["p_label"]][key]
    test = json.loads((data / "general_test.json").read_text())["data_list"]
    assert len(test) == 4 and all(t["answer"] in COLOURS and t["image_path"].startswith("images/general_test/")
                                  for t in test)
    with pytest.raises(InputError, match="only SFT"):
        build_dataset("dpo", data / "train_data.json", data, helpful=True)
