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
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.checks import check_ranges, ranged
from sae_lens_bae.entropy import estimate_entropies
from sae_lens_bae.experiments.common import TRAINING_CHECKPOINT
from sae_lens_bae.experiments.synthetic_presets import PRESETS, SyntheticPreset, tolerance
from sae_lens_bae.experiments.synthetic_report import (
    earlier_rows,
    passes_bar,
    summarise,
    thin_history,
    write_outputs,
)

__all__ = [
    "PRESETS",
    "REPORT",
    "SyntheticConfig",
    "SyntheticPreset",
    "bit_agreement",
    "directional_data",
    "passes_bar",
    "planted_cell",
    "recovered_bits",
    "run",
    "run_preset",
    "tolerance",
]

REPORT = "synthetic.md"
RECOVERED = 0.99
"""A planted bit counts as recovered when a channel agrees with it on this fraction of states."""


@dataclass
class SyntheticConfig:
    """What ``bae bench synthetic`` runs: a preset, optionally with parts of its grid replaced."""

    preset: Literal["cpu", "mid", "paper", "test"] = "cpu"
    """cpu (d = 64, a 2-core machine, about 16 minutes), mid (d = 256, r up to 128, about 26
    minutes on 2 cores), paper (d = 2048, for a GPU) or test (seconds)."""
    steps: int | None = ranged(None, low=1)
    """Training steps of every BAE (default: the preset's)."""
    ranks: Sequence[int] | None = ranged(None, low=0)
    """Ranks r (bits of the data), e.g. 0,8,64 (default: the preset's)."""
    expansions: Sequence[int] | None = ranged(None, low=1)
    """Expansion rates d_sae / d, e.g. 4 (default: the preset's)."""
    seeds: Sequence[int] | None = ranged(None, low=0)
    """Seeds, e.g. 0,1 (default: the preset's)."""
    restarts: int | None = ranged(None, low=1)
    """BAEs per cell, of which the one with the lowest held-out objective is kept (default: the
    preset's; ``EntropyRecipe.restarts``): runs from other starts can stay in a worse minimum.
    Multiplies the training cost."""
    drain_hold: float | None = ranged(None, low=0.0)
    """Hold the learning-rate schedule while a code still drains, for at most this fraction of
    the steps more (default: the preset's, 1 for paper, 0 elsewhere; ``EntropyRecipe.drain_hold``):
    0 gives a fixed-length schedule."""
    ablation: bool | None = None
    """Also train every cell without the objective, to show it is what makes the estimate right
    (default: the preset's; --no-ablation halves the run)."""
    resume: bool = True
    """Keep the groups an earlier run of this same grid wrote to --out and train only the rest
    (--no-resume trains everything again)."""
    device: str = "cpu"
    """Torch device (the paper preset wants a GPU)."""
    out: Path = Path("runs/synthetic")
    """Folder for the JSON, the table and the plots."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose from {sorted(PRESETS)}")
        chosen = self.grid()
        if max(chosen.ranks) > chosen.d:
            raise ValueError(f"ranks go up to d = {chosen.d} for preset {self.preset!r}")

    def grid(self) -> SyntheticPreset:
        """The preset with this config's replacements."""
        chosen = PRESETS[self.preset]
        if self.steps is not None:
            warm = chosen.recipe.optimiser.lr_warm_up_steps
            if self.steps <= warm:
                raise ValueError(
                    f"--steps {self.steps} does not pass the {self.preset} preset's "
                    f"{warm} lr warm-up steps; use more than {warm}"
                )
            chosen = replace(chosen, recipe=chosen.recipe.changed(steps=self.steps))
        if self.restarts is not None:
            chosen = replace(chosen, recipe=chosen.recipe.changed(restarts=self.restarts))
        if self.drain_hold is not None:
            chosen = replace(chosen, recipe=chosen.recipe.changed(drain_hold=self.drain_hold))
        for name in ("ranks", "expansions", "seeds"):
            values = getattr(self, name)
            if values is not None:
                chosen = replace(chosen, **{name: tuple(values)})
        if self.ablation is not None:
            chosen = replace(chosen, ablation=self.ablation)
        return chosen


