"""Issue 54, secure by construction on the training side: the reader judges values (an integer's magnitude
whatever its spelling, the recipe's `env:` entries, NUL in any config text), credentials refused by field name in
every mapping a user writes, the one-line error through the documented `accelerate launch`, every setting checked
before the model loads, and the writer's rules for every file a run writes, the libraries' saves included.

Each case is one of the issue's examples; the subprocess cases check the exit status, the one line, that nothing
changed and that no secret was printed (tests/hardening_checks.py)."""

from __future__ import annotations

import os
import sys

import pytest
from hardening_checks import CANARY, ROOT, assert_no_canary, assert_one_line, assert_unchanged, run_module, snapshot
from PIL import Image

from cli.errors import InputError

# ----------------------------------------------------------------------------------------------- helpers


def _recipe(tmp_path, text, *extra, monkeypatch):
    """`sft.py RECIPE extra...` parsed in this process (what every entry script does first)."""
    from trl import ModelConfig, SFTConfig

    from train.common import SpyTuneArguments, parse_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    required = ["--train_data_path", str(tmp_path / "d.json"), "--image_folder", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["sft.py", str(recipe), *required, *extra])
    return recipe, lambda: parse_recipe(SpyTuneArguments, SFTConfig, ModelConfig)


@pytest.fixture
def suite_dir(tmp_path):
    Image.new("RGB", (8, 8), "red").save(tmp_path / "img.png")
    (tmp_path / "q.json").write_text('{"benchmark_list": []}')
    return tmp_path


SPY = "sections:\n  spy: {items: q.json, images: .}\n"


def _suite(folder, text, *extra):
    config = folder / "suite.yaml"
    config.write_text("name: t\nbackend: openai\n" + text)
    before = snapshot(folder)
    proc = run_module("eval", "suite", "--config", config, "--model", "m", "--out", folder / "out", "--root", folder,
                      *extra, cwd=folder, timeout=120)
    return proc, before


# ----------------------------------------------------------------------------------------------- 1 the reader judges values

@pytest.mark.parametrize("spelling", ["0x" + "f" * 4298, "1" + ":59" * 2500, "0b" + "1" * 4298 * 4,
                                      "1" + "_0" * 4299, "-0x" + "f" * 4000])
def test_an_integer_is_judged_by_its_magnitude_whatever_its_spelling(spelling, tmp_path, monkeypatch):
    # the case: 0x + 4,298 f's passed the 4,300-character check and has 5,175 decimal digits; printing it
    # in the range error raised Python's digit-limit ValueError
    recipe, parse = _recipe(tmp_path, f"max_steps: {spelling}\n", monkeypatch=monkeypatch)
    with pytest.raises(InputError, match=rf"^{recipe}:1: an integer of more than 4,300 digits; refused"):
        parse()


def test_a_large_integer_within_the_limit_is_shown_by_its_size(tmp_path, monkeypatch):
    recipe, parse = _recipe(tmp_path, f"max_steps: 0x{'f' * 1000}\n", monkeypatch=monkeypatch)
    with pytest.raises(InputError, match=r"max_steps: must be a finite number, got an integer of about 1,205 digits"):
        parse()


@pytest.mark.parametrize("entry,field,message", [
    ("ON: x", "env", "True is not an environment variable's name.*quote the name"),
    ("'': x", "env", "'' is not an environment variable's name"),
    ("'A=B': x", "env", "'A=B' is not an environment variable's name"),
    ("1ABC: x", "env", "'1ABC' is not"),
    ('NAME: "a\\0b"', "env.NAME", "holds a NUL character"),
    ("NAME: [a]", "env.NAME", "expected text or a number"),
    ("NAME: true", "env.NAME", "expected text or a number"),
])
def test_recipe_env_entries_are_validated(entry, field, message, tmp_path, monkeypatch):
    recipe, parse = _recipe(tmp_path, f"max_steps: 1\nenv:\n  {entry}\n", monkeypatch=monkeypatch)
    with pytest.raises(InputError, match=rf"^{recipe}:3: {field}: .*{message}"):
        parse()


