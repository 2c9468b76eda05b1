"""Two CPU processes (gloo) through `accelerate launch --config_file accelerate_configs/cpu_2proc.yaml`, the way a
user launches 8 GPUs: 2 processes x per-device batch 2 train exactly like 1 process x batch 4 on the same data order
(same loss and logged metrics per step, same final weights, float32), for every method, with shared vision on and
off, packed (on 2 processes) against unpacked (on 1), full fine-tuning and LoRA, under DDP and DeepSpeed; the precomputed reference is computed once and written once; resume and saving
behave as in one process."""

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import forked_python
import pytest
from safetensors.torch import load_file
from test_train_methods import launch

from store.runs import MARKER

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4
pytestmark = pytest.mark.slow
COMPARED = ("loss", "grad_norm", "learning_rate", "rewards/", "logps/", "logits/", "mean_token_accuracy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_processes(script, recipe, tiny_model_dir, synthetic_dir, out, *overrides, output=None):
    return launch(script, recipe, tiny_model_dir, synthetic_dir, out, "--per_device_train_batch_size", "2",
                  *overrides, config="cpu_2proc.yaml", launcher_args=("--main_process_port", str(free_port())),
                  output=output)


def one_process(script, recipe, tiny_model_dir, synthetic_dir, out, *overrides):
    """The reference: `python train/SCRIPT.py` in one process (the launcher is what the two-process side tests)."""
    return launch(script, recipe, tiny_model_dir, synthetic_dir, out, "--per_device_train_batch_size", "4",
                  *overrides, accelerate=False)


def assert_same_history(a: list[dict], b: list[dict]) -> None:
    steps_a = [e for e in a if "loss" in e]
    steps_b = [e for e in b if "loss" in e]
    assert [e["step"] for e in steps_a] == [e["step"] for e in steps_b] and steps_a
    for x, y in zip(steps_a, steps_b):
        keys = [k for k in x if k.startswith(COMPARED)]
        assert keys and set(keys) == {k for k in y if k.startswith(COMPARED)}
        for k in keys:
            margin = k.replace("accuracies", "margins")
            if margin != k and abs(x.get(margin, 1.0)) < TOL and abs(y.get(margin, 1.0)) < TOL:
                continue  # whether a zero margin (policy = reference, step 1) counts as > 0 is float rounding
            assert x[k] == pytest.approx(y[k], rel=TOL, abs=TOL), (x["step"], k)


def assert_same_weights(a: Path, b: Path, name="model.safetensors") -> None:
    wa, wb = load_file(a / name), load_file(b / name)
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < TOL


def test_cpu_2proc_config_starts_two_gloo_ranks(tmp_path):
    probe = tmp_path / "probe.py"
    # each rank writes its own file: two processes printing to one pipe can interleave their lines
    probe.write_text("import sys\nfrom pathlib import Path\nfrom accelerate import PartialState\n"
                     "import torch.distributed as dist\ns = PartialState(cpu=True)\n"
                     "Path(sys.argv[1], f'rank{s.process_index}').write_text("
                     "f'{s.process_index} {s.num_processes} {s.distributed_type} {dist.get_backend()}')\n")
    result = forked_python.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                                str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"), "--main_process_port",
                                str(free_port()), str(probe), str(tmp_path)], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    ranks = [(tmp_path / f"rank{i}").read_text() for i in range(2)]
    assert ranks == ["0 2 DistributedType.MULTI_CPU gloo", "1 2 DistributedType.MULTI_CPU gloo"]
    assert not (tmp_path / "rank2").exists()


UNPACKED = ("--packed", "false")


