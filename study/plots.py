"""The tuned study's two pictures: the learning curves (held-out ICS, HMS and general accuracy against the step) and
the privacy-ability frontier (held-out ICS against general accuracy, the goal's corner, the Pareto front).

May import: matplotlib (lazily); the study's methods and results.
"""

from __future__ import annotations

from pathlib import Path

from study.methods import NAMES
from study.results import CURVES, GOAL, METRICS, budget_names, budget_runs, references


def _colours(methods: list[str]) -> dict:
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    return {m: palette(i) for i, m in enumerate(methods)}


def plot_curves(report: dict, path: Path) -> None:
    """Held-out ICS, HMS and general accuracy against the step (0: the backbone, where every method starts), one
    line per method at its long budget's setting, band = 95% interval over seeds."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.4), layout="constrained")
    steps = report["curve_steps"]
    backbone = report["backbone"]["backbone"]
    colours = _colours(report["methods"])
    for ax, k in zip(fig.subplots(1, len(CURVES)), CURVES):
        start = backbone["general"] if k == "general" else backbone["without_distractors"][k]
        for m in report["methods"]:
            points = [(s, report["curves"][str(s)][m].get(k)) for s in steps]
            points = [(0, {"mean": start, "low": start, "high": start})] * (start is not None) + [
                (s, v) for s, v in points if v]
            if not points:
                continue
            x = [s for s, _ in points]
            ax.plot(x, [v["mean"] for _, v in points], marker="o", color=colours[m], label=NAMES[m])
            if all(v["low"] is not None for _, v in points):
                ax.fill_between(x, [v["low"] for _, v in points], [v["high"] for _, v in points], alpha=0.2,
                                color=colours[m])
        for step in report["budgets"].values():
            ax.axvline(step, color="grey", lw=0.8, ls=":")
        ax.set_ylim(-5, 105)
        ax.set_xlabel("alignment step (each method at its long budget's setting)")
        ax.set_title(f"held-out {METRICS[k]} (without distractors)")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=100)


def plot_frontier(report: dict, path: Path) -> None:
    """Held-out ICS against general-task accuracy: per method and budget the mean with its 95% intervals (1x hollow,
    the long budget filled) and each seed as a faint point, the backbone and self-moderation as references, the
    goal's corner shaded and the Pareto front dashed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 6.5), layout="constrained")
    ax = fig.subplots()
    budgets = budget_names(report)
    colours = _colours(report["methods"])
    long = budgets[-1]
    ax.fill_between([GOAL["general"], 105], GOAL["ics"], 105, color="tab:green", alpha=0.08,
                    label=f"goal at {long}: ICS >= {GOAL['ics']:g}, general >= {GOAL['general']:g}")
    for budget in budgets:
        marker, filled = ("s", True) if budget == long else ("o", False)
        for m in report["methods"]:
            s = report["summary"][budget][m]
            if "ics" not in s or "general" not in s:
                continue
            seeds = list(budget_runs(report["final"][m], budget, report["budgets"][budget]).values())
            ax.scatter([r["general"] for r in seeds], [r["ics"] for r in seeds], s=14, marker=marker,
                       color=colours[m], alpha=0.18, linewidths=0)
            x, y = s["general"], s["ics"]
            xerr = [[x["mean"] - x["low"]], [x["high"] - x["mean"]]] if x["low"] is not None else None
            yerr = [[y["mean"] - y["low"]], [y["high"] - y["mean"]]] if y["low"] is not None else None
            ax.errorbar(x["mean"], y["mean"], xerr=xerr, yerr=yerr, fmt=marker, ms=8, capsize=3, color=colours[m],
                        mfc=colours[m] if filled else "white", label=f"{NAMES[m]} {budget}")
    for (name, v), marker in zip(references(report).items(), ("*", "D")):
        ax.scatter([v["general"]], [v["ics"]], marker=marker, s=120 if marker == "*" else 50, color="black",
                   zorder=5, label=f"{name.replace('_', '-')} (reference)")
    front = sorted((r["general"], r["ics"]) for r in report["frontier"] if r.get("front"))
    if front:
        ax.plot(*zip(*front), ls="--", color="black", lw=1, label="frontier (Pareto)")
    ax.set_xlim(-5, 105)
    ax.set_ylim(-5, 105)
    ax.set_xlabel("held-out general-task accuracy (%)")
    ax.set_ylabel("held-out ICS, without distractors (%)")
    ax.set_title("privacy against general ability")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    fig.savefig(path, dpi=100)


