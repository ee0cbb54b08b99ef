"""The synthetic benchmark's verdict and outputs: the accuracy bar, ``synthetic.json``/``.md``,
the plots, and reading back an earlier run of the same grid (so an interrupted one resumes)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sae_lens_bae.experiments.synthetic_grids import SyntheticGrid, tolerance
from sae_lens_bae.plots import legend_marker, save_figure, subplots
from sae_lens_bae.reports import read_json, write_json, write_text

__all__ = [
    "earlier_rows",
    "passes_bar",
    "plot_synthetic_dynamics",
    "plot_synthetic_scatter",
    "summarise",
    "thin_history",
    "write_outputs",
]

DYNAMICS = "synthetic_dynamics.json"
DYNAMICS_POINTS = 2000  # per curve: enough for the plot, small beside a 45000-step history


def thin_history(history: Mapping[str, list[float]]) -> dict[str, list[float]]:
    """The two curves the dynamics plot draws, at most ``DYNAMICS_POINTS`` points each (the last
    step always kept: the plot marks it)."""
    thinned = {}
    for key in ("batch_entropy_bits", "reconstruction_loss"):
        values = list(history[key])
        stride = max(1, -(-len(values) // DYNAMICS_POINTS))
        thinned[key] = values[::stride] + ([values[-1]] if (len(values) - 1) % stride else [])
    return thinned


def earlier_rows(
    grid: SyntheticGrid, out: Path, cells: list[tuple[int, int]]
) -> tuple[list[dict[str, Any]], dict[str, dict[str, list[float]]]]:
    """The complete groups of an earlier run of this grid in ``out`` and their dynamics (nothing if
    there is none); refuses a folder holding another grid's results, which this run would
    overwrite."""
    path = out / "synthetic.json"
    if not path.exists():
        return [], {}
    saved = read_json(
        path,
        "a synthetic benchmark's results",
        "use another --out (or --no-resume to overwrite it)",
        ("preset", "results"),
    )
    if saved.get("preset") != json.loads(json.dumps(grid.record())):  # as the file holds it
        raise ValueError(
            f"{path} holds the results of another grid or recipe; use another --out "
            f"(or --no-resume to overwrite them)"
        )
    by_group: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for row in saved["results"]:
        by_group.setdefault((row["expansion"], row["objective"]), []).append(row)
    wanted = sorted(cells)
    rows = [
        row
        for group in by_group.values()
        if sorted((row["r"], row["seed"]) for row in group) == wanted
        for row in group
    ]
    dynamics = {}
    if rows and (out / DYNAMICS).exists():
        fix = f"delete it to record the training dynamics again with {out}"
        dynamics = read_json(out / DYNAMICS, "synthetic training dynamics", fix)
        if not all(isinstance(curves, dict) for curves in dynamics.values()):
            raise ValueError(f"{out / DYNAMICS} is not synthetic training dynamics; {fix}")
    return rows, dynamics


def passes_bar(
    rows: list[dict[str, Any]],
    min_seeds: int = 2,
    bar: Callable[[int], float] = tolerance,
) -> dict[str, Any]:
    """The entropy issue's bar, counted per (r, expansion) over seeds: with the objective, r within
    max(1, 0.1 r) bits and held-out relative error <= 2% (r = 0: MSE <= 1e-4, as the data has no
    variance) on at least ``min_seeds`` seeds; without it (the ablation), every r >= 1 estimated
    above r + max(1, 0.1 r) on at least ``min_seeds`` seeds too. ``ablation_all_seeds`` is the
    stricter reading: above the bar on every seed."""
    verdict: dict[str, Any] = {"with_objective": {}, "ablation": {}}
    seeds_per_cell: dict[str, int] = {}
    for row in rows:
        r, key = row["r"], f"r={row['r']},expansion={row['expansion']}"
        if row["objective"]:
            accurate = abs(row["estimate_bits"] - r) <= bar(r) + 1e-9
            if row["relative_error"] is None:
                faithful = row["reconstruction_mse"] <= 1e-4
            else:
                faithful = row["relative_error"] <= 0.02
            verdict["with_objective"].setdefault(key, 0)
            verdict["with_objective"][key] += int(accurate and faithful)
        elif r >= 1:
            seeds_per_cell[key] = seeds_per_cell.get(key, 0) + 1
            verdict["ablation"].setdefault(key, 0)
            verdict["ablation"][key] += int(row["estimate_bits"] > r + bar(r))
    verdict["objective_ok"] = all(n >= min_seeds for n in verdict["with_objective"].values())
    verdict["ablation_ok"] = all(n >= min_seeds for n in verdict["ablation"].values())
    verdict["ablation_all_seeds"] = all(
        n == seeds_per_cell[key] for key, n in verdict["ablation"].items()
    )
    return verdict


def summarise(grid: SyntheticGrid, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``synthetic.json`` holds: the grid, the rows, ``passes_bar``'s verdict (a cell
    passing on 2 seeds, 1 for a one-seed grid) and the (expansion, objective) groups not trained
    yet (``missing``: the verdict covers only the others)."""
    verdict = passes_bar(rows, min_seeds=min(2, len(grid.seeds)), bar=grid.tolerance)
    trained = {(row["expansion"], row["objective"]) for row in rows}
    missing = [
        {"expansion": expansion, "objective": objective}
        for expansion, objective in grid.groups
        if (expansion, objective) not in trained
    ]
    return {"preset": grid.record(), "results": rows, "bar": verdict, "missing": missing}


