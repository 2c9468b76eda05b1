"""Pairwise preference losses on sequence log-ratios.

A log-ratio is log pi_theta(y|x) - log pi_ref(y|x) of a whole completion (token log-probs summed).
Each function takes tensors of shape (batch,) and returns the per-example loss, shape (batch,).
"""

import torch
import torch.nn.functional as F


def dpo_sigmoid(chosen_logratios: torch.Tensor, rejected_logratios: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO: -log sigmoid(beta * (r_chosen - r_rejected))."""
    return -F.logsigmoid(beta * (chosen_logratios - rejected_logratios))


def nca_pair(chosen_logratios: torch.Tensor, rejected_logratios: torch.Tensor, beta: float) -> torch.Tensor:
    """NCA (Chen et al., 2024), pairwise form: -log s(r_c) - 1/2 log s(-r_c) - 1/2 log s(-r_r), r = beta * log-ratio.

    Unlike DPO it scores each completion against the reference on its own, so it raises the chosen likelihood
    instead of only widening the gap.
    """
    chosen_rewards = beta * chosen_logratios
    rejected_rewards = beta * rejected_logratios
    return -F.logsigmoid(chosen_rewards) - 0.5 * F.logsigmoid(-chosen_rewards) - 0.5 * F.logsigmoid(-rejected_rewards)
