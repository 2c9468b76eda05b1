"""`make vllm-gpu-resolve` (what CI runs against PyPI): the GPU branch of `make vllm-env` resolves for the GPU
machine's tags without installing, and a pin that does not exist fails it. Here against a local package folder
(tests never reach the network): the same pip dry run, the same pins variable."""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_wheel(folder: Path, name: str, version: str) -> None:
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{name}/__init__.py", "")
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def resolve(folder: Path, pins: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(folder),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(["make", "-s", "-C", str(ROOT), "vllm-gpu-resolve", f"PYTHON={sys.executable}",
                           f"VLLM_GPU_PINS={pins}", "VLLM_PROJECT_DEPS="], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_pin_that_does_not_exist_fails_the_check(tmp_path):
    write_wheel(tmp_path, "vllm", "0.33.0")
    ok = resolve(tmp_path, "vllm==0.33.0")
    assert ok.returncode == 0 and "GPU vLLM pins resolve: 1 packages" in ok.stdout and "vllm==0.33.0" in ok.stdout, (
        ok.stdout + ok.stderr)
    typo = resolve(tmp_path, "vllm==0.33.99")
    assert typo.returncode != 0 and "No matching distribution found for vllm==0.33.99" in typo.stderr, typo.stderr
    assert resolve(tmp_path, "vlm==0.33.0").returncode != 0  # a misspelt name fails as well


def test_the_check_and_the_install_read_the_same_pins():
    makefile = (ROOT / "Makefile").read_text()
    gpu_install = re.search(r"^\$\(VLLM_VENV\)/\.installed-gpu:\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "$(VLLM_PIP) $(VLLM_GPU_PINS) $(VLLM_PROJECT_DEPS)" in gpu_install
    assert re.findall(r'"vllm==[^"]*"', makefile) == ['"vllm==0.33.0"']  # written once: VLLM_GPU_PINS
    assert re.search(r"^step vllm-gpu-resolve make vllm-gpu-resolve$", (ROOT / ".ci" / "run").read_text(), re.M)
