"""Markdown tables and PNG plots."""

from PIL import Image

from eval.report import bar_chart, format_cell, heatmap, markdown_table


def test_markdown_table():
    table = markdown_table([{"model": "a|b", "acc": 12.345, "n": 3}, {"model": "c", "acc": None}], ["model", "acc", "n"])
    assert table == "| model | acc | n |\n|---|---|---|\n| a\\|b | 12.35 | 3 |\n| c | – | – |\n"
    assert format_cell(float("nan")) == "–" and format_cell(1.0, digits=1) == "1.0"


def test_plots_are_png_files(tmp_path):
    bars = bar_chart(tmp_path / "plots" / "bars.png", [f"a{i}_x" for i in range(30)],
                     {"base": [float(i) for i in range(30)], "tuned": [None] + [50.0] * 29}, "per label", "%")
    heat = heatmap(tmp_path / "heat.png", [[1.0, None], [3.0, 4.0]], ["r1", "r2"], ["c1", "c2"], "heat")
    for path in (bars, heat):
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] > 300
