"""The suite YAML read and checked before anything runs: its schema at every level (TOP_KEYS, SECTION_KEYS,
JUDGE_KEYS), the settings, modes and benchmarks each section may name, paths resolved against root and required to
exist, every number in its range (cli/numbers.py), and backend_options' keys against the backend's constructor.
`python -m eval suite` (eval/suite.py, whose docstring shows the YAML) runs what load_config returns.
"""

from __future__ import annotations

from pathlib import Path

from cli.errors import InputError
from cli.strict_yaml import ANY, NOTHING, TEXT

SPY_SETTINGS = {"without_distractors": False, "with_distractors": True}
SPATIAL_MODES = ("one-pass", "staged", "guard")
# Section -> its schema (cli.strict_yaml.check: every level strict, in keys and types; ANY: a number, checked
# with its range by cli/numbers.py).
PATH = TEXT
SECTION_KEYS = {
    "spy": {"items": PATH, "images": PATH, "settings": [TEXT], "limit": ANY, "categories": (PATH, NOTHING),
            "self_moderation": bool},
    "synthetic_general": {"data": PATH, "images": PATH, "limit": ANY},
    "spatialtrust": {"data": PATH, "image_root": (PATH, NOTHING), "modes": [TEXT], "limit": ANY, "retries": ANY,
                     "box_scale": TEXT, "synthetic_images": ANY},
    "general": {"benchmarks": [TEXT], "datasets": dict.fromkeys(("mmmu", "ocrbench", "mme"), TEXT), "limit": ANY,
                "mmmu_splits": [TEXT]},
    "geo": {"images": PATH, "settings": [TEXT], "labels": PATH, "metadata": PATH, "limit": ANY},
}
JUDGE_KEYS = {"model": TEXT, "base_url": TEXT, "api_key_env": TEXT}
GEO_SETTINGS = ("mcq", "free-form")
GENERAL = ("mmmu", "ocrbench", "mme")
# judge (rule, or a mapping) and sections are checked by load_config; backend_options' keys by the backend
TOP_KEYS = {"name": TEXT, "root": PATH, "backend": TEXT, "backend_options": (dict, NOTHING), "judge": ANY,
            "sections": ANY, "wandb_project": (TEXT, NOTHING)}




def backend_option_names(backend: str) -> set[str] | None:
    """The options a backend's generator takes (its constructor's, and for openai the chat client's); None when
    it passes unknown ones on to a library we cannot inspect here (vLLM's engine arguments)."""
    import inspect

    from eval.backends import BACKENDS
    from vlm.chat_client import ChatClient

    names = set()
    for kind in (BACKENDS[backend], *((ChatClient,) if backend == "openai" else ())):
        for name, param in inspect.signature(kind.__init__).parameters.items():
            if param.kind is param.VAR_KEYWORD:
                if kind is BACKENDS[backend] and backend != "openai":
                    return None
            elif name not in ("self", "model"):
                names.add(name)
    return names


