"""Time one full training step of NCA-P and DPO on CPU, side by side in one process: the sequences' images
repeated (TRL's layout), shared (each image encoded once) or tree-packed (each example's prompt through the language
model once, no padding: losses/packing.py), each with a live and a precomputed reference.

A step is what the Trainer does per batch: `trainer.training_step` (policy forward + backward, and the reference
forward unless the reference log-probabilities were precomputed) followed by the optimizer step. Each
configuration collates one fixed batch once; the repetitions run every configuration once each, in a rotating
order, so a burst of load from other processes hits all of them alike. Medians (and minima) are reported.

Two random-weight models of one Qwen family (`--family`, default Qwen2-VL) are built in a temporary directory with
train/tiny_model.py:
- tiny:  the test model (text hidden 64 / 2 layers, vision embed 32 / depth 2), images resized to 64 image tokens;
- heavy: vision-heavy (text hidden 256 / 4 layers, vision embed 256 / depth 6), 256 image tokens per image;
- lm_heavy: shaped like SPY at 1 MP in proportion: image tokens most of each sequence (256 of about 300), short
  answers, distractor lines on, and the language model most of the work (text hidden 512 / 6 layers, vision embed
  128 / depth 2). Its packed-vs-shared step ratios are the report's `nca_p_packed_speedup` / `dpo_packed_speedup`.
Images are 16 merged patches a side: 448x448 for the 14-pixel patches of Qwen2-VL and Qwen2.5-VL, 512x512 for
Qwen3-VL's 16-pixel ones, so every family sees the same number of image tokens.

    python benchmarks/train_step.py [--family qwen3_vl] [--configs tiny,heavy,lm_heavy] [--reps 3] [--batch-size 2] [--lora]
                                    [--json benchmarks/results/train_step_cpu.json]
    python benchmarks/train_step.py --configs grpo --json benchmarks/results/train_step_grpo_cpu.json

`--configs grpo` (on the lm_heavy model) compares against the stock TRL trainers, side by side on one batch:
- `grpo_packed_speedup`: our packed GRPO step (the reference's log-prob pass, the policy's with the loss, backward,
  the optimizer step: losses/grpo_trainer.py) against stock `trl.GRPOTrainer`'s on the same rollouts, G = 8
  completions of up to 16 tokens per ~300-token image prompt; the rollouts' generation (transformers `generate`,
  the same for both) is timed separately (`grpo_generation_s`), the step memory as `grpo_step_memory_ratio`;
- `dpo_vs_stock_trl_speedup`: our DPO step (packed, live reference) against stock `trl.DPOTrainer`'s on the same
  pairs (its own vision collator: every image repeated).

Peak memory: the process holds every configuration at once, so its RSS high-water mark says nothing about one of
them. Per configuration we report `state` (bytes of the tensors it keeps between steps: policy weights, optimizer
state, the reference model when there is one) and `step` (how far RSS rises above its starting level during one
step: activations, gradients, temporaries; measured after the timed repetitions by resetting the kernel's
high-water mark, with glibc told to return large blocks to the OS at once), and their sum `peak`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                     "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_key, _value)

MODEL_CONFIGS = {
    "tiny": {},  # build_tiny_model's defaults: 64 image tokens
    "heavy": {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "vision_depth": 6, "vision_embed": 256,
              "max_pixels": "image"},  # the whole image: 256 image tokens
    "lm_heavy": {"hidden": 512, "layers": 6, "heads": 8, "kv_heads": 2, "vision_depth": 2, "vision_embed": 128,
                 "max_pixels": "image"},
}
PATCH_SIZES = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16, "qwen3_vl_moe": 16}  # the families that share vision
METHODS = ("nca_p", "dpo")
METHOD_NAMES = {"nca_p": "NCA-P", "dpo": "DPO"}
# (layout, precompute_ref_log_probs); the first is the baseline: what TRL does out of the box
LAYOUTS = ("repeated", "shared", "packed")
VARIANTS = tuple((layout, precompute) for precompute in (False, True) for layout in LAYOUTS)


def variant_name(method: str, layout: str, precompute: bool) -> str:
    return f"{method}/{layout}/{'precomputed' if precompute else 'live'}"


# ---- memory -------------------------------------------------------------------------------------------------------

def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def release_freed_memory(libc) -> None:
    """glibc keeps freed blocks; from here on, blocks over 64 KiB are mmapped and unmapped on free."""
    if libc is not None:
        libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (fixed: no dynamic raise)
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
        libc.malloc_trim(0)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_rss_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def tensor_mb(tensors) -> float:
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total / 2**20


def state_mb(trainer) -> float:
    """Weights of every live model (policy, reference unless released) and the optimizer state."""
    import torch

    # every model still alive through the trainer or the accelerator's list (a released reference must be in neither)
    models = {id(m): m for m in (trainer.model, trainer.ref_model, *trainer.accelerator._models) if m is not None}
    tensors = [t for m in models.values() for t in (*m.parameters(), *m.buffers())]
    for state in trainer.optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return tensor_mb(tensors)


# ---- set-up -------------------------------------------------------------------------------------------------------

def make_trainer(method, layout, precompute, model_dir, data_dir, out_dir, batch_size, lora):
    from peft import LoraConfig
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from data_prep.spy_tune import build_dataset
    from losses.nca_p_trainer import NCAPConfig, NCAPTrainer
    from losses.vision_dpo_trainer import VisionDPOConfig, VisionDPOTrainer

    dataset = build_dataset(method, data_dir / "train_data.json", data_dir, add_distractors=True, seed=0,
                            num_samples=batch_size)
    config_class, trainer_class = (NCAPConfig, NCAPTrainer) if method == "nca_p" else (VisionDPOConfig,
                                                                                      VisionDPOTrainer)
    args = config_class(output_dir=str(out_dir), use_cpu=True, bf16=False, report_to="none", max_length=None,
                        activation_checkpointing=False, per_device_train_batch_size=batch_size,
                        shared_vision=layout != "repeated", packed=layout == "packed",
                        precompute_ref_log_probs=precompute, disable_tqdm=True)
    peft_config = (LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                              lora_dropout=0.0) if lora else None)
    trainer = trainer_class(model=AutoModelForImageTextToText.from_pretrained(model_dir), args=args,
                            train_dataset=dataset, processing_class=AutoProcessor.from_pretrained(model_dir),
                            peft_config=peft_config)
    model = prepare_like_train(trainer)
    collate_times = []
    for _ in range(3):
        examples = [dict(trainer.train_dataset[i]) for i in range(batch_size)]  # decoded images, as a loader gives
        t0 = time.perf_counter()
        batch = trainer.data_collator(examples)
        collate_times.append(time.perf_counter() - t0)
    return trainer, model, batch, statistics.median(collate_times)


def prepare_like_train(trainer):
    """What `Trainer.train()` sets up before its first step (without its loop): activation checkpointing, the
    optimizer, and accelerate's preparation (device placement, mixed-precision autocast). Returns the model to step."""
    args = trainer.args
    if args.activation_checkpointing:
        kwargs = dict(args.activation_checkpointing_kwargs or {})
        trainer.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None)
    trainer.create_optimizer()
    model, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's own loop
    return model


