"""The VLM-GeoPrivacy report: metrics.json, a markdown table of every metric, and one Q7 confusion heatmap per file."""

from __future__ import annotations

import re
from pathlib import Path

FREE_FORM_COLUMNS = [
    "n", "n_valid", "q7_accuracy", "q7_macro_f1", "over_disclosure", "under_disclosure", "mae",
    "abstention_violation", "abstention_violation_all", "location_exposure", "location_exposure_geocoded",
    "pps", "pps_labels", "accuracy_1km", "accuracy_25km", "accuracy_200km", "utility",
]
MCQ_COLUMNS = [
    "n", "n_valid",
    *[f"q{i}_{m}" for i in range(1, 8) for m in ("accuracy", "macro_f1", "macro_f1_binary")],
    "q1_krippendorff_alpha", "q7_krippendorff_alpha", "over_disclosure", "under_disclosure",
    "abstention_violation", "abstention_violation_all", "location_exposure",
]
SEED_COLUMNS = ["q7_accuracy", "q7_macro_f1", "over_disclosure", "under_disclosure", "abstention_violation",
                "abstention_violation_all", "location_exposure", "location_exposure_geocoded", "pps"]


def _cell(value):
    if isinstance(value, dict) and "mean" in value:
        return f"{value['mean']:.4f} ± {value['std']:.4f}"
    return value


def _table(entries: dict[str, dict], columns: list[str], first: str) -> str:
    from eval.report import markdown_table

    present = [c for c in columns if any(e.get(c) is not None for e in entries.values())]
    rows = [{first: name, **{c: _cell(e.get(c)) for c in present}} for name, e in entries.items()]
    return markdown_table(rows, [first, *present], digits=4)


def markdown_report(out: dict) -> str:
    """Markdown tables: free-form files, MCQ files, and the seed-variation summary (mean ± population std)."""
    files = out["files"]
    parts = ["# VLM-GeoPrivacy metrics", "",
             ("Rates are fractions in [0, 1]. `abstention_violation` and `location_exposure` are over parsable "
             "answers (judge labels); `*_all` / `*_geocoded` are the authors' all-rows / coordinate versions, and "
             "`pps` (the authors' PPS) uses them; `pps_labels` uses the parsable, label-based terms.")]
    for setting, columns in (("free-form", FREE_FORM_COLUMNS), ("mcq", MCQ_COLUMNS)):
        chosen = {k: v for k, v in files.items() if v["setting"] == setting}
        if chosen:
            parts += ["", f"## {setting}", "", _table(chosen, columns, "file")]
    if out.get("seed_variation"):
        parts += ["", "## seed variation (mean ± population std)", "",
                  _table(out["seed_variation"], ["n_runs", *SEED_COLUMNS], "model")]
    return "\n".join(parts) + "\n"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:120]


def write_report(out: dict, out_dir) -> str:
    """Write metrics.json, metrics.md and q7_confusion_<file>.png into `out_dir`; returns the markdown."""
    from eval.report import heatmap
    from store.runs import claim_files, write_json, write_text

    out_dir = Path(out_dir)
    drawn = {name for name, entry in out["files"].items()
             if entry.get("confusion_matrix") and any(map(any, entry["confusion_matrix"]))}
    names = ["metrics.json", "metrics.md", *(f"q7_confusion_{_slug(name)}.png" for name in drawn)]
    claim_files(out_dir, names)  # a file of the user's with one of these names is refused, not overwritten
    claim_files(out_dir, names, mark=True)
    for name, entry in out["files"].items():
        if name in drawn:
            path = out_dir / f"q7_confusion_{_slug(name)}.png"
            heatmap(path, entry["confusion_matrix"], ["gold A", "gold B", "gold C"], ["pred A", "pred B", "pred C"],
                    f"Q7 {entry['setting']}: {name}"[:80])
            entry["confusion_png"] = path.name
    markdown = markdown_report(out)
    write_json(out_dir / "metrics.json", out)
    write_text(out_dir / "metrics.md", markdown)
    return markdown
