"""NCA-P training throughput on one GPU: a random-weight Qwen2-VL-7B (or 2B) built in bf16 on the device, no
download, no network. For each option (LoRA / full fine-tuning; the batch layout: tree-packed (each example's
prompt through the language model once, losses/packing.py), shared vision encoding or repeated images; live /
precomputed reference) and each image size, it runs the project's NCAPTrainer steps
(`trainer.training_step` + optimizer step, as Trainer's loop does) and reports tokens per second, model FLOPs
utilisation and peak GPU memory, as a table and JSON.

    python benchmarks/gpu/nca_p_throughput.py [--model 7b|2b] [--out DIR] [--time-budget 450]
    python benchmarks/gpu/nca_p_throughput.py --dry-run          # tiny config on CPU: checks the script end to end

Model FLOPs (the work a step needs) and executed FLOPs (for HFU) are counted by flops.py, whose docstring has the
formula. MFU is reported against the datasheet peak (--peak-tflops, 989 for an H100/H200 SXM in dense bf16) and
against a peak measured in the same run: a bf16 product of the model's own shape (8192 x hidden) @ (hidden x
intermediate).

Every configuration runs in its own try/except: an out-of-memory error (full fine-tuning of 7B with AdamW may not
fit) is recorded as `oom` and the rest still run. Configurations start in priority order while the time budget
lasts; results are rewritten after each one, so a run stopped from outside keeps what it measured.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import weakref
from pathlib import Path

STARTED = time.time()  # the time budget counts the third-party imports and the set-up too

for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                     "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_key, _value)

# Runs from a plain checkout, installed or not: the repository root (the project's packages), benchmarks/ (the CPU
# benchmark's step helpers) and this folder (checks, flops)
_HERE = Path(__file__).resolve().parent
for _path in (_HERE, _HERE.parent, _HERE.parents[1]):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
from checks import SMALL_SPEC, flex_logp_check, fused_head_check, layout_check, matmul_peak  # noqa: E402
from flops import expected_speedups, parameter_counts, step_flops  # noqa: E402
from train_step import prepare_like_train, train_step  # noqa: E402

# Qwen2-VL's published configurations (config.json of Qwen/Qwen2-VL-{7B,72B,2B}-Instruct); "tiny" is for --dry-run.
MODEL_SPECS = {
    "7b": {"text": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                    "intermediate_size": 18944, "vocab_size": 152064}, "tie_word_embeddings": False,
           "vision": {"depth": 32, "embed_dim": 1280, "num_heads": 16, "mlp_ratio": 4}},
    "72b": {"text": {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                     "intermediate_size": 29568, "vocab_size": 152064}, "tie_word_embeddings": False,
            "vision": {"depth": 32, "embed_dim": 1280, "num_heads": 16, "mlp_ratio": 4}},
    "2b": {"text": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                    "intermediate_size": 8960, "vocab_size": 151936}, "tie_word_embeddings": True,
           "vision": {"depth": 32, "embed_dim": 1280, "num_heads": 16, "mlp_ratio": 4}},
    "tiny": {"text": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                      "intermediate_size": 256, "vocab_size": 2048}, "tie_word_embeddings": False,
             "vision": {"depth": 2, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 2}},
}
SPY_MIN_PIXELS, SPY_MAX_PIXELS = 200_704, 1_003_520  # recipes/*.yaml: 448x448 .. 1120x896
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # language model only (vision: qkv/fc1/..)


# ---- model, processor, data ---------------------------------------------------------------------------------------

def build_processor(workdir: Path, min_pixels: int, max_pixels: int):
    """The tiny model's processor (a real Qwen2VLProcessor with the official chat template, BPE vocab ~1k)."""
    from transformers import AutoProcessor

    from train.tiny_model import build_tiny_model

    path = build_tiny_model(workdir / "processor", min_pixels=min_pixels, max_pixels=max_pixels)
    return AutoProcessor.from_pretrained(path)


