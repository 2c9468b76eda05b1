"""The study's methods: the training script each runs (train/demo.py's METHODS, and the GRPOs) and the name the page
gives it.

May import: train (its methods and their names); nothing of the study.
"""

from __future__ import annotations

from train.common import METHOD_NAMES

# GRPO (online RL: train/grpo.py, recipes/study/grpo.yaml) and guided GRPO (the same script, recipes/study/
# grpo_guided.yaml: issue 45's guided groups) are methods of this protocol only, by choice (`--methods ... grpo
# grpo_guided`): their learning rate and KL beta swept like the others', budgets in optimizer steps
EXTRA_METHODS = {"grpo": "grpo", "grpo_guided": "grpo"}  # method -> training script, beside train/demo.py's METHODS
NAMES = {**METHOD_NAMES, "grpo_guided": "Guided GRPO"}


def script(method: str) -> str:
    """The training script (and the compute's kind) of a study method: train/demo.py's METHODS, or EXTRA_METHODS."""
    from train.demo import METHODS

    return {**METHODS, **EXTRA_METHODS}[method]
