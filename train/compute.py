"""Training compute in tokens through the model (docs/study.md, "Compute"): the one formula, the logged counts that
feed it, and the per-step plan measured on the study's data (how GRPO's prompts and G per step are matched to DPO's).

    compute = 3 x trained + 1 x (reference + generated)        (forward-token equivalents)

A token *trained* goes through the policy forward and backward; a backward costs about two forwards (Kaplan et al.
2020: 6N FLOPs per trained token against 2N per forward token of an N-parameter model), so it counts 3. A token the
*reference* model scores (DPO, NCA, NCA-P; GRPO when its KL beta > 0: the kept rows after dynamic sampling's rounds
since issue 45, every round's rows before, as each run's log says: `run_compute`'s `reference_rule`) or that
*generation* processes (GRPO: every prompt token of every sample once, then one forward per generated token with the
KV cache; every generation round of a step, groups that dynamic sampling drops included) goes forward only and
counts 1. GRPO's old-policy pass (only with `num_iterations` > 1, steps misaligned with generation, or vLLM's
importance-sampling correction; the study runs none of them) is not counted.

Tokens are counted per sequence as the method defines its sequences: prompt (with its image's tokens in the language
model) plus answer; DPO's chosen and rejected each with their prompt, NCA-P's four, GRPO's G samples each with the
prompt. That is how TRL counts `num_tokens` (the attention masks of the unpacked rows). Tree packing, which passes a
shared prompt through the model once, is an implementation saving that every method of the study has in some
measure; it shows in the wall time, which the study reports beside the compute, and is not subtracted here. The
vision tower's own patch work is not counted (it is the same image per case for every method).
"""

from __future__ import annotations

import math
from pathlib import Path

FORWARD, BACKWARD = 1, 2  # cost of one token's forward pass, and of its backward pass, in forward passes
GENERATION_KEYS = ("generation/prompt_tokens", "generation/completion_tokens")  # per step, every generation round
REFERENCE_KEY = "reference/tokens"  # GRPO, per step: the tokens its reference model scored


def training_compute(trained: float, reference: float = 0.0, generated: float = 0.0) -> float:
    """Forward-token equivalents of a run: trained tokens forward and backward, reference and generated tokens
    forward only."""
    return (FORWARD + BACKWARD) * trained + FORWARD * (reference + generated)


def uses_reference(method: str, beta: float | None) -> bool:
    """Whether the method's loss scores its sequences with a reference model every step (the study precomputes
    nothing): the preference methods always, GRPO when its KL term is on, SFT never."""
    if method == "sft":
        return False
    if method == "grpo":
        return bool(beta)
    return True


def logged_tokens(history: list[dict], step: int) -> dict:
    """The tokens a run processed in its first `step` steps, from its log history (train_metrics.json):

    - `trained`: TRL's `num_tokens`, a running count read at the entry logged at `step`. DPO / NCA / NCA-P / SFT keep
      the count in memory only, so a resumed run restarts it from 0: a drop in the count marks a restart and the
      count before it is carried over (the study checkpoints and logs on the same steps).
    - `generated` (GRPO): `generation/prompt_tokens` + `generation/completion_tokens`, logged per step and averaged by
      TRL over each logging window: summed back as mean x the window's steps. None where the run did not log them
      (runs before dynamic sampling).

    Each is None where the log has no entry at `step` for it (then the compute is not known, never guessed)."""
    trained = _running_count(history, "num_tokens", step)
    generated = None
    if all(any(k in e for e in history) for k in GENERATION_KEYS):
        parts = [_windowed_sum(history, k, step) for k in GENERATION_KEYS]
        generated = None if None in parts else sum(parts)
    return {"trained": trained, "generated": generated}


def _entries(history: list[dict], key: str, step: int) -> list[tuple[int, float]]:
    return [(e["step"], e[key]) for e in history
            if isinstance(e.get(key), (int, float)) and isinstance(e.get("step"), int) and e["step"] <= step]


def _running_count(history: list[dict], key: str, step: int) -> float | None:
    entries = _entries(history, key, step)
    if not entries or entries[-1][0] != step:
        return None
    total, last = 0.0, 0.0
    for _, value in entries:
        if value < last:  # the counter restarted (a resumed run): keep what it had counted
            total += last
        last = value
    return total + last


