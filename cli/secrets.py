"""Keys come from the environment only, and no key reaches a file, a log, a traceback or W&B.

`refuse_in_config` refuses a config (suite, recipe) that holds a key: a field named like one (`api_key`,
`hub_token`, ...), a value equal to a secret the process knows, a value shaped like a provider key, or a URL with a
key parameter; the error names the variable to set instead. `refuse_on_command_line` refuses the same on a command
line (where every process of the machine can read it), and `variable_problem` / `endpoint_problem` check what
names a key's variable (an identifier, never the key) and an endpoint (an http(s) URL without credentials).
`redact` is the one redaction step: it replaces every secret value known to the process (the values of environment
variables named like keys, and of any variable a client was told to read its key from, `register`) and the key
parameters of URLs (`?key=...`) with `<redacted VAR>`. Everything written goes through it (store.runs' writers and
run files), and `guard_streams` puts it in front of stdout and stderr, so prints, log lines, progress bars and
tracebacks are covered too.
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


def holds_key(value: str) -> bool:
    """Whether `value` is a secret the process knows, holds a provider key, or is a URL with a key parameter."""
    return value in known() or bool(KEY_SHAPE.search(value) or URL_KEY.search(value))


def refuse_on_command_line(argv: list[str], key_options: tuple[str, ...] = ()) -> None:
    """InputError at the first of `key_options` given (options that take a key, e.g. TrainingArguments'
    `--hub_token`) or the first value that holds a key: a command line is visible to every `ps` of the machine,
    and a training run records its arguments in its checkpoints and in the pickled `training_args.bin` it
    uploads."""
    from cli.errors import InputError

    option = "argument"  # a value is named by the option before it
    for arg in argv:
        name, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if name:
            option = name
            if name in key_options:
                variable = KEY_FIELDS.get(name.lstrip("-"), "the key's environment variable")
                raise InputError("command line", None, name, f"a key is never given on the command line; set "
                                 f"{variable} in the environment instead")
            if not eq:
                continue
        if holds_key(value):
            raise InputError("command line", None, option, "holds a key (its value is not shown); a key is never "
                             "given on the command line: set it in an environment variable and name that "
                             "variable instead")


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def variable_problem(name: str) -> str | None:
    """Why `name` cannot name the environment variable that holds a key (`api_key_env`), or None."""
    if holds_key(name):
        return "holds a key (its value is not shown); name the environment variable that holds it instead"
    if not IDENTIFIER.fullmatch(name):
        return "expected the name of an environment variable (letters, digits and _), e.g. OPENAI_API_KEY"
    return None


def endpoint_problem(url: str) -> str | None:
    """Why `url` cannot be an OpenAI-compatible endpoint (`base_url`), or None: it must be an http(s) URL with a
    host that the HTTP client can parse, and carry no credentials (a user or password, a key parameter, a key):
    the key comes from its environment variable only. The URL is not echoed: it may hold a key."""
    import httpx

    if not url.startswith(("http://", "https://")):
        return "expected an http(s):// URL" + ("" if holds_key(url) else f", got {url!r}")
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError) as err:
        return f"not a valid URL ({err})"
    if parsed.userinfo:
        return "carries credentials (user:password@); an endpoint carries none: its key comes from the environment"
    if holds_key(url):
        return "carries a key (its value is not shown); an endpoint carries none: its key comes from the environment"
    if not parsed.host:
        return "names no host"
    if port is not None and not 0 < port < 65536:
        return f"port {port} is not in [1, 65535]"
    return None


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
        elif isinstance(value, str) and (value in secrets or KEY_SHAPE.search(value) or URL_KEY.search(value)):
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
