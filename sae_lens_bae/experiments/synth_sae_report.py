"""What ``bae bench synth-sae`` writes: ``synth.json`` (``model``, ``rows``, ``verdicts``,
``entropy_rows``), ``synth.md`` (the tables as they came out) and ``synth.png`` (MCC and F1
against L0, a line per family)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sae_lens_bae.experiments.protocol import frontier, frontier_verdict
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.reports import cell, markdown_table, write_json, write_text
from sae_lens_bae.training.baselines import shared_schedule

__all__ = [
    "VERDICT_METRICS",
    "plot_frontiers",
    "summary_table",
    "verdict_table",
    "verdicts",
    "write_outputs",
]

VERDICT_METRICS = {"mcc": True, "f1": True, "dead": False, "dense": False}
"""The metrics the BAE is judged on against each family at matched L0 (True: higher is better)."""
REPLICATES = 1000
"""Bootstrap replicates over seeds of every verdict."""
SUMMARY = (
    "l0", "mcc", "f1", "uniqueness", "precision", "recall", "explained_variance", "ev_ceiling",
    "dead", "dense", "above_top_feature", "shrinkage",
)  # fmt: skip


def _with_replicates(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows whose every replicate is the row's own value: the frontier's bootstrap then resamples
    seeds alone (no sequences exist on synthetic data)."""
    keys = ("l0", *VERDICT_METRICS)
    return [{**r, "replicates": {k: [float(r[k])] * REPLICATES for k in keys}} for r in rows]


def verdicts(
    rows: Sequence[dict[str, Any]], others: Sequence[str], ours: str = "bae"
) -> dict[str, Any]:
    """Protocol v2's verdict of the family ``ours`` against each of ``others`` on each metric,
    with L0 as x, on the rows' one split (keyed ``other.metric``)."""
    held = _with_replicates(rows)
    found: dict[str, Any] = {}
    for other in others:
        if other == ours:
            continue
        for metric, higher in VERDICT_METRICS.items():
            mine = frontier(held, ours, "test", "l0", metric)
            theirs = frontier(held, other, "test", "l0", metric)
            found[f"{other}.{metric}"] = frontier_verdict(mine, theirs, higher)
    return found


def _summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per family and setting: each metric's mean and spread over seeds."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["family"], row["setting"]), []).append(row)
    lines = []
    for (family, setting), held in sorted(groups.items()):
        line: dict[str, Any] = {"family": family, "setting": setting, "seeds": len(held)}
        for key in SUMMARY:
            values = [float(r[key]) for r in held]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            line[key] = (statistics.fmean(values), spread)
        line["converged"] = sum(bool(r["converged"]) for r in held)
        lines.append(line)
    return lines


def _mean(key: str, spec: str) -> Any:
    return lambda line: f"{line[key][0]:{spec}} ± {line[key][1]:{spec}}"


COLUMNS = [
    ("family", lambda line: line["family"]),
    ("setting", lambda line: f"{line['setting']:g}"),
    ("L0", _mean("l0", ".1f")),
    ("MCC", _mean("mcc", ".3f")),
    ("F1", _mean("f1", ".3f")),
    ("uniqueness", _mean("uniqueness", ".3f")),
    ("EV", _mean("explained_variance", ".3f")),
    ("EV ceiling", lambda line: f"{line['ev_ceiling'][0]:.3f}"),
    ("dead", _mean("dead", ".1f")),
    ("dense", _mean("dense", ".1f")),
    ("above top", _mean("above_top_feature", ".1f")),
    ("converged", lambda line: f"{line['converged']}/{line['seeds']}"),
]
ENTROPY_COLUMNS = [
    ("cell", lambda r: r["cell"]),
    ("truth (bits)", lambda r: cell(r["truth_bits"], ".2f")),
    ("BAE (bits)", lambda r: cell(r["bits"], ".2f")),
    ("ceiling (bits)", lambda r: cell(r["ceiling_bits"], ".2f")),
    ("reconstruction error", lambda r: cell(r["relative_error"], ".3f")),
    ("reliable", lambda r: "yes" if r["reliable"] else "no"),
    ("within tolerance", lambda r: "yes" if r["within_tolerance"] else "no"),
]


def summary_table(rows: Sequence[dict[str, Any]]) -> str:
    """One markdown line per family and setting: mean ± sd over seeds, converged seeds."""
    return markdown_table(_summary(rows), COLUMNS)


