"""The SPY composite from VLMEvalKit files (both naming schemes), lmms-eval results and our score JSONs."""

import json

import pytest

from cli.errors import InputError
from eval.__main__ import main
from eval.general import composite, results

# Hand-computed: priv = (90 + 60) / 2 = 75; general = (51 + 840/10 + (1500 + 600)/28) / 3 = (51 + 84 + 75) / 3 = 70;
# overall = 2 * 75 * 70 / (75 + 70) = 10500 / 145.
EXPECTED = {"priv": 75.0, "general": 70.0, "overall": 10500 / 145}


def write_vlmevalkit_dir(directory, spy_names=True):
    """VLMEvalKit score files as VLMEvalKit writes them (QUOTE_ALL CSV, JSON with indent 4)."""
    directory.mkdir(parents=True)
    name = directory.name
    infix = "_exact_matching" if spy_names else ""
    (directory / f"{name}_MMMU_DEV_VAL{infix}_acc.csv").write_text(
        '"split","Overall","Accounting","Art & Design"\n"validation","0.51","0.5","0.52"\n"dev","0.46","0.4","0.5"\n')
    (directory / f"{name}_OCRBench_score.json").write_text(json.dumps({
        "Text Recognition": 250, "Scene Text-centric VQA": 170, "Doc-oriented VQA": 160,
        "Key Information Extraction": 170, "Handwritten Mathematical Expression Recognition": 90,
        "Final Score": 840, "Final Score Norm": 84.0}, indent=4))
    (directory / f"{name}_MME{infix}_score.csv").write_text(
        '"perception","reasoning","existence","OCR"\n"1500.0","600.0","195.0","140.0"\n')
    return directory


def write_spy(path, ics=90.0, hms=60.0):
    path.write_text(json.dumps({"total": 10, "exceptions": 0, "accuracy": 80.0, "ics": ics, "hms": hms}))
    return path


def run_composite(tmp_path, *args):
    out = tmp_path / "composite.json"
    code = main(["composite", *args, "--out", str(out)])
    return code, out


@pytest.mark.parametrize("spy_names", [True, False])
def test_composite_from_vlmevalkit_dir_matches_hand_computation(tmp_path, capsys, spy_names):
    directory = write_vlmevalkit_dir(tmp_path / "Qwen2-VL-7B-Instruct", spy_names)
    code, out = run_composite(tmp_path, "--spy", str(write_spy(tmp_path / "spy.json")), "--general-dir", str(directory))
    assert code == 0
    result = json.loads(out.read_text())
    for key, value in EXPECTED.items():
        assert result[key] == pytest.approx(value)
    assert set(result) == {"priv", "general", "overall", "inputs"}
    assert result["inputs"]["mme"]["normalized"] == pytest.approx(75.0)
    assert result["inputs"]["mmmu"]["parts"] == {"validation": pytest.approx(51.0), "dev": pytest.approx(46.0)}
    assert "overall 72.41" in capsys.readouterr().out


def test_composite_from_lmms_eval_results_and_reference_spy_metrics(tmp_path):
    lmms = tmp_path / "lmms" / "Qwen__Qwen2-VL-7B-Instruct" / "20260801_results.json"
    lmms.parent.mkdir(parents=True)
    lmms.write_text(json.dumps({"results": {
        "mmmu_val": {"alias": "mmmu_val", "mmmu_acc,none": 0.51, "mmmu_acc_stderr,none": "N/A"},
        "mme": {"mme_perception_score,none": 1500.0, "mme_cognition_score,none": 600.0},
        "ocrbench": {"ocrbench_accuracy,none": 0.84}}, "versions": {}, "n-shot": {}}))
    spy = tmp_path / "reference_metrics.json"  # the SPY reference's DIR/metrics/<stem>.json
    spy.write_text(json.dumps({"metrics": {"ics w/o scenario": {"expected": 9, "all": 10, "score": 90.0},
                                           "hms": 60.0}}))
    code, out = run_composite(tmp_path, "--spy", str(spy), "--general-dir", str(tmp_path / "lmms"))
    assert code == 0
    result = json.loads(out.read_text())
    assert result["overall"] == pytest.approx(EXPECTED["overall"])
    assert {result["inputs"][b]["format"] for b in ("mmmu", "ocrbench", "mme")} == {"lmms-eval"}
    # The same file given per benchmark.
    code, out = run_composite(tmp_path, "--spy", str(spy), "--mmmu", str(lmms), "--ocrbench", str(lmms), "--mme", str(lmms))
    assert json.loads(out.read_text())["general"] == pytest.approx(70.0)


