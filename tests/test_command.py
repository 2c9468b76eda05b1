"""`privacy-align`, the one command on PATH (cli/command.py): every subcommand answers --help, a training run and an
evaluation go through it, a finished run is not trained over silently (train/resume.py check_finished), and a
launcher option goes through `accelerate launch` (launch/run.py: a failed run ends in the child's line and status).

The commands run as `python -m cli.command ...` forked from a preloaded interpreter (tests/forked_python.py), the
installed console script once (it is the same `main`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import forked_python
import pytest

from cli.command import DATA, MODULES, TRAIN, split_launcher

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "privacy-align"


def command(*args, cwd=ROOT):
    return forked_python.run([sys.executable, "-m", "cli.command", *map(str, args)], cwd=cwd, env=dict(os.environ))


def test_the_console_script_is_installed_and_lists_every_command():
    result = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for name in ["train", *MODULES, "data"]:
        assert f"\n  {name} " in result.stdout, name
    bad = subprocess.run([str(SCRIPT), "trian"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: command line: trian: unknown command (did you mean train?) (`privacy-align --help` lists them)"]


@pytest.mark.parametrize("args", [["train"], *[["train", m] for m in TRAIN], *[[name] for name in MODULES], ["data"],
                                  *[["data", kind] for kind in DATA]], ids=" ".join)
def test_every_subcommand_answers_help(args):
    result = command(*args, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout and "Traceback" not in result.stderr
    if args[0] == "train" and len(args) == 2:  # the launcher's options, then the script's own
        assert f"privacy-align train {args[1]} [RECIPE.yaml]" in result.stdout and "--output_dir" in result.stdout


def test_launcher_options_are_split_from_the_recipes():
    assert split_launcher(["r.yaml", "--num_processes", "2", "--max_steps", "3", "--config_file=c.yaml"]) == (
        ["--num_processes", "2", "--config_file=c.yaml"], ["r.yaml", "--max_steps", "3"])


def train_args(tiny_model_dir, synthetic_dir, out, *extra):
    return ["--model_name_or_path", tiny_model_dir, "--train_data_path", synthetic_dir / "train_data.json",
            "--image_folder", synthetic_dir, "--output_dir", out, "--max_steps", "2", "--logging_steps", "1",
            "--per_device_train_batch_size", "2", "--save_steps", "2", *extra]


@pytest.mark.slow
def test_train_then_eval_through_the_command_and_a_finished_run_is_refused(tiny_model_dir, synthetic_dir, tmp_path):
    out = tmp_path / "sft"
    trained = command("train", "sft", ROOT / "recipes/demo/sft.yaml", *train_args(tiny_model_dir, synthetic_dir, out))
    assert trained.returncode == 0, trained.stderr[-3000:]
    history = json.loads((out / "train_metrics.json").read_text())
    assert len([e for e in history if "loss" in e]) == 2 and (out / "model.safetensors").is_file()

    # the same command again: refused in one line, naming the folder and the override; the model is kept
    before = (out / "model.safetensors").stat().st_mtime_ns
    again = command("train", "sft", ROOT / "recipes/demo/sft.yaml", *train_args(tiny_model_dir, synthetic_dir, out))
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: command line: output_dir: {out} holds a finished run (train_metrics.json); name another "
        "--output_dir, or pass --overwrite_output_dir true to train it again from the start"]
    assert (out / "model.safetensors").stat().st_mtime_ns == before

    # a DPO recipe is not trained as NCA
    wrong = command("train", "nca", ROOT / "recipes/demo/dpo.yaml", *train_args(tiny_model_dir, synthetic_dir, out))
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        f"error: {ROOT / 'recipes/demo/dpo.yaml'}: loss_type: sigmoid trains dpo, not nca "
        "(`privacy-align train dpo ...`, or loss_type nca_pair)"]

    # evaluation through the command, on the trained model
    run = tmp_path / "spy.jsonl"
    generated = command("eval", "spy", "generate", "--backend", "hf", "--model", out, "--items",
                        synthetic_dir / "questions.json", "--images", synthetic_dir, "--out", run, "--limit", "4",
                        "--max-new-tokens", "4")
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert len([json.loads(line) for line in run.read_text().splitlines() if '"id"' in line]) >= 4


@pytest.mark.slow
def test_a_launcher_option_goes_through_accelerate_launch(tiny_model_dir, synthetic_dir, tmp_path):
    """Through launch/run.py (accelerate's launcher): the launched script's one line and its exit status 2, not
    accelerate's CalledProcessError traceback, which prints the child's argv (a key in --run_name included)."""
    out = tmp_path / "sft"
    out.mkdir()
    (out / "train_metrics.json").write_text("[]")  # a finished run: the launched script refuses before loading
    result = command("train", "sft", ROOT / "recipes/demo/sft.yaml", "--num_processes", "1", "--config_file",
                     ROOT / "accelerate_configs/cpu.yaml", *train_args(tiny_model_dir, synthetic_dir, out),
                     "--run_name", "launched-run-7f3a")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"error: command line: output_dir: {out} holds a finished run (train_metrics.json); name another "
        "--output_dir, or pass --overwrite_output_dir true to train it again from the start"]
    assert "launched-run-7f3a" not in result.stdout + result.stderr
