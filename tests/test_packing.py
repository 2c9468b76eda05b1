"""Tree-packed, padding-free preference batches (losses/packing.py) change nothing but the work (float32, 1e-5):

- packed vs unpacked (shared vision) for NCA-P, DPO and NCA on every Qwen family, full fine-tuning and LoRA: the
  per-sequence log-probabilities of the policy and of the reference, the loss, and every parameter's gradient;
- the precomputed reference pass packs too and stores the unpacked values; training on it gives the unpacked loss;
- a packed row holds no padding and exactly prefix + branches + leaves tokens per example, each image once;
- the tree mask: changing a sibling branch or another example leaves a token's log-probability as it is.
The two-process runs (DDP, ZeRO-2) with packing against one unpacked process are in tests/test_multiprocess.py.
"""

import os

import pytest
import torch
from test_preference_trainers import loss_and_grads, make_trainer, perturb

from losses.nca_p_trainer import NCAPCollator
from losses.vision_dpo_trainer import PreferenceCollator
from train.tiny_model import FAMILIES
from vlm.families import supports_packing

pytestmark = pytest.mark.slow
TOL = 1e-5
PACKING = [f for f in FAMILIES if supports_packing(f)]
COLLATORS = {"nca_p": NCAPCollator, "dpo": PreferenceCollator, "nca": PreferenceCollator}
# every family with NCA-P full and LoRA; DPO and NCA alternate full / LoRA across the families
CASES = [(f, "nca_p", lora) for f in PACKING for lora in (False, True)] + [
    (f, kind, (i + j) % 2 == 1) for i, f in enumerate(PACKING) for j, kind in enumerate(("dpo", "nca"))]


def both_batches(trainer, dataset, kind, n=2):
    examples = [dict(dataset[i]) for i in range(n)]
    collator = COLLATORS[kind]
    unpacked = collator(trainer.processing_class, shared_vision=True)([dict(e) for e in examples])
    packed = collator(trainer.processing_class, packed=True)([dict(e) for e in examples])
    return unpacked, packed


def token_logps(model, batch):
    """Per-token completion log-probabilities in the unpacked (rows, length - 1) layout, zero elsewhere."""
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    kwargs = {k: v for k, v in batch.items() if k not in ("completion_mask", "ref_logps", "ref_chosen_logps",
                                                          "ref_rejected_logps")}
    return model(**kwargs, labels=labels, fused_lm_head=True, use_cache=False).log_probs


def trainer_for(kind, family, tiny_family_dir, synthetic_dir, tmp_path, lora=False, **config):
    config.setdefault("loss_type", ["nca_pair"] if kind == "nca" else ["sigmoid"] if kind == "dpo" else ["nca_p"])
    trainer, dataset = make_trainer(kind, tiny_family_dir(family), synthetic_dir, tmp_path, lora=lora, **config)
    assert trainer.args.packed and trainer.data_collator.packed  # the default for the Qwen families
    return trainer, dataset


@pytest.mark.parametrize("family,kind,lora", CASES,
                         ids=[f"{f}-{k}-{'lora' if lo else 'full'}" for f, k, lo in CASES])
