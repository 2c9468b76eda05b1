"""Which attention a packed row runs (`packed_attention: auto | flex | sdpa`, losses/packing.py), on CPU, float32:

- the default on CUDA (the CUDA branch forced on CPU): the first packed step runs, on sdpa with the tree mask
  (transformers refuses its own flex_attention for the Qwen-VL classes: the old CUDA path stopped there);
- flex through our registered attention function, on every Qwen family, for the passes without gradient (a
  no-grad forward, the reference pass, the precomputed reference pass, evaluation): per-token log-probabilities
  equal the sdpa tree mask's and the unpacked batch's within 1e-5; gradient passes on CPU run sdpa;
- a flex that fails: `auto` warns once and gives the sdpa result, `flex` stops with one line and exit status 2;
- what ran goes into the card and the W&B config; the dense mask's size is checked before it is built.
"""

import logging

import pytest
import torch
from test_packing import PACKING, TOL, token_logps, trainer_for
from test_packing import both_batches as batches
from test_preference_trainers import make_trainer, perturb

from cli.errors import InputError
from losses import packing
from vlm.families import FAMILIES

pytestmark = pytest.mark.slow
FLEX = "flex_attention (block mask)"
SDPA = "sdpa (boolean tree mask)"


class CudaLooking(torch.Tensor):
    """A CPU tensor that says it is on CUDA: what the packed forward sees of a batch on a GPU, without one."""
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return torch.device("cuda")


@pytest.mark.parametrize("family", PACKING)
def test_the_default_on_cuda_runs_its_first_packed_step(family, tiny_family_dir, synthetic_dir, tmp_path):
    """Before: `Qwen2VLTextModel does not support an attention implementation through torch's flex_attention`."""
    trainer, dataset = trainer_for("dpo", family, tiny_family_dir, synthetic_dir, tmp_path)
    perturb(trainer.model)
    _, packed = batches(trainer, dataset, "dpo")
    on_cpu = token_logps(trainer.model, packed).detach()
    on_cuda = dict(packed, packed_segments=packed["packed_segments"].as_subclass(CudaLooking))
    assert on_cuda["packed_segments"].device.type == "cuda"
    logps = token_logps(trainer.model, on_cuda)  # a gradient pass, as the first training step
    logps.sum().backward()
    assert torch.equal(logps.detach(), on_cpu)
    assert trainer.packed_attention.summary() == {"requested": "auto", "gradient": SDPA}


@pytest.mark.parametrize("family", PACKING)
def test_flex_equals_sdpa_and_unpacked_without_gradient(family, tiny_family_dir, synthetic_dir, tmp_path):
    kind = "nca_p"
    trainer, dataset = trainer_for(kind, family, tiny_family_dir, synthetic_dir, tmp_path, packed_attention="flex")
    perturb(trainer.model)
    unpacked, packed = batches(trainer, dataset, kind)
    assert trainer.model.config.get_text_config()._attn_implementation == packing.ATTENTION
    with torch.no_grad():
        plain = token_logps(trainer.model, unpacked)
        flex = token_logps(trainer.model, packed)
        reference = trainer.reference_logps(packed)  # the reference pass (full fine-tuning: the reference model)
    assert trainer.packed_attention.ran == {"no_gradient": FLEX}
    sdpa = token_logps(trainer.model, packed).detach()  # a gradient pass: on CPU, sdpa
    assert trainer.packed_attention.ran == {"no_gradient": FLEX, "gradient": SDPA}
    assert (flex - sdpa).abs().max().item() <= TOL and (flex - plain).abs().max().item() <= TOL
    assert (flex != 0).sum() > 100 and not torch.equal(flex, sdpa)  # two kernels, the same values
    with torch.no_grad():
        plain_reference = trainer.reference_logps(unpacked)
    assert reference.tolist() == pytest.approx(plain_reference.tolist(), rel=1e-6, abs=TOL)


# every packing family, DPO and NCA-P alternating (one trainer pair each: a precompute, an evaluation, a step)
PRECOMPUTED = [(("dpo", "nca_p")[i % 2], family) for i, family in enumerate(PACKING)]


