"""Our MMMU / OCRBench / MME numbers next to the published Qwen2-VL-7B-Instruct ones (JSON, markdown, PNG)."""

from __future__ import annotations

from pathlib import Path

from eval.general.composite import general_score
from eval.general.results import NORMALIZER
from store.runs import write_json, write_text

# Qwen2-VL-7B-Instruct. "official": the QwenLM/Qwen2-VL README image-benchmark table. The reproductions:
# VLMEvalKit MMMU from QwenLM/Qwen3-VL#628, VLMEvalKit MME (perception 1677.37 + reasoning 606.07) from
# QwenLM/Qwen3-VL#498, lmms-eval MMMU from #628, SPY paper Table 7 (original model, a VLMEvalKit run).
PUBLISHED = {
    "official": {"mmmu": 54.1, "ocrbench": 845.0, "mme": 2326.8},
    "vlmevalkit": {"mmmu": 50.56, "mme": 2283.44, "mme_perception": 1677.37, "mme_cognition": 606.07},
    "lmms-eval": {"mmmu": 51.22},
    "spy_paper": {"mmmu": 50.44},
}
PUBLISHED_GENERAL = general_score(**PUBLISHED["official"])  # 73.90
COLUMNS = ["metric", "ours", "Qwen2-VL README", "VLMEvalKit repro", "lmms-eval repro", "SPY paper", "ours - README"]


def report_rows(general: dict) -> list[dict]:
    """One row per number; `general` maps benchmark -> a `results.read_result` dict."""
    values = {b: general[b]["value"] for b in general}
    mme_parts = general["mme"].get("parts", {})
    rows = []

    def row(metric, ours, key):
        official = PUBLISHED["official"].get(key)
        rows.append({
            "metric": metric, "ours": ours, "Qwen2-VL README": official,
            "VLMEvalKit repro": PUBLISHED["vlmevalkit"].get(key), "lmms-eval repro": PUBLISHED["lmms-eval"].get(key),
            "SPY paper": PUBLISHED["spy_paper"].get(key),
            "ours - README": None if ours is None or official is None else ours - official,
        })

    row("MMMU val accuracy (%)", values["mmmu"], "mmmu")
    row("OCRBench (of 1000)", values["ocrbench"], "ocrbench")
    row("MME perception (of 2000)", mme_parts.get("perception"), "mme_perception")
    row("MME cognition (of 800)", mme_parts.get("cognition"), "mme_cognition")
    row("MME total (of 2800)", values["mme"], "mme")
    ours_general = general_score(values["mmmu"], values["ocrbench"], values["mme"])
    rows.append({"metric": "general score (0-100)", "ours": ours_general, "Qwen2-VL README": PUBLISHED_GENERAL,
                 "ours - README": ours_general - PUBLISHED_GENERAL})
    return rows


def write_report(general: dict, out_dir, label: str = "ours") -> dict:
    """general_report.json / .md / .png in `out_dir`; returns the JSON object."""
    from eval.report import bar_chart, markdown_table

    out_dir = Path(out_dir)
    rows = report_rows(general)
    report = {
        "label": label, "rows": rows,
        "inputs": {b: {k: v for k, v in r.items() if k != "parts"} for b, r in general.items()},
        "published": PUBLISHED,
    }
    table = markdown_table(rows, COLUMNS)
    sources = "\n".join(f"- {b}: `{r['path']}` ({r['format']})" for b, r in general.items())
    markdown = (f"# General capability: {label} vs Qwen2-VL-7B-Instruct\n\n{table}\n"
                "README = QwenLM/Qwen2-VL README; repro = published reproductions with VLMEvalKit / lmms-eval "
                "(QwenLM/Qwen3-VL#628, #498); expect about +-1 point of run-to-run and environment noise.\n\n"
                f"Inputs:\n{sources}\n")
    write_text(out_dir / "general_report.md", markdown)
    write_json(out_dir / "general_report.json", report)
    normalized = [general[b]["value"] / NORMALIZER[b] for b in ("mmmu", "ocrbench", "mme")]
    published = [PUBLISHED["official"][b] / NORMALIZER[b] for b in ("mmmu", "ocrbench", "mme")]
    bar_chart(out_dir / "general_report.png", ["MMMU val", "OCRBench / 10", "MME / 28", "general"],
              {label: [*normalized, rows[-1]["ours"]], "Qwen2-VL-7B-Instruct (README)": [*published, PUBLISHED_GENERAL]},
              title="General capability (0-100 terms of the SPY general score)", ylabel="score")
    print(table, end="")
    return report
