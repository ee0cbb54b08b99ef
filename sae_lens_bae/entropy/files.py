"""``bae entropy estimate``: the entropy of hidden states you already have, read from files.

Each file holds one or more sets of states, each ``[n, d]``: a ``.pt`` tensor (or a dict of
named tensors), an ``.npy`` array, a ``.safetensors`` file (every tensor a set, named by its key)
or an activation cache folder (``harvest_activations``; every hook a set). ``estimate_entropies``
trains one BAE per set with ``--recipe``'s settings and writes ``entropy.json`` and
``entropy.md``: each set's bits with the trust columns that say whether the reading is an
estimate or only a bound.
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
from sae_lens_bae.checks import check_ranges, existing
from sae_lens_bae.entropy.cells import estimate_entropies
from sae_lens_bae.entropy.recipe import EntropyRecipe
from sae_lens_bae.entropy.tables import cell_columns, reliability_note
from sae_lens_bae.reports import markdown_table, read_torch, write_json, write_text

__all__ = ["REPORT", "EstimateConfig", "estimate", "read_state_sets"]

REPORT = "entropy.md"

_FIX = "give [n, d] states as .pt, .npy or .safetensors files, or an activation cache folder"


@dataclass
class EstimateConfig:
    """What ``bae entropy estimate`` reads and how it trains its BAEs."""

    states: Sequence[Path] = existing("path", _FIX)
    """Files (or activation cache folders) of hidden states, each [n, d]: one set per tensor."""
    recipe: EntropyRecipe = field(default_factory=EntropyRecipe)
    """How each set's BAEs train (sae_lens_bae.entropy.EntropyRecipe)."""
    seed: int = 0
    """Seed of the first BAE of every set (the recipe's seeds count up from it)."""
    device: str = "cpu"
    """Torch device."""
    out: Path = Path("runs/entropy")
    """Folder for entropy.json and entropy.md."""

    def __post_init__(self) -> None:
        check_ranges(self)


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


def estimate(cfg: EstimateConfig, progress: bool = True) -> dict[str, Any]:
    """Read the sets, estimate their entropy and write ``entropy.json`` and ``entropy.md`` to
    ``cfg.out``; returns the summary."""
    sets = read_state_sets(cfg.states)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, states in sets.items():
        cfg.recipe.check_samples(states.shape[0], f"{name}'s {states.shape[0]} states")
    cells = estimate_entropies(
        list(sets.values()),
        cfg.recipe,
        seeds=[cfg.seed] * len(sets),
        device=cfg.device,
        progress=progress,
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
    write_text(out / REPORT, table + "\n" + reliability_note(rows, lambda r: r["set"]))
    return summary
