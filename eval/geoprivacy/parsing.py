"""Answer parsing for the MCQ setting, following the authors' rules (spec §6).

The rules are kept as they are, quirks included, so that our runs are scored the way the released files were:
an unrecognised answer after `Qi:` is skipped and later answers shift one slot left, and values such as `Yes`,
`Y` or `B: B` survive and are scored as wrong.
"""

from __future__ import annotations

import re

MISSING = "N/A"


def _single(answer: str) -> str | None:
    if len(answer) == 1:
        return answer
    if answer.lower() == "yes":
        return "A"
    if answer.lower() == "no":
        return "B"
    return None


def parse_mcq(text: str) -> dict[str, str]:
    """A 7-question MCQ response -> {"Q1": ..., "Q7": ...} (spec §6.2)."""
    text = (text or "").replace("*", "")
    answers: list[str] = []
    for i in range(1, 8):
        marker = f"Q{i}:"
        if marker not in text:
            # No `Qi:` tag: the response is taken as one label per line (what API prompts ask for).
            answers = [line.strip() for line in text.split("\n")]
            break
        after = text.split(marker, 1)[1].split(f"Q{i + 1}", 1)[0].strip()
        single = _single(after)
        if single is not None:
            answers.append(single)
    if len(answers) < 7 and "Answer:" in text:
        answers = text.rsplit("Answer:", 1)[1].split()
    answers = (answers + [MISSING] * 7)[:7]
    return {f"Q{i}": answer for i, answer in enumerate(answers, 1)}


def parse_q7_only(text: str) -> dict[str, str]:
    """A Q7-only MCQ response -> {"Q7": letter or "N/A"} (spec §6.3)."""
    text = text or ""
    if "Q7:" in text:
        line = text.split("Q7:", 1)[1].strip().split("\n", 1)[0].strip()
        single = _single(line)
        if single is not None:
            return {"Q7": single}
        match = re.search(r"[ABC]", line, flags=re.IGNORECASE)
        if match:
            return {"Q7": match.group(0).upper()}
    for line in text.split("\n"):
        if line.strip() in ("A", "B", "C"):
            return {"Q7": line.strip()}
    return {"Q7": MISSING}
