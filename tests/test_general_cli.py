"""`python -m eval general score`: our JSON plus VLMEvalKit files that the SPY reference reads unchanged; bad input
exits 2 naming file, line and field, and writes nothing."""

import json
from pathlib import Path

import pytest

from eval.__main__ import main
from store.runs import write_jsonl


def spy_reference_general(g) -> float:
    """The SPY reference's reading of a general-benchmark directory (spy.md 4.3), step by step."""
    stem = Path(g).stem
    with open(f"{g}/{stem}_MMMU_DEV_VAL_exact_matching_acc.csv") as f:
        lines = f.readlines()
    assert len(lines) == 3
    mmmu = next(float(line.replace('"', "").split(",")[1]) * 100 for line in lines[1:]
                if line.replace('"', "").split(",")[0] == "validation")
    with open(f"{g}/{stem}_OCRBench_score.json") as f:
        ocr = json.load(f)["Final Score Norm"]
    with open(f"{g}/{stem}_MME_exact_matching_score.csv") as f:
        lines = f.readlines()
    assert len(lines) == 2
    fields = lines[1].replace('"', "").split(",")
    mme = (float(fields[0]) + float(fields[1])) / 28
    return (mmmu + ocr + mme) / 3


def mmmu_records():
    base = {"question_type": "multiple-choice", "options": ["x", "y"], "answer": "A"}
    return [
        {**base, "id": "validation_Art_1", "split": "validation", "subject": "Art", "response": "A"},
        {**base, "id": "validation_Art_2", "split": "validation", "subject": "Art", "response": "B"},
        {**base, "id": "validation_Math_1", "split": "validation", "subject": "Math", "response": "x"},
        {**base, "id": "validation_Math_2", "split": "validation", "subject": "Math", "response": None,
         "error": "out of memory"},
        {**base, "id": "dev_Art_1", "split": "dev", "subject": "Art", "response": "A"},
    ]


def ocrbench_records():
    return [{"id": "0", "category": "Doc-oriented VQA", "answers": ["42"], "response": "It is 42"},
            {"id": "1", "category": "Regular Text Recognition", "answers": ["cat"], "response": "dog"}]


def mme_records():
    return [{"id": f"count/1.jpg#{k}", "question_id": "count/1.jpg", "category": "count", "answer": a, "response": r}
            for k, (a, r) in enumerate([("Yes", "Yes"), ("No", "No")])]


def test_score_writes_ours_and_files_the_spy_reference_reads(tmp_path, capsys):
    g = tmp_path / "Qwen2.5-VL-7B"  # a dot in the name: the reference uses Path(g).stem == "Qwen2"
    for benchmark, records in [("mmmu", mmmu_records()), ("ocrbench", ocrbench_records()), ("mme", mme_records())]:
        run = tmp_path / f"{benchmark}.jsonl"
        write_jsonl(run, records)
        assert main(["general", "score", benchmark, str(run), "--out", str(g / f"{benchmark}.json")]) == 0
    captured = capsys.readouterr()
    assert "warning: 1 samples have no response" in captured.err and "validation 50.00% of 4" in captured.out
    mmmu_score = json.loads((g / "mmmu.json").read_text())
    assert mmmu_score["n_failed"] == 1 and mmmu_score["items_file"] == "mmmu.items.jsonl"
    assert (g / "Qwen2.5-VL-7B_MMMU_DEV_VAL_acc.csv").exists() and (g / "Qwen2.5-VL-7B_MME_score.csv").exists()
    # MMMU val 2/4 = 50; OCRBench 1 -> 0.1; MME count acc 100 + acc+ 100 = 200 -> 200/28.
    assert spy_reference_general(g) == pytest.approx((50 + 0.1 + 200 / 28) / 3)


def test_official_profile_writes_no_vlmevalkit_files(tmp_path, capsys):
    run = tmp_path / "run.jsonl"
    write_jsonl(run, mmmu_records())
    assert main(["general", "score", "mmmu", str(run), "--out", str(tmp_path / "out" / "s.json"),
                 "--profile", "official"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s.items.jsonl", "s.json"]
    assert "no VLMEvalKit-format files for the official profile" in capsys.readouterr().err
    assert main(["general", "score", "mme", str(run), "--out", str(tmp_path / "x.json"), "--profile", "official"]) == 2


def test_bad_run_file_exits_2_naming_line_and_field(tmp_path, capsys):
    records = mmmu_records()
    del records[1]["options"]
    run = tmp_path / "run.jsonl"
    write_jsonl(run, records)
    out = tmp_path / "out" / "s.json"
    assert main(["general", "score", "mmmu", str(run), "--out", str(out)]) == 2
    assert "run.jsonl:2: options: missing field" in capsys.readouterr().err
    write_jsonl(run, [{**r, "category": "Poetry"} for r in ocrbench_records()])
    assert main(["general", "score", "ocrbench", str(run), "--out", str(out)]) == 2
    assert "run.jsonl:1: category: unknown OCRBench category 'Poetry'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_generation_input_errors_come_before_the_model(tmp_path, capsys):
    args = ["general", "ocrbench", "--model", str(tmp_path / "no-model"), "--backend", "hf", "--out",
            str(tmp_path / "run.jsonl")]
    assert main([*args, "--dataset", str(tmp_path / "nowhere")]) == 2  # not on disk: tried as a Hub id, offline
    assert "cannot load from the Hugging Face Hub" in capsys.readouterr().err
    (tmp_path / "run.jsonl").write_text('{"id": "0"}\nnot json\n')
    assert main(args) == 2
    assert "run.jsonl:2: not valid JSON" in capsys.readouterr().err


def test_generator_options_follow_vlmevalkit():
    from eval.general.cli import build_parser, generator_options

    def options(*argv, items=({"n_images": 3},)):
        return generator_options(build_parser().parse_args(list(argv)), list(items))

    base = ["--model", "m", "--out", "r.jsonl"]
    hf = options("ocrbench", *base, "--backend", "hf")
    assert hf == {"max_new_tokens": 2048, "batch_size": 8, "min_pixels": 78400, "max_pixels": 12845056}
    vllm = options("mmmu", *base, "--backend", "vllm", "--backend-option", "tensor_parallel_size=2")
    assert vllm["images_per_prompt"] == 3 and vllm["min_pixels"] == 1003520 and vllm["tensor_parallel_size"] == 2
    api = options("mme", *base, "--backend", "openai", "--base-url", "http://127.0.0.1:8000/v1", "--pixels", "model")
    assert api == {"max_new_tokens": 2048, "base_url": "http://127.0.0.1:8000/v1", "api_key_env": "OPENAI_API_KEY"}
