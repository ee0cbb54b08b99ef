"""``bae compare``: a BAE against SAELens' SAEs by a protocol fixed before any number is read
(pre-registered in docs/research/protocol-v2.md).

Every family (a BAE, TopK, JumpReLU, the standard L1 SAE...) trains on the same tokens with the
same schedule, at the settings of a sqrt(2) ladder and several seeds; its learning rate is
bracketed and chosen on validation tokens only, and every model is then read once on test
tokens and on another text (out of distribution), every metric with bootstrap replicates over
the split's sequences.

The protocol, in order:

1. Splits: the corpus's sequences cut into train / validation / test (``held_out_fraction`` each
   for validation and test); OOD: another text, read the same way, every sequence held out.
2. Learning rate, per family: its middle setting at every ``lrs`` candidate (the first two
   seeds), the grid extended while its edge wins (``protocol.bracket_learning_rate``); the lowest
   mean validation value of the family's own training objective wins.
3. At that rate, every setting and seed; every model read on validation, test and OOD.
4. The BAE's default setting, on validation (means over seeds): the most ``activated`` features
   among the settings that meet the feature target (EV at least the sparsest TopK's minus 0.02,
   under 1% constant latents); none meets it: the recipe's own coefficients (scale 1).
5. The verdicts of ``protocol.frontier_verdict``: at least 3 points of both frontiers in their
   overlap, a bootstrap over sequences and seeds.

All activations are scaled once by sqrt(d) / (mean training norm), as SAELens'
``expected_average_only_in`` would, and every model reads them with
``normalize_activations="none"``, so losses are in one unit.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from sae_lens_bae.checks import ranged
from sae_lens_bae.experiments.common import ComSemJudge, LayerData
from sae_lens_bae.experiments.compare_report import verdicts
from sae_lens_bae.experiments.compare_study import Study, task_name
from sae_lens_bae.experiments.protocol import extend_ladders, ladder_shortfalls
from sae_lens_bae.training import FAMILIES

__all__ = ["REPORT", "CompareConfig", "run"]

REPORT = "compare.md"


@dataclass
class CompareConfig(ComSemJudge, LayerData):
    """What ``bae compare`` runs; the defaults ran in 35 minutes on a 2-core CPU before the BAE's
    default framed its inputs (the ``full`` CPU preset and the GPU preset, neither run yet, are
    commands in docs/features.md)."""

    max_sequences: int | None = ranged(1536, low=1)
    """Cap on harvested sequences."""
    held_out_fraction: float = ranged(0.1, above=0.0, below=0.5)
    """Fraction of the sequences in each of the validation and test splits."""
    ood_dataset: str | None = None
    """Another text for the out-of-distribution split (default: gensim's movie reviews)."""
    families: Sequence[str] = ("bae", "topk", "jumprelu")
    """Families trained (see sae_lens_bae.training.FAMILIES)."""
    bae_scales: Sequence[float] = (0.3536, 0.5, 0.7071, 1.0)
    """The BAE's settings: multiples of its recipe's a_e and a_c (a sqrt(2) ladder)."""
    topk_k: Sequence[int] = (45, 64, 91, 128)
    """TopK's and BatchTopK's settings: k (a sqrt(2) ladder)."""
    jumprelu_coefficients: Sequence[float] = (0.08839, 0.125, 0.1768, 0.25)
    """JumpReLU's settings: its L0 coefficient (a sqrt(2) ladder)."""
    l1_coefficients: Sequence[float] = (1.5, 2.121, 3.0, 4.243)
    """The standard and gated SAEs' settings: their L1 coefficient (a sqrt(2) ladder)."""
    lrs: Sequence[float] = (5e-4, 1e-3, 2e-3, 4e-3)
    """Adam learning rates, log-spaced, each family chooses from on validation (2 seeds)."""
    lr_extensions: int = ranged(2, low=0)
    """Rates added beyond an edge of ``lrs`` while that edge wins (one ratio further each)."""
    seeds: Sequence[int] = (0, 1, 2)
    """Seeds of every setting (initialisation and data order)."""
    d_sae: int = ranged(1152, low=1)
    """Latents (code bits) of every model."""
    steps: int = ranged(600, low=1)
    """Training steps of every model."""
    batch_size: int = ranged(256, low=1)
    """Activations per training step."""
    records_k: int = ranged(10, low=1)
    """Top-k features kept per token in the records (k)."""
    n_explain: int = ranged(5, low=1)
    """activated: at least n_explain + 1 records (Algorithm 1); activated_strict: more than 8."""
    prior: Literal["training", "evaluation"] = "evaluation"
    """The BAE's burstiness prior: the mean code of the split read (the paper's) or of training."""
    spliced_sequences: int = ranged(16, low=0)
    """Sequences of each split on which each model is spliced into the LM (CE, KL)."""
    probe_datasets: Sequence[str] = ()
    """Labelled sentence sets for k-sparse probing, one task each (default: gensim's reviews)."""
    probe_sentences: int = ranged(200, low=0)
    """Labelled sentences read per task (a seeded sample, half to fit, half to score); 0: skip."""
    ladder_extensions: int = ranged(2, low=0)
    """Rounds of rungs added to the ladders (validation KL and L0) until every family has at
    least 3 points inside every other's range (``protocol.extend_ladders``); 0: the grids as
    given."""
    bootstrap: int = ranged(200, low=10)
    """Bootstrap replicates (sequences and seeds resampled) behind every verdict."""
    out: Path = Path("runs/compare")
    """Report folder."""

    def __post_init__(self) -> None:
        super().__post_init__()  # LayerData's: every field's range, this class's too
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown or not self.families:
            raise ValueError(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
        if len(self.lrs) < 2:
            raise ValueError(f"lrs needs at least 2 rates to bracket, got {list(self.lrs)}")
        for name in ("bae_scales", "topk_k", "jumprelu_coefficients", "l1_coefficients", "lrs"):
            values = getattr(self, name)
            if not values or any(v <= 0 for v in values) or len(set(values)) < len(values):
                raise ValueError(f"{name} must be distinct positive values, got {list(values)}")
        names = [task_name(source) for source in self.probe_datasets]
        if len(set(names)) < len(names):
            raise ValueError(
                f"probe_datasets {list(self.probe_datasets)} share task names {names}: give "
                "each task a file or folder of its own name"
            )
        if not self.seeds or len(set(self.seeds)) < len(self.seeds):
            raise ValueError(f"seeds must be distinct, got {list(self.seeds)}")
        uses_k = {"topk", "batchtopk"} & set(self.families)
        if uses_k and any(k > self.d_sae for k in self.topk_k):
            raise ValueError(f"topk_k {list(self.topk_k)} exceeds d_sae = {self.d_sae}")

    def settings(self, family: str) -> list[float]:
        """The sparsity settings ``family`` trains at, sorted."""
        grid = {
            "bae": self.bae_scales,
            "topk": self.topk_k,
            "batchtopk": self.topk_k,
            "jumprelu": self.jumprelu_coefficients,
            "standard": self.l1_coefficients,
            "gated_relu": self.l1_coefficients,
        }
        return sorted(float(v) for v in grid[family])


def run(cfg: CompareConfig, progress: bool = True) -> dict[str, Any]:
    """Harvest, choose, train, read and write ``compare.md``, ``compare.json``, the frontier and
    density plots to ``cfg.out``; returns the summary."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    study = Study(cfg, out, progress)
    chosen_lr, tried = study.choose_learning_rates()
    ladders = {family: cfg.settings(family) for family in cfg.families}
    final = study.train_grid(ladders, chosen_lr)
    added: dict[str, list[float]] = {}
    for _ in range(cfg.ladder_extensions):
        judged = [r for r in study.rows if r["name"] in final]
        more = _rungs_to_add(cfg, judged, ladders)
        if not more:
            break
        for family, rungs in more.items():
            ladders[family] = sorted([*ladders[family], *rungs])
            added[family] = sorted([*added.get(family, []), *rungs])
        final += study.train_grid(more, chosen_lr)
    judged = [r for r in study.rows if r["name"] in final]
    bae_default = _bae_default(study.rows, final, cfg.d_sae) if "bae" in cfg.families else None
    study.read_final(final)
    summary = {
        "config": asdict(cfg),
        "hook": study.data.hook,
        "dataset": study.data.dataset,
        "ood_dataset": study.splits["ood"].dataset,
        "tokens": study.tokens(),
        "outliers_dropped": study.outliers_dropped(),
        "activation_scale": study.data.scales[study.data.hook],
        "chosen_lr": chosen_lr,
        "lr_candidates": tried,
        "settings": ladders,
        "settings_added": added,
        "ladder_shortfalls": ladder_shortfalls(judged, list(cfg.families)),
        "bae_default": bae_default,
        "rows": study.rows,
        "verdicts": verdicts(study.rows, list(cfg.families), seed=cfg.seeds[0]),
        "seconds": study.watch.seconds,
    }
    study.write(summary, final)
    return summary


def _rungs_to_add(
    cfg: CompareConfig, rows: list[dict[str, Any]], ladders: dict[str, list[float]]
) -> dict[str, list[float]]:
    """``protocol.extend_ladders`` on the final grid's validation rows, without a k above
    ``d_sae``."""
    more = extend_ladders(rows, ladders, whole=("topk", "batchtopk"))
    for family in ("topk", "batchtopk"):
        if family in more:
            more[family] = [k for k in more[family] if k <= cfg.d_sae]
    return {family: rungs for family, rungs in more.items() if rungs}


EV_MARGIN = 0.02
"""The feature target's EV tolerance below the sparsest TopK SAE (the paper's TopK-15)."""


def _bae_default(rows: list[dict[str, Any]], final: list[str], d_sae: int) -> float:
    """The BAE's default setting from validation rows of the final grid (means over seeds): the
    most activated features (ties: the higher EV) among the settings that meet the feature
    target: EV at least the sparsest TopK setting's minus ``EV_MARGIN`` and constant latents
    under 1%; none meets it: the recipe's own coefficients (scale 1). Chosen before any test or
    OOD row exists."""
    held = [r for r in rows if r["split"] == "validation" and r["name"] in final]

    def mean(family: str, setting: float, key: str) -> float:
        values = [r[key] for r in held if r["family"] == family and r["setting"] == setting]
        return statistics.fmean(values)

    topk = sorted({r["setting"] for r in held if r["family"] == "topk"})
    floor = mean("topk", topk[0], "explained_variance") - EV_MARGIN if topk else float("-inf")
    settings = sorted({r["setting"] for r in held if r["family"] == "bae"})
    meets = [
        s
        for s in settings
        if mean("bae", s, "explained_variance") >= floor
        and mean("bae", s, "constant") < 0.01 * d_sae
    ]
    if not meets:
        return 1.0
    return max(
        meets, key=lambda s: (mean("bae", s, "activated"), mean("bae", s, "explained_variance"))
    )
