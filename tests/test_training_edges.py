"""Training edges (issue 32, items 14, 15 and 17), on the tiny models, in process:

- truncation: the answer tokens that `max_length` keeps are counted on the dataset exactly as TRL's collators cut
  them (every family, SFT / DPO / NCA-P); a cut is said once with the numbers, a dataset that keeps no answer token is
  refused before any step (and before the reference pass), for DPO, NCA-P and SFT, packed and unpacked;
- the reference precompute of a `max_steps` run scores only the rows the run reads, and training on it gives the
  losses of the live reference;
- `--use_peft true` without target modules takes the family's default targets (the language model's projections);
- a resume under other settings names every setting that differs, `packed` included.
"""

import json
import math

import pytest
from transformers import AutoModelForImageTextToText, AutoProcessor

from cli.errors import InputError, RunStopped
from data_prep.spy_tune import build_dataset
from losses.nca_p_trainer import NCAPCollator, NCAPConfig, NCAPTrainer
from losses.truncation import check_truncation, measure, token_counts
from losses.vision_dpo_trainer import PreferenceCollator, VisionDPOConfig, VisionDPOTrainer
from train.tiny_model import FAMILIES

pytestmark = pytest.mark.slow


def dataset_of(method, synthetic_dir, n=6, distractors=True):
    return build_dataset(method, synthetic_dir / "train_data.json", synthetic_dir, add_distractors=distractors,
                         seed=3, num_samples=n)


def collator_of(method, processor, max_length=None):
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    if method == "sft":
        return DataCollatorForVisionLanguageModeling(processor, max_length=max_length, completion_only_loss=True)
    cls = NCAPCollator if method == "nca_p" else PreferenceCollator
    return cls(processor, shared_vision=False, max_length=max_length)


def pairs_of(collator):
    return (lambda example: collator.preference_pairs([example])) if hasattr(collator, "preference_pairs") \
        else (lambda example: [example])


