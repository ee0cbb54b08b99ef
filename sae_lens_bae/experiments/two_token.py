"""``bae bench two-token``: a BAE's code entropy of LM states after r tokens from two (<= r bits).

Feed BOS + r tokens drawn uniformly and independently from two fixed tokens. The last token's
hidden state is a function of the sequence, so its entropy is at most that of the sequences: r
bits (and at most the plug-in entropy of the N sequences actually sampled, about log2 N once
2^r >> N). A BAE estimate above that ceiling would be an artefact of the estimator.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformer_lens import HookedTransformer

from sae_lens_bae.activations import gather_states, hook_point
from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.entropy import TRACING_RECIPE, EntropyRecipe, estimate_entropies
from sae_lens_bae.entropy.tables import reliability_note
from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT, recipe_field
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import error_colour_bar, save_figure, subplots
from sae_lens_bae.prompts import first_token_ids
from sae_lens_bae.reports import cell, markdown_table, write_json, write_text

__all__ = [
    "REPORT",
    "TwoTokenConfig",
    "plot_two_token_benchmark",
    "run",
    "trace_two_token",
    "two_token_sequences",
]

REPORT = "two_token.md"


def two_token_sequences(
    tokens: tuple[int, int], r: int, n: int, bos: int, seed: int = 0
) -> tuple[torch.Tensor, float]:
    """``n`` rows of BOS + r tokens drawn uniformly from ``tokens``, and the plug-in entropy in
    bits of the sampled sequences."""
    generator = torch.Generator().manual_seed(seed * 1000 + r)
    choice = torch.randint(0, 2, (n, r), generator=generator)
    body = torch.where(choice.bool(), tokens[1], tokens[0])
    rows = torch.cat([torch.full((n, 1), bos), body], dim=1)
    counts = Counter(map(tuple, choice.tolist()))
    sample_entropy = -sum(c / n * math.log2(c / n) for c in counts.values())
    return rows, max(sample_entropy, 0.0) + 0.0  # + 0.0 turns -0.0 into 0.0


@dataclass
class TwoTokenConfig:
    """What ``bae bench two-token`` runs; the defaults fit a 2-core CPU."""

    model: str = "smollm2-135m"
    """Embedded name, local HF directory or TransformerLens name."""
    layer: int | None = ranged(None, low=0)
    """Block of a --hook inside a block (default: the middle one)."""
    hook: str = "hook_resid_post"
    """Hook point: a full TransformerLens name, or a name inside block --layer."""
    words: Sequence[str] = ("yes", "no")
    """The two words whose first tokens make the sequences (each its own first token)."""
    planted_bits: Sequence[int] = ranged((0, 1, 2, 4, 6, 8, 10, 12), low=0)
    """Sequence lengths r (each sequence carries r planted bits)."""
    n_samples: int = ranged(4096, low=1)
    """Sequences per r."""
    recipe: EntropyRecipe = recipe_field(TRACING_RECIPE)
    """How each r's BAE is trained."""
    batch_size: int = ranged(64, low=1)
    """Sequences per forward pass."""
    device: str = "cpu"
    """Torch device."""
    seed: int = 0
    """Seed of the sequences and the BAEs."""
    out: Path = Path("runs/two_token")
    """Folder for the JSON, the table and the plot."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if len(self.words) != 2:
            raise ValueError(f"words needs exactly two words, got {list(self.words)}")


def trace_two_token(
    model: HookedTransformer,
    cfg: TwoTokenConfig,
    progress: bool = True,
    checkpoint: Path | None = None,
) -> list[dict[str, Any]]:
    """One row per r: BAE estimate, the ceilings r and sample entropy, reconstruction quality.
    ``checkpoint``: where the BAEs' training saves itself (``estimate_entropies``)."""
    cfg.recipe.check_samples(cfg.n_samples, f"n_samples={cfg.n_samples}")
    ids = first_token_ids(model.tokenizer, list(cfg.words))
    bos = model.tokenizer.bos_token_id
    hook = hook_point(model, cfg.hook, cfg.layer)
    sets, sample_entropies = [], []
    for r in cfg.planted_bits:
        rows, sample_entropy = two_token_sequences(
            (ids[0], ids[1]), r, cfg.n_samples, bos, cfg.seed
        )
        states, _ = gather_states(
            model,
            rows,
            [hook],
            torch.full((rows.shape[0], 1), r),
            batch_size=cfg.batch_size,
            progress=progress,
            desc=f"r = {r}",
            keep=None if checkpoint is None else checkpoint / f"states-r{r}.pt",
        )
        sets.append(states[hook][:, 0])
        sample_entropies.append(sample_entropy)
    estimates = estimate_entropies(
        sets,
        cfg.recipe,
        seeds=[cfg.seed] * len(sets),
        device=str(model.cfg.device),
        progress=progress,
        checkpoint=checkpoint,
    )
    return [
        {
            "r": r,
            "sample_entropy_bits": h,
            **cell.summary(),
            "within_ceiling": cell.bits <= min(r, h) + max(1.0, 0.1 * r),
        }
        for r, h, cell in zip(cfg.planted_bits, sample_entropies, estimates, strict=True)
    ]


