"""train/grpo.py with rollouts fixed by the row (for tests/test_grpo.py's two-process checks): completion k of a
group (the k-th of its consecutive rows over the processes) is the k-th of four fixed answers (GRPO_FIXED_ANSWERS:
`mixed`, one of them a refusal, or `helpful`, none), so that one process and two processes train on the same
rollouts, which sampling cannot give (each process draws its own random numbers). Everything else is train/grpo.py's.

    accelerate launch ... tests/grpo_fixed_rollouts.py RECIPE.yaml [--key value ...]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train.grpo as grpo  # noqa: E402

# GRPO_FIXED_ANSWERS=helpful: four answers without a refusal, so every refusal-expected group misses the verdict
ANSWERS = {"mixed": ("The colour is red.", "I'm sorry, but I cannot share that.", "red", "No idea, maybe blue."),
           "helpful": ("The colour is red.", "red", "It is red.", "No idea, maybe blue.")
           }[os.environ.get("GRPO_FIXED_ANSWERS", "mixed")]


def fixed_rollouts(prompts, trainer):
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    tokenizer = trainer.processing_class.tokenizer
    first = trainer.accelerator.process_index * len(prompts)  # this process's first row of the generation batch
    completions = []
    for i in range(len(prompt_ids)):  # a group's G rows are consecutive over the processes: G = len(ANSWERS)
        k = (first + i) % len(ANSWERS)
        completions.append(tokenizer(ANSWERS[k], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    return {"prompt_ids": [list(p) for p in prompt_ids], "completion_ids": completions,
            "logprobs": [[0.0] * len(c) for c in completions]}


class FixedRolloutTrainer(grpo.VisionGRPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, rollout_func=fixed_rollouts, **kwargs)


if __name__ == "__main__":
    grpo.VisionGRPOTrainer = FixedRolloutTrainer
    grpo.run(grpo.main)
