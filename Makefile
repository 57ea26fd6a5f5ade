# Two commands set everything up on a fresh machine with Python 3.11 and make:
#   make demo   -> virtualenv + install + two estimates and a real 2-process training run
#   make test   -> virtualenv + install + the whole test suite (pytest + nbval)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lab install browser lint clean

install: $(STAMP)

# Re-install when the package metadata changes. Without CUDA, torch==2.13.0 (a CPU
# build) goes in first so that the `torch>=2.6` range is already met and pip does
# not pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install --quiet "torch==2.13.0"; fi
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolkit estimate --model gpt3-175b --tokens 300e9 --gpus 1024xA100-80GB --tp 8 --pp 16 --zero 1 --precision mixed-bf16 --mfu 0.45 --offer p4de.24xlarge
	$(BIN)/toolkit estimate --model llama2-7b --gpus 8xH100-SXM --zero 3 --precision mixed-bf16 --mfu 0.40 --offer p5.48xlarge --spot
	rm -rf runs/demo
	$(BIN)/toolkit train --layers 4 --hidden 256 --heads 8 --vocab 256 --seq 128 --micro-batch 8 --global-batch 16 --precision fp32 --steps 30 --warmup 3 --lr 2e-3 --eval-every 10 --nproc 2 --out runs/demo --no-progress

# Two workers, a test file each at a time (notebooks keep their cells in order; module fixtures are built once);
# the slowest tests are listed at the end. Then the tests marked `quiet`, which time code against a reference,
# alone: beside the other worker's ranks on two cores a timed difference of a few ms is off 5x either way; and those
# marked `alone`, which start more ranks than there are cores (96 s beside the other worker, 20 s by themselves).
# TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2
test: $(STAMP) browser lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 -m "not quiet and not alone and not slow"
	$(BIN)/python -m pytest -q -m "(quiet or alone) and not slow" tests

# Further points of test matrices whose other points make test runs (each 13-19 s here): kept out of make test's
# 12 minutes, run before a release or when touching what they cover.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m slow tests

# ruff: pyflakes' and pycodestyle's errors, and the formatter's layout (pyproject.toml's [tool.ruff]).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The browser test drives Debian's Chromium; install it when missing (as root, through apt).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    echo "installing Chromium for the browser test (apt-get)"; \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); \
	  else echo "make test needs Chromium for tests/browser: sudo apt-get install chromium"; exit 1; fi; }

# JupyterLab refuses to start as root without --allow-root (containers and cloud notebooks often run as root).
# No news feed and no update check: JupyterLab's prompt for them otherwise sits over the first chart.
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ --LabApp.news_url= --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
	  $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

clean:
	rm -rf $(VENV) build *.egg-info
