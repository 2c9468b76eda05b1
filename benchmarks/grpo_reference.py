"""A GRPO step with dynamic sampling, the reference's log-prob pass in every generation round (TRL's order,
`reference_after_filter: false`) against once on the kept rows after the rounds (verl's order, the default since
issue 45), side by side in one run: the same model, seed, prompts and rounds.

    python benchmarks/grpo_reference.py [--reps 3] [--prompts 2] [--json benchmarks/results/grpo_reference_cpu.json]

The model is train_step.py's lm_heavy random Qwen2-VL (image tokens most of a ~300-token prompt; the language model
most of the work), G = 8, float32, packed, one thread. The rollouts are fixed (a `rollout_func` answering each
group's rows with eight fixed answers, as tests/grpo_fixed_rollouts.py does) and the reward is fixed by the prompt
(every sample of a general-task prompt scores alike: zero spread; a SPY prompt's samples differ), so both
configurations draw the same extra rounds (losses/dynamic_sampling.py's refill_indices: a function of the seed, the
step and the round) and generation costs nothing: what differs is where the reference runs. A step is
`_generate_and_score_completions` (the rounds: the fixed rollouts, the rewards, the advantages; the reference per
round or once) then the policy's pass with the loss, backward and the optimizer step; every repetition runs both
configurations, in turn order rotated. Reported: median and minimum seconds per phase, the rounds, the tokens the
reference scored (`reference/tokens`), and the ratios before / after.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                     "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}.items():
    os.environ.setdefault(_key, _value)
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

G = 8
ANSWERS = ("The colour is red.", "I'm sorry, but I cannot share that.", "red", "No idea, maybe blue.",
           "It is a red car.", "I cannot tell.", "Red, I think.", "The picture is grey.")
CONFIGS = {"before": False, "after": True}  # name -> reference_after_filter


def fixed_rollouts(prompts, trainer):
    """Row k of a group answers ANSWERS[k] with its end-of-turn token; no sampling, no generation cost."""
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    tokenizer = trainer.processing_class.tokenizer
    completions = [tokenizer(ANSWERS[i % G], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                   for i in range(len(prompt_ids))]
    return {"prompt_ids": [list(p) for p in prompt_ids], "completion_ids": completions,
            "logprobs": [[0.0] * len(c) for c in completions]}


def by_task(prompts, completions, task, **_):
    """The same reward for every sample of a general-task prompt (zero spread), the sample's place otherwise."""
    return [1.0 if t == "general" else float(i % G) for i, t in enumerate(task)]


def make_trainer(after: bool, model_dir: Path, dataset, out: Path, prompts: int):
    from train_step import prepare_like_train
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from losses.grpo_trainer import VisionGRPOConfig, VisionGRPOTrainer

    args = VisionGRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", disable_tqdm=True,
                            activation_checkpointing=False, per_device_train_batch_size=G * prompts,
                            num_generations=G, max_completion_length=16, beta=0.04, packed=True, seed=0,
                            dynamic_sampling=True, dynamic_sampling_reward="total",
                            dynamic_sampling_max_extra_rounds=6, reference_after_filter=after)
    trainer = VisionGRPOTrainer(model=AutoModelForImageTextToText.from_pretrained(model_dir), reward_funcs=[by_task],
                                args=args, train_dataset=dataset, rollout_func=fixed_rollouts,
                                processing_class=AutoProcessor.from_pretrained(model_dir))
    trainer.model.train()
    return trainer, prepare_like_train(trainer)


