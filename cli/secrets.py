"""Keys come from the environment only, and no key reaches a file, a log, a traceback or W&B.

`refuse_in_config` refuses a config (suite, recipe) that holds a key: a field named like one (`api_key`,
`hub_token`, ...), a value equal to a secret the process knows, or a value shaped like a provider key; the error
names the variable to set instead. `redact` is the one redaction step: it replaces every secret value known to
the process (the values of environment variables named like keys, and of any variable a client was told to read
its key from, `register`) and the key parameters of URLs (`?key=...`) with `<redacted VAR>`. Everything written
goes through it (store.runs' writers and run files), and `guard_streams` puts it in front of stdout and stderr,
so prints, log lines, progress bars and tracebacks are covered too.
"""

from __future__ import annotations

import io
import os
import re
import sys

# Variables whose values are secrets by their name (OPENAI_API_KEY, HF_TOKEN, GOOGLE_MAPS_API_KEY, WANDB_API_KEY).
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)
# Config fields that would hold a key, and the variable to use instead.
KEY_FIELDS = {"api_key": "the variable named by api_key_env (default OPENAI_API_KEY)",
              "hub_token": "HF_TOKEN", "token": "HF_TOKEN", "hf_token": "HF_TOKEN", "wandb_api_key": "WANDB_API_KEY",
              "geocoder_key": "GOOGLE_MAPS_API_KEY", "key": "the key's environment variable",
              "password": "the key's environment variable", "secret": "the key's environment variable"}
# Shapes of provider keys: OpenAI / Anthropic `sk-...`, Hugging Face `hf_...`, Google `AIza...`.
KEY_SHAPE = re.compile(r"\b(sk-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_-]{30,})")
URL_KEY = re.compile(r"([?&](?:key|api_key|apikey|access_token|token)=)[^&#\s\"']+", re.IGNORECASE)
MIN_LENGTH = 8  # shorter values (EMPTY, 1) would redact ordinary words

_registered: set[str] = set()


def register(variable: str) -> None:
    """Treat `variable`'s value as a secret from now on (a client told to read its key from it)."""
    _registered.add(variable)


def known() -> dict[str, str]:
    """Secret value -> the variable holding it."""
    values = {}
    for name, value in os.environ.items():
        if (SECRET_NAME.search(name) or name in _registered) and value and len(value) >= MIN_LENGTH \
                and value.upper() not in ("EMPTY", "NONE", "FALSE", "TRUE"):
            values[value] = name
    return values


def redact(text: str) -> str:
    """`text` with every known secret and every URL key parameter replaced by `<redacted VAR>`."""
    if not text:
        return text
    for value, name in sorted(known().items(), key=lambda kv: -len(kv[0])):
        if value in text:
            text = text.replace(value, f"<redacted {name}>")
    return URL_KEY.sub(r"\1<redacted>", text)


def redact_obj(obj):
    """A JSON-like object with `redact` applied to every string in it (keys too)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_obj(k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj


def refuse_in_config(path, obj, field: str = "", line_of=None) -> None:
    """InputError at the first key-like field or key-like value in `obj`, naming the variable to use."""
    from cli.errors import InputError

    secrets = known()

    def walk(value, where, line):
        if isinstance(value, dict):
            for key, sub in value.items():
                name = f"{where}.{key}" if where else str(key)
                key_line = getattr(value, "key_lines", {}).get(key, line)
                if str(key).lower() in KEY_FIELDS and sub not in (None, ""):
                    raise InputError(path, key_line, name, "a key is never read from a file; set "
                                     f"{KEY_FIELDS[str(key).lower()]} in the environment instead")
                walk(sub, name, key_line)
        elif isinstance(value, list):
            for n, item in enumerate(value):
                walk(item, f"{where}[{n}]", (getattr(value, "item_lines", None) or [line] * (n + 1))[n])
        elif isinstance(value, str) and (value in secrets or KEY_SHAPE.search(value)):
            variable = secrets.get(value, "an environment variable")
            raise InputError(path, line, where, f"holds a key (its value is not shown); set {variable} in the "
                             "environment and name it (api_key_env) instead")

    walk(obj, field, getattr(obj, "line", None) or None)


class _Redacting(io.TextIOBase):
    """A text stream that redacts what it writes, then hands it to the real stream."""

    def __init__(self, inner):
        self.inner = inner

    def write(self, text):
        self.inner.write(redact(text))
        return len(text)

    def flush(self):
        self.inner.flush()

    def isatty(self):
        return self.inner.isatty()

    def fileno(self):
        return self.inner.fileno()

    @property
    def encoding(self):
        return getattr(self.inner, "encoding", "utf-8")

    def __getattr__(self, name):
        return getattr(self.inner, name)


def guard_streams() -> None:
    """Redact everything printed from now on (stdout, stderr: prints, logging, tqdm, tracebacks); idempotent.
    Log handlers that libraries made before (transformers keeps its own stderr handler) are pointed at the
    redacting streams too."""
    import logging

    wrapped = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Redacting):
            setattr(sys, name, _Redacting(stream))
            wrapped[id(stream)] = getattr(sys, name)
    if not wrapped:
        return
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in wrapped:
                handler.setStream(wrapped[id(stream)])