@pytest.mark.parametrize("script,recipe,overrides,baseline", [
    ("sft", "sft", (), ()),
    ("dpo", "dpo", (), UNPACKED),
    ("dpo", "nca", ("--shared_vision", "false", *UNPACKED), ()),
    ("nca_p", "nca_p", ("--use_peft", "true", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"),
     ("--shared_vision", "false", *UNPACKED)),
], ids=["sft", "dpo-packed-vs-unpacked", "nca-repeated", "nca_p-packed-lora-vs-repeated"])
def test_two_processes_train_like_one(script, recipe, overrides, baseline, tiny_model_dir, synthetic_dir, tmp_path):
    """`baseline`: what the one process runs in addition (packed on 2 processes against the unpacked path on 1)."""
    steps = ("--max_steps", "2", "--warmup_steps", "0", "--learning_rate", "1e-3")
    a = two_processes(script, recipe, tiny_model_dir, synthetic_dir, tmp_path / "a", *steps, *overrides)
    b = one_process(script, recipe, tiny_model_dir, synthetic_dir, tmp_path / "b", *steps, *overrides, *baseline)
    assert_same_history(a, b)
    lora = "--use_peft" in overrides
    assert_same_weights(tmp_path / "a", tmp_path / "b", "adapter_model.safetensors" if lora else "model.safetensors")


def test_nca_p_two_processes_train_resume_and_save_like_one(tiny_model_dir, synthetic_dir, tmp_path):
    """Full fine-tuning, shared vision, 4 steps with a checkpoint at 2: equal to one process; a 2-process resume
    from the checkpoint ends with the same weights; only the main process writes the final folder."""
    steps = ("--max_steps", "4", "--warmup_steps", "0", "--learning_rate", "1e-3")
    output = []
    a = two_processes("nca_p", "nca_p", tiny_model_dir, synthetic_dir, tmp_path / "a", *steps, output=output)
    b = one_process("nca_p", "nca_p", tiny_model_dir, synthetic_dir, tmp_path / "b", *steps)
    assert_same_history(a, b)
    assert {"rewards/margins_private", "rewards/accuracies_non_private"} <= set(a[0])  # per variant, gathered
    assert_same_weights(tmp_path / "a", tmp_path / "b")

    # saving: one writer, a folder that reloads to the trained weights (= the last checkpoint's)
    assert output[0].count("saved the NCA-P model") == 1 and "main process of 2" in output[0]
    assert_same_weights(tmp_path / "a", tmp_path / "a" / "checkpoint-4")
    from transformers import Qwen2VLForConditionalGeneration
    reloaded = Qwen2VLForConditionalGeneration.from_pretrained(tmp_path / "a")
    trained = load_file(tmp_path / "a" / "model.safetensors")
    state = reloaded.state_dict()
    assert all(state[k].equal(v) for k, v in trained.items() if k in state)

    # resume with 2 processes from checkpoint-2
    resumed = tmp_path / "resumed"
    (resumed / "checkpoint-2").parent.mkdir()
    subprocess.run(["cp", "-r", str(tmp_path / "a" / "checkpoint-2"), str(resumed / "checkpoint-2")], check=True)
    shutil.copy(tmp_path / "a" / MARKER, resumed / MARKER)  # a killed run's folder: the marker its start wrote
    history = two_processes("nca_p", "nca_p", tiny_model_dir, synthetic_dir, resumed, *steps,
                            "--resume_from_checkpoint", "true")
    assert [e["step"] for e in history if "loss" in e] == [1, 2, 3, 4]
    assert_same_weights(tmp_path / "a", resumed)


def test_precomputed_reference_two_processes(tiny_model_dir, synthetic_dir, tmp_path):
    """7 rows over 2 ranks (not divisible): the cache has each row once, equal to the 1-process cache, written by one
    process, scoring only the rows the run reads; training on it matches one process."""
    import pyarrow.parquet as pq

    steps = ("--max_steps", "1", "--warmup_steps", "0", "--learning_rate", "1e-3", "--num_train_samples", "7",
             "--precompute_ref_log_probs", "true")
    a = two_processes("nca_p", "nca_p", tiny_model_dir, synthetic_dir, tmp_path / "a", *steps)
    b = one_process("nca_p", "nca_p", tiny_model_dir, synthetic_dir, tmp_path / "b", *steps)
    caches = [sorted((tmp_path / run / "ref_logps").iterdir()) for run in ("a", "b")]
    assert [[p.name for p in c] for c in caches] == [[caches[1][0].name]] * 2  # one file each, same key, no .tmp
    values = [pq.read_table(c[0]).column("ref_logps").to_pylist() for c in caches]
    assert len(values[0]) == len(values[1]) == 7
    # 1 step x 2 processes x batch 2 reads 4 of the 7 rows: those are scored, the same 4 in both runs, the rest NaN
    scored = [[i for i, row in enumerate(v) if row == row and not any(x != x for x in row)] for v in values]
    assert len(scored[0]) == 4 and scored[0] == scored[1]
    assert all(x == pytest.approx(y, abs=1e-4, nan_ok=True) for x, y in zip(*values))
    assert_same_history(a, b)
    assert_same_weights(tmp_path / "a", tmp_path / "b")


def reloaded_state(path: Path) -> dict:
    """The saved model as transformers loads it (ZeRO-3's consolidated save names keys differently; loading maps them)."""
    from transformers import Qwen2VLForConditionalGeneration

    model, info = Qwen2VLForConditionalGeneration.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    return model.state_dict()


@pytest.mark.parametrize("stage,overrides", [
    ("zero2", ()),
    ("zero3", ("--activation_checkpointing", "true", "--precompute_ref_log_probs", "true")),
])
def test_deepspeed_two_processes_train_like_one(stage, overrides, tiny_model_dir, synthetic_dir, tmp_path):
    """NCA-P, packed, under DeepSpeed on 2 CPU processes ends where 1 unpacked process ends; under ZeRO-3 the
    vision tower runs on gathered parameters, with activation checkpointing and the reference precompute."""
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    steps = ("--max_steps", "2", "--warmup_steps", "0", "--learning_rate", "1e-3", *overrides)
    output = []
    a = launch("nca_p", "nca_p", tiny_model_dir, synthetic_dir, tmp_path / "a", "--per_device_train_batch_size", "2",
               *steps, config=f"{stage}_cpu.yaml", output=output,
               launcher_args=("--num_processes", "2", "--main_process_port", str(free_port())))
    b = one_process("nca_p", "nca_p", tiny_model_dir, synthetic_dir, tmp_path / "b", *steps, *UNPACKED)
    assert "main process of 2" in output[0]
    assert_same_history(a, b)
    sa, sb = reloaded_state(tmp_path / "a"), reloaded_state(tmp_path / "b")
    assert max((sa[k] - sb[k]).abs().max().item() for k in sb) < TOL


def eval_launch(config, tmp_path, *argv) -> subprocess.CompletedProcess:
    return forked_python.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                              str(ROOT / "accelerate_configs" / config), "--main_process_port", str(free_port()),
                              "-m", "eval", *argv], cwd=ROOT, timeout=900)


