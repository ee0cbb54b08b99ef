"""``bae bench llm-truth``: an LLM's own hidden states whose entropy is known, and the readings.

A causal model's state at token position p is a deterministic function of the tokens up to p
(the BOS and the p tokens after it); at the embedding hook, of the token at p alone. So a set of
such states holds exactly the entropy of those tokens' empirical distribution, which counting
gives: the plug-in entropy of the distinct prefixes (or tokens). Each cell (a hook, a position
after BOS, a number of states) is read by its own BAE and by the k-means reference, beside its
truth and the joint entropy of the BAE's code on the set.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from sae_lens_bae.activations import gather_states
from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.data import default_corpus, document_windows, iter_texts
from sae_lens_bae.entropy import TRACING_RECIPE, EntropyRecipe, estimate_entropies
from sae_lens_bae.entropy.estimate import set_tolerance
from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT, recipe_field
from sae_lens_bae.experiments.llm_truth_report import write_outputs
from sae_lens_bae.models import load_model

__all__ = [
    "LLM_TRUTH_RECIPE",
    "REPORT",
    "LLMTruthConfig",
    "TruthCell",
    "parse_cell",
    "run",
    "token_truth",
]

REPORT = "llm-truth.md"

EMBEDDING_HOOK = "hook_embed"
"""The hook whose state at position p is a function of the token at p alone."""

LLM_TRUTH_RECIPE = TRACING_RECIPE.changed(seeds=1)
"""The tracing recipe with one seed: twelve cells of 576-dimensional states within 15 minutes
on 2 CPU cores."""


def token_truth(tokens: Int[Tensor, "n ctx"], position: int, embedding: bool) -> tuple[float, int]:
    """The entropy in bits of the states at ``position`` of these rows (BOS at index 0, so
    position p is the p-th token after it), and how many distinct token keys determine them:
    the plug-in entropy of the distinct prefixes ``tokens[:, :p + 1]`` or, at the embedding hook
    (``embedding``), of the distinct tokens ``tokens[:, p]``."""
    if not 0 <= position < tokens.shape[1]:
        raise ValueError(f"position must be in [0, {tokens.shape[1] - 1}], got {position}")
    keys = tokens[:, position : position + 1] if embedding else tokens[:, : position + 1]
    counts = Counter(map(tuple, keys.tolist()))
    n = keys.shape[0]
    bits = -sum(c / n * math.log2(c / n) for c in counts.values())
    return max(bits, 0.0) + 0.0, len(counts)


@dataclass(frozen=True)
class TruthCell:
    """One set: the states of ``hook`` at ``position`` (after BOS) of ``n_states`` windows."""

    hook: str
    position: int
    n_states: int

    @property
    def embedding(self) -> bool:
        return self.hook == EMBEDDING_HOOK


def parse_cell(spec: str, hook: str = "hook_resid_post") -> tuple[str, int]:
    """``"15@2"`` -> (``blocks.15.<hook>``, 2); ``"embed@1"`` -> (``hook_embed``, 1); a full hook
    name before the ``@`` is kept as it is."""
    name, at, position = spec.partition("@")
    if not at or not position.strip().isdigit() or not name.strip():
        raise ValueError(
            f"a cell is LAYER@POSITION, embed@POSITION or HOOK@POSITION (e.g. 15@2), got {spec!r}"
        )
    name = name.strip()
    if name.isdigit():
        name = f"blocks.{name}.{hook}"
    elif name == "embed":
        name = EMBEDDING_HOOK
    if int(position) < 1:
        raise ValueError(f"positions count tokens after BOS, from 1; got {spec!r}")
    return name, int(position)


@dataclass
class LLMTruthConfig:
    """What ``bae bench llm-truth`` runs; the defaults fit 15 minutes on a 2-core CPU."""

    model: str = "smollm2-135m"
    """Embedded name, local HF directory or TransformerLens name."""
    dataset: str | None = None
    """Text file, folder or HF dataset (default: the embedded corpus)."""
    text_column: str | None = None
    """Text column of a table/JSONL dataset."""
    cells: Sequence[str] = ("embed@1", "5@1", "15@1", "25@1", "15@2", "25@2")
    """(hook, position after BOS) cells: LAYER@P (the block's --hook), embed@P or HOOK@P."""
    hook: str = "hook_resid_post"
    """Hook point inside a block, for the LAYER@P cells."""
    sample_sizes: Sequence[int] = ranged((1024, 4096), low=1)
    """States per set: every cell is read at each size (the first windows of one shuffle)."""
    window: int = ranged(8, low=1)
    """Tokens after BOS per document window (windows never cross a document)."""
    recipe: EntropyRecipe = recipe_field(LLM_TRUTH_RECIPE)
    """How each cell's BAE is trained."""
    batch_size: int = ranged(64, low=1)
    """Windows per forward pass."""
    device: str = "cpu"
    """Torch device."""
    reference: bool = True
    """Also read each cell with the k-means reference (entropy.reference)."""
    seed: int = 0
    """Seed of the windows' shuffle and of the BAEs."""
    out: Path = Path("runs/llm_truth")
    """Folder for the JSON, the table and the plot."""

    def __post_init__(self) -> None:
        check_ranges(self)
        specs = [parse_cell(spec, self.hook) for spec in self.cells]
        if not specs:
            raise ValueError("--cells needs at least one cell")
        if max(position for _, position in specs) > self.window:
            raise ValueError(f"a cell's position is past the window of {self.window} tokens")

    def truth_cells(self) -> list[TruthCell]:
        """Every (cell, sample size), sizes outermost."""
        specs = [parse_cell(spec, self.hook) for spec in self.cells]
        return [TruthCell(h, p, n) for n in self.sample_sizes for h, p in specs]


def _windows(cfg: LLMTruthConfig, tokenizer: Any) -> tuple[Tensor, str]:
    """The shuffled windows the sets are cut from (as many as the largest size), and the text."""
    source = cfg.dataset if cfg.dataset is not None else default_corpus()
    rows = document_windows(iter_texts(source, text_column=cfg.text_column), tokenizer, cfg.window)
    needed = max(cfg.sample_sizes)
    if rows.shape[0] < needed:
        raise ValueError(
            f"{source} gives {rows.shape[0]} windows of {cfg.window} tokens, fewer than the "
            f"largest sample size {needed}; use smaller --sample-sizes, a shorter --window or "
            "more text"
        )
    order = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(cfg.seed))
    return rows[order[:needed]], str(source)


