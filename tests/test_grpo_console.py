"""GRPO's console line (train/grpo_console.py): one short line per logging window, its items always in the same
order whatever order the window's record lists its keys in; the record itself (train_metrics.json, W&B, the trainer
state) keeps every key. The end-to-end run (tests/test_grpo.py) checks the lines a real run prints."""

import random

from train.grpo_console import summary

WINDOW = {"loss": 0.0061, "grad_norm": 0.52, "learning_rate": 9.5e-06, "num_tokens": 51200.0,
          "completions/mean_length": 11.5, "rewards/privacy_compliance/mean": 0.71875,
          "rewards/privacy_compliance/std": 0.45, "rewards/helpfulness/mean": 0.508, "rewards/helpfulness/std": 0.4,
          "reward": 0.973, "reward_std": 0.317, "frac_reward_zero_std": 0.625, "kl": 0.0015, "entropy": 1.2,
          "rewards/missing": 0.0, "groups/zero_spread/reject": 1.0, "groups/reject_with_refusal": 1.0,
          "dynamic_sampling/dropped_share": 0.625, "dynamic_sampling/extra_rounds": 2.0,
          "compliance/a2_age": 1.0, "compliance/a10_name": 0.0, "epoch": 0.01}
EXPECTED = ("step 5/20 | loss 0.0061 | reward 0.973 ± 0.317 | privacy_compliance 0.719 | helpfulness 0.508 | "
            "kl 0.0015 | zero-spread groups 0.625 | dropped 0.625, extra rounds 2 | reject groups with a refusal 1 | "
            "missing 0")


def test_the_console_line_has_a_fixed_order_whatever_the_record_order():
    names = ["privacy_compliance", "helpfulness"]
    assert summary(WINDOW, 5, 20, names) == EXPECTED
    keys = list(WINDOW)
    for seed in range(5):  # TRL's record lists a window's keys in the order they first came
        random.Random(seed).shuffle(keys)
        assert summary({k: WINDOW[k] for k in keys}, 5, 20, names) == EXPECTED
    # a key a window lacks (no dynamic sampling, no refusal-expected group) is left out; the rest keep their order
    bare = {k: v for k, v in WINDOW.items() if not k.startswith(("dynamic_sampling/", "groups/"))}
    assert summary(bare, 5, 20, names) == ("step 5/20 | loss 0.0061 | reward 0.973 ± 0.317 | privacy_compliance "
                                           "0.719 | helpfulness 0.508 | kl 0.0015 | zero-spread groups 0.625 | "
                                           "missing 0")
    # the rewards in the recipe's order
    assert summary(WINDOW, 5, 20, names[::-1]).index("helpfulness") < summary(WINDOW, 5, 20, names[::-1]).index(
        "privacy_compliance 0.719")
    # not a training window: printed as the Trainer prints it
    assert summary({"train_runtime": 12.0, "train_loss": 0.1}, 20, 20, names) is None
