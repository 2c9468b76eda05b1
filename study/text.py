"""How the study's numbers read on its page: a value, a mean with its interval, a p-value, a sweep point.

May import: nothing of the project.
"""

from __future__ import annotations


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and not float(text) else text  # no "-0.0"


def ci(summary: dict | None, digits: int = 1) -> str:
    if not summary:
        return "n/a"
    if summary["low"] is None:
        return fmt(summary["mean"], digits)
    return f"{fmt(summary['mean'], digits)} [{fmt(summary['low'], digits)}, {fmt(summary['high'], digits)}]"


def p_value(p: float | None) -> str:
    return "n/a" if p is None else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def point_text(point: dict) -> str:
    return f"lr {point['learning_rate']:.3g}" + (f", beta {point['beta']:.3g}" if "beta" in point else "")


