# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
# Each creates the project venv (.venv) when it is missing or older than pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OUT ?= outputs/demo
# No network at run time: the Hub is never contacted, telemetry is off, W&B logs offline.
OFFLINE := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
           WANDB_MODE=offline TOKENIZERS_PARALLELISM=false

.PHONY: demo test lint vllm-env clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	DS_BUILD_OPS=0 $(PY) -m pip install -q -e ".[dev,deepspeed]"
	touch $(STAMP)

demo: $(STAMP)
	$(OFFLINE) $(PY) -m train.demo --out $(OUT)

test: $(STAMP)
	$(OFFLINE) $(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# vLLM pins its own torch and transformers, so it lives in its own environment (GPU machines only).
vllm-env:
	test -x .venv-vllm/bin/python || $(PYTHON) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q "vllm==0.33.0" "openai>=1.60,<4" "matplotlib>=3.9,<4" "tqdm>=4.66" PyYAML
	.venv-vllm/bin/pip install -q --no-deps -e .

clean:
	rm -rf $(VENV) .venv-vllm
