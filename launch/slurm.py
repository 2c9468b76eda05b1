"""Run one training recipe on N nodes x G GPUs under SLURM: one `accelerate launch` per node.

    sbatch --nodes 4 launch/slurm.sbatch train/nca_p.py recipes/nca_p.yaml [--key value ...]
    python launch/slurm.py --dry-run --config accelerate_configs/zero3.yaml train/nca_p.py recipes/nca_p.yaml

`launch/slurm.sbatch` starts this helper once per node (`srun --ntasks-per-node 1`). Each copy reads SLURM's
variables (the job's node list, its own node index), takes the first node as the rendezvous host, and runs
`accelerate launch` with the machine count, this node's rank and the total process count, so accelerate starts
DeepSpeed's multi-node setup itself (`deepspeed_multinode_launcher: standard` in the configs). `--dry-run` prints
the environment and the exact command instead of running it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

DEFAULT_PORT = 29500


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list ("gpu[001-003,007],login1") as host names, in order (what
    `scontrol show hostnames` prints; no SLURM command is needed for it)."""
    hosts = []
    for name, ranges in re.findall(r"([^,\[]+)(?:\[([^\]]+)\])?,?", nodelist):
        if not ranges:
            hosts.append(name)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for i in range(int(low), int(high or low) + 1):
                hosts.append(f"{name}{i:0{len(low)}d}")
    return hosts


def node_environment(env: dict) -> dict:
    """Variables every node's processes need: NCCL behaviour, one shared model/data cache, W&B run grouping."""
    job = env.get("SLURM_JOB_ID", "local")
    return {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),  # a dead rank ends the job
        "NCCL_DEBUG": env.get("NCCL_DEBUG", "WARN"),
        # one cache for all nodes, on the shared file system the job starts from, unless the user set one
        "HF_HOME": env.get("HF_HOME", os.path.join(env.get("SLURM_SUBMIT_DIR", os.getcwd()), ".cache", "huggingface")),
        "WANDB_RUN_GROUP": env.get("WANDB_RUN_GROUP", f"slurm-{job}"),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "8"),
    }


def accelerate_command(args, env: dict) -> list[str]:
    hosts = expand_nodelist(env["SLURM_JOB_NODELIST"])
    nodes = int(env.get("SLURM_NNODES", len(hosts)))
    if nodes != len(hosts):
        raise SystemExit(f"error: SLURM_NNODES={nodes} but SLURM_JOB_NODELIST names {len(hosts)} hosts")
    rank = int(env.get("SLURM_NODEID", env.get("SLURM_PROCID", "0")))
    command = ["accelerate", "launch", "--config_file", args.config,
               "--num_machines", str(nodes), "--machine_rank", str(rank),
               "--num_processes", str(nodes * args.gpus_per_node),
               "--main_process_ip", hosts[0], "--main_process_port", str(args.port)]
    if nodes > 1:
        command += ["--rdzv_backend", "static", "--same_network"]
    return command + [args.script, args.recipe, *args.overrides]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--config", default="accelerate_configs/zero3.yaml", help="accelerate config (DeepSpeed)")
    parser.add_argument("--gpus-per-node", type=int, default=int(os.environ.get("SLURM_GPUS_ON_NODE", 8) or 8))
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--dry-run", action="store_true", help="print this node's environment and command only")
    parser.add_argument("script", help="entry script, e.g. train/nca_p.py")
    parser.add_argument("recipe", help="recipe YAML, e.g. recipes/nca_p.yaml")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="--key value pairs passed to the script")
    args = parser.parse_args(argv)
    if args.gpus_per_node < 1:
        parser.error("--gpus-per-node must be at least 1")
    for path in (args.config, args.script, args.recipe):
        if not os.path.isfile(path):
            print(f"error: {path}: file not found", file=sys.stderr)
            return 2
    if "SLURM_JOB_NODELIST" not in os.environ:
        print("error: SLURM_JOB_NODELIST is not set: run this inside a SLURM job (launch/slurm.sbatch)",
              file=sys.stderr)
        return 2
    command = accelerate_command(args, os.environ)
    extra = node_environment(os.environ)
    if args.dry_run:
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items()))
        print(shlex.join(command))
        return 0
    os.execvpe(command[0], command, {**os.environ, **extra})


if __name__ == "__main__":
    sys.exit(main())
