"""NCA-P on TRL: one example = one (image, question, context) with a non-private (0) and a private (1)
instruction variant, each with its chosen and rejected answer, i.e. four sequences through the policy and
the reference model, scored by `losses.nca_p_loss`.

Row layout of a batch of B examples, in blocks of B: [p0 + c0], [p1 + c1], [p0 + r0], [p1 + r1].
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from losses.nca_p import nca_p_loss
from losses.vision_dpo_trainer import PreferenceCollator, VisionDPOConfig, VisionDPOTrainer

SEQUENCES = ("chosen_0", "chosen_1", "rejected_0", "rejected_1")  # the order of the row blocks


@dataclass
class NCAPConfig(VisionDPOConfig):
    loss_type: list[str] = field(default_factory=lambda: ["nca_p"], metadata={"help": "Only `nca_p`."})
    beta: float = field(default=0.01, metadata={"help": "Scale of the log-ratio rewards (the paper: 0.01)."})

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type != ["nca_p"]:
            raise ValueError(f"NCAPTrainer trains loss_type nca_p only, got {self.loss_type}")


@dataclass
class NCAPCollator(PreferenceCollator):
    """Both variants of each example through TRL's vision preference collator, as 2B preference pairs."""

    sequences_per_example = 4

    def preference_pairs(self, examples: list[dict]) -> list[dict]:
        # TRL lays the rows out as [chosen of all pairs; rejected of all pairs] = [c0, c1, r0, r1] blocks
        return [
            {"images": ex["images"], "prompt": ex[f"prompt_{j}"], "chosen": ex[f"chosen_{j}"],
             "rejected": ex[f"rejected_{j}"]}
            for j in (0, 1) for ex in examples
        ]

    def add_reference(self, batch: dict, ref: torch.Tensor) -> None:
        batch["ref_logps"] = ref  # (B, 4) in SEQUENCES order


class NCAPTrainer(VisionDPOTrainer):
    signature_columns = ["images", "image", "ref_logps", "prompt_0", "prompt_1", *SEQUENCES]
    collator_class = NCAPCollator

    def example_logratios(self, model, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy log-probs and log-ratios against the reference, both (B, 4) in SEQUENCES order."""
        policy = torch.stack(self.sequence_logps(model, inputs).chunk(4), dim=1)
        if self.precompute_ref_logps:
            reference = inputs["ref_logps"].to(policy)
        else:
            reference = torch.stack(self.reference_logps(inputs).chunk(4), dim=1)
        return policy, policy - reference

    def _compute_loss(self, model, inputs, return_outputs=False):
        policy, logratios = self.example_logratios(model, inputs)
        loss = nca_p_loss(logratios[:, :2], logratios[:, 2:], self.beta).mean()
        self._log_metrics(policy.detach(), logratios.detach())
        self._count_tokens(inputs)
        return (loss, None) if return_outputs else loss

    def _count_tokens(self, inputs) -> None:
        """TRL's running `num_tokens`, which its DPO loss logs and this one replaces: the real tokens of the four
        sequences of every example (the unpacked rows' attention masks; train/compute.py counts compute from it)."""
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            self._total_train_tokens += self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]

    def _log_metrics(self, policy: torch.Tensor, logratios: torch.Tensor) -> None:
        mode = "train" if self.model.training else "eval"
        rewards = self.accelerator.gather_for_metrics(self.beta * logratios)
        policy = self.accelerator.gather_for_metrics(policy)
        metrics = self._metrics[mode]
        for k, name in enumerate(SEQUENCES):
            metrics[f"rewards/{name}"].append(rewards[:, k].mean().item())
            metrics[f"logps/{name}"].append(policy[:, k].mean().item())
        chosen, rejected = rewards[:, 0] + rewards[:, 1], rewards[:, 2] + rewards[:, 3]
        metrics["rewards/chosen"].append(chosen.mean().item())
        metrics["rewards/rejected"].append(rejected.mean().item())
        metrics["rewards/margins"].append((chosen - rejected).mean().item())
        metrics["rewards/accuracies"].append((chosen > rejected).float().mean().item())
        for j, variant in ((0, "non_private"), (1, "private")):
            margin = rewards[:, j] - rewards[:, 2 + j]
            metrics[f"rewards/margins_{variant}"].append(margin.mean().item())
            metrics[f"rewards/accuracies_{variant}"].append((margin > 0).float().mean().item())

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        # Evaluation reports the loss and the reward metrics; there are no logits to return.
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None
