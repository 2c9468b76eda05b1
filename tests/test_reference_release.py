"""The precomputed reference really frees the reference model, and the weight fingerprint that keys its cache.

With full fine-tuning and `precompute_ref_log_probs`, TRL has registered the reference in the accelerator's model
list; the trainer must drop it there too, so that after the precompute pass one model object is alive (the policy)
and the reference's bytes are gone. Counted over every live object, not over the trainer's attributes.
"""

import gc
import sys
from pathlib import Path

import forked_python
import pytest
import torch
from test_preference_trainers import make_trainer
from transformers import Qwen2VLForConditionalGeneration

from losses.fingerprint import tensor_digest, weighted_byte_sum, weights_fingerprint


def live_models() -> list:
    gc.collect()
    return [o for o in gc.get_objects() if issubclass(type(o), Qwen2VLForConditionalGeneration)]


def live_tensor_bytes() -> int:
    """Bytes of every distinct storage held by a live tensor (parameters included). Fake tensors hold no memory:
    torch.compile's caches can keep some alive after an earlier test's compiled call."""
    from torch._subclasses.fake_tensor import FakeTensor

    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and obj.device.type == "cpu" and not isinstance(obj, FakeTensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nca_p", "dpo"])
def test_precompute_frees_the_reference(kind, tiny_model_dir, synthetic_dir, tmp_path):
    assert not live_models()
    live, _ = make_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "live")
    assert len(live_models()) == 2  # policy + reference
    reference_bytes = sum(p.numel() * p.element_size() for p in live.ref_model.parameters())
    with_reference = live_tensor_bytes()
    del live
    assert not live_models()

    pre, _ = make_trainer(kind, tiny_model_dir, synthetic_dir, tmp_path / "pre", precompute_ref_log_probs=True)
    models = live_models()
    assert models == [pre.model]  # the policy alone: the reference is gone from the accelerator too
    assert all(m is not None for m in pre.accelerator._models) and len(pre.accelerator._models) <= 1
    freed = with_reference - live_tensor_bytes()
    # the reference's weights, give or take the small cached-column tensors of the two runs
    assert freed == pytest.approx(reference_bytes, rel=0.05)
    del pre, models
    assert not live_models()


def test_fingerprint_changes_with_any_weight():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.LayerNorm(20)).to(torch.bfloat16)
    before = weights_fingerprint(model)
    assert weights_fingerprint(model) == before
    original = model[0].weight[3, 4].item()
    with torch.no_grad():
        model[0].weight[3, 4] = original + 0.5
    assert weights_fingerprint(model) != before
    with torch.no_grad():
        model[0].weight[3, 4] = original
    assert weights_fingerprint(model) == before
    assert weights_fingerprint(model.float()) != before  # dtype is part of it


def test_weighted_byte_sum_detects_each_change_and_matches_its_definition(monkeypatch):
    """The accelerator path, run here on CPU: every single-byte change and a swap of two bytes change the sum."""
    import losses.fingerprint as fingerprint

    monkeypatch.setattr(fingerprint, "_CHUNK_BYTES", 64)  # several chunks even for a small tensor
    data = torch.randint(0, 256, (1000,), dtype=torch.uint8)
    multiplier = fingerprint._MULTIPLIER % 2**64
    expected = sum(int(b) * ((2 * i * multiplier + 1) % 2**64) for i, b in enumerate(data.tolist())) % 2**64
    assert weighted_byte_sum(data) == expected
    for i in (0, 63, 64, 999):
        changed = data.clone()
        changed[i] ^= 1
        assert weighted_byte_sum(changed) != expected
    swapped = data.clone()
    swapped[[10, 500]] = data[[500, 10]]
    assert data[10] == data[500] or weighted_byte_sum(swapped) != expected
    assert tensor_digest(torch.ones(3)) != tensor_digest(torch.ones(3) * 2)


@pytest.mark.slow
def test_precompute_frees_the_reference_under_deepspeed(tmp_path):
    """DeepSpeed ZeRO-2 (one CPU process): TRL wraps the reference in its own engine; the precompute frees it too."""
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    root = Path(__file__).resolve().parents[1]
    result = forked_python.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
         str(root / "accelerate_configs" / "zero2_cpu.yaml"), str(root / "tests" / "reference_release_probe.py"),
         str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT")]
    assert lines == ["RESULT precompute=False deepspeed=True live_models=2",
                     "RESULT precompute=True deepspeed=True live_models=1"], result.stdout[-2000:]
