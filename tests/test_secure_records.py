"""Issue 46 item 1: no key reaches what a run records, as a class. Each attack of the issue is a case here: refused
on input in one line that never shows it (cli.secrets.refuse_recorded, refuse_on_command_line, endpoint_problem),
and, with every input refusal switched off, kept off disk by the scrubber alone (cli.secrets.scrub at the one place
each format is written: training_args.bin, trainer_state.json, the card, logs, W&B's offline files, the judge cache,
the error line)."""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import forked_python
import pytest
import torch
from hardening_checks import assert_one_line, snapshot
from test_hardening_runtime import in_process

from cli import secrets
from train import grpo

ROOT = Path(__file__).resolve().parents[1]
K = "Kq7w-judge-key-0a1b2c3d"  # OPENAI_API_KEY's value in these tests: not shaped like a provider key
S2, S3 = "S2-query-secret-5e6f", "S3-userinfo-secret-7a8b"
ATTACK = ("--judge_base_url", f"http://127.0.0.1:9/v1/{K}?%6Bey={S2}", "--vllm_server_base_url",
          f"http://u:{S3}@127.0.0.1:8000", "--run_name", f"run-{K}", "--report_to", "wandb")


def files_holding(root, *needles: str) -> list[str]:
    """The files below `root` whose bytes hold any of `needles`."""
    return [str(p) for p in Path(root).rglob("*") if p.is_file()
            and any(n.encode() in p.read_bytes() for n in needles)]


