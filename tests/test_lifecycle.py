"""From a trained checkpoint to a published model: one push with our card (against a local Hub stand-in),
the card's content, LoRA adapters that load from anywhere and merge, and trying the model with train.chat."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import forked_python
import pytest
from hub_server import HubServer
from huggingface_hub import ModelCard

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_env(hub, tmp_path) -> dict:
    """The test's environment with the Hub at the stand-in: the offline switches unset, a fresh HF cache."""
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
    return {**env, "HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_stand_in", "HF_HOME": str(tmp_path / "hf-home")}


def train(script, recipe, tiny_model_dir, synthetic_dir, out, *overrides, env=None):
    command = [
        sys.executable, str(ROOT / "train" / f"{script}.py"), str(ROOT / "recipes" / "demo" / f"{recipe}.yaml"),
        "--model_name_or_path", str(tiny_model_dir), "--train_data_path", str(synthetic_dir / "train_data.json"),
        "--image_folder", str(synthetic_dir), "--output_dir", str(out), "--max_steps", "3", "--logging_steps", "1",
        "--per_device_train_batch_size", "2", "--save_steps", "2", "--save_total_limit", "null", *overrides,
    ]
    result = forked_python.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def assert_our_card(text: str, method_tag: str = "nca-p"):
    card = ModelCard(text)
    assert "privacy-align" in card.data.tags and method_tag in card.data.tags and "qwen2_vl" in card.data.tags
    assert "fine-tuned version of" not in text and "## Usage" in text and "## Citation" in text


def check_commits(hub, out, strategy):
    messages = [c["message"] for c in hub.commits]
    assert messages[-1] == "privacy-align: final model"
    if strategy == "every_save":
        assert messages == ["privacy-align: final model"]
    else:
        assert messages[:-1] and all(m.startswith("Training in progress") for m in messages[:-1])
    for commit in hub.commits:
        cards = [text for path, text in commit["files"].items() if path.endswith("README.md")]
        assert cards and all(assert_our_card(text.decode()) is None for text in cards)
    final = hub.commits[-1]["files"]
    weights = "adapter_model.safetensors" if (out / "adapter_config.json").exists() else "model.safetensors"
    assert final[weights] == (out / weights).read_bytes()
    assert "training_args.bin" not in final and not any(p.startswith("checkpoint-") for p in final)
    assert hub.validated  # the card went through the stand-in's metadata check
    # our card, not TRL's, in the run folder and in every checkpoint
    for folder in (out, out / "checkpoint-2", out / "checkpoint-3"):
        assert_our_card((folder / "README.md").read_text())


@pytest.mark.slow
def test_push_to_hub_checkpoint_strategy(tiny_model_dir, synthetic_dir, tmp_path):
    """hub_strategy checkpoint: the Trainer's checkpoint pushes, then our one final publish; every pushed card
    is ours. (The default, one commit, is tested with the LoRA run below.)"""
    out = tmp_path / "run"
    with HubServer() as hub:
        train("nca_p", "nca_p", tiny_model_dir, synthetic_dir, out, "--push_to_hub", "true",
              "--hub_model_id", "me/tiny-nca-p", "--hub_strategy", "checkpoint", env=hub_env(hub, tmp_path))
    check_commits(hub, out, "checkpoint")


