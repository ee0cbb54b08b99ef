"""``bae bench more-bits``: BAEs with C code bits per feature at one decoder width.

With ``bits_per_feature = C`` the encoder emits C * d_sae bits and each group of C becomes one real
value h_R = sum_j 2^j b_j / (2^C - 1) before the decoder, whose width d_sae stays fixed. More bits
per feature buy reconstruction; the question is what they cost in interpretable features. Per C: the
held-out reconstruction, activated / dead / dense features and L0 (feature magnitudes: burstiness
for C = 1 as in ``bae compare``, the real values h_R for C > 1), and ComSem's columns when an LLM is
given. Every C starts at the same encoder scale, and its penalties are weighted so that a feature
weighs what it weighs at C = 1 (``penalties_per_feature``): the entropy and firing terms sum over C
times as many bits (a / C), the covariance over C^2 times as many pairs (a_c / C^2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sae_lens_bae.checks import ranged
from sae_lens_bae.comsem import COMSEM_COLUMNS
from sae_lens_bae.experiments.common import ComSemJudge, LayerData
from sae_lens_bae.features import code_prior, feature_statistics, top_k_records
from sae_lens_bae.features.records import Magnitude
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.reports import Stopwatch, cell, markdown_table, write_json, write_text
from sae_lens_bae.saes.bae import BAETrainingSAEConfig
from sae_lens_bae.saes.bae_recipes import DEFAULT_LR, bae_config
from sae_lens_bae.training import train_sae

__all__ = ["REPORT", "MoreBitsConfig", "penalties_per_feature", "plot_more_bits", "run"]

REPORT = "more_bits.md"


@dataclass
class MoreBitsConfig(ComSemJudge, LayerData):
    """What ``bae bench more-bits`` runs; the defaults fit a 2-core CPU (decoder width d_sae =
    d_in, so that C = 4 has as many code bits as a 4x BAE)."""

    bits_per_feature: Sequence[int] = ranged((1, 2, 3, 4), low=1)
    """Code bits per feature C, one BAE each."""
    expansion: int = ranged(1, low=1)
    """Decoder width d_sae / d_in, the same for every C."""
    steps: int = ranged(1000, low=1)
    """Training steps per BAE."""
    batch_size: int = ranged(512, low=1)
    """Activations per training step."""
    records_k: int = ranged(10, low=1)
    """Top-k features kept per token in the records."""
    activated_min_samples: int = ranged(8, low=0)
    """A feature is activated with more than this many tokens in the records."""
    dense_threshold: float = ranged(0.5, low=0.0, high=1.0)
    """A feature firing on more than this fraction of tokens is dense."""
    seed: int = 0
    """Seed of the BAEs' initialisation and data order."""
    out: Path = Path("runs/more_bits")
    """Report folder."""

    def __post_init__(self) -> None:
        super().__post_init__()  # LayerData's: every field's range, this class's too
        if not self.bits_per_feature or any(c < 1 for c in self.bits_per_feature):
            raise ValueError(
                f"bits_per_feature must be integers >= 1, got {list(self.bits_per_feature)}"
            )


def penalties_per_feature(d_in: int, bits_per_feature: int) -> dict[str, float]:
    """The default recipe's coefficients for C = ``bits_per_feature`` code bits per feature, so
    that the penalties weigh a feature as at C = 1: a_e / C (a sum over C times as many bits) and
    a_c / C^2 (a sum over C^2 times as many pairs)."""
    one = BAETrainingSAEConfig(d_in=d_in, d_sae=4 * d_in)
    return {
        "entropy_coefficient": one.entropy_coefficient / bits_per_feature,
        "covariance_coefficient": one.covariance_coefficient / bits_per_feature**2,
    }


