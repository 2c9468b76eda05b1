"""End to end on CPU: the tiny Qwen2-VL answers each benchmark's fixture through the transformers backend, the
answers are scored (gibberish must score as wrong, not crash), then the composite and the report are built."""

import json

import pytest
from general_fixtures import save

from eval.__main__ import main
from eval.general import mme, mmmu, ocrbench
from store.runs import read_jsonl

EXPECTED_IDS = {
    "mmmu": ["validation_Accounting_1", "validation_Math_2", "validation_Art_3", "dev_Physics_1"],
    "ocrbench": ["0", "1", "2"],
    "mme": ["existence/000000006040.jpg#0", "existence/000000006040.jpg#1", "code_reasoning/0020.png#0",
            "code_reasoning/0020.png#1"],
}


def generate_args(benchmark, model, data, run, *extra):
    return ["general", benchmark, "--model", str(model), "--backend", "hf", "--dataset", str(data), "--out", str(run),
            "--max-new-tokens", "8", "--pixels", "model", "--batch-size", "4", *extra]


@pytest.mark.slow
def test_generate_score_composite_report(tiny_model_dir, tmp_path, capsys):
    general_dir = tmp_path / "tiny-qwen2vl"
    for benchmark, module in {"mmmu": mmmu, "ocrbench": ocrbench, "mme": mme}.items():
        data = save(benchmark, tmp_path / f"{benchmark}-data")
        run = tmp_path / f"{benchmark}.jsonl"
        if benchmark == "mmmu":  # an interrupted run: the first two samples only, then the rest
            assert main(generate_args(benchmark, tiny_model_dir, data, run, "--limit", "2")) == 0
            first = read_jsonl(run)
        assert main(generate_args(benchmark, tiny_model_dir, data, run)) == 0
        records = read_jsonl(run)
        assert [r["id"] for r in records] == EXPECTED_IDS[benchmark]
        assert all(isinstance(r["response"], str) and "error" not in r for r in records)
        if benchmark == "mmmu":
            assert records[:2] == first  # resumed, not regenerated
            assert records[2]["n_images"] == 3
        before = run.read_bytes()
        assert main(generate_args(benchmark, tiny_model_dir, data, run)) == 0  # all done: nothing to do
        assert run.read_bytes() == before

        score_path = general_dir / f"{benchmark}_score.json"
        assert main(["general", "score", benchmark, str(run), "--out", str(score_path)]) == 0
        score = json.loads(score_path.read_text())
        verdicts = read_jsonl(general_dir / f"{benchmark}_score.items.jsonl")
        assert [v["id"] for v in verdicts] == EXPECTED_IDS[benchmark]
        # The saved verdicts are those of the scoring rules applied to the saved responses.
        assert score["score"] == module.score(records)["score"]
        assert 0 <= score["score"] <= {"mmmu": 100, "ocrbench": 3, "mme": 400}[benchmark]

    names = sorted(p.name for p in general_dir.iterdir())
    assert "tiny-qwen2vl_MMMU_DEV_VAL_exact_matching_acc.csv" in names
    assert "tiny-qwen2vl_MME_exact_matching_score.csv" in names and "tiny-qwen2vl_OCRBench_score.json" in names

    spy = tmp_path / "spy_metrics.json"
    spy.write_text(json.dumps({"ics": 50.0, "hms": 40.0}))
    out = tmp_path / "composite.json"
    assert main(["composite", "--spy", str(spy), "--general-dir", str(general_dir), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["priv"] == 45.0 and 0 <= result["overall"] <= 100
    assert result["inputs"]["mmmu"]["path"].endswith("tiny-qwen2vl_MMMU_DEV_VAL_exact_matching_acc.csv")

    assert main(["general", "report", "--general-dir", str(general_dir), "--out", str(tmp_path / "report"),
                 "--label", "tiny"]) == 0
    report = json.loads((tmp_path / "report" / "general_report.json").read_text())
    assert report["rows"][0]["Qwen2-VL README"] == 54.1
    assert (tmp_path / "report" / "general_report.png").stat().st_size > 0
    assert "| MMMU val accuracy (%) |" in (tmp_path / "report" / "general_report.md").read_text()
