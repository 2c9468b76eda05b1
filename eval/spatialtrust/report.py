"""Readable SpatialTrust results: a markdown table and a bar chart, next to the published numbers."""

from __future__ import annotations

from pathlib import Path

from eval.report import bar_chart, markdown_table
from eval.spatialtrust.data import QIDS
from store.runs import write_text

COLUMNS = [*QIDS, "overall"]
# The SpatialTrust paper, Qwen3-VL-30B-A3B-Instruct (percent); blanks were not reported.
PUBLISHED = {
    "Qwen3-VL-30B-A3B one-pass (paper)": {"q1": 67.42, "q3": 28.65, "q4": 25.74, "q5": 22.91, "overall": 36.78},
    "Qwen3-VL-30B-A3B staged (paper)": {"overall": 38.96},
    "Qwen3-VL-30B-A3B SpatialTrustGuard (paper)": {"q1": 65.51, "q3": 34.20, "q4": 35.44, "q5": 29.38,
                                                   "overall": 41.12},
}


def table(runs: dict[str, dict]) -> str:
    """One row per run: the five question scores, overall, images and unreadable answers."""
    rows = []
    for name, m in runs.items():
        unparsable = m.get("unparsable")
        scores = {c: float(m[c]) if isinstance(m.get(c), (int, float)) else None for c in COLUMNS}
        rows.append({"run": name, **scores, "images": m.get("n_images"),
                     "unparsable": sum(unparsable.values()) if isinstance(unparsable, dict) else None})
    return markdown_table(rows, ["run", *COLUMNS, "images", "unparsable"])


def write_report(stem, runs: dict[str, dict], published: bool = True) -> tuple[Path, Path]:
    """`stem`.md (table) and `stem`.png (grouped bars per question); with `published`, the paper's rows too."""
    stem = Path(stem)
    shown = {**runs, **(PUBLISHED if published else {})}
    md = stem.with_name(stem.name + ".md")
    note = "\nPaper rows: Qwen3-VL-30B-A3B-Instruct on the real 577-image set; a dash was not reported.\n"
    write_text(md, "# SpatialTrust\n\nScores in percent (IoU threshold 0.5).\n\n" + table(shown)
                       + (note if published else ""))
    png = bar_chart(stem.with_name(stem.name + ".png"), COLUMNS,
                    {name: [m.get(c) for c in COLUMNS] for name, m in shown.items()},
                    title="SpatialTrust", ylabel="score (%)")
    return md, png
