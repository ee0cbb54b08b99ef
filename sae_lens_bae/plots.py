"""Matplotlib figures saved as PNG: training curves, firing frequencies, feature magnitudes,
entropy traces and ComSem scores (an experiment's own figures live in its module, drawn with
``subplots`` and ``save_figure`` from here)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from torch import Tensor

__all__ = [
    "entropy_curves_figure",
    "error_colour_bar",
    "legend_marker",
    "plot_comsem_scores",
    "plot_entropy_curves",
    "plot_firing_frequencies",
    "plot_magnitude_heatmaps",
    "plot_training_curves",
    "save_figure",
    "subplots",
]


_FIGURE_KWARGS = ("figsize", "dpi", "layout")


def subplots(nrows: int = 1, ncols: int = 1, **kwargs: Any) -> tuple[Any, Any]:
    """``matplotlib.pyplot.subplots`` for a figure that is only ever written to a file: a bare
    ``Figure``, outside pyplot, so no backend is chosen or changed (a notebook importing this
    keeps its inline plots) and nothing is left open for a notebook to display."""
    fig = Figure(**{k: kwargs.pop(k) for k in _FIGURE_KWARGS if k in kwargs})
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Lay out and write ``fig`` as a PNG; returns the path."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return Path(path)


def legend_marker(label: str, color: str, marker: str = "o") -> Any:
    """A legend entry for a marker style (scatter plots whose points carry other meanings)."""
    return Line2D([], [], color=color, marker=marker, linestyle="", label=label)


def plot_training_curves(
    histories: Mapping[str, list[dict[str, float]]], path: str | Path, title: str = ""
) -> Path:
    """Reconstruction loss per step for every model, plus the BAE's batch entropy if logged."""
    has_entropy = any(
        "batch_entropy_bits" in row for history in histories.values() for row in history
    )
    fig, axes = subplots(1, 2 if has_entropy else 1, figsize=(11 if has_entropy else 6, 4))
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
    return save_figure(fig, path)


def _log_frequency_bins(frequencies: Mapping[str, Tensor]) -> np.ndarray:
    floor = min(
        (float(r[r > 0].min()) for r in frequencies.values() if (r > 0).any()), default=1e-6
    )
    return np.linspace(np.log10(floor) - 0.1, 0.0, 50)


def _firing_histogram(
    ax: Any,
    frequencies: Mapping[str, Tensor],
    bins: np.ndarray,
    counts: Mapping[str, Mapping[str, Any]],
    dense_threshold: float,
) -> None:
    for name, frequency in frequencies.items():
        values = frequency.detach().float().cpu().numpy()
        held = counts[name]  # the caller's features.statistics.frequency_counts: every table's
        ax.hist(
            np.log10(values[values > 0]),
            bins=bins,
            alpha=0.55,
            label=f"{name} ({held['latents']} features, {held['dead']} dead, "
            f"{held['dense']} dense)",
        )
    ax.axvline(np.log10(dense_threshold), color="k", linestyle=":", linewidth=1)
    ax.set(xlabel="log10 firing frequency on held-out tokens", ylabel="features")
    ax.legend(fontsize=7)


def plot_firing_frequencies(
    frequencies: Mapping[str, Tensor],
    path: str | Path,
    counts: Mapping[str, Mapping[str, Any]],
    dense_threshold: float,
    title: str = "",
) -> Path:
    """Histogram of log10 firing frequency per model (``features.statistics.firing_frequency``:
    an SAE latent that fires, a BAE bit in its rare state), the paper's feature-density figure;
    the legend gives each model's ``counts`` (``features.statistics.frequency_counts`` of the
    same frequencies: latents, dead, dense), the dotted line ``dense_threshold``."""
    fig, ax = subplots(figsize=(7, 4))
    bins = _log_frequency_bins(frequencies)
    _firing_histogram(ax, frequencies, bins, counts, dense_threshold)
    ax.set_title(title or "Feature firing frequency")
    return save_figure(fig, path)


def plot_magnitude_heatmaps(
    magnitudes: Mapping[str, Tensor], path: str | Path, title: str = ""
) -> Path:
    """Per model, a [samples x latents] heat map of feature magnitudes (each model's own scale:
    burstiness for a BAE, activations for an SAE)."""
    columns = min(3, len(magnitudes))
    rows = -(-len(magnitudes) // columns)
    fig, axes = subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows), squeeze=False)
    for ax, (name, values) in zip(axes.flat, magnitudes.items(), strict=False):
        image = ax.imshow(values.detach().float().cpu().numpy(), aspect="auto", cmap="magma")
        fig.colorbar(image, ax=ax)
        ax.set(title=name, xlabel="latent (most used first)", ylabel="held-out token")
    for ax in list(axes.flat)[len(magnitudes) :]:
        ax.axis("off")
    fig.suptitle(title or "Feature magnitudes")
    return save_figure(fig, path, dpi=110)


def error_colour_bar(fig: Any, ax: Any, scatter: Any) -> None:
    """The colour bar of points coloured by their BAE's relative reconstruction error."""
    fig.colorbar(scatter, ax=ax, label="relative reconstruction error (SSE / variance)")


def plot_entropy_curves(rows: list[dict], path: str | Path, **options: Any) -> Path:
    """:func:`entropy_curves_figure` of ``rows`` (with its keyword ``options``) written to
    ``path``."""
    return save_figure(entropy_curves_figure(rows, **options), path)