def test_recipe_env_entries_that_are_fine_are_set(tmp_path, monkeypatch):
    monkeypatch.delenv("I54_THREADS", raising=False)
    _, parse = _recipe(tmp_path, "max_steps: 1\nenv:\n  I54_THREADS: 2\n", "--use_cpu", "true",
                        monkeypatch=monkeypatch)
    parse()
    import os

    assert os.environ.pop("I54_THREADS") == "2"


@pytest.mark.parametrize("text,field", [
    ('output_dir: "out\\0/x"\n', "output_dir"),
    ('train_data_path: "a\\0.json"\n', "train_data_path"),
    ('run_name: "r\\0"\n', "run_name"),
])
def test_nul_in_a_recipe_string_is_refused(text, field, tmp_path, monkeypatch):
    recipe, parse = _recipe(tmp_path, text, monkeypatch=monkeypatch)
    with pytest.raises(InputError, match=rf"^{recipe}:1: {field}: holds a NUL character"):
        parse()


def test_nul_in_a_suite_string_is_refused(suite_dir):
    proc, before = _suite(suite_dir, 'wandb_project: "p\\0q"\n' + SPY)
    assert_one_line(proc, "suite.yaml:3: wandb_project: holds a NUL character")
    assert_unchanged(before, suite_dir)


# ----------------------------------------------------------------------------------------------- 3 credentials by field name

@pytest.mark.parametrize("text,field", [
    ("backend_options:\n  extra_body: {access_token: TOKENVALUE123}\n", "backend_options.extra_body.access_token"),
    ("backend_options:\n  extra_headers: {Authorization: 'Bearer TOKENVALUE123'}\n",
     "backend_options.extra_headers.Authorization"),
    ("backend_options:\n  extra_body: {client_secret: TOKENVALUE123}\n", "backend_options.extra_body.client_secret"),
    ("backend_options:\n  extra_headers: {X-Api-Key: TOKENVALUE123}\n", "backend_options.extra_headers.X-Api-Key"),
])
def test_a_credential_field_in_a_suite_mapping_is_refused_before_anything_is_written(text, field, suite_dir):
    proc, before = _suite(suite_dir, text + SPY)
    line = assert_one_line(proc, f"{field}: a key is never read from a file")
    assert "TOKENVALUE123" not in proc.stderr + proc.stdout and "TOKENVALUE123" not in line
    assert_unchanged(before, suite_dir)
    assert not (suite_dir / "out").exists()  # suite_settings.json is not written


def test_a_credential_field_given_through_set_is_refused(suite_dir):
    proc, before = _suite(suite_dir, SPY, "--set", "backend_options.extra_body.access_token=TOKENVALUE123")
    assert_one_line(proc, "backend_options.extra_body.access_token: a key is never read from a file")
    assert "TOKENVALUE123" not in proc.stderr + proc.stdout
    assert not (suite_dir / "out").exists()
    assert_no_canary(suite_dir, proc.stdout, proc.stderr)


def test_vocabulary_tokens_and_key_sources_are_not_credentials():
    from cli.secrets import is_credential_field

    assert not any(map(is_credential_field, ["pad_token", "eos_token", "api_key_env", "max_tokens", "max_new_tokens",
                                             "judge_api_key_env", "tokenizer", "keys"]))
    assert all(map(is_credential_field, ["access_token", "Authorization", "Proxy-Authorization", "X-Api-Key",
                                         "client_secret", "cookie", "hub_token", "password"]))


# ----------------------------------------------------------------------------------------------- 2 the launcher's ending

