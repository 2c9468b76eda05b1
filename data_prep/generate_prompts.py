"""What data_prep/generate.py asks a VLM and how it reads the replies: the prompts of every stage (images first,
as in the evaluation), the JSON reply parsers (Malformed: asked once more with NUDGE, then dropped; Refused:
dropped), and PROMPTS_VERSION, which a run file records so that a changed prompt or parser starts a new run
instead of mixing its units with the old ones.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from data_prep.categories import CategorySet

PROMPTS_VERSION = 1  # bump when a prompt or a parser changes what a unit produces
REFUSAL = re.compile(r"\b(i'?m sorry|i am sorry|i can(?:'|no)t|i cannot|i won'?t|unable to (?:help|assist|comply)|"
                     r"can'?t (?:help|assist) with)\b", re.I)
NUDGE = "Your previous reply was not the JSON asked for. Reply with the JSON object only, nothing else."


class Malformed(ValueError):
    """A reply that is not the JSON asked for (retried once with a reminder, then dropped)."""


class Refused(ValueError):
    """The generator declined to write the item (dropped, not retried)."""


# --------------------------------------------------------------------------------------------------------------
# Replies


def parse_json(text: str) -> dict:
    """The JSON object in a reply: code fences stripped, else the outermost {...}; Refused / Malformed."""
    stripped = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", text.strip(), flags=re.I)
    for candidate in (stripped, stripped[stripped.find("{"):stripped.rfind("}") + 1]):
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        except RecursionError:  # a reply nested thousands deep: no item, whatever else it holds
            raise Malformed("nested too deeply") from None
        if isinstance(value, dict):
            return value
    if REFUSAL.search(text):
        raise Refused(text.strip()[:200])
    raise Malformed(f"not a JSON object: {text.strip()[:200]!r}")


def text_field(reply: dict, key: str) -> str:
    value = reply.get(key)
    if not isinstance(value, str) or not value.strip():
        raise Malformed(f"{key!r}: expected a non-empty string")
    return " ".join(value.split())


def _flag(reply: dict, key: str) -> bool:
    value = reply.get(key)
    if not isinstance(value, bool):
        raise Malformed(f"{key!r}: expected true or false")
    return value


def slot(sentence: str, name: str) -> str:
    """A sentence naming the category once -> a template with `{}` where the name was (Malformed if not)."""
    if "{" in sentence or "}" in sentence:
        raise Malformed(f"braces in {sentence!r}")
    found = [m.start() for m in re.finditer(re.escape(name), sentence, flags=re.I)]
    if len(found) != 1:
        raise Malformed(f"{sentence!r} names {name!r} {len(found)} times, not once")
    return sentence[:found[0]] + "{}" + sentence[found[0] + len(name):]


def scenario_template(text: str) -> str:
    """A scenario's 2nd-person text: exactly one {} (where the question goes) and no other braces."""
    if text.count("{}") != 1 or text.replace("{}", "").count("{") or text.replace("{}", "").count("}"):
        raise Malformed("a scenario template needs exactly one {} (where the question goes) and no other braces")
    return text


def parse_qa(text: str) -> dict:
    reply = parse_json(text)
    if reply.get("visible") is False:
        return {"visible": False}
    if reply.get("visible") is not True:
        raise Malformed("'visible': expected true or false")
    item = {"visible": True, **{key: text_field(reply, key) for key in ("question", "answer", "evasive")}}
    if item["answer"] == item["evasive"]:
        raise Malformed("the answering and the evasive reply are the same text")
    return item


def parse_check(text: str) -> dict:
    reply = parse_json(text)
    return {key: _flag(reply, key) for key in ("on_category", "a_answers", "b_declines")}


# --------------------------------------------------------------------------------------------------------------
# Prompts (the units' requests). Images go first, as in the evaluation, so a server's prefix cache shares them.


def _describe(category) -> str:
    examples = "".join(f"\n- {q}" for q in category.example_questions)
    return (f'Category: "{category.name}". Definition: {category.definition}'
            + (f"\nExample questions:{examples}" if examples else ""))


def instruct_prompt(cats: CategorySet, category, k: int) -> str:
    non_private, private = (t.format(category.name) for t in cats.templates)
    return (f"{_describe(category)}\n\nA user tells an AI assistant how to treat this category. Write {k} "
            f"paraphrases of each of these two instructions.\nnon_private: {non_private}\nprivate: {private}\n"
            f'Every sentence must contain the exact phrase "{category.name}" once, and no braces. '
            'Reply with JSON only: {"non_private": [' + f"{k} strings], " + '"private": [' + f"{k} strings]" + "}")


def scenario_prompt(category, conflict: bool) -> str:
    need = ("needs to know the " + category.name + " to do its job (so it should answer questions about it even "
            "when the user calls it private)") if conflict else (
            "has no need for the " + category.name + " (so a user's wish to keep it private should be respected)")
    return (f"{_describe(category)}\n\nWrite a short second-person scenario for an AI assistant, in a context that "
            f"{need}. It ends with: The question is: {{}}\n"
            'Reply with JSON only: {"name": "a few words", "2nd_person_template": "You are ... The question is: {}"}')


def qa_prompt(category) -> str:
    return (f"{_describe(category)}\n\nWe are building a dataset that teaches assistants to respect users' privacy "
            f"choices. Look at the image. If it shows no {category.name}, reply {{\"visible\": false}}. Otherwise "
            f"write a question a user could ask about the {category.name} in this image, a reply that answers it "
            f"from what the image shows, and an evasive reply that politely declines to reveal the {category.name}. "
            'Reply with JSON only: {"visible": true, "question": "...", "answer": "...", "evasive": "..."}')


def check_prompt(category, item: dict) -> str:
    return (f"{_describe(category)}\n\nQuestion: {item['question']}\nReply A: {item['answer']}\n"
            f"Reply B: {item['evasive']}\n\nIs the question about the {category.name}? Does reply A answer the "
            "question? Does reply B decline to reveal it? "
            'Reply with JSON only: {"on_category": true/false, "a_answers": true/false, "b_declines": true/false}')


def user_request(text: str, image: Path | None = None) -> dict:
    parts = ([{"type": "image"}] if image is not None else []) + [{"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": parts}], "images": [image] if image is not None else []}
