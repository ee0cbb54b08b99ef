"""What ``bae compare`` writes from its rows: the verdicts of the pre-registered rule, the
markdown report and the frontier plots (means over seeds, error bars their spread)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from sae_lens_bae.comsem import COMSEM_COLUMNS
from sae_lens_bae.experiments.protocol import frontier, frontier_verdict, seed_mean_and_spread
from sae_lens_bae.features.probing import PROBE_KS
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.reports import cell, markdown_table

__all__ = ["CHECKS", "RULE", "plot_frontiers", "report", "verdicts"]

Row = dict[str, Any]

PROBE_K = "5"
"""The probe the verdicts read (every k is in the rows and tables)."""


def _probe(row: Row) -> float | None:
    return (row.get("probe_accuracy") or {}).get(PROBE_K)


CHECKS: tuple[tuple[str, Callable[[Row], Any], Callable[[Row], Any], bool], ...] = (
    ("activated at matched KL", itemgetter("kl"), itemgetter("activated"), True),
    ("activated (>8) at matched KL", itemgetter("kl"), itemgetter("activated_strict"), True),
    ("KL at matched L0", itemgetter("l0_rare"), itemgetter("kl"), False),
    ("EV at matched L0", itemgetter("l0_rare"), itemgetter("explained_variance"), True),
    (f"probe accuracy (k={PROBE_K}) at matched L0", itemgetter("l0_rare"), _probe, True),
)
"""(metric, x, y, higher y is better) of every verdict."""

RULE = (
    "Learning rate per family: the lowest validation value of the family's own training "
    "objective at its middle setting, first seed. BAE default, on validation means over seeds: "
    "the most `activated` features among the settings with EV at least the sparsest TopK's "
    "minus 0.02 and under 1% constant channels (none: scale 1). Every model of the final grid is "
    "read once on test and on OOD. A family's frontier is its settings' points, each the mean "
    "over seeds with the sample standard deviation as spread. The BAE **beats** a family on a "
    "metric at matched x when, at every BAE point inside the other frontier's x range, its value "
    "exceeds the other frontier's (linear between its points) by more than the larger spread; "
    "it **loses** when the reverse holds at every such point; otherwise **no difference**; "
    "**no overlap** when no BAE point lies in the other's x range. A verdict holds only when "
    "test and OOD agree. L0 in the verdicts and plots is `L0 rare`: per token, the latents in "
    "their informative state, an SAE's L0 and a BAE's bits in their rare state (its L0 once "
    "canonicalised, an exact reparametrisation)."
)


def verdicts(rows: Sequence[Row], families: Sequence[str]) -> list[Row]:
    """The BAE against every SAE family on every check of ``CHECKS``, on test and OOD."""
    if "bae" not in families:
        return []
    found = []
    for family in [f for f in families if not f.startswith("bae")]:
        for metric, x, y, higher in CHECKS:
            per_split = {
                split: frontier_verdict(
                    frontier(rows, "bae", split, x, y), frontier(rows, family, split, x, y), higher
                )
                for split in ("test", "ood")
            }
            agreed = per_split["test"] if per_split["test"] == per_split["ood"] else "split"
            found.append({"metric": metric, "against": family, **per_split, "verdict": agreed})
    return found


COLUMNS = (
    ("L0", "l0", ".1f"),
    ("L0 rare", "l0_rare", ".1f"),
    ("EV", "explained_variance", ".3f"),
    ("CE recovered", "ce_loss_recovered", ".3f"),
    ("KL", "kl", ".3f"),
    ("dead", "dead", ".0f"),
    ("constant", "constant", ".0f"),
    ("activated", "activated", ".0f"),
    ("activated (>8)", "activated_strict", ".0f"),
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
        (title, lambda g, key=key, spec=spec: _cell([r.get(key) for r in g["rows"]], spec))
        for title, key, spec in COLUMNS
    ]
    columns += [
        (
            f"probe k={k}",
            lambda g, k=k: _cell(
                [(r.get("probe_accuracy") or {}).get(str(k)) for r in g["rows"]], ".3f"
            ),
        )
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
        "",
        "## The decision rule",
        "",
        RULE,
        "",
        "## Chosen on validation",
        "",
        f"BAE default setting: {summary['bae_default']}.",
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
        lines += ["## Verdicts (the BAE against each family)", ""]
        lines.append(
            markdown_table(
                summary["verdicts"],
                [
                    (title, lambda v, key=key: str(v[key]))
                    for title, key in (
                        ("metric", "metric"),
                        ("against", "against"),
                        ("test", "test"),
                        ("OOD", "ood"),
                        ("verdict", "verdict"),
                    )
                ],
            )
        )
    return "\n".join(lines)


PLOTS = (
    (
        "frontier_kl_l0.png",
        "L0 (rare state)",
        itemgetter("l0_rare"),
        "KL (spliced)",
        itemgetter("kl"),
    ),
    (
        "frontier_activated_kl.png",
        "KL (spliced)",
        itemgetter("kl"),
        "activated",
        itemgetter("activated"),
    ),
    (
        "frontier_probe_l0.png",
        "L0 (rare state)",
        itemgetter("l0_rare"),
        f"probe accuracy (k={PROBE_K})",
        _probe,
    ),
)


def plot_frontiers(rows: Sequence[Row], families: Sequence[str], out: Path, title: str) -> None:
    """The three frontier PNGs, test on the left and OOD on the right: one marker per family, a
    point per setting (mean over seeds), error bars the seeds' spread."""
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