@pytest.mark.parametrize("kind,family", PRECOMPUTED, ids=[f"{k}-{f}" for k, f in PRECOMPUTED])
def test_flex_precomputed_reference_and_evaluation(kind, family, tiny_family_dir, synthetic_dir, tmp_path):
    flex, dataset = trainer_for(kind, family, tiny_family_dir, synthetic_dir, tmp_path / "flex",
                                packed_attention="flex", precompute_ref_log_probs=True)
    assert flex.packed_attention.ran == {"no_gradient": FLEX}  # the precompute pass ran flex
    plain, _ = make_trainer(kind, tiny_family_dir(family), synthetic_dir, tmp_path / "plain", packed=False)
    batch = plain.data_collator([dict(dataset[i]) for i in range(4)])
    unpacked_ref = torch.stack(plain.reference_logps(batch).chunk(plain.collator_class.sequences_per_example), 1)
    stored = torch.tensor(flex.train_dataset["ref_logps"])
    assert stored.flatten().tolist() == pytest.approx(unpacked_ref.flatten().tolist(), rel=1e-6, abs=TOL)

    perturb(flex.model)
    metrics = flex.evaluate(eval_dataset=flex.train_dataset)  # no gradient: flex
    flex.model.train()
    loss = flex.compute_loss(flex.model, flex.data_collator([dict(flex.train_dataset[i]) for i in range(4)]))
    assert flex.packed_attention.ran == {"no_gradient": FLEX, "gradient": SDPA}
    assert metrics["eval_loss"] == pytest.approx(loss.item(), abs=TOL)


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_a_batch_builds_its_mask_once_for_policy_and_reference(attention, tiny_family_dir, synthetic_dir, tmp_path,
                                                               monkeypatch):
    """A DPO step with a live reference model: the policy's and the reference's packed passes take one mask, built
    once per batch (sdpa: a training step, both passes on the dense mask; flex: the step without gradient, as in
    evaluation, both passes on the block mask)."""
    trainer, dataset = trainer_for("dpo", "qwen2_vl", tiny_family_dir, synthetic_dir, tmp_path,
                                   packed_attention=attention)
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
    perturb(trainer.model)
    builds, uses = [], []
    for name in ("tree_attention_mask", "tree_block_mask"):
        monkeypatch.setattr(packing, name, lambda *a, build=getattr(packing, name), name=name: builds.append(name)
                            or build(*a))
    share = trainer.packed_attention.mask
    monkeypatch.setattr(trainer.packed_attention, "mask", lambda *a: uses.append(a[0]) or share(*a))
    batches = [trainer.data_collator([dict(dataset[i]) for i in (2 * b, 2 * b + 1)]) for b in range(2)]
    for batch in batches:
        with torch.set_grad_enabled(attention == "sdpa"):
            trainer.compute_loss(trainer.model, batch)
    built = "tree_block_mask" if attention == "flex" else "tree_attention_mask"
    assert uses == [attention] * 4  # two batches x (policy, reference)
    assert builds == [built] * 2  # once per batch
    assert trainer.packed_attention.ran == ({"no_gradient": FLEX} if attention == "flex" else
                                            {"gradient": SDPA, "no_gradient": SDPA})


def failing_flex(*args, **kwargs):
    raise RuntimeError("flex kernel failed to compile\nsecond line")


def test_auto_falls_back_to_sdpa_with_one_warning(tiny_family_dir, synthetic_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(FAMILIES["qwen2_vl"], "flex_routes", (("cpu", "no_gradient"),))  # as if flex had run here
    trainer, dataset = trainer_for("dpo", "qwen2_vl", tiny_family_dir, synthetic_dir, tmp_path)
    perturb(trainer.model)
    _, packed = batches(trainer, dataset, "dpo")
    sdpa = token_logps(trainer.model, packed).detach()
    monkeypatch.setattr(packing, "flex_attention", failing_flex)
    with caplog.at_level(logging.WARNING, logger="losses.packing"), torch.no_grad():
        first, second = token_logps(trainer.model, packed), token_logps(trainer.model, packed)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "losses.packing"]
    assert len(warnings) == 1 and "continuing on sdpa" in warnings[0].getMessage()
    assert torch.equal(first, sdpa) and torch.equal(second, sdpa)
    assert trainer.packed_attention.summary() == {
        "requested": "auto", "gradient": SDPA, "no_gradient": SDPA,
        "flex_failed": "RuntimeError: flex kernel failed to compile"}