def kept_by_collator(collator, example) -> list[int]:
    batch = collator([dict(example)])
    mask = batch["completion_mask"] if "completion_mask" in batch else batch["labels"] != -100
    return sorted(mask.sum(1).tolist())


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", ["sft", "dpo", "nca_p"])
def test_token_counts_are_what_the_collator_keeps(method, family, tiny_family_dir, synthetic_dir):
    """Prompt + answer lengths as counted (images from their sizes, not decoded) equal the collated rows', and the
    answer tokens kept under a max_length that cuts some equal the collator's completion mask."""
    processor = AutoProcessor.from_pretrained(tiny_family_dir(family))
    dataset = dataset_of(method, synthetic_dir)
    plain = collator_of(method, processor)
    counts = list(token_counts(dataset, processor, pairs_of(plain)))
    assert len(counts) == len(dataset)
    totals = [p + a for row in counts for p, a in row]
    max_length = sorted(totals)[len(totals) // 2]  # cuts about half of the sequences
    cutting = collator_of(method, processor, max_length)
    cut_somewhere = False
    for example, row in zip(dataset, counts):
        batch = plain([dict(example)])
        assert sorted(batch["attention_mask"].sum(1).tolist()) == sorted(p + a for p, a in row)
        kept = sorted(max(0, min(a, max_length - p)) for p, a in row)
        assert kept_by_collator(cutting, example) == kept
        cut_somewhere |= any(p + a > max_length for p, a in row)
    assert cut_somewhere


def test_the_counts_name_rows_cut_emptied_and_left_with_nothing(tiny_model_dir, synthetic_dir):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    dataset = dataset_of("dpo", synthetic_dir, n=8)
    counts = list(token_counts(dataset, processor))
    prompts = sorted(min(p for p, _ in row) for row in counts)
    max_length = prompts[len(prompts) // 2]  # half the rows keep no answer token
    found = measure(dataset, processor, max_length)
    expected_nothing = sum(all(p >= max_length for p, _ in row) for row in counts)
    assert found.rows == 8 and found.nothing == expected_nothing and 0 < found.nothing < 8
    assert found.cut >= found.emptied >= found.nothing
    assert found.longest == max(p + a for row in counts for p, a in row)
    assert measure(dataset, processor, found.longest).cut == 0
    assert measure(dataset, processor, found.longest - 1).cut >= 1
    line = found.warning(max_length)
    assert f"from {found.cut} of 8 training rows" in line and f"{found.nothing} keep no answer token" in line
    with pytest.raises(InputError, match="keeps no answer token of any of the 8 training rows"):
        check_truncation(dataset, processor, min(prompts))


def preference_trainer(kind, model_dir, synthetic_dir, out, n=6, **config):
    dataset = dataset_of("nca_p" if kind == "nca_p" else "dpo", synthetic_dir, n=n, distractors=False)
    config_class, trainer_class = (NCAPConfig, NCAPTrainer) if kind == "nca_p" else (VisionDPOConfig, VisionDPOTrainer)
    defaults = dict(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", max_length=None,
                    activation_checkpointing=False, per_device_train_batch_size=2, beta=0.1, logging_steps=1,
                    save_strategy="no", learning_rate=1e-3, seed=11)
    return trainer_class(model=AutoModelForImageTextToText.from_pretrained(model_dir),
                         args=config_class(**{**defaults, **config}), train_dataset=dataset,
                         processing_class=AutoProcessor.from_pretrained(model_dir))


@pytest.mark.parametrize("kind", ["dpo", "nca_p"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_a_max_length_that_keeps_no_answer_is_refused_before_the_reference_pass(kind, packed, tiny_model_dir,
                                                                                 synthetic_dir, tmp_path):
    with pytest.raises(InputError, match="max_length: 20 keeps no answer token"):
        preference_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "out", max_length=20, packed=packed,
                           precompute_ref_log_probs=True)
    assert not (tmp_path / "out" / "ref_logps").exists()  # refused before any reference pass


@pytest.mark.parametrize("kind", ["dpo", "nca_p"])
def test_a_cutting_max_length_is_said_once_with_the_numbers(kind, tiny_model_dir, synthetic_dir, tmp_path, caplog):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    collator = collator_of("nca_p" if kind == "nca_p" else "dpo", processor)
    dataset = dataset_of("nca_p" if kind == "nca_p" else "dpo", synthetic_dir, distractors=False)
    row = next(token_counts(dataset, processor, pairs_of(collator)))
    with caplog.at_level("WARNING"):
        preference_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "out", max_length=max(p for p, _ in row) + 1)
    said = [r.getMessage() for r in caplog.records if "cuts answer tokens" in r.getMessage()]
    assert len(said) == 1 and "of 6 training rows" in said[0]


@pytest.mark.parametrize("kind", ["dpo", "nca_p"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_a_batch_that_keeps_no_answer_stops_the_run(kind, packed, tiny_model_dir, synthetic_dir, tmp_path):
    """Some rows keep answer tokens, others none: the dataset passes, and with one row per batch an epoch draws one of
    the others, whose step stops the run with one line instead of training on nothing (loss log 2, zero gradient)."""
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    collator = collator_of("nca_p" if kind == "nca_p" else "dpo", processor)
    dataset = dataset_of("nca_p" if kind == "nca_p" else "dpo", synthetic_dir, distractors=False)
    shortest = sorted(min(p for p, _ in row) for row in token_counts(dataset, processor, pairs_of(collator)))
    max_length = shortest[len(shortest) // 2]  # rows whose every prompt reaches it keep nothing
    found = measure(dataset, processor, max_length, pairs_of(collator))
    assert 0 < found.nothing < found.rows
    trainer = preference_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "out", max_length=max_length,
                                 packed=packed, per_device_train_batch_size=1, max_steps=found.rows)
    with pytest.raises(RunStopped, match=f"max_length {max_length} leaves no answer token in this batch"):
        trainer.train()
    assert trainer.state.global_step < found.rows


@pytest.mark.parametrize("padding_free", [True, False], ids=["packed", "unpacked"])
def test_an_sft_batch_that_keeps_no_answer_stops_the_run(padding_free, tiny_model_dir, synthetic_dir, tmp_path):
    from trl import SFTConfig

    from train.sft import SpySFTTrainer

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    dataset = dataset_of("sft", synthetic_dir, distractors=False)
    shortest = sorted(min(p for p, _ in row) for row in token_counts(dataset, processor))
    max_length = shortest[len(shortest) // 2]
    found = measure(dataset, processor, max_length)
    assert 0 < found.nothing < found.rows
    args = SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", seed=11,
                     max_length=max_length, padding_free=padding_free, per_device_train_batch_size=1,
                     max_steps=found.rows, save_strategy="no", activation_checkpointing=False, learning_rate=1e-3)
    trainer = SpySFTTrainer(model=AutoModelForImageTextToText.from_pretrained(tiny_model_dir), args=args,
                            train_dataset=dataset, processing_class=processor)
    with pytest.raises(RunStopped, match=f"max_length {max_length} leaves no answer token in this batch"):
        trainer.train()
    assert trainer.state.global_step < found.rows


# ---------------------------------------------------------------------------------------- the reference precompute
@pytest.mark.parametrize("kind", ["dpo", "nca_p"])
def test_a_max_steps_run_precomputes_only_the_rows_it_reads(kind, tiny_model_dir, synthetic_dir, tmp_path):
    """3 steps x batch 2 x accumulation 2 read 12 of 30 rows: the cache scores those 12 (the others NaN, which a
    batch refuses), and training on it logs the losses of the live reference, step by step."""
    import pyarrow.parquet as pq

    steps = dict(max_steps=3, gradient_accumulation_steps=2, n=30)
    live = preference_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "live", **steps)
    pre = preference_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "pre", precompute_ref_log_probs=True,
                             **steps)
    [cache] = (tmp_path / "pre" / "ref_logps").glob("train-*.parquet")
    values = pq.read_table(cache).column("ref_logps").to_pylist()
    scored = [i for i, row in enumerate(values) if not any(math.isnan(v) for v in row)]
    assert len(values) == 30 and len(scored) == 12 and sorted(pre.rows_read()) == scored
    live.train()
    pre.train()
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (live, pre)]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_a_row_that_was_not_precomputed_stops_the_step(tiny_model_dir, synthetic_dir, tmp_path):
    from cli.errors import RunStopped

    trainer = preference_trainer("dpo", tiny_model_dir, synthetic_dir, tmp_path / "out", n=2,
                                 precompute_ref_log_probs=True)
    examples = [{**dict(trainer.train_dataset[i]), "ref_logps": [float("nan"), -3.0]} for i in range(2)]
    with pytest.raises(RunStopped, match="not precomputed"):
        trainer.compute_loss(trainer.model, trainer.data_collator(examples))


# ---------------------------------------------------------------------------------------------- LoRA and resume
def test_use_peft_without_targets_takes_the_language_models_projections(tiny_family_dir):
    import re

    from peft import LoraConfig, get_peft_model

    from vlm.families import default_lora_targets

    for family in FAMILIES:
        model = AutoModelForImageTextToText.from_pretrained(tiny_family_dir(family))
        targets = default_lora_targets(family)
        lora = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=targets))
        adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in lora.named_modules() if name.endswith(".lora_A")}
        assert adapted and all(".language_model." in name for name in adapted), family
        leaves = {re.sub(r".*\.", "", name) for name in adapted}
        assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= leaves, family
    assert default_lora_targets("an_unknown_family") is None


