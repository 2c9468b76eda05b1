"""GPU checks run before the timings of `nca_p_throughput.py`, so that its numbers come from code that computes
the right thing on that device, and the peak its MFU is measured against.

- `fused_head_check`: TRL's fused LM head (a Triton kernel on CUDA: only the completion positions go through the
  head) against an explicit float32 log-softmax of the same hidden states, for the log-probabilities and the
  head's weight gradient.
- `layout_check`: a few NCA-P steps of a small random Qwen2-VL in two batch layouts (shared vision on and off;
  packed (sdpa or flex) and shared), from the same weights on the same batch: the losses agree within the stated
  tolerance. `packed_flex` against `shared` is the flex backward's first run on a GPU.
- `flex_logp_check` (first, on the benchmark's own model: 7B): per-token log-probabilities of one packed batch
  without gradient, flex_attention with the tree's block mask (our registered attention function) against sdpa
  with the boolean tree mask: the same weights, the same batch.
- `matmul_peak`: the dense matrix-product rate the device reaches on one of the model's own shapes.
"""

from __future__ import annotations

import copy
import time

# A small Qwen2-VL: every kernel of the 7B model, seconds per step on a GPU (and on a CPU in --dry-run).
SMALL_SPEC = {"text": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "intermediate_size": 512, "vocab_size": 4096}, "tie_word_embeddings": False,
              "vision": {"depth": 4, "embed_dim": 128, "num_heads": 4, "mlp_ratio": 2}}
# |loss(shared) - loss(repeated)| allowed per step; log-prob and gradient tolerances of the fused head
# attention_logprob_abs: two attention kernels through every layer of the model (bf16 rounds them differently)
TOLERANCES = {"bf16": {"loss_abs": 2e-2, "logprob_abs": 1e-2, "grad_rel": 2e-2, "attention_logprob_abs": 5e-2},
              "fp32": {"loss_abs": 1e-4, "logprob_abs": 1e-4, "grad_rel": 1e-4, "attention_logprob_abs": 1e-4}}


def _timer(device: str):
    import torch

    if device.startswith("cuda"):
        def elapsed(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def elapsed(fn):
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
    return elapsed


def matmul_peak(m: int, k: int, n: int, device: str, dtype, warmup: int = 3, reps: int = 10) -> dict:
    """TFLOP/s of an (m x k) @ (k x n) product in `dtype`, the mean of `reps` timed products."""
    import torch

    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    for _ in range(warmup):
        a @ b
    seconds = _timer(device)(lambda: [a @ b for _ in range(reps)])
    return {"shape": [m, k, n], "dtype": str(dtype).removeprefix("torch."), "tflops": 2 * m * k * n * reps / seconds / 1e12}


def fused_head_check(model, device: str, dtype_name: str, batch: int = 4, length: int = 96) -> dict:
    """Fused (TRL) against explicit float32 log-probabilities on the completion half of random sequences."""
    import torch
    from trl.kernels.chunked_logprob import _use_triton
    from trl.trainer.utils import add_fused_lm_head

    tol = TOLERANCES[dtype_name]
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, min(vocab, 1000), (batch, length), generator=generator).to(device)
    labels = input_ids.masked_fill(torch.arange(length, device=device) < length // 2, -100)
    add_fused_lm_head(model)
    head = model.get_output_embeddings().weight

    fused = model(input_ids=input_ids, labels=labels, fused_lm_head=True, use_cache=False).log_probs
    fused_grad, = torch.autograd.grad(fused.sum(), head)

    hidden = model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state[:, :-1]
    logits = hidden.float() @ head.float().T
    target = labels[:, 1:]
    mask = target != -100
    reference = torch.log_softmax(logits, dim=-1).gather(-1, target.clamp(min=0)[..., None])[..., 0] * mask
    reference_grad, = torch.autograd.grad(reference.sum(), head)

    logprob_err = float((fused.detach().float() - reference.detach()).abs()[mask].max())
    grad_err = float((fused_grad.float() - reference_grad.float()).norm() / reference_grad.float().norm())
    return {"triton": _use_triton(torch.device(device)), "positions": int(mask.sum()),
            "logprob_max_abs_err": logprob_err, "grad_rel_err": grad_err,
            "tolerance": {k: tol[k] for k in ("logprob_abs", "grad_rel")},
            "ok": logprob_err <= tol["logprob_abs"] and grad_err <= tol["grad_rel"]}


def layout_check(build_model, make_trainer, processor, device: str, dtype_name: str,
                 layouts=("shared", "repeated"), steps: int = 3) -> dict:
    """NCA-P steps (full fine-tuning, live reference) in two batch layouts (packed_flex / packed / shared /
    repeated), from the same weights: the losses agree. packed: sdpa with the boolean tree mask; packed_flex:
    flex_attention with the block mask (on CPU only for the passes without gradient: torch has no flex backward
    there)."""
    import torch
    from train_step import train_step

    tol = TOLERANCES[dtype_name]
    losses = {}
    for layout in layouts:
        model = build_model(SMALL_SPEC, processor, device)
        trainer, stepped, batch = make_trainer(model, copy.deepcopy(model), layout)
        losses[layout] = [train_step(trainer, stepped, batch) for _ in range(steps)]
        del trainer, stepped, batch, model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    diffs = [abs(a - b) for a, b in zip(*losses.values())]
    return {"steps": steps, "losses": losses, "max_abs_diff": max(diffs), "tolerance": tol["loss_abs"],
            "weights_moved": len(set(round(v, 6) for v in losses[layouts[0]])) > 1,
            "ok": max(diffs) <= tol["loss_abs"]}


def flex_logp_check(model, make_trainer, device: str, dtype_name: str) -> dict:
    """One packed batch through `model` (LoRA, so no reference copy) without gradient, twice: every pass on flex,
    then on sdpa (`PackedAttention.only`); the per-token completion log-probabilities agree."""
    import torch

    trainer, stepped, batch = make_trainer(model, None, "packed_flex")
    inputs = trainer._prepare_inputs(dict(batch))
    labels = inputs["input_ids"].masked_fill(inputs["completion_mask"] == 0, -100)
    kwargs = {k: v for k, v in inputs.items() if k not in ("completion_mask", "ref_logps", "ref_chosen_logps",
                                                            "ref_rejected_logps")}
    timer, logps, outputs = _timer(device), {}, []
    with torch.no_grad():
        for kind in ("flex", "sdpa", "flex"):  # flex twice: the second call after compilation, for its time
            with trainer.packed_attention.only(kind):
                seconds = timer(lambda: outputs.append(stepped(**kwargs, labels=labels, fused_lm_head=True,
                                                               use_cache=False)))
            logps[kind] = outputs[-1].log_probs.float()
            logps[f"{kind}_seconds"] = seconds
    mask = outputs[-1].label_mask
    diff = (logps["flex"] - logps["sdpa"])[mask].abs()
    tol = TOLERANCES[dtype_name]["attention_logprob_abs"]
    return {"tokens": int(inputs["packed_input_ids"].size(1)), "scored": int(mask.sum()),
            "logprob_max_abs_diff": diff.max().item(), "logprob_mean_abs_diff": diff.mean().item(),
            "mean_logprob": logps["sdpa"][mask].mean().item(), "tolerance": tol,
            "flex_s": logps["flex_seconds"], "sdpa_s": logps["sdpa_seconds"],
            "attention_ran": trainer.packed_attention.summary(), "ok": diff.max().item() <= tol}
