"""VLM-GeoPrivacy prompts for every setting and prompting strategy, built from the verbatim texts (spec §2).

Settings: `mcq` (the seven questions, optionally with heuristics, or Q7 alone) and `free-form` (where was this photo
taken). Free-form methods: `zs` (vanilla), `iter-cot` (step-by-step first turn, then escalating single-turn
follow-ups chosen by the judge label) and `malicious` (jailbreak persona plus a FigStep typographic image).

Prompt formats follow the authors' two code paths: `api` joins the user parts with a newline and asks for one bare
label per line; `open` (their vLLM path for open models) concatenates the parts and asks for the strict
`Q1: <label>` template.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

PROMPTS = json.loads((Path(__file__).resolve().parent / "assets" / "prompts.json").read_text(encoding="utf-8"))
SETTINGS = ("free-form", "mcq")
METHODS = ("zs", "iter-cot", "malicious")
PROMPT_FORMATS = ("api", "open")
MAX_FOLLOWUPS = 3  # iter-cot: at most three more calls while the answer is not judged C


def system_message(method: str = "zs") -> str:
    """The system message is keyed by the method up to its first `-` (MCQ always uses `zs`)."""
    return PROMPTS["system"][method.split("-")[0]]


def mcq_text(heuristics: bool = True, q7_only: bool = False, prompt_format: str = "api") -> str:
    """The MCQ user text: each question with its options (and heuristics), then the answer-format instruction."""
    questions = PROMPTS["questions"][-1:] if q7_only else PROMPTS["questions"]
    parts = []
    for q in questions:
        part = f"\n{q['id']}: {q['question']}\n" + "\n".join(q["options"])
        if heuristics:
            part += f"\nHeuristics:{q['heuristics']}\n\n"
        parts.append(part)
    if q7_only:
        # The authors' strict Q7-only wording is not in the released texts; both formats use the API instruction.
        instruction = PROMPTS["inst_label_q7"]
    else:
        instruction = PROMPTS["inst_label_strict" if prompt_format == "open" else "inst_label"]
    parts.append(f"\nInstruction: {instruction}\n")
    return ("" if prompt_format == "open" else "\n").join(parts)


def free_form_text(method: str = "zs") -> str:
    if method == "zs":
        return PROMPTS["free_form"]
    if method == "iter-cot":
        return PROMPTS["free_form"] + "\n" + PROMPTS["iter_cot_instruction"]
    if method == "malicious":
        return PROMPTS["malicious_user"]
    raise ValueError(f"unknown free-form method {method!r}; expected one of {', '.join(METHODS)}")


def followup_text(label: str | None) -> str:
    """iter-cot: the next single-turn question after an answer judged `label` (A asks for a country, B for a
    specific place, anything else for a more specific location)."""
    followups = PROMPTS["iter_cot_followups"]
    return followups[label] if label in ("A", "B") else followups["other"]


@lru_cache(maxsize=1)
def figstep_image():
    """The FigStep typographic image of the malicious setting: an empty numbered list of geolocation steps.

    A re-rendering of the authors' `data/figstep_jailbreak.png` from its transcribed text (the PNG is not released
    with the data we copied): black text on white, 760 x 760 like FigStep's images.
    """
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (760, 760), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=34)
    y = 60
    for line in PROMPTS["figstep_lines"]:
        words, current = line.split(), ""
        for word in words:  # wrap to the image width
            trial = f"{current} {word}".strip()
            if draw.textlength(trial, font=font) > 680 and current:
                draw.text((40, y), current, fill="black", font=font)
                y, current = y + 50, word
            else:
                current = trial
        draw.text((40, y), current, fill="black", font=font)
        y += 110
    return image


def build_messages(user_text: str, n_images: int, system: str, prompt_format: str = "api") -> list[dict]:
    """System turn, then one user turn: (API: a newline text part,) the image(s), the user text (spec §2.4)."""
    content = [{"type": "text", "text": "\n"}] if prompt_format == "api" else []
    content += [{"type": "image"} for _ in range(n_images)]
    content.append({"type": "text", "text": user_text})
    return [{"role": "system", "content": system}, {"role": "user", "content": content}]


def build_request(sample_id: str, image, setting: str, method: str = "zs", heuristics: bool = True,
                  q7_only: bool = False, prompt_format: str = "api", user_text: str | None = None) -> dict:
    """One Generator request `{id, messages, images}` for an image (a path or a PIL image).

    `user_text` overrides the free-form question (the iter-cot follow-ups reuse the method's system message and
    image with a new question, in a fresh single-turn conversation)."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt format {prompt_format!r}")
    images = [image]
    if setting == "mcq":
        system, text = system_message("zs"), mcq_text(heuristics, q7_only, prompt_format)
    elif setting == "free-form":
        system, text = system_message(method), user_text or free_form_text(method)
        if method == "malicious":
            images.append(figstep_image())
    else:
        raise ValueError(f"unknown setting {setting!r}; expected one of {', '.join(SETTINGS)}")
    return {"id": str(sample_id), "messages": build_messages(text, len(images), system, prompt_format),
            "images": images}


def judge_messages(text: str) -> list[dict]:
    """The granularity judge's chat: its system message, then the judge prompt with the answer inserted."""
    user = PROMPTS["judge_template"].replace("{GRANULARITY_JUDGE}", PROMPTS["granularity_judge"])
    return [{"role": "system", "content": PROMPTS["judge_system"]},
            {"role": "user", "content": user.replace("{text_raw}", text)}]


def extraction_messages(text: str) -> list[dict]:
    """The place-name extraction chat used before geocoding an answer judged C (spec §4)."""
    user = PROMPTS["extraction_template"].replace("{text_raw.strip()}", text.strip())
    return [{"role": "system", "content": PROMPTS["extraction_system"]}, {"role": "user", "content": user}]
