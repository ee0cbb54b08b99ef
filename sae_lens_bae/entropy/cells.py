"""One BAE per set of hidden states, trained together, each set's entropy estimated.

Every entropy experiment (the synthetic benchmark, tracing by position, by number of ICL
demonstrations, the two-token benchmark) is the same step repeated over a grid of *cells*: train
a BAE on the cell's hidden states, then estimate their entropy with it. ``estimate_entropies``
does it for a whole grid at once with ``train_stacked_baes``; ``EntropyRecipe`` is how each BAE
is trained: to convergence (``training.convergence``) within a step budget, with several seeds per
cell for error bars. Each cell reports what makes it trustworthy (``entropy.estimate``): its
reconstruction error, number of distinct states and the ceiling log2 of it, and ``reliable``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from sae_lens_bae.entropy.estimate import (
    DEFAULT_MAX_RELATIVE_ERROR,
    EntropyEstimate,
    code_entropy,
    discrete_set_bits,
    unreliable_reasons,
)
from sae_lens_bae.entropy.recipe import TRACING_RECIPE, EntropyRecipe
from sae_lens_bae.entropy.reference import QuantizerReading, reference_reading
from sae_lens_bae.entropy.repair import repair_baes
from sae_lens_bae.evaluation import evaluate_sae, held_out_objective, unexplained_variance
from sae_lens_bae.outliers import NORM_RATIO, drop_outliers, report_outliers
from sae_lens_bae.saes.bae import BAETrainingSAE
from sae_lens_bae.saes.decoder_refit import refit_decoder
from sae_lens_bae.saes.input_frame import current_input_scale
from sae_lens_bae.stacks.training import train_stacked_baes

__all__ = [
    "TRACING_RECIPE",
    "CellEntropy",
    "EntropyRecipe",
    "estimate_entropies",
]


_REFERENCE_FIELDS = {
    "k": "k",
    "bits": "bits",
    "joint_bits": "assignment_bits",
    "relative_error": "relative_error",
    "typical_relative_error": "typical_relative_error",
    "reads_cell": "reads_cell",
}
"""A cell summary's ``reference_*`` keys and the ``QuantizerReading`` fields they hold."""