def build_model(spec: dict, processor, device: str, dtype):
    """Random weights, built directly on `device` in `dtype`: nothing is downloaded or read from disk."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from train.tiny_model import rope_sections

    tokenizer = processor.tokenizer
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in
           ("<|endoftext|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    text = spec["text"]
    if text["vocab_size"] < len(tokenizer):
        raise ValueError(f"model vocab {text['vocab_size']} < tokenizer vocab {len(tokenizer)}")
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    config = Qwen2VLConfig(
        text_config=dict(**text, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                          "mrope_section": rope_sections(head_dim)},
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=spec["tie_word_embeddings"]),
        vision_config=dict(**spec["vision"], hidden_size=text["hidden_size"], in_channels=3, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=spec["tie_word_embeddings"],
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2VLForConditionalGeneration._from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.to(device)  # a no-op when the device context already placed every tensor


def make_images(source_dir: Path, target_dir: Path, size: tuple[int, int]) -> Path:
    """A copy of the synthetic SPY-Tune image folder with every image resized to `size` (width, height)."""
    from PIL import Image

    for src in (source_dir / "images" / "train").glob("*.png"):
        dst = target_dir / src.relative_to(source_dir)
        dst.parent.mkdir(parents=True, exist_ok=True)
        Image.open(src).convert("RGB").resize(size).save(dst)
    return target_dir


def parse_size(text: str) -> tuple[int, int]:
    w, _, h = text.lower().partition("x")
    return int(w), int(h or w)


# ---- one configuration ---------------------------------------------------------------------------------------------

def estimate(args) -> int:
    """--estimate: the FLOP-based expectations for 7B and 2B at SPY's image sizes (meta device: no memory, no GPU)."""
    import torch

    with tempfile.TemporaryDirectory(prefix="nca-p-estimate-") as tmp:
        processor = build_processor(Path(tmp), SPY_MIN_PIXELS, SPY_MAX_PIXELS)
    lines = [(f"Expected step-time ratios from executed FLOPs ({args.text_tokens} text tokens per sequence, packed: "
              f"{args.answer_tokens} answer tokens per sequence, {args.branch_tokens} tokens per NCA-P instruction "
              f"variant, the rest shared; "
             f"activation checkpointing {'on' if args.activation_checkpointing else 'off'})"), "",
             ("| model | image | tokens/seq | vision share of an NCA-P forward (shared) | shared vision: full FT | LoRA "
             "| precompute (shared): full FT | LoRA | both: full FT | LoRA | DPO shared vision: full FT | LoRA "
             "| NCA-P packed vs shared: full FT | LoRA | DPO packed vs shared: full FT | LoRA "
             "| reference weights freed |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    results = {}
    for model_name in ("7b", "2b"):
        spec = MODEL_SPECS[model_name]
        model = build_model(spec, processor, "meta", torch.bfloat16)
        counts = parameter_counts(model)
        del model
        for size in args.sizes:
            w, h = parse_size(size)
            patches = (w // 14) * (h // 14)
            shape = {"answer_tokens": args.answer_tokens, "branch_tokens": args.branch_tokens}
            e = expected_speedups(counts, spec, patches, args.text_tokens, args.activation_checkpointing, **shape)
            dpo = expected_speedups(counts, spec, patches, args.text_tokens, args.activation_checkpointing, 2, **shape)
            results[f"{model_name}/{size}"] = {"nca_p": e, "dpo": dpo}
            lines.append(
                f"| {model_name.upper()} ({counts['total'] / 1e9:.2f}B) | {size} | {e['tokens_per_sequence']} | "
                f"{e['vision_share_of_shared_forward']:.0%} | "
                f"{e['full_shared_vision_speedup']:.2f}x | {e['lora_shared_vision_speedup']:.2f}x | "
                f"{e['full_precompute_speedup']:.2f}x | {e['lora_precompute_speedup']:.2f}x | "
                f"{e['full_combined_speedup']:.2f}x | {e['lora_combined_speedup']:.2f}x | "
                f"{dpo['full_shared_vision_speedup']:.2f}x | {dpo['lora_shared_vision_speedup']:.2f}x | "
                f"{e['full_packed_speedup']:.2f}x | {e['lora_packed_speedup']:.2f}x | "
                f"{dpo['full_packed_speedup']:.2f}x | {dpo['lora_packed_speedup']:.2f}x | "
                f"{2 * counts['total'] / 2**30:.1f} GiB (full FT) |")
    print("\n".join(lines))
    if args.out:
        write_outputs(Path(args.out), {"benchmark": "nca_p_flop_estimate", "text_tokens": args.text_tokens,
                                       "activation_checkpointing": args.activation_checkpointing,
                                       "estimates": results}, "\n".join(lines),
                      "nca_p_flop_estimate" + ("" if args.text_tokens == 200 else f"_text{args.text_tokens}"))
    return 0


def make_trainer(model, ref_model, args, dataset, processor, workdir: Path, name: str, layout: str,
                 precompute: bool = False, lora: bool = False, learning_rate: float = 1e-7, method: str = "nca_p"):
    """The project's NCAPTrainer (or, `method` dpo, VisionDPOTrainer with TRL's sigmoid loss) as a training run
    builds it, prepared as `Trainer.train()` prepares it; returns the trainer, the model to step and one collated
    batch."""
    from peft import LoraConfig

    from losses.nca_p_trainer import NCAPConfig, NCAPTrainer
    from losses.vision_dpo_trainer import VisionDPOConfig, VisionDPOTrainer

    cuda = args.device.startswith("cuda")
    config_class, trainer_class, method_args = ((NCAPConfig, NCAPTrainer, {}) if method == "nca_p" else
                                                (VisionDPOConfig, VisionDPOTrainer,
                                                 {"loss_type": ["sigmoid"], "beta": 0.1}))
    training_args = config_class(**method_args,
        output_dir=str(workdir / "out" / name), use_cpu=not cuda, bf16=args.dtype == "bf16",
        report_to="none", max_length=None, per_device_train_batch_size=args.batch_size,
        activation_checkpointing=args.activation_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if args.activation_checkpointing else None,
        shared_vision=layout != "repeated", packed=layout.startswith("packed"),
        packed_attention="flex" if layout == "packed_flex" else "sdpa",
        precompute_ref_log_probs=precompute, disable_tqdm=True, learning_rate=learning_rate,
    )
    peft_config = None
    if lora:
        peft_config = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                                 target_modules=args.lora_targets.split(","))
    trainer = trainer_class(model=model, ref_model=ref_model, args=training_args, train_dataset=dataset,
                            processing_class=processor, peft_config=peft_config)
    stepped = prepare_like_train(trainer)
    batch = trainer.data_collator([dict(trainer.train_dataset[i]) for i in range(args.batch_size)])
    return trainer, stepped, batch


def run_config(cfg: dict, args, processor, dataset, workdir: Path, state: dict, peak_tflops: dict) -> dict:
    """One configuration; `state` receives what holds memory, so that the caller can free it even after an error."""
    import torch

    device = args.device
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    spec = MODEL_SPECS[args.model]
    result = {**cfg, "status": "ok"}
    t_start = time.perf_counter()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        result["allocated_before_gb"] = torch.cuda.memory_allocated() / 2**30

    model = build_model(spec, processor, device, args.torch_dtype)
    state["model_ref"] = weakref.ref(model)
    counts = parameter_counts(model)
    ref_model = None
    if cfg["finetune"] == "full":
        # TRL would load the reference from the model's Hub name, which a model built here does not have
        state["ref_model"] = ref_model = copy.deepcopy(model)
    result["build_s"] = time.perf_counter() - t_start
    t0 = time.perf_counter()
    trainer, stepped, batch = make_trainer(model, ref_model, args, dataset, processor, workdir, cfg["name"],
                                           cfg["layout"], cfg["reference"] == "precomputed",
                                           cfg["finetune"] == "lora", method=cfg["method"])
    state["trainer"] = trainer
    state.pop("ref_model", None)
    del model, ref_model
    # A model is a reference cycle (TRL's fused head binds its forward to it): only the collector frees a released
    # reference once this frame lets go of it, as it would in a training script where TRL creates the reference.
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    result["trainer_s"] = time.perf_counter() - t0  # includes the reference pass when precomputed
    lora_params = sum(p.numel() for n, p in trainer.model.named_parameters() if "lora_" in n)
    result["trainable_params"] = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    result["parameters"] = counts
    result["activation_checkpointing_active"] = bool(
        getattr(trainer.accelerator.unwrap_model(stepped), "is_activation_checkpointing", False))
    result["optimizer"] = str(getattr(trainer.args.optim, "value", trainer.args.optim))
    if cuda:
        # after the precompute pass, the reference (full fine-tuning) must be gone: compare live / precomputed
        result["allocated_after_setup_gb"] = torch.cuda.memory_allocated() / 2**30
        result["setup_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()

    flops = step_flops(batch, counts, spec, cfg["finetune"], cfg["reference"] == "live",
                       args.activation_checkpointing, lora_params, trainer.collator_class.sequences_per_example)
    result.update({"sequences": int(batch["input_ids"].size(0)), "padded_length": int(batch["input_ids"].size(1)),
                   "tokens_per_step": flops["tokens"], "completion_tokens_per_step": flops["completion_tokens"],
                   "model_tflop_per_step": flops["flops"] / 1e12,
                   "executed_tflop_per_step": flops["executed_flops"] / 1e12,
                   "vision_flop_share": flops["vision_share"],
                   "image_tokens_per_image": int(batch["image_grid_thw"][0].prod()) // 4})
    for _ in range(args.warmup):
        result["loss_first_step"] = train_step(trainer, stepped, batch)
    times = []
    for _ in range(args.steps):
        sync()
        t0 = time.perf_counter()
        train_step(trainer, stepped, batch)
        sync()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    tflops = flops["flops"] / step_s / 1e12
    result.update({"step_times_s": times, "step_s": step_s, "tokens_per_s": flops["tokens"] / step_s,
                   "examples_per_s": args.batch_size / step_s, "tflops": tflops,
                   "mfu": tflops / peak_tflops["datasheet"],
                   "mfu_measured_peak": tflops / peak_tflops["measured"] if peak_tflops.get("measured") else None,
                   "hfu_measured_peak": (flops["executed_flops"] / step_s / 1e12 / peak_tflops["measured"]
                                         if peak_tflops.get("measured") else None)})
    if cuda:
        result["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
        result["reserved_peak_gb"] = torch.cuda.max_memory_reserved() / 2**30
    result["wall_s"] = time.perf_counter() - t_start
    return result


def free(state: dict, device: str) -> bool:
    """Drop every reference to the configuration's models; True when the policy model was really freed."""
    import torch

    model_ref = state.pop("model_ref", None)
    state.clear()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return model_ref is None or model_ref() is None


def error_status(exc: BaseException) -> str:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return "oom"
    return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


# ---- the run ------------------------------------------------------------------------------------------------------

def configurations(args) -> list[dict]:
    """Most informative first: at the first (largest) size, full fine-tuning and LoRA packed, then shared, then
    repeated (live reference), then the precomputed reference (packed and shared), then the same at the other sizes."""
    out = []
    for size in args.sizes:
        for reference in args.references:
            for method in args.methods:
                for layout in args.layouts:
                    for finetune in args.finetune:
                        if reference == "precomputed" and layout == "repeated" and len(args.layouts) > 1:
                            continue  # precompute is measured with the faster layouts only
                        out.append({"name": f"{size}/{method}/{finetune}/{layout}/{reference}", "image_size": size,
                                    "method": method, "finetune": finetune, "layout": layout,
                                    "shared_vision": layout != "repeated", "reference": reference})
    return out


def markdown_table(report: dict, args) -> str:
    peak = report.get("peak_tflops", {})
    measured = peak.get("measured")
    lines = [(f"NCA-P on a random-weight Qwen2-VL-{args.model.upper()}, batch {args.batch_size} examples "
              f"({4 * args.batch_size} sequences), {args.dtype}, activation checkpointing "
              f"{'on' if args.activation_checkpointing else 'off'}. MFU against the datasheet peak "
              f"({peak.get('datasheet', args.peak_tflops):g} TFLOP/s) and against the measured one "
              f"({measured:.3g} TFLOP/s, {peak.get('measured_shape')})" if measured else
              f"NCA-P on a random-weight Qwen2-VL-{args.model.upper()} (no measured peak)"), ""]
    checks = report.get("checks", {})
    for name, check in checks.items():
        detail = {k: v for k, v in check.items() if k not in ("ok", "losses")}
        lines.append(f"- check `{name}`: **{'ok' if check.get('ok') else 'FAILED'}** {json.dumps(detail)}")
    if checks:
        lines.append("")
    lines += ["| image | method | finetune | layout | reference | status | step s | tokens/s | model TFLOP/s | MFU (datasheet) "
              "| MFU (measured) | HFU (measured) | peak GB | GB after set-up |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        def fmt(key, spec, r=r):
            return format(r[key], spec) if r.get(key) is not None else "-"
        lines.append(f"| {r['image_size']} | {r.get('method', 'nca_p')} | {r['finetune']} | {r['layout']} | "
                     f"{r['reference']} | {r['status'][:60]} | {fmt('step_s', '.3f')} | {fmt('tokens_per_s', '.0f')} | "
                     f"{fmt('tflops', '.1f')} | {fmt('mfu', '.1%')} | {fmt('mfu_measured_peak', '.1%')} | "
                     f"{fmt('hfu_measured_peak', '.1%')} | {fmt('peak_gb', '.1f')} | "
                     f"{fmt('allocated_after_setup_gb', '.1f')} |")
    for title, slow, fast in (("Shared vision encoding, step-time ratio repeated / shared:", "repeated", "shared"),
                              ("Tree packing, step-time ratio shared / packed:", "shared", "packed"),
                              ("Packed attention, step-time ratio sdpa / flex:", "packed", "packed_flex")):
        speedups = layout_speedups(report["results"], slow, fast)
        if speedups:
            lines += ["", title] + [f"- {k}: **{v:.2f}x**" for k, v in speedups.items()]
    return "\n".join(lines)


def layout_speedups(results: list[dict], slow: str = "repeated", fast: str = "shared") -> dict:
    ok = {r["name"]: r for r in results if r["status"] == "ok"}
    out = {}
    for name, r in ok.items():
        if r["layout"] == fast:
            other = ok.get(name.replace(f"/{fast}/", f"/{slow}/"))
            if other:
                out[name.replace(f"/{fast}", "")] = other["step_s"] / r["step_s"]
    return out


def write_outputs(out_dir: Path, report: dict, table: str, stem: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(report, indent=1) + "\n"), (".md", table + "\n")):
        path = out_dir / f"{stem}{suffix}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="7b", choices=list(MODEL_SPECS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--sizes", help="image sizes WxH (default: SPY's bounds, 1120x896 = 1,003,520 px and "
                                         "448x448 = 200,704 px; --dry-run: 168x140,112x112)")
    parser.add_argument("--min-pixels", type=int, help=f"image processor bound (default {SPY_MIN_PIXELS})")
    parser.add_argument("--max-pixels", type=int, help=f"image processor bound (default {SPY_MAX_PIXELS})")
    parser.add_argument("--finetune", default="lora,full", help="comma-separated: lora, full")
    parser.add_argument("--layout", default="packed_flex,packed,shared,repeated",
                        help="batch layouts, comma-separated: packed_flex (tree-packed, flex_attention with the "
                             "block mask), packed (tree-packed, sdpa with the boolean tree mask), shared (each image "
                             "encoded once), repeated (TRL's)")
    parser.add_argument("--reference", default="live,precomputed", help="live, precomputed or both")
    parser.add_argument("--methods", default="nca_p,dpo", help="comma-separated: nca_p, dpo (TRL's sigmoid loss)")
    parser.add_argument("--batch-size", type=int, default=2, help="NCA-P examples per step (4 sequences each)")
    parser.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                        help="as the recipes (default on)")
    parser.add_argument("--lora-r", type=int, default=64)
    parser.add_argument("--lora-targets", default=LORA_TARGETS)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per configuration")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per configuration (median reported)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak, for MFU")
    parser.add_argument("--time-budget", type=float, default=450.0,
                        help="seconds from --started-at; no configuration starts once the elapsed time plus the "
                             "longest one so far would pass it")
    parser.add_argument("--started-at", type=float, default=None,
                        help="epoch seconds the budget counts from (run.sh passes its own start, so that the wheel "
                             "install counts too; default: this process's start)")
    parser.add_argument("--skip-checks", action="store_true", help="no correctness checks before the timings")
    parser.add_argument("--out", default=None, help="output folder (default: $OUT, else benchmarks/results)")
    parser.add_argument("--estimate", action="store_true",
                        help="print the FLOP-based expected ratios for 7B and 2B at --sizes and exit (no GPU)")
    parser.add_argument("--text-tokens", type=int, default=200, help="--estimate: text tokens per sequence")
    parser.add_argument("--answer-tokens", type=int, default=40, help="--estimate: answer tokens per sequence")
    parser.add_argument("--branch-tokens", type=int, default=20,
                        help="--estimate: tokens in which NCA-P's two instruction variants differ (each)")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny model on CPU, small images, one step each: checks the script end to end")
    args = parser.parse_args(argv)
    defaults = ("1120x896,448x448", SPY_MIN_PIXELS, SPY_MAX_PIXELS)
    if args.dry_run:
        args.model, args.device, args.dtype = "tiny", "cpu", "fp32"
        args.batch_size, args.warmup, args.steps = 1, 1, 1
        defaults = ("168x140", 56 * 56, 224 * 224)  # one size: both methods, every layout, in a test's time
    args.sizes = args.sizes or defaults[0]
    args.min_pixels = args.min_pixels or defaults[1]
    args.max_pixels = args.max_pixels or defaults[2]
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.finetune = [f for f in args.finetune.split(",") if f]
    args.layouts = [s for s in args.layout.split(",") if s]
    args.references = [r for r in args.reference.split(",") if r]
    args.methods = [m for m in args.methods.split(",") if m]
    if not args.methods or set(args.methods) - {"nca_p", "dpo"}:
        parser.error("--methods takes nca_p and/or dpo")
    if (set(args.finetune) - {"lora", "full"} or set(args.layouts) - {"packed_flex", "packed", "shared", "repeated"}
            or set(args.references) - {"live", "precomputed"}):
        parser.error("--finetune takes lora/full, --layout packed_flex/packed/shared/repeated, --reference live/precomputed")
    if args.estimate:
        return estimate(args)
    out_dir = Path(args.out or os.environ.get("OUT") or Path(__file__).resolve().parents[1] / "results")
    stem = f"nca_p_throughput_{args.model}{'_dry_run' if args.dry_run else ''}"

    import datasets
    import torch
    import transformers

    from data_prep.spy_tune import build_dataset
    from data_prep.synthetic import build

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    device = args.device
    args.torch_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.dry_run:
        torch.set_num_threads(1)  # a shared CPU: OpenMP threads waiting on each other dominate tiny ops
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu (or --dry-run)", file=sys.stderr)
        return 2
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # the recipes' tf32: true
        torch.backends.cudnn.allow_tf32 = True
    started = args.started_at or STARTED

    def elapsed() -> float:
        return time.time() - started

    report = {
        "benchmark": "nca_p_throughput", "model": args.model, "model_spec": MODEL_SPECS[args.model],
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
        "settings": {k: v for k, v in vars(args).items() if k != "torch_dtype"},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "trl": _version("trl"), "peft": _version("peft"),
                     "accelerate": _version("accelerate"), "datasets": datasets.__version__, "cuda": torch.version.cuda},
        "flop_formula": __doc__[__doc__.index("Model FLOPs"):__doc__.index("Every configuration")].strip(),
        "checks": {}, "results": [],
    }
    text = MODEL_SPECS[args.model]["text"]
    peak = matmul_peak(8192 if not args.dry_run else 256, text["hidden_size"], text["intermediate_size"], device,
                       args.torch_dtype)
    report["peak_tflops"] = {"datasheet": args.peak_tflops, "measured": peak["tflops"], "measured_shape": peak["shape"]}
    print(f"measured {peak['dtype']} matmul {peak['shape']}: {peak['tflops']:.1f} TFLOP/s ({elapsed():.0f} s)",
          flush=True)
    configs = configurations(args)
    with tempfile.TemporaryDirectory(prefix="nca-p-throughput-") as tmp:
        workdir = Path(tmp)
        processor = build_processor(workdir, args.min_pixels, args.max_pixels)
        data_dir = build(workdir / "data", train_per_label=1, test_per_label=1, image_size=64)
        images = {size: make_images(data_dir, workdir / f"images-{size}", parse_size(size)) for size in args.sizes}
        datasets_by_size = {
            (size, method): build_dataset(method, data_dir / "train_data.json", images[size], seed=0,
                                          num_samples=args.batch_size)
            for size in args.sizes for method in ("nca_p", *args.methods)}
        if not args.skip_checks:
            run_checks(report, args, processor, datasets_by_size[(args.sizes[-1], "nca_p")], workdir)
            write_outputs(out_dir, report, markdown_table(report, args), stem)
        longest = 0.0
        for i, cfg in enumerate(configs):
            if elapsed() + longest > args.time_budget:
                report["results"].append({**cfg, "status": "skipped (time budget)"})
                print(f"[{i + 1}/{len(configs)}] {cfg['name']}: skipped (time budget)", flush=True)
                continue
            print(f"[{i + 1}/{len(configs)}] {cfg['name']} ... ({elapsed():.0f} s)", flush=True)
            t0 = time.perf_counter()
            state = {}  # everything of this configuration that holds memory, dropped by `free`
            try:
                result = run_config(cfg, args, processor, datasets_by_size[(cfg["image_size"], cfg["method"])],
                                    workdir, state,
                                    report["peak_tflops"])
            except Exception as exc:  # noqa: BLE001 (one configuration's failure must not lose the others)
                traceback.print_exc()
                result = {**cfg, "status": error_status(exc)}
                if device.startswith("cuda"):
                    result["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
            result["freed"] = free(state, device)
            gc.collect()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
                result["allocated_after_gb"] = torch.cuda.memory_allocated() / 2**30
            longest = max(longest, time.perf_counter() - t0)
            report["results"].append(result)
            brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()
                     if k in ("status", "step_s", "tokens_per_s", "mfu", "mfu_measured_peak", "peak_gb", "freed")}
            print(f"    {brief} ({time.perf_counter() - t0:.0f} s)", flush=True)
            report["shared_vision_speedups"] = layout_speedups(report["results"], "repeated", "shared")
            report["packed_speedups"] = layout_speedups(report["results"], "shared", "packed")
            report["flex_speedups"] = layout_speedups(report["results"], "packed", "packed_flex")
            report["wall_s"] = elapsed()
            write_outputs(out_dir, report, markdown_table(report, args), stem)
    report["wall_s"] = elapsed()
    write_outputs(out_dir, report, markdown_table(report, args), stem)
    print()
    print(markdown_table(report, args))
    print(f"\nwrote {out_dir / stem}.json and .md ({report['wall_s']:.0f} s since the start)")
    checks_ok = all(check.get("ok") for check in report["checks"].values())
    return 0 if checks_ok and any(r["status"] == "ok" for r in report["results"]) else 1


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def run_checks(report: dict, args, processor, dataset, workdir: Path) -> None:
    """The correctness checks (checks.py), before any timing, recorded in `report`: first flex against sdpa on the
    benchmark's own model (LoRA, the smaller image size), then the others on a small random model."""
    import torch

    def small_model(spec, processor, device):
        return build_model(spec, processor, device, args.torch_dtype)

    def small_trainer(model, ref_model, layout):
        return make_trainer(model, ref_model, args, dataset, processor, workdir, f"check-{layout}", layout,
                            learning_rate=1e-4)

    def real_trainer(model, ref_model, layout):
        return make_trainer(model, ref_model, args, dataset, processor, workdir, f"check-real-{layout}", layout,
                            lora=True)

    for name, run in (("flex_logps", lambda: flex_logp_check(small_model(MODEL_SPECS[args.model], processor,
                                                                         args.device), real_trainer,
                                                             args.device, args.dtype)),
                      ("fused_head", lambda: fused_head_check(small_model(SMALL_SPEC, processor, args.device),
                                                              args.device, args.dtype)),
                      ("shared_vision", lambda: layout_check(small_model, small_trainer, processor,
                                                             args.device, args.dtype, ("shared", "repeated"))),
                      ("packed", lambda: layout_check(small_model, small_trainer, processor,
                                                      args.device, args.dtype, ("packed", "shared"))),
                      ("packed_flex", lambda: layout_check(small_model, small_trainer, processor,
                                                           args.device, args.dtype, ("packed_flex", "shared")))):
        t0 = time.perf_counter()
        try:
            report["checks"][name] = run()
        except Exception as exc:  # noqa: BLE001 (recorded; the timings still run)
            traceback.print_exc()
            report["checks"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        report["checks"][name]["seconds"] = time.perf_counter() - t0
        print(f"check {name}: {json.dumps(report['checks'][name])}", flush=True)
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
