"""An LLM judge behind any OpenAI-compatible endpoint (a local vLLM server or an API), with a cache.

    judge = JudgeClient("gpt-4o", cache_path="outputs/judge_cache.jsonl")
    judge.complete(["prompt 1", "prompt 2"])  # [{"text": ...}, {"text": None, "error": ...}]

Requests go through `vlm.chat_client.ChatClient` (bounded concurrency, retries with backoff on 429 / 5xx /
timeouts / garbage). Answers are cached by (judge model, prompt) in a JSON Lines file, appended as they
arrive, so re-running a judged step, even after a kill, sends nothing that was already answered. Failed
requests are not cached. The client (and the API key) is only needed when something is not cached.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator

from store.runs import RunFile
from vlm.chat_client import ChatClient


def cache_key(model: str, prompt) -> str:
    return hashlib.sha256(json.dumps([model, prompt], ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def cache_line_problem(record: dict) -> tuple[str, str] | None:
    """(field, problem) of a cache line that is not one `stream` writes (key, model and text strings, the prompt),
    or None: a file that is not a judge cache (a user's JSON Lines, an edited cache) is refused when it is opened,
    not at the first answer read from it."""
    for field in ("key", "model", "text"):
        if not isinstance(record.get(field), str):
            return field, f"expected a string, got {json.dumps(record.get(field))[:60]} (not a judge cache line)"
    if "prompt" not in record:
        return "prompt", "missing field (not a judge cache line)"
    return None


def as_messages(prompt) -> list[dict]:
    """A prompt string becomes one user message; a list of messages is sent as is."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


class JudgeClient:
    def __init__(self, model: str, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 concurrency: int = 8, max_retries: int = 6, timeout: float = 60.0, max_tokens: int = 512,
                 cache_path=None, **client_options):
        self.model = model
        self._client_args = dict(base_url=base_url, api_key_env=api_key_env, concurrency=concurrency,
                                 max_retries=max_retries, timeout=timeout, max_tokens=max_tokens,
                                 temperature=0.0, **client_options)
        self._client: ChatClient | None = None
        self.cache = RunFile(cache_path, key="key", check=cache_line_problem) if cache_path else None

    @property
    def client(self) -> ChatClient:
        if self._client is None:
            self._client = ChatClient(self.model, **self._client_args)
        return self._client

    def cached(self, prompt) -> str | None:
        record = self.cache.get(cache_key(self.model, prompt)) if self.cache else None
        return None if record is None else record["text"]

    def stream(self, jobs: Iterable[tuple]) -> Iterator[tuple]:
        """Yield `(key, result)` for each `(key, prompt)` job: cached answers first, then the others as they
        finish. Identical prompts are sent once."""
        by_hash: dict[str, list] = {}
        prompts: dict[str, object] = {}
        for key, prompt in jobs:
            text = self.cached(prompt)
            if text is not None:
                yield key, {"text": text}
                continue
            h = cache_key(self.model, prompt)
            by_hash.setdefault(h, []).append(key)
            prompts[h] = prompt
        if not by_hash:
            return
        for h, result in self.client.stream((h, as_messages(prompts[h])) for h in by_hash):
            if self.cache is not None and result.get("text") is not None:
                self.cache.append({"key": h, "model": self.model, "prompt": prompts[h], "text": result["text"]})
            for key in by_hash[h]:
                yield key, result

    def complete(self, prompts: list) -> list[dict]:
        """Per prompt, in order: `{"text": str}` or `{"text": None, "error": str}`."""
        results = dict(self.stream(enumerate(prompts)))
        return [results[i] for i in range(len(prompts))]