def _launched(tmp_path, launcher, *args):
    import os
    import subprocess

    recipe = tmp_path / "r.yaml"
    recipe.write_text((ROOT / "recipes" / "demo" / "sft.yaml").read_text())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_API_KEY": CANARY}
    before = snapshot(tmp_path)
    proc = subprocess.run([*launcher, "--config_file", str(ROOT / "accelerate_configs" / "cpu.yaml"),
                           str(ROOT / "train" / "sft.py"), str(recipe), *args],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert_unchanged(before, tmp_path)
    return proc


def test_the_documented_launch_command_ends_in_our_one_line_without_the_key(tmp_path):
    # the case: through `accelerate launch` the refusal was followed by CalledProcessError's traceback,
    # which prints the child's argv, key included. The documented command (launch/run.py, accelerate's own
    # launcher) adds nothing to the child's line and exits with its status.
    proc = _launched(tmp_path, [sys.executable, str(ROOT / "launch" / "run.py")], "--run_name", f"run-{CANARY}")
    line = assert_one_line(proc, "error: command line: --run_name: holds the value of WANDB_API_KEY (not shown)")
    assert CANARY not in proc.stdout + proc.stderr and line.startswith("error: ")


def test_plain_accelerate_launch_prints_the_argv_which_is_why_it_is_not_the_documented_command(tmp_path):
    proc = _launched(tmp_path, [sys.executable, "-m", "accelerate.commands.launch"], "--run_name", f"run-{CANARY}")
    assert proc.returncode == 1 and "CalledProcessError" in proc.stderr and CANARY in proc.stderr  # outside: docs


def test_the_launcher_takes_the_status_of_torch_s_failed_child():
    import subprocess

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    sys.path.insert(0, str(ROOT / "launch"))
    try:
        from run import child_status
    finally:
        sys.path.remove(str(ROOT / "launch"))
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file="/nonexistent")
    assert child_status(ChildFailedError("train/sft.py", {0: failure})) == 2
    assert child_status(subprocess.CalledProcessError(130, ["x"])) == 130
    assert child_status(ValueError("accelerate's own")) is None


# ----------------------------------------------------------------------------------------------- 4 every setting before the model loads

