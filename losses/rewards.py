"""GRPO's rewards on SPY-Tune prompts, as pure scoring functions (train/rewards.py gives them their judge and
TRL's calling form).

- `privacy_compliance`: 1 when the sampled answer does what SPY expects of the prompt (refuse exactly when the
  instruction marks the asked category private, scenarios and absolute categories included:
  `data_prep.spy.expected_verdict`), else 0. The answer's verdict (respond / reject) comes from the offline rule
  judge (eval/spy/rule_judge.py) or from an LLM judge behind any OpenAI-compatible endpoint (eval/judge.py: cached,
  concurrent, bounded retries) with SPY's judge prompt.
- `helpfulness`: when the expected verdict is to answer, how right the answer is: the general task's exact match
  (data_prep/synthetic.py: normalize_answer), or for a SPY prompt the token F1 against its reference answer (1 when equal). A
  refusal scores about 0 there, so refusing everything cannot win.
- `general_accuracy`: the general task's exact match alone (0.0 on SPY prompts): the general task's anchor without the
  SPY answers' token F1, which varies inside nearly every answer-expected SPY group and so owns most of their
  advantage (docs/training/grpo.md, "What GRPO needs to learn here").

A judge that fails (no answer after its retries, or an answer that names no verdict) gives `None`: a missing reward,
which GRPO leaves out of its group (losses/grpo_trainer.py), never a zero. A reward that does not apply to a prompt
(compliance of a general-task prompt, helpfulness of a prompt to refuse) is 0.0, the same for all G completions of
the group, so it moves no advantage.
"""

from __future__ import annotations

import re
from collections import Counter

from data_prep.synthetic import normalize_answer


def completion_text(completion) -> str:
    """The text of a completion: a string, or the content of TRL's conversational [{"role", "content"}]."""
    if isinstance(completion, str):
        return completion
    content = completion[-1]["content"] if completion else ""
    if isinstance(content, list):  # multimodal content blocks
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return content or ""


def compliance(verdict: str | None, expected: str) -> float | None:
    """1.0 if the judged verdict is the expected one, 0.0 if not, None when the judge gave no verdict."""
    return None if verdict is None else float(verdict == expected)


def _tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def answer_match(response: str, reference: str) -> float:
    """1.0 for the reference answer (normalized), else the token F1 between the two (SQuAD's answer overlap)."""
    if normalize_answer(response) == normalize_answer(reference):
        return 1.0
    got, want = Counter(_tokens(response)), Counter(_tokens(reference))
    common = sum((got & want).values())
    if not common:
        return 0.0
    precision, recall = common / sum(got.values()), common / sum(want.values())
    return 2 * precision * recall / (precision + recall)


def helpfulness_score(response: str, expected_verdict: str, reference: str, task: str) -> float:
    """How right an answer is where one is expected: exact match on the general task, answer_match on SPY."""
    if expected_verdict != "respond":
        return 0.0
    if task == "general":
        return float(normalize_answer(response) == normalize_answer(reference))
    return answer_match(response, reference)


def general_accuracy_score(response: str, reference: str, task: str) -> float:
    """The general task's exact match; 0.0 for a SPY prompt (not this reward's case)."""
    return helpfulness_score(response, "respond", reference, task) if task == "general" else 0.0


REWARD_NAMES = ("privacy_compliance", "helpfulness", "general_accuracy")
JUDGED_REWARDS = frozenset({"privacy_compliance"})  # the ones a judge failure can leave missing
