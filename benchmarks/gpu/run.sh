#!/usr/bin/env bash
# The one command to run on a lent GPU machine (no network, its own torch/transformers; see README.md here):
#   bash benchmarks/gpu/run.sh [--dry-run] [nca_p_throughput.py options]
# 1. installs the wheels carried in .whl/ (`make gpu-wheels`) into a folder put first on PYTHONPATH, beside the
#    machine's packages (its torch stays); without .whl/ it uses what is installed;
# 2. prints the versions in use and where they come from;
# 3. runs the correctness checks and the throughput benchmark of NCA-P and DPO (nca_p_throughput.py's default
#    --methods nca_p,dpo), results under $OUT (else benchmarks/results), the time budget counted from this
#    script's start (BUDGET seconds, default 480: 8 of the 9 minutes of a call).
set -euo pipefail
START=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
SITE=${GPU_SITE:-/tmp/privacy-align-site}
RESULTS=${OUT:-$ROOT/benchmarks/results}
mkdir -p "$RESULTS"

shopt -s nullglob
wheels=("$ROOT"/.whl/*.whl)
if ((${#wheels[@]})); then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  echo "installed ${#wheels[@]} carried wheels into $SITE ($(($(date +%s) - START)) s)"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  echo "no wheels in $ROOT/.whl: using the installed packages"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
       TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

"$PYTHON" - <<'PY'
import importlib, importlib.metadata as md, platform
print("python", platform.python_version())
for name in ("torch", "torchvision", "transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub",
             "tokenizers", "safetensors", "pyarrow", "fsspec", "dill", "multiprocess", "triton", "numpy", "PIL",
             "data_prep", "losses", "train", "cli", "store", "vlm"):
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # report every missing piece at once, then fail below
        print(f"  {name:16s} MISSING ({type(exc).__name__}: {exc})")
        continue
    where = getattr(module, "__file__", None) or list(getattr(module, "__path__", []))
    print(f"  {name:16s} {getattr(module, '__version__', '') or '':14s} {where}")
PY

set -o pipefail
"$PYTHON" "$ROOT/benchmarks/gpu/nca_p_throughput.py" --started-at "$START" --time-budget "${BUDGET:-480}" \
  --out "$RESULTS" "$@" 2>&1 | tee "$RESULTS/run.log"

# GRPO with vLLM rollouts (docs/training/grpo.md#generation): where vLLM imports beside TRL (a GPU machine with
# `make vllm-env`, or GPU_VLLM_PYTHON naming such an interpreter), the colocate checks CI runs on CPU
# (tests/grpo_vllm_engine.py: greedy equality, packed = unpacked with the importance-sampling ratio, dynamic sampling,
# guides, weight sync) and the rollout / step benchmark, results under $OUT. The lent machine has no vLLM (and no
# network to install its CUDA wheels): then this says so and runs nothing.
VLLM_PYTHON=${GPU_VLLM_PYTHON:-$PYTHON}
if [[ " $* " != *" --dry-run "* ]] && "$VLLM_PYTHON" -c 'import vllm, trl' 2>/dev/null; then
  python_tiny() { "$VLLM_PYTHON" -c 'import sys; from pathlib import Path; from train.tiny_model import DEMO_CONFIG, build_tiny_model
from data_prep.synthetic import build
build_tiny_model(Path(sys.argv[1]) / "tiny", **DEMO_CONFIG)
build(Path(sys.argv[1]) / "data", train_per_label=1, test_per_label=1, general_train=8, general_test=2)' "$1"; }
  work=$(mktemp -d)
  python_tiny "$work"
  "$VLLM_PYTHON" "$ROOT/tests/grpo_vllm_engine.py" "$work/tiny" "$work/data" "$RESULTS/grpo_vllm_checks_gpu.json" \
    2>&1 | tee "$RESULTS/grpo_vllm_checks.log" | grep -E "^(greedy|sampling_logps|packed|dynamic_sampling|guidance|weight_sync) " || true
  "$VLLM_PYTHON" "$ROOT/benchmarks/grpo_vllm.py" --out "$RESULTS/grpo_vllm_gpu.json" 2>&1 | tail -5
else
  echo "GRPO vLLM checks skipped: vllm and trl do not both import with $VLLM_PYTHON (make vllm-env on a GPU machine)"
fi
