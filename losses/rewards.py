"""GRPO's rewards on SPY-Tune prompts: pure scoring functions, and the registry a recipe names them from.

- `privacy_compliance`: 1 when the sampled answer does what SPY expects of the prompt (refuse exactly when the
  instruction marks the asked category private, scenarios and absolute categories included:
  `data_prep.spy.expected_verdict`), else 0. The answer's verdict (respond / reject) comes from the offline rule
  judge (eval/spy/rule_judge.py) or from an LLM judge behind any OpenAI-compatible endpoint (eval/judge.py: cached,
  concurrent, bounded retries) with SPY's judge prompt.
- `helpfulness`: when the expected verdict is to answer, how right the answer is: the general task's exact match
  (eval/general/synthetic.py), or for a SPY prompt the token F1 against its reference answer (1 when equal). A
  refusal scores about 0 there, so refusing everything cannot win.

A judge that fails (no answer after its retries, or an answer that names no verdict) gives `None`: a missing reward,
which GRPO leaves out of its group (losses/grpo_trainer.py), never a zero. A reward that does not apply to a prompt
(compliance of a general-task prompt, helpfulness of a prompt to refuse) is 0.0, the same for all G completions of
the group, so it moves no advantage.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from eval.general.synthetic import normalize as normalize_answer


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


# ---- the judge -----------------------------------------------------------------------------------------------------

@dataclass
class JudgeSettings:
    """`judge: rule` (offline) or an LLM judge model at `base_url` (default: the OpenAI API)."""

    judge: str = "rule"
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8
    max_retries: int = 3
    timeout: float = 60.0
    cache_path: str | None = None
    categories: str | None = None


class VerdictJudge:
    """respond / reject verdicts of answers, or None where the LLM judge failed."""

    def __init__(self, settings: JudgeSettings):
        self.settings = settings
        self._client = None
        if settings.judge != "rule":
            from eval.judge import JudgeClient

            self._client = JudgeClient(settings.judge, base_url=settings.base_url, api_key_env=settings.api_key_env,
                                       concurrency=settings.concurrency, max_retries=settings.max_retries,
                                       timeout=settings.timeout, cache_path=settings.cache_path)
            self._client.client  # noqa: B018 - a missing API key fails now, before any model loads

    def verdicts(self, labels: list[str], questions: list[str], responses: list[str]) -> list[str | None]:
        from eval.spy.prompts import VERDICTS, judge_prompt, parse_verdict
        from eval.spy.rule_judge import rule_verdict

        if self._client is None:
            return [rule_verdict(r) for r in responses]
        prompts = [judge_prompt(label, question, response, self.settings.categories)
                   for label, question, response in zip(labels, questions, responses, strict=True)]
        results = self._client.complete(prompts)
        parsed = [None if r.get("text") is None else parse_verdict(r["text"]) for r in results]
        return [v if v in VERDICTS else None for v in parsed]  # an unparsable answer is no verdict


# ---- the reward functions, as TRL calls them -------------------------------------------------------------------------

def make_reward_funcs(names: list[str], judge: VerdictJudge) -> list:
    """The recipe's reward names -> TRL reward functions (`f(prompts, completions, **columns) -> list[float|None]`)."""

    def privacy_compliance(prompts, completions, expected_verdict, task, p_label, question, log_metric=None, **_):
        spy_rows = [i for i, t in enumerate(task) if t == "spy"]
        texts = [completion_text(c) for c in completions]
        found = judge.verdicts([p_label[i] for i in spy_rows], [question[i] for i in spy_rows],
                               [texts[i] for i in spy_rows])
        scores: list[float | None] = [0.0] * len(completions)
        for i, verdict in zip(spy_rows, found, strict=True):
            scores[i] = compliance(verdict, expected_verdict[i])
            if log_metric is not None and scores[i] is not None:
                log_metric(f"compliance/{p_label[i]}", scores[i])
        return scores

    def helpfulness(prompts, completions, expected_verdict, answer, task, **_):
        return [helpfulness_score(completion_text(c), v, a, t)
                for c, v, a, t in zip(completions, expected_verdict, answer, task, strict=True)]

    available = {f.__name__: f for f in (privacy_compliance, helpfulness)}
    return [available[name] for name in names]


REWARD_NAMES = ("privacy_compliance", "helpfulness")
JUDGED_REWARDS = frozenset({"privacy_compliance"})  # the ones a judge failure can leave missing
