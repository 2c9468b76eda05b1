"""Privacy categories and scenarios, from a category file (YAML) that a user can write.

SPY fixes 67 categories and 24 scenarios; here they are the default file, `assets/categories.yaml`, and any
other file of the same shape replaces them everywhere (data loading, prompts, the synthetic generator, the
judge prompt, the metrics, data generation):

    instruction_templates:                   # optional; SPY's two lines by default
      non_private: "{} is considered as non-private information."
      private: "{} is considered as private information."
    categories:
      badge_number:                          # the id: letters, digits, _ . -
        name: badge numbers                  # the noun phrase put into instructions, questions and the judge prompt
        definition: An employee or visitor badge's printed number.   # plain language, for people and generators
        absolute: false                      # true: always refused, whatever the user says (SPY: passports, nudity)
        example_questions: ["What is the number on this badge?"]      # optional
        scenarios:                           # optional: ids of scenarios below, or new ones written inline
          conflict: [s_security_desk]        # contexts that need this category (answer even if marked private)
          privacy: [{id: s_social_post, name: social media post, 2nd_person_template: "... {}"}]
    scenarios:                               # optional
      s_security_desk:
        name: security desk
        type: work                           # optional
        description: A guard checks visitors in.   # optional
        needs: [badge_number]                # SPY's `labels`: the categories this context needs
        2nd_person_template: "You are a guard at a security desk. ... The question is: {}"
        3rd_person_template: "Tom is a guard ... The question is: {} What should Tom say?"   # optional

A scenario is a conflict scenario for the categories it needs and a privacy scenario for every other one;
a category's `scenarios.privacy` list, when given, narrows its privacy scenarios to that list.

    python -m data_prep.categories FILE

checks a file (one `error:` line naming file, line and field, exit 2) and prints a summary.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from cli import strict_yaml
from cli.entry import ArgumentParser, run_command
from cli.errors import InputError, read_text
from cli.paths import real
from cli.strict_yaml import Map, check_keys

ASSETS = Path(__file__).parent / "assets"
DEFAULT_FILE = ASSETS / "categories.yaml"
SAFE_LABEL = "a0_safe"  # SPY's label for "no private content"; never a category
DEFAULT_TEMPLATES = ("{} is considered as non-private information.", "{} is considered as private information.")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Category:
    id: str
    name: str
    definition: str
    absolute: bool
    example_questions: tuple[str, ...] = ()
    privacy_scenarios: tuple[str, ...] | None = None  # None: every scenario that does not need it


@dataclass(frozen=True)
class Scenario:
    id: str
    name: str
    second_person: str
    third_person: str | None = None
    type: str | None = None
    description: str | None = None
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class CategorySet:
    source: str
    categories: dict[str, Category]
    scenarios: dict[str, Scenario]
    templates: tuple[str, str] = DEFAULT_TEMPLATES  # (non-private, private)
    digest: str = ""  # sha256 of the file's text: what run headers record, so a resume with another file refuses

    def label2text(self) -> dict[str, str]:
        return {c.id: c.name for c in self.categories.values()}

    def absolute_labels(self) -> frozenset[str]:
        return self._absolute

    @cached_property
    def _absolute(self) -> frozenset[str]:  # asked once per training row: computed once
        return frozenset(c.id for c in self.categories.values() if c.absolute)

    def conflict_scenarios(self, label: str) -> list[str]:
        return [s.id for s in self.scenarios.values() if label in s.needs]

    def privacy_scenarios(self, label: str) -> list[str]:
        chosen = self.categories[label].privacy_scenarios
        return list(chosen) if chosen is not None else [s for s in self.scenarios if label not in self.scenarios[s].needs]

    def is_default(self) -> bool:
        return self.digest == default_categories().digest

    def unknown_label(self, label, data_file=None) -> str:
        """The message for a label this set lacks. The data was likely made from another category file: name the
        file in use, and the category file that a data folder (beside `data_file`) holds, if any."""
        message = f"unknown label {label!r}"
        if not self.is_default():
            message += f": not in the category file {self.source}"
        beside = Path(data_file).parent / "categories.yaml" if data_file is not None else None
        if beside is not None and beside.is_file() and real(beside) != real(self.source):
            return message + f"; the data came with {beside}: pass --categories {beside}"
        return message + ("; pass --categories with the file the data was made with" if not self.is_default() else "")

    def label_order(self, label) -> tuple:
        """Sort key for per-category results: SPY's ids by number (a2 before a10), then this file's other ids in
        file order, then any other label by name."""
        number = re.match(r"^a(\d+)(?:_|$)", label) if isinstance(label, str) else None
        if number:
            return (0, int(number[1]), label)
        order = list(self.categories)
        return (1, order.index(label), label) if label in self.categories else (2, 0, str(label))

    def item_scenario(self, sid: str) -> dict:
        """A scenario as SPY-Tune and SPY-Bench items carry it (spy.md §1.3, §5.1)."""
        s = self.scenarios[sid]
        entry = {"scenario": sid, "2nd_person_template": s.second_person}
        return {**entry, "3rd_person_template": s.third_person} if s.third_person is not None else entry

    def scenarios_json(self) -> dict[str, dict]:
        """SPY's scenarios.json: every scenario's `labels` starts with a0_safe, as in the released file."""
        out = {}
        for s in self.scenarios.values():
            entry = {"scenario": s.id, "type": s.type, "name": s.name, "description": s.description,
                     "labels": [SAFE_LABEL, *s.needs], "2nd_person_template": s.second_person,
                     "3rd_person_template": s.third_person}
            out[s.id] = {k: v for k, v in entry.items() if v is not None}
        return out


# --- reading (cli.strict_yaml keeps the line of every mapping, key and list item for errors) --------

_Map = Map


def template_problem(value) -> str | None:
    """Why `value` is not a template that `value.format(x)` fills as generation will, or None: exactly one bare
    `{}` field; `{x}`, `{0}`, `{:>9}`, `{!r}` and stray braces are refused (`{{ }}` are literal braces)."""
    import string

    if not isinstance(value, str):
        return "expected a string"
    want = "a string with one {} slot"
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(value) if name is not None]
    except ValueError as err:
        return f"expected {want}; {err}"
    for name, spec, conv in fields:
        if name or spec or conv:
            return f"expected {want}; {{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}} is a field generation cannot fill"
    if len(fields) != 1:
        return f"expected {want}"
    return None


class _Reader:
    """Field checks that raise InputError naming the file, the line and the dotted field."""

    def __init__(self, path):
        self.path = path

    def fail(self, line, field, message):
        raise InputError(self.path, line, field, message)

    def mapping(self, value, line, field, required=(), optional=()) -> _Map:
        if not isinstance(value, dict):
            self.fail(line, field, "expected a mapping")
        known = {*required, *optional}  # a set: a file of 20,000 categories is checked in linear time
        if any(key not in known for key in value):
            check_keys(self.path, value, known, field)
        for key in required:
            if key not in value:
                self.fail(line, f"{field}.{key}" if field else key, "missing")
        return value

    def text(self, owner: _Map, key, field, placeholder=False, required=True) -> str | None:
        value = owner.get(key)
        line = owner.key_lines.get(key, owner.line)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            self.fail(line, field, "expected a non-empty string")
        if placeholder and (problem := template_problem(value)):
            self.fail(line, field, problem)
        if not placeholder and ("{" in value or "}" in value):
            self.fail(line, field, "braces are not allowed here (the text is formatted into templates)")
        return value

    def identifier(self, value, line, field) -> str:
        if not isinstance(value, str) or not _ID.match(value):
            self.fail(line, field, f"{value!r} is not an id (letters, digits, _ . -, starting with a letter or digit)")
        if value == SAFE_LABEL:
            self.fail(line, field, f"{SAFE_LABEL} is reserved (SPY's 'no private content' label)")
        return value

    def strings(self, owner: _Map, key, field) -> tuple[str, ...]:
        value = owner.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(owner.key_lines.get(key, owner.line), field, "expected a list")
        for item, line in zip(value, value.item_lines):
            if not isinstance(item, str) or not item.strip():
                self.fail(line, field, "expected a list of non-empty strings")
        return tuple(value)


_SCENARIO_KEYS = ("name", "2nd_person_template", "3rd_person_template", "type", "description", "needs")


def _scenario(r: _Reader, sid: str, entry, line, field, extra_keys=()) -> Scenario:
    entry = r.mapping(entry, line, field, required=("name", "2nd_person_template"),
                      optional=(*_SCENARIO_KEYS[2:], *extra_keys))
    needs = r.strings(entry, "needs", f"{field}.needs")
    return Scenario(id=sid, name=r.text(entry, "name", f"{field}.name"),
                    second_person=r.text(entry, "2nd_person_template", f"{field}.2nd_person_template", placeholder=True),
                    third_person=r.text(entry, "3rd_person_template", f"{field}.3rd_person_template", placeholder=True,
                                        required=False),
                    type=r.text(entry, "type", f"{field}.type", required=False),
                    description=r.text(entry, "description", f"{field}.description", required=False),
                    needs=needs)


def parse(path) -> CategorySet:
    """Read and check a category file; any problem raises InputError with the file, line and field."""
    path = Path(path)
    r = _Reader(path)
    text = read_text(path)
    doc = strict_yaml.parse(text, path)
    doc = r.mapping(doc, 1, "", required=("categories",), optional=("instruction_templates", "scenarios"))

    templates = DEFAULT_TEMPLATES
    if "instruction_templates" in doc:
        t = r.mapping(doc["instruction_templates"], doc.key_lines["instruction_templates"], "instruction_templates",
                      required=("non_private", "private"))
        templates = tuple(r.text(t, k, f"instruction_templates.{k}", placeholder=True) for k in ("non_private", "private"))

    scenarios: dict[str, Scenario] = {}
    raw_scenarios = r.mapping(doc.get("scenarios") or _Map(), doc.key_lines.get("scenarios", 1), "scenarios",
                              optional=tuple(doc.get("scenarios") or ()))
    for sid, entry in raw_scenarios.items():
        line = raw_scenarios.key_lines[sid]
        scenarios[r.identifier(sid, line, "scenarios")] = _scenario(r, sid, entry, line, f"scenarios.{sid}")

    raw = doc["categories"]
    r.mapping(raw, doc.key_lines["categories"], "categories", optional=tuple(raw or ()))
    if not raw:
        r.fail(doc.key_lines["categories"], "categories", "no categories")
    categories, refs = {}, []  # refs: (category, "conflict" | "privacy", scenario id, line), checked at the end
    for cid, entry in raw.items():
        line, field = raw.key_lines[cid], f"categories.{cid}"
        r.identifier(cid, line, "categories")
        entry = r.mapping(entry, line, field, required=("name", "definition"),
                          optional=("absolute", "example_questions", "scenarios"))
        absolute = entry.get("absolute", False)
        if not isinstance(absolute, bool):
            r.fail(entry.key_lines["absolute"], f"{field}.absolute", "expected true or false")
        privacy = None
        own = r.mapping(entry["scenarios"] if "scenarios" in entry else _Map(), entry.key_lines.get("scenarios", line),
                        f"{field}.scenarios", optional=("conflict", "privacy"))
        for kind, listed in own.items():
            where = f"{field}.scenarios.{kind}"
            if listed is None:
                continue
            if not isinstance(listed, list):
                r.fail(own.key_lines[kind], where, "expected a list")
            ids = []
            for item, item_line in zip(listed, listed.item_lines):
                if isinstance(item, dict):  # a new scenario, written inline
                    sid = r.identifier(item.get("id"), item_line, f"{where}.id")
                    scenario = _scenario(r, sid, item, item_line, f"{where}.{sid}", extra_keys=("id",))
                    if sid in scenarios and scenarios[sid] != scenario:
                        r.fail(item_line, f"{where}.id", f"{sid} is already defined differently")
                    scenarios[sid] = scenario
                else:
                    sid = r.identifier(item, item_line, where)
                ids.append(sid)
                refs.append((cid, kind, sid, item_line))
            if kind == "privacy":
                privacy = tuple(ids)
        categories[cid] = Category(
            id=cid, name=r.text(entry, "name", f"{field}.name"), definition=r.text(entry, "definition",
                                                                                     f"{field}.definition"),
            absolute=absolute, example_questions=r.strings(entry, "example_questions", f"{field}.example_questions"),
            privacy_scenarios=privacy)

    for sid, entry in raw_scenarios.items():
        needs = entry.get("needs")
        for label, line in zip(needs or (), getattr(needs, "item_lines", ())):
            if label not in categories:
                r.fail(line, f"scenarios.{sid}.needs", f"unknown category {label}")
    for cid, kind, sid, line in refs:
        if sid not in scenarios:
            r.fail(line, f"categories.{cid}.scenarios.{kind}", f"unknown scenario {sid}")
        if kind == "conflict" and cid not in scenarios[sid].needs:  # the category's own list adds it to the needs
            s = scenarios[sid]
            scenarios[sid] = Scenario(**{**s.__dict__, "needs": (*s.needs, cid)})
    for cid, kind, sid, line in refs:
        if kind == "privacy" and cid in scenarios[sid].needs:
            r.fail(line, f"categories.{cid}.scenarios.privacy",
                   f"{sid} needs {cid}, so it is a conflict scenario for it, not a privacy one")
    return CategorySet(source=str(path), categories=categories, scenarios=scenarios, templates=templates,
                       digest=hashlib.sha256(text.encode("utf-8")).hexdigest())


@lru_cache(maxsize=16)
def _cached(resolved: str, stamp: tuple) -> CategorySet:
    return parse(resolved)


def load_categories(path=None) -> CategorySet:
    """The category set of `path`, or of the default file (SPY's 67 categories and 24 scenarios)."""
    path = Path(path or DEFAULT_FILE)
    try:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)  # an edited file is read again
    except OSError:
        stamp = ()  # parse names the problem
    return _cached(str(real(path)), stamp)  # a loop: one line


def as_categories(value=None) -> CategorySet:
    """A CategorySet from what callers pass: None (the default file), a path, or a CategorySet."""
    return value if isinstance(value, CategorySet) else load_categories(value)


def default_categories() -> CategorySet:
    return load_categories(None)


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", default=str(DEFAULT_FILE))
    args = parser.parse_args(argv)
    try:
        cats = parse(args.file)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    absolute = sorted(cats.absolute_labels())
    print(f"{args.file}: {len(cats.categories)} categories ({len(absolute)} absolute: {', '.join(absolute) or 'none'}),"
          f" {len(cats.scenarios)} scenarios")


if __name__ == "__main__":
    run_command(main)