def train_step(trainer, model, batch) -> float:
    """One optimizer step on `batch`, as Trainer's loop does it; returns the loss."""
    trainer._metrics["train"].clear()
    loss = trainer.training_step(model, dict(batch))
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss.item()


def batch_stats(batch) -> dict:
    grid = batch["image_grid_thw"]
    packed = batch.get("packed_input_ids")
    return {"sequences": int(batch["input_ids"].size(0)), "padded_length": int(batch["input_ids"].size(1)),
            "tokens": int(batch["attention_mask"].sum()), "images_encoded": int(grid.size(0)),
            "image_tokens_per_image": int(grid[0].prod()) // 4,
            "language_model_tokens": int(batch["input_ids"].numel() if packed is None else packed.numel())}


# ---- benchmark ----------------------------------------------------------------------------------------------------

def image_size(family: str) -> int:
    return 16 * 2 * PATCH_SIZES[family]  # 16 x 16 merged 2x2 patch blocks


def model_config(name: str, family: str) -> dict:
    return {k: image_size(family) ** 2 if v == "image" else v for k, v in MODEL_CONFIGS[name].items()}


def benchmark_config(name, workdir, data_dir, args, libc) -> dict:
    from train.tiny_model import build_tiny_model

    model_dir = build_tiny_model(workdir / f"model-{name}", family=args.family, **model_config(name, args.family))
    runs = {}
    for method in args.methods:
        for layout, precompute in VARIANTS:
            key = variant_name(method, layout, precompute)
            t0 = time.perf_counter()
            trainer, model, batch, collate_s = make_trainer(method, layout, precompute, model_dir, data_dir,
                                                     workdir / f"out-{name}", args.batch_size, args.lora)
            runs[key] = {"trainer": trainer, "model": model, "batch": batch, "times": [], "setup_s": time.perf_counter() - t0,
                         "collate_s": collate_s}
            print(f"  [{name}] built {key} ({runs[key]['setup_s']:.1f} s)", flush=True)
    keys = list(runs)
    for run in runs.values():  # warm-up: optimizer state, lazy initialisations
        run["loss"] = train_step(run["trainer"], run["model"], run["batch"])
    for rep in range(args.reps):
        order = keys[rep % len(keys):] + keys[:rep % len(keys)]
        for key in order:
            run = runs[key]
            t0 = time.perf_counter()
            train_step(run["trainer"], run["model"], run["batch"])
            run["times"].append(time.perf_counter() - t0)
        print(f"  [{name}] repetition {rep + 1}/{args.reps}: "
              + ", ".join(f"{k}={runs[k]['times'][-1]:.2f}s" for k in keys), flush=True)

    release_freed_memory(libc)
    can_measure = reset_rss_peak()
    for key in keys:
        run = runs[key]
        if libc is not None:
            libc.malloc_trim(0)
        start = _status_kb("VmRSS")
        if can_measure and reset_rss_peak():
            train_step(run["trainer"], run["model"], run["batch"])
            run["step_mb"] = max(0, _status_kb("VmHWM") - start) / 1024
        else:
            run["step_mb"] = None
        run["state_mb"] = state_mb(run["trainer"])

    model = runs[keys[0]]["trainer"].model
    params = {"total": sum(p.numel() for p in model.parameters()),
              "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    params["vision"] = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    result = {"model": {"family": args.family, **model_config(name, args.family), "parameters": params},
              "variants": {}, "ratios": {}}
    for key in keys:
        run = runs[key]
        times = run["times"]
        peak = None if run["step_mb"] is None else run["state_mb"] + run["step_mb"]
        result["variants"][key] = {
            "median_s": statistics.median(times), "min_s": min(times), "times_s": times,
            "state_mb": run["state_mb"], "step_mb": run["step_mb"], "peak_mb": peak,
            "loss_first_step": run["loss"], "batch": batch_stats(run["batch"]), "setup_s": run["setup_s"],
            "collate_s": run["collate_s"],
        }
    for method in args.methods:
        result["ratios"].update(method_ratios(method, result["variants"]))
    del runs
    return result