@pytest.mark.parametrize("args,field,message", [
    (["--report_to", "bogus"], "report_to", "unknown integration 'bogus'"),
    (["--report_to", "tensorboard"], "report_to", "tensorboard is not installed"),
    (["--attn_implementation", "bogus"], "attn_implementation", "bogus"),
    (["--lr_scheduler_kwargs", '{"bogus": 1}'], "lr_scheduler_kwargs", "refuses them.*bogus"),
], ids=["report_to-bogus", "report_to-tensorboard", "attn-bogus", "scheduler-kwargs"])
def test_settings_are_checked_before_the_model_loads(args, field, message, tmp_path, synthetic_dir, tiny_model_dir):
    import re

    import forked_python
    from test_bad_inputs_train import ENV, Case

    pytest.importorskip("wandb")
    case = Case(tmp_path, synthetic_dir, tiny_model_dir)
    case.args = args
    before = snapshot(tmp_path)
    proc = forked_python.run(case.train_command(), capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    line = assert_one_line(proc, f": {field}: ")
    assert re.search(message, line), line
    assert_unchanged(before, tmp_path)
    assert not case.out.exists()


@pytest.mark.parametrize("text,message", [
    ("generation_kwargs: {max_new_tokens: -1}\n", r"generation_kwargs: max_new_tokens: must be in \[1, 2147483647\], got -1"),
    ("generation_kwargs: {top_p: 5.0}\n", r"generation_kwargs: top_p: must be in \(0, 1\], got 5.0"),
])
def test_grpo_generation_kwargs_are_judged_by_the_number_table(text, message, tmp_path, monkeypatch):
    from trl import ModelConfig

    from losses.grpo_trainer import VisionGRPOConfig
    from train.common import SpyTuneArguments, parse_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    monkeypatch.setattr(sys, "argv", ["grpo.py", str(recipe), "--train_data_path", "d.json", "--image_folder", "."])
    with pytest.raises(InputError, match=rf"{recipe}: {message}"):
        parse_recipe(SpyTuneArguments, VisionGRPOConfig, ModelConfig)


@pytest.mark.parametrize("name,text", [("min_pixels", "100000000000000000000"),
                                       ("max_new_tokens", "100000000000000000000"), ("min_pixels", "1e20")])
def test_eval_pixel_and_token_options_have_an_upper_bound(name, text):
    import argparse

    from cli.numbers import option

    with pytest.raises(argparse.ArgumentTypeError):
        option(name)(text)


def test_the_eval_clis_use_the_table_for_pixels_and_tokens(tmp_path):
    for args in (["--min-pixels", "100000000000000000000"], ["--max-new-tokens", "100000000000000000000"]):
        proc = run_module("eval", "spy", "generate", *args, cwd=tmp_path)
        assert_one_line(proc, args[0], "must be")


def test_an_image_the_processor_would_refuse_is_refused_when_the_data_is_validated(tmp_path):
    from cli.errors import check_image

    Image.new("RGB", (6000, 28), "red").save(tmp_path / "wide.png")
    with pytest.raises(InputError, match=r"6000x28 pixels: an aspect ratio over 200:1"):
        check_image(tmp_path / "wide.png")
    Image.new("RGB", (5000, 28), "red").save(tmp_path / "ok.png")
    check_image(tmp_path / "ok.png")


# ----------------------------------------------------------------------------------------------- 5 the writer for every file of a run

def _run_folder(tmp_path, monkeypatch):
    from store.runs import mark_folder

    monkeypatch.setattr(sys, "argv", ["train/sft.py"])
    out = tmp_path / "out"
    out.mkdir()
    mark_folder(out, "train/sft.py")
    return out


@pytest.mark.parametrize("where", ["config.json", "checkpoint-1", "checkpoint-1/model.safetensors"])
def test_a_link_in_the_run_folder_is_refused_before_transformers_saves(where, tmp_path, monkeypatch):
    from losses.checkpointing import guarded_save

    out = _run_folder(tmp_path, monkeypatch)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (out / "checkpoint-1").mkdir(exist_ok=where != "checkpoint-1")
    if where == "checkpoint-1":
        (out / "checkpoint-1").rmdir()
    (out / where).symlink_to(outside)
    with pytest.raises(InputError, match=rf"^{out / where}: is a symbolic link in the run's output folder"):
        with guarded_save(out):
            raise AssertionError("the save ran")
    assert not any(outside.iterdir())


def test_a_hard_link_in_the_run_folder_is_refused_before_transformers_saves(tmp_path, monkeypatch):
    # a planted hard link to a user's file: transformers' save opens config.json for writing in place, which would
    # rewrite the user's file through its other name
    from losses.checkpointing import guarded_save

    out = _run_folder(tmp_path, monkeypatch)
    users = tmp_path / "users-notes.txt"
    users.write_text("mine\n")
    (out / "checkpoint-1").mkdir()
    os.link(users, out / "checkpoint-1" / "config.json")
    with pytest.raises(InputError, match=rf"^{out / 'checkpoint-1' / 'config.json'}: is a hard link \(2 names\)"):
        with guarded_save(out):
            raise AssertionError("the save ran")
    assert users.read_text() == "mine\n"


def test_a_folder_that_is_no_longer_the_run_s_is_not_saved_into(tmp_path, monkeypatch):
    from losses.checkpointing import guarded_save
    from store.runs import mark_folder

    out = _run_folder(tmp_path, monkeypatch)
    mark_folder(out, "train.demo")
    with pytest.raises(InputError, match="is no longer this run's output folder"):
        with guarded_save(out):
            raise AssertionError("the save ran")


def test_every_trainer_saves_through_the_guard():
    from losses.checkpointing import HubFormatResumeMixin
    from losses.grpo_trainer import VisionGRPOTrainer
    from losses.vision_dpo_trainer import VisionDPOTrainer

    for trainer in (VisionGRPOTrainer, VisionDPOTrainer):
        assert trainer._save_checkpoint is HubFormatResumeMixin._save_checkpoint
        assert trainer.save_model is HubFormatResumeMixin.save_model


def test_a_user_folder_with_a_checkpoint_named_file_is_not_taken_over(tmp_path, synthetic_dir, tiny_model_dir):
    # the case: any entry named checkpoint-* skipped the "folder of your files" refusal
    import forked_python
    from test_bad_inputs_train import ENV, Case

    case = Case(tmp_path, synthetic_dir, tiny_model_dir)
    case.out.mkdir()
    (case.out / "checkpoint-notes.txt").write_text("mine\n")
    (case.out / "README.md").write_text("my readme\n")
    before = snapshot(tmp_path)
    proc = forked_python.run(case.train_command(), capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert_one_line(proc, "holds files not made by this command", "--output_dir")
    assert_unchanged(before, tmp_path)


def test_the_hub_upload_list_holds_regular_files_only(tmp_path):
    from train.card import published_files

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "secret.txt").write_text("outside")
    (tmp_path / "out" / "notes.txt").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "x.txt").write_text("outside")
    (tmp_path / "out" / "sub").symlink_to(tmp_path / "linked")
    assert sorted(published_files(tmp_path / "out")) == ["model.safetensors"]