def entropy_curves_figure(
    rows: list[dict],
    *,
    x: str,
    curve: str,
    xlabel: str,
    curve_label: str,
    title: str = "",
    log2_x: bool = False,
) -> Any:
    """Estimated bits against ``x``, one curve per value of ``curve``, with error bars (the
    spread over seeds, ``bits_std``, when the rows have it) and, dotted, each cell's ceiling
    log2(number of states) (``ceiling_bits``, when the rows have it): no set of that many states
    holds more. Every point is coloured by its BAE's relative reconstruction error; reliable
    cells are filled, unreliable ones hollow rings (``reliable`` False: a poor reconstruction or
    an estimate above its ceiling). Rows with a k-means reference (``reference_bits``) add it
    dashed, as squares in the curve's colour: filled where that code reads the cell (the
    rule's errors and ceiling), hollow where no K tried did."""
    fig, ax = subplots(figsize=(7.5, 4.8))
    errors = [r["relative_error"] for r in rows if r["relative_error"] is not None]
    norm = Normalize(vmin=0.0, vmax=max(errors) if errors else 1.0)
    cmap = colormaps["viridis"]
    mappable = None
    for n, value in enumerate(sorted({r[curve] for r in rows})):
        group = sorted((r for r in rows if r[curve] == value), key=lambda r: r[x])
        xs = [r[x] for r in group]
        bits = [r["bits"] for r in group]
        label = f"{curve_label} {value}"
        if "accuracy" in group[0]:  # ICL traces: the model's accuracy with these k shots
            label += f" (ICL accuracy {group[0]['accuracy']:.2f})"
        colour = f"C{n}"
        spread = [r.get("bits_std") or 0.0 for r in group]
        ax.errorbar(xs, bits, yerr=spread, fmt="-", color=colour, alpha=0.7, capsize=2, label=label)
        if all(r.get("ceiling_bits") is not None for r in group):
            ax.plot(
                xs,
                [r["ceiling_bits"] for r in group],
                ":",
                color=colour,
                linewidth=1.2,
                gid="ceiling",
            )
        referenced = [i for i, r in enumerate(group) if r.get("reference_bits") is not None]
        if referenced:  # the k-means reference: squares, filled where it reads the cell
            ax.plot(
                [xs[i] for i in referenced],
                [group[i]["reference_bits"] for i in referenced],
                "--",
                color=colour,
                linewidth=1.0,
                alpha=0.7,
                gid="reference",
            )
            passes = [bool(group[i]["reference_reads_cell"]) for i in referenced]
            ax.scatter(
                [xs[i] for i in referenced],
                [group[i]["reference_bits"] for i in referenced],
                marker="s",
                s=30,
                zorder=3,
                facecolors=[colour if p else "none" for p in passes],
                edgecolors=colour,
                linewidths=1.2,
                gid="reference_points",
            )
        shades = [
            (0.6, 0.6, 0.6, 1.0) if r["relative_error"] is None else cmap(norm(r["relative_error"]))
            for r in group
        ]
        for reliable in (True, False):
            picked = [i for i, r in enumerate(group) if bool(r.get("reliable", True)) is reliable]
            if not picked:
                continue
            points = ax.scatter(
                [xs[i] for i in picked],
                [bits[i] for i in picked],
                s=36 if reliable else 44,
                zorder=3,
                facecolors=[shades[i] for i in picked] if reliable else "none",
                edgecolors="k" if reliable else [shades[i] for i in picked],
                linewidths=0.3 if reliable else 1.8,
                gid="reliable" if reliable else "unreliable",
            )
            mappable = mappable or points
    if log2_x:
        ax.set_xscale("log", base=2)
    ax.set(xlabel=xlabel, ylabel="estimated entropy (bits)", title=title)
    if any(r.get("ceiling_bits") is not None for r in rows):
        ax.plot([], [], ":", color="k", label="ceiling: log2(states)")
    if any(not r.get("reliable", True) for r in rows):
        ax.scatter(
            [],
            [],
            s=44,
            facecolors="none",
            edgecolors="k",
            linewidths=1.8,
            label="unreliable cell (ring)",
        )
    if any(r.get("reference_bits") is not None for r in rows):
        label = "k-means reference: smallest K reading the cell (hollow: none did)"
        ax.plot([], [], "--s", color="k", markerfacecolor="none", linewidth=1.0, label=label)
    ax.legend(fontsize=8)
    if mappable is not None:
        fig.colorbar(
            ScalarMappable(norm=norm, cmap=cmap),
            ax=ax,
            label="relative reconstruction error (SSE / variance)",
        )
    return fig


def plot_comsem_scores(
    scores: Mapping[str, list[float]] | list[float], path: str | Path, title: str = ""
) -> Path:
    """Per-feature ComSem scores sorted from best to worst, with their running mean (the summary
    score after the best n features): one curve pair per model when given a mapping."""
    series = scores if isinstance(scores, Mapping) else {"ComSem": scores}
    fig, ax = subplots(figsize=(6.5, 4.5))
    for n, (name, values) in enumerate(series.items()):
        ranked = np.sort(np.asarray(values, dtype=float))[::-1]
        if ranked.size == 0:
            continue
        rank = np.arange(1, ranked.size + 1)
        colour = f"C{n}"
        ax.plot(rank, ranked, color=colour, linewidth=1.5, label=f"{name}: score")
        ax.plot(
            rank,
            np.cumsum(ranked) / rank,
            "--",
            color=colour,
            linewidth=1,
            label=f"{name}: running mean",
        )
    ax.set(xlabel="features, best first", ylabel="ComSem score", ylim=(-0.02, 1.02), title=title)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