def planted_cell(
    r: int, d: int, n_train: int, n_test: int, seed: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Train and test instances c M of one basis M (orthonormal rows), c uniform on {0,1}^r, and
    their bits c (``recovered_bits`` compares a code with them)."""
    if r > d:
        raise ValueError(f"rank r={r} cannot exceed the dimension d={d}")
    generator = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, max(r, 1), generator=generator))[0].T[:r]
    bits = torch.randint(0, 2, (n_train + n_test, r), generator=generator).float()
    data = bits @ basis if r else torch.zeros(n_train + n_test, d)
    train, test = data[:n_train].clone(), data[n_train:].clone()
    # copies, not views: a caller that drops a part (the train bits, n x r) frees its memory
    return train, test, bits[:n_train].clone(), bits[n_train:].clone()


def directional_data(r: int, d: int, n_train: int, n_test: int, seed: int) -> tuple[Tensor, Tensor]:
    """Train and test instances c M of one basis M (orthonormal rows), c uniform on {0,1}^r."""
    train, test, _, _ = planted_cell(r, d, n_train, n_test, seed)
    return train, test


@torch.no_grad()
def bit_agreement(
    codes: Float[Tensor, "n n_bits"], bits: Float[Tensor, "n r"]
) -> Float[Tensor, "r n_bits"]:
    """The fraction of the states on which each code channel copies or negates each planted bit
    (whichever is more), in fp64 on the codes' device."""
    codes, bits = codes.double(), bits.to(codes.device).double()
    same = (bits.T @ codes + (1 - bits).T @ (1 - codes)) / len(bits)
    return torch.maximum(same, 1 - same)


@torch.no_grad()
def recovered_bits(
    codes: Float[Tensor, "n n_bits"], bits: Float[Tensor, "n r"], agreement: float = RECOVERED
) -> int:
    """How many planted bits some code channel copies (or negates) on at least ``agreement`` of
    the states: an estimate near r could come from a code of other bits with the same sum of
    entropies; this says whether the BAE found the planted ones."""
    if bits.shape[1] == 0 or codes.shape[1] == 0:
        return 0
    return int((bit_agreement(codes, bits).amax(1) >= agreement).sum())


def run(cfg: SyntheticConfig, progress: bool = True) -> dict[str, Any]:
    """Run the config's grid and write ``synthetic.json``/``.md`` and the plots to ``cfg.out``;
    returns the JSON summary (preset, one row per BAE, the accuracy bar's verdict)."""
    preset = cfg.grid()
    Path(cfg.out).mkdir(parents=True, exist_ok=True)  # before any work: an unusable folder fails
    rows = run_preset(preset, cfg.out, progress=progress, device=cfg.device, resume=cfg.resume)
    return summarise(preset, rows)


def run_preset(
    preset: SyntheticPreset,
    out_dir: str | Path | None = None,
    progress: bool = True,
    device: str = "cpu",
    resume: bool = True,
) -> list[dict[str, Any]]:
    """Train every BAE of the grid, estimate entropies on held-out samples, write JSON/plots.

    The outputs are rewritten after each (expansion, objective) group, one stacked training of
    every cell: a paper-scale grid takes hours on a GPU, and an interrupted run keeps the groups it
    finished. With ``resume``, groups that ``out_dir/synthetic.json`` already holds for this same
    grid (preset and recipe equal) are kept and not trained again, and the group that was training
    goes on from its last checkpoint (``out_dir/training-checkpoint``, removed once the group's
    rows are written)."""
    out = Path(out_dir) if out_dir is not None else None
    cells = [(r, seed) for r in preset.ranks for seed in preset.seeds]
    groups = preset.groups
    rows, dynamics = earlier_rows(preset, out, cells) if out is not None and resume else ([], {})
    done = {(row["expansion"], row["objective"]) for row in rows}
    if done and progress:
        print(f"resuming from {out}/synthetic.json: {len(done)} of {len(groups)} groups kept")
    data = {}  # train, test, test bits: the train bits (n x r each) are not kept
    for r, seed in cells:
        train, test, _, test_bits = planted_cell(
            r, preset.d, preset.train_states(r), preset.n_test, 1000 * r + seed
        )
        data[(r, seed)] = train, test, test_bits
    checkpoint = None if out is None else out / TRAINING_CHECKPOINT
    if checkpoint is not None and not resume:  # an interrupted group is trained from the start
        shutil.rmtree(checkpoint, ignore_errors=True)
    for expansion, objective in groups:
        if (expansion, objective) in done:
            continue
        recipe = preset.recipe.changed(expansion=expansion, objective=objective)
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
            rows.append(
                {
                    "r": r,
                    "seed": seed,
                    "n_train": len(train),
                    "expansion": expansion,
                    "objective": objective,
                    "estimate_bits": cell.bits,
                    "reconstruction_mse": cell.reconstruction_mse,
                    # held-out SSE as a fraction of the data variance (None for r = 0)
                    "relative_error": cell.relative_error,
                    # the same with the decoder as trained, before its least-squares refit
                    "trained_relative_error": cell.trained_relative_error,
                    # planted bits some channel copies on >= RECOVERED of the held-out states
                    "recovered_bits": recovered_bits(cell.codes(test), test_bits),
                    "steps": cell.steps,  # at most the recipe's; fewer once converged
                    "restart_objectives": cell.restart_objectives,  # None without restarts
                    "restart_bits": cell.restart_bits,  # each restart's estimate, or None
                    "repaired_channels": cell.repaired_channels,  # per seed (entropy.repair)
                    "repair_steps": cell.repair_steps,  # trained by the repairs, beyond steps
                }
            )
            if seed == preset.seeds[0] and r == max(preset.ranks):
                label = f"{'with' if objective else 'without'} objective, {expansion}x"
                dynamics[label] = thin_history(cell.history)
        rows.sort(key=lambda row: groups.index((row["expansion"], row["objective"])))
        if out is not None:
            write_outputs(preset, rows, dynamics, out)
        if checkpoint is not None:
            shutil.rmtree(checkpoint, ignore_errors=True)  # the group's rows are written
    if out is not None and len(done) == len(groups):  # nothing trained: the report, rewritten
        write_outputs(preset, rows, dynamics, out)
    return rows