def _windowed_sum(history: list[dict], key: str, step: int) -> float | None:
    entries = _entries(history, key, step)
    if not entries or entries[-1][0] != step:
        return None
    total, before = 0.0, 0
    for at, mean in entries:
        total += mean * (at - before)
        before = at
    return total


REFERENCE_RULES = {
    "logged": "GRPO's logged reference/tokens (the rows its reference scored)",
    "every round": "every generation round's rows (GRPO before the reference ran after dynamic sampling's filter, "
                   "issue 45)",
    "trained": "the trained rows",
}


def run_compute(history: list[dict], step: int, method: str, beta: float | None) -> dict:
    """A run's tokens and compute at `step` (values None where the log cannot say: see `logged_tokens`), and the rule
    that counted its reference tokens (REFERENCE_RULES): the preference methods' reference scores the trained rows;
    GRPO logs what its reference scored (`reference/tokens`: since issue 45 the kept rows only, after dynamic
    sampling's rounds), and a GRPO run from before that log ran its reference in every generation round, on the
    rows `generation/*` counts (None where it did not log those either)."""
    tokens = logged_tokens(history, step)
    trained, generated = tokens["trained"], tokens["generated"]
    rule = "trained"
    reference = None if trained is None else trained * uses_reference(method, beta)
    if method != "grpo":
        generated = 0.0
    elif any(REFERENCE_KEY in e for e in history):
        rule, reference = "logged", _windowed_sum(history, REFERENCE_KEY, step)
    else:
        rule, reference = "every round", None if generated is None else generated * uses_reference(method, beta)
    known = None not in (trained, reference, generated)
    compute = training_compute(trained, reference, generated) if known else None
    return {"trained": trained, "reference": reference, "generated": generated, "compute": compute,
            "reference_rule": rule}


# ------------------------------------------------------------------------------------------ measured on the data
def step_plan(method: str, recipe: dict, case_tokens: float, rounds: float = 1.0) -> dict:
    """One optimizer step of a recipe, planned from the mean tokens of one training case (`case_tokens`, measured by
    `mean_case_tokens`): the cases a step trains on (per_device_train_batch_size x gradient_accumulation_steps on one
    process: GRPO's are samples, `num_generations` per prompt), the tokens trained, scored by the reference and
    generated (GRPO: `rounds` generation rounds of the batch; 1 = no group dropped), and the compute."""
    cases = recipe["per_device_train_batch_size"] * recipe.get("gradient_accumulation_steps", 1)
    trained = cases * case_tokens
    reference = trained * uses_reference(method, recipe.get("beta"))
    generated = trained * rounds if method == "grpo" else 0.0
    plan = {"cases": cases, "case_tokens": case_tokens, "trained": trained, "reference": reference,
            "generated": generated, "compute": training_compute(trained, reference, generated)}
    if method == "grpo":
        plan.update(generations=recipe["num_generations"], prompts=cases / recipe["num_generations"])
    return plan


def within(value: float, target: float, tolerance: float = 0.2) -> bool:
    """value within `tolerance` (a share) of target."""
    return math.isfinite(value) and abs(value - target) <= tolerance * target