@dataclass
class CellEntropy:
    """A cell's entropy estimate with what makes it trustworthy: the mean over its seeds' BAEs,
    their spread, the bootstrap spread over states, reconstruction, ceiling, reliability."""

    bits: float
    bits_std: float | None  # over seeds; None with one seed
    bits_per_seed: list[float]
    reconstruction_mse: float
    relative_error: float | None  # SSE / total variance, mean over seeds; None without variance
    typical_relative_error: float | None  # the median state's, mean over seeds (see estimate)
    n_samples: int
    n_distinct: int
    ceiling_bits: float
    code_bits: float  # the plug-in entropy of the codes on the set, mean over seeds
    bootstrap_std: float | None
    reliable: bool
    excess_bits: float | None  # over the codes' joint entropy, mean over seeds (see estimate)
    steps: int  # the most steps any of its BAEs trained
    scale: float  # the kept BAE's input frame's k (1 without a frame)
    bae: BAETrainingSAE = field(repr=False)
    history: dict[str, list[float]] = field(repr=False)
    restart_objectives: list[list[float]] | None = None  # per seed, each restart's held-out
    # objective (the lowest was kept); None without restarts
    restart_bits: list[list[float]] | None = None  # per seed, each restart's estimate
    reference: QuantizerReading | None = None  # the k-means reference (entropy.reference)
    trained_relative_error: float | None = None  # relative_error with the decoders as trained,
    # mean over seeds; None without ``recipe.selection.refit_decoder``
    decoder_refits: list[bool] | None = None  # per seed, whether its decoder was refitted
    knocked_out_bits: list[list[int]] | None = None  # per seed, the bits knocked out of its
    # kept BAE by a repair (entropy.repair; [] for none); None where the recipe never repairs
    repair_steps: int = 0  # the most steps the repairs of a kept BAE trained (beside ``steps``)
    state_bits: float | None = None  # the plug-in entropy of the set's distinct states
    outliers_dropped: int = 0  # extreme states set aside from the set and its evaluation set
    reasons: list[str] = field(default_factory=list)  # the rule's failed conditions, in words

    @torch.no_grad()
    def codes(self, states: Float[Tensor, "n d"]) -> Float[Tensor, "n n_bits"]:
        """The kept BAE's codes of ``states`` of this cell's set (read in its input frame), on
        the BAE's device."""
        return self.bae.encode_bits(states.float().to(self.bae.W_enc.device))

    def summary(self) -> dict[str, float | int | bool | list[float] | None]:
        reference = {
            f"reference_{key}": None if self.reference is None else getattr(self.reference, field)
            for key, field in _REFERENCE_FIELDS.items()
        }
        return {
            "bits": self.bits,
            "bits_std": self.bits_std,
            "bits_per_seed": self.bits_per_seed,
            "reconstruction_mse": self.reconstruction_mse,
            "relative_error": self.relative_error,
            "typical_relative_error": self.typical_relative_error,
            "n_samples": self.n_samples,
            "n_distinct": self.n_distinct,
            "ceiling_bits": self.ceiling_bits,
            "code_bits": self.code_bits,
            "bootstrap_std": self.bootstrap_std,
            "reliable": self.reliable,
            "excess_bits": self.excess_bits,
            "steps": self.steps,
            "scale": self.scale,
            "restart_objectives": self.restart_objectives,
            "restart_bits": self.restart_bits,
            "trained_relative_error": self.trained_relative_error,
            "decoder_refits": self.decoder_refits,
            "knocked_out_bits": self.knocked_out_bits,
            "repair_steps": self.repair_steps,
            "state_bits": self.state_bits,
            "outliers_dropped": self.outliers_dropped,
            "reasons": self.reasons,
            **reference,
        }


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _cell(
    estimates: list[EntropyEstimate],
    evaluations: list[dict],
    steps: list[int],
    bae: BAETrainingSAE,
    history: dict[str, list[float]],
    max_relative_error: float,
    restart_objectives: list[list[float]] | None = None,
    restart_bits: list[list[float]] | None = None,
) -> CellEntropy:
    """One cell from its seeds' estimates (the first seed's BAE and bootstrap are kept)."""
    bits = [e.bits for e in estimates]
    first = estimates[0]
    relative_error = _mean([e.relative_error for e in estimates])
    typical_error = _mean([e.typical_relative_error for e in estimates])
    mean_bits = sum(bits) / len(bits)
    excess = _mean([e.excess_bits for e in estimates])
    code_bits = sum(e.code_bits for e in estimates) / len(estimates)
    frame = current_input_scale(bae)
    reasons = unreliable_reasons(
        mean_bits,
        first.ceiling_bits,
        relative_error,
        excess,
        max_relative_error,
        typical_error,
        state_bits=discrete_set_bits(first.state_bits, first.n_distinct, first.n_samples),
        code_bits=code_bits,
    )
    return CellEntropy(
        bits=mean_bits,
        bits_std=float(torch.tensor(bits).std()) if len(bits) > 1 else None,
        bits_per_seed=bits,
        reconstruction_mse=sum(e["reconstruction_loss"] for e in evaluations) / len(evaluations),
        relative_error=relative_error,
        typical_relative_error=typical_error,
        n_samples=first.n_samples,
        n_distinct=first.n_distinct,
        ceiling_bits=first.ceiling_bits,
        code_bits=code_bits,
        bootstrap_std=first.bootstrap_std,
        reliable=not reasons,
        excess_bits=excess,
        steps=max(steps),
        scale=1.0 if frame is None else float(frame),
        bae=bae,
        history=history,
        restart_objectives=restart_objectives,
        restart_bits=restart_bits,
        state_bits=first.state_bits,
        reasons=reasons,
    )


RESTART_SEED_STRIDE = 100_000
"""Restart q of seed s of a set with base seed b trains with seed b + 1000 s + 100000 q (restart
0 is the seed a recipe without restarts uses)."""


def _best_restart(
    baes: Sequence[BAETrainingSAE], states: Tensor, batch_size: int, group: range
) -> tuple[int, list[float] | None]:
    """The index, in ``group`` (one seed's restarts), of the BAE of lowest held-out objective,
    and their objectives (None for a single restart: nothing to choose, nothing computed)."""
    if len(group) == 1:
        return group[0], None
    costs = [held_out_objective(baes[g], states, batch_size) for g in group]
    return group[min(range(len(group)), key=costs.__getitem__)], costs


