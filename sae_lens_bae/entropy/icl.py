"""Entropy of the last-token hidden state as in-context demonstrations are added
(``bae entropy icl``).

Each prompt is k demonstrations ``sentence: <x> sentiment: <label>`` (drawn at random per prompt,
each with its own label) followed by the query ``sentence: <q> sentiment:``. The same queries are
used for every k, so the cells differ only in their demonstrations. For every (layer, k) a BAE
estimates the entropy of the last token's states; the model's ICL accuracy per k is read from the
logits of the label words' first tokens at that token.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer
from transformers import PreTrainedTokenizerBase

from sae_lens_bae.activations import check_layers
from sae_lens_bae.entropy.cells import (
    CELL_COLUMNS,
    TRACING_RECIPE,
    EntropyRecipe,
    estimate_entropies,
)
from sae_lens_bae.entropy.states import first_token_ids, gather_states
from sae_lens_bae.reports import markdown_table, write_json

__all__ = [
    "ICLTemplate",
    "ICLTracingConfig",
    "build_icl_prompts",
    "encode_prompts",
    "load_icl_pairs",
    "run_icl_tracing",
    "trace_icl",
]


@dataclass(frozen=True)
class ICLTemplate:
    """How demonstrations and the query are written; ``{sentence}`` and ``{label}`` are filled."""

    demonstration: str = "sentence: {sentence} sentiment: {label}\n"
    query: str = "sentence: {sentence} sentiment:"

    def __post_init__(self) -> None:
        for name in ("demonstration", "query"):
            if "{sentence}" not in getattr(self, name):
                raise ValueError(f"The {name} template must contain {{sentence}}")
        if "{label}" not in self.demonstration or "{label}" in self.query:
            raise ValueError("Only the demonstration template holds {label} (the query asks it)")


def build_icl_prompts(
    pairs: Sequence[tuple[str, str]],
    shots: int,
    n_prompts: int,
    *,
    template: ICLTemplate | None = None,
    seed: int = 0,
) -> list[tuple[str, str]]:
    """``n_prompts`` (prompt, query label) pairs with ``shots`` demonstrations each.

    Queries are ``pairs[:n_prompts]`` (the same for every ``shots``), demonstrations are drawn
    without replacement from the remaining pairs, independently per prompt.
    """
    template = template or ICLTemplate()
    if n_prompts < 1 or shots < 0:
        raise ValueError(f"Need n_prompts >= 1 and shots >= 0, got {n_prompts} and {shots}")
    pool = list(pairs[n_prompts:])
    if len(pairs) < n_prompts or (shots and len(pool) < shots):
        raise ValueError(
            f"{len(pairs)} labelled sentences cannot give {n_prompts} queries plus {shots} "
            "demonstrations each; use fewer prompts or a larger set"
        )
    rng = random.Random(seed * 1000 + shots)
    prompts = []
    for sentence, label in pairs[:n_prompts]:
        demos = rng.sample(pool, shots)
        text = "".join(template.demonstration.format(sentence=x, label=y) for x, y in demos)
        prompts.append((text + template.query.format(sentence=sentence), label))
    return prompts


def encode_prompts(
    prompts: Sequence[str], tokenizer: PreTrainedTokenizerBase
) -> tuple[torch.Tensor, torch.Tensor]:
    """BOS + prompt ids, right-padded with BOS, and each row's last real position ([n, 1])."""
    bos = tokenizer.bos_token_id
    if bos is None:
        raise ValueError("ICL tracing needs a tokenizer with a bos_token")
    rows = [[bos, *tokenizer(p, add_special_tokens=False)["input_ids"]] for p in prompts]
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [bos] * (width - len(r)) for r in rows], dtype=torch.long)
    return tokens, torch.tensor([[len(r) - 1] for r in rows])


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
) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """Rows per (layer, k) with estimated bits and reconstruction, and ICL accuracy per k."""
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
    )
    rows = [
        {"layer": layer, "shots": k, "accuracy": accuracy[k], **cell.summary()}
        for (layer, k), cell in zip(cells, estimates, strict=True)
    ]
    return rows, accuracy


@dataclass
class ICLTracingConfig:
    """What ``bae entropy icl`` runs; the defaults are the reduced grid for a 2-core CPU."""

    dataset: str
    model: str = "smollm2-135m"
    split: str = "train"
    text_column: str | None = None
    label_column: str = "label"
    label_words: dict[str, str] | None = None
    layers: Sequence[int] = (5, 15, 25)
    shots: Sequence[int] = (0, 1, 2, 4, 8)
    n_prompts: int = 512
    max_sentence_words: int | None = 24
    template: ICLTemplate = field(default_factory=ICLTemplate)
    hook: str = "hook_resid_post"
    recipe: EntropyRecipe = TRACING_RECIPE
    batch_size: int = 16
    device: str = "cpu"
    seed: int = 0
    out: Path = Path("runs/entropy_icl")


def load_icl_pairs(cfg: Any) -> list[tuple[str, str]]:
    """The (sentence, label word) pairs a config names through its ``dataset``, ``split``,
    ``text_column``, ``label_column``, ``label_words`` and ``max_sentence_words`` fields (ICL
    tracing's and steering's configs both have them)."""
    from sae_lens_bae.data import load_labelled_sentences

    pairs = load_labelled_sentences(
        cfg.dataset,
        split=cfg.split,
        text_column=cfg.text_column,
        label_column=cfg.label_column,
        label_words=cfg.label_words,
    )
    if cfg.max_sentence_words is not None:  # long reviews would make 8-shot prompts very long
        pairs = [p for p in pairs if len(p[0].split()) <= cfg.max_sentence_words]
    return pairs


def run_icl_tracing(
    cfg: ICLTracingConfig, progress: bool = True
) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """Load model and sentences, trace, and write ``icl.json``, ``icl.md`` and ``icl.png``."""
    from sae_lens_bae.models import load_model
    from sae_lens_bae.plots import plot_entropy_by_layer

    pairs = load_icl_pairs(cfg)
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
    )
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "icl.json", {"config": asdict(cfg), "accuracy": accuracy, "cells": rows})
    plot_entropy_by_layer(rows, out / "icl.png", title=f"{cfg.model}: last-token entropy")
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
            *CELL_COLUMNS,
        ],
    )
    (out / "icl.md").write_text(table)
    return rows, accuracy
