"""``bae compress``: train a BAE on one layer and compress its held-out states at several
burstiness thresholds (bytes against float32, reconstruction error, cosine similarity)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sae_lens_bae.checks import ranged
from sae_lens_bae.compression import compression_report, decoder_bytes
from sae_lens_bae.experiments.common import LayerData
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.reports import Stopwatch, markdown_table, write_json, write_text
from sae_lens_bae.saes.bae_recipes import DEFAULT_LR, bae_config
from sae_lens_bae.training import train_sae

__all__ = ["REPORT", "CompressionConfig", "plot_compression", "run"]

REPORT = "compression.md"


@dataclass
class CompressionConfig(LayerData):
    """What ``bae compress`` runs: train a BAE on one layer and compress its held-out states."""

    expansion: int = ranged(4, low=1)
    """d_sae / d_in of the BAE."""
    steps: int = ranged(1000, low=1)
    """Training steps of the BAE."""
    batch_size: int = ranged(512, low=1)
    """Activations per training step."""
    thresholds: Sequence[float] = ranged((-1.0, -0.75, -0.5, -0.25, 0.0), low=-1.0, high=0.0)
    """Burstiness thresholds in [log2 0.5, 0] = [-1, 0]; -1 keeps the code exactly."""
    seed: int = 0
    """Seed of the BAE's initialisation and data order."""
    out: Path = Path("runs/compress")
    """Report folder."""

    def __post_init__(self) -> None:
        super().__post_init__()  # LayerData's: every field's range, this class's too


def run(cfg: CompressionConfig, progress: bool = True) -> dict[str, Any]:
    """Harvest, train, compress the held-out states at every threshold; writes
    ``compression.md``, ``compression.json``, ``compression.png`` and the trained BAE."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    watch = Stopwatch("compress")
    data = cfg.harvest(out, progress=progress)
    watch.lap("harvest")
    train, test = data.train[data.hook], data.test[data.hook]
    scale = data.scales[data.hook]
    d_in = train.shape[1]
    bae = train_sae(
        train,
        bae_config(d_in, cfg.expansion * d_in, training_steps=cfg.steps),
        training_samples=cfg.steps * cfg.batch_size,
        batch_size=cfg.batch_size,
        lr=DEFAULT_LR,
        device=cfg.device,
        seed=cfg.seed,
        outlier_norm_ratio=cfg.outlier_norm_ratio,
    ).sae.eval()
    bae.fold_activation_norm_scaling_factor(scale)  # from here on: the states as harvested
    bae.save_inference_model(out / "bae")
    watch.lap("train")
    rows = compression_report(bae, test / scale, cfg.thresholds, work_dir=out / "compressed")
    watch.lap("compress")
    summary = {
        "config": asdict(cfg),
        "hook": data.hook,
        "dataset": data.dataset,
        "held_out_vectors": int(test.shape[0]),
        "d_in": d_in,
        "code_bits": bae.cfg.n_bits,
        "decoder_bytes": decoder_bytes(bae),
        "rows": rows,
        "seconds": watch.seconds,
    }
    write_json(out / "compression.json", summary)
    plot_compression(rows, out / "compression.png", title=f"{cfg.model} {data.hook}")
    columns = [
        ("threshold", lambda r: f"{r['threshold']:g}"),
        ("flips / vector", lambda r: f"{r['flips_per_vector']:.1f}"),
        ("stored as", lambda r: r["layout"]),
        ("bytes", lambda r: str(r["bytes"])),
        ("ratio vs fp32", lambda r: f"{r['ratio_float32']:.1f}x"),
        ("ratio incl. decoder", lambda r: f"{r['ratio_float32_with_decoder']:.2f}x"),
        ("MSE", lambda r: f"{r['mse']:.4g}"),
        ("relative error", lambda r: f"{r['relative_error']:.3f}"),
        ("cosine", lambda r: f"{r['cosine']:.3f}"),
    ]
    header = (
        f"# Hidden-state compression: {cfg.model} `{data.hook}`\n\n"
        f"{test.shape[0]} held-out vectors of d = {d_in} ({test.shape[0] * d_in * 4} bytes in "
        f"float32); BAE with {bae.cfg.n_bits} code bits, decoder + prior "
        f"{decoder_bytes(bae)} bytes.\n\n"
    )
    write_text(out / "compression.md", header + markdown_table(rows, columns))
    return summary


def plot_compression(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Compression ratio against cosine similarity to the originals, one point per threshold."""
    fig, ax = subplots(figsize=(6, 4.5))
    ratios = [row["ratio_float32"] for row in rows]
    cosines = [row["cosine"] for row in rows]
    ax.plot(ratios, cosines, "o-")
    for row, x, y in zip(rows, ratios, cosines, strict=True):
        ax.annotate(
            f"{row['threshold']:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8
        )
    ax.set(
        xlabel="compression ratio vs float32 (decoder not counted)",
        ylabel="mean cosine similarity to the originals",
        xscale="log",
        title=title,
    )
    return save_figure(fig, path)
