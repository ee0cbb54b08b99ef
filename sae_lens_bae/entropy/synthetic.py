"""Synthetic directional benchmark: hidden states whose entropy is known exactly.

Sample an orthonormal basis M in R^{r x d} and independent fair bits c in {0,1}^r; the instances
c M take 2^r equally likely values, so their entropy is exactly r bits. A BAE trained with the
entropy objective should estimate r; one trained without it (a_e = a_c = 0) should not. Every
BAE of one (expansion, objective) cell is trained in one ``StackedBAE``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sae_lens_bae.entropy.estimate import estimate_entropy
from sae_lens_bae.evaluation import evaluate_sae
from sae_lens_bae.saes.bae import BAETrainingSAEConfig
from sae_lens_bae.stacked import train_stacked_baes

__all__ = ["PRESETS", "SyntheticPreset", "directional_data", "passes_bar", "run_synthetic"]


@dataclass(frozen=True)
class SyntheticPreset:
    """One benchmark grid. Coefficients are the paper's d = 2048 values rescaled by 2048 / d."""

    d: int
    ranks: tuple[int, ...]
    expansions: tuple[int, ...]
    seeds: tuple[int, ...]
    n_train: int
    n_test: int
    steps: int
    batch_size: int = 512
    lr: float = 2e-3
    surrogate_temperature: float = 0.3
    entropy_coefficient_2048: float = 5e-7
    covariance_coefficient_2048: float = 1e-6

    @property
    def entropy_coefficient(self) -> float:
        return self.entropy_coefficient_2048 * 2048 / self.d

    @property
    def covariance_coefficient(self) -> float:
        return self.covariance_coefficient_2048 * 2048 / self.d


PRESETS: dict[str, SyntheticPreset] = {
    # 84 BAEs on 2 CPU cores in about 17 minutes. Measured: every r <= 32 at 2x and r <= 16 at 4x
    # within 0.01 bits on 3 of 3 seeds; r = 32 at 4x still 37-40 bits (3000 steps: 48-67)
    "cpu": SyntheticPreset(
        d=64,
        ranks=(0, 1, 2, 4, 8, 16, 32),
        expansions=(2, 4),
        seeds=(0, 1, 2),
        n_train=16384,
        n_test=4096,
        steps=4000,
    ),
    # the paper's scale, for a GPU
    "paper": SyntheticPreset(
        d=2048,
        ranks=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        expansions=(2, 4),
        seeds=(0, 1, 2),
        n_train=65536,
        n_test=8192,
        steps=128 * 100,  # 100 epochs of 65536 samples in batches of 512
        lr=5e-4,
    ),
    # seconds, for tests
    "test": SyntheticPreset(
        d=16, ranks=(0, 2, 4), expansions=(2,), seeds=(0,), n_train=2048, n_test=512, steps=300
    ),
}


def directional_data(r: int, d: int, n_train: int, n_test: int, seed: int) -> tuple[Tensor, Tensor]:
    """Train and test instances c M of one basis M (orthonormal rows), c uniform on {0,1}^r."""
    if r > d:
        raise ValueError(f"rank r={r} cannot exceed the dimension d={d}")
    generator = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, max(r, 1), generator=generator))[0].T[:r]
    bits = torch.randint(0, 2, (n_train + n_test, r), generator=generator).float()
    data = bits @ basis if r else torch.zeros(n_train + n_test, d)
    return data[:n_train], data[n_train:]


def tolerance(r: int) -> float:
    """The accuracy bar: within max(1, 0.1 r) bits."""
    return max(1.0, 0.1 * r)