def test_card_content(tiny_model_dir, tmp_path):
    """The card built from a run's arguments: Hub base id from a local snapshot, tags from the model type,
    the key recipe values only, reward metrics, versions, and model-index from evaluation results."""
    from huggingface_hub import EvalResult
    from trl import ModelConfig

    from losses.nca_p_trainer import NCAPConfig
    from train.card import build_card, hub_id
    from train.common import SpyTuneArguments

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-VL-7B-Instruct" / "snapshots" / "abc123"
    shutil.copytree(tiny_model_dir, snapshot)
    config = json.loads((snapshot / "config.json").read_text())
    assert hub_id(str(snapshot)) == "Qwen/Qwen2.5-VL-7B-Instruct" and hub_id("Qwen/Qwen2-VL-7B-Instruct")
    assert hub_id(str(tiny_model_dir)) is None
    folder = tmp_path / "out"
    folder.mkdir()
    script = SpyTuneArguments(train_data_path="d.json", image_folder="imgs", dataset_name="SPY-Tune")
    training = NCAPConfig(output_dir=str(folder), beta=0.25, learning_rate=2e-6, hub_model_id="me/qwen-spy-nca-p",
                          report_to=[], bf16=False)
    model = ModelConfig(model_name_or_path=str(snapshot), use_peft=True, lora_r=8, lora_target_modules=["q_proj"])
    history = [{"loss": 1.0, "rewards/margins": 0.5, "step": 1}, {"train_runtime": 3.0, "step": 1}]
    results = [EvalResult(task_type="image-text-to-text", dataset_type="spy-bench", dataset_name="SPY-Bench",
                          metric_type="ics", metric_name="ICS", metric_value=71.5)]
    card = build_card(folder, "nca_p", str(snapshot), script, training, model, history, results,
                      model_type="qwen2_5_vl")
    text = str(card)
    assert card.data.base_model == "Qwen/Qwen2.5-VL-7B-Instruct" and card.data.library_name == "peft"
    assert {"qwen2_5_vl", "nca-p", "lora"} <= set(card.data.tags) and "qwen2-vl" not in card.data.tags
    assert card.data.license == "apache-2.0" and card.data.datasets == ["SPY-Tune"]
    assert text.splitlines()[text.splitlines().index("---", 1) + 2].startswith("# qwen-spy-nca-p: NCA-P")
    assert "beta: 0.25" in text and "lora_r: 8" in text and "rewards/margins | 0.5" in text
    assert "AcceleratorConfig" not in text and "train_runtime" not in text and "hub_token" not in text
    assert "transformers: " in text and "@inproceedings{nca2024" in text
    assert "model-index" in text and card.data.eval_results[0].metric_value == 71.5
    assert config["model_type"] == "qwen2_vl"  # the tiny model; the tag came from model_type given above


@pytest.mark.slow
def test_a_pushed_card_names_no_local_path_and_its_example_runs_as_printed(tiny_model_dir, synthetic_dir, tmp_path):
    """What a push uploads names no path of the machine that trained it (card, configs), the base as a user finds
    it (here a local folder: its name, said to be local), and the card's usage example runs as printed against the
    Hub (the stand-in), on a photo.jpg beside it."""
    from PIL import Image

    out = tmp_path / "sft"
    with HubServer() as hub:
        env = hub_env(hub, tmp_path)
        train("sft", "sft", tiny_model_dir, synthetic_dir, out, "--push_to_hub", "true", "--hub_model_id",
              "me/tiny-sft", env=env)
        files = hub.files("me/tiny-sft")
        local = [str(p) for p in (tmp_path.parents[1], tiny_model_dir, synthetic_dir, ROOT, Path.home())]
        for path, content in files.items():  # the session's temporary folders, the checkout, the home folder
            assert not any(place.encode() in content for place in local), path
        card = ModelCard(files["README.md"].decode())
        assert card.data.base_model is None and card.data.datasets == ["synthetic-spy-tune"]
        assert f"`{tiny_model_dir.name}` (a local model folder, not on the Hub)" in card.text
        snippet = card.text.split("```python\n")[1].split("```")[0]
        assert 'from_pretrained("me/tiny-sft")' in snippet and "photo.jpg" in snippet
        user = tmp_path / "user"
        user.mkdir()
        Image.new("RGB", (56, 56), (200, 40, 40)).save(user / "photo.jpg")
        (user / "example.py").write_text(snippet)
        result = subprocess.run([sys.executable, "example.py"], cwd=user, env=env, capture_output=True, text=True,
                                timeout=600)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr[-3000:]