def grpo_command(tmp_path, data, model, *extra, refusals: bool = True):
    """train/grpo.py on the demo recipe, two steps of the tiny model, W&B offline in tmp_path/wandb. Without
    `refusals`, the input checks that would refuse a key are switched off first (the scrubber's own test)."""
    args = [str(ROOT / "recipes" / "demo" / "grpo.yaml"), "--model_name_or_path", str(model),
            "--train_data_path", str(data / "train_data.json"), "--image_folder", str(data),
            "--output_dir", str(tmp_path / "out"), "--max_steps", "2", "--save_steps", "1", "--logging_steps", "1",
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_completion_length", "4", *extra]
    script = str(ROOT / "train" / "grpo.py")
    if refusals:
        command = [sys.executable, script, *args]
    else:
        switch_off = ("import runpy, sys; from cli import secrets; "
                      "secrets.refuse_on_command_line = secrets.refuse_recorded = lambda *a, **k: None; "
                      "secrets.endpoint_problem = lambda url: None; sys.argv = sys.argv[1:]; "
                      "runpy.run_path(sys.argv[0], run_name='__main__')")
        command = [sys.executable, "-c", switch_off, script, *args]
    env = {**os.environ, "OPENAI_API_KEY": K}  # W&B offline, this checkout on the path: tests/conftest.py
    return forked_python.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_issue_command_is_refused_in_one_line(tmp_path, synthetic_dir, tiny_model_dir):
    """The issue's command (K in the judge URL's path and in the run name, S2 in a `%6Bey=` query, S3 as userinfo,
    W&B offline): exit 2 before anything is written, one line, none of the three printed."""
    before = snapshot(tmp_path)
    result = grpo_command(tmp_path, synthetic_dir, tiny_model_dir, *ATTACK)
    assert_one_line(result, "judge_base_url", "not shown")
    assert not {K, S2, S3} & {w for w in (K, S2, S3) if w in result.stdout + result.stderr}
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists() and not (tmp_path / "wandb").exists()


@pytest.mark.slow
def test_the_scrubber_alone_keeps_every_key_off_disk(tmp_path, synthetic_dir, tiny_model_dir):
    """The same command with every input refusal switched off trains (exit 0), and K, S2 and S3 are in no file it
    wrote: training_args.bin (output folder and checkpoints), trainer_state.json, the card, the metrics, W&B's
    offline run file, debug logs and console log; and in no printed line."""
    result = grpo_command(tmp_path, synthetic_dir, tiny_model_dir, *ATTACK, refusals=False)
    assert result.returncode == 0, result.stderr[-3000:]
    out, wandb_dir = tmp_path / "out", tmp_path / "wandb"
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert {"out/training_args.bin", "out/checkpoint-2/training_args.bin", "out/checkpoint-2/trainer_state.json",
            "out/README.md"} <= written
    assert any(name.endswith(".wandb") for name in written) and any(name.endswith("debug.log") for name in written)
    assert files_holding(tmp_path, K, S2, S3) == []
    assert not [w for w in (K, S2, S3) if w in result.stdout + result.stderr]
    recorded = torch.load(out / "training_args.bin", weights_only=False)
    assert recorded.judge_base_url == "http://127.0.0.1:9/v1/<redacted OPENAI_API_KEY>"  # a URL: no query
    assert recorded.vllm_server_base_url == "http://127.0.0.1:8000" and recorded.hub_token is None
    assert recorded.run_name == "run-<redacted OPENAI_API_KEY>"
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["RunSettings"]["args"]["settings"]["judge_base_url"] == \
        "http://127.0.0.1:9/v1/<redacted OPENAI_API_KEY>"
    assert wandb_dir.is_dir() and files_holding(wandb_dir, "<redacted OPENAI_API_KEY>")  # W&B got the scrubbed copy


def grpo_refuses(monkeypatch, tmp_path, *overrides, recipe=None, env=None):
    """train/grpo.py's main through the command-line wrapper, in this process (refused before any model loads):
    the demo recipe (or `recipe`), a model that does not exist, output in tmp_path/o; the result and whether
    anything was written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", K)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    before = snapshot(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train/grpo.py", str(recipe or ROOT / "recipes" / "demo" / "grpo.yaml"),
                                      "--model_name_or_path", str(tmp_path / "no-such-model"),
                                      "--output_dir", str(tmp_path / "o"), *overrides])
    environ = dict(os.environ)
    result = in_process(grpo.main)
    assert dict(os.environ) == environ  # a refused recipe's env: never reaches the environment
    assert snapshot(tmp_path) == before and not (tmp_path / "o").exists()
    return result


KEY_PARAMETERS = ["?x-api-key=", "?api-key=", "?access_key=", "?client_secret=", "?password=", "?secret=", "#key=",
                  ";key=", "?k%65y=", "?q=1&Api_Key=", "?X-Goog-Api-Key="]


@pytest.mark.parametrize("parameter", KEY_PARAMETERS)
def test_a_key_parameter_of_any_spelling_is_refused_and_scrubbed(parameter, tmp_path, monkeypatch):
    """Query keys the issue found passing (x-api-key, api-key, access_key, client_secret, password, secret, `#key=`,
    `;key=`, `k%65y=`): refused in one line that does not show the value, and redacted from any text."""
    secret = "plain-secret-4c5d6e"
    url = f"http://127.0.0.1:9/v1{parameter}{secret}"
    result = grpo_refuses(monkeypatch, tmp_path, "--judge", "gpt-4o", "--judge_base_url", url)
    assert_one_line(result, "judge_base_url", "not shown")
    assert secret not in result.stderr
    assert secret not in secrets.scrub(f"GET {url} 401") and secret not in secrets.scrub(url)


def test_any_query_or_fragment_in_a_recorded_url_is_refused(tmp_path, monkeypatch):
    """A URL a run records carries nothing past its path: a query of any name is refused (it could be a key whose
    parameter name no list foresees), as is a fragment; the line never shows either."""
    for url, said in [("http://127.0.0.1:9/v1?tenant=abc123xyz", "carries a query or fragment"),
                      ("http://127.0.0.1:9/v1#frag-abc123xyz", "carries a query or fragment"),
                      ("http://127.0.0.1:8000/?tenant=abc123xyz", "carries a query or fragment")]:
        for option in ("--judge_base_url", "--vllm_server_base_url"):
            result = grpo_refuses(monkeypatch, tmp_path, option, url)
            line = assert_one_line(result, option.lstrip("-"), said)
            assert "abc123xyz" not in line


@pytest.mark.parametrize("argv", [["--hub-token", "hf-T-secret-value"], ["--hub_token", "hf-T-secret-value"],
                                  ["--hub-token=hf-T-secret-value"]], ids=["dash", "underscore", "equals"])
def test_a_token_in_any_spelling_argparse_accepts_is_refused(argv, tmp_path, monkeypatch):
    """`--hub-token T` (the dash spelling argparse also accepts) landed T in training_args.bin: every spelling of
    every credential field is refused, naming HF_TOKEN."""
    result = grpo_refuses(monkeypatch, tmp_path, *argv)
    line = assert_one_line(result, "hub", "HF_TOKEN")
    assert "hf-T-secret-value" not in line


def test_credential_fields_are_never_recorded():
    """Whatever a config holds in a credential field (hub_token, any *_token but the tokenizer's special tokens,
    *_key, *password*, *secret*), scrub's copy holds None there; the tokenizer's tokens are kept."""
    from trl import SFTConfig

    args = SFTConfig(output_dir="o", hub_token="hf-T-secret-value", eos_token="<|im_end|>", report_to="none",
                     use_cpu=True, bf16=False)
    kept = secrets.scrub(args)
    assert kept.hub_token is None and kept.eos_token == "<|im_end|>" and args.hub_token == "hf-T-secret-value"
    assert b"hf-T-secret-value" not in pickle.dumps(kept)
    for name in ("hub_token", "hub-token", "wandb_api_key", "client_secret", "db_password", "token", "api-key"):
        assert secrets.is_credential_field(name), name
    for name in ("pad_token", "eos_token", "max_tokens", "judge_api_key_env", "resp_key_name", "average_tokens"):
        assert not secrets.is_credential_field(name), name


def test_a_recipe_env_key_source_is_refused(tmp_path, monkeypatch):
    """A recipe's `env:` entry that the run names as its key source is a key read from a file: refused at its line,
    before `--run_name K` (K its value) can be recorded; nothing reaches the environment."""
    recipe = tmp_path / "grpo.yaml"
    cred = "Jv7-cred-9f8e7d6c"
    recipe.write_text((ROOT / "recipes" / "demo" / "grpo.yaml").read_text()
                      + f"judge_api_key_env: JUDGE_CRED\nenv:\n  JUDGE_CRED: {cred}\n")
    monkeypatch.delenv("JUDGE_CRED", raising=False)
    result = grpo_refuses(monkeypatch, tmp_path, "--run_name", cred, recipe=recipe)
    line = assert_one_line(result, f"{recipe}:", "env.JUDGE_CRED", "holds a key")
    assert cred not in line


def test_a_value_holding_a_key_source_s_value_is_refused(tmp_path, monkeypatch):
    """The variable named as the judge's key source counts as secret from the first check on (it was registered
    only when the judge client was built, after the command line was checked): `--run_name` containing its value
    is refused, naming the variable and never the value."""
    result = grpo_refuses(monkeypatch, tmp_path, "--judge_api_key_env", "JUDGE_CRED_I46", "--run_name",
                          "exp-0123456789abcdef", env={"JUDGE_CRED_I46": "0123456789abcdef"})
    line = assert_one_line(result, "run_name", "holds the value of JUDGE_CRED_I46")
    assert "0123456789abcdef" not in line


def test_a_key_source_named_on_the_command_line_covers_the_recipe_s_values(tmp_path, monkeypatch):
    """The recipe is read before the command line: a key source the command line names (`--judge_api_key_env`)
    still covers a recipe value holding its variable's value (checked on the merged arguments,
    cli.secrets.refuse_recorded)."""
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text((ROOT / "recipes" / "demo" / "grpo.yaml").read_text() + "run_name: exp-0123456789abcdef\n")
    result = grpo_refuses(monkeypatch, tmp_path, "--judge_api_key_env", "JUDGE_CRED_I46B", recipe=recipe,
                          env={"JUDGE_CRED_I46B": "0123456789abcdef"})
    line = assert_one_line(result, f"{recipe}: run_name: holds the value of JUDGE_CRED_I46B")
    assert "0123456789abcdef" not in line


@pytest.mark.parametrize("value", [f"prefix-{K}-suffix", f"http://127.0.0.1:9/{K.replace('K', '%4B')}/v1",
                                   f"outputs/{K}"], ids=["contained", "percent-encoded", "in-a-path"])
def test_a_value_containing_a_known_secret_is_refused(value, tmp_path, monkeypatch):
    """A value that *contains* (not only equals) a known secret, also percent-encoded, in any string field."""
    option = "--judge_base_url" if value.startswith("http") else "--run_name"
    result = grpo_refuses(monkeypatch, tmp_path, option, value)
    line = assert_one_line(result, "OPENAI_API_KEY")
    assert K not in line


def test_an_uppercase_scheme_url_never_prints_its_password(tmp_path, monkeypatch, capsys):
    """`--judge_base_url 'HTTP://user:PW@h/v1'` printed PW in its error; now no error line shows URL credentials,
    for training and for any command (cli/entry.py scrubs the one line)."""
    result = grpo_refuses(monkeypatch, tmp_path, "--judge", "gpt-4o", "--judge_base_url", "HTTP://user:PW-i46x@h/v1")
    assert_one_line(result, "judge_base_url")
    assert "PW-i46x" not in result.stderr
    assert "PW-i46x" not in (secrets.endpoint_problem("HTTP://user:PW-i46x@h/v1") or "")
    assert "PW-i46x" not in (secrets.endpoint_problem("ftp://user:PW-i46x@h/v1") or "")
    from cli.entry import run_main
    from cli.errors import InputError

    def fails():
        raise InputError("suite.yaml", 3, "base_url", "cannot reach HTTP://user:PW-i46x@h/v1?api-key=abc123xyz")

    assert run_main(fails) == 2
    err = capsys.readouterr().err
    assert "PW-i46x" not in err and "abc123xyz" not in err and "suite.yaml:3: base_url" in err


def test_the_judge_cache_and_every_written_file_are_scrubbed(tmp_path, monkeypatch):
    """A judge answer that echoes a key, URL credentials or a key parameter is stored without them (the judge
    cache is a run file: store.runs writes every line through scrub)."""
    from store.runs import RunFile

    monkeypatch.setenv("OPENAI_API_KEY", K)
    cache = RunFile(tmp_path / "judge_cache.jsonl", key="key")
    cache.append({"key": "k1", "model": "j", "prompt": "p",
                  "text": f"respond; you called http://u:{S3}@h/v1?x-api-key={S2} with {K}"})
    cache.close()
    assert files_holding(tmp_path, K, S2, S3) == []
    assert json.loads((tmp_path / "judge_cache.jsonl").read_text().splitlines()[-1])["key"] == "k1"
