"""Matplotlib figures saved as PNG: training curves, firing frequencies, entropy benchmarks and
traces."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from torch import Tensor  # noqa: E402

__all__ = [
    "plot_comsem_scores",
    "plot_compression",
    "plot_entropy_by_layer",
    "plot_entropy_by_position",
    "plot_entropy_curves",
    "plot_firing_frequencies",
    "plot_firing_frequency_grid",
    "plot_magnitude_heatmaps",
    "plot_more_bits",
    "plot_steering",
    "plot_synthetic_dynamics",
    "plot_synthetic_scatter",
    "plot_training_curves",
    "plot_two_token_benchmark",
]


def plot_training_curves(
    histories: Mapping[str, list[dict[str, float]]], path: str | Path, title: str = ""
) -> Path:
    """Reconstruction loss per step for every model, plus the BAE's batch entropy if logged."""
    has_entropy = any(
        "batch_entropy_bits" in row for history in histories.values() for row in history
    )
    fig, axes = plt.subplots(1, 2 if has_entropy else 1, figsize=(11 if has_entropy else 6, 4))
    axes = np.atleast_1d(axes)
    for name, history in histories.items():
        steps = [row["step"] for row in history]
        axes[0].plot(steps, [row["reconstruction_loss"] for row in history], label=name)
        if has_entropy and "batch_entropy_bits" in history[0]:
            axes[1].plot(steps, [row["batch_entropy_bits"] for row in history], label=name)
    axes[0].set(xlabel="training step", ylabel="reconstruction loss (mean sq. error)", yscale="log")
    axes[0].set_title("Reconstruction (normalised activations)")
    axes[0].legend()
    if has_entropy:
        axes[1].set(xlabel="training step", ylabel="bits", title="Minibatch code entropy (BAE)")
        axes[1].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _log_frequency_bins(firing_rates: Mapping[str, Tensor]) -> np.ndarray:
    floor = min(
        (float(r[r > 0].min()) for r in firing_rates.values() if (r > 0).any()), default=1e-6
    )
    return np.linspace(np.log10(floor) - 0.1, 0.0, 50)


def _firing_histogram(
    ax: Any, firing_rates: Mapping[str, Tensor], bins: np.ndarray, dense_threshold: float = 0.5
) -> None:
    for name, rates in firing_rates.items():
        rates = rates.detach().float().cpu().numpy()
        alive = rates[rates > 0]
        dead = int((rates == 0).sum())
        dense = int((rates > dense_threshold).sum())
        ax.hist(
            np.log10(alive),
            bins=bins,
            alpha=0.55,
            label=f"{name} ({len(rates)} features, {dead} dead, {dense} dense)",
        )
    ax.axvline(np.log10(dense_threshold), color="k", linestyle=":", linewidth=1)
    ax.set(xlabel="log10 firing frequency on held-out tokens", ylabel="features")
    ax.legend(fontsize=7)