def mean_case_tokens(method: str, data: Path, processor, general_fraction: float = 0.0,
                     sample: int | None = None) -> float:
    """Mean tokens through the model per training case of `method` on a study data folder (data_prep/synthetic.py's
    train_data.json, one instruction line), counted as TRL counts them: SFT's prompt + answer and each preference
    pair's two sequences (NCA-P: four) through the trainers' own collators; a GRPO sample's prompt as TRL tokenizes it
    for generation, plus the answer the helpful backbone was trained to give (recipes/study/backbone.yaml: it
    answers, refusing only the absolute categories; a general question: the colour word) with its end-of-turn token.
    `general_fraction` > 0: that share of the cases are the general task's (data_prep/spy_tune.py's general_for), for
    every method. `sample`: that many cases, evenly spread over the data in its file order (every category, the general share)."""
    from data_prep.spy_tune import build_dataset

    data = Path(data)
    mixed = {"general_path": data / "general_train.json", "general_fraction": general_fraction} \
        if general_fraction else {}

    def rows(name: str, **extra):
        built = build_dataset(name, data / "train_data.json", data, add_distractors=False, shuffle=False, **extra)
        if not sample or sample >= len(built):
            return built
        return built.select(sorted({i * len(built) // sample for i in range(sample)}))

    if method == "grpo":
        from trl.data_utils import prepare_multimodal_messages

        prompts = rows("grpo", **mixed)
        prompt_tokens = [len(processor.apply_chat_template(
            conversation=[prepare_multimodal_messages(r["prompt"], r["images"])], add_generation_prompt=True,
            tokenize=True, return_dict=True)["input_ids"][0]) for r in prompts]
        end = 1  # the end-of-turn token that stops a sample, counted in its completion
        answers = {"spy": [len(processor.tokenizer(r["completion"][0]["content"], add_special_tokens=False)
                               ["input_ids"]) + end for r in rows("sft", helpful=True)],
                   "general": [len(processor.tokenizer(r["answer"], add_special_tokens=False)["input_ids"]) + end
                               for r in prompts if r["task"] == "general"]}
        tasks = [r["task"] for r in prompts]
        answer = sum(sum(answers[t]) / len(answers[t]) for t in tasks) / len(tasks)
        return sum(prompt_tokens) / len(prompt_tokens) + answer
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    if method == "sft":
        collate = DataCollatorForVisionLanguageModeling(processor)
    else:
        from losses.nca_p_trainer import NCAPCollator

        pairs = NCAPCollator(processor).preference_pairs if method == "nca_p" else (lambda examples: examples)
        preference = DataCollatorForVisionPreference(processor)
        collate = lambda examples: preference(pairs(examples))  # noqa: E731
    cases = rows({"sft": "sft", "dpo": "dpo", "nca": "nca", "nca_p": "nca_p"}[method], **mixed)
    total = 0
    for start in range(0, len(cases), 32):
        batch = [cases[i] for i in range(start, min(start + 32, len(cases)))]
        total += int(collate(batch)["attention_mask"].sum())
    return total / len(cases)


PLANNED_KEYS = {"per_device_train_batch_size": int, "gradient_accumulation_steps": int, "num_generations": int,
                "beta": float, "general_fraction": float}  # the recipe keys a step's plan reads


def measured_rounds(report: dict, method: str = "grpo") -> float | None:
    """The generation rounds per step a tuned study's `method` took with dynamic sampling: 1 + its logged
    `dynamic_sampling/extra_rounds`, mean over the final runs at the long budget (None where none logged it)."""
    step = str(max(report["budgets"].values()))
    logged = [run["steps"][step].get("logged", {}).get("dynamic_sampling/extra_rounds")
              for run in report["final"].get(method, {}).get("runs", {}).values() if step in run["steps"]]
    logged = [x for x in logged if x is not None]
    return 1 + sum(logged) / len(logged) if logged else None


def study_plan(data: Path, model: Path, recipes: Path, methods: list[str], sample: int | None = None,
               overrides: list[str] = (), rounds: float = 1.0, kinds: dict | None = None) -> dict:
    """method -> its recipe's planned step (`step_plan`) on this data with this model's processor (`sample` cases
    of each method measured), and each GRPO recipe's ratio to DPO's compute per step at `rounds` generation rounds
    (DPO is measured for it where the GRPOs run without it). `overrides`: the runs' extra `--key value` arguments
    (the study's --train-args), applied to the recipes where they set PLANNED_KEYS. `kinds`: method -> the method
    its recipe trains as (recipes/study/grpo_guided.yaml: grpo), the method itself where not named."""
    from transformers import AutoProcessor

    from cli import strict_yaml

    kinds = kinds or {}
    processor = AutoProcessor.from_pretrained(model)
    plans, measured = {}, {}
    online = [m for m in methods if kinds.get(m, m) == "grpo"]
    for method in dict.fromkeys([*methods, "dpo"] if online else methods):
        kind = kinds.get(method, method)
        recipe = strict_yaml.load(Path(recipes) / f"{method}.yaml")
        recipe.update({key[2:]: PLANNED_KEYS[key[2:]](value) for key, value in zip(overrides, overrides[1:])
                       if key.startswith("--") and key[2:] in PLANNED_KEYS})
        key = ("dpo" if kind == "nca" else kind, recipe.get("general_fraction", 0.0))  # NCA trains DPO's pairs
        if key not in measured:
            measured[key] = mean_case_tokens(key[0], data, processor, key[1], sample)
        plans[method] = step_plan(kind, recipe, measured[key], rounds)
    for method in online:
        plans[method]["ratio_to_dpo"] = plans[method]["compute"] / plans["dpo"]["compute"]
    return plans
