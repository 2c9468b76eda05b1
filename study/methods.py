"""The study's methods: the training script each runs (train/demo.py's METHODS, and the tuned protocol's own), the
name the page gives it, and the two-stage methods' first stage.

A method is a recipe, recipes/study/<method>.yaml, trained by a script. The tuned protocol adds to the quick
protocol's four (issue 53): each of SFT, DPO and NCA-P with the general task mixed in at a quarter of its rows
(`*_general`: data_prep/spy_tune.py's general_for), the GRPOs, and SFT then guided GRPO (a cold start, as
DeepSeek-R1 and AM3Safety do).

May import: train (its methods and their names); nothing of the study.
"""

from __future__ import annotations

from train.common import METHOD_NAMES

# method -> training script (and the compute's kind), beside train/demo.py's METHODS: the tuned protocol's methods
# only, by choice (`--methods ...`)
EXTRA_METHODS = {"grpo": "grpo", "grpo_guided": "grpo", "sft_general": "sft", "dpo_general": "dpo",
                 "nca_p_general": "nca_p", "sft_grpo_guided": "grpo"}
NAMES = {**METHOD_NAMES, "grpo_guided": "Guided GRPO", "sft_general": "SFT + general", "dpo_general": "DPO + general",
         "nca_p_general": "NCA-P + general", "sft_grpo_guided": "SFT then guided GRPO",
         "sft_cold_start": "its SFT cold start"}
# A two-stage method: its first stage, a recipe of recipes/study/ trained from the backbone once per seed (every sweep
# point of that seed starts from it) for `first_share` of the common budget's steps, and the share of the common
# budget it stands for in compute (`offset_share`): the second stage, the method's own recipe, trains that many steps
# fewer than every other method at each budget, so both stages together match the others' compute. At the study's
# 30-step common budget: 20 SFT steps of 16 cases (a quarter general), which cost about 6 guided GRPO steps of 24
# samples at the rounds dynamic sampling takes, then guided GRPO for 24 (1x) and 84 (3x) steps
# (tests/test_study_data.py checks the plan).
TWO_STAGE = {"sft_grpo_guided": {"first": "sft_cold_start", "first_share": 2 / 3, "offset_share": 1 / 5}}


def script(method: str) -> str:
    """The training script (and the compute's kind) of a study method, or of a first stage: train/demo.py's METHODS,
    EXTRA_METHODS, or SFT."""
    from train.demo import METHODS

    firsts = {t["first"]: "sft" for t in TWO_STAGE.values()}
    return {**METHODS, **EXTRA_METHODS, **firsts}[method]


def with_first_stages(methods: list[str]) -> list[str]:
    """The methods, then the first stages of the two-stage ones (each once)."""
    return list(dict.fromkeys([*methods, *(TWO_STAGE[m]["first"] for m in methods if m in TWO_STAGE)]))


def offset(method: str, common_steps: int) -> int:
    """The budget steps a two-stage method's first stage stands for at this common budget (0 for every other
    method); at least one, and fewer than the common budget."""
    if method not in TWO_STAGE:
        return 0
    return min(common_steps - 1, max(1, round(common_steps * TWO_STAGE[method]["offset_share"])))


def first_steps(method: str, common_steps: int) -> int:
    """The steps of a two-stage method's first stage at this common budget (at least one)."""
    return max(1, round(common_steps * TWO_STAGE[method]["first_share"]))