def test_a_resume_names_every_setting_that_differs(tmp_path):
    from trl import ModelConfig

    from train.common import SpyTuneArguments
    from train.resume import STATE_KEY, _settings, check_resume

    script = SpyTuneArguments(train_data_path=str(tmp_path / "d.json"), image_folder=str(tmp_path))

    def config(**changes):
        return VisionDPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **changes)

    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    state = {"stateful_callbacks": {STATE_KEY: {"args": {"settings": _settings(script, config(), ModelConfig())}}}}
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    failures = []

    def fail(option, message):
        failures.append((option, message))
        raise InputError("command line", None, option, message)

    for changes, names in [({"packed": False}, ["packed"]),
                           ({"packed": False, "learning_rate": 1e-3}, ["learning_rate", "packed"]),
                           ({"dataloader_drop_last": True}, ["dataloader_drop_last"])]:
        with pytest.raises(InputError):
            check_resume(script, config(**changes), ModelConfig(), str(checkpoint), fail)
        option, message = failures[-1]
        assert option == ", ".join(names), message
        assert all(f"{name} " in message or len(names) == 1 for name in names)
    assert "packed" in failures[1][1] and "learning_rate" in failures[1][1] and "True, not False" in failures[1][1]


def test_settings_cover_every_results_changing_option():
    """A guard against the list drifting: every option of the DPO config that is not written-where/how-often is in
    the settings a resume compares."""
    from trl import ModelConfig

    from train.common import SpyTuneArguments
    from train.resume import _settings

    settings = _settings(SpyTuneArguments("a", "b"), VisionDPOConfig(output_dir="x", use_cpu=True, bf16=False),
                         ModelConfig())
    for name in ("packed", "shared_vision", "max_length", "precompute_ref_log_probs", "dataloader_drop_last",
                 "gradient_accumulation_steps", "seed", "data_seed", "lora_target_modules"):
        assert name in settings, name
