"""GRPO rollouts through vLLM (colocate) against transformers `generate`, side by side in one run on the same prompts
and model, and the GRPO step time with each. Runs in vLLM's environment (`make vllm-env`):

    .venv-vllm/bin/python benchmarks/grpo_vllm.py [--out benchmarks/results/grpo_vllm_cpu.json]

The model is the tiny random Qwen2-VL built here (`--hidden`, `--layers`; the demo's size by default, float32), the
prompts synthetic SPY-Tune ones with their images; each rollout batch is `--prompts` prompts x G=4 completions of up
to `--new-tokens` tokens, sampled at temperature 1 (transformers' sampling stops at the end token as vLLM does;
`tokens` counts what each generated). Rollouts: the trainer's own `_generate` (TRL's path, the weight sync included
for vLLM), `--reps` timed batches after one warm-up. Steps: `train()` for `--steps` optimizer steps with each
backend, the median step time of steps 2.. (step 1 holds the first generation's warm-up).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

G = 4


def build(work: Path, hidden: int, layers: int):
    from data_prep.synthetic import build as build_data
    from train.tiny_model import build_tiny_model

    model = build_tiny_model(work / "model", hidden=hidden, layers=layers, vision_depth=1)
    data = build_data(work / "data", train_per_label=1, test_per_label=1, general_train=8, general_test=2)
    return model, data


def trainer_for(model_dir, data, out, prompts: int, new_tokens: int, steps: int, use_vllm: bool):
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback

    from data_prep.spy_tune import build_dataset
    from losses.grpo_trainer import VisionGRPOConfig, VisionGRPOTrainer

    dataset = build_dataset("grpo", data / "train_data.json", data, add_distractors=False, seed=3, num_samples=None,
                            general_path=data / "general_train.json", general_fraction=0.5)
    config = VisionGRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=prompts * G,
        num_generations=G, max_completion_length=new_tokens, gradient_checkpointing=False, beta=0.04,
        max_steps=steps, save_strategy="no", logging_steps=1, learning_rate=1e-5, use_vllm=use_vllm,
        vllm_mode="colocate", vllm_dtype="float32", vllm_enforce_eager=True, vllm_kv_cache_gib=1,
        vllm_max_model_length=2048, disable_tqdm=True)

    def spread(prompts, completions, **_):  # a reward with spread in every group: every step trains
        return [float(i % G) for i in range(len(completions))]

    class Clock(TrainerCallback):
        times: list[float] = []

        def on_step_begin(self, *_args, **_kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, *_args, **_kwargs):
            self.times.append(time.perf_counter() - self.start)

    clock = Clock()
    clock.times = []
    trainer = VisionGRPOTrainer(model=AutoModelForImageTextToText.from_pretrained(model_dir), reward_funcs=[spread],
                                args=config, train_dataset=dataset,
                                processing_class=AutoProcessor.from_pretrained(model_dir), callbacks=[clock])
    return trainer, dataset, clock


def rollouts(trainer, dataset, prompts: int, reps: int) -> dict:
    rows = [dict(dataset[i]) for i in range(prompts) for _ in range(G)]
    batch = [r["prompt"] for r in rows]
    trainer._generate(batch)  # warm-up
    times, tokens = [], []
    for _ in range(reps):
        start = time.perf_counter()
        completions = trainer._generate(batch)[1]
        times.append(time.perf_counter() - start)
        tokens.append(sum(map(len, completions)))
    seconds = statistics.median(times)
    return {"completions": len(batch), "seconds_median": round(seconds, 4), "seconds": [round(t, 4) for t in times],
            "rollouts_per_s": round(len(batch) / seconds, 2), "tokens_median": statistics.median(tokens),
            "tokens_per_s": round(statistics.median(tokens) / seconds, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/grpo_vllm_cpu.json")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    import torch
    import transformers
    import trl
    import vllm

    report = {"benchmark": "grpo_vllm", "machine": {
        "platform": platform.platform(), "cpus": os.cpu_count(), "load_average_start": os.getloadavg(),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "trl": trl.__version__, "vllm": vllm.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu"},
        "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"num_generations": G,
                                                                           "dtype": "float32", "temperature": 1.0}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, data = build(work, args.hidden, args.layers)
        results = {}
        # vLLM first: its engine is built once; transformers' run then uses the same trainer's own generate path
        trainer, dataset, clock = trainer_for(model, data, work / "vllm", args.prompts, args.new_tokens,
                                              args.steps, use_vllm=True)
        results["vllm"] = {"rollouts": rollouts(trainer, dataset, args.prompts, args.reps)}
        trainer.train()
        results["vllm"]["step_seconds"] = [round(t, 3) for t in clock.times]
        del trainer
        trainer, dataset, clock = trainer_for(model, data, work / "hf", args.prompts, args.new_tokens, args.steps,
                                              use_vllm=False)
        results["transformers"] = {"rollouts": rollouts(trainer, dataset, args.prompts, args.reps)}
        trainer.train()
        results["transformers"]["step_seconds"] = [round(t, 3) for t in clock.times]
        for r in results.values():
            r["step_seconds_median"] = round(statistics.median(r["step_seconds"][1:] or r["step_seconds"]), 3)
    report["results"] = results
    report["machine"]["load_average_end"] = os.getloadavg()
    vllm_r, hf_r = results["vllm"], results["transformers"]
    print(f"{'':14s} {'rollouts/s':>11s} {'tokens/s':>9s} {'step s':>7s}")
    for name, r in (("vLLM", vllm_r), ("transformers", hf_r)):
        print(f"{name:14s} {r['rollouts']['rollouts_per_s']:11.2f} {r['rollouts']['tokens_per_s']:9.1f} "
              f"{r['step_seconds_median']:7.2f}")
    print(f"vLLM / transformers: rollouts {vllm_r['rollouts']['rollouts_per_s'] / hf_r['rollouts']['rollouts_per_s']:.2f}x, "
          f"step time {vllm_r['step_seconds_median'] / hf_r['step_seconds_median']:.2f}x")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
