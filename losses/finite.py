"""Training stops at the first non-finite loss, and a model with non-finite weights is never saved.

Both checks sit at the narrowest hook of every trainer (`FiniteTrainingMixin`, under HubFormatResumeMixin):
`training_step`, which returns each micro-batch's loss (a callback never sees it: the Trainer's
`logging_nan_inf_filter` hides a NaN from the logs), and `save_model`, through which every checkpoint and the final
model are written. Each check is agreed by all processes (a reduction of one number), so every process stops at
the same step and none waits in a collective for another that has left. Stopping raises RunStopped: one line, exit
status 1 (cli/entry.py); the checkpoints saved before stay complete, and resume from them.

GRPO samples before it computes a loss: weights that a step made non-finite (or so large that the logits overflow)
stop its next generation in torch's multinomial (`probability tensor contains either inf, nan or element < 0`) before
any loss exists. `sampling_stopped` turns that error into the same one-line stop (losses/grpo_trainer.py, around
TRL's `_generate`); every process holds the same weights, so each fails alike and none waits for another.
"""

from __future__ import annotations

import torch

from cli.errors import RunStopped


def all_finite(accelerator, local_ok: bool) -> bool:
    """Whether `local_ok` holds on every process."""
    if accelerator is None or accelerator.num_processes == 1:
        return local_ok
    flag = torch.tensor([0.0 if local_ok else 1.0], device=accelerator.device)
    return accelerator.reduce(flag, reduction="sum").item() == 0


def weights_finite(model) -> bool:
    """Every trainable parameter (the local shard under ZeRO-3) is finite; frozen ones cannot have changed."""
    for parameter in model.parameters():
        if parameter.requires_grad:
            values = getattr(parameter, "ds_tensor", parameter)
            if values.numel() and not torch.isfinite(values.detach()).all():
                return False
    return True


# torch's message when the probabilities it samples from hold NaN, inf or a negative value (torch.multinomial)
SAMPLING_ERROR = "probability tensor contains either `inf`, `nan` or element < 0"


def sampling_stopped(err: BaseException, step: int, model) -> RunStopped | None:
    """The one-line stop for torch's sampling error after `step` optimizer steps (None: another error)."""
    if not isinstance(err, RuntimeError) or SAMPLING_ERROR.replace("`", "") not in str(err).replace("`", ""):
        return None
    weights = "are not finite (NaN or inf)" if not weights_finite(model) else "are finite but make the logits overflow"
    when = f"after step {step}" if step else "before the first step"
    return RunStopped(f"training stopped at step {step + 1}: the model's next-token probabilities are not finite "
                      f"{when}, so no answer can be sampled (its weights {weights}; a learning rate too high?); the "
                      "model was not saved, checkpoints before this step are kept")


class FiniteTrainingMixin:
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        local_ok = bool(torch.isfinite(loss.detach()).all())
        if not all_finite(getattr(self, "accelerator", None), local_ok):
            value = "not finite on another process" if local_ok else f"{loss.detach().float().mean().item()}"
            raise RunStopped(f"training stopped at step {self.state.global_step + 1}: the loss is {value} (a learning "
                             "rate too high, or bad data); the model was not saved, checkpoints before this step are "
                             "kept")
        return loss

    def save_model(self, output_dir=None, _internal_call: bool = False):
        if not all_finite(getattr(self, "accelerator", None), weights_finite(self.model)):
            raise RunStopped(f"training stopped at step {self.state.global_step}: the weights are not finite (NaN or "
                             "inf; a learning rate too high?); nothing was saved at this step, earlier checkpoints "
                             "are kept")
        return super().save_model(output_dir, _internal_call)
