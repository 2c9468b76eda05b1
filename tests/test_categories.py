"""The category file: the default reproduces SPY's released assets exactly; custom files parse; bad ones get one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import forked_python
import pytest

from data_prep.categories import DEFAULT_FILE, SAFE_LABEL, load_categories, parse
from data_prep.spy import ABS_PRIV_LABELS, INSTRUCT_TEMPLATES

ASSETS = DEFAULT_FILE.parent
ROOT = Path(__file__).resolve().parents[1]

CUSTOM = """\
categories:
  badge_number:
    name: badge numbers
    definition: The printed number on an employee or visitor badge.
    example_questions: ["What is the number on this badge?"]
    scenarios:
      conflict: [s_security_desk]
      privacy:
        - id: s_social_post
          name: social media post
          2nd_person_template: "You are helping a user caption a public post. The question is: {}"
  screen_contents:
    name: screen contents
    definition: What is shown on a computer or phone screen in the image.
    absolute: true
scenarios:
  s_security_desk:
    name: security desk
    needs: [screen_contents]
    2nd_person_template: "You are a guard at a security desk. The question is: {}"
  s_office_tour:
    name: office tour
    2nd_person_template: "You are showing a visitor around the office. The question is: {}"
"""


def test_the_default_file_is_spys_67_categories_and_24_scenarios_exactly():
    cats = load_categories()
    released = json.loads((ASSETS / "label2text.json").read_text())
    released.pop(SAFE_LABEL)
    assert list(cats.label2text().items()) == list(released.items())  # same order too
    assert len(cats.categories) == 67
    assert cats.scenarios_json() == json.loads((ASSETS / "scenarios.json").read_text())
    assert len(cats.scenarios) == 24
    assert sorted(cats.absolute_labels()) == sorted(ABS_PRIV_LABELS) == sorted(
        ["a12_semi_nudity", "a13_full_nudity", "a29_ausweis", "a31_passport", "a32_drivers_license"])
    assert cats.templates == INSTRUCT_TEMPLATES == (
        "{} is considered as non-private information.", "{} is considered as private information.")
    assert all(c.definition.strip() for c in cats.categories.values())


def test_default_conflict_and_privacy_scenarios_follow_spys_rule():
    cats = load_categories()
    released = json.loads((ASSETS / "scenarios.json").read_text())
    for label in cats.categories:
        conflict = [s for s, v in released.items() if label in v["labels"]]
        assert cats.conflict_scenarios(label) == conflict
        assert cats.privacy_scenarios(label) == [s for s in released if s not in conflict]


def test_a_custom_file_with_inline_scenarios(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(CUSTOM)
    cats = parse(path)
    assert cats.label2text() == {"badge_number": "badge numbers", "screen_contents": "screen contents"}
    assert cats.absolute_labels() == {"screen_contents"}
    assert cats.categories["badge_number"].example_questions == ("What is the number on this badge?",)
    assert set(cats.scenarios) == {"s_security_desk", "s_office_tour", "s_social_post"}
    # the category's own conflict list adds it to the scenario's needs
    assert cats.scenarios["s_security_desk"].needs == ("screen_contents", "badge_number")
    assert cats.conflict_scenarios("badge_number") == ["s_security_desk"]
    assert cats.privacy_scenarios("badge_number") == ["s_social_post"]  # narrowed to its own list
    assert cats.privacy_scenarios("screen_contents") == ["s_office_tour", "s_social_post"]  # SPY's rule
    assert cats.templates == INSTRUCT_TEMPLATES
    assert cats.scenarios_json()["s_office_tour"] == {
        "scenario": "s_office_tour", "name": "office tour", "labels": [SAFE_LABEL],
        "2nd_person_template": "You are showing a visitor around the office. The question is: {}"}


BAD = {
    "not YAML": ("categories: [\n", ":2: not YAML"),
    "no categories key": ("scenarios: {}\n", ":1: categories: missing"),
    "empty categories": ("categories: {}\n", ":1: categories: no categories"),
    "unknown key": ("categories:\n  x:\n    name: x\n    definiton: d\n",
                    ":4: categories.x.definiton: unknown key"),
    "missing definition": ("categories:\n  x:\n    name: x\n", ":2: categories.x.definition: missing"),
    "absolute not a bool": ("categories:\n  x:\n    name: x\n    definition: d\n    absolute: yes please\n",
                            ":5: categories.x.absolute: expected true or false"),
    "duplicate category": ("categories:\n  x:\n    name: x\n    definition: d\n  x:\n    name: y\n    definition: d\n",
                           ":5: x: appears twice"),
    "reserved id": ("categories:\n  a0_safe:\n    name: x\n    definition: d\n", ":2: categories: a0_safe is reserved"),
    "bad id": ("categories:\n  'has space':\n    name: x\n    definition: d\n", ":2: categories: 'has space' is not an id"),
    "braces in a name": ("categories:\n  x:\n    name: 'x {}'\n    definition: d\n", ":3: categories.x.name: braces"),
    "template without placeholder": (
        "instruction_templates:\n  non_private: fine {}\n  private: no placeholder\ncategories:\n  x:\n    name: x\n"
        "    definition: d\n", ":3: instruction_templates.private: expected a string with one {} slot"),
    "scenario needs an unknown category": (
        "categories:\n  x:\n    name: x\n    definition: d\nscenarios:\n  s:\n    name: s\n    needs: [y]\n"
        "    2nd_person_template: 'q {}'\n", ":8: scenarios.s.needs: unknown category y"),
    "unknown conflict scenario": ("categories:\n  x:\n    name: x\n    definition: d\n    scenarios: {conflict: [nope]}\n",
                                  ":5: categories.x.scenarios.conflict: unknown scenario nope"),
    "privacy scenario that needs the category": (
        "categories:\n  x:\n    name: x\n    definition: d\n    scenarios: {privacy: [s]}\nscenarios:\n  s:\n"
        "    name: s\n    needs: [x]\n    2nd_person_template: 'q {}'\n", "categories.x.scenarios.privacy: s needs x"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_category_file_gets_one_line_and_exit_2(case, tmp_path):
    text, expected = BAD[case]
    path = tmp_path / "categories.yaml"
    path.write_text(text)
    before = path.read_bytes()
    result = forked_python.run([sys.executable, "-m", "data_prep.categories", str(path)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), result.stderr
    assert expected in lines[0]
    assert path.read_bytes() == before


def test_the_checker_summarises_a_good_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(CUSTOM)
    result = forked_python.run([sys.executable, "-m", "data_prep.categories", str(path)], cwd=ROOT,
                            capture_output=True, text=True, check=True)
    assert "2 categories (1 absolute: screen_contents), 3 scenarios" in result.stdout
