"""The synthetic benchmark's grids (``bae bench synthetic --grid ...``): data sizes, ranks,
seeds and the ``EntropyRecipe`` each grid trains with. What each grid was measured to do, and
how its recipe was found: docs/research/synthetic-entropy.md."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from sae_lens_bae.entropy import EntropyRecipe

__all__ = ["GRIDS", "SyntheticGrid", "tolerance"]


@dataclass(frozen=True)
class SyntheticGrid:
    """One benchmark grid: data size and the recipe every BAE of the grid is trained with (its
    ``expansion`` is replaced by each of ``expansions``)."""

    d: int
    ranks: tuple[int, ...]
    expansions: tuple[int, ...]
    seeds: tuple[int, ...]
    n_train: int
    n_test: int
    recipe: EntropyRecipe
    tolerance_fraction: float = 0.1
    tolerance_floor: float = 1.0
    ablation: bool = True  # also train every cell without the objective (a_e = a_c = 0)
    states_per_rank_squared: float = 0.0
    """The training set of rank r holds at least this many times r^2 states (0: ``n_train`` at
    every r). From a random start r planted bits are found only from about r^2 states or more,
    by a BAE as by FastICA (docs/research/synthetic-entropy.md)."""

    def train_states(self, r: int) -> int:
        """Training states of the cells of rank r."""
        return max(self.n_train, math.ceil(self.states_per_rank_squared * r * r))

    def tolerance(self, r: int) -> float:
        """The accuracy bar: within max(floor, fraction * r) bits of r."""
        return max(self.tolerance_floor, self.tolerance_fraction * r)

    def record(self) -> dict[str, Any]:
        """The grid as JSON values, its recipe flat (what ``synthetic.json`` records)."""
        return json.loads(json.dumps({**asdict(self), "recipe": self.recipe.record()}))

    @property
    def groups(self) -> list[tuple[int, bool]]:
        """(expansion, objective) of each stacked training, in the order a run trains them."""
        objectives = (True, False) if self.ablation else (True,)
        return [(expansion, objective) for expansion in self.expansions for objective in objectives]


_PAPER_D = 2048
"""The paper's hidden-state dimension, that of its synthetic grid."""

GRIDS: dict[str, SyntheticGrid] = {
    # d = 64, r up to 32, 2x and 4x, with the ablation: the CPU grid
    "cpu": SyntheticGrid(
        d=64,
        ranks=(0, 1, 2, 4, 8, 16, 32),
        expansions=(2, 4),
        seeds=(0, 1, 2),
        n_train=16384,
        n_test=4096,
        recipe=EntropyRecipe.of(steps=4000, lr=4e-3),
    ),
    # d = 256, r up to 128 at the paper's bar (0.05 r bits at < 2% held-out error)
    "mid": SyntheticGrid(
        d=256,
        ranks=(0, 1, 4, 16, 64, 128),
        expansions=(2,),
        seeds=(0, 1, 2),
        n_train=16384,
        n_test=4096,
        recipe=EntropyRecipe.of(steps=12000, lr=4e-3),
        tolerance_fraction=0.05,
        tolerance_floor=0.0,
        ablation=False,
    ),
    # the paper's scale (d = 2048, r up to 512), for a GPU
    "gpu": SyntheticGrid(
        d=_PAPER_D,
        ranks=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        expansions=(2, 4),
        seeds=(0, 1, 2),
        n_train=65536,
        n_test=8192,
        recipe=EntropyRecipe.long_run(_PAPER_D, restarts=3),  # the grid sets each expansion
        tolerance_fraction=0.05,
        tolerance_floor=0.0,
        states_per_rank_squared=2.0,
    ),
    # seconds, for tests
    "test": SyntheticGrid(
        d=16,
        ranks=(0, 2, 4),
        expansions=(2,),
        seeds=(0,),
        n_train=2048,
        n_test=512,
        recipe=EntropyRecipe(steps=300),
    ),
}


def tolerance(r: int) -> float:
    """The ``cpu`` grid's accuracy bar: within max(1, 0.1 r) bits."""
    return max(1.0, 0.1 * r)