def step(trainer, model, rows: list[dict]) -> dict:
    """One optimizer step's phases, timed: the rounds (with the reference where it runs), then the training."""
    import torch

    trainer._metrics["train"].clear()
    torch.manual_seed(0)
    start = time.perf_counter()
    batch = trainer._generate_and_score_completions([dict(r) for r in rows])
    scored = time.perf_counter()
    loss = trainer.compute_loss(model, batch)
    trainer.accelerator.backward(loss)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    end = time.perf_counter()
    metrics = trainer._metrics["train"]
    return {"rounds_s": scored - start, "train_s": end - scored, "step_s": end - start,
            "rounds": 1 + metrics["dynamic_sampling/extra_rounds"][-1],
            "reference_tokens": metrics["reference/tokens"][-1], "batch": batch}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions of both configurations")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step (G = 8 samples each)")
    parser.add_argument("--json", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.prompts < 1:
        parser.error("--reps and --prompts must be >= 1")

    import torch
    import transformers
    from train_step import image_size, model_config

    from data_prep.spy_tune import build_dataset
    from data_prep.synthetic import build
    from train.tiny_model import build_tiny_model

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-grpo-reference-") as tmp:
        work = Path(tmp)
        data = build(work / "data", train_per_label=1, test_per_label=1, general_train=16, general_test=2,
                     image_size=image_size("qwen2_vl"))
        model_dir = build_tiny_model(work / "model", **model_config("lm_heavy", "qwen2_vl"))
        dataset = build_dataset("grpo", data / "train_data.json", data, add_distractors=True, seed=0,
                                general_path=data / "general_train.json", general_fraction=0.5)
        general = next(i for i, t in enumerate(dataset["task"]) if t == "general")
        spy = next(i for i, t in enumerate(dataset["task"]) if t == "spy")
        # round 0: general prompts (zero spread) first, one SPY prompt last: further rounds are drawn
        rows = [dataset[general]] * G * (args.prompts - 1) + [dataset[spy]] * G
        runs = {name: make_trainer(after, model_dir, dataset, work / name, args.prompts)
                for name, after in CONFIGS.items()}
        results, warm = {name: [] for name in CONFIGS}, {}
        for name, (trainer, model) in runs.items():
            warm[name] = step(trainer, model, rows)
            print(f"[{name}] warm-up: {warm[name]['rounds']:.0f} rounds, {warm[name]['step_s']:.1f} s", flush=True)
        # the global step stays 0 (no Trainer loop): every step draws the same rounds, in both configurations
        same = all(warm["before"]["batch"][k].equal(warm["after"]["batch"][k]) for k in ("prompt_ids",
                                                                                         "completion_ids"))
        for rep in range(args.reps):
            order = list(CONFIGS)[rep % 2:] + list(CONFIGS)[:rep % 2]
            for name in order:
                result = step(*runs[name], rows)
                results[name].append({k: v for k, v in result.items() if k != "batch"})
            print(f"repetition {rep + 1}/{args.reps}: " + ", ".join(
                f"{n} {results[n][-1]['step_s']:.1f} s" for n in CONFIGS), flush=True)
    summary = {}
    for name, reps in results.items():
        summary[name] = {f"{k} median": statistics.median(r[k] for r in reps) for k in ("rounds_s", "train_s",
                                                                                        "step_s")}
        summary[name].update({f"{k} min": min(r[k] for r in reps) for k in ("rounds_s", "step_s")})
        summary[name].update(rounds=reps[0]["rounds"], reference_tokens=reps[0]["reference_tokens"])
    report = {"benchmark": "grpo_reference_cpu", "same_batch": same, "configs": summary,
              "step_speedup": summary["before"]["step_s median"] / summary["after"]["step_s median"],
              "rounds_speedup": summary["before"]["rounds_s median"] / summary["after"]["rounds_s median"],
              "reference_tokens_ratio": summary["before"]["reference_tokens"] / summary["after"]["reference_tokens"],
              "settings": {"reps": args.reps, "prompts": args.prompts, "num_generations": G, "model": "lm_heavy",
                           "dtype": "float32", "threads": 1},
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                          "load_average_start": load_start, "load_average_end": os.getloadavg()}}
    print("\n| reference | rounds | reference tokens | rounds s (median) | train s | step s (median / min) |\n"
          "|---|---|---|---|---|---|")
    for name in CONFIGS:
        s = summary[name]
        print(f"| {'every round' if name == 'before' else 'after the rounds'} | {s['rounds']:.0f} | "
              f"{s['reference_tokens']:.0f} | {s['rounds_s median']:.2f} | {s['train_s median']:.2f} | "
              f"{s['step_s median']:.2f} / {s['step_s min']:.2f} |")
    print(f"\nstep {report['step_speedup']:.2f}x faster after, the rounds {report['rounds_speedup']:.2f}x; the "
          f"reference scored {report['reference_tokens_ratio']:.2f}x fewer tokens; same batch: {same}")
    if args.json:
        from store.runs import write_json

        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
