"""GRPO's console: one short line per logging window, always in the same order, instead of the Trainer's whole
dict (about 20 keys plus one `compliance/<category>` per category seen). The full record is unchanged: every key
goes to train_metrics.json, W&B and the trainer state (docs/training/grpo.md, "What the log says").

    step 5/20 | loss 0.0061 | reward 0.973 ± 0.317 | privacy_compliance 0.719 | helpfulness 0.508 | kl 0.0015 |
        zero-spread groups 0.625 | dropped 0.625, extra rounds 2.0 | reject groups with a refusal 0 | missing 0
"""

from __future__ import annotations

from transformers.trainer_callback import PrinterCallback, ProgressCallback

# (key, label) in the order printed; a key absent from a window (dynamic sampling off, no refusal-expected groups)
# is left out of its line, the order of the rest unchanged. rewards/<name>/mean come after `reward`, in the
# recipe's order of reward_funcs.
HEAD = (("loss", "loss"),)
TAIL = (("kl", "kl"), ("frac_reward_zero_std", "zero-spread groups"), ("dynamic_sampling/dropped_share", "dropped"),
        ("dynamic_sampling/extra_rounds", "extra rounds"), ("groups/reject_with_refusal", "reject groups with a refusal"),
        ("rewards/missing", "missing"))
JOINED = {"dynamic_sampling/extra_rounds"}  # printed after the previous item with a comma


def _number(value) -> str:
    if isinstance(value, float):
        return "0" if value == 0 else f"{value:.4g}" if abs(value) < 0.01 else f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


def summary(logs: dict, step: int, max_steps: int, reward_names: list[str]) -> str | None:
    """The console line of a training window's logs, or None for a record that is not one (the run's final
    summary, an evaluation): those are printed as the Trainer prints them."""
    if "loss" not in logs or "reward" not in logs:
        return None
    parts = [f"step {step}/{max_steps}"]
    parts += [f"{label} {_number(logs[key])}" for key, label in HEAD if key in logs]
    reward = f"reward {_number(logs['reward'])}"
    if logs.get("reward_std") is not None:
        reward += f" ± {_number(logs['reward_std'])}"
    parts.append(reward)
    parts += [f"{name} {_number(logs[f'rewards/{name}/mean'])}" for name in reward_names
              if logs.get(f"rewards/{name}/mean") is not None]
    for key, label in TAIL:
        if logs.get(key) is None:
            continue
        if key in JOINED and parts[-1].startswith("dropped"):
            parts[-1] += f", {label} {_number(logs[key])}"
        else:
            parts.append(f"{label} {_number(logs[key])}")
    return " | ".join(parts)


class _SummaryLines:
    """`summary`'s line per training window in place of the whole dict; other records as the parent prints them."""

    def __init__(self, reward_names: list[str]):
        super().__init__()
        self.reward_names = list(reward_names)

    def on_log(self, args, state, control, logs=None, **kwargs):
        line = summary(logs or {}, state.global_step, state.max_steps, self.reward_names)
        if line is None:
            return super().on_log(args, state, control, logs=logs, **kwargs)
        self.show(state, line)


class GRPOConsole(_SummaryLines, ProgressCallback):
    """The progress bar, with `summary`'s line per logging window in place of the whole dict."""

    def show(self, state, line: str) -> None:
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.write(line)


class _Printer(_SummaryLines, PrinterCallback):
    """With disable_tqdm: `summary`'s line printed, no bar."""

    def show(self, state, line: str) -> None:
        if state.is_local_process_zero:
            print(line, flush=True)


def use_console(trainer, reward_names: list[str]) -> None:
    """Replace the Trainer's progress callback (or, with disable_tqdm, its printer) by GRPOConsole."""
    for kind in (ProgressCallback, PrinterCallback):
        if trainer.pop_callback(kind) is not None:
            trainer.add_callback(GRPOConsole(reward_names) if kind is ProgressCallback else _Printer(reward_names))
