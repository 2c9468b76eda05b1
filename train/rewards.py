"""GRPO's reward functions as TRL calls them (`f(prompts, completions, **columns) -> list[float | None]`), built from
losses/rewards.py's pure scores and the verdict judge: the offline rule judge (eval/spy/rule_judge.py) or an LLM judge
behind any OpenAI-compatible endpoint (eval/judge.py: cached, concurrent, bounded retries) with SPY's judge prompt.
They live here, not in losses/, because the judge is evaluation's: losses/ sits below eval/."""

from __future__ import annotations

from dataclasses import dataclass

from losses.rewards import completion_text, compliance, general_accuracy_score, helpfulness_score

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
        from eval.spy.prompts import judge_prompt, verdict_word
        from eval.spy.rule_judge import rule_verdict

        if self._client is None:
            return [rule_verdict(r) for r in responses]
        prompts = [judge_prompt(label, question, response, self.settings.categories)
                   for label, question, response in zip(labels, questions, responses, strict=True)]
        results = self._client.complete(prompts)
        # a verdict is a word of the answer; an answer naming none is no verdict (a missing reward, never a guess)
        return [None if r.get("text") is None else verdict_word(r["text"]) for r in results]


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

    def general_accuracy(prompts, completions, answer, task, **_):
        return [general_accuracy_score(completion_text(c), a, t) for c, a, t in zip(completions, answer, task,
                                                                                    strict=True)]

    available = {f.__name__: f for f in (privacy_compliance, helpfulness, general_accuracy)}
    return [available[name] for name in names]
