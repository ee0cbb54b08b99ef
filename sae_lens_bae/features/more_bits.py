"""``bae bench more-bits``: BAEs with C code bits per feature at one decoder width.

With ``bits = C`` the encoder emits C * d_sae bits and each group of C becomes one real value
h_R = sum_j 2^j b_j / (2^C - 1) before the decoder, whose width d_sae stays fixed. More bits per
feature buy reconstruction; the question is what they cost in interpretable features. Per C: the
held-out reconstruction, activated / dead / dense features and L0 (feature magnitudes: burstiness
for C = 1 as in ``bae compare``, the real values h_R for C > 1), and ComSem's columns when an LLM
is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sae_lens_bae.features.burstiness import code_prior
from sae_lens_bae.features.records import top_k_records
from sae_lens_bae.features.statistics import feature_statistics
from sae_lens_bae.reports import Stopwatch, cell, markdown_table, write_json
from sae_lens_bae.saes.bae import SHORT_RUN_LR, short_run_config

__all__ = ["MoreBitsConfig", "run_more_bits"]


@dataclass
class MoreBitsConfig:
    """What ``bae bench more-bits`` runs; the defaults fit a 2-core CPU (decoder width d_sae =
    d_in, so that C = 4 has as many code bits as a 4x BAE)."""

    dataset: str | None = None
    model: str = "smollm2-135m"
    layer: int | None = None
    text_column: str | None = None
    context_size: int = 128
    max_sequences: int | None = 512
    bits: Sequence[int] = (1, 2, 3, 4)
    expansion: int = 1  # decoder width d_sae / d_in, the same for every C
    steps: int = 1000
    batch_size: int = 512
    records_k: int = 10
    activated_min_samples: int = 8
    dense_threshold: float = 0.5
    comsem: Any = None  # a comsem.ClientConfig: ComSem columns per C
    comsem_max_features: int | None = None
    device: str = "cpu"
    seed: int = 0
    out: Path = Path("runs/more_bits")

    def __post_init__(self) -> None:
        if not self.bits or any(c < 1 for c in self.bits):
            raise ValueError(f"bits must be integers >= 1, got {list(self.bits)}")


def run_more_bits(cfg: MoreBitsConfig, progress: bool = True) -> dict[str, Any]:
    """Harvest one layer, train one BAE per C, evaluate; writes ``more_bits.md``,
    ``more_bits.json`` and ``more_bits.png``."""
    from sae_lens_bae.activations import harvest_layer
    from sae_lens_bae.plots import plot_more_bits
    from sae_lens_bae.training import train_sae

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("more-bits")
    data = harvest_layer(
        cfg.model,
        cfg.dataset,
        cfg.layer,
        out / "activations",
        text_column=cfg.text_column,
        context_size=cfg.context_size,
        max_sequences=cfg.max_sequences,
        device=cfg.device,
    )
    watch.lap("harvest")
    train, test = data.train[data.hook], data.test[data.hook]
    d_in = train.shape[1]
    rows = []
    records = {}
    for c in cfg.bits:
        bae_cfg = short_run_config(d_in, cfg.expansion * d_in, bits=c)
        sae = train_sae(
            train,
            bae_cfg,
            training_samples=cfg.steps * cfg.batch_size,
            batch_size=cfg.batch_size,
            lr=SHORT_RUN_LR,
            device=cfg.device,
            seed=cfg.seed,
        ).sae.eval()
        if c == 1:
            magnitude, prior = "burstiness", code_prior(sae)
        else:
            magnitude, prior = "raw", None  # h_R, the real values the decoder reads
        held = top_k_records(sae, test, data.positions, data.token_ids, magnitude,  # type: ignore[arg-type]
                             k=cfg.records_k, prior=prior, sequences=data.sequences)  # fmt: skip
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
        stats.pop("firing_rates")
        rows.append({"bits": c, "code_bits": c * sae.cfg.d_sae, "magnitude": magnitude, **stats})
        watch.lap(f"C = {c}")
    if cfg.comsem is not None:
        from sae_lens_bae.comsem import comsem_columns

        by_name = {f"C={row['bits']}": row for row in rows}
        comsem_columns(records, data.tokenizer, cfg.comsem, by_name, out / "comsem",
                       cfg.comsem_max_features, progress)  # fmt: skip
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
        ("C (bits per feature)", lambda r: str(r["bits"])),
        ("code bits", lambda r: str(r["code_bits"])),
        ("reconstruction loss", lambda r: cell(r["reconstruction_loss"], ".4f")),
        ("explained variance", lambda r: cell(r["explained_variance"], ".3f")),
        ("activated", lambda r: str(r["activated"])),
        ("dead", lambda r: str(r["dead"])),
        ("dense", lambda r: str(r["dense"])),
        ("L0", lambda r: cell(r["l0"], ".1f")),
    ]
    if cfg.comsem is not None:
        from sae_lens_bae.comsem import COMSEM_COLUMNS

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
    (out / "more_bits.md").write_text(header + markdown_table(rows, columns))
    watch.lap("report")
    return summary
