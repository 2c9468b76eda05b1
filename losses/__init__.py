"""The maths of training as pure functions (the preference losses, NCA-P's, GRPO's reward scores, truncation counts)
and, in submodules, what couples them to TRL: the trainers, tree packing, shared vision, checkpoint resume.
Imports data_prep, vlm and cli."""

from losses.nca_p import nca_p_loss
from losses.preference import dpo_sigmoid, nca_pair

__all__ = ["dpo_sigmoid", "nca_pair", "nca_p_loss"]
