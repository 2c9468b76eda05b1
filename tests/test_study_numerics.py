"""The tuned study's numerics across machines (issue 33; docs/study.md, "Reproducibility across machines"): the
platform record names the CPU and the pinned settings, the pins reach every process the study starts (each
library reports what it runs), and, as far as one machine can show it, the pinned preference path trains to the
same bits when the machine's CPU dispatch is emulated as another's (the variables that moved it unpinned)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from study.pins import NUMERICS, cpu_record, machine_line

ROOT = Path(__file__).resolve().parents[1]
# What another x86 machine's libraries could choose where this one's choose otherwise; unpinned, each of these moves
# the first training step (measured, docs/study.md): oneDNN's GELU, ATen's flash attention, MKL's addmm.
OTHER_MACHINE = {"DNNL_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in NUMERICS}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def test_cpu_record_from_cpuinfo_and_sysfs(tmp_path):
    (tmp_path / "cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9654\n"
        "stepping\t: 1\ncache size\t: 1024 KB\nflags\t\t: sse2 avx2 avx512f fma\n\n"
        "processor\t: 1\nvendor_id\t: OtherVendor\nmodel\t\t: 99\n")
    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")]):
        index = tmp_path / "cache" / f"index{i}"
        index.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (index / name).write_text(f"{value}\n")
    record = cpu_record(tmp_path / "cpuinfo", tmp_path / "cache")
    assert record == {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17", "model name": "AMD EPYC 9654",
                      "stepping": "1", "cache size": "1024 KB", "flags": ["avx2", "avx512f", "fma", "sse2"],
                      "caches": {"L1 Data": "32K", "L2 Unified": "1024K", "L3 Unified": "32768K"}}
    assert cpu_record(tmp_path / "absent") == {}
    line = machine_line({"cpu": record, "numerics": NUMERICS})
    assert "AuthenticAMD family 25 model 17 (AMD EPYC 9654)" in line and "DNNL_MAX_CPU_ISA=AVX2" in line
    # the page names the machine as lscpu does, and says whether it has AVX-512 (the second machine had not)
    line = machine_line({"cpu": record, "lscpu_model": "AMD EPYC 9654 96-Core Processor", "avx512": False})
    assert "family 25 model 17 (AMD EPYC 9654 96-Core Processor, AVX-512 no)" in line
    assert machine_line({}) == ""  # a study.json from before the record


def test_platform_record_holds_the_cpu_and_the_pins_in_force():
    """The study's own order (pin, then platform()) in a fresh process: the pins are in force, the CPU is named."""
    code = ("import json; from study.pins import pin_numerics, platform; pin_numerics(); "
            "print(json.dumps(platform()))")
    done = subprocess.run([sys.executable, "-c", code], env=_env(**OTHER_MACHINE), capture_output=True, text=True,
                          timeout=120, check=True)
    record = json.loads(done.stdout.splitlines()[-1])
    assert record["numerics"] == NUMERICS
    assert record["cpu_capability"] == "AVX2" and record["torch_threads"] == 1  # ATen obeys the pin, not the machine
    cpu = record["cpu"]
    assert {"vendor_id", "cpu family", "model", "model name", "flags"} <= set(cpu) and "avx2" in cpu["flags"]
    assert record["processor"] == cpu["model name"]
    assert record["avx512"] == ("avx512f" in cpu["flags"]) and "lscpu_model" in record


REPORTER = """
import json, os, sys, torch
a = torch.randn(64, 64)
a @ a  # MKL's verbose line says its CNR mode and thread count
with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
    torch.nn.functional.gelu(torch.randn(64, 128))  # oneDNN's says the ISA it dispatches to
print(json.dumps({"env": {k: os.environ.get(k) for k in %r}, "capability": torch.backends.cpu.get_cpu_capability(),
                  "threads": torch.get_num_threads()}), flush=True)
"""

STUDY_SIDE = """
import subprocess, sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from study.pins import pin_numerics
pin_numerics()
reporter = sys.argv[1]
# what train.demo.train starts for every training run: accelerate launch with the study's CPU config
subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", "accelerate_configs/cpu.yaml",
                reporter], check=True)
# what run_tasks starts for --jobs > 1: spawned workers
with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
    pool.submit(subprocess.run, [sys.executable, reporter], check=True).result()
"""


def test_pins_reach_the_processes_the_study_starts(tmp_path):
    """A machine whose environment says otherwise: the accelerate-launched training process and a spawned job
    worker both run with the pins, and ATen, MKL and oneDNN each report that they follow them."""
    reporter = tmp_path / "reporter.py"
    reporter.write_text(REPORTER % (sorted(NUMERICS),))
    done = subprocess.run([sys.executable, "-c", STUDY_SIDE, str(reporter)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=_env(MKL_VERBOSE="1", **OTHER_MACHINE))
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 2
    for report in reports:
        assert report == {"env": NUMERICS, "capability": "AVX2", "threads": 1}
    mkl = [line for line in done.stdout.splitlines() if line.startswith("MKL_VERBOSE SGEMM")]
    dnnl = [line for line in done.stdout.splitlines() if ",isa:" in line]
    assert len(mkl) == 2 and all("CNR:AUTO" in line and "NThr:1" in line for line in mkl), mkl
    assert len(dnnl) == 2 and all(line.endswith("isa:Intel AVX2") for line in dnnl), dnnl


TRAIN = """
import sys
from pathlib import Path
from train.demo import ROOT, Clock, train
from study.pins import pin_numerics
pin_numerics()
script, recipe, model, data, out = sys.argv[1:]
train(script, Path(model), Path(data), Path(out), 2, Clock(),
      ["--logging_steps", "1", "--save_strategy", "no", "--learning_rate", "3e-3"],
      ROOT / "recipes" / "study" / f"{recipe}.yaml")
"""


def _trained(tmp_path, name: str, script: str, recipe: str, model, data, env: dict) -> tuple[list, bytes]:
    out = tmp_path / name
    done = subprocess.run([sys.executable, "-c", TRAIN, script, recipe, str(model), str(data), str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    logged = json.loads((out / "train_metrics.json").read_text())
    values = [{k: v for k, v in e.items() if k.startswith(("loss", "rewards/", "logps/"))} for e in logged
              if "loss" in e]
    return values, (out / "model.safetensors").read_bytes()


def test_pinned_preference_path_ignores_the_machines_cpu_dispatch(tmp_path, tiny_model_dir, synthetic_dir):
    """The study's DPO and NCA-P (packed, shared vision: its sdpa with the boolean tree mask) for two steps through
    the study's own launcher, on this machine's dispatch and on another's as the environment emulates it: the same
    losses, rewards and weights, bit for bit. (Without the pin, i.e. pin_numerics a no-op, the emulated machine
    trains to other weights at the first step and this test fails: checked once.)"""
    for script, recipe in (("dpo", "dpo"), ("nca_p", "nca_p")):
        here = _trained(tmp_path, f"{recipe}-here", script, recipe, tiny_model_dir, synthetic_dir, _env())
        other = _trained(tmp_path, f"{recipe}-other", script, recipe, tiny_model_dir, synthetic_dir,
                         _env(**OTHER_MACHINE))
        assert here[0] == other[0], recipe  # every logged loss / reward / log-prob, exactly
        assert here[1] == other[1], f"{recipe}: the weights differ"
