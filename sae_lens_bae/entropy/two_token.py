"""Hidden-state entropy benchmark on a real LM (``bae bench two-token``).

Feed BOS + r tokens drawn uniformly and independently from two fixed tokens. The last token's
hidden state is a function of the sequence, so its entropy is at most that of the sequences: r
bits (and at most the plug-in entropy of the N sequences actually sampled, about log2 N once
2^r >> N). A BAE estimate above that ceiling would be an artefact of the estimator.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer

from sae_lens_bae.activations import check_layers
from sae_lens_bae.entropy.cells import (
    TRACING_RECIPE,
    EntropyRecipe,
    estimate_entropies,
)
from sae_lens_bae.entropy.states import first_token_ids, gather_states
from sae_lens_bae.reports import cell, markdown_table, write_json

__all__ = ["TwoTokenConfig", "run_two_token", "two_token_sequences"]


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
    layer: int = 15
    hook: str = "hook_resid_post"
    words: tuple[str, str] = ("yes", "no")  # each must start with its own token
    ranks: Sequence[int] = (0, 1, 2, 4, 6, 8, 10, 12)
    n_samples: int = 4096
    recipe: EntropyRecipe = TRACING_RECIPE
    batch_size: int = 64
    device: str = "cpu"
    seed: int = 0
    out: Path = Path("runs/two_token")


def trace_two_token(
    model: HookedTransformer, cfg: TwoTokenConfig, progress: bool = True
) -> list[dict[str, Any]]:
    """One row per r: BAE estimate, the ceilings r and sample entropy, reconstruction quality."""
    check_layers(model, [cfg.layer])
    cfg.recipe.check_samples(cfg.n_samples, f"n_samples={cfg.n_samples}")
    ids = first_token_ids(model.tokenizer, list(cfg.words))
    bos = model.tokenizer.bos_token_id
    hook = f"blocks.{cfg.layer}.{cfg.hook}"
    sets, sample_entropies = [], []
    for r in cfg.ranks:
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
        )
        sets.append(states[hook][:, 0])
        sample_entropies.append(sample_entropy)
    estimates = estimate_entropies(
        sets,
        cfg.recipe,
        seeds=[cfg.seed] * len(sets),
        device=str(model.cfg.device),
        progress=progress,
    )
    return [
        {
            "r": r,
            "sample_entropy_bits": h,
            **cell.summary(),
            "within_ceiling": cell.bits <= min(r, h) + max(1.0, 0.1 * r),
        }
        for r, h, cell in zip(cfg.ranks, sample_entropies, estimates, strict=True)
    ]


def run_two_token(cfg: TwoTokenConfig, progress: bool = True) -> list[dict[str, Any]]:
    """Load the model, run the benchmark, write ``two_token.json``/``.md``/``.png``."""
    from sae_lens_bae.models import load_model
    from sae_lens_bae.plots import plot_two_token_benchmark

    model = load_model(cfg.model, device=cfg.device)
    rows = trace_two_token(model, cfg, progress=progress)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "two_token.json", {"config": asdict(cfg), "results": rows})
    plot_two_token_benchmark(
        rows, out / "two_token.png", title=f"{cfg.model}, blocks.{cfg.layer}.{cfg.hook}"
    )
    table = markdown_table(
        rows,
        [
            ("r", lambda row: str(row["r"])),
            ("sample entropy", lambda row: f"{row['sample_entropy_bits']:.2f}"),
            ("BAE estimate", lambda row: cell(row["bits"], ".2f")),
            ("relative error", lambda row: cell(row["relative_error"], ".4f")),
            ("within ceiling", lambda row: "yes" if row["within_ceiling"] else "NO"),
        ],
    )
    (out / "two_token.md").write_text(table)
    return rows
