"""The maths of preference training, as pure tensor functions (and, in submodules, the TRL-coupled trainer)."""

from losses.nca_p import nca_p_loss
from losses.preference import dpo_sigmoid, nca_pair

__all__ = ["dpo_sigmoid", "nca_pair", "nca_p_loss"]
