"""Keys come from the environment only, and no key reaches a file, a log, a traceback or W&B.

Two steps, one on each side of a run.

**Refused on input**, before any work. `refuse_on_command_line` (every command line), `refuse_in_config` (a suite,
a recipe file) and `refuse_recorded` (every field of a training run's parsed arguments, whichever file, flag or
spelling set it) refuse a value that *contains* a secret the process knows (also percent-decoded), holds a provider
key's shape, or carries URL credentials (`user:password@`, a parameter named like a key: `?x-api-key=`, `;secret=`,
`#k%65y=`); `refuse_recorded` also refuses a credential field given at all (`is_credential_field`: `hub_token`,
every `*_token`, `*_key`, `*password*`, ...) and a URL field that carries any userinfo, query or fragment: a run
records its URLs, so they must be `scheme://host[:port]/path`. The variables named as key sources (`*_key_env`
options and fields) are registered before anything is checked, so their values count as known secrets.

**Scrubbed on output**: `scrub` is the one function between a value and anything recorded. A string loses every
known secret (`<redacted VAR>`, also percent-quoted), URL userinfo, the values of key-named URL parameters and
provider-key shapes; a string that is a URL, or a URL quoted whole inside a text (a JSON value, a Python repr),
loses its userinfo, query and fragment (a query inside free text is kept unless its parameter is named like a
key); a config dataclass is copied with its credential fields None and every other attribute scrubbed; mappings and
lists are scrubbed item by item. It is called where each format is written: store.runs (every file and run-file
line our code writes: cards, JSON, the judge cache), the trainers' `_save` (training_args.bin,
losses/checkpointing.py), train/resume.py's settings (trainer_state.json), train/card.py's W&B callback (the run's
config, name and recorded command line), the printed streams (`guard_streams`: logs, progress bars, tracebacks) and
cli/entry.py's error line.

Secrets known to the process: the values of environment variables named like keys (`SECRET_NAME`) and of every
variable registered as a key source (`register`), at least MIN_LENGTH characters long.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
import re
import sys
from urllib.parse import quote, unquote, unquote_plus

# Variables whose values are secrets by their name (OPENAI_API_KEY, HF_TOKEN, GOOGLE_MAPS_API_KEY, WANDB_API_KEY).
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)
# Options and fields that name the variable a key is read from (api_key_env, judge_api_key_env, geocoder_key_env).
KEY_SOURCE = re.compile(r"key[_-]env$", re.IGNORECASE)
# Fields that would hold a credential: a name ending in a credential word, or holding password / secret anywhere.
CREDENTIAL_FIELD = re.compile(r"(^|[_-])(token|key|secret|password|passwd|pwd|credentials?|auth|authorization|cookie)$|"
                              r"password|passwd|secret", re.IGNORECASE)
# Config fields that would hold a key, and the variable to use instead.
KEY_FIELDS = {"api_key": "the variable named by api_key_env (default OPENAI_API_KEY)",
              "hub_token": "HF_TOKEN", "token": "HF_TOKEN", "hf_token": "HF_TOKEN", "wandb_api_key": "WANDB_API_KEY",
              "geocoder_key": "GOOGLE_MAPS_API_KEY", "key": "the key's environment variable",
              "password": "the key's environment variable", "secret": "the key's environment variable"}
# Shapes of provider keys: OpenAI / Anthropic `sk-...`, Hugging Face `hf_...`, Google `AIza...`.
KEY_SHAPE = re.compile(r"\b(sk-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_-]{30,})")
SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
URL = re.compile(SCHEME)
# `scheme://user:password@`: the authority's userinfo, up to its last `@` (a path, query or fragment ends it).
USERINFO = re.compile(rf"({SCHEME})[^/\s?#\"'<>\\]*@")
# A URL that is a whole quoted string inside a text: a JSON value, a Python repr's.
QUOTED_URL = re.compile(rf"""(["'])({SCHEME}[^"'\s\\]*)\1""")
# A URL parameter `NAME=VALUE` after any of the separators a URL parser or a server may split on.
PARAMETER = re.compile(r"([?&;#])([^=&;#?\s\"'<>\\/]+)=([^&;#\s\"'<>\\]*)")
KEY_PARAMETER = re.compile(r"key|token|secret|passw|pwd|auth|credential|signature|^sig$", re.IGNORECASE)
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


def is_credential_field(name) -> bool:
    """Whether a field or option (any spelling: `hub_token`, `--hub-token`) would hold a credential. The tokenizer's
    special tokens (`pad_token`, `eos_token`: transformers' SPECIAL_TOKENS_ATTRIBUTES) are vocabulary, not keys."""
    name = str(name).lstrip("-").replace("-", "_")
    if not CREDENTIAL_FIELD.search(name):
        return False
    if name.endswith("_token"):
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        return name not in PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES
    return True


def _key_parameter(name: str) -> bool:
    return bool(KEY_PARAMETER.search(unquote(name).replace("-", "_")))


def _scrub_parameter(match) -> str:
    separator, name, _value = match.groups()
    return f"{separator}{name}=<redacted>" if _key_parameter(name) else match.group(0)


def _bare_url(url: str) -> str:
    """scheme://host[:port]/path of a URL: no userinfo, query or fragment."""
    return re.split(r"[?#]", USERINFO.sub(r"\1", url), maxsplit=1)[0]


def _scrub_text(text: str) -> str:
    if "://" in text:  # a value that is a URL, whole or quoted in text (JSON, a Python repr), is recorded bare
        if re.fullmatch(rf"\s*{SCHEME}\S*\s*", text):
            text = _bare_url(text)
        text = QUOTED_URL.sub(lambda m: f"{m[1]}{_bare_url(m[2])}{m[1]}", text)
    for value, name in sorted(known().items(), key=lambda kv: -len(kv[0])):
        for form in dict.fromkeys((value, quote(value, safe=""))):
            if form in text:
                text = text.replace(form, f"<redacted {name}>")
    if "://" in text:
        text = USERINFO.sub(r"\1<redacted>@", text)
    if "=" in text:
        text = PARAMETER.sub(_scrub_parameter, text)
    return KEY_SHAPE.sub("<redacted key>", text)


def scrub(value):
    """What may be recorded of `value` (the module's docstring says what goes): the one step between a value and
    any file, log line, W&B record or error line."""
    if isinstance(value, str):
        return _scrub_text(value) if value else value
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(scrub(v) for v in value)
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kept = copy.copy(value)
        for name, item in vars(value).items():
            object.__setattr__(kept, name, None if item is not None and is_credential_field(name) else scrub(item))
        return kept
    return value


def redact(text: str) -> str:
    """`scrub` of a text (the name store.runs and the older callers use)."""
    return scrub(text)


def redact_obj(obj):
    """`scrub` of a JSON-like object (the name the older callers use)."""
    return scrub(obj)


def text_problem(text: str, secrets: dict[str, str] | None = None) -> str | None:
    """Why a value given on a command line or in a file holds a key, or None; never shows the key."""
    secrets = known() if secrets is None else secrets
    forms = dict.fromkeys((text, unquote(text), unquote_plus(text)))
    for secret, variable in secrets.items():
        if any(secret in form for form in forms):
            return f"holds the value of {variable} (not shown)"
    if any(KEY_SHAPE.search(form) for form in forms):
        return "holds a key (its value is not shown)"
    if USERINFO.search(text):
        return "carries credentials (user:password@, not shown)"
    if any(_key_parameter(m.group(2)) for m in PARAMETER.finditer(text)):
        return "carries a key parameter (its value is not shown)"
    return None


def value_problem(text: str, secrets: dict[str, str] | None = None, recorded: bool = False) -> str | None:
    """`text_problem`, and for a value a run records (`recorded`), a URL carrying any userinfo, query or fragment."""
    return text_problem(text, secrets) or (url_problem(text) if recorded and URL.match(text.strip()) else None)


def holds_key(value: str) -> bool:
    """Whether `value` holds a secret the process knows, a provider key or URL credentials."""
    return text_problem(value) is not None


def _register_key_sources(pairs) -> None:
    """Register the variables that options and fields named `*_key_env` name, before any value is checked."""
    for name, value in pairs:
        if KEY_SOURCE.search(str(name)) and isinstance(value, str) and IDENTIFIER.fullmatch(value):
            register(value)


def _options(argv: list[str]):
    """(option, value) of a command line: `--name value`, `--name=value`; a value not after an option is named
    `argument`."""
    option = "argument"
    for arg in argv:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            option = name
            if eq:
                yield name, value
            continue
        yield option, arg


def refuse_on_command_line(argv: list[str], key_options: tuple[str, ...] = (), recorded: bool = False) -> None:
    """InputError at the first of `key_options` given or the first value that holds a key (`value_problem`; a run
    that records its arguments: `recorded`): a command line is visible to every `ps` of the machine."""
    from cli.errors import InputError

    options = list(_options(argv))
    _register_key_sources((name.lstrip("-").replace("-", "_"), value) for name, value in options)
    for arg in argv:
        name = arg.partition("=")[0]
        if arg.startswith("--") and name in key_options:
            variable = KEY_FIELDS.get(name.lstrip("-").replace("-", "_"), "the key's environment variable")
            raise InputError("command line", None, name, f"a key is never given on the command line; set "
                             f"{variable} in the environment instead")
    secrets = known()
    for option, value in options:
        problem = value_problem(value, secrets, recorded)
        if problem:
            raise InputError("command line", None, option, f"{problem}; a key is never given on the command line: "
                             "set it in an environment variable and name that variable instead")


def url_problem(url: str) -> str | None:
    """Why a URL cannot be recorded with a run, or None: credentials, a query or a fragment (none is shown)."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as err:
        return f"not a valid URL ({scrub(str(err))})"
    if parsed.userinfo or USERINFO.search(url):
        return "carries credentials (user:password@, not shown); it carries none: its key comes from the environment"
    if any(_key_parameter(m.group(2)) for m in PARAMETER.finditer(url)):
        return "carries a key (its value is not shown); it carries none: its key comes from the environment"
    if parsed.query or parsed.fragment or "?" in url or "#" in url:
        return "carries a query or fragment (not shown); a URL recorded with a run is scheme://host[:port]/path"
    return None


def refuse_recorded(values: dict, source) -> None:
    """Every field of a run's parsed arguments (`values`: name -> value, whatever set it), before any of it is used
    or recorded: a credential field given at all, a value holding a known secret or a key, a URL with userinfo,
    query or fragment: InputError naming `source(name)` (where it was given) and the field, never the value."""
    from cli.errors import InputError

    _register_key_sources(values.items())
    secrets = known()
    for name, value in values.items():
        if is_credential_field(name) and value not in (None, "", [], ()):
            raise InputError(source(name), None, name, f"a key is never given as an option or in a file; set "
                             f"{KEY_FIELDS.get(name, 'its environment variable')} in the environment instead")
        for text in (value if isinstance(value, (list, tuple)) else [value]):
            if not isinstance(text, str):
                continue
            problem = value_problem(text, secrets, recorded=True)
            if problem:
                raise InputError(source(name), None, name, f"{problem}; a key is never given as an option or in a "
                                 "file: set it in an environment variable and name that variable instead")


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def variable_problem(name: str) -> str | None:
    """Why `name` cannot name the environment variable that holds a key (`api_key_env`), or None."""
    if KEY_SHAPE.search(name) or name in known():
        return "holds a key (its value is not shown); name the environment variable that holds it instead"
    if not IDENTIFIER.fullmatch(name):
        return "expected the name of an environment variable (letters, digits and _), e.g. OPENAI_API_KEY"
    return None


def endpoint_problem(url: str) -> str | None:
    """Why `url` cannot be an OpenAI-compatible endpoint (`base_url`), or None: an http(s) URL with a host that the
    HTTP client can parse, and nothing beside scheme, host, port and path: no credentials, no query, no fragment
    (the key comes from its environment variable only). The URL is never echoed: it may hold a key."""
    import httpx

    if not url.lower().startswith(("http://", "https://")):
        return "expected an http(s):// URL (the value is not shown)"
    problem = url_problem(url)
    if problem:
        return problem
    if holds_key(url):
        return "carries a key (its value is not shown); an endpoint carries none: its key comes from the environment"
    parsed = httpx.URL(url)
    if not parsed.host:
        return "names no host"
    if parsed.port is not None and not 0 < parsed.port < 65536:
        return f"port {parsed.port} is not in [1, 65535]"
    return None


def refuse_in_config(path, obj, field: str = "", line_of=None, recorded: bool = False) -> None:
    """InputError at the first key-like field or key-like value in `obj` (`value_problem`; a run's recipe, whose
    values the run records: `recorded`), naming the variable to use. The variables the file names as key sources
    (`*_key_env`) count as secrets from here on."""
    from cli.errors import InputError

    def sources(value):
        if isinstance(value, dict):
            for key, sub in value.items():
                yield key, sub
                yield from sources(sub)
        elif isinstance(value, list):
            for item in value:
                yield from sources(item)

    _register_key_sources(sources(obj))
    secrets = known()

    def walk(value, where, line):
        if isinstance(value, dict):
            for key, sub in value.items():
                name = f"{where}.{key}" if where else str(key)
                key_line = getattr(value, "key_lines", {}).get(key, line)
                if is_credential_field(key) and sub not in (None, "", [], {}):  # the rule recipes' fields get
                    variable = KEY_FIELDS.get(str(key).lower()) or (
                        key if SECRET_NAME.search(str(key)) and IDENTIFIER.fullmatch(str(key)) else "its variable")
                    raise InputError(path, key_line, name, "a key is never read from a file; "
                                     f"set {variable} in the environment instead")
                walk(sub, name, key_line)
        elif isinstance(value, list):
            for n, item in enumerate(value):
                walk(item, f"{where}[{n}]", (getattr(value, "item_lines", None) or [line] * (n + 1))[n])
        elif isinstance(value, str) and value_problem(value, secrets, recorded):
            variable = next((v for s, v in secrets.items() if s in value or s in unquote(value)),
                            "an environment variable")
            raise InputError(path, line, where, f"{value_problem(value, secrets, recorded)}; set {variable} in the "
                             "environment and name it (api_key_env) instead")

    walk(obj, field, getattr(obj, "line", None) or None)


class _Redacting(io.TextIOBase):
    """A text stream that scrubs what it writes, then hands it to the real stream."""

    def __init__(self, inner):
        self.inner = inner

    def write(self, text):
        self.inner.write(scrub(text))
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
    """Scrub everything printed from now on (stdout, stderr: prints, logging, tqdm, tracebacks); idempotent.
    Log handlers that libraries made before (transformers keeps its own stderr handler) are pointed at the
    scrubbing streams too."""
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


def hook_console_capture() -> None:
    """Import W&B's console capture ("wrap") with the scrubber outside it. wandb.sdk.lib.console_capture patches
    the `write` of whatever sys.stdout / sys.stderr are when it is first imported, and hands its callbacks the text
    given to that `write`: imported behind guard_streams, it patched the scrubbing stream and recorded the raw text
    in W&B's output.log. Imported here, with the real streams in sys for that moment, it patches them, below the
    scrubber, and records what the scrubber passed on. Already imported (before guard_streams), it sits below
    the scrubber already. Call before anything imports wandb (train/common.check_settings, for a run reporting to
    W&B)."""
    import importlib.util

    if "wandb.sdk.lib.console_capture" in sys.modules or importlib.util.find_spec("wandb") is None:
        return
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s.inner if isinstance(s, _Redacting) else s for s in saved)
    try:
        import wandb.sdk.lib.console_capture  # noqa: F401 - imported for its patch of the real streams
    finally:
        sys.stdout, sys.stderr = saved
