# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
# Each creates the project venv (.venv) when it is missing or older than pyproject.toml or constraints.txt.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OUT ?= outputs/demo
# No network at run time: the Hub is never contacted, telemetry is off, W&B logs offline.
OFFLINE := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
           WANDB_MODE=offline TOKENIZERS_PARALLELISM=false

.PHONY: demo study test lint docs vllm-env gpu-wheels clean

# The exact tested set: pyproject.toml's ranges, resolved to constraints.txt's versions.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	DS_BUILD_OPS=0 $(PY) -m pip install -q -c constraints.txt -e ".[dev,deepspeed,wandb]"
	touch $(STAMP)

demo: $(STAMP)
	$(OFFLINE) $(PY) -m train.demo --out $(OUT)

# The miniature alignment study (README): SFT, DPO, NCA, NCA-P from one helpful backbone, 3 seeds, about 20 min on CPU.
study: OUT = outputs/study
study: $(STAMP)
	$(OFFLINE) $(PY) -m train.study --out $(OUT)

test: $(STAMP)
	$(OFFLINE) $(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The documentation site (docs/, mkdocs.yml) into site/; strict: a broken link, a missing page or an unresolved API
# reference fails. The CLI reference is generated from the parsers, so it needs the project installed.
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(OFFLINE) $(PY) -m mkdocs build --strict --quiet

# vLLM pins its own torch and transformers, so it lives in its own environment (GPU machines only).
vllm-env:
	test -x .venv-vllm/bin/python || $(PYTHON) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q "vllm==0.33.0" "openai>=3.57.0,<4" "matplotlib>=3.11.2,<4" "tqdm>=4.70.1,<5" "PyYAML>=6.0.4,<7" \
	    "geopy>=2.5.0,<3" "krippendorff>=0.9.0,<1"
	.venv-vllm/bin/pip install -q --no-deps -e .

# What the lent GPU machine (Python 3.12, torch 2.11, transformers 5.17, no trl/datasets, no network) lacks, as
# wheels for its Python, carried in .whl/ (git-ignored) and installed by benchmarks/gpu/run.sh. The versions are
# constraints.txt's pins (a test checks it) plus datasets' own dill and multiprocess; none pulls in torch.
GPU_WHEELS := transformers==5.24.0 trl==1.16.0 peft==0.21.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
GPU_WHEELS_MAX_MIB := 48

gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    -d .whl $(GPU_WHEELS)
	@total=$$(du -cb .whl/*.whl | tail -1 | cut -f1); ls -1 .whl; \
	  echo "$$(ls .whl/*.whl | wc -l) wheels, $$((total / 1024)) KiB in .whl/ (limit $(GPU_WHEELS_MAX_MIB) MiB)"; \
	  test $$total -le $$(($(GPU_WHEELS_MAX_MIB) * 1048576)) || { echo "error: .whl/ is over $(GPU_WHEELS_MAX_MIB) MiB"; exit 1; }

clean:
	rm -rf $(VENV) .venv-vllm