def test_packed_changes_nothing_but_the_work(family, kind, lora, tiny_family_dir, synthetic_dir, tmp_path):
    trainer, dataset = trainer_for(kind, family, tiny_family_dir, synthetic_dir, tmp_path, lora=lora)
    if not lora:
        perturb(trainer.model)
    else:  # LoRA's B starts at zero: move the adapters so that the policy differs from the reference
        perturb(trainer.model, seed=1)
    unpacked, packed = both_batches(trainer, dataset, kind)
    assert packed["packed_input_ids"].size(1) < int(unpacked["attention_mask"].sum())

    # per token within 1e-5; a sequence's sum of ~100 float32 terms (~-100) then within a few of its ulps
    with torch.no_grad():
        token_a, token_b = token_logps(trainer.model, unpacked), token_logps(trainer.model, packed)
        assert token_a.shape == token_b.shape and (token_a - token_b).abs().max().item() <= TOL
        for logps in (trainer.sequence_logps, lambda _, batch: trainer.reference_logps(batch)):
            a, b = logps(trainer.model, unpacked), logps(trainer.model, packed)
            assert a.shape == b.shape == (unpacked["input_ids"].size(0),)
            assert a.tolist() == pytest.approx(b.tolist(), rel=1e-6, abs=TOL)
    loss_a, grads_a = loss_and_grads(trainer, unpacked)
    loss_b, grads_b = loss_and_grads(trainer, packed)
    assert loss_a == pytest.approx(loss_b, abs=TOL)
    assert loss_a != pytest.approx(4 * 0.6931471805599453 if kind == "nca_p" else 0.6931471805599453, abs=1e-4)
    assert grads_a.keys() == grads_b.keys() and any(g.abs().sum() > 0 for g in grads_a.values())
    for name in grads_a:
        assert (grads_a[name] - grads_b[name]).abs().max().item() <= TOL, name


@pytest.mark.parametrize("kind,family", [("nca_p", "qwen2_vl"), ("dpo", "qwen3_vl")])
def test_precomputed_reference_packs_too(kind, family, tiny_family_dir, synthetic_dir, tmp_path):
    packed, dataset = trainer_for(kind, family, tiny_family_dir, synthetic_dir, tmp_path / "packed",
                                  precompute_ref_log_probs=True)
    plain, _ = make_trainer(kind, tiny_family_dir(family), synthetic_dir, tmp_path / "plain", packed=False)
    assert packed.ref_model is None
    batch = plain.data_collator([dict(dataset[i]) for i in range(4)])
    assert "packed_input_ids" not in batch
    unpacked_ref = torch.stack(plain.reference_logps(batch).chunk(plain.collator_class.sequences_per_example), 1)
    stored = torch.tensor(packed.train_dataset["ref_logps"])
    assert stored.flatten().tolist() == pytest.approx(unpacked_ref.flatten().tolist(), rel=1e-6, abs=TOL)

    perturb(packed.model)
    perturb(plain.model)
    loss_packed = packed.compute_loss(packed.model, packed.data_collator([dict(packed.train_dataset[i]) for i in range(2)]))
    loss_plain = plain.compute_loss(plain.model, plain.data_collator([dict(dataset[i]) for i in range(2)]))
    assert loss_packed.item() == pytest.approx(loss_plain.item(), abs=TOL)


def common_prefix(sequences):
    return len(os.path.commonprefix([tuple(s) for s in sequences]))


@pytest.mark.parametrize("kind", ["nca_p", "dpo"])
def test_packed_row_is_prefix_branches_and_leaves(kind, tiny_family_dir, synthetic_dir, tmp_path):
    trainer, dataset = trainer_for(kind, "qwen2_vl", tiny_family_dir, synthetic_dir, tmp_path)
    unpacked, packed = both_batches(trainer, dataset, kind, n=3)
    ids, real, answer = unpacked["input_ids"], unpacked["attention_mask"].bool(), unpacked["completion_mask"].bool()
    k = COLLATORS[kind].sequences_per_example
    examples = ids.size(0) // k
    expected = 0
    for e in range(examples):
        rows = [e + j * examples for j in range(k)]
        prompts = {tuple(ids[r][real[r] & ~answer[r]].tolist()) for r in rows}
        assert len(prompts) == (2 if kind == "nca_p" else 1)  # NCA-P: two instruction variants, DPO: one prompt
        prefix = common_prefix(prompts)
        branches = sum(len(p) - prefix for p in prompts) if len(prompts) > 1 else 0
        leaves = sum(int(answer[r].sum()) for r in rows)
        expected += prefix + branches + leaves
    row = packed["packed_input_ids"]
    assert row.shape == (1, expected)
    assert trainer.processing_class.tokenizer.pad_token_id not in row.tolist()[0]
    image_token = trainer.model.config.image_token_id
    per_image = int(unpacked["image_grid_thw"][0].prod()) // 4
    assert int((row == image_token).sum()) == examples * per_image  # each example's image once
    assert packed["image_grid_thw"].size(0) == examples == packed["image_index"].numel()
    assert packed["pixel_values"].size(0) == int(packed["image_grid_thw"].prod(-1).sum())
    assert packed["packed_multiplicity"].sum().item() == real.sum().item()