RATIOS = {  # name: (slower variant, faster variant) as (layout, precompute)
    "shared_vision_speedup": (("repeated", False), ("shared", False)),
    "shared_vision_speedup_precomputed": (("repeated", True), ("shared", True)),
    "packed_speedup": (("shared", False), ("packed", False)),
    "packed_speedup_precomputed": (("shared", True), ("packed", True)),
    "precompute_speedup": (("shared", False), ("shared", True)),
    "precompute_speedup_repeated": (("repeated", False), ("repeated", True)),
    "combined_speedup": (("repeated", False), ("packed", True)),
}


def method_ratios(method: str, variants: dict) -> dict:
    out = {}
    for ratio, (slow, fast) in RATIOS.items():
        a, b = variants[variant_name(method, *slow)], variants[variant_name(method, *fast)]
        out[f"{method}_{ratio}"] = a["median_s"] / b["median_s"]
        out[f"{method}_{ratio}_min"] = a["min_s"] / b["min_s"]
    return out


# ---- against the stock TRL trainers (--configs grpo) ------------------------------------------------------------------

GRPO_G, GRPO_PROMPTS, GRPO_COMPLETION = 8, 2, 16


def make_grpo_trainer(stock: bool, model_dir, data_dir, out_dir, lora):
    from peft import LoraConfig
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import GRPOConfig, GRPOTrainer

    from data_prep.spy_tune import build_dataset
    from losses.grpo_trainer import VisionGRPOConfig, VisionGRPOTrainer
    from train.rewards import JudgeSettings, VerdictJudge, make_reward_funcs

    dataset = build_dataset("grpo", data_dir / "train_data.json", data_dir, add_distractors=True, seed=0,
                            num_samples=GRPO_PROMPTS)
    common = dict(output_dir=str(out_dir), use_cpu=True, bf16=False, report_to="none", disable_tqdm=True,
                  activation_checkpointing=False, per_device_train_batch_size=GRPO_G * GRPO_PROMPTS,
                  num_generations=GRPO_G, max_completion_length=GRPO_COMPLETION, beta=0.04)
    processor = AutoProcessor.from_pretrained(model_dir, padding_side="left")  # what TRL loads itself
    peft_config = (LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                              lora_dropout=0.0) if lora else None)
    rewards = make_reward_funcs(["privacy_compliance", "helpfulness"], VerdictJudge(JudgeSettings()))
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    if stock:
        trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=GRPOConfig(**common), train_dataset=dataset,
                              processing_class=processor, peft_config=peft_config)
    else:
        trainer = VisionGRPOTrainer(model=model, reward_funcs=rewards, args=VisionGRPOConfig(**common, packed=True),
                                    train_dataset=dataset, processing_class=processor, peft_config=peft_config)
    trainer.model.train()
    return trainer, prepare_like_train(trainer), dataset


