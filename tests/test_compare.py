"""`eval compare`: a leaderboard of suite results with deltas against the first run, and warnings when the runs
were scored over different sample counts or settings (hand-made results.json files; no model)."""

import json
import shutil
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


def test_a_null_setting_is_the_same_as_an_absent_one(tmp_path):
    """`"limit": null` in one run's settings and no `limit` in the other's: the same setting, no warning; a limit
    that is set still warns."""
    runs = {}
    for name, spy in (("absent", {"settings": ["without_distractors"]}),
                      ("null", {"settings": ["without_distractors"], "limit": None}),
                      ("forty", {"settings": ["without_distractors"], "limit": 40})):
        folder = results(tmp_path / name, 50.0, 654)
        data = json.loads((folder / "results.json").read_text())
        data["settings"] = {"model": name, "backend_options": {"batch_size": 8, "device": None},
                            "sections": {"spy": spy}}
        (folder / "results.json").write_text(json.dumps(data))
        runs[name] = folder
    result = run(runs["absent"], runs["null"], "--out", tmp_path / "board")
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr
    result = run(runs["absent"], runs["forty"], "--out", tmp_path / "board2")
    assert result.returncode == 0 and "forty: setting 'sections' differs" in result.stderr


def demo_like_suites(synthetic_dir, root: Path) -> tuple[Path, Path]:
    """Two suite folders laid out as the demo's: root/suite/<stage>, their SPY-Bench images and SpatialTrust data
    in root/synthetic-spy-tune and root/spatialtrust-synthetic, outside each suite folder (results.json records
    them as ../../...)."""
    from data_prep.spy_bench import build_samples
    from eval.spatialtrust.data import build_synthetic
    from store.runs import read_jsonl, write_jsonl

    shutil.copytree(synthetic_dir, root / "synthetic-spy-tune")
    st_data = build_synthetic(root / "spatialtrust-synthetic", n_images=2, width=64, height=48)
    samples = build_samples(root / "synthetic-spy-tune" / "questions.json", images_dir=root / "synthetic-spy-tune")
    folders = []
    for stage, verdict in (("base", "respond"), ("nca_p", "reject")):
        folder = root / "suite" / stage
        write_jsonl(folder / "spy" / "without_distractors" / "judged.jsonl",
                    [{**s, "response": "r", "eval_resp": verdict, "judge": "rule"} for s in samples[:6]])
        write_jsonl(folder / "spatialtrust" / "one-pass" / "predictions.jsonl",
                    [{"image_id": r["image_id"]} for r in read_jsonl(st_data)])
        rows = [{"benchmark": "SPY-Bench", "setting": "without distractors", "metric": "ICS", "key": "ics",
                 "value": 0.0, "n": 6}]
        (folder / "results.json").write_text(json.dumps({
            "headline": rows, "settings": {"model": stage},
            "sections": {"spy": {"without_distractors": {}}, "spatialtrust": {"one-pass": {}}},
            "inputs": {"spy": {"images": "../../synthetic-spy-tune", "categories": None},
                       "spatialtrust": {"data": "../../spatialtrust-synthetic/data.jsonl", "image_root": None}}}))
        folders.append(folder)
    return folders[0], folders[1]


def test_compare_names_the_options_for_data_outside_the_suites_and_keeps_the_images(synthetic_dir, tmp_path):
    """Suites whose data lie outside their folders (the demo's): compare refuses in one line naming the options
    and the paths to give, writing nothing; with them, its viewer has every sample's image and SpatialTrust."""
    base, nca_p = demo_like_suites(synthetic_dir, tmp_path / "demo")
    out = tmp_path / "demo" / "leaderboard"
    result = forked_python.run([sys.executable, "-m", "eval", "compare", "demo/suite/base", "demo/suite/nca_p",
                                "--out", "demo/leaderboard"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: demo/suite/base/results.json: inputs: ")
    assert "--images demo/synthetic-spy-tune --spatialtrust-data demo/spatialtrust-synthetic/data.jsonl" \
        in result.stderr
    assert not out.exists()
    # the line's options, as said: every sample with its image, and SpatialTrust's
    flags = result.stderr.split("name them: ")[1].split(" (or")[0].split()
    result = forked_python.run([sys.executable, "-m", "eval", "compare", "demo/suite/base", "demo/suite/nca_p",
                                "--out", "demo/leaderboard", *flags], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0 and "warning" not in result.stderr.lower(), result.stderr
    rows = json.loads((out / "view" / "data" / "rows-0000.js").read_text().split(",", 1)[1].rsplit(");", 1)[0])
    assert len(rows) == 6 + 2 and all(r["img"] is not None for r in rows)
    assert {r["bench"] for r in rows} == {"spy", "st"}
    # --no-view: the leaderboard alone needs no data
    result = run(base, nca_p, "--no-view", "--out", tmp_path / "board")
    assert result.returncode == 0 and (tmp_path / "board" / "compare.md").exists()
