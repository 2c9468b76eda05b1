"""NCA-P: the NCA pair loss of the non-private and the private variant of one example, summed."""

import torch

from losses.preference import nca_pair


def nca_p_loss(chosen_logratios: torch.Tensor, rejected_logratios: torch.Tensor, beta: float) -> torch.Tensor:
    """L = sum_{j in {0, 1}} nca_pair(r_c^j, r_r^j), per example.

    Inputs have shape (batch, 2): column 0 holds the log-ratios under the non-private instruction, column 1
    under the private one (the same image, question and context). Returns shape (batch,); the trainer averages it.
    """
    if chosen_logratios.shape != rejected_logratios.shape or chosen_logratios.shape[-1:] != (2,):
        raise ValueError(f"expected two (batch, 2) tensors, got {tuple(chosen_logratios.shape)} and "
                         f"{tuple(rejected_logratios.shape)}")
    return nca_pair(chosen_logratios, rejected_logratios, beta).sum(dim=-1)
