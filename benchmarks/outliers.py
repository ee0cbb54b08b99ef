"""What a few extreme states do to a BAE trained with ``train_sae``, with and without the extreme
state policy (``sae_lens_bae.outliers``), on a synthetic set: the record behind
docs/research/outliers.md.

    python benchmarks/outliers.py --out /tmp/outliers

States: 32 dimensions, a 12-dimensional standard Gaussian in a random subspace plus a mean
offset of 5 on every coordinate; ``--n`` training states and a quarter as many held-out ones,
all ordinary. In the training set a share of the states (``--shares``) is put at ``--factors``
times the clean set's median norm, each keeping its direction. Every cell trains
``train_sae(x, bae_config(32, 64, normalize_activations="expected_average_only_in"),
training_samples=--steps * 512)``, as a user trains the default BAE (it reads inputs as given;
SAELens scales them to mean norm sqrt(d_in) by a factor estimated over its default
``n_batches_for_norm_estimate`` minibatches and folds it into the weights at the end), once with
the policy (the default: states above 10x the median norm dropped) and once keeping every state
(``outlier_norm_ratio=None``), for each of ``--seeds`` (the seed of the data, the injection and
the training), and reads on the held-out ordinary states: explained variance, the fraction of
constant bits (``saes.binary.constant_bits``) and of dense bits (rare state on more than
10% of states). Writes ``outliers.json``, ``outliers.md`` (each cell against the clean set of
its seed) and ``outliers.png``.

    python benchmarks/outliers.py --cache CACHE --hooks blocks.15.hook_resid_post \
        --shares 0.001 --factors 30 --steps 600 --out /tmp/outliers-llm

reads the hooks of an activation cache (``harvest_activations``) instead, each as it was
harvested (its own attention sinks in) and with the injected share: the last 10% of its
sequences held out, their ordinary states (``outlier_mask``) read, ``bae_config(d, 2 d)``
(normalised the same way).
Every change is against the run of the same source and seed trained without any extreme state
(no share injected, the rule on).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from sae_lens_bae.activations import ActivationCache
from sae_lens_bae.evaluation import evaluate_sae
from sae_lens_bae.outliers import outlier_mask
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.reports import markdown_table, write_json, write_text
from sae_lens_bae.saes.bae_recipes import bae_config
from sae_lens_bae.saes.binary import DENSE_FREQUENCY, constant_bits
from sae_lens_bae.training.trainer import train_sae

D, STRUCTURE, OFFSET, WIDTH, BATCH = 32, 12, 5.0, 64, 512
POLICIES = {"drop": 10.0, "keep": None}
NORMALISATION = "expected_average_only_in"  # the default BAE reads states as given


def synthetic_states(n: int, seed: int) -> torch.Tensor:
    """``n`` states: a standard Gaussian in a random ``STRUCTURE``-dimensional subspace of ``D``
    dimensions, offset by ``OFFSET`` on every coordinate."""
    generator = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(D, STRUCTURE, generator=generator))[0].T
    return torch.randn(n, STRUCTURE, generator=generator) @ basis + OFFSET


def inject(states: torch.Tensor, share: float, factor: float, seed: int) -> torch.Tensor:
    """``states`` with ``round(share * n)`` of them (at least one) put at ``factor`` times the
    median norm, their directions kept."""
    n = states.shape[0]
    generator = torch.Generator().manual_seed(seed + 1)
    rows = torch.randperm(n, generator=generator)[: max(1, round(share * n))]
    norms = states.norm(dim=-1)
    out = states.clone()
    out[rows] = states[rows] / norms[rows, None] * factor * norms.median()
    return out


def sources(args: argparse.Namespace) -> dict[str, Any]:
    """Each source by name: seed -> (training states, held-out ordinary states)."""
    if args.cache is None:

        def synthetic(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
            states = synthetic_states(args.n + args.n // 4, seed)
            return states[: args.n], states[args.n :]

        return {"synthetic": synthetic}
    cache = ActivationCache.load(args.cache)
    per_seq = cache.token_positions().shape[0] // cache.meta["n_sequences"]
    n_train = per_seq * (cache.meta["n_sequences"] - cache.meta["n_sequences"] // 10)
    out = {}
    for hook in args.hooks or cache.hooks:
        states = cache.activations(hook)
        held = states[n_train:]
        out[hook] = lambda _seed, s=states, h=held: (s[:n_train], h[outlier_mask(h)])
    return out


def read(sae: Any, held_out: torch.Tensor) -> dict[str, float]:
    """Explained variance and the constant and dense fractions of the code on ``held_out``."""
    scores = evaluate_sae(sae, held_out)
    rates, n = scores["firing_rates"], scores["n_samples"]
    rare = torch.minimum(rates, 1 - rates)
    return {
        "explained_variance": float(scores["explained_variance"]),
        "constant_fraction": float(constant_bits(rates * n, n).float().mean()),
        "dense_fraction": float((rare > DENSE_FREQUENCY).float().mean()),
    }


def cell_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (seed, share, factor, policy) cell, the clean set of each seed first (share 0)."""
    grid = [(0.0, 1.0)] + [(q, f) for q in args.shares for f in args.factors]
    cells = [(name, s, q, f) for name in sources(args) for s in args.seeds for q, f in grid]
    rows, read_states = [], sources(args)
    for name, seed, share, factor in tqdm(cells, desc="Outlier cells", unit="cell"):
        train, held_out = read_states[name](seed)
        d = train.shape[1]
        if share > 0:
            train = inject(train, share, factor, seed)
        for policy, ratio in POLICIES.items():
            start = time.perf_counter()
            run = train_sae(
                train,
                bae_config(
                    d,
                    WIDTH if name == "synthetic" else 2 * d,
                    normalize_activations=NORMALISATION,
                ),
                training_samples=args.steps * BATCH,
                batch_size=BATCH,
                seed=seed,
                device=args.device,
                outlier_norm_ratio=ratio,
            )
            rows.append(
                {
                    "source": name,
                    "seed": seed,
                    "share": share,
                    "factor": factor,
                    "injected": max(1, round(share * len(train))) if share > 0 else 0,
                    "policy": policy,
                    "set_aside": run.outliers_dropped,
                    **read(run.sae, held_out),
                    "seconds": time.perf_counter() - start,
                }
            )
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (source, share, factor, policy): the seeds' mean of each reading and of its
    change from the run of the same source and seed without any extreme state (no share
    injected, the rule on)."""
    clean = {(r["source"], r["seed"]): r for r in rows if r["share"] == 0 and r["policy"] == "drop"}
    groups: dict[tuple[str, float, float, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["source"], r["share"], r["factor"], r["policy"]), []).append(r)
    table = []
    for (source, share, factor, policy), members in groups.items():
        mean = lambda key, ms=members: float(np.mean([m[key] for m in ms]))  # noqa: E731
        change = lambda key, ms=members: float(  # noqa: E731
            np.mean([m[key] - clean[(m["source"], m["seed"])][key] for m in ms])
        )
        table.append(
            {
                "source": source,
                "share": share,
                "factor": factor,
                "policy": policy,
                "seeds": len(members),
                "injected": members[0]["injected"],
                "set_aside": mean("set_aside"),
                "explained_variance": mean("explained_variance"),
                "ev_change": change("explained_variance"),
                "ev_per_seed": [m["explained_variance"] for m in members],
                "constant_fraction": mean("constant_fraction"),
                "constant_change": change("constant_fraction"),
                "dense_fraction": mean("dense_fraction"),
            }
        )
    return table


COLUMNS = [
    ("source", lambda r: r["source"]),
    ("share", lambda r: "clean" if r["share"] == 0 else f"{100 * r['share']:g}%"),
    ("x median norm", lambda r: "" if r["share"] == 0 else f"{r['factor']:g}"),
    ("policy", lambda r: r["policy"]),
    ("injected", lambda r: str(r["injected"])),
    ("set aside", lambda r: f"{r['set_aside']:g}"),
    ("held-out EV", lambda r: f"{r['explained_variance']:.3f}"),
    ("EV change", lambda r: f"{r['ev_change']:+.3f}"),
    ("EV per seed", lambda r: " / ".join(f"{v:.3f}" for v in r["ev_per_seed"])),
    ("constant bits", lambda r: f"{100 * r['constant_fraction']:.1f}%"),
    ("constant change (pp)", lambda r: f"{100 * r['constant_change']:+.1f}"),
    ("dense bits", lambda r: f"{100 * r['dense_fraction']:.1f}%"),
]


def plot(table: list[dict[str, Any]], path: Path) -> Path:
    """Held-out EV change against the outliers' norm, a line per share and policy."""
    fig, ax = subplots(figsize=(6.0, 3.6))
    styles = {"drop": "-", "keep": "--"}
    lines = sorted({(r["source"], r["share"]) for r in table if r["share"] > 0})
    for source, share in lines:
        for policy, style in styles.items():
            rows = sorted(
                (
                    r
                    for r in table
                    if (r["source"], r["share"], r["policy"]) == (source, share, policy)
                ),
                key=lambda r: r["factor"],
            )
            ax.plot(
                [r["factor"] for r in rows],
                [r["ev_change"] for r in rows],
                style,
                marker="o",
                label=f"{source}: {100 * share:g}% outliers, {policy}",
            )
    ax.set_xscale("log")
    ax.set_xlabel("outliers' norm / median norm")
    ax.set_ylabel("held-out EV change (ordinary states)")
    ax.axhline(0.0, color="gray", linewidth=0.5)
    ax.legend(fontsize=6)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--shares", type=float, nargs="+", default=[0.0001, 0.001, 0.01])
    parser.add_argument("--factors", type=float, nargs="+", default=[10.0, 30.0, 100.0])
    parser.add_argument("--n", type=int, default=40_000, help="training states")
    parser.add_argument("--steps", type=int, default=400, help="training steps of 512 states")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", type=Path, help="an activation cache to read instead")
    parser.add_argument("--hooks", nargs="+", help="the cache's hooks to read (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not all(0 < s < 1 for s in args.shares):
        parser.error(f"--shares must be fractions in (0, 1), got {args.shares}")
    if not all(f > 0 for f in args.factors):
        parser.error(f"--factors must be positive, got {args.factors}")
    if args.n < 4 * BATCH or args.steps < 1:
        parser.error(f"give --n of at least {4 * BATCH} states and --steps of at least 1")
    if args.cache is not None:
        try:
            hooks = ActivationCache.load(args.cache).hooks
        except (FileNotFoundError, ValueError) as error:
            parser.error(str(error))
        if not set(args.hooks or []) <= set(hooks):
            parser.error(f"--hooks must be among the cache's hooks {hooks}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = cell_rows(args)
    table = summarise(rows)
    report = {
        "info": {
            "d": D, "structure": STRUCTURE, "offset": OFFSET, "d_sae": WIDTH, "batch": BATCH,
            "n": args.n, "cache": str(args.cache), "steps": args.steps, "seeds": args.seeds,
            "device": args.device, "normalize_activations": NORMALISATION,
            "torch": torch.__version__, "machine": platform.platform(),
        },
        "runs": rows,
        "table": table,
    }  # fmt: skip
    write_json(args.out / "outliers.json", report)
    write_text(args.out / "outliers.md", markdown_table(table, COLUMNS))
    plot(table, args.out / "outliers.png")
    return report


if __name__ == "__main__":
    main()