def write_outputs(
    grid: SyntheticGrid,
    rows: list[dict[str, Any]],
    dynamics: dict[str, dict[str, list[float]]],
    out: Path,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(grid, rows)
    verdict = summary["bar"]
    write_json(out / DYNAMICS, dynamics)  # before the rows: a resumed run needs both
    write_json(out / "synthetic.json", summary)
    plot_synthetic_scatter(rows, out / "synthetic_entropy.png")
    plot_synthetic_dynamics(dynamics, out / "synthetic_dynamics.png")
    lines = [
        "| r | expansion | objective | estimate (bits, mean over seeds) | relative error "
        "| planted bits recovered (per seed) |",
        "|---|---|---|---|---|---|",
    ]
    keys = sorted({(row["r"], row["expansion"], row["objective"]) for row in rows})
    for r, expansion, objective in keys:
        group = [
            row
            for row in rows
            if (row["r"], row["expansion"], row["objective"]) == (r, expansion, objective)
        ]
        estimate = sum(row["estimate_bits"] for row in group) / len(group)
        errors = [row["relative_error"] for row in group if row["relative_error"] is not None]
        error = f"{sum(errors) / len(errors):.4f}" if errors else "-"
        # rows of a run from before the column have no count
        recovered = "/".join(str(row.get("recovered_bits", "-")) for row in group)
        lines.append(
            f"| {r} | {expansion} | {'yes' if objective else 'no'} | {estimate:.3f} "
            f"| {error} | {recovered} |"
        )
    line = (
        f"\nBar met with the objective (every cell, >= {min(2, len(grid.seeds))} seeds): "
        f"{verdict['objective_ok']}"
    )
    if grid.ablation:
        line += (
            f"; ablation above r + tolerance for every r >= 1 (same count of seeds): "
            f"{verdict['ablation_ok']}; on every seed: "
            f"{verdict['ablation_all_seeds']}"
        )
    lines.append(line)
    if summary["missing"]:
        groups = ", ".join(
            f"{g['expansion']}x {'with' if g['objective'] else 'without'} objective"
            for g in summary["missing"]
        )
        lines.append(
            f"\nPartial run, the verdict covers only the rows above; not trained yet: "
            f"{groups} (run the same command again to train them)."
        )
    write_text(out / "synthetic.md", "\n".join(lines) + "\n")


def plot_synthetic_scatter(rows: list[dict], path: str | Path) -> Path:
    """True entropy r against the BAE estimate: colour = with/without the entropy objective,
    marker = expansion rate, opacity = held-out reconstruction (faint = poor), diagonal drawn."""
    fig, ax = subplots(figsize=(6.5, 5.5))
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
        legend_marker(label, color=c)
        for c, label in ((colors[True], "with entropy objective"), (colors[False], "a_e = a_c = 0"))
    ] + [
        legend_marker(f"{e}x expansion", color="gray", marker=m)
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
    return save_figure(fig, path)


def plot_synthetic_dynamics(
    histories: Mapping[str, dict[str, list[float]]], path: str | Path
) -> Path:
    """Per training step: reconstruction loss against minibatch code entropy."""
    fig, ax = subplots(figsize=(6.5, 4.5))
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
    return save_figure(fig, path)
