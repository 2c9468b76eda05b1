"""The one place that talks to OpenAI-compatible chat endpoints (an API, a `vllm serve`): `ChatClient`
(bounded concurrency, retries with backoff on 429 / 5xx / timeouts / garbage, the key from an environment
variable only) and the image messages it sends (`openai_messages`: lossless PNG data URLs). The evaluation's
API backend and judge and the data generator (data_prep/generate.py) all use it.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import queue
import random
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path

from cli.errors import InputError, RunStopped, key_refused
from cli.numbers import RULES, check_value


def load_image(image):
    """A PIL RGB image from a PIL image or a path (every backend sees the same pixels)."""
    from PIL import Image

    if isinstance(image, (str, Path)):
        with Image.open(image) as opened:
            return opened.convert("RGB")
    return image.convert("RGB")


def image_data_url(image) -> str:
    """A lossless base64 PNG data URL (the reference recompressed to JPEG, so API models saw other pixels)."""
    buffer = io.BytesIO()
    load_image(image).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def openai_messages(request: dict) -> list[dict]:
    """Chat-completions messages: each image part becomes an `image_url` part, in place."""
    images = iter(request.get("images") or [])
    messages = []
    for message in request["messages"]:
        content = message["content"]
        if isinstance(content, list):
            content = [
                {"type": "image_url", "image_url": {"url": image_data_url(next(images))}}
                if part["type"] == "image" else {"type": "text", "text": part["text"]}
                for part in content
            ]
        messages.append({"role": message["role"], "content": content})
    return messages


class GarbageResponse(Exception):
    """The server answered 2xx with something that is not a chat completion."""


def response_text(response) -> str:
    """The assistant text of a chat completion, or GarbageResponse."""
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise GarbageResponse(f"no choices in the response ({type(response).__name__})")
    content = getattr(getattr(choices[0], "message", None), "content", None)
    if not isinstance(content, str):
        raise GarbageResponse("the first choice has no text content")
    # JSON's "\ud800" reads as a lone surrogate, which has no UTF-8 form: as U+FFFD, the answer can be stored
    return re.sub("[\ud800-\udfff]", "\ufffd", content)


def is_retryable(err: Exception) -> bool:
    import openai

    if isinstance(err, (openai.APITimeoutError, openai.APIConnectionError, openai.APIResponseValidationError,
                        GarbageResponse, json.JSONDecodeError)):
        return True
    if isinstance(err, openai.APIStatusError):
        return err.status_code in (408, 409, 429) or err.status_code >= 500
    return False


def is_unreachable(err: Exception) -> bool:
    """No connection to the server at all (refused, reset, no route): not a timeout, not an HTTP answer."""
    import openai

    return isinstance(err, openai.APIConnectionError) and not isinstance(err, openai.APITimeoutError)


def retry_after(err: Exception) -> float | None:
    """Seconds the server asked us to wait (Retry-After / retry-after-ms headers), if it said."""
    response = getattr(err, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms") is not None:
            return float(headers["retry-after-ms"]) / 1000
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            import time

            return parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        return None


def describe(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err)[:500]}"


class ChatClient:
    """Chat completions against an OpenAI-compatible endpoint through `openai.AsyncOpenAI`.

    At most `concurrency` requests are in flight. A request failing with 429, 5xx, a timeout, a connection
    error or a garbage body is retried up to `max_retries` times, waiting the server's Retry-After when it
    gives one and otherwise `backoff * 2**attempt` seconds (capped at `max_backoff`) with random jitter;
    other errors (400, ...) are not retried, and 401 / 403 (a wrong key) stops the whole run at once with
    InputError naming the key's variable (exit 2), as every request would fail alike. An endpoint that is down stops
    the run too: once `max_connection_failures` requests in a row have failed for good with no connection at all
    (each after its retries; any answer from the server resets the count), RunStopped (one line, exit 1) ends it,
    instead of working every remaining request through its retries; what was finished is kept and the same command
    resumes. The API key is read from the environment variable `api_key_env` only and never logged; a server at
    `base_url` that needs no key gets a placeholder.
    """

    def __init__(self, model: str, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 concurrency: int = 8, max_retries: int = 6, timeout: float = 60.0, max_tokens: int | None = 512,
                 temperature: float | None = 0.0, backoff: float = 1.0, max_backoff: float = 60.0,
                 max_tokens_field: str = "max_tokens", extra_body: dict | None = None,
                 max_connection_failures: int = 3):
        # each one checked again here, however it came (command line, suite, Python): concurrency 0 would wait
        # forever, a NaN timeout never fires, a negative backoff crashes the first retry
        for name, value in (("concurrency", concurrency), ("max_retries", max_retries), ("timeout", timeout),
                            ("backoff", backoff), ("max_backoff", max_backoff), ("temperature", temperature),
                            ("max_tokens", max_tokens), ("max_connection_failures", max_connection_failures)):
            if value is not None:
                check_value(value, RULES[name], "endpoint options", name)
        from cli.secrets import endpoint_problem, variable_problem

        # a key's variable is a name, an endpoint carries no credentials, and a URL the HTTP client cannot parse is
        # refused here rather than with its exception at the first request
        for name, problem in (("api_key_env", variable_problem(api_key_env)),
                              ("base_url", base_url and endpoint_problem(base_url))):
            if problem:
                raise InputError("endpoint options", None, name, problem)
        self.model, self.base_url, self.api_key_env = model, base_url, api_key_env
        self.concurrency, self.max_retries, self.timeout = concurrency, max_retries, timeout
        self.backoff, self.max_backoff = backoff, max_backoff
        self.max_connection_failures, self._unreachable = max_connection_failures, 0  # requests in a row
        self.params = {"temperature": temperature, max_tokens_field: max_tokens}
        self.params = {k: v for k, v in self.params.items() if v is not None}
        if extra_body:
            self.params["extra_body"] = extra_body
        self._api_key()  # fail before any work when the key is missing

    def _api_key(self) -> str:
        from cli.secrets import register

        register(self.api_key_env)  # its value is redacted from every file written and every line printed
        key = os.environ.get(self.api_key_env)
        if key:
            return key
        if self.base_url:  # local servers (vLLM) accept any key
            return "EMPTY"
        raise InputError("environment", None, self.api_key_env,
                         "not set (the API key is read from this environment variable only)")

    def delay(self, attempt: int, err: Exception) -> float:
        asked = retry_after(err)
        if asked is not None and asked >= 0:
            return min(asked, self.max_backoff)
        return min(self.max_backoff, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)

    async def complete(self, client, messages) -> dict:
        """One completion with retries: `{"text": str}` or `{"text": None, "error": str}`."""
        try:
            messages = messages() if callable(messages) else messages
        except Exception as err:  # noqa: BLE001 - e.g. an unreadable image: nothing to retry
            return {"text": None, "error": f"request: {describe(err)}"}
        for attempt in range(self.max_retries + 1):
            try:
                response = await client.chat.completions.create(model=self.model, messages=messages, **self.params)
                self._unreachable = 0
                return {"text": response_text(response)}
            except Exception as err:  # noqa: BLE001 - classified by is_retryable
                status = getattr(err, "status_code", None)
                if status in (401, 403):  # the key is wrong for every request: stop the run, send nothing more
                    raise key_refused(self.base_url, self.api_key_env, status) from None
                unreachable = is_unreachable(err)
                if not unreachable:  # the server answered (an error status, garbage) or is slow: it is up
                    self._unreachable = 0
                if not is_retryable(err) or attempt == self.max_retries:
                    if unreachable:
                        self._unreachable += 1
                        if self._unreachable >= self.max_connection_failures:
                            raise self._down(attempt + 1, err) from None
                    return {"text": None, "error": f"failed after {attempt + 1} attempt(s): {describe(err)}"}
                await asyncio.sleep(self.delay(attempt, err))

    def _down(self, attempts: int, err: Exception) -> RunStopped:
        return RunStopped(f"{self.base_url or 'the OpenAI API'}: no connection for {self._unreachable} requests in a "
                          f"row, {attempts} attempt(s) each ({describe(err)}): the endpoint is down or unreachable; "
                          "what was finished is kept, and the same command resumes once it is back "
                          "(max_connection_failures sets how many failures in a row stop the run)")

    async def _run(self, jobs: list, put: Callable) -> None:
        import openai

        client = openai.AsyncOpenAI(api_key=self._api_key(), base_url=self.base_url, timeout=self.timeout,
                                    max_retries=0)  # retries live here, once
        semaphore = asyncio.Semaphore(self.concurrency)

        async def one(key, messages):
            async with semaphore:
                put((key, await self.complete(client, messages)))

        tasks = [asyncio.ensure_future(one(key, messages)) for key, messages in jobs]
        try:
            await asyncio.gather(*tasks)
        finally:  # a failure (a refused key) cancels every other request
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()

    def stream(self, jobs: Iterable[tuple]) -> Iterator[tuple]:
        """Yield `(key, result)` for each `(key, messages)` job as it finishes (messages may be a callable
        that builds them). The event loop runs in its own thread, so this works inside notebooks too."""
        jobs = list(jobs)
        if not jobs:
            return
        results: queue.Queue = queue.Queue()
        finished = object()
        loop = asyncio.new_event_loop()
        task = loop.create_task(self._run(jobs, results.put))

        def worker():
            try:
                loop.run_until_complete(task)
            except BaseException as err:  # noqa: BLE001 - handed to the consumer thread
                results.put(err)
            finally:
                loop.close()
                results.put(finished)

        thread = threading.Thread(target=worker, name="chat-client", daemon=True)
        thread.start()
        try:
            while (item := results.get()) is not finished:
                if isinstance(item, BaseException):
                    if isinstance(item, asyncio.CancelledError):
                        continue
                    raise item
                yield item
        finally:
            if thread.is_alive():  # the consumer stopped early: cancel what is in flight
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:
                    pass
                thread.join(timeout=30)