def run_synthetic(
    preset: SyntheticPreset, out_dir: str | Path | None = None, progress: bool = True
) -> list[dict[str, Any]]:
    """Train every BAE of the grid, estimate entropies on held-out samples, write JSON/plots."""
    rows: list[dict[str, Any]] = []
    dynamics: dict[str, dict[str, list[float]]] = {}
    cells = [(r, seed) for r in preset.ranks for seed in preset.seeds]
    data = {
        (r, seed): directional_data(r, preset.d, preset.n_train, preset.n_test, 1000 * r + seed)
        for r, seed in cells
    }
    for expansion in preset.expansions:
        for objective in (True, False):
            cfg = BAETrainingSAEConfig(
                d_in=preset.d,
                d_sae=expansion * preset.d,
                surrogate_temperature=preset.surrogate_temperature,
                entropy_coefficient=preset.entropy_coefficient if objective else 0.0,
                covariance_coefficient=preset.covariance_coefficient if objective else 0.0,
            )
            baes, histories = train_stacked_baes(
                [data[cell][0] for cell in cells],
                cfg,
                training_samples=preset.steps * preset.batch_size,
                seeds=[seed for _, seed in cells],
                batch_size=preset.batch_size,
                lr=preset.lr,
                progress=progress,
            )
            for (r, seed), bae, history in zip(cells, baes, histories, strict=True):
                test = data[(r, seed)][1]
                evaluation = evaluate_sae(bae, test)
                explained = evaluation["explained_variance"]
                rows.append(
                    {
                        "r": r,
                        "seed": seed,
                        "expansion": expansion,
                        "objective": objective,
                        "estimate_bits": estimate_entropy(bae, test).bits,
                        "reconstruction_mse": evaluation["reconstruction_loss"],
                        # held-out SSE as a fraction of the data variance (None for r = 0)
                        "relative_error": None if explained is None else 1.0 - explained,
                    }
                )
                if seed == preset.seeds[0] and r == max(preset.ranks):
                    label = f"{'with' if objective else 'without'} objective, {expansion}x"
                    dynamics[label] = history
    if out_dir is not None:
        _write_outputs(preset, rows, dynamics, Path(out_dir))
    return rows


def passes_bar(rows: list[dict[str, Any]], min_seeds: int = 2) -> dict[str, Any]:
    """The entropy issue's bar: with the objective, every r within max(1, 0.1 r) bits and held-out
    relative error <= 2% (r = 0: MSE <= 1e-4, as the data has no variance) at every expansion
    on at least ``min_seeds`` seeds; without it, every r >= 1 estimated above r + max(1, 0.1 r)."""
    verdict: dict[str, Any] = {"with_objective": {}, "ablation": {}}
    for row in rows:
        r, key = row["r"], f"r={row['r']},expansion={row['expansion']}"
        if row["objective"]:
            accurate = abs(row["estimate_bits"] - r) <= tolerance(r)
            if row["relative_error"] is None:
                faithful = row["reconstruction_mse"] <= 1e-4
            else:
                faithful = row["relative_error"] <= 0.02
            verdict["with_objective"].setdefault(key, 0)
            verdict["with_objective"][key] += int(accurate and faithful)
        elif r >= 1:
            verdict["ablation"].setdefault(key, True)
            verdict["ablation"][key] &= row["estimate_bits"] > r + tolerance(r)
    verdict["objective_ok"] = all(n >= min_seeds for n in verdict["with_objective"].values())
    verdict["ablation_ok"] = all(verdict["ablation"].values())
    return verdict


def _write_outputs(
    preset: SyntheticPreset,
    rows: list[dict[str, Any]],
    dynamics: dict[str, dict[str, list[float]]],
    out: Path,
) -> None:
    from sae_lens_bae.plots import plot_synthetic_dynamics, plot_synthetic_scatter

    out.mkdir(parents=True, exist_ok=True)
    verdict = passes_bar(rows, min_seeds=min(2, len(preset.seeds)))
    (out / "synthetic.json").write_text(
        json.dumps({"preset": asdict(preset), "results": rows, "bar": verdict}, indent=2)
    )
    plot_synthetic_scatter(rows, out / "synthetic_entropy.png")
    plot_synthetic_dynamics(dynamics, out / "synthetic_dynamics.png")
    lines = [
        "| r | expansion | objective | estimate (bits, mean over seeds) | relative error |",
        "|---|---|---|---|---|",
    ]
    keys = sorted({(row["r"], row["expansion"], row["objective"]) for row in rows})
    for r, expansion, objective in keys:
        group = [
            row
            for row in rows
            if (row["r"], row["expansion"], row["objective"]) == (r, expansion, objective)
        ]
        estimate = sum(row["estimate_bits"] for row in group) / len(group)
        errors = [row["relative_error"] for row in group if row["relative_error"] is not None]
        error = f"{sum(errors) / len(errors):.4f}" if errors else "-"
        lines.append(
            f"| {r} | {expansion} | {'yes' if objective else 'no'} | {estimate:.3f} | {error} |"
        )
    lines.append(
        f"\nBar met with the objective: {verdict['objective_ok']}; "
        f"ablation above r + tolerance for every r >= 1: {verdict['ablation_ok']}"
    )
    (out / "synthetic.md").write_text("\n".join(lines) + "\n")