def run(cfg: MoreBitsConfig, progress: bool = True) -> dict[str, Any]:
    """Harvest one layer, train one BAE per C, evaluate; writes ``more_bits.md``,
    ``more_bits.json`` and ``more_bits.png``."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("more-bits")
    data = cfg.harvest(out, progress=progress)
    watch.lap("harvest")
    train, test = data.train[data.hook], data.test[data.hook]
    d_in = train.shape[1]
    rows = []
    records = {}
    for c in cfg.bits_per_feature:
        bae_cfg = bae_config(
            d_in,
            cfg.expansion * d_in,
            training_steps=cfg.steps,
            bits_per_feature=c,
            **penalties_per_feature(d_in, c),
        )
        sae = train_sae(
            train,
            bae_cfg,
            training_samples=cfg.steps * cfg.batch_size,
            batch_size=cfg.batch_size,
            lr=DEFAULT_LR,
            device=cfg.device,
            seed=cfg.seed,
            outlier_norm_ratio=cfg.outlier_norm_ratio,
        ).sae.eval()
        magnitude: Magnitude
        if c == 1:
            magnitude, prior = "burstiness", code_prior(sae)
        else:
            magnitude, prior = "raw", None  # h_R, the real values the decoder reads
        held = top_k_records(
            sae,
            test,
            data.positions,
            data.token_ids,
            magnitude,
            k=cfg.records_k,
            prior=prior,
            sequences=data.sequences,
        )
        held.info = {"model": cfg.model, "hook": data.hook, "sae": f"bae_C{c}"}
        (out / "records").mkdir(exist_ok=True)
        held.save(out / "records" / f"bae_C{c}.safetensors")
        records[f"C={c}"] = held
        stats = feature_statistics(
            sae,
            test,
            held,
            dense_threshold=cfg.dense_threshold,
            activated_min_samples=cfg.activated_min_samples,
        )
        stats.pop("firing_frequency")
        rows.append(
            {
                "bits_per_feature": c,
                "n_bits": c * sae.cfg.d_sae,
                "magnitude": magnitude,
                **penalties_per_feature(d_in, c),
                **stats,
            }
        )
        watch.lap(f"C = {c}")
    if cfg.judge(
        records,
        data.tokenizer,
        {f"C={row['bits_per_feature']}": row for row in rows},
        out,
        progress,
    ):
        watch.lap("comsem")
    summary = {
        "config": asdict(cfg),
        "hook": data.hook,
        "dataset": data.dataset,
        "decoder_width": cfg.expansion * d_in,
        "train_tokens": int(train.shape[0]),
        "held_out_tokens": int(test.shape[0]),
        "rows": rows,
        "seconds": watch.seconds,
    }
    write_json(out / "more_bits.json", summary)
    plot_more_bits(rows, out / "more_bits.png", title=f"{cfg.model} {data.hook}")
    columns = [
        ("C (bits per feature)", lambda r: str(r["bits_per_feature"])),
        ("code bits", lambda r: str(r["n_bits"])),
        ("reconstruction loss", lambda r: cell(r["reconstruction_loss"], ".4f")),
        ("explained variance", lambda r: cell(r["explained_variance"], ".3f")),
        ("activated", lambda r: str(r["activated"])),
        ("dead", lambda r: str(r["dead"])),
        ("dense", lambda r: str(r["dense"])),
        ("L0", lambda r: cell(r["l0"], ".1f")),
    ]
    if cfg.comsem_llm is not None:
        columns += [
            (title, lambda r, key=key, spec=spec: cell(r[key], spec))
            for key, title, spec in COMSEM_COLUMNS
        ]
    header = (
        f"# More-bit decoding: {cfg.model} `{data.hook}`, decoder width {cfg.expansion * d_in}\n\n"
        f"{train.shape[0]} training / {test.shape[0]} held-out tokens, {cfg.steps} steps per "
        f"BAE; activated: features with more than {cfg.activated_min_samples} tokens in the "
        f"top-{cfg.records_k} records (C = 1: burstiness, C > 1: h_R).\n\n"
    )
    write_text(out / "more_bits.md", header + markdown_table(rows, columns))
    watch.lap("report")
    return summary


def plot_more_bits(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Reconstruction loss and activated features against C, the code bits per feature."""
    per_feature = [row["bits_per_feature"] for row in rows]
    fig, (left, right) = subplots(1, 2, figsize=(9, 3.8))
    left.plot(per_feature, [row["reconstruction_loss"] for row in rows], "o-")
    left.set(
        xlabel="C (bits per feature)", ylabel="held-out reconstruction loss", xticks=per_feature
    )
    right.plot(per_feature, [row["activated"] for row in rows], "o-", label="activated")
    if all(row.get("comsem_interpretable") is not None for row in rows):
        right.plot(
            per_feature, [row["comsem_interpretable"] for row in rows], "s--", label="FI (ComSem)"
        )
    right.set(xlabel="C (bits per feature)", ylabel="features", xticks=per_feature)
    right.legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path)
