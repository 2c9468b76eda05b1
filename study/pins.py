"""The tuned study's numerics across machines: the CPU dispatch every process of the study is pinned to (NUMERICS),
the platform record that names the machine and the pins in force, and the bitwise comparison of two studies' shared
values (the cross-machine check). docs/study.md, "Reproducibility across machines", has the measurements.

May import: the standard library, torch (lazily, after the pins are set); nothing else of the study.
"""

from __future__ import annotations

import os
import platform as platform_module
import subprocess
import sys
from pathlib import Path

# The numeric settings of every process of the tuned study, set in its environment before torch loads (the training
# subprocesses and the spawned --jobs workers inherit them) and recorded in its platform. Why each (docs/study.md,
# "Reproducibility across machines": the op-level measurements): on one machine the preference path's first step
# changes in exactly three kernels when a library's CPU dispatch is varied, each the same kernel as in SFT:
NUMERICS = {
    # MKL, every float matmul. Its default blocks a GEMM by the cache sizes the machine reports; CNR mode AUTO keeps
    # the ISA dispatch but fixes the cache sizes, the reductions and the scheduling (Intel's CNR guide), so two CPUs
    # of one kind that report other caches block alike. Bitwise equal to the default here; on AMD every named
    # branch but COMPATIBLE falls back to AUTO (measured: AVX2 ... AVX512_E4 all equal the default). COMPATIBLE
    # (SSE2, the same code on every x86) also changes the first step's addmm here and doubled the training time.
    "MKL_CBWR": "AUTO",
    # MKL's ISA capped at AVX2 as the other two libraries' are; equal to the default here (measured).
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    # oneDNN: the vision tower's patch convolution and GELU. It dispatches on every extension it finds (AVX-512
    # with bf16 and VNNI here, AMX on newer Xeons), beyond ATen's capability; DNNL_MAX_CPU_ISA=AVX2 changes the
    # GELU's result, so every machine gets the AVX2 kernels.
    "DNNL_MAX_CPU_ISA": "AVX2",
    # ATen's own kernels: the packed rows' flash attention (sdpa with the boolean tree mask picks the CPU flash
    # kernel, as SFT's padded batches do; its blocks are fixed by the sequence length, its vector maths by the
    # capability), soft-max, the element-wise maths. AVX2 changes the flash attention's output; AVX2 everywhere.
    "ATEN_CPU_CAPABILITY": "avx2",
}


def pin_numerics() -> dict:
    """Put NUMERICS into this process's environment (before torch loads here; every process started later inherits
    it) and return it. Set, not defaulted: a machine's own values are what must not reach the study's floats."""
    os.environ.update(NUMERICS)
    return dict(NUMERICS)


def platform() -> dict:
    """What decides the floating-point results: torch and its BLAS, the CPU kernels chosen, the thread count, the CPU
    (vendor, family, model, flags, caches: MKL's and oneDNN's dispatch reads them; lscpu's model name and whether it
    has AVX-512, for the page) and the pinned settings."""
    import torch

    config = torch.__config__.show()
    blas = [line.strip() for line in config.splitlines() if "BLAS" in line or "LAPACK" in line or "MKL" in line]
    cpu = cpu_record()
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"), "threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads(), "blas": blas, "python": sys.version.split()[0],
            "machine": platform_module.machine(), "processor": cpu.get("model name"), "cpu": cpu,
            "lscpu_model": lscpu_model(), "cores": os.cpu_count(),
            "avx512": "avx512f" in cpu.get("flags", []) if cpu else None,
            "numerics": {k: os.environ.get(k) for k in NUMERICS}}


def lscpu_model() -> str | None:
    """lscpu's "Model name" (None where lscpu is missing): the machine's name as the page states it."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name:")), None)


CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "microcode", "cache size")


def cpu_record(cpuinfo: Path = Path("/proc/cpuinfo"), caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict:
    """The first CPU's /proc/cpuinfo fields (CPU_FIELDS, its flags as a sorted list) and its cache levels from sysfs;
    {} where they cannot be read (not Linux)."""
    try:
        first = Path(cpuinfo).read_text().split("\n\n")[0]
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    record = {k: fields[k] for k in CPU_FIELDS if k in fields}
    record["flags"] = sorted(fields.get("flags", "").split())
    levels = {}
    for index in sorted(Path(caches).glob("index*")):
        try:
            level, kind, size = ((index / n).read_text().strip() for n in ("level", "type", "size"))
        except OSError:
            continue
        levels[f"L{level} {kind}"] = size
    if levels:
        record["caches"] = levels
    return record


def machine_line(platform: dict, cpu: bool = True) -> str:
    """The CPU (where `cpu`) and the pinned settings, for the tables' platform lines (empty for a study.json from
    before they were recorded)."""
    pins = platform.get("numerics")
    cpu = platform.get("cpu") if cpu else None
    text = ""
    if cpu:
        text += (f"; CPU {cpu.get('vendor_id')} family {cpu.get('cpu family')} model {cpu.get('model')} "
                 f"({platform.get('lscpu_model') or cpu.get('model name')}"
                 + (f", AVX-512 {'yes' if platform['avx512'] else 'no'}" if platform.get("avx512") is not None else "")
                 + ")")
    if pins:
        text += "; pinned " + ", ".join(f"{k}={v}" for k, v in pins.items())
    return text


# ------------------------------------------------------------------------------------------------- across machines
def _leaves(value, path: str = "") -> dict:
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _leaves(sub, f"{path}.{key}" if path else key).items()}
    return {path: value} if isinstance(value, (int, float)) and not isinstance(value, bool) else {}


def compare_runs(a: dict, b: dict) -> dict:
    """Every number two tuned study.json files (either layout) both hold for the backbone and the final runs they
    share, compared bit for bit: {"equal": count, "different": [(path, a's, b's)]} (the cross-machine check)."""
    def numbers(report: dict) -> dict:
        runs = {"backbone": report["backbone"]}
        for m, entry in report["final"].items():
            for key in ("runs", "runs_1x"):
                for seed, run in entry.get(key, {}).items():
                    runs[f"{key}.{m}.{seed}"] = {k: run[k] for k in ("steps", "training")}
        return _leaves(runs)

    ours, theirs = numbers(a), numbers(b)
    shared = [k for k in ours if k in theirs]
    return {"equal": sum(ours[k] == theirs[k] for k in shared),
            "different": [(k, ours[k], theirs[k]) for k in shared if ours[k] != theirs[k]]}

