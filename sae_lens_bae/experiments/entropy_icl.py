"""``bae entropy icl``: a BAE's code entropy and trust verdict on the last state per shot count.

Each prompt is k demonstrations ``sentence: <x> sentiment: <label>`` (drawn at random per prompt,
each with its own label) followed by the query ``sentence: <q> sentiment:``. The same queries are
used for every k, so the cells differ only in their demonstrations. For every (layer, k) a BAE
reads the last token's states, with the trust rule's verdict and the k-means reference beside
it; the model's ICL accuracy per k is read from the
logits of the label words' first tokens at that token.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer

from sae_lens_bae.activations import check_layers, gather_states
from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.entropy import TRACING_RECIPE, EntropyRecipe, estimate_entropies
from sae_lens_bae.entropy.tables import cell_columns, reliability_note
from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT, LabelledSentences, recipe_field
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import plot_entropy_curves
from sae_lens_bae.prompts import (
    ICLTemplate,
    build_icl_prompts,
    encode_prompts,
    first_token_ids,
)
from sae_lens_bae.reports import markdown_table, write_json, write_text

__all__ = ["REPORT", "ICLTracingConfig", "run", "trace_icl"]

REPORT = "icl.md"


def trace_icl(
    model: HookedTransformer,
    pairs: Sequence[tuple[str, str]],
    layers: Sequence[int],
    shots: Sequence[int] = (0, 1, 2, 4, 8),
    n_prompts: int = 512,
    recipe: EntropyRecipe = TRACING_RECIPE,
    *,
    hook: str = "hook_resid_post",
    template: ICLTemplate | None = None,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
    reference: bool = True,
    checkpoint: Path | None = None,
) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """Rows per (layer, k) with estimated bits and reconstruction, and ICL accuracy per k.
    ``checkpoint``: where the BAEs' training saves itself (``estimate_entropies``)."""
    recipe.check_samples(n_prompts, f"n_prompts={n_prompts}")
    labels = sorted({label for _, label in pairs})
    ids = first_token_ids(model.tokenizer, labels)
    hooks = [f"blocks.{layer}.{hook}" for layer in layers]
    shuffled = list(pairs)
    random.Random(seed).shuffle(shuffled)
    states: dict[tuple[int, int], torch.Tensor] = {}
    accuracy: dict[int, float] = {}
    for k in shots:
        prompts = build_icl_prompts(shuffled, k, n_prompts, template=template, seed=seed)
        tokens, last = encode_prompts([p for p, _ in prompts], model.tokenizer)
        order = torch.argsort(last[:, 0])  # similar lengths together: less padding per batch
        gathered, logits = gather_states(
            model,
            tokens[order],
            hooks,
            last[order],
            batch_size=batch_size,
            logit_tokens=ids,
            progress=progress,
            desc=f"k = {k}: {n_prompts} prompts of up to {tokens.shape[1]} tokens",
            keep=None if checkpoint is None else checkpoint / f"states-{k}-shots.pt",
        )
        assert logits is not None
        truth = torch.tensor([labels.index(y) for _, y in prompts])[order]
        accuracy[k] = (logits[:, 0].argmax(-1) == truth).float().mean().item()
        for layer, name in zip(layers, hooks, strict=True):
            states[(layer, k)] = gathered[name][:, 0]
    cells = list(states)
    estimates = estimate_entropies(
        [states[c] for c in cells],
        recipe,
        seeds=[seed] * len(cells),
        device=str(model.cfg.device),
        progress=progress,
        reference=reference,
        checkpoint=checkpoint,
    )
    rows = [
        {"layer": layer, "shots": k, "accuracy": accuracy[k], **cell.summary()}
        for (layer, k), cell in zip(cells, estimates, strict=True)
    ]
    return rows, accuracy


@dataclass
class ICLTracingConfig(LabelledSentences):
    """What ``bae entropy icl`` runs; the defaults are the reduced grid for a 2-core CPU."""

    layers: Sequence[int] = ranged((5, 15, 25), low=0)
    """Layers traced."""
    shots: Sequence[int] = ranged((0, 1, 2, 4, 8), low=0)
    """Numbers of demonstrations k."""
    n_prompts: int = ranged(512, low=1)
    """Queries (the same for every k)."""
    template: ICLTemplate = field(default_factory=ICLTemplate)
    """How demonstrations and the query are written."""
    hook: str = "hook_resid_post"
    """Hook point inside each block."""
    recipe: EntropyRecipe = recipe_field(TRACING_RECIPE)
    """How each cell's BAE is trained."""
    batch_size: int = ranged(16, low=1)
    """Prompts per forward pass."""
    device: str = "cpu"
    """Torch device."""
    reference: bool = True
    """Also read each cell with the smallest k-means code that reads it (the trust rule's errors
    under the ceiling; ``entropy.reference``): drawn beside the BAE's curve, in the table."""
    seed: int = 0
    """Seed of the prompts and the BAEs."""
    out: Path = Path("runs/entropy_icl")
    """Folder for the JSON, the tables and the plot."""

    def __post_init__(self) -> None:
        check_ranges(self)


def run(cfg: ICLTracingConfig, progress: bool = True) -> dict[str, Any]:
    """Load model and sentences, trace, and write ``icl.json``, ``icl.md`` and ``icl.png``;
    returns the JSON summary (accuracy per k, one row per cell)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)  # before any work: an unusable folder fails now
    pairs = cfg.pairs()
    model = load_model(cfg.model, device=cfg.device)
    check_layers(model, cfg.layers)
    rows, accuracy = trace_icl(
        model,
        pairs,
        cfg.layers,
        cfg.shots,
        cfg.n_prompts,
        cfg.recipe,
        hook=cfg.hook,
        template=cfg.template,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        progress=progress,
        reference=cfg.reference,
        checkpoint=out / TRAINING_CHECKPOINT,
    )
    summary = {"config": asdict(cfg), "accuracy": accuracy, "cells": rows}
    write_json(out / "icl.json", summary)
    plot_entropy_curves(
        rows,
        out / "icl.png",
        x="layer",
        curve="shots",
        xlabel="layer",
        curve_label="k =",
        title=f"{cfg.model}: last-token entropy with k demonstrations",
    )
    accuracies = [{"k": k, "accuracy": acc} for k, acc in accuracy.items()]
    table = markdown_table(
        accuracies,
        [("k", lambda row: str(row["k"])), ("ICL accuracy", lambda row: f"{row['accuracy']:.3f}")],
    )
    table += "\n" + markdown_table(
        rows,
        [
            ("layer", lambda row: str(row["layer"])),
            ("k", lambda row: str(row["shots"])),
            *cell_columns(rows),
        ],
    )
    note = reliability_note(rows, lambda r: f"layer {r['layer']}, k = {r['shots']}")
    write_text(out / "icl.md", table + "\n" + note)
    shutil.rmtree(out / TRAINING_CHECKPOINT, ignore_errors=True)  # the results are written
    return summary
