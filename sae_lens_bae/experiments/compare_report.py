"""What ``bae compare`` writes from its rows: the verdicts of the pre-registered rule, the
markdown report and the frontier plots (means over seeds, error bars their spread)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sae_lens_bae.comsem import COMSEM_COLUMNS
from sae_lens_bae.experiments.compare_read import MAGNITUDES_READ
from sae_lens_bae.experiments.protocol import (
    frontier,
    frontier_verdict,
    seed_mean_and_spread,
    value,
)
from sae_lens_bae.features import frequency_counts
from sae_lens_bae.features.probing import PROBE_KS
from sae_lens_bae.features.statistics import DENSE_FREQUENCY
from sae_lens_bae.plots import plot_firing_frequencies, save_figure, subplots
from sae_lens_bae.reports import cell, markdown_table

__all__ = ["CHECKS", "HEADLINE", "RULE", "plot_density", "plot_frontiers", "report", "verdicts"]

Row = dict[str, Any]

PROBE_K = "5"
"""The probe the verdicts read (every k is in the rows and tables)."""

HEADLINE = "activated_by_magnitude.support"
"""The headline metric (docs/research/protocol-v2.md): activated under the support's burstiness,
a stick that is the same definition for every family."""

CHECKS: tuple[tuple[str, str, str, bool], ...] = (
    *(
        (f"activated ({m}) at matched KL", "kl", f"activated_by_magnitude.{m}", True)
        for m in MAGNITUDES_READ
    ),
    *(
        (f"activated >8 ({m}) at matched KL", "kl", f"activated_strict_by_magnitude.{m}", True)
        for m in MAGNITUDES_READ
    ),
    ("KL at matched L0", "l0", "kl", False),
    ("EV at matched L0", "l0", "explained_variance", True),
)
"""(metric, x, y, higher y is better) of every verdict; probing adds one per task."""

RULE = (
    "Learning rate per family: its middle setting at each candidate (log-spaced), first two "
    "seeds, the grid extended while its edge wins; the lowest mean validation value of the "
    "family's own training objective. BAE default, on validation means over seeds: the most "
    "`activated` features among the settings with EV at least the sparsest TopK's minus 0.02 and "
    "under 1% constant latents (none: scale 1). Every model of the final grid is read once on "
    "test and on OOD. A frontier point is a setting's mean over seeds; its bootstrap replicates "
    "resample the split's sequences (the same resample for every model) and the seeds. Verdict, "
    "per split: the points of both frontiers inside the x range both span are read against the "
    "other frontier at their x (linear between its points); with fewer than 3 such points "
    "**too few points** (none: **no overlap**); otherwise the mean gap (BAE minus the other) "
    "and its 95% bootstrap interval: **better** above 0, **worse** below, **no difference** "
    "when it holds 0. L0 is the mean number of active latents per token: an SAE latent that "
    "fires, a BAE bit in its rare state. Headline: `activated` under the support's burstiness "
    "at matched KL."
)


def _probe_tasks(rows: Sequence[Row]) -> list[str]:
    return sorted({t for r in rows if r["split"] == "test" for t in r.get("probe_accuracy") or {}})


def verdicts(rows: Sequence[Row], families: Sequence[str], seed: int = 0) -> list[Row]:
    """The BAE against every other family on every check, on test and on OOD: one dict each."""
    if "bae" not in families:
        return []
    checks = list(CHECKS) + [
        (f"probe {t} (k={PROBE_K}) at matched L0", "l0", f"probe_accuracy.{t}.{PROBE_K}", True)
        for t in _probe_tasks(rows)
    ]
    found = []
    for family in [f for f in families if f != "bae"]:
        for metric, x, y, higher in checks:
            for split in ("test", "ood"):
                ours = frontier(rows, "bae", split, x, y, seed)
                theirs = frontier(rows, family, split, x, y, seed)
                if metric.startswith("probe") and not ours and not theirs:
                    continue  # one task: no probe of its own on OOD
                decided = frontier_verdict(ours, theirs, higher)
                found.append({"metric": metric, "against": family, "split": split, **decided})
    return found


COLUMNS = (
    ("L0", "l0", ".1f"),
    ("EV", "explained_variance", ".3f"),
    ("CE recovered", "ce_loss_recovered", ".3f"),
    ("KL", "kl", ".3f"),
    ("dead", "dead", ".0f"),
    ("constant", "constant", ".0f"),
    ("dense", "dense", ".0f"),
    ("activated", "activated", ".0f"),
    ("activated (>8)", "activated_strict", ".0f"),
    *((f"activated ({m})", f"activated_by_magnitude.{m}", ".0f") for m in MAGNITUDES_READ[1:]),
)


def _cell(values: list[Any], spec: str) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mean, spread = seed_mean_and_spread(values)
    return f"{mean:{spec}} ± {spread:{spec}}" if len(values) > 1 else f"{mean:{spec}}"


def split_table(rows: Sequence[Row], split: str) -> str:
    """One line per family and setting on ``split``: every metric as mean ± spread over seeds."""
    groups: dict[tuple[str, float], list[Row]] = {}
    for row in rows:
        if row["split"] == split:
            key = (row["family"], row["setting"])
            groups.setdefault(key, []).append(row)
    lines = [{"family": f, "setting": s, "rows": held} for (f, s), held in groups.items()]
    columns: list[tuple[str, Callable[[Row], str]]] = [
        ("family", lambda g: g["family"]),
        ("setting", lambda g: f"{g['setting']:g}"),
        ("lr", lambda g: f"{g['rows'][0]['lr']:g}"),
        ("seeds", lambda g: str(len(g["rows"]))),
    ]
    columns += [
        (title, lambda g, key=key, spec=spec: _cell([value(r, key) for r in g["rows"]], spec))
        for title, key, spec in COLUMNS
    ]
    columns += [
        (
            f"probe {task} k={k}",
            lambda g, key=f"probe_accuracy.{task}.{k}": _cell(
                [value(r, key) for r in g["rows"]], ".3f"
            ),
        )
        for task in _probe_tasks(rows)
        for k in PROBE_KS
    ]
    return markdown_table(lines, columns)


def report(summary: dict[str, Any]) -> str:
    """The markdown report: the rule first, then the choices, the tables and the verdicts."""
    config, tokens = summary["config"], summary["tokens"]
    validation = [r for r in summary["rows"] if r["split"] == "validation"]
    chosen = summary["chosen_lr"]
    choices = markdown_table(
        [r for r in validation if r["seed"] == config["seeds"][0]],
        [
            ("family", lambda r: r["family"]),
            ("setting", lambda r: f"{r['setting']:g}"),
            (
                "lr",
                lambda r: f"{r['lr']:g}" + (" (chosen)" if chosen[r["family"]] == r["lr"] else ""),
            ),
            ("validation objective", lambda r: cell(r["objective"], ".4g")),
            ("validation EV", lambda r: f"{r['explained_variance']:.3f}"),
            ("validation L0", lambda r: f"{r['l0']:.1f}"),
            ("validation activated", lambda r: str(r["activated"])),
        ],
    )
    lines = [
        f"# BAE vs SAEs: {config['model']} `{summary['hook']}`",
        "",
        f"Tokens: {tokens['train']} train, {tokens['validation']} validation, {tokens['test']} "
        f"test (from {summary['dataset']}), {tokens['ood']} OOD (from {summary['ood_dataset']}). "
        f"{config['steps']} steps of {config['batch_size']}, d_sae {config['d_sae']}, seeds "
        f"{list(config['seeds'])}. BAE magnitudes: burstiness with the {config['prior']} prior.",
        _outlier_line(config.get("outlier_norm_ratio"), summary.get("outliers_dropped")),
        "",
        "## The decision rule",
        "",
        RULE,
        "",
        "## Chosen on validation",
        "",
        f"BAE default setting: {summary['bae_default']}. Learning rates tried: "
        + "; ".join(
            f"{f}: {', '.join(f'{lr:g}' for lr in rates)}"
            for f, rates in summary["lr_candidates"].items()
        )
        + ".",
        "",
        choices,
    ]
    for split in ("test", "ood"):
        heading = "OOD" if split == "ood" else "Test"
        lines += [f"## {heading}", "", split_table(summary["rows"], split)]
    judged = [r for r in summary["rows"] if r.get("comsem_score") is not None]
    if judged:
        lines += ["## ComSem (test, first seed)", ""]
        columns = [("model", lambda r: r["name"])]
        columns += [
            (title, lambda r, key=key, spec=spec: cell(r.get(key), spec))
            for key, title, spec in COMSEM_COLUMNS
        ]
        lines.append(markdown_table(judged, columns))
    if summary["verdicts"]:
        lines += ["## Verdicts (the BAE against each family)", "", _verdict_table(summary)]
    return "\n".join(lines)


def _outlier_line(ratio: float | None, dropped: dict[str, int] | None) -> str:
    """The report's words on extreme states (``sae_lens_bae.outliers``): how many the harvests
    set aside, or that they were kept."""
    if ratio is None:
        return "Extreme states kept (--outlier-norm-ratio none)."
    if dropped is None:
        return ""
    return (
        f"Extreme states (norm above {ratio:g}x the median) set aside: {dropped['harvest']} of "
        f"the harvest, {dropped['ood']} of the OOD text."
    )


def _verdict_table(summary: dict[str, Any]) -> str:
    return markdown_table(
        summary["verdicts"],
        [
            ("metric", lambda v: v["metric"]),
            ("against", lambda v: v["against"]),
            ("split", lambda v: v["split"]),
            ("points in overlap", lambda v: str(v["points_in_overlap"])),
            ("mean gap", lambda v: cell(v["gap"], ".4g")),
            ("95% interval", lambda v: _interval(v["interval"])),
            ("verdict", lambda v: v["verdict"]),
        ],
    )


def _interval(interval: list[float] | None) -> str:
    return "-" if interval is None else f"[{interval[0]:.4g}, {interval[1]:.4g}]"


PLOTS = (
    ("frontier_kl_l0.png", "L0", "l0", "KL (spliced)", "kl"),
    ("frontier_activated_kl.png", "KL (spliced)", "kl", "activated (support)", HEADLINE),
    ("frontier_activated_native_kl.png", "KL (spliced)", "kl", "activated (native)", "activated"),
)


def plot_frontiers(rows: Sequence[Row], families: Sequence[str], out: Path, title: str) -> None:
    """The frontier PNGs, test on the left and OOD on the right: one marker per family, a point
    per setting (mean over seeds), error bars the seeds' spread."""
    for file, x_label, x, y_label, y in PLOTS:
        fig, axes = subplots(1, 2, figsize=(11, 4.5))
        for ax, split in zip(axes, ("test", "ood"), strict=True):
            for n, family in enumerate(families):
                points = frontier(rows, family, split, x, y)
                if points:
                    ax.errorbar(
                        [p.x for p in points],
                        [p.y for p in points],
                        xerr=[p.x_spread for p in points],
                        yerr=[p.y_spread for p in points],
                        marker="osv^D*P"[n % 7],
                        capsize=3,
                        label=family,
                    )
            ax.set(xlabel=x_label, ylabel=y_label, title=f"{title}: {split}")
            if x_label.startswith("L0"):
                ax.set_xscale("log")
            ax.legend(fontsize=7)
        save_figure(fig, out / file)


def plot_density(frequencies: dict[str, Any], rows: Sequence[Row], path: Path, title: str) -> Path:
    """The paper's feature-density figure: every family's log10 firing frequency on test, one
    model each (its middle setting, first seed), dead and dense counted as every table counts
    them."""
    picked = {}
    for row in rows:
        if row["split"] == "test" and row["family"] not in picked and row["name"] in frequencies:
            settings = sorted({r["setting"] for r in rows if r["family"] == row["family"]})
            middle = settings[(len(settings) - 1) // 2]
            first = min(r["seed"] for r in rows if r["family"] == row["family"])
            if row["setting"] == middle and row["seed"] == first:
                picked[row["family"]] = frequencies[row["name"]]
    counts = {family: frequency_counts(frequency) for family, frequency in picked.items()}
    return plot_firing_frequencies(
        picked, path, counts, DENSE_FREQUENCY, title=f"Feature density, {title} (test)"
    )
