# One command sets everything up and runs the tests (`make test`); `make demo` runs the main job.
# A virtualenv in .venv holds the Python packages; system packages are installed with apt-get
# when missing (as root, or through sudo).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# g++ builds the CPU recurrence, sctk scores; the rest are the offline TTS voices and texts of the synthetic corpus
# (Debian main only, listed in recipes/synth_en/local/packages.txt; the non-free MBROLA/pico voices are an opt-in
# of recipes/synth_en).
TTS_PACKAGES := $(shell awk '!/^\#/ && NF { print $$2 }' recipes/synth_en/local/packages.txt)
APT_PACKAGES ?= g++ sctk $(TTS_PACKAGES)

.PHONY: setup sysdeps test test-fast test-all gpu-test lint format bench demo clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@$(MAKE) --no-print-directory sysdeps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

sysdeps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# The suite runs in parallel (pytest-xdist, one worker per core up to 4; a test file stays on one worker, so its
# module fixtures are built once) and prints its 15 slowest tests. Files go out in collection order, which
# tests/conftest.py's LONGEST_FIRST sets (--no-loadscope-reorder: by default xdist sends the files with the most
# tests first, and the few long process-level files ran last, side by side). `make test` runs every test but the
# GPU and slow ones; `make test-fast` leaves out the process-level ones too (tests/process/: training runs, kill -9,
# recipe runs; marker `process`), for the edit-test loop.
PYTEST := $(PY) -m pytest -q -n auto --maxprocesses=4 --dist loadfile --no-loadscope-reorder --durations=15

test: setup
	$(PYTEST)

test-fast: setup
	$(PYTEST) -m 'not slow and not process'

test-all: setup
	$(PYTEST) -m ''

gpu-test: setup
	$(PY) tests/run_gpu_tests.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup
	$(PY) benchmarks/recurrence_speed.py

demo: setup
	recipes/synth_en/run.sh --size small
	@sample=$$(find data/synth_en/corpus/audio/test_unseen -name '*.flac' | sort | head -n 1); \
	  echo "transcribing $$sample with exp/synth_en/model:"; \
	  $(VENV)/bin/srupp-asr transcribe --model exp/synth_en/model -f json -o exp/synth_en/demo "$$sample" && \
	  $(VENV)/bin/srupp-asr transcribe --model exp/synth_en/model "$$sample" && \
	  echo "and with the built-in default model (srupp_asr/default_model, trained on a GPU):" && \
	  $(VENV)/bin/srupp-asr transcribe "$$sample"

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
