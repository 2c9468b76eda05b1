"""Hardening at the edges, the input classes of issue 26: strict configs at every level, keys from the environment
only and redacted everywhere, data paths inside their folder, locked run files and training folders, outputs that
do not collide or overwrite a user's folder, bounded YAML aliases and no FIFO reads, validators that check
templates as generation uses them. Each subprocess case checks the exit status, the one line, that nothing changed
and that the canary key leaked nowhere (tests/hardening_checks.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chat_server import ChatServer, Reply
from hardening_checks import CANARY, ROOT, assert_no_canary, assert_one_line, assert_unchanged, run_module, snapshot
from PIL import Image

from cli import paths, secrets, strict_yaml
from cli.errors import InputError, check_image, read_text
from data_prep.categories import parse as parse_categories
from data_prep.categories import template_problem
from store import locks
from store.runs import RunFile, check_outputs, claim_folder, read_jsonl, write_json, write_jsonl

# ----------------------------------------------------------------------------------------------- fixtures

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8))  # 10**9 leaves


@pytest.fixture
def suite_dir(tmp_path):
    """A folder with a SPY items file and an image: what a valid suite needs before its keys are checked."""
    Image.new("RGB", (8, 8), "red").save(tmp_path / "img.png")
    (tmp_path / "q.json").write_text(json.dumps({"benchmark_list": []}))
    return tmp_path


def write_suite(folder: Path, text: str) -> Path:
    path = folder / "suite.yaml"
    path.write_text("name: t\nbackend: hf\n" + text)
    return path


SPY = "sections:\n  spy: {items: q.json, images: .}\n"


def suite_refused(folder, text, *needles, env=None):
    """`eval suite` on this config: exit 2, one line holding `needles`, nothing written, no canary anywhere."""
    config = write_suite(folder, text)
    before = snapshot(folder)
    proc = run_module("eval", "suite", "--config", config, "--model", "m", "--out", folder / "out", "--root", folder,
                      cwd=folder, env=env, timeout=120)
    line = assert_one_line(proc, str(config), *needles)
    assert_unchanged(before, folder)
    assert_no_canary(folder / "out", proc.stdout, proc.stderr)  # the config itself may hold it: it is the input
    return line


def load_suite(folder, text):
    from eval.suite_config import load_config

    return load_config(write_suite(folder, text), root=str(folder))


# ----------------------------------------------------------------------------------------------- 1 strict configs

def test_suite_judge_typo_is_refused_naming_the_closest_key(suite_dir):
    # the case: `base_ur` sent every judge request to the public API
    line = suite_refused(suite_dir, "judge: {model: j, base_ur: http://127.0.0.1:9/v1}\n" + SPY,
                         "judge.base_ur", "did you mean base_url")
    assert ":3:" in line


def test_suite_duplicate_top_level_key_is_refused(suite_dir):
    suite_refused(suite_dir, "judge: rule\njudge: {model: j}\n" + SPY, ":4:", "judge", "appears twice")


def test_suite_duplicate_key_inside_a_section_is_refused(suite_dir):
    with pytest.raises(InputError, match=r":6: limit: appears twice"):
        load_suite(suite_dir, "sections:\n  spy:\n    limit: 2\n    limit: 3\n    items: q.json\n    images: .\n")


def test_suite_unknown_backend_option_is_refused(suite_dir):
    with pytest.raises(InputError, match=r"backend_options\.batch_sise: unknown key \(did you mean batch_size\?\)"):
        load_suite(suite_dir, "backend_options: {batch_sise: 4}\n" + SPY)


def test_suite_openai_backend_options_include_the_client_options(suite_dir):
    (suite_dir / "suite.yaml").write_text("name: t\nbackend: openai\nbackend_options: {max_retries: 2, backoff: 0.5}\n"
                                          + SPY)
    from eval.suite_config import load_config

    assert load_config(suite_dir / "suite.yaml", root=str(suite_dir))["backend_options"]["backoff"] == 0.5


def test_suite_hf_refuses_an_openai_only_option(suite_dir):
    with pytest.raises(InputError, match=r"backend_options\.base_url: unknown key"):
        load_suite(suite_dir, "backend_options: {base_url: http://x}\n" + SPY)


def test_suite_unknown_dataset_key_in_general_is_refused(suite_dir):
    with pytest.raises(InputError, match=r"sections\.general\.datasets\.mmmuu: unknown key \(did you mean mmmu\?\)"):
        load_suite(suite_dir, "sections:\n  general:\n    datasets: {mmmuu: x}\n")


def test_suite_unknown_section_suggests_the_closest(suite_dir):
    with pytest.raises(InputError, match=r"sections\.spatialtrst: unknown key \(did you mean spatialtrust\?\)"):
        load_suite(suite_dir, "sections:\n  spatialtrst: {data: d.jsonl}\n")


def test_strict_schema_checks_items_of_a_list():
    doc = strict_yaml.parse("runs:\n  - {name: a}\n  - {name: b, colour: red}\n", "f.yaml")
    with pytest.raises(InputError, match=r"f\.yaml:3: runs\.colour: unknown key"):
        strict_yaml.check("f.yaml", doc, {"runs": [{"name": None}]})


def test_merge_keys_may_be_overridden_but_written_keys_not_twice():
    doc = strict_yaml.parse("base: &b {x: 1, y: 2}\nnew:\n  <<: *b\n  y: 3\n", "f.yaml")
    assert doc["new"] == {"x": 1, "y": 3}
    with pytest.raises(InputError, match=r"f\.yaml:3: y: appears twice"):
        strict_yaml.parse("new:\n  y: 1\n  y: 3\n", "f.yaml")


def test_category_file_unknown_nested_key_names_line_and_closest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("categories:\n  x:\n    name: x\n    definition: d\n    absolut: true\n")
    with pytest.raises(InputError, match=r":5: categories\.x\.absolut: unknown key \(did you mean absolute\?\)"):
        parse_categories(path)


def _recipe(tmp_path, text, *extra, monkeypatch):
    from train.common import SpyTuneArguments, parse_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    monkeypatch.setattr(sys, "argv", ["sft.py", str(recipe), *extra])
    from trl import ModelConfig, SFTConfig

    return recipe, lambda: parse_recipe(SpyTuneArguments, SFTConfig, ModelConfig)


def test_recipe_duplicate_key_is_refused(tmp_path, monkeypatch):
    recipe, parse = _recipe(tmp_path, "max_steps: 1\nmax_steps: 2\n", monkeypatch=monkeypatch)
    with pytest.raises(InputError, match=rf"{recipe}:2: max_steps: appears twice"):
        parse()


# ----------------------------------------------------------------------------------------------- 2 secrets

def test_suite_api_key_in_the_file_is_refused_without_printing_it(suite_dir):
    suite_refused(suite_dir, f"judge: {{model: j, api_key: {CANARY}}}\n" + SPY, "judge.api_key", "environment")


def test_suite_value_equal_to_a_known_secret_is_refused(suite_dir):
    line = suite_refused(suite_dir, f"wandb_project: {CANARY}\n" + SPY, "wandb_project", "OPENAI_API_KEY")
    assert CANARY not in line


def test_suite_key_shaped_value_is_refused_even_when_not_in_the_environment(suite_dir):
    with pytest.raises(InputError, match=r"judge\.api_key_env: holds a key"):
        load_suite(suite_dir, "judge: {model: j, api_key_env: sk-abcdefghijklmnopqrstuvwx}\n" + SPY)


def test_recipe_env_with_a_key_is_refused(tmp_path, monkeypatch):
    recipe, parse = _recipe(tmp_path, "env:\n  HF_TOKEN: abcdefgh12345678\n", monkeypatch=monkeypatch)
    with pytest.raises(InputError, match=rf"{recipe}:2: env\.HF_TOKEN: a key is never read from a file"):
        parse()


def test_recipe_hub_token_is_refused(tmp_path, monkeypatch):
    recipe, parse = _recipe(tmp_path, "hub_token: abcdefgh12345678\n", monkeypatch=monkeypatch)
    with pytest.raises(InputError, match=r"hub_token: a key is never read from a file; set HF_TOKEN"):
        parse()


def test_hub_token_on_the_command_line_is_refused(tmp_path, monkeypatch):
    _, parse = _recipe(tmp_path, "max_steps: 1\n", "--hub_token", "abc", monkeypatch=monkeypatch)
    with pytest.raises(InputError, match=r"--hub_token: .*set HF_TOKEN"):
        parse()


def test_written_json_is_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    write_json(tmp_path / "r.json", {"error": f"401 bad key {CANARY}", CANARY: 1})
    write_jsonl(tmp_path / "r.jsonl", [{"x": CANARY}])
    assert_no_canary(tmp_path)
    assert "<redacted OPENAI_API_KEY>" in (tmp_path / "r.json").read_text()


def test_run_file_records_are_redacted_on_append_and_finalize(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", CANARY)
    run = RunFile(tmp_path / "run.jsonl", header={"model": "m"})
    run.append({"id": "1", "error": f"server said: invalid key {CANARY}"})
    assert_no_canary(tmp_path)
    run.finalize(["1"])
    run.close()
    assert_no_canary(tmp_path)
    assert run.get("1")["error"].endswith(CANARY)  # in memory the record is what the server said


def test_a_variable_a_client_reads_its_key_from_is_redacted(monkeypatch):
    from vlm.chat_client import ChatClient

    monkeypatch.setenv("JUDGE_CRED_VAR", "0123456789abcdef")  # a name that does not look like a key's
    assert secrets.redact("0123456789abcdef") == "0123456789abcdef"
    ChatClient("m", base_url="http://127.0.0.1:9/v1", api_key_env="JUDGE_CRED_VAR")
    assert secrets.redact("key 0123456789abcdef") == "key <redacted JUDGE_CRED_VAR>"


def test_geocoder_url_keys_are_redacted():
    url = "https://maps.googleapis.com/maps/api/geocode/json?address=Paris&key=AIzaSecret123&x=1"
    assert secrets.redact(f"GET {url}") == \
        "GET https://maps.googleapis.com/maps/api/geocode/json?address=Paris&key=<redacted>&x=1"
    # a value that is a URL is recorded as scheme://host/path (issue 46: without userinfo, query and fragment)
    assert secrets.redact(url) == "https://maps.googleapis.com/maps/api/geocode/json"


def test_wandb_config_is_redacted(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    settings = {"judge": {"model": "j", "note": CANARY}, "list": [CANARY]}
    assert CANARY not in json.dumps(secrets.redact_obj(settings))


def test_tracebacks_and_logs_are_redacted(tmp_path):
    code = ("import logging, os, sys; early = logging.getLogger('lib'); early.addHandler(logging.StreamHandler()); "
            "from cli import log; log.setup(); early.warning('lib %s', os.environ['OPENAI_API_KEY']); "
            "logging.getLogger('eval.x').warning('key %s', os.environ['OPENAI_API_KEY']); "
            "print('out', os.environ['OPENAI_API_KEY']); raise RuntimeError(os.environ['OPENAI_API_KEY'])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": CANARY})
    assert proc.returncode == 1 and "RuntimeError: <redacted OPENAI_API_KEY>" in proc.stderr
    assert "warning: key <redacted" in proc.stderr and "out <redacted" in proc.stdout
    assert "lib <redacted" in proc.stderr  # a library's handler made before the guard is redacted too
    assert_no_canary(tmp_path, proc.stdout, proc.stderr)


def test_a_server_error_that_echoes_the_key_is_stored_redacted(tmp_path, monkeypatch, synthetic_dir):
    from data_prep.spy_bench import build_samples
    from eval.spy.cli import judge

    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    samples = build_samples(synthetic_dir / "questions.json")[:2]
    for s in samples:
        s["response"] = "The colour is red."
    write_jsonl(tmp_path / "run.jsonl", samples)
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {CANARY}", "code": 400}}).encode()
    with ChatServer(lambda req: Reply(status=400, body=body)) as server:
        records = judge(tmp_path / "run.jsonl", tmp_path / "judged.jsonl", judge_model="j", base_url=server.base_url,
                        max_retries=0, progress=False)
        assert server.requests  # the request went out, with the key
    assert all(r["judge_error"] for r in records)
    assert_no_canary(tmp_path)


# ----------------------------------------------------------------------------------------------- 3 data paths

@pytest.mark.parametrize("image_path", ["/etc/passwd", "../img.png", "sub/../../img.png"])
def test_bench_item_paths_outside_the_images_folder_are_refused(tmp_path, synthetic_dir, image_path):
    from data_prep.spy_bench import build_samples

    data = json.loads((synthetic_dir / "questions.json").read_text())
    data["benchmark_list"] = data["benchmark_list"][:1]
    data["benchmark_list"][0]["question_item"]["image_path"] = image_path
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(data, indent=1))
    with pytest.raises(InputError, match=rf"{path}:\S+: question_item\.image_path: .* a data file names files inside"):
        build_samples(path, images_dir=synthetic_dir)


def test_a_dotdot_that_stays_inside_is_accepted(tmp_path):
    (tmp_path / "a").mkdir()
    assert paths.inside(tmp_path, "a/../b.png") == tmp_path / "a/../b.png"


def test_outside_paths_with_explicit_consent(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.ALLOW_ENV, "1")
    assert paths.inside(tmp_path / "data", "/abs/x.png") == Path("/abs/x.png")
    assert paths.inside(tmp_path / "data", "../x.png") == tmp_path / "data" / "../x.png"


def test_spatialtrust_record_with_an_absolute_image_is_refused(tmp_path):
    from eval.spatialtrust import data

    folder = data.build_synthetic(tmp_path / "st", n_images=1).parent
    lines = (folder / "data.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["image"] = "/etc/hostname"
    (folder / "data.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(InputError, match=r"data\.jsonl:1: image: '/etc/hostname' is an absolute path"):
        data.load(folder / "data.jsonl")


def test_self_moderation_run_records_cannot_name_outside_images(tmp_path):
    from eval.spy.self_moderation import load_answered

    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"id": "1", "input_question": "q", "response": "r", "image_path": "../../x.png"}) + "\n")
    with pytest.raises(InputError, match=r"run\.jsonl:1: image_path: '\.\./\.\./x\.png' leaves its folder"):
        load_answered(path, tmp_path)


def test_spy_request_refuses_an_outside_image():
    from eval.spy.prompts import spy_request

    with pytest.raises(InputError, match="is an absolute path"):
        spy_request({"id": "1", "input_question": "q", "image_path": "/etc/passwd"}, "/data")


def test_geo_metadata_cannot_name_an_image_outside(tmp_path):
    from eval.geoprivacy.data import find_image

    with pytest.raises(InputError, match="image_id: '../secret.jpg' leaves its folder"):
        find_image(tmp_path, "yfcc-1", {"image_id": "../secret", "image_source": "yfcc"})


def test_spy_tune_validate_refuses_an_absolute_image_path(tmp_path, synthetic_dir):
    data = json.loads((synthetic_dir / "train_data.json").read_text())
    data["data_list"][0]["question_item"]["image_path"] = "/etc/passwd"
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data))
    before = snapshot(tmp_path)
    proc = run_module("data_prep.spy_tune", "validate", path, "--images", synthetic_dir, cwd=tmp_path, timeout=120)
    assert_one_line(proc, str(path), "question_item.image_path", "absolute path")
    assert_unchanged(before, tmp_path)
    assert_no_canary(tmp_path, proc.stdout, proc.stderr)


# ----------------------------------------------------------------------------------------------- 4 locks

def _holder(target: Path, *, kill_after: float | None = None):
    """Another process holding the lock of `target` until it is told to stop (or killed)."""
    code = (f"from store import locks; import sys, time; locks.acquire({str(target)!r}); print('held', flush=True);"
            " time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_on_a_locked_run_file_is_refused_naming_the_pid(tmp_path):
    target = tmp_path / "run.jsonl"
    holder = _holder(target)
    try:
        with pytest.raises(InputError, match=rf"run\.jsonl: this run file is in use by pid {holder.pid}"):
            RunFile(target, header={"model": "m"})
    finally:
        holder.terminate()
        holder.wait()


def test_a_stale_lock_of_a_killed_run_is_taken_over(tmp_path):
    target = tmp_path / "run.jsonl"
    holder = _holder(target)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert locks.lock_path(target).exists()  # the killed holder could not remove it
    run = RunFile(target, header={"model": "m"})
    assert locks.lock_path(target).read_text().strip() == str(os.getpid())
    run.close()
    assert not locks.lock_path(target).exists()


def test_the_lock_is_reentrant_in_one_process(tmp_path):
    first = RunFile(tmp_path / "run.jsonl", header={"model": "m"})
    second = RunFile(tmp_path / "run.jsonl", header={"model": "m"})
    second.close()
    assert locks.lock_path(tmp_path / "run.jsonl").exists()
    first.close()
    assert not locks.lock_path(tmp_path / "run.jsonl").exists()


def test_a_judge_command_on_a_run_file_in_use_exits_2_with_one_line(tmp_path, synthetic_dir):
    from data_prep.spy_bench import build_samples

    samples = build_samples(synthetic_dir / "questions.json")[:2]
    for s in samples:
        s["response"] = "red"
    write_jsonl(tmp_path / "run.jsonl", samples)
    holder = _holder(tmp_path / "judged.jsonl")
    try:
        before = snapshot(tmp_path)
        proc = run_module("eval", "spy", "judge", tmp_path / "run.jsonl", "--judge", "rule", "--out",
                          tmp_path / "judged.jsonl", cwd=tmp_path, timeout=120)
        assert_one_line(proc, "judged.jsonl", f"in use by pid {holder.pid}")
        assert_unchanged(before, tmp_path)
    finally:
        holder.terminate()
        holder.wait()


def test_a_training_output_folder_in_use_is_refused(tmp_path, synthetic_dir, tiny_model_dir):
    out = tmp_path / "out"
    holder = _holder(out)
    try:
        proc = run_module("train.sft", ROOT / "recipes" / "demo" / "sft.yaml", "--model_name_or_path", tiny_model_dir,
                          "--train_data_path", synthetic_dir / "train_data.json", "--image_folder", synthetic_dir,
                          "--output_dir", out, "--max_steps", "1", cwd=tmp_path, timeout=200)
        assert_one_line(proc, str(out), "training output folder is in use", f"pid {holder.pid}")
        assert not out.exists()
    finally:
        holder.terminate()
        holder.wait()


# ----------------------------------------------------------------------------------------------- 5 outputs

def test_two_outputs_with_one_path_are_refused(tmp_path):
    with pytest.raises(InputError, match="is written twice by this command"):
        check_outputs([], [tmp_path / "x.json", tmp_path / "sub" / ".." / "x.json"])


def test_spy_metrics_out_and_reference_out_equal_is_refused(tmp_path):
    judged = tmp_path / "judged.jsonl"
    judged.write_text(json.dumps({"id": "1", "label": "a0_safe", "eval_resp": "respond"}) + "\n")
    before = snapshot(tmp_path)
    proc = run_module("eval", "spy", "metrics", judged, "--out", tmp_path / "m.json", "--reference-out",
                      tmp_path / "m.json", cwd=tmp_path, timeout=120)
    assert_one_line(proc, "m.json", "written twice")
    assert_unchanged(before, tmp_path)


def test_spatialtrust_score_out_named_like_its_report_is_refused(tmp_path):
    from eval.spatialtrust import data

    path = data.build_synthetic(tmp_path / "st", n_images=1)
    (tmp_path / "p.jsonl").write_text("")
    before = snapshot(tmp_path)
    proc = run_module("eval", "spatialtrust", "score", "--data", path, "--predictions", tmp_path / "p.jsonl",
                      "--out", tmp_path / "m.md", cwd=tmp_path, timeout=120)
    assert_one_line(proc, "m.md", "written twice")
    assert_unchanged(before, tmp_path)


@pytest.mark.parametrize("module,args", [
    ("data_prep.synthetic", ["--train-per-label", "1", "--test-per-label", "1", "--out"]),
    ("eval", ["spatialtrust", "synthetic", "--n-images", "1", "--out"]),
    ("train.tiny_model", []),
])
def test_a_folder_output_holding_a_users_files_is_refused(tmp_path, module, args):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    before = snapshot(tmp_path)
    proc = run_module(module, *args, out, cwd=tmp_path, timeout=120)
    assert_one_line(proc, str(out), "thesis.tex", "choose another --out")
    assert_unchanged(before, tmp_path)


def test_a_folder_made_by_the_command_may_be_written_again(tmp_path):
    claim_folder(tmp_path / "o", "cmd")
    (tmp_path / "o" / "a.txt").write_text("ours")
    claim_folder(tmp_path / "o", "cmd")  # a rerun
    with pytest.raises(InputError, match="holds files made by cmd"):
        claim_folder(tmp_path / "o", "other")


def test_a_claimed_folder_ignores_lock_files_and_listed_own_entries(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / ".run.jsonl.lock").write_text("1")
    (tmp_path / "o" / "tiny").mkdir()
    claim_folder(tmp_path / "o", "cmd", own=("tiny",))


# ----------------------------------------------------------------------------------------------- 7 hangs

def test_a_billion_laughs_suite_is_refused_quickly(suite_dir):
    started = time.monotonic()
    suite_refused(suite_dir, BOMB + SPY, "aliases")
    assert time.monotonic() - started < 60


def test_a_billion_laughs_recipe_is_refused(tmp_path, monkeypatch):
    recipe, parse = _recipe(tmp_path, BOMB, monkeypatch=monkeypatch)
    with pytest.raises(InputError, match="expands to more than"):
        parse()


def test_a_billion_laughs_category_file_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(BOMB + "categories: {}\n")
    with pytest.raises(InputError, match="expands to more than"):
        parse_categories(path)


def test_a_fifo_is_refused_not_read(tmp_path):
    fifo = tmp_path / "items.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is a FIFO, not a regular file"):
        read_text(fifo)
    with pytest.raises(InputError, match="is a FIFO"):
        check_image(fifo)
    with pytest.raises(InputError, match="is a device"):
        read_text("/dev/zero")


def test_a_fifo_as_spy_items_exits_2_at_once(tmp_path):
    fifo = tmp_path / "items.json"
    os.mkfifo(fifo)
    proc = run_module("eval", "spy", "judge", fifo, "--judge", "rule", "--out", tmp_path / "j.jsonl", cwd=tmp_path,
                      timeout=60)
    assert_one_line(proc, str(fifo), "FIFO")


# ----------------------------------------------------------------------------------------------- 11 early checks

@pytest.mark.parametrize("template", ["{x} {}", "{0}", "{} {0}", "{:>5}", "{}}", "{!r}"])
def test_templates_generation_cannot_fill_are_refused(template):
    assert template_problem(template)


@pytest.mark.parametrize("template", ["{} is private.", "Literal {{braces}} and {}"])
def test_templates_generation_fills_are_accepted(template):
    assert template_problem(template) is None
    template.format("x")


def test_category_file_template_with_a_named_field_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("instruction_templates:\n  non_private: '{x} {} ok'\n  private: '{} no'\n"
                    "categories:\n  c1: {name: n, definition: d}\n")
    with pytest.raises(InputError, match=r":2: instruction_templates\.non_private: .*\{x\}"):
        parse_categories(path)


def test_spy_tune_template_with_a_numbered_field_is_refused(synthetic_dir, tmp_path):
    from data_prep.spy_tune import load_items

    data = json.loads((synthetic_dir / "train_data.json").read_text())
    data["data_list"][0]["instruct_templates"] = ["{0} is fine", "{} is private"]
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"instruct_templates\[0\]"):
        load_items(path, synthetic_dir)


def test_json_lines_with_u2028_inside_a_string_are_accepted(tmp_path):
    from data_prep.spy_bench import load_items

    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"id": 1, "q": "a\u2028b"}, ensure_ascii=False) + "\n" + json.dumps({"id": 2}) + "\n",
                    encoding="utf-8")
    assert [item["id"] for _, item in load_items(path)] == [1, 2]
    assert [r["id"] for r in read_jsonl(path)] == [1, 2]


def test_a_large_category_file_is_checked_in_linear_time(tmp_path):
    def timed(n):
        path = tmp_path / f"c{n}.yaml"
        path.write_text("categories:\n" + "".join(f"  c{i}: {{name: n{i}, definition: d}}\n" for i in range(n)))
        started = time.perf_counter()
        assert len(parse_categories(path).categories) == n
        return time.perf_counter() - started

    small, large = timed(1000), timed(8000)
    assert large < 20 * small + 1, (small, large)  # quadratic would be 64 times


def test_a_json_config_with_a_key_given_twice_is_refused(tmp_path):
    from cli.errors import read_json

    path = tmp_path / "label2text.json"
    path.write_text('{"a1": "x", "a1": "y"}')
    with pytest.raises(InputError, match=r"label2text\.json:1: a1: appears twice in one object"):
        read_json(path)


@pytest.mark.parametrize("name,text", [("deep.yaml", "a: " + "[" * 100_000), ("deep.json", "[" * 100_000 + "]" * 100_000),
                                       ("deep.jsonl", "{\"a\": " + "[" * 100_000 + "]" * 100_000 + "}\n")])
def test_deeply_nested_input_is_one_line_not_a_crash(tmp_path, name, text):
    from cli.errors import read_json

    path = tmp_path / name
    path.write_text(text)
    reader = {"deep.yaml": strict_yaml.load, "deep.json": read_json, "deep.jsonl": read_jsonl}[name]
    with pytest.raises(InputError, match="nested too deeply|not YAML|not valid JSON"):
        reader(path)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("case", ["spy-items-json", "spy-items-jsonl", "view-run-file", "general-dir"])
def test_every_reader_of_a_users_json_refuses_deep_nesting_in_one_line(tmp_path, capsys, case):
    """Issue 39 item 8: `eval spy generate --items deep.json` was a RecursionError traceback; every JSON and JSON
    Lines reader of user files goes through one guarded loader (cli.errors.parse_json)."""
    from eval.__main__ import main

    deep = tmp_path / ("deep.jsonl" if case == "spy-items-jsonl" else "deep.json")
    deep.write_text(DEEP + "\n")
    spy = ["spy", "generate", "--images", tmp_path, "--out", tmp_path / "out.jsonl", "--model", "m", "--backend",
           "openai", "--base-url", "http://127.0.0.1:9/v1", "--items", deep]
    argv, said = {"spy-items-json": (spy, f"{deep}: nested too deeply"),
                  "spy-items-jsonl": (spy, f"{deep}:1: nested too deeply"),
                  "view-run-file": (["view", deep, "--out", tmp_path / "view"], f"{deep}: nested too deeply"),
                  "general-dir": (["composite", "--spy", tmp_path / "spy.json", "--general-dir", tmp_path / "general",
                                   "--out", tmp_path / "c.json"], "general: no MMMU val result file")}[case]
    if case == "general-dir":  # a deep file where result files are looked for: not a result file, and no crash
        (tmp_path / "spy.json").write_text(json.dumps({"ics": 90.0, "hms": 60.0}))
        (tmp_path / "general").mkdir()
        deep.rename(tmp_path / "general" / "20240101_results.json")
    before = snapshot(tmp_path)
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err
    assert snapshot(tmp_path) == before


def test_a_checkpoint_with_a_deeply_nested_state_is_not_complete(tmp_path):
    from losses.checkpointing import is_complete_checkpoint
    from train.resume import recorded_settings

    (tmp_path / "trainer_state.json").write_text(DEEP)
    assert not is_complete_checkpoint(tmp_path) and recorded_settings(tmp_path) is None


@pytest.mark.parametrize("argv, option, problem", [
    (["--api-key-env", CANARY], "--api-key-env", "holds a key (its value is not shown)"),
    (["--base-url=http://127.0.0.1:9/v1?api_key=plain-secret-i39"], "--base-url",
     "carries a key parameter (its value is not shown)"),
], ids=["key-as-variable", "key-in-url"])
def test_a_key_on_any_command_line_is_refused(tmp_path, capsys, argv, option, problem):
    """Issue 39 item 1, for every command: a key is never a command-line value (every `ps` shows it, and a run
    records its settings); one line naming the option, the key nowhere."""
    from eval.__main__ import main

    write_jsonl(tmp_path / "run.jsonl", [{"id": "1", "label": "a25_nationality", "is_privacy": 1, "response": "r"}])
    assert main(["spy", "judge", str(tmp_path / "run.jsonl"), "--judge-model", "j", "--out",
                 str(tmp_path / "judged.jsonl"), *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"error: command line: {option}: {problem}; a key is never given on " \
                  "the command line: set it in an environment variable and name that variable instead\n"
    assert not (tmp_path / "judged.jsonl").exists()


@pytest.mark.parametrize("url, problem", [
    ("http://me:pw@judge.example/v1", "carries credentials"), ("http://[::1/v1", "not a valid URL"),
    ("http://judge.example/v1?token=abc", "carries a key"), ("ftp://judge.example/v1", "expected an http(s):// URL"),
    ("http:///v1", "names no host"), ("http://judge.example:99999/v1", "port 99999 is not in [1, 65535]")])
def test_an_endpoint_carries_no_credentials_and_parses(url, problem):
    from vlm.chat_client import ChatClient

    assert problem in secrets.endpoint_problem(url)
    with pytest.raises(InputError, match=f"endpoint options: base_url: {re.escape(problem)}"):
        ChatClient("m", base_url=url)
    assert secrets.endpoint_problem("http://[::1]:8000/v1") is None
    assert secrets.variable_problem("MY_JUDGE_KEY") is None and "name of an environment" in secrets.variable_problem("a b")


# ----------------------------------------------------------------------------------------------- issue 32: types
def _wrong_values(schema):
    """(value, what the refusal says) for a schema leaf: a scalar where a list goes, text where a flag goes,
    a number or a list where text goes."""
    if isinstance(schema, list):
        return [("3", "expected a list, got 3"), ("without_distractors", "expected a list, got 'without_distractors'"),
                ("{a: 1}", "expected a list, got a mapping")]
    if schema is bool:
        return [('"no"', "expected true or false, got 'no'"), ("1", "expected true or false, got 1")]
    if isinstance(schema, dict):
        return [("3", "expected a mapping, got 3"), ("[a]", "expected a mapping, got a list")]
    if schema is str or (isinstance(schema, tuple) and str in schema):
        return [("3", "expected text"), ("[a, b]", "expected text")]
    return []


def _suite_type_cases():
    from eval.suite_config import SECTION_KEYS

    return [(section, key, value, said) for section, keys in SECTION_KEYS.items() for key, schema in keys.items()
            for value, said in _wrong_values(schema)]


@pytest.mark.parametrize("section, key, value, said", _suite_type_cases(),
                         ids=lambda v: str(v)[:24])
def test_every_suite_value_of_the_wrong_type_is_refused(suite_dir, section, key, value, said):
    """Every list, flag, path and mapping of every section (the schema itself lists them): refused naming the line
    and the field, never iterated character by character nor taken as truthy."""
    with pytest.raises(InputError, match=rf"suite\.yaml:5: sections\.{section}\.{key}: {re.escape(said)}"):
        load_suite(suite_dir, f"sections:\n  {section}:\n    {key}: {value}\n")


@pytest.mark.parametrize("text, needles", [
    ("sections:\n  spy: {items: q.json, images: ., settings: 3}\n", ["sections.spy.settings", "expected a list, got 3"]),
    ("sections:\n  spy: {items: q.json, images: ., settings: without_distractors}\n",
     ["sections.spy.settings", "write [without_distractors] for one"]),
    ("sections:\n  spy: {items: q.json, images: ., self_moderation: \"no\"}\n",
     ["sections.spy.self_moderation", "expected true or false, got 'no'"]),
    ("judge: {model: [j]}\n" + SPY, [":3:", "judge.model: expected text"]),
    ("backend_options: [4]\n" + SPY, [":3:", "backend_options: expected a mapping or nothing"]),
], ids=["settings-3", "settings-text", "self-moderation-no", "judge-model-list", "options-list"])
def test_a_suite_value_of_the_wrong_type_is_one_line_and_changes_nothing(suite_dir, text, needles):
    suite_refused(suite_dir, text, *needles)


def test_the_right_types_still_pass(suite_dir):
    config = load_suite(suite_dir, "sections:\n  spy: {items: q.json, images: ., settings: [with_distractors], "
                                   "self_moderation: false, categories: null}\n")
    assert config["sections"]["spy"]["settings"] == ["with_distractors"]


def test_every_recipe_flag_and_list_option_refuses_the_wrong_type(tmp_path):
    """Every flag of the three trainers' recipes takes true or false only (quoted "no" is text, and truthy), every
    list option a list of plain values, or one value (a list of one, as on the command line): the schema comes from
    the parser itself."""
    from trl import DPOConfig, ModelConfig, SFTConfig, TrlParser

    from losses.nca_p_trainer import NCAPConfig
    from train.common import SpyTuneArguments, _read_recipe, _recipe_schema

    checked = 0
    for config in (SFTConfig, DPOConfig, NCAPConfig):
        actions = TrlParser((SpyTuneArguments, config, ModelConfig))._actions
        schema = _recipe_schema(actions)
        for key, kind in schema.items():
            if key == "help" or not (kind is bool or isinstance(kind, list)):
                continue
            wrong = _wrong_values(kind)[:2] if kind is bool else [
                ("{a: 1}", "expected a list, got a mapping"), ("[[a]]", "expected text or a number, got a list")]
            for value, said in wrong:
                recipe = tmp_path / "r.yaml"
                recipe.write_text(f"max_steps: 1\n{key}: {value}\n")
                with pytest.raises(InputError, match=rf"r\.yaml:2: {key}: {re.escape(said)}"):
                    _read_recipe(recipe, actions)
                checked += 1
    assert checked > 100  # the flags and lists of three configs
    recipe = tmp_path / "ok.yaml"
    recipe.write_text("add_distractors: false\nuse_peft: true\nlora_target_modules: [q_proj, 7]\nloss_type: nca\n")
    read = _read_recipe(recipe, actions)
    assert read["lora_target_modules"] == ["q_proj", "7"] and read["loss_type"] == ["nca"]  # as the command line


def test_a_recipe_flag_given_as_text_is_refused_by_the_training_script(tmp_path, monkeypatch):
    recipe, parse = _recipe(tmp_path, "max_steps: 1\nadd_distractors: \"no\"\n", monkeypatch=monkeypatch)
    with pytest.raises(InputError, match=rf"{recipe}:2: add_distractors: expected true or false, got 'no'"):
        parse()


@pytest.mark.parametrize("entry, needles", [
    ("absolute: \"no\"", [":5:", "categories.x.absolute", "expected true or false"]),
    ("example_questions: What is it?", [":5:", "categories.x.example_questions", "expected a list"]),
    ("scenarios: {privacy: s1}", [":5:", "categories.x.scenarios.privacy", "expected a list"]),
    ("name: [n]", [":3:", "categories.x.name", "expected a non-empty string"]),
], ids=["absolute-text", "questions-scalar", "privacy-scalar", "name-list"])
def test_a_category_file_value_of_the_wrong_type_is_one_line(tmp_path, entry, needles):
    path = tmp_path / "c.yaml"
    fields = [entry, "definition: d"] if entry.startswith("name") else ["name: x", "definition: d", entry]
    path.write_text("categories:\n  x:\n" + "".join(f"    {field}\n" for field in fields))
    before = snapshot(tmp_path)
    proc = run_module("data_prep.categories", path, cwd=tmp_path, timeout=60)
    assert_one_line(proc, str(path), *needles)
    assert_unchanged(before, tmp_path)


# ----------------------------------------------------------------------------------------------- issue 32: outputs
def test_a_training_folder_holding_a_users_readme_is_refused(tmp_path, synthetic_dir, tiny_model_dir, monkeypatch):
    """transformers writes README.md (the model card) into output_dir: a folder of the user's is refused before
    anything loads, whatever its entries are named (a `checkpoint-*` name is no proof, issue 54); a folder whose
    marker names this script (resumed, or copied to resume) is the run's."""
    from trl import ModelConfig, SFTConfig

    from train.common import SpyTuneArguments, check_run, parse_recipe

    out = tmp_path / "mine"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    before = snapshot(tmp_path)
    monkeypatch.setattr(sys, "argv", ["sft.py", str(ROOT / "recipes" / "demo" / "sft.yaml"), "--model_name_or_path",
                                      str(tiny_model_dir), "--train_data_path", str(synthetic_dir / "train_data.json"),
                                      "--image_folder", str(synthetic_dir), "--output_dir", str(out)])
    with pytest.raises(InputError, match=r"mine: holds files not made by this command \(e\.g\. README\.md\).*"
                                         r"choose another --output_dir"):
        check_run(*parse_recipe(SpyTuneArguments, SFTConfig, ModelConfig))
    assert_unchanged(before, tmp_path)
    (out / "checkpoint-2").mkdir()
    with pytest.raises(InputError, match=r"mine: holds files not made by this command"):
        check_run(*parse_recipe(SpyTuneArguments, SFTConfig, ModelConfig))
    from store.runs import mark_folder

    mark_folder(out, "train/sft.py")  # what train/card.attach writes when the run starts
    check_run(*parse_recipe(SpyTuneArguments, SFTConfig, ModelConfig))  # a run's folder: resumable
    locks.release(out.resolve())