@pytest.mark.parametrize("code,cause", [(28, "no space left on the device"), (27, "file too large")])
def test_a_fault_during_a_save_is_one_line(code, cause, tmp_path, monkeypatch, capsys):
    from safetensors import SafetensorError

    from cli.entry import run_main
    from losses.checkpointing import guarded_save

    out = _run_folder(tmp_path, monkeypatch)

    def save():
        with guarded_save(out):
            raise SafetensorError(f'Error while serializing: IoError(Os {{ code: {code}, kind: StorageFull, '
                                  'message: "..." }})')

    assert run_main(save) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out}: {cause}"), lines


def test_an_input_that_vanished_mid_run_is_one_line(tmp_path, capsys):
    from cli.entry import run_main

    def read():
        return open(tmp_path / "images" / "gone.png", "rb")

    assert run_main(read) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "gone.png: no such file or directory" in lines[0], lines


# ----------------------------------------------------------------------------------------------- 6 W&B's console capture

WANDB_CAPTURE = """
import sys
from cli.secrets import guard_streams, hook_console_capture
guard_streams()
if sys.argv[1] == "hooked":
    hook_console_capture()
from wandb.sdk.lib import console_capture
got = []
console_capture.capture_stdout(lambda data, n: got.append(data[:n]))
print("the key is " + __import__("os").environ["MY_SERVICE_TOKEN"], flush=True)
open("captured.txt", "w").write(repr(got))  # not through the scrubbing streams
"""