def truth_rows(
    cells: Sequence[TruthCell], tokens: Tensor, states: dict[str, Tensor], positions: list[int]
) -> tuple[list[dict[str, Any]], list[Tensor]]:
    """Each cell's truth (``token_truth`` on its windows) and its set of states."""
    rows, sets = [], []
    for cell in cells:
        bits, distinct = token_truth(tokens[: cell.n_states], cell.position, cell.embedding)
        rows.append({**asdict(cell), "truth_bits": bits, "distinct": distinct})
        sets.append(states[cell.hook][: cell.n_states, positions.index(cell.position)])
    return rows, sets


def read_row(row: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """A cell's row: its truth, the BAE's reading with the trust columns, the joint entropy of
    the BAE's code on the set and the k-means reference; ``off`` is the reading less the truth,
    ``within`` whether it is inside max(0.25 bit, 3%) of it (``set_tolerance``)."""
    off = summary["bits"] - row["truth_bits"]
    return {
        **row,
        **summary,
        "joint_code_bits": summary["code_bits"],
        "off_bits": off,
        "within_tolerance": abs(off) <= set_tolerance(row["truth_bits"]),
        "wrong_but_reliable": summary["reliable"] and abs(off) > set_tolerance(row["truth_bits"]),
    }


def run(cfg: LLMTruthConfig, progress: bool = True) -> dict[str, Any]:
    """Harvest the cells' states, read each with a BAE and the reference, and write
    ``llm-truth.json``, ``llm-truth.md`` and ``llm-truth.png`` to ``cfg.out``."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)  # before any work: an unusable folder fails now
    cells = cfg.truth_cells()
    cfg.recipe.check_samples(min(cfg.sample_sizes), f"--sample-sizes {min(cfg.sample_sizes)}")
    model = load_model(cfg.model, device=cfg.device)
    tokens, source = _windows(cfg, model.tokenizer)
    positions = sorted({c.position for c in cells})
    checkpoint = out / TRAINING_CHECKPOINT
    states, _ = gather_states(
        model,
        tokens[:, : positions[-1] + 1],
        sorted({c.hook for c in cells}),
        torch.tensor(positions).expand(tokens.shape[0], -1),
        batch_size=cfg.batch_size,
        progress=progress,
        keep=checkpoint / "states.pt",
    )
    rows, sets = truth_rows(cells, tokens, states, positions)
    estimates = estimate_entropies(
        sets,
        cfg.recipe,
        seeds=[cfg.seed] * len(sets),
        device=cfg.device,
        progress=progress,
        reference=cfg.reference,
        checkpoint=checkpoint,
    )
    rows = [read_row(row, e.summary()) for row, e in zip(rows, estimates, strict=True)]
    summary = {"config": {**asdict(cfg), "dataset": source}, "rows": rows}
    write_outputs(summary, out, cfg.model)
    shutil.rmtree(checkpoint, ignore_errors=True)  # the results are written
    return summary
