"""``bae entropy positions``: a BAE's code entropy and trust verdict per LLM position and layer.

Take N windows of BOS + 2^K tokens from documents, the hidden states at positions 2^0 ... 2^K
(position p has p tokens of context after the BOS) at chosen layers, and read each
(layer, position) cell with its own BAE: the bits its code spends, and the trust rule's verdict on
whether they are the cell's entropy. All cells' BAEs train as one stacked module.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens import HookedTransformer

from sae_lens_bae.activations import check_layers, gather_states
from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.data import default_corpus, document_windows, iter_texts
from sae_lens_bae.entropy import TRACING_RECIPE, EntropyRecipe, estimate_entropies
from sae_lens_bae.entropy.tables import cell_columns, reliability_note
from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT, recipe_field
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import plot_entropy_curves
from sae_lens_bae.reports import markdown_table, write_json, write_text

__all__ = ["REPORT", "PositionTracingConfig", "run", "trace_positions"]

REPORT = "positions.md"

_CELL_KEYS = [
    ("layer", lambda row: str(row["layer"])),
    ("position", lambda row: str(row["position"])),
]


@dataclass
class PositionTracingConfig:
    """What ``bae entropy positions`` runs; the defaults are the reduced grid for a 2-core CPU."""

    model: str = "smollm2-135m"
    """Embedded name, local HF directory or TransformerLens name."""
    dataset: str | None = None
    """Text file, folder or HF dataset (default: the embedded corpus)."""
    text_column: str | None = None
    """Text column of a table/JSONL dataset."""
    layers: Sequence[int] = ranged((5, 15, 25), low=0)
    """Layers traced."""
    hook: str = "hook_resid_post"
    """Hook point inside each block."""
    max_log2_position: int = ranged(6, low=0)
    """K: positions 2^0 .. 2^K."""
    n_sequences: int = ranged(2048, low=1)
    """Document windows of 2^K tokens (the states of each cell)."""
    recipe: EntropyRecipe = recipe_field(TRACING_RECIPE)
    """How each cell's BAE is trained."""
    batch_size: int = ranged(32, low=1)
    """Sequences per forward pass."""
    device: str = "cpu"
    """Torch device."""
    reference: bool = True
    """Also read each cell with the smallest k-means code that reads it (the trust rule's errors
    under the ceiling; ``entropy.reference``): drawn beside the BAE's curve, in the table."""
    seed: int = 0
    """Seed of the BAEs."""
    out: Path = Path("runs/entropy_positions")
    """Folder for the JSON, the table and the plot."""

    def __post_init__(self) -> None:
        check_ranges(self)


def trace_positions(
    model: HookedTransformer,
    tokens: Int[Tensor, "n_seq ctx"],
    layers: Sequence[int],
    max_log2_position: int,
    recipe: EntropyRecipe = TRACING_RECIPE,
    *,
    hook: str = "hook_resid_post",
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = True,
    reference: bool = True,
    checkpoint: Path | None = None,
) -> list[dict[str, Any]]:
    """One row per (layer, position 2^j): estimated bits and reconstruction quality.

    ``tokens`` rows are BOS + at least 2^K tokens (``sae_lens_bae.data.document_windows``).
    ``checkpoint``: where the BAEs' training saves itself (``estimate_entropies``).
    """
    positions = [2**j for j in range(max_log2_position + 1)]
    if tokens.shape[1] <= positions[-1]:
        raise ValueError(
            f"Position {positions[-1]} needs rows of at least {positions[-1] + 1} tokens (BOS + "
            f"2^{max_log2_position}); got rows of {tokens.shape[1]}"
        )
    recipe.check_samples(tokens.shape[0], f"{tokens.shape[0]} sequences")
    hooks = [f"blocks.{layer}.{hook}" for layer in layers]
    index = torch.tensor(positions).expand(tokens.shape[0], -1)
    keep = None if checkpoint is None else checkpoint / "states.pt"
    states, _ = gather_states(
        model, tokens, hooks, index, batch_size=batch_size, progress=progress, keep=keep
    )
    cells = [(layer, j) for layer in layers for j in range(len(positions))]
    sets = [states[f"blocks.{layer}.{hook}"][:, j] for layer, j in cells]
    estimates = estimate_entropies(
        sets,
        recipe,
        seeds=[seed] * len(sets),
        device=str(model.cfg.device),
        progress=progress,
        reference=reference,
        checkpoint=checkpoint,
    )
    return [
        {"layer": layer, "position": positions[j], **cell.summary()}
        for (layer, j), cell in zip(cells, estimates, strict=True)
    ]


def run(cfg: PositionTracingConfig, progress: bool = True) -> dict[str, Any]:
    """Load the model and text, trace, and write ``positions.json``, ``positions.md`` and
    ``positions.png`` to ``cfg.out``; returns the JSON summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)  # before any work: an unusable folder fails now
    source = cfg.dataset if cfg.dataset is not None else default_corpus()
    texts = iter_texts(source, text_column=cfg.text_column)  # a missing path fails before the model
    model = load_model(cfg.model, device=cfg.device)
    check_layers(model, cfg.layers)
    tokens = document_windows(
        texts,
        model.tokenizer,
        2**cfg.max_log2_position,
        max_sequences=cfg.n_sequences,
    )
    if tokens.shape[0] < cfg.n_sequences:
        print(f"Note: {source} gave {tokens.shape[0]} windows of {2**cfg.max_log2_position} tokens")
    rows = trace_positions(
        model,
        tokens,
        cfg.layers,
        cfg.max_log2_position,
        cfg.recipe,
        hook=cfg.hook,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        progress=progress,
        reference=cfg.reference,
        checkpoint=out / TRAINING_CHECKPOINT,
    )
    config = {**asdict(cfg), "dataset": str(source), "n_sequences_used": int(tokens.shape[0])}
    summary = {"config": config, "cells": rows}
    write_json(out / "positions.json", summary)
    plot_entropy_curves(
        rows,
        out / "positions.png",
        x="position",
        curve="layer",
        xlabel="token position (tokens after BOS)",
        curve_label="layer",
        title=f"{cfg.model}, {cfg.hook}: hidden-state entropy by position",
        log2_x=True,
    )
    table = markdown_table(rows, [*_CELL_KEYS, *cell_columns(rows)])
    note = reliability_note(rows, lambda r: f"layer {r['layer']}, position {r['position']}")
    write_text(out / "positions.md", table + "\n" + note)
    shutil.rmtree(out / TRAINING_CHECKPOINT, ignore_errors=True)  # the results are written
    return summary
