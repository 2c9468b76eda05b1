"""launch/slurm.py: SLURM's variables -> one `accelerate launch` per node (dry run, no cluster needed)."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import forked_python
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "launch"))
from slurm import expand_nodelist  # noqa: E402


def dry_run(env: dict, *args) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "WANDB_RUN_GROUP", "HF_HOME"))}
    return forked_python.run([sys.executable, "launch/slurm.py", "--dry-run", *args, "train/nca_p.py",
                           "recipes/nca_p.yaml", "--run_name", "ncap"], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True)


@pytest.mark.parametrize("nodelist,hosts", [
    ("gpu001", ["gpu001"]),
    ("gpu[001-003,007]", ["gpu001", "gpu002", "gpu003", "gpu007"]),
    ("a[8-10],login1", ["a8", "a9", "a10", "login1"]),
])
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_one_node():
    result = dry_run({"SLURM_JOB_NODELIST": "gpu017", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_ID": "5"},
                     "--config", "accelerate_configs/zero2.yaml")
    assert result.returncode == 0, result.stderr
    env_line, command = result.stdout.splitlines()
    assert shlex.split(command) == [
        "accelerate", "launch", "--config_file", "accelerate_configs/zero2.yaml", "--num_machines", "1",
        "--machine_rank", "0", "--num_processes", "8", "--main_process_ip", "gpu017", "--main_process_port", "29500",
        "train/nca_p.py", "recipes/nca_p.yaml", "--run_name", "ncap"]
    assert "WANDB_RUN_GROUP=slurm-5" in env_line and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in env_line


@pytest.mark.parametrize("node", [0, 3])
def test_four_nodes(node):
    result = dry_run({"SLURM_JOB_NODELIST": "gpu[001-004]", "SLURM_NNODES": "4", "SLURM_NODEID": str(node),
                      "SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": "/shared/privacy-align"})
    assert result.returncode == 0, result.stderr
    env_line, command = result.stdout.splitlines()
    assert shlex.split(command) == [
        "accelerate", "launch", "--config_file", "accelerate_configs/zero3.yaml", "--num_machines", "4",
        "--machine_rank", str(node), "--num_processes", "32", "--main_process_ip", "gpu001",
        "--main_process_port", "29500", "--rdzv_backend", "static", "--same_network",
        "train/nca_p.py", "recipes/nca_p.yaml", "--run_name", "ncap"]
    assert "HF_HOME=/shared/privacy-align/.cache/huggingface" in env_line and "WANDB_RUN_GROUP=slurm-77" in env_line


def test_outside_slurm_and_bad_config_exit_2_with_one_line():
    outside = dry_run({})
    assert outside.returncode == 2 and len(outside.stderr.strip().splitlines()) == 1
    assert "SLURM_JOB_NODELIST" in outside.stderr
    missing = dry_run({"SLURM_JOB_NODELIST": "gpu1"}, "--config", "accelerate_configs/nope.yaml")
    assert missing.returncode == 2 and missing.stderr.strip() == "error: accelerate_configs/nope.yaml: file not found"