def test_chat_answers_on_the_tiny_model(tiny_model_dir, synthetic_dir):
    image = next((synthetic_dir / "images").rglob("*.png"))
    command = [sys.executable, "-m", "train.chat", "--model", str(tiny_model_dir), "--image", str(image),
               "--instruction", "Do not reveal anyone's identity.", "--question", "Who is this?",
               "--max-new-tokens", "5"]
    result = forked_python.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    from train.chat import answer

    assert result.stdout.rstrip("\n") == answer(str(tiny_model_dir), str(image), "Do not reveal anyone's identity.",
                                                "Who is this?", 5)
    missing = forked_python.run([*command[:6], "no-such.jpg", *command[7:]], cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no-such.jpg" in missing.stderr


@pytest.mark.slow
def test_lora_adapter_loads_from_anywhere_and_merges(tiny_model_dir, synthetic_dir, tmp_path):
    """Pushed with the defaults (hub_strategy every_save), the run makes one commit: the adapter and our card.
    Trained from a relative base path, the adapter records it absolute, its card says peft, it loads from
    another folder, and merge_lora writes a full model that answers like base + adapter."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    link = tmp_path / "base"
    link.symlink_to(tiny_model_dir)
    out = tmp_path / "lora"
    with HubServer() as hub:
        train("nca_p", "nca_p", os.path.relpath(link, ROOT), synthetic_dir, out, "--use_peft", "true", "--lora_r", "4",
              "--lora_target_modules", "q_proj", "v_proj", "--push_to_hub", "true", "--hub_model_id", "me/tiny-lora",
              env=hub_env(hub, tmp_path))
    check_commits(hub, out, "every_save")
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert Path(adapter_config["base_model_name_or_path"]).is_absolute()  # here: it loads from anywhere
    pushed = json.loads(hub.files("me/tiny-lora")["adapter_config.json"])  # published: no path of this machine
    assert pushed["base_model_name_or_path"] == tiny_model_dir.name  # the base folder's name
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "peft" and "lora" in card.data.tags
    moved = tmp_path / "elsewhere" / "adapter"
    shutil.copytree(out, moved, ignore=shutil.ignore_patterns("checkpoint-*"))
    merged_dir = tmp_path / "merged"
    result = forked_python.run([sys.executable, "-m", "train.merge_lora", str(moved), "--out", str(merged_dir)],
                            cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    merged = AutoModelForImageTextToText.from_pretrained(merged_dir)
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    merged_card = ModelCard.load(merged_dir / "README.md")
    assert merged_card.data.library_name == "transformers" and "lora" not in merged_card.data.tags
    with_adapter = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(tiny_model_dir), moved)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, with_adapter(input_ids=ids).logits, atol=1e-4)
    again = forked_python.run([sys.executable, "-m", "train.merge_lora", str(moved), "--out", str(merged_dir)],
                           cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert again.returncode == 2 and "not empty" in again.stderr


SUITE = """name: test
backend: hf
backend_options: {batch_size: 20, max_new_tokens: 4, device: cpu}
judge: rule
sections:
  spy: {items: spy/questions.json, images: spy, limit: 20}
  spatialtrust: {data: spatialtrust/data.jsonl, synthetic_images: 3, modes: [one-pass]}
  general: {datasets: {mmmu: mmmu, ocrbench: ocrbench, mme: mme}}
"""


def run_suite(*args, env=None):
    result = forked_python.run([sys.executable, "-m", "eval", "suite", *map(str, args)], cwd=ROOT, capture_output=True,
                            text=True, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_suite_evaluates_resumes_and_pushes_model_index(tiny_model_dir, synthetic_dir, tmp_path):
    """One command: SPY-Bench (both settings) and SpatialTrust into results.json, report.md and the PNG; again:
    nothing regenerated (the model is not even loaded), the same results; --push-to-hub writes model-index into
    the repo's card on the Hub stand-in, keeping the card; --wandb logs the metrics (offline run)."""
    from general_fixtures import save

    root = tmp_path / "data"
    root.mkdir()
    (root / "spy").symlink_to(synthetic_dir)
    for benchmark in ("mmmu", "ocrbench", "mme"):
        save(benchmark, root / benchmark)
    config = tmp_path / "suite.yaml"
    config.write_text(SUITE)
    out = tmp_path / "suite"
    first = run_suite("--config", config, "--root", root, "--model", tiny_model_dir, "--out", out)
    results = json.loads((out / "results.json").read_text())
    spy = {(r["setting"], r["metric"]): r for r in results["headline"] if r["benchmark"] == "SPY-Bench"}
    for setting in ("without distractors", "with distractors"):
        for metric in ("ICS", "HMS", "RtA", "AtA"):
            assert isinstance(spy[setting, metric]["value"], float) and spy[setting, metric]["n"] == 20
    overall = [r for r in results["headline"] if r["benchmark"] == "SpatialTrust" and r["metric"] == "overall"]
    assert len(overall) == 1 and overall[0]["n"] == 3
    general = {r["benchmark"]: r for r in results["headline"] if r["benchmark"] in ("MMMU", "OCRBench", "MME")}
    assert {k: v["n"] for k, v in general.items()} == {"MMMU": 3, "OCRBench": 3, "MME": 4}
    composite = {r["metric"]: r["value"] for r in results["headline"] if r["benchmark"] == "SPY composite"}
    assert set(composite) == {"priv", "general", "overall"}
    assert (out / "report.png").stat().st_size > 5_000 and "| SPY-Bench | with distractors | ICS |" in (
        out / "report.md").read_text()
    assert "loading" in first.stdout

    with HubServer() as hub:
        env = {**hub_env(hub, tmp_path), "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
               "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}  # where the sample table's images are staged
        card_dir = tmp_path / "card"
        shutil.copytree(tiny_model_dir, card_dir)
        (card_dir / "README.md").write_text("---\nlicense: apache-2.0\n---\n\n# my model\n")
        subprocess.run([sys.executable, "-c", "import sys; from train.card import publish; "
                        "publish(sys.argv[1], 'me/tiny')", str(card_dir)], cwd=ROOT, env=env, check=True)
        again = run_suite("--config", config, "--root", root, "--model", tiny_model_dir, "--out", out,
                          "--push-to-hub", "me/tiny", "--wandb", "--wandb-project", "suite-test", env=env)
    assert "loading" not in again.stdout
    assert json.loads((out / "results.json").read_text()) == results
    assert [c["message"] for c in hub.commits][-1].startswith("privacy-align: evaluation results")
    card = ModelCard(hub.files("me/tiny")["README.md"].decode())
    assert card.data.license == "apache-2.0" and "# my model" in card.text
    ics = [r for r in card.data.eval_results if r.metric_type == "ics"]
    assert len(ics) == 2 and {r.metric_value for r in ics} == {spy[s, "ICS"]["value"] for s in
                                                               ("without distractors", "with distractors")}
    logged = b"".join(p.read_bytes() for p in (tmp_path / "wandb").rglob("*.wandb"))
    assert b"eval/SPY-Bench/with distractors/ICS" in logged
    # beside the metrics, the sample table (wandb.Table, capped at --wandb-samples) with its images as the run's media
    table = json.loads(next((tmp_path / "wandb").rglob("samples_*.table.json")).read_text())
    assert len(table["data"]) == 20 + 20 + 3 and "image" in table["columns"]  # every sample: fewer than the cap, 100
    assert b"media/images/" in logged
    assert (out / "view" / "index.html").is_file()


def test_suite_refuses_bad_config(tmp_path):
    config = tmp_path / "suite.yaml"
    config.write_text(SUITE.replace("spatialtrust:", "spatial_trust:"))
    result = forked_python.run([sys.executable, "-m", "eval", "suite", "--config", str(config), "--model", "m",
                             "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "sections.spatial_trust" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_suite_with_an_llm_judge_endpoint(tiny_model_dir, synthetic_dir, tmp_path):
    """judge: {model, base_url}: the SPY judge prompts go to an OpenAI-compatible server (here a local one that
    rejects everything), the key from the named environment variable."""
    from chat_server import ChatServer

    with ChatServer(lambda request: "reject") as server:
        config = tmp_path / "suite.yaml"
        config.write_text(f"""backend: hf
backend_options: {{batch_size: 10, max_new_tokens: 3, device: cpu}}
judge: {{model: test-model, base_url: "{server.base_url}", api_key_env: SUITE_TEST_KEY}}
sections:
  spy: {{items: {synthetic_dir}/questions.json, images: {synthetic_dir}, limit: 10,
         settings: [without_distractors]}}
""")
        run_suite("--config", config, "--model", tiny_model_dir, "--out", tmp_path / "out",
                  env={**os.environ, "SUITE_TEST_KEY": "sk-local"})
    assert 0 < len(server.requests) <= 10  # identical prompts are asked once (the judge cache)
    from store.runs import read_jsonl

    judged = read_jsonl(tmp_path / "out" / "spy" / "without_distractors" / "judged.jsonl")
    assert len(judged) == 10 and all(r["judge"] == "test-model" and r["eval_resp"] == "reject" for r in judged)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    rta = next(r for r in results["headline"] if r["metric"] == "AtA")
    assert rta["n"] == 10 and results["sections"]["spy"]["without_distractors"]["exceptions"] == 0
    assert "sk-local" not in "".join(p.read_text() for p in (tmp_path / "out").rglob("*.json*"))