def grpo_step(trainer, model, batch) -> float:
    """The training side of a GRPO step on fixed rollouts: the reference's log-prob pass (what
    `_generate_and_score_completions` runs after generating), the policy's with the loss, backward, optimizer."""
    import torch
    from trl.trainer.utils import use_adapter

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    images = {k: batch[k] for k in ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")}
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    reference = trainer.ref_model or trainer.model
    context = use_adapter(unwrapped, adapter_name=None) if trainer.ref_model is None else contextlib.nullcontext()
    with torch.no_grad(), context:
        batch = {**batch, "ref_per_token_logps": trainer._get_per_token_logps_and_entropies(
            reference, ids, mask, batch["completion_ids"].size(1), **images)[0]}
    trainer._metrics["train"].clear()
    loss = trainer.compute_loss(model, batch)  # GRPOTrainer.training_step would generate new rollouts first
    trainer.accelerator.backward(loss)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss.item()


def benchmark_against_trl(workdir, data_dir, args, libc) -> dict:
    """Ours against stock TRL: GRPO (packed vs GRPOTrainer) and DPO (packed vs DPOTrainer), one lm_heavy model."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import DPOConfig, DPOTrainer

    from data_prep.spy_tune import build_dataset
    from train.tiny_model import build_tiny_model

    model_dir = build_tiny_model(workdir / "model-grpo", family=args.family, **model_config("lm_heavy", args.family))
    runs = {}
    for name in ("grpo/stock_trl", "grpo/packed"):
        trainer, model, dataset = make_grpo_trainer(name == "grpo/stock_trl", model_dir, data_dir,
                                                    workdir / f"out-{name.replace('/', '-')}", args.lora)
        runs[name] = {"trainer": trainer, "model": model, "step": grpo_step, "times": []}
    rows = [dict(dataset[i // GRPO_G]) for i in range(GRPO_G * GRPO_PROMPTS)]
    stock = runs["grpo/stock_trl"]["trainer"]
    generation = []
    for _ in range(2):  # the rollouts: generation and scoring, with transformers, as the stock trainer makes them
        torch.manual_seed(0)
        t0 = time.perf_counter()
        batch = stock._generate_and_score_completions([dict(r) for r in rows])
        generation.append(time.perf_counter() - t0)
    batch = {k: v for k, v in batch.items() if k not in ("ref_per_token_logps", "old_per_token_logps")}
    for run in runs.values():
        run["batch"] = batch
    for name in ("dpo/stock_trl", "dpo/packed"):
        dataset = build_dataset("dpo", data_dir / "train_data.json", data_dir, add_distractors=True, seed=0,
                                num_samples=args.batch_size)
        common = dict(output_dir=str(workdir / f"out-{name.replace('/', '-')}"), use_cpu=True, bf16=False,
                      report_to="none", max_length=None, activation_checkpointing=False, disable_tqdm=True,
                      per_device_train_batch_size=args.batch_size)
        if name == "dpo/stock_trl":
            trainer = DPOTrainer(model=AutoModelForImageTextToText.from_pretrained(model_dir), args=DPOConfig(**common),
                                 train_dataset=dataset, processing_class=AutoProcessor.from_pretrained(model_dir))
            model = prepare_like_train(trainer)
            batch = trainer.data_collator([dict(trainer.train_dataset[i]) for i in range(args.batch_size)])
        else:
            trainer, model, batch, _ = make_trainer("dpo", "packed", False, model_dir, data_dir,
                                                    workdir / "out-dpo-packed", args.batch_size, args.lora)
        runs[name] = {"trainer": trainer, "model": model, "batch": batch, "times": [],
                      "step": lambda t, m, b: train_step(t, m, b)}
        print(f"  [grpo] built {name}", flush=True)
    keys = list(runs)
    for run in runs.values():
        run["loss"] = run["step"](run["trainer"], run["model"], run["batch"])
    for rep in range(args.reps):
        for key in keys[rep % len(keys):] + keys[:rep % len(keys)]:
            run = runs[key]
            t0 = time.perf_counter()
            run["step"](run["trainer"], run["model"], run["batch"])
            run["times"].append(time.perf_counter() - t0)
        print(f"  [grpo] repetition {rep + 1}/{args.reps}: "
              + ", ".join(f"{k}={runs[k]['times'][-1]:.2f}s" for k in keys), flush=True)
    release_freed_memory(libc)
    can_measure = reset_rss_peak()
    for run in runs.values():
        if libc is not None:
            libc.malloc_trim(0)
        start = _status_kb("VmRSS")
        if can_measure and reset_rss_peak():
            run["step"](run["trainer"], run["model"], run["batch"])
            run["step_mb"] = max(0, _status_kb("VmHWM") - start) / 1024
        else:
            run["step_mb"] = None
        run["state_mb"] = state_mb(run["trainer"])
    completion_tokens = int(runs["grpo/packed"]["batch"]["completion_mask"].sum())
    result = {"model": {"family": args.family, **model_config("lm_heavy", args.family)},
              "grpo_batch": {"prompts": GRPO_PROMPTS, "num_generations": GRPO_G,
                             "prompt_tokens": int(runs["grpo/packed"]["batch"]["prompt_mask"].sum(1)[0]),
                             "completion_tokens": completion_tokens},
              "generation_s": generation, "variants": {}, "ratios": {}}
    for key, run in runs.items():
        result["variants"][key] = {"median_s": statistics.median(run["times"]), "min_s": min(run["times"]),
                                   "times_s": run["times"], "state_mb": run["state_mb"], "step_mb": run["step_mb"],
                                   "loss_first_step": run["loss"]}
    v = result["variants"]
    for method in ("grpo", "dpo"):
        slow, fast = v[f"{method}/stock_trl"], v[f"{method}/packed"]
        name = "grpo_packed_speedup" if method == "grpo" else "dpo_vs_stock_trl_speedup"
        result["ratios"][name] = slow["median_s"] / fast["median_s"]
        result["ratios"][name + "_min"] = slow["min_s"] / fast["min_s"]
        memory = (slow["step_mb"] / fast["step_mb"]) if slow["step_mb"] and fast["step_mb"] else None
        result["ratios"][f"{method}_step_memory_ratio"] = memory
    del runs
    return result


def _mb(x) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def markdown_table(name: str, result: dict) -> str:
    params = result["model"]["parameters"]
    batches = {METHOD_NAMES[k.split("/")[0]]: v["batch"] for k, v in result["variants"].items() if "/shared/" in k}
    lines = [(f"### {result['model']['family']} {name}: {params['total'] / 1e6:.1f}M parameters ({params['vision'] / 1e6:.1f}M vision, "
             f"{params['trainable'] / 1e6:.2f}M trained)"), "",
             "Batch: " + "; ".join(f"{m} {b['sequences']} sequences x {b['padded_length']} tokens "
                                   f"({b['tokens']} real), {b['image_tokens_per_image']} image tokens per image"
                                   for m, b in batches.items()),
             "",
             ("| method | layout | reference | LM tokens | median s | min s | vs repeated/live | vs shared | state MB "
              "| step MB | peak MB | collate s |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, v in result["variants"].items():
        method, vision, reference = key.split("/")
        base = result["variants"][variant_name(method, "repeated", False)]["median_s"]
        shared = result["variants"][variant_name(method, "shared", reference == "precomputed")]["median_s"]
        lines.append(f"| {METHOD_NAMES[method]} | {vision} | {reference} | {v['batch']['language_model_tokens']} | "
                     f"{v['median_s']:.3f} | {v['min_s']:.3f} | {base / v['median_s']:.2f}x | "
                     f"{shared / v['median_s']:.2f}x | {_mb(v['state_mb'])} | {_mb(v['step_mb'])} | "
                     f"{_mb(v['peak_mb'])} | {v['collate_s']:.3f} |")
    lines.append("")
    for key, value in result["ratios"].items():
        if not key.endswith("_min"):
            lines.append(f"- {key}: **{value:.2f}x** (min/min {result['ratios'][key + '_min']:.2f}x)")
    return "\n".join(lines)


def grpo_table(result: dict) -> str:
    b = result["grpo_batch"]
    lines = [f"### {result['model']['family']} lm_heavy against stock TRL", "",
             f"GRPO: {b['prompts']} prompts x G = {b['num_generations']} ({b['prompt_tokens']}-token prompt, "
             f"{b['completion_tokens']} completion tokens in all); generation (not in the step) median "
             f"{statistics.median(result['generation_s']):.2f} s", "",
             "| step | median s | min s | state MB | step MB |", "|---|---|---|---|---|"]
    for key, v in result["variants"].items():
        lines.append(f"| {key} | {v['median_s']:.3f} | {v['min_s']:.3f} | {_mb(v['state_mb'])} | {_mb(v['step_mb'])} |")
    lines.append("")
    for key, value in result["ratios"].items():
        if value is not None and not key.endswith("_min"):
            lines.append(f"- {key}: **{value:.2f}x**")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen2_vl", choices=list(PATCH_SIZES),
                        help="model family (train/tiny_model.py); the ones that share vision encoding")
    parser.add_argument("--configs", default="tiny,heavy,lm_heavy", help="comma-separated, of: " + ", ".join(MODEL_CONFIGS))
    parser.add_argument("--methods", default="nca_p,dpo", help="comma-separated, of: " + ", ".join(METHODS))
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions of every configuration")
    parser.add_argument("--batch-size", type=int, default=2, help="examples per step (NCA-P: 4 sequences each)")
    parser.add_argument("--lora", action="store_true", help="LoRA (r=8, attention projections) instead of full FT")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (0: torch's default). 1 by default: on a shared machine, OpenMP "
                             "threads that wait for a descheduled sibling make every op many times slower")
    parser.add_argument("--json", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    args.methods = [m for m in args.methods.split(",") if m]
    bad = [c for c in args.configs if c not in (*MODEL_CONFIGS, "grpo")] + [m for m in args.methods if m not in METHODS]
    if bad or args.reps < 1 or args.batch_size < 1:
        parser.error(f"unknown config/method {bad}" if bad else "--reps and --batch-size must be >= 1")

    import datasets
    import torch
    import transformers
    import trl

    from data_prep.synthetic import build

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    if args.threads:
        torch.set_num_threads(args.threads)
    libc = _libc()
    started = time.time()
    report = {
        "benchmark": "train_step_cpu",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average_start": os.getloadavg(), "python": sys.version.split()[0],
                    "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "settings": {"family": args.family, "reps": args.reps, "batch_size": args.batch_size,
                     "finetune": "lora" if args.lora else "full", "image_size": image_size(args.family), "dtype": "float32", "activation_checkpointing": False},
        "configs": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-train-step-") as tmp:
        workdir = Path(tmp)
        data_dir = build(workdir / "data", train_per_label=1, test_per_label=1, image_size=image_size(args.family))
        for name in args.configs:
            print(f"[{name}] building the model and its trainers", flush=True)
            benchmark = benchmark_against_trl if name == "grpo" else benchmark_config
            report["configs"][name] = benchmark(name, workdir, data_dir, args, libc) if name != "grpo" else \
                benchmark(workdir, data_dir, args, libc)
    report["machine"]["load_average_end"] = os.getloadavg()
    report["wall_s"] = time.time() - started
    for name, result in report["configs"].items():
        if name == "grpo":
            report.update({k: v for k, v in result["ratios"].items() if not k.endswith("_min")})
            report["grpo_generation_s"] = statistics.median(result["generation_s"])
            continue
        prefix = "" if name in ("heavy", "lm_heavy") else f"{name}_"
        ratios = ("packed_speedup",) if name == "lm_heavy" else ("shared_vision_speedup", "precompute_speedup",
                                                                 "combined_speedup")
        for method in args.methods:
            for ratio in ratios:
                report[f"{prefix}{method}_{ratio}"] = result["ratios"][f"{method}_{ratio}"]
            if name == "lm_heavy":  # how much less a step needs on top of the kept state (shared / packed)
                shared, packed = (result["variants"][variant_name(method, layout, False)]["step_mb"]
                                  for layout in ("shared", "packed"))
                report[f"{method}_packed_step_memory_ratio"] = shared / packed if shared and packed else None

    print()
    for name, result in report["configs"].items():
        print(grpo_table(result) if name == "grpo" else markdown_table(name, result))
        print()
    print(f"torch threads {torch.get_num_threads()}, load average {report['machine']['load_average_start']} -> "
          f"{report['machine']['load_average_end']}, wall {report['wall_s']:.0f} s")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp, path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
