"""Readable results: markdown tables and PNG plots (matplotlib's Agg canvas; no display, no global state)."""

from __future__ import annotations

import math
from pathlib import Path


def format_cell(value, digits: int = 2) -> str:
    """Floats with `digits` decimals, None/NaN as an en dash, everything else as str."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: list[dict], columns: list[str], digits: int = 2) -> str:
    """A GitHub markdown table: one row per dict, one column per key (a missing key is an en dash)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(row.get(c), digits) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(figure, path) -> Path:
    from store.processes import is_main_process

    path = Path(path)
    if is_main_process():  # every process of a data-parallel run reaches here; one writes
        from store import writer

        with writer.atomic(path) as f:  # the one writer: no link followed, a temporary of its own
            figure.savefig(f, dpi=120, format=path.suffix.lstrip(".") or "png")
    return path


def _number(value) -> float:
    return float("nan") if value is None else float(value)


def bar_chart(path, categories: list[str], series: dict[str, list[float]], title: str, ylabel: str) -> Path:
    """Grouped bars: one group per category, one bar per series (None draws no bar). Writes a PNG."""
    import numpy as np

    n = max(1, len(series))
    width = 0.8 / n
    x = np.arange(len(categories))
    figure = _figure(max(6.0, 0.35 * len(categories) * max(1, n / 2) + 2), 4.5)
    ax = figure.add_subplot()
    for k, (name, values) in enumerate(series.items()):
        ax.bar(x + (k - (n - 1) / 2) * width, [_number(v) for v in values], width, label=name)
    ax.set_xticks(x, categories, rotation=90 if len(categories) > 8 else 0, fontsize=8 if len(categories) > 20 else 10)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return _save(figure, path)


def heatmap(path, matrix, row_labels: list[str], col_labels: list[str], title: str) -> Path:
    """A heatmap with its values written in the cells (None/NaN cells left blank). Writes a PNG."""
    import numpy as np

    data = np.array([[_number(v) for v in row] for row in matrix], dtype=float).reshape(len(row_labels), len(col_labels))
    figure = _figure(max(4.0, 0.9 * len(col_labels) + 3), max(3.0, 0.3 * len(row_labels) + 1.5))
    ax = figure.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(data), aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(col_labels)), col_labels, rotation=45, ha="right")
    ax.set_yticks(range(len(row_labels)), row_labels)
    finite = data[np.isfinite(data)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    if data.size <= 400:
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                if np.isfinite(data[i, j]):
                    ax.text(j, i, f"{data[i, j]:.3g}", ha="center", va="center", fontsize=7,
                            color="black" if data[i, j] > middle else "white")
    figure.colorbar(image, ax=ax)
    ax.set_title(title)
    return _save(figure, path)