def test_explicit_flex_that_fails_stops_with_one_line(tiny_family_dir, synthetic_dir, tmp_path, monkeypatch,
                                                      capsys):
    from cli.entry import run_main

    trainer, dataset = trainer_for("dpo", "qwen2_vl", tiny_family_dir, synthetic_dir, tmp_path,
                                   packed_attention="flex")
    _, packed = batches(trainer, dataset, "dpo")
    monkeypatch.setattr(packing, "flex_attention", failing_flex)
    capsys.readouterr()  # the trainer's own messages
    with torch.no_grad():
        assert run_main(lambda: token_logps(trainer.model, packed)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "packed_attention: flex failed on the first packed forward (RuntimeError: flex " \
                              "kernel failed to compile)" in err[0], err
    assert "gradient" not in trainer.packed_attention.ran


def test_the_dense_mask_size_is_checked_before_it_is_built(tiny_family_dir, synthetic_dir, tmp_path, monkeypatch):
    trainer, dataset = trainer_for("dpo", "qwen2_vl", tiny_family_dir, synthetic_dir, tmp_path)
    _, packed = batches(trainer, dataset, "dpo")
    tokens = packed["packed_input_ids"].size(1)
    monkeypatch.setattr(packing, "_free_bytes", lambda device: 2 * packing.dense_mask_bytes(tokens) - 2)
    built = []
    monkeypatch.setattr(torch, "arange", lambda *a, **k: built.append(a) or pytest.fail("mask built"))
    with pytest.raises(InputError, match=rf"per_device_train_batch_size: a packed micro-batch of {tokens} tokens "
                                         r"needs .* GiB .* lower per_device_train_batch_size"):
        packing.tree_attention_mask(packed["packed_segments"], packed["packed_ancestors"])
    monkeypatch.undo()
    monkeypatch.setattr(packing, "_free_bytes", lambda device: 2 * packing.dense_mask_bytes(tokens))
    assert packing.tree_attention_mask(packed["packed_segments"], packed["packed_ancestors"]).shape == (
        1, 1, tokens, tokens)


def test_what_ran_goes_into_the_card_and_the_wandb_config(tiny_family_dir, synthetic_dir, tmp_path, monkeypatch):
    import wandb
    import yaml
    from transformers import TrainerControl, TrainerState
    from trl import ModelConfig

    from train.card import CardCallback, build_card
    from train.common import SpyTuneArguments

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    trainer, dataset = trainer_for("dpo", "qwen2_vl", tiny_family_dir, synthetic_dir, tmp_path,
                                   packed_attention="flex")
    _, packed = batches(trainer, dataset, "dpo")
    with torch.no_grad():
        token_logps(trainer.model, packed)
    token_logps(trainer.model, packed)
    ran = {"requested": "flex", "no_gradient": FLEX, "gradient": SDPA}
    script_args = SpyTuneArguments(train_data_path=str(synthetic_dir / "train_data.json"),
                                   image_folder=str(synthetic_dir), dataset_name="spy-tune")
    model_args = ModelConfig(model_name_or_path=str(tiny_family_dir("qwen2_vl")))
    card = build_card(tmp_path, "dpo", model_args.model_name_or_path, script_args, trainer.args, model_args,
                      packed_attention_ran=packing.attention_ran(trainer.model))
    recipe = yaml.safe_load(str(card).split("## Recipe\n\n```yaml\n")[1].split("```")[0])
    assert recipe["packed_attention"] == "flex" and recipe["packed_attention_ran"] == ran

    callback = CardCallback("dpo", script_args, trainer.args, model_args)
    run = wandb.init(project="privacy-align-test", dir=str(tmp_path))
    try:
        state = TrainerState()
        callback.on_step_end(trainer.args, state, TrainerControl(), model=trainer.model)
        assert dict(run.config)["packed_attention_ran"] == ran
    finally:
        run.finish()


@pytest.mark.parametrize("where", ["recipe", "command line"])
def test_packed_attention_is_strict(where, monkeypatch, tmp_path):
    import sys

    from trl import ModelConfig

    from losses.vision_dpo_trainer import VisionDPOConfig
    from train.common import SpyTuneArguments, parse_recipe

    recipe = tmp_path / "dpo.yaml"
    recipe.write_text("model_name_or_path: m\ntrain_data_path: d.json\nimage_folder: .\noutput_dir: out\nuse_cpu: true\n"
                      + ("packed_attention: flash\n" if where == "recipe" else ""))
    flags = ["--packed_attention", "flash"] if where == "command line" else []
    monkeypatch.setattr(sys, "argv", ["dpo.py", str(recipe), *flags])
    with pytest.raises(InputError, match=r"packed_attention.*flash") as err:
        parse_recipe(SpyTuneArguments, VisionDPOConfig, ModelConfig)
    assert "\n" not in str(err.value)
    monkeypatch.setattr(sys, "argv", ["dpo.py", str(recipe), "--packed_attention", "sdpa"])
    if where == "command line":
        assert parse_recipe(SpyTuneArguments, VisionDPOConfig, ModelConfig)[1].packed_attention == "sdpa"