def test_an_lmms_eval_file_from_before_the_perception_key_was_renamed(tmp_path):
    """lmms-eval before 2024-11-05 wrote MME's perception score as `mme_percetion_score` (issue 39 item 12)."""
    from eval.general.results import read_result

    path = tmp_path / "20241001_results.json"
    path.write_text(json.dumps({"results": {"mme": {"mme_percetion_score,none": 1500.0,
                                                    "mme_cognition_score,none": 600.0}}}))
    result = read_result(path, "mme")
    assert result["value"] == 2100.0 and result["parts"] == {"perception": 1500.0, "cognition": 600.0}
    path.write_text(json.dumps({"results": {"mme": {"mme_cognition_score,none": 600.0}}}))
    with pytest.raises(InputError, match=r"results\.mme\.mme_perception_score,none: missing"):
        read_result(path, "mme")


def test_explicit_file_overrides_the_directory(tmp_path):
    directory = write_vlmevalkit_dir(tmp_path / "m")
    ours = tmp_path / "mmmu_score.json"
    ours.write_text(json.dumps({"benchmark": "mmmu", "profile": "official", "score": 60.0, "splits": {}}))
    code, out = run_composite(tmp_path, "--spy", str(write_spy(tmp_path / "spy.json")), "--general-dir",
                              str(directory), "--mmmu", str(ours))
    assert code == 0
    result = json.loads(out.read_text())
    assert result["general"] == pytest.approx((60 + 84 + 75) / 3)
    assert result["inputs"]["mmmu"]["format"] == "privacy-align"


@pytest.mark.parametrize("ics,hms,field", [(None, 60.0, "ics"), (90.0, None, "hms"), (90.0, "N/A", "hms")])
def test_undefined_privacy_scores_exit_2_and_write_nothing(tmp_path, capsys, ics, hms, field):
    directory = write_vlmevalkit_dir(tmp_path / "m")
    code, out = run_composite(tmp_path, "--spy", str(write_spy(tmp_path / "spy.json", ics, hms)),
                              "--general-dir", str(directory))
    assert code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert f"spy.json: {field}: is undefined" in err and "Traceback" not in err


def test_bad_general_inputs_exit_2(tmp_path, capsys):
    spy = str(write_spy(tmp_path / "spy.json"))
    directory = write_vlmevalkit_dir(tmp_path / "m")
    (directory / "m_MME_exact_matching_score.csv").unlink()
    code, out = run_composite(tmp_path, "--spy", spy, "--general-dir", str(directory))
    assert code == 2 and not out.exists() and "no MME result file" in capsys.readouterr().err
    # Two candidates of the same kind: ambiguous, not a silent pick.
    write_vlmevalkit_dir(tmp_path / "twins", spy_names=False)
    (tmp_path / "twins" / "other_MME_score.csv").write_text('"perception","reasoning"\n"1.0","2.0"\n')
    code, _ = run_composite(tmp_path, "--spy", spy, "--general-dir", str(tmp_path / "twins"))
    assert code == 2 and "several MME results" in capsys.readouterr().err
    # A file of another benchmark.
    code, _ = run_composite(tmp_path, "--spy", spy, "--mmmu", str(tmp_path / "m" / "m_OCRBench_score.json"),
                            "--ocrbench", str(tmp_path / "m" / "m_OCRBench_score.json"), "--mme", "x.csv")
    assert code == 2 and "holds OCRBench results, not MMMU val" in capsys.readouterr().err
    # No validation row.
    bad = tmp_path / "bad_MMMU_DEV_VAL_acc.csv"
    bad.write_text('"split","Overall"\n"dev","0.5"\n')
    with pytest.raises(Exception, match="no 'validation' row"):
        results.read_result(bad, "mmmu")
    # Missing directory or all files.
    code, _ = run_composite(tmp_path, "--spy", spy, "--mmmu", str(bad))
    assert code == 2 and "give --general-dir DIR or all of" in capsys.readouterr().err


def test_harmonic_mean_edge():
    assert composite.composite(0, 0, 0, 0, 0)["overall"] == 0.0
    assert composite.composite(100, 100, 100, 1000, 2800) == {"priv": 100, "general": 100, "overall": 100}


def test_composite_from_general_is_the_composite_formula():
    """The study's composite (a general score already on 0..100) and `eval composite`'s are one formula."""
    general = composite.general_score(50.0, 800, 2100)
    assert composite.composite(90.0, 70.0, 50.0, 800, 2100) == composite.composite_from_general(90.0, 70.0, general)
    assert composite.composite_from_general(90.0, 70.0, 100.0) == {"priv": 80.0, "general": 100.0,
                                                                   "overall": 2 * 80 * 100 / 180}


def test_synthetic_general_scores_exact_answers():
    from eval.general.synthetic import score

    records = [{"answer": "red", "response": "Red."}, {"answer": "red", "response": " red "},
               {"answer": "blue", "response": "The background is blue."}, {"answer": "pink", "response": None}]
    assert score(records) == {"accuracy": 50.0, "n": 4, "correct": 2}
