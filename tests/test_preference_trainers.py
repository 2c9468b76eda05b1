"""The NCA-P and DPO/NCA trainers on the tiny models of every supported family, in process:

- the NCA-P loss of a batch equals `nca_p_loss` of log-probabilities computed independently (plain forward,
  explicit log-softmax) for the four sequences of each example;
- shared vision encoding gives the same loss and the same gradient for every parameter (float32, 1e-5),
  for NCA-P and DPO, full fine-tuning and LoRA, on every Qwen family (Qwen3-VL's deepstack features included);
  a family that cannot share (Gemma 3) says so once and trains on the plain path;
- precomputed reference log-probabilities give the live-reference loss, are cached on disk and release the
  reference model.
"""

import pytest
import torch
from peft import LoraConfig
from transformers import AutoModelForImageTextToText, AutoProcessor

from data_prep.spy_tune import build_dataset
from losses import nca_p_loss
from losses.nca_p_trainer import NCAPCollator, NCAPConfig, NCAPTrainer
from losses.vision_dpo_trainer import PreferenceCollator, VisionDPOConfig, VisionDPOTrainer
from train.tiny_model import FAMILIES
from vlm.families import supports_shared_vision

pytestmark = pytest.mark.slow
TOL = 1e-5
SHARING = [f for f in FAMILIES if supports_shared_vision(f)]
NOT_SHARING = [f for f in FAMILIES if not supports_shared_vision(f)]


def make_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path, lora=False, **config):
    method = "nca_p" if kind == "nca_p" else "dpo"
    dataset = build_dataset(method, synthetic_dir / "train_data.json", synthetic_dir, add_distractors=False,
                            seed=3, num_samples=4)
    config_class, trainer_class = (NCAPConfig, NCAPTrainer) if kind == "nca_p" else (VisionDPOConfig, VisionDPOTrainer)
    args = config_class(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                        max_length=None, activation_checkpointing=False, per_device_train_batch_size=2,
                        beta=0.1, **config)
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0) if lora else None
    trainer = trainer_class(model=AutoModelForImageTextToText.from_pretrained(tiny_model_dir), args=args,
                            train_dataset=dataset, processing_class=AutoProcessor.from_pretrained(tiny_model_dir),
                            peft_config=peft_config)
    trainer.model.train()
    return trainer, dataset


@torch.no_grad()
def perturb(model, seed=0):
    """Move the policy away from the reference so that log-ratios are not all zero."""
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.add_(torch.randn(p.shape, generator=generator) * 0.02)


def independent_logp(model, processor, image, prompt, completion) -> float:
    """log pi(completion | image, prompt) from a plain forward pass and an explicit log-softmax."""
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt[0]["content"]}]}]
    prompt_text = processor.apply_chat_template(conversation, add_generation_prompt=True)
    full_text = processor.apply_chat_template(conversation + [
        {"role": "assistant", "content": [{"type": "text", "text": completion[0]["content"]}]}])
    assert full_text.startswith(prompt_text)
    inputs = processor(text=[prompt_text], images=[image], return_tensors="pt")
    completion_ids = processor.tokenizer(full_text[len(prompt_text):], add_special_tokens=False,
                                         return_tensors="pt")["input_ids"]
    n = completion_ids.size(1)
    inputs["input_ids"] = torch.cat([inputs["input_ids"], completion_ids], dim=1)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    for key in ("mm_token_type_ids", "token_type_ids"):  # Qwen / Gemma 3: image positions of the prompt
        if key in inputs:
            inputs[key] = torch.cat([inputs[key], torch.zeros_like(completion_ids)], dim=1)
    with torch.no_grad():
        logits = model(**inputs).logits[0, -n - 1:-1]
    return torch.log_softmax(logits.double(), dim=-1).gather(1, completion_ids[0, :, None]).sum().item()


@pytest.mark.parametrize("family", FAMILIES)
def test_nca_p_loss_equals_independent_computation(family, tiny_family_dir, synthetic_dir, tmp_path):
    tiny_model_dir = tiny_family_dir(family)
    trainer, dataset = make_trainer("nca_p", tiny_model_dir, synthetic_dir, tmp_path)
    perturb(trainer.model)
    examples = [dict(dataset[i]) for i in range(2)]
    batch = trainer.data_collator([dict(e) for e in examples])
    loss = trainer.compute_loss(trainer.model, batch).item()

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    reference = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    policy = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    perturb(policy)
    chosen, rejected = torch.zeros(2, 2), torch.zeros(2, 2)
    for i, ex in enumerate(examples):
        image = ex["images"][0]
        for j in (0, 1):
            for target, column in ((chosen, f"chosen_{j}"), (rejected, f"rejected_{j}")):
                target[i, j] = (independent_logp(policy, processor, image, ex[f"prompt_{j}"], ex[column])
                                - independent_logp(reference, processor, image, ex[f"prompt_{j}"], ex[column]))
    per_example = nca_p_loss(chosen, rejected, 0.1)
    assert abs(chosen).max() > 1e-3  # the log-ratios are not trivially zero
    assert loss == pytest.approx(per_example.mean().item(), abs=1e-5)

    # one example per batch: the trainer's loss is the per-example loss itself
    for i in range(2):
        single = trainer.data_collator([dict(examples[i])])
        assert trainer.compute_loss(trainer.model, single).item() == pytest.approx(per_example[i].item(), abs=1e-5)


def loss_and_grads(trainer, batch):
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return loss.item(), grads