def run(cfg: TwoTokenConfig, progress: bool = True) -> dict[str, Any]:
    """Load the model, run the benchmark, write ``two_token.json``/``.md``/``.png``; returns
    the JSON summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)  # before any work: an unusable folder fails now
    model = load_model(cfg.model, device=cfg.device)
    rows = trace_two_token(model, cfg, progress=progress, checkpoint=out / TRAINING_CHECKPOINT)
    summary = {"config": asdict(cfg), "results": rows}
    write_json(out / "two_token.json", summary)
    plot_two_token_benchmark(
        rows, out / "two_token.png", title=f"{cfg.model}, {hook_point(model, cfg.hook, cfg.layer)}"
    )
    table = markdown_table(
        rows,
        [
            ("r", lambda row: str(row["r"])),
            ("sample entropy", lambda row: f"{row['sample_entropy_bits']:.2f}"),
            ("BAE estimate", lambda row: cell(row["bits"], ".2f")),
            ("± seeds", lambda row: cell(row.get("bits_std"), ".2f")),
            ("relative error", lambda row: cell(row["relative_error"], ".4f")),
            ("within ceiling", lambda row: "yes" if row["within_ceiling"] else "NO"),
            ("reliable", lambda row: "yes" if row["reliable"] else "NO"),
        ],
    )
    verdict = all(row["within_ceiling"] for row in rows)
    note = reliability_note(rows, lambda row: f"r = {row['r']}")
    write_text(
        out / "two_token.md", f"{table}\nevery estimate within its ceiling: {verdict}\n\n{note}"
    )
    shutil.rmtree(out / TRAINING_CHECKPOINT, ignore_errors=True)  # the results are written
    return summary


def plot_two_token_benchmark(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Estimate against r for r-token sequences over two tokens, with the ceilings drawn: r bits
    and the plug-in entropy of the sequences actually sampled."""
    fig, ax = subplots(figsize=(6.5, 5))
    rs = [row["r"] for row in rows]
    ax.plot(rs, rs, "k--", linewidth=1, label="r (entropy of the sequence source)")
    ax.plot(
        rs,
        [row["sample_entropy_bits"] for row in rows],
        ":",
        color="gray",
        label="plug-in entropy of the sampled sequences",
    )
    scatter = ax.scatter(
        rs,
        [row["bits"] for row in rows],
        c=[np.nan if row["relative_error"] is None else row["relative_error"] for row in rows],
        cmap="viridis",
        s=45,
        zorder=3,
        edgecolors="k",
        linewidths=0.3,
        label="BAE estimate",
    )
    ax.set(xlabel="sequence length r (bits of randomness)", ylabel="bits", title=title)
    ax.legend(fontsize=8, loc="upper left")
    error_colour_bar(fig, ax, scatter)
    return save_figure(fig, path)
