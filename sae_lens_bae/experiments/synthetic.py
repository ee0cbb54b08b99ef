"""``bae bench synthetic``: hidden states whose entropy is known exactly, and BAEs' estimates.

Sample an orthonormal basis M in R^{r x d} and independent fair bits c in {0,1}^r; the instances
c M take 2^r equally likely values, so their entropy is exactly r bits. A BAE trained with the
entropy objective should estimate r; one trained without it (a_e = a_c = 0) should not. Every
BAE of one (expansion, objective) cell is trained in one ``StackedBAE``.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.entropy import estimate_entropies
from sae_lens_bae.entropy.planted import planted_cell, recovered_bits
from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT
from sae_lens_bae.experiments.synthetic_grids import GRIDS, SyntheticGrid, tolerance
from sae_lens_bae.experiments.synthetic_report import (
    earlier_rows,
    passes_bar,
    summarise,
    thin_history,
    write_outputs,
)

__all__ = [
    "GRIDS",
    "REPORT",
    "SyntheticConfig",
    "SyntheticGrid",
    "passes_bar",
    "run",
    "run_grid",
    "tolerance",
]

REPORT = "synthetic.md"


@dataclass
class SyntheticConfig:
    """What ``bae bench synthetic`` runs: a grid, optionally with parts of it replaced."""

    grid: str = "cpu"
    """cpu (d = 64, a 2-core machine, about 6 minutes), mid (d = 256, r up to 128, about 26
    minutes on 2 cores), gpu (d = 2048, the paper's scale) or test (seconds)."""
    steps: int | None = ranged(None, low=1)
    """Training steps of every BAE (default: the grid's)."""
    planted_bits: Sequence[int] | None = ranged(None, low=0)
    """Planted bits r (the data's entropy), e.g. 0,8,64 (default: the grid's)."""
    expansions: Sequence[int] | None = ranged(None, low=1)
    """Expansion rates d_sae / d, e.g. 4 (default: the grid's)."""
    seeds: Sequence[int] | None = ranged(None, low=0)
    """Seeds, e.g. 0,1 (default: the grid's)."""
    restarts: int | None = ranged(None, low=1)
    """BAEs per cell, of which the one with the lowest held-out objective is kept (default: the
    grid's; ``EntropyRecipe.restarts``): runs from other starts can stay in a worse minimum.
    Multiplies the training cost."""
    drain_hold: float | None = ranged(None, low=0.0)
    """Hold the learning-rate schedule while a code still drains, for at most this fraction of
    the steps more (default: the grid's, 1 for gpu, 0 elsewhere; ``EntropyRecipe.drain_hold``):
    0 gives a fixed-length schedule."""
    ablation: bool | None = None
    """Also train every cell without the objective, to show it is what makes the estimate right
    (default: the grid's; --no-ablation halves the run)."""
    resume: bool = True
    """Keep the groups an earlier run of this same grid wrote to --out and train only the rest
    (--no-resume trains everything again)."""
    device: str = "cpu"
    """Torch device (the gpu grid wants one)."""
    out: Path = Path("runs/synthetic")
    """Folder for the JSON, the table and the plots."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.grid not in GRIDS:
            raise ValueError(f"unknown grid {self.grid!r}; choose from {sorted(GRIDS)}")
        chosen = self.chosen_grid()
        if max(chosen.ranks) > chosen.d:
            raise ValueError(f"planted bits go up to d = {chosen.d} in grid {self.grid!r}")

    def chosen_grid(self) -> SyntheticGrid:
        """The grid with this config's replacements."""
        chosen = GRIDS[self.grid]
        if self.steps is not None:
            warm = chosen.recipe.optimiser.lr_warm_up_steps
            if self.steps <= warm:
                raise ValueError(
                    f"--steps {self.steps} does not pass the {self.grid} grid's "
                    f"{warm} lr warm-up steps; use more than {warm}"
                )
            chosen = replace(chosen, recipe=chosen.recipe.changed(steps=self.steps))
        if self.restarts is not None:
            chosen = replace(chosen, recipe=chosen.recipe.changed(restarts=self.restarts))
        if self.drain_hold is not None:
            chosen = replace(chosen, recipe=chosen.recipe.changed(drain_hold=self.drain_hold))
        for name, field_name in (
            ("planted_bits", "ranks"),
            ("expansions", "expansions"),
            ("seeds", "seeds"),
        ):
            values = getattr(self, name)
            if values is not None:
                chosen = replace(chosen, **{field_name: tuple(values)})
        if self.ablation is not None:
            chosen = replace(chosen, ablation=self.ablation)
        return chosen


def run(cfg: SyntheticConfig, progress: bool = True) -> dict[str, Any]:
    """Run the config's grid and write ``synthetic.json``/``.md`` and the plots to ``cfg.out``;
    returns the JSON summary (grid, one row per BAE, the accuracy bar's verdict)."""
    grid = cfg.chosen_grid()
    Path(cfg.out).mkdir(parents=True, exist_ok=True)  # before any work: an unusable folder fails
    rows = run_grid(grid, cfg.out, progress=progress, device=cfg.device, resume=cfg.resume)
    return summarise(grid, rows)


def _row(
    r: int,
    seed: int,
    n_train: int,
    expansion: int,
    objective: bool,
    cell: Any,
    test: Any,
    bits: Any,
) -> dict[str, Any]:
    """One BAE's row of ``synthetic.json``."""
    return {
        "r": r,
        "seed": seed,
        "n_train": n_train,
        "expansion": expansion,
        "objective": objective,
        "estimate_bits": cell.bits,
        "reconstruction_mse": cell.reconstruction_mse,
        # held-out SSE as a fraction of the data variance (None for r = 0)
        "relative_error": cell.relative_error,
        # the same with the decoder as trained, before its least-squares refit
        "trained_relative_error": cell.trained_relative_error,
        # planted bits some bit of the code copies on >= RECOVERED of the held-out states
        "recovered_bits": recovered_bits(cell.codes(test), bits),
        "steps": cell.steps,  # at most the recipe's; fewer once converged
        "restart_objectives": cell.restart_objectives,  # None without restarts
        "restart_bits": cell.restart_bits,  # each restart's estimate, or None
        "knocked_out_bits": cell.knocked_out_bits,  # per seed (entropy.repair)
        "repair_steps": cell.repair_steps,  # trained by the repairs, beyond steps
    }


def run_grid(
    grid: SyntheticGrid,
    out_dir: str | Path | None = None,
    progress: bool = True,
    device: str = "cpu",
    resume: bool = True,
) -> list[dict[str, Any]]:
    """Train every BAE of the grid, estimate entropies on held-out samples, write JSON/plots.

    The outputs are rewritten after each (expansion, objective) group, one stacked training of
    every cell: a paper-scale grid takes hours on a GPU, and an interrupted run keeps the groups it
    finished. With ``resume``, groups that ``out_dir/synthetic.json`` already holds for this same
    grid (the same grid and recipe) are kept and not trained again, and the group that was training
    goes on from its last checkpoint (``out_dir/training-checkpoint``, removed once the group's
    rows are written)."""
    out = Path(out_dir) if out_dir is not None else None
    cells = [(r, seed) for r in grid.ranks for seed in grid.seeds]
    groups = grid.groups
    rows, dynamics = earlier_rows(grid, out, cells) if out is not None and resume else ([], {})
    done = {(row["expansion"], row["objective"]) for row in rows}
    if done and progress:
        print(f"resuming from {out}/synthetic.json: {len(done)} of {len(groups)} groups kept")
    data = {}  # train, test, test bits: the train bits (n x r each) are not kept
    for r, seed in cells:
        train, test, _, test_bits = planted_cell(
            r, grid.d, grid.train_states(r), grid.n_test, 1000 * r + seed
        )
        data[(r, seed)] = train, test, test_bits
    checkpoint = None if out is None else out / TRAINING_CHECKPOINT
    if checkpoint is not None and not resume:  # an interrupted group is trained from the start
        shutil.rmtree(checkpoint, ignore_errors=True)
    for expansion, objective in groups:
        if (expansion, objective) in done:
            continue
        recipe = grid.recipe.changed(expansion=expansion, objective=objective)
        estimates = estimate_entropies(
            [data[cell][0] for cell in cells],
            recipe,
            eval_sets=[data[cell][1] for cell in cells],
            seeds=[seed for _, seed in cells],
            normalise=False,  # the recipe's coefficients were set on this data's own scale
            device=device,
            progress=progress,
            checkpoint=checkpoint,
        )
        for (r, seed), cell in zip(cells, estimates, strict=True):
            train, test, test_bits = data[(r, seed)]
            rows.append(_row(r, seed, len(train), expansion, objective, cell, test, test_bits))
            if seed == grid.seeds[0] and r == max(grid.ranks):
                label = f"{'with' if objective else 'without'} objective, {expansion}x"
                dynamics[label] = thin_history(cell.history)
        rows.sort(key=lambda row: groups.index((row["expansion"], row["objective"])))
        if out is not None:
            write_outputs(grid, rows, dynamics, out)
        if checkpoint is not None:
            shutil.rmtree(checkpoint, ignore_errors=True)  # the group's rows are written
    if out is not None and len(done) == len(groups):  # nothing trained: the report, rewritten
        write_outputs(grid, rows, dynamics, out)
    return rows