def test_the_suite_refuses_a_users_folder_as_its_out(suite_dir):
    out = suite_dir / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")
    config = write_suite(suite_dir, SPY)
    before = snapshot(suite_dir)
    proc = run_module("eval", "suite", "--config", config, "--model", "m", "--out", out, "--root", suite_dir,
                      cwd=suite_dir, timeout=120)
    assert_one_line(proc, str(out), "results.json", "choose another --out")
    assert_unchanged(before, suite_dir)


def test_report_files_never_overwrite_a_users_file(tmp_path):
    """A report command writes named files into a folder that may hold others (its inputs): one of those names
    that no command of ours wrote is refused; once ours (the marker lists it), a rerun replaces it."""
    from store.runs import claim_files

    (tmp_path / "metrics.md").write_text("my notes")
    (tmp_path / "judged.jsonl").write_text("")
    with pytest.raises(InputError, match=r"metrics\.md: is already there and was not written by this project"):
        claim_files(tmp_path, ["metrics.json", "metrics.md"])
    claim_files(tmp_path, ["report.md"])  # other names beside the user's files: fine
    claim_files(tmp_path, ["report.md"], mark=True)
    (tmp_path / "report.md").write_text("ours")
    claim_files(tmp_path, ["report.md"])  # a rerun


def report_inputs(folder: Path) -> dict:
    """Valid inputs of each command that writes named files into a folder that may hold others (claim_files):
    command -> (argv before --out, the names it writes there)."""
    from eval.spy.cli import metrics

    judged = folder / "judged.jsonl"
    write_jsonl(judged, [{"id": f"s{n}", "label": "a25_nationality", "question": "Q?", "response": "No.",
                          "is_privacy": n % 2, "benchmark_id": str(n // 2), "eval_resp": "reject"} for n in range(4)])
    metrics(judged, folder / "metrics.json")
    row = {"benchmark": "SPY-Bench", "setting": "without_distractors", "metric": "HMS", "key": "hms", "value": 50.0,
           "n": 4}
    for name in ("a", "b"):
        (folder / name).mkdir()
        (folder / name / "results.json").write_text(json.dumps({"headline": [row], "settings": {}}))
    lmms = folder / "lmms" / "results.json"
    lmms.parent.mkdir()
    lmms.write_text(json.dumps({"results": {
        "mmmu_val": {"mmmu_acc,none": 0.51}, "mme": {"mme_perception_score,none": 1500.0,
                                                     "mme_cognition_score,none": 600.0},
        "ocrbench": {"ocrbench_accuracy,none": 0.84}}}))
    return {
        "spy-report": (["spy", "report", folder / "metrics.json"],
                       ["spy_report.md", "spy_report.json", "spy_overall.png", "spy_by_label_accuracy.png"]),
        "compare": (["compare", folder / "a", folder / "b", "--no-view"], ["compare.md", "compare.json", "compare.png"]),
        "general-report": (["general", "report", "--general-dir", folder / "lmms"],
                           ["general_report.md", "general_report.json", "general_report.png"]),
    }


@pytest.mark.parametrize("command, which", [("spy-report", 0), ("spy-report", 3), ("compare", 0), ("compare", 1),
                                            ("general-report", 0), ("general-report", 2)])
def test_report_commands_never_overwrite_a_users_file(tmp_path, command, which):
    """`spy report`, `compare` and `general report` (each writes a few named files into --out, a folder that may
    hold others): a file of one of those names that no command of ours wrote is refused with one line naming it,
    exit 2, before any work, and stays byte for byte; moved away, the same command writes there (the inputs were
    fine), and its own files are then replaced by a rerun."""
    from eval.__main__ import main as eval_main

    argv, names = report_inputs(tmp_path)[command]
    out = tmp_path / "out"
    out.mkdir()
    mine = out / names[which]
    mine.write_bytes(b"my own \x00\xff notes")
    (out / "notes.txt").write_text("beside them")
    before = snapshot(tmp_path)
    proc = run_module("eval", *argv, "--out", out, cwd=tmp_path, timeout=120)
    assert_one_line(proc, str(mine), "not written by this project's commands", "choose another --out")
    assert_unchanged(before, tmp_path)
    mine.rename(tmp_path / "kept")
    assert eval_main([*map(str, argv), "--out", str(out)]) == 0
    assert all((out / name).is_file() for name in names) and (out / "notes.txt").read_text() == "beside them"
    assert eval_main([*map(str, argv), "--out", str(out)]) == 0  # a rerun replaces what it wrote


def test_geo_metrics_refuses_to_overwrite_a_users_metrics_md(tmp_path):
    from test_geo_pipeline import IMAGES

    labels = tmp_path / "labels.csv"
    labels.write_text("id,Q1,Q2,Q3,Q4,Q5,Q6,Q7\n" + "".join(f"{k},{v[1]}\n" for k, v in IMAGES.items()))
    run = tmp_path / "mcq.jsonl"
    run.write_text("".join(json.dumps({"id": k, "setting": "mcq", "Q7-gen": "A", "Q7-label": "A"}) + "\n"
                           for k in IMAGES))
    report = tmp_path / "report"
    report.mkdir()
    (report / "metrics.md").write_text("my own metrics")
    before = snapshot(tmp_path)
    proc = run_module("eval", "geo", "metrics", run, "--labels", labels, "--out", report, cwd=tmp_path, timeout=120)
    assert_one_line(proc, str(report / "metrics.md"), "not written by this project's commands")
    assert_unchanged(before, tmp_path)


@pytest.mark.parametrize("command", ["suite", "spy-generate", "synthetic"])
def test_an_out_under_a_folder_that_refuses_writes_is_refused_before_any_work(suite_dir, command):
    """/sys: root's permission bits say yes, creating a file there fails; the probe file finds it (exit 2 at once),
    not the first write after the work (exit 1)."""
    if os.access("/sys", os.W_OK) and paths_probe_ok("/sys"):
        pytest.skip("/sys takes files on this machine")
    config = write_suite(suite_dir, SPY)
    argv = {"suite": ("eval", "suite", "--config", config, "--model", "m", "--out", "/sys/privacy-align-out"),
            "spy-generate": ("eval", "spy", "generate", "--items", "q.json", "--images", ".", "--model", "m",
                             "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--out",
                             "/sys/privacy-align-out/run.jsonl"),
            "synthetic": ("data_prep.synthetic", "--out", "/sys/privacy-align-out")}[command]
    before = snapshot(suite_dir)
    proc = run_module(*argv, cwd=suite_dir, timeout=120)
    assert_one_line(proc, "/sys/privacy-align-out", "cannot")
    assert_unchanged(before, suite_dir)


def paths_probe_ok(folder) -> bool:
    from cli.errors import write_probe

    return write_probe(folder) is None