def test_tree_mask_keeps_siblings_and_other_examples_out(tiny_family_dir, synthetic_dir, tmp_path):
    """NCA-P, two examples: change every token off the path of example 0's non-private chosen answer (the private
    branch and its answers, all of example 1): that answer's token log-probabilities stay as they are."""
    trainer, dataset = trainer_for("nca_p", "qwen2_vl", tiny_family_dir, synthetic_dir, tmp_path)
    _, packed = both_batches(trainer, dataset, "nca_p")
    segments, ancestors = packed["packed_segments"], packed["packed_ancestors"]
    length = packed["input_ids"].size(1)
    leaf = segments[packed["packed_source"] // length == 0].max()  # row 0's answer is its last segment
    off_path = ~ancestors[leaf][segments] & (packed["packed_mm_token_type_ids"][0] == 0)
    assert off_path.sum() > 50

    with torch.no_grad():
        before = token_logps(trainer.model, packed)
    changed = dict(packed)
    ids = packed["packed_input_ids"].clone()
    ids[0, off_path] = ids[0, 1]  # an ordinary text token of the system line
    changed["packed_input_ids"] = ids
    with torch.no_grad():
        after = token_logps(trainer.model, changed)
    assert torch.equal(before[0], after[0])  # row 0: example 0, non-private instruction, chosen answer
    assert (before[1:] - after[1:]).abs().max() > 1e-3  # the rows whose path was changed do change


@pytest.mark.parametrize("family,lora", [("qwen2_vl", False), ("qwen3_vl", True)])
def test_sft_padding_free_equals_padded(family, lora, tiny_family_dir, synthetic_dir, tmp_path):
    """`padding_free: true` on vision data (TRL refuses it): one row, each sequence with its own M-RoPE positions."""
    from peft import LoraConfig
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTConfig

    from data_prep.spy_tune import build_dataset
    from losses.packing import PaddingFreeCollator
    from train.sft import SpySFTTrainer

    model_dir = tiny_family_dir(family)
    dataset = build_dataset("sft", synthetic_dir / "train_data.json", synthetic_dir, add_distractors=True, seed=3,
                            num_samples=3)
    args = SFTConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", max_length=None,
                     activation_checkpointing=False, per_device_train_batch_size=3, padding_free=True)
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0) if lora else None
    trainer = SpySFTTrainer(AutoModelForImageTextToText.from_pretrained(model_dir), args, train_dataset=dataset,
                            processing_class=AutoProcessor.from_pretrained(model_dir), peft_config=peft_config)
    assert trainer.args.padding_free and isinstance(trainer.data_collator, PaddingFreeCollator)
    trainer.model.train()
    perturb(trainer.model)
    examples = [dict(dataset[i]) for i in range(3)]
    padded = trainer.data_collator.collator([dict(e) for e in examples])
    packed = trainer.data_collator([dict(e) for e in examples])
    assert (padded["attention_mask"] == 0).any()  # the padded batch pads; the packed row holds the real tokens only
    assert packed["packed_input_ids"].numel() == int(padded["attention_mask"].sum())
    assert trainer.processing_class.tokenizer.pad_token_id not in packed["packed_input_ids"].tolist()[0]
    loss_a, grads_a = loss_and_grads(trainer, padded)
    loss_b, grads_b = loss_and_grads(trainer, packed)
    assert loss_a == pytest.approx(loss_b, abs=TOL) and loss_a > 0
    assert grads_a.keys() == grads_b.keys() and any(g.abs().sum() > 0 for g in grads_a.values())
    for name in grads_a:
        assert (grads_a[name] - grads_b[name]).abs().max().item() <= TOL, name
