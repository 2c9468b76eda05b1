"""`eval compare`: a leaderboard of suite results with deltas against the first run, and warnings when the runs
were scored over different sample counts or settings (hand-made results.json files; no model)."""

import json
import sys
from pathlib import Path

import forked_python

ROOT = Path(__file__).resolve().parents[1]


def results(folder: Path, ics: float, n: int, judge="rule") -> Path:
    folder.mkdir(parents=True)
    rows = [{"benchmark": "SPY-Bench", "setting": "without distractors", "metric": "ICS", "key": "ics", "value": ics,
             "n": n},
            {"benchmark": "SpatialTrust", "setting": "one-pass", "metric": "overall", "key": "overall", "value": 30.0,
             "n": 8}]
    (folder / "results.json").write_text(json.dumps({"headline": rows, "settings": {"model": str(folder),
                                                                                   "judge": judge}}))
    return folder


def run(*args):
    return forked_python.run([sys.executable, "-m", "eval", "compare", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True)


def test_compare_deltas_and_warnings(tmp_path):
    base, same = results(tmp_path / "base", 40.0, 654), results(tmp_path / "nca_p", 71.5, 654)
    result = run(base, same, "--out", tmp_path / "board")
    assert result.returncode == 0 and "warning" not in result.stderr
    board = json.loads((tmp_path / "board" / "compare.json").read_text())
    assert board["rows"][0]["Δ nca_p"] == 31.5 and board["rows"][1]["Δ nca_p"] == 0.0
    assert "| SPY-Bench | without distractors | ICS | 40.00 | 71.50 | 31.50 |" in (tmp_path / "board" / "compare.md").read_text()
    assert (tmp_path / "board" / "compare.png").stat().st_size > 5_000

    small = results(tmp_path / "small", 80.0, 160, judge={"model": "gpt-4o"})
    result = run(base, small, "--names", "base", "short run", "--out", tmp_path / "board2")
    assert result.returncode == 0
    assert "SPY-Bench without distractors: different sample counts (base 654, short run 160)" in result.stderr
    assert "setting 'judge' differs" in result.stderr
    assert "## Warnings" in (tmp_path / "board2" / "compare.md").read_text()


def test_compare_refuses_a_folder_without_results(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run(results(tmp_path / "base", 1.0, 5), tmp_path / "empty", "--out", tmp_path / "board")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "results.json" in result.stderr
    assert not (tmp_path / "board").exists()