@pytest.mark.parametrize("family", SHARING)
@pytest.mark.parametrize("kind,lora", [("nca_p", False), ("nca_p", True), ("dpo", False), ("dpo", True)])
def test_shared_vision_changes_nothing_but_the_work(kind, lora, family, tiny_family_dir, synthetic_dir, tmp_path):
    tiny_model_dir = tiny_family_dir(family)
    trainer, dataset = make_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path, lora=lora)
    if not lora:
        perturb(trainer.model)
    collator_class = NCAPCollator if kind == "nca_p" else PreferenceCollator
    processor = trainer.processing_class
    examples = [dict(dataset[i]) for i in range(2)]
    repeated = collator_class(processor, shared_vision=False)([dict(e) for e in examples])
    shared = collator_class(processor, shared_vision=True)([dict(e) for e in examples])
    rows = repeated["input_ids"].size(0)
    assert repeated["image_grid_thw"].size(0) == rows and shared["image_grid_thw"].size(0) == 2
    assert shared["image_index"].tolist() == [i % 2 for i in range(rows)]

    loss_a, grads_a = loss_and_grads(trainer, repeated)
    loss_b, grads_b = loss_and_grads(trainer, shared)
    assert loss_a == pytest.approx(loss_b, abs=TOL)
    assert grads_a.keys() == grads_b.keys() and grads_a
    assert any(g.abs().sum() > 0 for g in grads_a.values())
    for name in grads_a:
        assert (grads_a[name] - grads_b[name]).abs().max().item() <= TOL, name


def count_vision_calls(model):
    from losses.shared_vision import vision_backbone

    calls = []
    visual = vision_backbone(model).visual
    visual.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[0]))
    return calls


@pytest.mark.parametrize("family", SHARING)
def test_vision_tower_runs_once_per_image(family, tiny_family_dir, synthetic_dir, tmp_path):
    trainer, dataset = make_trainer("nca_p", tiny_family_dir(family), synthetic_dir, tmp_path)
    policy_calls, reference_calls = count_vision_calls(trainer.model), count_vision_calls(trainer.ref_model)
    batch = trainer.data_collator([dict(dataset[i]) for i in range(2)])
    trainer.compute_loss(trainer.model, batch)
    patches = int(batch["image_grid_thw"].prod(-1).sum())
    assert batch["input_ids"].size(0) == 8  # 2 examples x 4 sequences
    assert policy_calls == reference_calls == [patches]  # each model encodes the 2 images once, not 8 times


@pytest.mark.parametrize("kind,family", [("nca_p", f) for f in FAMILIES] + [("dpo", "qwen2_vl"), ("dpo", "gemma3")])
def test_precomputed_reference_equals_live_reference(kind, family, tiny_family_dir, synthetic_dir, tmp_path):
    tiny_model_dir = tiny_family_dir(family)
    live, dataset = make_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "live")
    pre, pre_dataset = make_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "pre",
                                    precompute_ref_log_probs=True)
    assert pre.ref_model is None and live.ref_model is not None
    cache = list((tmp_path / "pre" / "out" / "ref_logps").glob("train-*.parquet"))
    assert len(cache) == 1
    columns = pre.train_dataset.column_names
    assert "ref_logps" in columns and len(pre.train_dataset[0]["ref_logps"]) == pre.collator_class.sequences_per_example == (4 if kind == "nca_p" else 2)

    # same rows, same reference values as a live reference pass
    batch_live = live.data_collator([dict(dataset[i]) for i in range(2)])
    batch_pre = pre.data_collator([dict(pre.train_dataset[i]) for i in range(2)])
    live_ref = live.reference_logps(batch_live)
    stored = torch.tensor([pre.train_dataset[i]["ref_logps"] for i in range(2)])
    assert torch.allclose(torch.cat(stored.unbind(1)), live_ref, atol=1e-4)

    # step 0, with the policy moved away from the reference in both: the same loss
    perturb(live.model)
    perturb(pre.model)
    loss_live = live.compute_loss(live.model, batch_live).item()
    loss_pre = pre.compute_loss(pre.model, batch_pre).item()
    assert loss_live == pytest.approx(loss_pre, abs=1e-5)
    assert loss_live != pytest.approx(4 * 0.6931471805599453 if kind == "nca_p" else 0.6931471805599453, abs=1e-4)

    # a second run with the same model and data reuses the cache instead of recomputing
    mtime = cache[0].stat().st_mtime_ns
    again, _ = make_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "pre", precompute_ref_log_probs=True)
    assert cache[0].stat().st_mtime_ns == mtime
    assert again.train_dataset["ref_logps"] == pre.train_dataset["ref_logps"]


@pytest.mark.parametrize("family", NOT_SHARING)
@pytest.mark.parametrize("kind", ["nca_p", "dpo"])
def test_family_without_sharing_says_so_once_and_trains_plain(kind, family, tiny_family_dir, synthetic_dir, tmp_path,
                                                                caplog):
    with caplog.at_level("WARNING"):
        trainer, dataset = make_trainer(kind, tiny_family_dir(family), synthetic_dir, tmp_path)
    warnings = [r.getMessage() for r in caplog.records if "shared_vision" in r.getMessage()]
    assert len(warnings) == 1 and family in warnings[0] and "plain path" in warnings[0]
    assert trainer.args.shared_vision is False and trainer.data_collator.shared_vision is False
    batch = trainer.data_collator([dict(dataset[i]) for i in range(2)])
    assert "image_index" not in batch and batch["pixel_values"].size(0) == batch["input_ids"].size(0)
    perturb(trainer.model)
    loss, grads = loss_and_grads(trainer, batch)
    assert torch.isfinite(torch.tensor(loss)) and any(g.abs().sum() > 0 for g in grads.values())