def _merge(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def load_config(path, root: str | None = None, overrides: dict | None = None) -> dict:
    """The suite YAML, validated (unknown keys and sections, missing files are refused before anything runs).
    `overrides` (`eval suite --set`) is merged into it first, and checked with it."""
    from cli import secrets, strict_yaml

    if not Path(path).exists():
        raise InputError(path, None, None, "no such suite file")
    config = strict_yaml.load(path)  # duplicate keys, alias bombs, FIFOs refused
    if not isinstance(config, dict):
        raise InputError(path, None, None, "expected a mapping (name, backend, judge, sections)")
    _merge(config, overrides or {})
    secrets.refuse_in_config(path, config)  # a key in the file (or a --set): refused, naming the variable to set
    strict_yaml.check(path, config, TOP_KEYS)
    judge = config.get("judge", "rule")
    if isinstance(judge, dict):
        strict_yaml.check(path, judge, JUDGE_KEYS, "judge", strict_yaml.line_of(config, "judge"))
    backend = config.get("backend", "hf")
    if backend not in ("hf", "vllm", "openai"):
        raise InputError(path, strict_yaml.line_of(config, "backend"), "backend", "choose hf, vllm or openai")
    options = config.get("backend_options") or {}
    if not isinstance(options, dict):
        raise InputError(path, strict_yaml.line_of(config, "backend_options"), "backend_options", "expected a mapping")
    known = backend_option_names(backend)
    if known is not None:
        strict_yaml.check_keys(path, options, known, "backend_options")
    sections = config.get("sections")
    if not isinstance(sections, dict) or not sections:
        raise InputError(path, None, "sections", "name at least one section: " + ", ".join(SECTION_KEYS))
    strict_yaml.check_keys(path, sections, SECTION_KEYS, "sections")
    for name, entry in sections.items():
        strict_yaml.check(path, entry, SECTION_KEYS[name], f"sections.{name}", strict_yaml.line_of(sections, name))
    if judge != "rule" and not (isinstance(judge, dict) and isinstance(judge.get("model"), str)):
        raise InputError(path, None, "judge", "rule, or a mapping with model (and base_url, api_key_env)")
    base = Path(root if root is not None else config.get("root", "."))

    def resolve(value):
        return str(value if Path(value).is_absolute() else base / value)

    def require_paths(section: dict, name: str, keys) -> None:
        """Each of `keys` given, resolved against root, and existing."""
        for key in keys:
            if key not in section:
                raise InputError(path, None, f"sections.{name}.{key}", "missing")
            section[key] = resolve(section[key])
            if not Path(section[key]).exists():
                raise InputError(path, None, f"sections.{name}.{key}", f"{section[key]} does not exist")

    spy = sections.get("spy")
    if spy is not None:
        require_paths(spy, "spy", ("items", "images"))
        if spy.get("categories") is not None:  # checked now (a bad file: its line and field), before anything runs
            from data_prep.categories import load_categories

            spy["categories"] = resolve(spy["categories"])
            if not Path(spy["categories"]).is_file():
                raise InputError(path, None, "sections.spy.categories", f"{spy['categories']} does not exist")
            load_categories(spy["categories"])
        spy.setdefault("settings", list(SPY_SETTINGS))
        bad = [s for s in spy["settings"] if s not in SPY_SETTINGS]
        if bad:
            raise InputError(path, None, "sections.spy.settings", f"{bad[0]!r}: choose from {', '.join(SPY_SETTINGS)}")
    synthetic = sections.get("synthetic_general")
    if synthetic is not None:
        require_paths(synthetic, "synthetic_general", ("data", "images"))
    spatial = sections.get("spatialtrust")
    if spatial is not None:
        if "data" not in spatial:
            raise InputError(path, None, "sections.spatialtrust.data", "missing")
        spatial["data"] = resolve(spatial["data"])
        if spatial.get("image_root"):
            spatial["image_root"] = resolve(spatial["image_root"])
        if not Path(spatial["data"]).exists() and not spatial.get("synthetic_images"):
            raise InputError(path, None, "sections.spatialtrust.data",
                             f"{spatial['data']} does not exist (synthetic_images: N draws a synthetic set there)")
        spatial.setdefault("modes", ["one-pass"])
        bad = [m for m in spatial["modes"] if m not in SPATIAL_MODES]
        if bad:
            raise InputError(path, None, "sections.spatialtrust.modes", f"{bad[0]!r}: choose from {SPATIAL_MODES}")
        from eval.spatialtrust.parsing import BOX_SCALES

        if spatial.get("box_scale", "pixels") not in BOX_SCALES:
            raise InputError(path, strict_yaml.line_of(spatial, "box_scale"), "sections.spatialtrust.box_scale",
                             f"{spatial['box_scale']!r}: choose from {', '.join(BOX_SCALES)}")
    general = sections.get("general")
    if general is not None:
        general.setdefault("benchmarks", list(GENERAL))
        bad = [b for b in general["benchmarks"] if b not in GENERAL]
        if bad:
            raise InputError(path, None, "sections.general.benchmarks", f"{bad[0]!r}: choose from {', '.join(GENERAL)}")
        datasets = general.setdefault("datasets", {})
        if not isinstance(datasets, dict) or any(k not in GENERAL for k in datasets):
            raise InputError(path, None, "sections.general.datasets", f"a mapping from {', '.join(GENERAL)} to a "
                             "local copy (save_to_disk folder or parquet) or a Hub id")
        for name, source in datasets.items():  # a relative path that exists under root is local, else a Hub id
            if (base / source).exists():
                datasets[name] = resolve(source)
    geo = sections.get("geo")
    if geo is not None:
        for key in ("images", "labels", "metadata"):
            if key in geo:
                geo[key] = resolve(geo[key])
                if not Path(geo[key]).exists():
                    raise InputError(path, None, f"sections.geo.{key}", f"{geo[key]} does not exist")
        if "images" not in geo:
            raise InputError(path, None, "sections.geo.images", "missing (the authors' download_images.py fetches them)")
        geo.setdefault("settings", ["mcq"])
        bad = [s for s in geo["settings"] if s not in GEO_SETTINGS]
        if bad:
            raise InputError(path, None, "sections.geo.settings", f"{bad[0]!r}: choose from {', '.join(GEO_SETTINGS)}")
        if "free-form" in geo["settings"] and judge == "rule":
            raise InputError(path, None, "sections.geo.settings",
                             "free-form answers need an LLM granularity judge (judge: {model: ...}); mcq needs none")
    _check_numbers(path, config, judge, sections)
    return {**config, "backend": config.get("backend", "hf"), "backend_options": config.get("backend_options") or {},
            "judge": judge, "sections": sections}


def _check_numbers(path, config: dict, judge, sections: dict) -> None:
    """Every number of the suite (a section's limit, a backend's timeout, the judge's concurrency, ...) is one, finite
    and in the range its command-line option has (cli/numbers.py), before anything runs."""
    from cli.numbers import check_mapping

    for name, entry in sections.items():
        check_mapping(path, entry, f"sections.{name}")
    if isinstance(config.get("backend_options"), dict):
        check_mapping(path, config["backend_options"], "backend_options")
    if isinstance(judge, dict):
        check_mapping(path, judge, "judge")