@pytest.mark.parametrize("benchmark", ["spy", "spatialtrust"])
def test_data_parallel_generation_writes_the_one_process_file(benchmark, tiny_model_dir, synthetic_dir, tmp_path):
    """`accelerate launch -m eval <benchmark> generate --backend hf` on 2 processes: each generates half, the
    main process writes one run file, identical to the 1-process file (greedy); resumable from a torn partial file."""
    if benchmark == "spy":
        def argv(out):
            return ["spy", "generate", "--items", str(synthetic_dir / "questions.json"), "--images", str(synthetic_dir),
                    "--backend", "hf", "--model", str(tiny_model_dir), "--batch-size", "4", "--max-new-tokens", "6",
                    "--limit", "9", "--out", str(out)]
        outputs = ("run.jsonl",)
    else:
        data = tmp_path / "st"
        from eval.spatialtrust.data import build_synthetic
        build_synthetic(data, n_images=3, width=224, height=160)

        def argv(out):
            return ["spatialtrust", "generate", "--data", str(data / "data.jsonl"), "--mode", "staged",
                    "--backend", "hf", "--model", str(tiny_model_dir), "--batch-size", "4", "--max-new-tokens", "6",
                    "--out", str(out)]
        outputs = ("run.jsonl", "run.run.jsonl")
    one = forked_python.run([sys.executable, "-m", "eval", *argv(tmp_path / "one" / "run.jsonl")], cwd=ROOT,
                            timeout=900)  # the reference, one plain process
    assert one.returncode == 0, one.stderr[-3000:]
    two = eval_launch("cpu_2proc.yaml", tmp_path, *argv(tmp_path / "two" / "run.jsonl"))
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count(str(tmp_path / "two" / "run.jsonl")) == 1, two.stdout  # the closing line, once
    for name in outputs:
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text(), name
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(outputs)  # nothing else, no shards
    if benchmark == "spy":  # each process generated its half, not everything
        assert "process 1 of 2: generated 5 of 9 requests" in two.stderr
        assert "process 2 of 2: generated 4 of 9 requests" in two.stderr

    if benchmark == "spy":  # a killed run: 4 finished lines and a torn one, resumed by 2 processes
        lines = (tmp_path / "one" / "run.jsonl").read_text().splitlines(keepends=True)
        partial = tmp_path / "resumed" / "run.jsonl"
        partial.parent.mkdir()
        partial.write_text("".join(lines[:5]) + lines[5][:20])
        resumed = eval_launch("cpu_2proc.yaml", tmp_path, *argv(partial))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert partial.read_text() == (tmp_path / "one" / "run.jsonl").read_text()