def plot_firing_frequencies(
    firing_rates: Mapping[str, Tensor], path: str | Path, title: str = ""
) -> Path:
    """Histogram of log10 feature firing frequency per model; dead features counted apart."""
    fig, ax = plt.subplots(figsize=(7, 4))
    _firing_histogram(ax, firing_rates, _log_frequency_bins(firing_rates))
    ax.set_title(title or "Feature firing frequency")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_firing_frequency_grid(
    firing_rates: Mapping[str, Tensor],
    path: str | Path,
    reference: str = "bae",
    dense_threshold: float = 0.5,
    title: str = "",
) -> Path:
    """One panel per baseline: its firing-frequency histogram over the reference model's."""
    others = [name for name in firing_rates if name != reference]
    if reference not in firing_rates or not others:
        raise ValueError(
            f"Need {reference!r} and at least one other model; got {list(firing_rates)}"
        )
    columns = min(3, len(others))
    rows = -(-len(others) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows), squeeze=False)
    bins = _log_frequency_bins(firing_rates)
    for ax, name in zip(axes.flat, others, strict=False):
        pair = {reference: firing_rates[reference], name: firing_rates[name]}
        _firing_histogram(ax, pair, bins, dense_threshold)
        ax.set_title(f"{reference} vs {name}", fontsize=9)
    for ax in list(axes.flat)[len(others) :]:
        ax.axis("off")
    fig.suptitle(title or "Feature firing frequency (dotted: dense threshold)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_magnitude_heatmaps(
    magnitudes: Mapping[str, Tensor], path: str | Path, title: str = ""
) -> Path:
    """Per model, a [samples x channels] heat map of feature magnitudes (each model's own scale:
    burstiness for a BAE, activations for an SAE)."""
    columns = min(3, len(magnitudes))
    rows = -(-len(magnitudes) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows), squeeze=False)
    for ax, (name, values) in zip(axes.flat, magnitudes.items(), strict=False):
        image = ax.imshow(values.detach().float().cpu().numpy(), aspect="auto", cmap="magma")
        fig.colorbar(image, ax=ax)
        ax.set(title=name, xlabel="channel (most used first)", ylabel="held-out token")
    for ax in list(axes.flat)[len(magnitudes) :]:
        ax.axis("off")
    fig.suptitle(title or "Feature magnitudes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_synthetic_scatter(rows: list[dict], path: str | Path) -> Path:
    """True entropy r against the BAE estimate: colour = with/without the entropy objective,
    marker = expansion rate, opacity = held-out reconstruction (faint = poor), diagonal drawn."""
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    markers = {2: "o", 4: "s", 8: "^"}
    colors = {True: "tab:blue", False: "tab:red"}
    for row in rows:
        error = row["relative_error"]
        alpha = 1.0 if error is None else float(np.clip(1.0 - 20 * error, 0.15, 1.0))
        ax.scatter(
            row["r"],
            row["estimate_bits"],
            marker=markers.get(row["expansion"], "D"),
            color=colors[row["objective"]],
            alpha=alpha,
            s=40,
        )
    top = max(max(r["r"] for r in rows), max(r["estimate_bits"] for r in rows)) * 1.1 + 1
    ax.plot([0, top], [0, top], "k--", linewidth=1, label="estimate = r")
    ax.set(
        xscale="symlog",
        yscale="symlog",
        xlabel="true entropy r (bits)",
        ylabel="estimated entropy (bits)",
        title="Synthetic directional benchmark",
    )
    handles = [
        plt.Line2D([], [], color=c, marker="o", linestyle="", label=label)
        for c, label in ((colors[True], "with entropy objective"), (colors[False], "a_e = a_c = 0"))
    ] + [
        plt.Line2D([], [], color="gray", marker=m, linestyle="", label=f"{e}x expansion")
        for e, m in markers.items()
        if any(row["expansion"] == e for row in rows)
    ]
    ax.legend(handles=[*handles, ax.get_lines()[0]], fontsize=8, loc="upper left")
    ax.text(
        0.98,
        0.02,
        "opacity: held-out reconstruction (faint = worse)",
        transform=ax.transAxes,
        ha="right",
        fontsize=7,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_synthetic_dynamics(
    histories: Mapping[str, dict[str, list[float]]], path: str | Path
) -> Path:
    """Per training step: reconstruction loss against minibatch code entropy."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, history in histories.items():
        ax.plot(
            history["batch_entropy_bits"], history["reconstruction_loss"], label=label, alpha=0.8
        )
        ax.scatter(history["batch_entropy_bits"][-1], history["reconstruction_loss"][-1], s=25)
    ax.set(
        xlabel="minibatch code entropy (bits)",
        ylabel="reconstruction loss",
        yscale="log",
        title="Training dynamics (largest r; dot = end of training)",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _error_colour_bar(fig: Any, ax: Any, scatter: Any) -> None:
    fig.colorbar(scatter, ax=ax, label="relative reconstruction error (SSE / variance)")


def plot_entropy_curves(
    rows: list[dict],
    path: str | Path,
    *,
    x: str,
    curve: str,
    xlabel: str,
    curve_label: str,
    title: str = "",
    log2_x: bool = False,
) -> Path:
    """Estimated bits against ``x``, one curve per value of ``curve``; points coloured by their
    BAE's relative reconstruction error (an estimate from a poor reconstruction is not one)."""
    fig, ax = plt.subplots(figsize=(7, 4.8))
    errors = [r["relative_error"] for r in rows if r["relative_error"] is not None]
    vmax = max(errors) if errors else 1.0
    scatter = None
    for value in sorted({r[curve] for r in rows}):
        group = sorted((r for r in rows if r[curve] == value), key=lambda r: r[x])
        xs = [r[x] for r in group]
        label = f"{curve_label} {value}"
        if "accuracy" in group[0]:  # ICL traces: the model's accuracy with these k shots
            label += f" (ICL accuracy {group[0]['accuracy']:.2f})"
        ax.plot(xs, [r["bits"] for r in group], "-", alpha=0.7, label=label)
        scatter = ax.scatter(
            xs,
            [r["bits"] for r in group],
            c=[np.nan if r["relative_error"] is None else r["relative_error"] for r in group],
            cmap="viridis",
            vmin=0.0,
            vmax=vmax,
            s=36,
            zorder=3,
            edgecolors="k",
            linewidths=0.3,
        )
    if log2_x:
        ax.set_xscale("log", base=2)
    ax.set(xlabel=xlabel, ylabel="estimated entropy (bits)", title=title)
    ax.legend(fontsize=8)
    if scatter is not None:
        _error_colour_bar(fig, ax, scatter)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_entropy_by_position(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Entropy against token position (log2 axis), one curve per layer."""
    return plot_entropy_curves(
        rows,
        path,
        x="position",
        curve="layer",
        xlabel="token position (tokens after BOS)",
        curve_label="layer",
        title=title or "Hidden-state entropy by position",
        log2_x=True,
    )


def plot_entropy_by_layer(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Entropy against layer, one curve per number of in-context demonstrations k."""
    return plot_entropy_curves(
        rows,
        path,
        x="layer",
        curve="shots",
        xlabel="layer",
        curve_label="k =",
        title=title or "Last-token entropy with k demonstrations",
    )


def plot_two_token_benchmark(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Estimate against r for r-token sequences over two tokens, with the ceilings drawn: r bits
    and the plug-in entropy of the sequences actually sampled."""
    fig, ax = plt.subplots(figsize=(6.5, 5))
    rs = [row["r"] for row in rows]
    ax.plot(rs, rs, "k--", linewidth=1, label="r (entropy of the sequence source)")
    ax.plot(rs, [row["sample_entropy_bits"] for row in rows], ":", color="gray",
            label="plug-in entropy of the sampled sequences")  # fmt: skip
    scatter = ax.scatter(
        rs,
        [row["bits"] for row in rows],
        c=[np.nan if row["relative_error"] is None else row["relative_error"] for row in rows],
        cmap="viridis",
        s=45,
        zorder=3,
        edgecolors="k",
        linewidths=0.3,
        label="BAE estimate",
    )
    ax.set(xlabel="sequence length r (bits of randomness)", ylabel="bits", title=title)
    ax.legend(fontsize=8, loc="upper left")
    _error_colour_bar(fig, ax, scatter)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_comsem_scores(
    scores: Mapping[str, list[float]] | list[float], path: str | Path, title: str = ""
) -> Path:
    """Per-feature ComSem scores sorted from best to worst, with their running mean (the summary
    score after the best n features): one curve pair per model when given a mapping."""
    series = scores if isinstance(scores, Mapping) else {"ComSem": scores}
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for n, (name, values) in enumerate(series.items()):
        ranked = np.sort(np.asarray(values, dtype=float))[::-1]
        if ranked.size == 0:
            continue
        rank = np.arange(1, ranked.size + 1)
        colour = f"C{n}"
        ax.plot(rank, ranked, color=colour, linewidth=1.5, label=f"{name}: score")
        ax.plot(rank, np.cumsum(ranked) / rank, "--", color=colour, linewidth=1,
                label=f"{name}: running mean")  # fmt: skip
    ax.set(xlabel="features, best first", ylabel="ComSem score", ylim=(-0.02, 1.02), title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_steering(
    rows: list[dict], unsteered: float, k_shot: float, shots: int, path: str | Path, title: str = ""
) -> Path:
    """0-shot accuracy against steering strength, one curve per model's task vector, with the
    unsteered 0-shot and the k-shot accuracies as reference lines."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for n, row in enumerate(rows):
        strengths = sorted(row["accuracy"], key=float)
        ax.plot([float(s) for s in strengths], [row["accuracy"][s] for s in strengths], "o-",
                color=f"C{n}", label=row["model"], markersize=4)  # fmt: skip
    ax.axhline(unsteered, color="gray", linestyle=":", label="0-shot, no steering")
    ax.axhline(k_shot, color="k", linestyle="--", linewidth=1, label=f"{shots}-shot")
    ax.set(xlabel="strength α", ylabel="0-shot accuracy", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_more_bits(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Reconstruction loss and activated features against C, the code bits per feature."""
    bits = [row["bits"] for row in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    left.plot(bits, [row["reconstruction_loss"] for row in rows], "o-")
    left.set(xlabel="C (bits per feature)", ylabel="held-out reconstruction loss", xticks=bits)
    right.plot(bits, [row["activated"] for row in rows], "o-", label="activated")
    if all(row.get("comsem_interpretable") is not None for row in rows):
        right.plot(bits, [row["comsem_interpretable"] for row in rows], "s--", label="FI (ComSem)")
    right.set(xlabel="C (bits per feature)", ylabel="features", xticks=bits)
    right.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_compression(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Compression ratio against cosine similarity to the originals, one point per threshold."""
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ratios = [row["ratio_float32"] for row in rows]
    cosines = [row["cosine"] for row in rows]
    ax.plot(ratios, cosines, "o-")
    for row, x, y in zip(rows, ratios, cosines, strict=True):
        ax.annotate(f"{row['threshold']:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)  # fmt: skip
    ax.set(xlabel="compression ratio vs float32 (decoder not counted)",
           ylabel="mean cosine similarity to the originals", xscale="log", title=title)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