@pytest.mark.parametrize("hooked", [True, False], ids=["hooked", "unhooked"])
def test_wandb_console_capture_receives_only_scrubbed_text(hooked, tmp_path):
    import os
    import subprocess

    pytest.importorskip("wandb")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MY_SERVICE_TOKEN": CANARY}
    proc = subprocess.run([sys.executable, "-c", WANDB_CAPTURE, "hooked" if hooked else "raw"], capture_output=True,
                          text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert CANARY not in proc.stdout and "<redacted MY_SERVICE_TOKEN>" in proc.stdout  # the terminal
    # W&B's callback: scrubbed when the capture is hooked below the scrubber; the raw text otherwise (the case)
    captured = (tmp_path / "captured.txt").read_text()
    assert (CANARY in captured) is (not hooked) and ("<redacted MY_SERVICE_TOKEN>" in captured) is hooked, captured


# ----------------------------------------------------------------------------------------------- 7 a run whose weights diverge

def test_grpo_whose_weights_diverge_stops_in_one_line(tmp_path, synthetic_dir, tiny_model_dir, capsys):
    # the issue's case: `--learning_rate 1e30` on GRPO ended in torch's sampling traceback ("probability tensor
    # contains either inf, nan or element < 0") at the generation after the first step, before any loss existed.
    # The real trainer and generation; a reward by the completion's place in its group, so the first step has a
    # gradient (a random tiny model's answers all score alike under the rule judge)
    from test_grpo import G, make_grpo_trainer

    from cli.entry import run_main

    def by_place(completions, **_):
        return [float(i % G) for i in range(len(completions))]

    trainer, _ = make_grpo_trainer(tiny_model_dir, synthetic_dir, tmp_path, rewards=[by_place], general_fraction=0,
                                   learning_rate=1e30, warmup_steps=0, max_steps=2, max_completion_length=4,
                                   save_strategy="no", disable_tqdm=True, beta=0.0)
    capsys.readouterr()
    assert run_main(trainer.train) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # the others: the run's info lines
    assert "Traceback" not in err and len(errors) == 1 and err.strip().endswith(errors[0]), err
    assert errors[0].startswith("error: training stopped at step 2: the model's next-token probabilities are not "
                                "finite after step 1") and "a learning rate too high?" in errors[0], errors
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_link_planted_during_training_is_refused_at_the_next_save(tmp_path, synthetic_dir, tiny_model_dir,
                                                                    monkeypatch):
    # end to end: train/sft.py's main, its real trainer and saves; between step 2 and its checkpoint a link is
    # planted at OUT/checkpoint-2 pointing outside the run's folder (a TrainerCallback added when the run attaches
    # its own: on_step_end runs before the step's save). The save is refused in one line, nothing written there.
    from test_hardening_runtime import in_process, recipe_argv
    from transformers import TrainerCallback

    from train import sft
    from train.card import attach

    out, outside = tmp_path / "out", tmp_path / "elsewhere"
    outside.mkdir()

    class Plant(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                (out / "checkpoint-2").symlink_to(outside, target_is_directory=True)

    def attach_and_plant(trainer, *args):
        attach(trainer, *args)
        trainer.add_callback(Plant())

    monkeypatch.setattr(sft, "attach", attach_and_plant)
    monkeypatch.setattr(sys, "argv", ["train/sft.py", *recipe_argv(
        tiny_model_dir, synthetic_dir, out, "--max_steps", "3", "--save_total_limit", "null", "--save_steps", "1")])
    proc = in_process(sft.main)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr[-3000:]
    assert errors[0] == (f"error: {out / 'checkpoint-2'}: is a symbolic link in the run's output folder; the save "
                         "is refused (it would write where the link points): remove it and resume"), errors
    assert proc.stderr.strip().endswith(errors[0])
    assert not any(outside.iterdir())  # nothing written through the link
    assert (out / "checkpoint-1" / "trainer_state.json").is_file()  # the save before it, complete
    assert not (out / "model.safetensors").exists() and not (out / "checkpoint-3").exists()


# ----------------------------------------------------------------------------------------------- 8 property tests

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_fuzz import bounded  # noqa: E402

NAMES = st.text("abcxyz-_.0123456789", min_size=1, max_size=8).filter(lambda n: n not in (".", ".."))
CREDENTIAL_KEYS = st.sampled_from(["access_token", "Authorization", "X-Api-Key", "client_secret", "password",
                                   "hub_token", "Proxy-Authorization", "my_credentials", "api_key", "cookie"])


@bounded(25)
@given(path=st.lists(st.sampled_from(["extra_body", "extra_headers", "options", "nested", "a-b"]), max_size=4),
       key=CREDENTIAL_KEYS, in_list=st.booleans())
def test_a_credential_key_at_any_depth_of_a_suite_mapping_is_refused(path, key, in_list):
    from cli.secrets import refuse_in_config

    value = {key: "TOKENVALUE123"}
    for part in reversed(path):
        value = {part: [value] if in_list else value}
    with pytest.raises(InputError) as raised:
        refuse_in_config("suite.yaml", {"backend_options": value})
    message = str(raised.value)
    assert key in message and "a key is never read from a file" in message and "TOKENVALUE123" not in message


@bounded(25)
@given(parts=st.lists(NAMES, min_size=1, max_size=3), to_file=st.booleans())
def test_a_link_anywhere_below_a_run_folder_is_refused_at_the_save(parts, to_file, tmp_path_factory):
    import shutil

    from losses.checkpointing import guarded_save
    from store.runs import MARKER, mark_folder, training_command

    if parts[0] == MARKER:
        parts = ["x" + parts[0], *parts[1:]]
    root = tmp_path_factory.mktemp("links")
    out = root / "out"
    out.mkdir()
    mark_folder(out, training_command())
    outside = root / "elsewhere"
    outside.mkdir()
    target = outside / "f.txt" if to_file else outside
    if to_file:
        target.write_text("theirs\n")
    link = out.joinpath(*parts)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    try:
        with pytest.raises(InputError, match=f"^{link}: is a symbolic link in the run's output folder"):
            with guarded_save(out):
                raise AssertionError("the save ran")
        assert sorted(p.name for p in outside.iterdir()) == (["f.txt"] if to_file else [])
    finally:
        shutil.rmtree(root)
