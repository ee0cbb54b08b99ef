"""``bae entropy estimate``: a BAE's code entropy of your own hidden states, with its trust verdict.

The states come from files (``--states``), each holding one or more sets ``[n, d]``: a ``.pt``
tensor (or a dict of named tensors), an ``.npy`` array, a ``.safetensors`` file (every tensor a
set, named by its key) or an activation cache folder (``harvest_activations``; every hook a set).
Without files they are harvested: the hook point ``--hook``/``--layer`` of ``--model`` over
``--dataset``, every position but BOS's as one set, or each of ``--positions`` as its own.
``estimate_entropies`` trains one BAE per set with the recipe's settings and writes
``entropy.json``, ``entropy.md`` and ``entropy.png``: each set's bits (with their spread over
seeds from ``--seeds 2`` on) and the trust columns that say whether the reading is an estimate
or only a bound.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from sae_lens_bae.activations.cache import ActivationCache
from sae_lens_bae.activations.hooks import hook_point
from sae_lens_bae.activations.states import gather_states
from sae_lens_bae.checks import check_ranges, existing, ranged
from sae_lens_bae.data import default_corpus, iter_texts, token_rows, tokenize_texts
from sae_lens_bae.entropy.cells import estimate_entropies
from sae_lens_bae.entropy.recipe import EntropyRecipe
from sae_lens_bae.entropy.tables import cell_columns, reliability_note
from sae_lens_bae.models import load_model
from sae_lens_bae.outliers import NORM_RATIO
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.reports import markdown_table, read_torch, write_json, write_text

__all__ = ["REPORT", "EstimateConfig", "harvest_state_sets", "read_state_sets", "run"]

REPORT = "entropy.md"

_FIX = "give [n, d] states as .pt, .npy or .safetensors files, or an activation cache folder"


@dataclass
class EstimateConfig:
    """What ``bae entropy estimate`` reads and how it trains its BAEs."""

    states: Sequence[Path] | None = existing("path", _FIX, default=None)
    """Files (or activation cache folders) of states [n, d], a set per tensor (default: harvest)."""
    model: str = "smollm2-135m"
    """Without --states: embedded name, local HF directory or TransformerLens name."""
    dataset: str | None = None
    """Without --states: text file, folder or HF dataset (default: the embedded corpus)."""
    hook: str = "hook_resid_post"
    """Hook point: a full TransformerLens name, or a name inside block --layer."""
    layer: int | None = ranged(None, low=0)
    """Block of a --hook inside a block (default: the middle one)."""
    text_column: str | None = None
    """Text column of a table/JSONL dataset."""
    context_size: int = ranged(64, low=2)
    """Tokens per harvested sequence, BOS included."""
    max_sequences: int = ranged(1024, low=1)
    """Cap on harvested sequences (with --positions: the states of each set)."""
    positions: Sequence[int] | None = ranged(None, low=1)
    """Token positions after BOS, each its own set, e.g. 1,4,16 (default: all, one set)."""
    recipe: EntropyRecipe = field(default_factory=EntropyRecipe)
    """How each set's BAEs train (sae_lens_bae.entropy.EntropyRecipe)."""
    outlier_norm_ratio: float | None = ranged(NORM_RATIO, above=1.0)
    """Extreme states (norm above this times the set's median) are dropped and counted; none
    keeps them."""
    seed: int = 0
    """Seed of the first BAE of every set (the recipe's seeds count up from it)."""
    device: str = "cpu"
    """Torch device."""
    out: Path = Path("runs/entropy")
    """Folder for entropy.json and entropy.md."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.positions and max(self.positions) >= self.context_size:
            raise ValueError(
                f"positions go up to {self.context_size - 1} in sequences of "
                f"{self.context_size} tokens; ask for smaller ones or a larger --context-size"
            )
        if self.states is None and self.positions:  # a state per sequence and position
            self.recipe.check_samples(self.max_sequences, f"--max-sequences {self.max_sequences}")


def read_state_sets(paths: Sequence[str | Path]) -> dict[str, Tensor]:
    """Every set of states in ``paths`` by name (the file's name, with the tensor's key or the
    hook where a file holds several), as float32 ``[n, d]``; anything else is refused in one
    line naming the file."""
    sets: dict[str, Tensor] = {}
    for path in map(Path, paths):
        for key, states in _read(path).items():
            name = path.stem if key is None else f"{path.stem}:{key}"
            if not isinstance(states, Tensor) or states.ndim != 2 or states.shape[0] < 2:
                shape = tuple(states.shape) if isinstance(states, Tensor) else type(states).__name__
                raise ValueError(f"{name} is not a set of states [n >= 2, d] ({shape}); {_FIX}")
            if not torch.isfinite(states).all():
                raise ValueError(f"{name} holds NaN or infinite states; give finite ones")
            sets[name] = states.float()
    return sets


def _read(path: Path) -> dict[str | None, Any]:
    """The tensors of one file or cache folder, by key (None for a file of one tensor)."""
    if path.is_dir():
        cache = ActivationCache.load(path)
        return {hook: cache.activations(hook) for hook in cache.hooks}
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            return {None: torch.from_numpy(np.load(path, allow_pickle=False))}
        except (ValueError, OSError) as error:
            why = type(error).__name__
            raise ValueError(f"{path} is not a NumPy array ({why}); {_FIX}") from None
    if suffix == ".safetensors":
        try:
            return dict(load_file(path))
        except (SafetensorError, OSError) as error:
            raise ValueError(f"{path} is not a safetensors file ({error}); {_FIX}") from None
    if suffix in (".pt", ".pth"):
        loaded = read_torch(path, "a torch file of states", _FIX, weights_only=True)
        return dict(loaded) if isinstance(loaded, dict) else {None: loaded}
    raise ValueError(f"{path}: states come in .pt, .npy or .safetensors files or cache folders")


def harvest_state_sets(cfg: EstimateConfig, progress: bool = True) -> dict[str, Tensor]:
    """The sets ``cfg`` asks a model for: its hook point's states over the dataset's sequences,
    every position after BOS as one set, or one set per position of ``cfg.positions``."""
    source = cfg.dataset if cfg.dataset is not None else str(default_corpus())
    texts = iter_texts(source, text_column=cfg.text_column)  # a missing path fails before the model
    model = load_model(cfg.model, device=cfg.device)
    hook = hook_point(model, cfg.hook, cfg.layer)
    tokens = token_rows(
        tokenize_texts(texts, model.tokenizer, cfg.context_size, max_sequences=cfg.max_sequences)
    )
    wanted = list(cfg.positions) if cfg.positions else list(range(1, tokens.shape[1]))
    positions = torch.tensor(wanted).expand(tokens.shape[0], -1)
    states = gather_states(model, tokens, [hook], positions, progress=progress)[0][hook]
    if not cfg.positions:
        return {hook: states.reshape(-1, states.shape[-1]).float()}
    return {f"{hook}@{p}": states[:, j].float() for j, p in enumerate(wanted)}


def _outlier_note(rows: list[dict[str, Any]], ratio: float | None) -> str:
    """The report's line on extreme states: how many each set had set aside, or that none
    were looked for."""
    if ratio is None:
        return "Extreme states kept (--outlier-norm-ratio none)."
    counts = ", ".join(f"{r['set']} {r['outliers_dropped']}" for r in rows)
    return (
        f"Extreme states (norm above {ratio:g}x the set's median norm) set aside before "
        f"training: {counts}."
    )


def plot_bits(rows: list[dict[str, Any]], path: Path) -> Path:
    """Bits per set with the seeds' spread; a reading the trust columns refuse is drawn hollow."""
    fig, ax = subplots(figsize=(max(4.0, 0.6 * len(rows) + 2), 3.2))
    x = np.arange(len(rows))
    bits = np.array([r["bits"] for r in rows], dtype=float)
    spread = np.array([r["bits_std"] or 0.0 for r in rows], dtype=float)
    trusted = np.array([bool(r["reliable"]) for r in rows])
    ax.bar(x[trusted], bits[trusted], yerr=spread[trusted], color="tab:blue", capsize=3)
    ax.bar(
        x[~trusted],
        bits[~trusted],
        yerr=spread[~trusted],
        capsize=3,
        fill=False,
        edgecolor="tab:gray",
        hatch="//",
        label="not reliable (see entropy.md)",
    )
    ax.set_xticks(x, [r["set"] for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("entropy (bits)")
    if not trusted.all():
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def run(cfg: EstimateConfig, progress: bool = True) -> dict[str, Any]:
    """Read or harvest the sets, estimate their entropy and write ``entropy.json``,
    ``entropy.md`` and ``entropy.png`` to ``cfg.out``; returns the summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)  # before any work: an unusable folder fails now
    if cfg.states is not None:
        sets = read_state_sets(cfg.states)
    else:
        sets = harvest_state_sets(cfg, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    for name, states in sets.items():
        cfg.recipe.check_samples(states.shape[0], f"{name}'s {states.shape[0]} states")
    cells = estimate_entropies(
        list(sets.values()),
        cfg.recipe,
        seeds=[cfg.seed] * len(sets),
        device=cfg.device,
        progress=progress,
        outlier_norm_ratio=cfg.outlier_norm_ratio,
    )
    rows = [
        {"set": name, "n": int(states.shape[0]), "d": int(states.shape[1]), **cell.summary()}
        for (name, states), cell in zip(sets.items(), cells, strict=True)
    ]
    config = json.loads(json.dumps(asdict(cfg), default=str))
    summary = {"config": config, "sets": rows}
    write_json(out / "entropy.json", summary)
    keys = [("set", lambda r: r["set"]), ("n", lambda r: str(r["n"])), ("d", lambda r: str(r["d"]))]
    table = markdown_table(rows, [*keys, *cell_columns(rows)])
    note = reliability_note(rows, lambda r: r["set"])
    write_text(out / REPORT, f"{table}\n{note}\n\n{_outlier_note(rows, cfg.outlier_norm_ratio)}\n")
    plot_bits(rows, out / "entropy.png")
    return summary
