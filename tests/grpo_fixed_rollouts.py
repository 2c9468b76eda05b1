"""train/grpo.py with rollouts fixed by the prompt (for tests/test_grpo.py's two-process check): completion k of a
group is the k-th of four fixed answers, so that one process and two processes train on the same rollouts, which
sampling cannot give (each process draws its own random numbers). Everything else is train/grpo.py's.

    accelerate launch ... tests/grpo_fixed_rollouts.py RECIPE.yaml [--key value ...]
"""

import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train.grpo as grpo  # noqa: E402

ANSWERS = ("The colour is red.", "I'm sorry, but I cannot share that.", "red", "No idea, maybe blue.")


def fixed_rollouts(prompts, trainer):
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    tokenizer = trainer.processing_class.tokenizer
    seen, completions = Counter(), []
    for prompt in prompt_ids:
        k = seen[tuple(prompt)] % len(ANSWERS)
        seen[tuple(prompt)] += 1
        completions.append(tokenizer(ANSWERS[k], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    return {"prompt_ids": [list(p) for p in prompt_ids], "completion_ids": completions,
            "logprobs": [[0.0] * len(c) for c in completions]}


class FixedRolloutTrainer(grpo.VisionGRPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, rollout_func=fixed_rollouts, **kwargs)


if __name__ == "__main__":
    grpo.VisionGRPOTrainer = FixedRolloutTrainer
    grpo.run(grpo.main)