def verdict_table(found: dict[str, Any]) -> str:
    """``verdicts``' answer as a markdown table, a line per family and metric."""
    return markdown_table(
        [{"key": key, **value} for key, value in found.items()],
        [
            ("family.metric", lambda v: v["key"]),
            ("verdict", lambda v: v["verdict"]),
            ("mean gap", lambda v: cell(v["gap"], "+.3f")),
            ("95% interval", lambda v: "-" if v["interval"] is None else
             f"[{v['interval'][0]:+.3f}, {v['interval'][1]:+.3f}]"),
            ("points", lambda v: str(v["points_in_overlap"])),
        ],
    )  # fmt: skip


def _markdown(cfg: Any, model: dict[str, Any], rows: list[dict], found: dict, entropy: list) -> str:
    spec = cfg.spec
    schedule = shared_schedule(spec.lr, model["steps"])  # what train_seed trained with
    lines = [
        f"# bae bench synth-sae --preset {cfg.preset}",
        "",
        f"Model: {spec.num_features} features in {spec.hidden_dim} dimensions; SAE width "
        f"{spec.width}; {model['steps']} steps of {spec.batch_size} samples at lr {spec.lr} "
        f"(warm-up over {schedule['lr_warm_up_steps']} steps, linear decay to "
        f"{schedule['lr_end']:g} over the last {schedule['lr_decay_steps']}); "
        f"seeds {', '.join(map(str, cfg.seeds))}; target L0 {model['target_l0']:.2f} (the "
        f"true L0 of the {spec.width} most frequent features). Mean ± sd over seeds; a BAE in "
        "its canonical form.",
        "",
        summary_table(rows),
        f"Converged (MCC and F1 moved < 0.01 over the last quarter): "
        f"{sum(bool(r['converged']) for r in rows)} of {len(rows)} models.",
        "",
        "## The BAE against each family at matched L0",
        "",
        verdict_table(found),
    ]
    lines += _published(spec)
    if entropy:
        read = sum(r["reliable"] and r["within_tolerance"] for r in entropy)
        wrong = sum(r["reliable"] and not r["within_tolerance"] for r in entropy)
        lines += [
            "## Feature-set entropy with a known answer",
            "",
            markdown_table(entropy, ENTROPY_COLUMNS),
            f"{read} of {len(entropy)} cells read (reliable and within max(0.25 bit, 3%)); "
            f"{wrong} reliable reading{'' if wrong == 1 else 's'} off the truth by more. The "
            "ceiling is log2 of the number of distinct held-out states: a "
            "truth above it cannot be confirmed from this many states.",
            "",
        ]
    return "\n".join(lines)


def _published(spec: Any) -> list[str]:
    """SAELens' published SynthSAEBench-16k rows (200M samples), for the preset that has them."""
    if not spec.published:
        return []
    lines = ["## Published (SAELens, SynthSAEBench-16k, 200M samples)", ""]
    for l0, families in spec.published.items():
        table = [{"family": name, **values} for name, values in families.items()]
        lines.append(f"L0 = {l0}:\n")
        lines.append(
            markdown_table(
                table,
                [
                    ("family", lambda r: r["family"]),
                    ("F1", lambda r: f"{r['f1']:.4f}"),
                    ("MCC", lambda r: f"{r['mcc']:.4f}"),
                    ("uniqueness", lambda r: f"{r['uniqueness']:.4f}"),
                    ("EV", lambda r: f"{r['ev']:.4f}"),
                ],
            )
        )
    return lines


def plot_frontiers(rows: Sequence[dict[str, Any]], families: Sequence[str], path: Path) -> Path:
    """MCC and F1 against L0: a family's seed-mean points by setting, joined in L0 order."""
    fig, axes = subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("mcc", "f1"), strict=True):
        for family in families:
            points = frontier(rows, family, "test", "l0", metric)
            ax.plot([p.x for p in points], [p.y for p in points], marker="o", label=family)
        ax.set_xlabel("L0")
        ax.set_ylabel(metric.upper())
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def write_outputs(
    out: Path, cfg: Any, model: dict[str, Any], rows: list[dict], entropy: list[dict]
) -> dict[str, Any]:
    """Write the three outputs; returns what ``synth.json`` holds."""
    found = verdicts(rows, cfg.families)
    summary = {"model": model, "rows": rows, "verdicts": found, "entropy_rows": entropy}
    write_json(out / "synth.json", summary)
    write_text(out / "synth.md", _markdown(cfg, model, rows, found, entropy))
    plot_frontiers(rows, cfg.families, out / "synth.png")
    return summary