def estimate_entropies(
    sets: Sequence[Float[Tensor, "n d"]],
    recipe: EntropyRecipe | None = None,
    *,
    eval_sets: Sequence[Float[Tensor, "m d"]] | None = None,
    seeds: Sequence[int] | None = None,
    normalise: bool = True,
    bootstrap: int = 20,
    max_relative_error: float = DEFAULT_MAX_RELATIVE_ERROR,
    device: str = "cpu",
    progress: bool = True,
    reference: bool = False,
    checkpoint: str | Path | None = None,
    outlier_norm_ratio: float | None = NORM_RATIO,
) -> list[CellEntropy]:
    """Train ``recipe.seeds`` BAEs per set (all stacked, see ``train_stacked_baes``; with
    ``recipe.selection.restarts`` > 1, that many per seed, keeping the one of lowest held-out
    objective) and estimate each set's entropy with them: the mean over seeds, with their spread, a
    bootstrap spread over states (``bootstrap`` replicates, first seed), the reconstruction
    error, the ceiling and ``reliable`` (``entropy.estimate.is_reliable`` on the seeds' means:
    relative error, in total and for the typical state, at most ``max_relative_error``, within
    the ceiling, no excess over the codes' joint entropy, and the codes neither merging nor
    double-counting the set's own plug-in entropy; ``reasons`` names what fails).

    Estimates and reconstruction are measured on ``eval_sets`` when given (held-out samples of the
    same distributions), else on the training sets themselves: the entropy *of that set* is the
    question there; convergence is checked on the same states. ``normalise``: each BAE reads its
    set in an input frame fixed on the whole set (``EntropyRecipe.config``), scaled to the
    variance the recipe was calibrated at and placed where it was (``saes.input_frame``), so a
    scaled or translated set gives the same estimate. ``seeds``: a
    base seed per set (default its index); seed s of a set is
    its base + 1000 s. ``reference``: also read each evaluation set with the smallest k-means
    code that reads it (``entropy.reference.reference_reading``, seeded with the set's base
    seed), to tell a cell no code of that kind reads at this sample size from one the BAE
    misses. With ``recipe.selection.refit_decoder`` each BAE's decoder is refitted by least
    squares on its training set first (``saes.decoder_refit``; ``trained_relative_error`` keeps
    the error of the decoders as trained). With ``recipe.selection.repair_rounds``, a BAE with
    bits the rest of its code fixes is then retrained without them, and kept if that lowers
    its held-out objective (``entropy.repair``; ``knocked_out_bits``), before the restarts are
    compared. ``checkpoint``: a folder the training saves itself to and goes on from when the
    same call is made again (``train_stacked_baes``), so a killed trace does not train again.
    ``outlier_norm_ratio``: extreme states (``sae_lens_bae.outliers``: norm above this times the
    set's median norm) are dropped from each training and evaluation set first, and counted in
    the cell's ``outliers_dropped``; None keeps every state.
    """
    recipe = recipe or EntropyRecipe()
    if not sets:
        raise ValueError("estimate_entropies needs at least one set of states")
    d_in = sets[0].shape[-1]
    for index, states in enumerate(sets):
        if states.ndim != 2 or states.shape[-1] != d_in:
            raise ValueError(
                f"Every set must be [n, {d_in}] (the first set's width); set {index} is "
                f"{tuple(states.shape)}"
            )
        if not torch.isfinite(states).all():
            raise ValueError(f"Set {index} holds NaN/Inf states; drop or fix them first")
    apart = eval_sets is not None
    eval_sets = list(sets) if eval_sets is None else list(eval_sets)
    if len(eval_sets) != len(sets):
        raise ValueError(f"{len(sets)} training sets but {len(eval_sets)} evaluation sets")
    base = list(range(len(sets))) if seeds is None else list(seeds)
    if len(base) != len(sets):
        raise ValueError(f"{len(sets)} sets but {len(base)} seeds")
    scaled, held_out, dropped = [], [], []
    for index, (states, held) in enumerate(zip(sets, eval_sets, strict=True)):
        train, n_train = drop_outliers(states.float(), outlier_norm_ratio)
        held, n_held = drop_outliers(held.float(), outlier_norm_ratio) if apart else (train, 0)
        report_outliers(n_train + n_held, len(states), f"set {index}", outlier_norm_ratio)
        scaled.append(train)
        held_out.append(held)
        dropped.append(n_train + n_held)
    restarts = recipe.selection.restarts
    replicas = [(r, q) for r in range(recipe.seeds) for q in range(restarts)]
    training = train_stacked_baes(
        [x for x in scaled for _ in replicas],
        recipe.config(d_in, framed=normalise),
        training_samples=recipe.steps * recipe.batch_size,
        seeds=[b + 1000 * r + RESTART_SEED_STRIDE * q for b in base for r, q in replicas],
        batch_size=recipe.batch_size,
        lr=recipe.optimiser.lr,
        device=device,
        progress=progress,
        convergence=recipe.convergence(),
        check_sets=[x for x in held_out for _ in replicas],
        lr_warm_up_steps=recipe.optimiser.lr_warm_up_steps,
        lr_scheduler_name=recipe.optimiser.lr_scheduler_name,
        lr_end=recipe.optimiser.lr_end,
        adam_beta2=recipe.optimiser.adam_beta2,
        drain_hold=recipe.drain_rule(),
        checkpoint=checkpoint,
    )
    owner = [index for index in range(len(sets)) for _ in replicas]  # each BAE's set
    trained_errors: dict[int, float | None] = {}
    refits: dict[int, bool] = {}
    if recipe.selection.refit_decoder:  # before repairs and restarts are compared
        for g, index in enumerate(owner):
            trained_errors[g] = unexplained_variance(training.baes[g], held_out[index].to(device))
            refits[g] = refit_decoder(training.baes[g], scaled[index], seed=base[index]).applied
    repairs = repair_baes(
        training.baes,
        [scaled[i] for i in owner],
        [held_out[i] for i in owner],
        recipe,
        [base[i] for i in owner],
        device,
        progress,
    )
    for g, repair in repairs.items():
        trained_errors[g], refits[g] = repair.trained_relative_error, repair.refitted
    cells = []
    for index, states in enumerate(held_out):
        states = states.to(device)
        seeds = recipe.seeds
        groups = [
            range((index * seeds + r) * restarts, (index * seeds + r + 1) * restarts)
            for r in range(seeds)
        ]
        chosen = [_best_restart(training.baes, states, recipe.batch_size, g) for g in groups]
        members = [g for g, _ in chosen]
        objectives = [costs for _, costs in chosen if costs is not None] or None
        estimated = {  # every BAE once; the bootstrap on the first seed's kept one
            g: code_entropy(
                training.baes[g],
                states,
                bootstrap=bootstrap if g == members[0] else 0,
                seed=base[index],
                max_relative_error=max_relative_error,
            )
            for group in groups
            for g in group
        }
        estimates = [estimated[g] for g in members]
        restart_bits = (
            [[estimated[g].bits for g in group] for group in groups] if restarts > 1 else None
        )
        evaluations = [evaluate_sae(training.baes[g], states) for g in members]
        first = members[0]
        entry = _cell(
            estimates,
            evaluations,
            [training.steps[g] for g in members],
            training.baes[first],
            training.histories[first],
            max_relative_error,
            objectives,
            restart_bits,
        )
        if recipe.selection.refit_decoder:
            entry.trained_relative_error = _mean([trained_errors[g] for g in members])
            entry.decoder_refits = [refits[g] for g in members]
        if recipe.repairs:
            entry.knocked_out_bits = [
                repairs[g].knocked_out if g in repairs else [] for g in members
            ]
            entry.repair_steps = max(repairs[g].steps if g in repairs else 0 for g in members)
        entry.outliers_dropped = dropped[index]
        cells.append(entry)
    if reference:
        for index, entry in enumerate(tqdm(cells, desc="k-means references", disable=not progress)):
            entry.reference, _ = reference_reading(
                held_out[index].to(device), seed=base[index], max_relative_error=max_relative_error
            )
    return cells
