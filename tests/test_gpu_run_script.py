"""`benchmarks/gpu/run.sh` works from a plain copy of the checkout with the project not installed, as on the lent
GPU machine (where the repository arrives as files and the project's packages are found through PYTHONPATH), and
`make gpu-wheels` carries exactly the versions the project pins."""

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def copy_checkout(target: Path) -> Path:
    """The files git would send: tracked, and untracked but not ignored (what the device tool carries)."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, names):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes(source.read_bytes())
    return target


def bare_python(env_dir: Path) -> Path:
    """A Python that sees this environment's third-party packages but not the project (whose editable install is a
    .pth hook of this environment: a site-packages folder added by a .pth line has its own .pth files ignored)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(purelib) / "project_deps.pth").write_text("\n".join(paths) + "\n")
    return python


@pytest.mark.slow
def test_run_sh_dry_run_from_a_copy_without_the_project_installed(tmp_path):
    checkout = copy_checkout(tmp_path / "checkout")
    python = bare_python(tmp_path / "env")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([str(python), "-c", "import torch, trl, datasets; import data_prep"], env=env,
                           capture_output=True, text=True, cwd=tmp_path)
    assert "No module named 'data_prep'" in probe.stderr  # third-party packages yes, the project no

    out = tmp_path / "out"
    result = subprocess.run(["bash", str(checkout / "benchmarks" / "gpu" / "run.sh"), "--dry-run"], cwd=tmp_path,
                            env={**env, "PYTHON": str(python), "OUT": str(out)}, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "MISSING" not in result.stdout
    assert re.search(rf"data_prep\s+\S*\s*{re.escape(str(checkout))}", result.stdout), result.stdout[:2000]

    report = json.loads((out / "nca_p_throughput_tiny_dry_run.json").read_text())
    # flex against sdpa on the benchmark's own model first, then the small model's checks
    assert list(report["checks"]) == ["flex_logps", "fused_head", "shared_vision", "packed", "packed_flex"]
    flex = report["checks"]["flex_logps"]
    assert flex["scored"] > 0 and flex["logprob_max_abs_diff"] <= flex["tolerance"] == 1e-4  # float32 in the dry run
    assert flex["attention_ran"]["no_gradient"] == "flex_attention (block mask)"
    assert all(check["ok"] for check in report["checks"].values()), report["checks"]
    assert report["checks"]["shared_vision"]["weights_moved"]
    assert report["peak_tflops"]["measured"] > 0
    results = report["results"]
    assert results and all(r["status"] == "ok" for r in results), [r["status"] for r in results]
    # the most informative configurations first: at the first size, LoRA and full packed with flex, then packed with
    # sdpa, then shared, then repeated
    assert [(r["finetune"], r["layout"]) for r in results[:8]] == [
        ("lora", "packed_flex"), ("full", "packed_flex"), ("lora", "packed"), ("full", "packed"), ("lora", "shared"),
        ("full", "shared"), ("lora", "repeated"), ("full", "repeated")]
    for r in results:
        assert r["model_tflop_per_step"] <= r["executed_tflop_per_step"]
        assert r["mfu_measured_peak"] > r["mfu"] > 0  # the CPU's measured peak is far below the H200 datasheet
    assert (out / "nca_p_throughput_tiny_dry_run.md").read_text().count("| ok |") == len(results)
    assert (out / "run.log").stat().st_size > 0


def test_gpu_wheels_are_the_pinned_versions():
    makefile = (ROOT / "Makefile").read_text()
    wheels = dict(re.findall(r"([A-Za-z0-9_.-]+)==([0-9][^\s]*)", re.search(r"GPU_WHEELS :=(.*)", makefile).group(1)))
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
    assert {"transformers", "trl", "peft", "datasets"} <= set(wheels)
    for name, version in wheels.items():
        assert pins[name] == version, name
    assert "torch" not in wheels  # the GPU machine's own torch stays
