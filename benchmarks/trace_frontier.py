"""One cell of the position trace (a layer's hidden states at one token position) read by BAEs of
the tracing recipe at several strengths of the entropy and covariance terms: how many bits a code
spends at each reconstruction error, against the cell's ceiling log2(distinct states). The probe
behind docs/research/llm-traces.md's reading of why the LLM traces' cells are not reliable: a cell
is reliable only if some strength gives both errors <= 20% and an estimate under the ceiling.

    python benchmarks/trace_frontier.py --dataset ../shared/data/text/wikitext-2 --layer 15 \\
        --position 8 --n-sequences 16384 --multipliers 1,0.25,0.0625,0 --out DIR

A multiplier m trains with a_e and a_c at m times the recipe's (0: the ablation without them,
the most reconstruction the BAE's width allows).

Beside the BAEs, the reference a reader needs to judge them: codes with one active bit of K
(k-means: Lloyd's iterations from a k-means++ start), for K in ``--quantizer-sizes``. Such a
code's cost in the estimator's own currency is bounded whatever the set: K code bits firing on
fractions p_k (summing to 1) sum to H(p) + sum_k (1 - p_k) log2(1 / (1 - p_k)) <= log2 K +
log2 e bits. It is a reference, not a bound (a code with several active bits may do better
at the same bits): if the K whose sum stays under the ceiling leave far more than 20% error,
a reliable cell asks for a code much better than a quantizer at the same rate. Each quantizer row
reports its error (total and typical state's, as the BAE rows measure them, on all states), the
per-bit sum a BAE estimate would read from its one-hot code (``bits``) and the code's joint
entropy (``assignment_bits``). ``info.components_for_80pct`` is how many principal components
keep 80% of the variance (the most error a reliable cell may leave).

And between the two, what a BAE's own encoder (one halfspace per bit) makes of the same
centroids: for each K and each ``--halfspace-margins`` value a, a ``saes.BAE`` whose bit k
fires iff (x - mean) . u_k > a |u_k|^2 (u_k = centroid k - mean; a = 1/2: nearer the centroid
than the mean), with the least-squares decoder of those codes, read by ``code_entropy``
untrained. A quantizer's cell is an intersection of halfspaces; these rows say how far one
halfspace per bit gets to it (``l0``: bits firing per state; ``silent``: the share of
states that fire none and decode to the mean).

Writes ``DIR/trace_frontier.json``, ``.md`` and ``.png`` (bits against relative error, the
ceiling and the 20% line drawn) after each row, so an interrupted run keeps its rows.
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from sae_lens_bae.activations import gather_states
from sae_lens_bae.data import default_corpus, document_windows, iter_texts
from sae_lens_bae.entropy import TRACING_RECIPE, code_entropy, estimate_entropies
from sae_lens_bae.entropy.estimate import DEFAULT_MAX_RELATIVE_ERROR
from sae_lens_bae.entropy.reference import quantizer_reading
from sae_lens_bae.entropy.tables import CELL_COLUMNS
from sae_lens_bae.models import load_model
from sae_lens_bae.plots import save_figure, subplots
from sae_lens_bae.reports import cell, markdown_table, write_json, write_text
from sae_lens_bae.saes.bae import BAE, BAEConfig

COLUMNS = [
    ("multiplier", lambda row: f"{row['multiplier']:g}"),
    *CELL_COLUMNS,
    ("seconds", lambda row: f"{row['seconds']:.0f}"),
]
TRUST_COLUMNS = [
    ("relative error", lambda row: cell(row["relative_error"], ".4f")),
    ("typical error", lambda row: cell(row["typical_relative_error"], ".4f")),
    ("reliable", lambda row: "yes" if row["reliable"] else "NO"),
]
QUANTIZER_COLUMNS = [
    ("K (code bits, one active)", lambda row: str(row["k"])),
    ("bits (per-bit sum)", lambda row: f"{row['bits']:.2f}"),
    ("assignment bits", lambda row: f"{row['assignment_bits']:.2f}"),
    ("excess", lambda row: cell(row["excess_bits"], ".2f")),
    *TRUST_COLUMNS,
    ("iterations", lambda row: str(row["iterations"])),
    ("seconds", lambda row: f"{row['seconds']:.0f}"),
]
HALFSPACE_COLUMNS = [
    ("K", lambda row: str(row["k"])),
    ("margin a", lambda row: f"{row['margin']:g}"),
    ("bits", lambda row: f"{row['bits']:.2f}"),
    *TRUST_COLUMNS,
    ("l0", lambda row: f"{row['l0']:.2f}"),
    ("silent", lambda row: f"{row['silent']:.3f}"),
]


def quantizer_row(
    x: Float[Tensor, "n d"], k: int, iterations: int = 50, seed: int = 0
) -> tuple[dict[str, Any], Float[Tensor, "k d"]]:
    """``entropy.reference.quantizer_reading`` of a one-active-bit code of ``k`` bits
    (k-means) on ``x`` as a row (its errors as the BAE rows measure them, the per-bit sum of
    its one-hot code as ``bits``, its joint entropy as ``assignment_bits``), with the seconds it
    took; and the centroids."""
    start = time.perf_counter()
    reading, centroids = quantizer_reading(x, k, iterations, seed)
    return {**reading.summary(), "seconds": time.perf_counter() - start}, centroids


def halfspace_bae(
    x: Float[Tensor, "n d"], centroids: Float[Tensor, "k d"], margin: float, ridge: float = 1e-3
) -> tuple[BAE, Float[Tensor, "n k"]]:
    """A BAE whose bit k fires iff (x - mean) . u_k > margin |u_k|^2, u_k = centroid k - mean
    of ``x``, decoding with the least-squares decoder of its codes on ``x`` (ridge ``ridge``
    on the codes' Gram matrix); returns it and those codes."""
    mean = x.float().mean(0)
    u = centroids.float() - mean
    bae = BAE(BAEConfig(d_in=x.shape[1], d_sae=centroids.shape[0], device=str(x.device)))
    with torch.no_grad():
        bae.W_enc.copy_(u.T)
        bae.b_enc.copy_(-(u @ mean) - margin * u.pow(2).sum(-1))
        codes = bae.encode(x.float()).double()
        gram = codes.T @ codes + ridge * torch.eye(codes.shape[1], dtype=codes.dtype,
                                                   device=codes.device)  # fmt: skip
        bae.W_dec.copy_(torch.linalg.solve(gram, codes.T @ (x.double() - mean.double())))
        bae.b_dec.copy_(mean)
    return bae, codes


def halfspace_row(
    x: Float[Tensor, "n d"], centroids: Float[Tensor, "k d"], margin: float
) -> dict[str, Any]:
    """``code_entropy`` of ``halfspace_bae`` on ``x``, with its code bits firing per state."""
    bae, codes = halfspace_bae(x, centroids, margin)
    estimate = code_entropy(bae, x)
    active = codes.sum(-1)
    return {
        "k": centroids.shape[0],
        "margin": margin,
        "bits": estimate.bits,
        "ceiling_bits": estimate.ceiling_bits,
        "relative_error": estimate.relative_error,
        "typical_relative_error": estimate.typical_relative_error,
        "reliable": estimate.reliable,
        "l0": float(active.float().mean()),
        "silent": float((active == 0).float().mean()),
    }


def components_for(x: Float[Tensor, "n d"], kept: float) -> int:
    """How many principal components of ``x`` keep at least the fraction ``kept`` of its
    variance."""
    data = x.double() - x.double().mean(0)
    variances = torch.linalg.eigvalsh(data.T @ data).flip(0).clamp_min(0)
    shares = variances.cumsum(0) / variances.sum()
    return int((shares < kept - 1e-12).sum()) + 1


def default_quantizer_sizes(n_states: int, width: int) -> list[int]:
    """Powers of 4 from 16 while under half the states, and the BAE's width (if under the
    number of states): the range from a coarse code to one near memorising the set."""
    sizes = {4**i for i in range(2, 32) if 4**i < n_states / 2}
    return sorted(sizes | ({width} if width < n_states else set()))


def _write(out: Path, report: dict[str, Any], title: str) -> None:
    write_json(out / "trace_frontier.json", report)
    text = f"# {title}\n\n"
    if report["quantizers"]:
        text += ("Reference: codes with one active bit of K (k-means), "
                 f"{report['info']['components_for_80pct']} principal components keep 80% of "
                 "the variance.\n\n" + markdown_table(report["quantizers"], QUANTIZER_COLUMNS)
                 + "\n\n")  # fmt: skip
    if report["halfspace"]:
        text += ("BAEs built from those centroids (one halfspace per bit), untrained:\n\n"
                 + markdown_table(report["halfspace"], HALFSPACE_COLUMNS) + "\n\n")  # fmt: skip
    if report["rows"]:
        text += "BAEs of the tracing recipe:\n\n" + markdown_table(report["rows"], COLUMNS)
    write_text(out / "trace_frontier.md", text)
    fig, ax = subplots(figsize=(6.5, 4.5))
    ceiling = report["info"]["ceiling_bits"]
    series = ((report["rows"], "BAE trained (a_e, a_c x multiplier)", "o"),
              (report["quantizers"], "k-means, one active of K", "s"),
              (report["halfspace"], "BAE from k-means centroids (margin a)", "^"))  # fmt: skip
    for rows, label, marker in series:
        rows = [r for r in rows if r["relative_error"] is not None]
        if not rows:
            continue
        ax.plot([r["relative_error"] for r in rows], [r["bits"] for r in rows], marker=marker,
                linestyle="", label=label)  # fmt: skip
        for r in rows:
            if "multiplier" in r:
                name = f"x{r['multiplier']:g}"
            else:
                name = f"K={r['k']}" + (f", a={r['margin']:g}" if "margin" in r else "")
            ax.annotate(name, (r["relative_error"], r["bits"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.axhline(ceiling, color="grey", linestyle="--", label=f"ceiling {ceiling:.2f} bits")
    ax.axvline(DEFAULT_MAX_RELATIVE_ERROR, color="grey", linestyle=":", label="20% error")
    ax.set_yscale("log")
    ax.set_xlabel("relative reconstruction error (SSE / SST)")
    ax.set_ylabel("bits (sum of per-bit entropies)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, out / "trace_frontier.png")


def _numbers(
    parser: argparse.ArgumentParser, flag: str, text: str, kind: type[int] | type[float]
) -> list[Any]:
    """A comma-separated list of ``kind`` ('' for none), or one line and exit 2."""
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        noun = "whole numbers" if kind is int else "numbers"
        parser.error(f"{flag} takes {noun} separated by commas, got {text}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default=None, help="default: the embedded corpus")
    parser.add_argument("--text-column", default=None)
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--hook", default="hook_resid_post")
    parser.add_argument("--position", type=int, default=8, help="tokens after the BOS")
    parser.add_argument("--n-sequences", type=int, default=16384)
    parser.add_argument("--multipliers", default="1,0.25,0.0625,0", help="'' for no BAE rows")
    parser.add_argument(
        "--quantizer-sizes",
        default=None,
        help="K of the k-means references, separated by commas ('' for none); default: powers"
        " of 4 from 16 while under half the states, and the BAE's width",
    )
    parser.add_argument("--quantizer-iterations", type=int, default=50)
    parser.add_argument(
        "--halfspace-margins",
        default="0.5,0.85,1",
        help="margins a of the BAEs built from each K's centroids ('' for none)",
    )
    parser.add_argument("--expansion", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per forward pass")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("runs/trace-frontier"))
    args = parser.parse_args(argv)
    multipliers = _numbers(parser, "--multipliers", args.multipliers, float)
    if any(m < 0 for m in multipliers):
        parser.error(f"--multipliers must be >= 0, got {args.multipliers}")
    sizes = None
    if args.quantizer_sizes is not None:
        sizes = _numbers(parser, "--quantizer-sizes", args.quantizer_sizes, int)
        if any(k < 1 for k in sizes):
            parser.error(f"--quantizer-sizes must be >= 1, got {args.quantizer_sizes}")
    margins = _numbers(parser, "--halfspace-margins", args.halfspace_margins, float)
    args.out.mkdir(parents=True, exist_ok=True)

    model = load_model(args.model, device=args.device)
    source = args.dataset if args.dataset is not None else default_corpus()
    tokens = document_windows(iter_texts(source, text_column=args.text_column), model.tokenizer,
                              args.position, max_sequences=args.n_sequences)  # fmt: skip
    hook = f"blocks.{args.layer}.{args.hook}"
    index = torch.full((tokens.shape[0], 1), args.position)
    states, _ = gather_states(model, tokens, [hook], index, batch_size=args.batch_size)
    x = states[hook][:, 0]
    width = args.expansion * x.shape[1]
    sizes = default_quantizer_sizes(x.shape[0], width) if sizes is None else sizes
    if any(k > x.shape[0] for k in sizes):
        parser.error(f"--quantizer-sizes: K must be at most the {x.shape[0]} states, got "
                     f"{args.quantizer_sizes}")  # fmt: skip
    ceiling = math.log2(torch.unique(x, dim=0).shape[0])
    report: dict[str, Any] = {
        "info": {"model": args.model, "dataset": str(source), "hook": hook,
                 "position": args.position, "n_states": int(x.shape[0]),
                 "expansion": args.expansion, "steps": args.steps, "seed": args.seed,
                 "ceiling_bits": ceiling,
                 "components_for_80pct": components_for(x, 1 - DEFAULT_MAX_RELATIVE_ERROR),
                 "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "machine": platform.processor() or platform.machine()},
        "quantizers": [],
        "halfspace": [],
        "rows": [],
    }  # fmt: skip
    title = (f"{args.model} {hook}, position {args.position}, {x.shape[0]} states, "
             f"{args.expansion}x")  # fmt: skip
    states = x.to(args.device)
    for k in sizes:
        row, centroids = quantizer_row(states, k, args.quantizer_iterations, args.seed)
        report["quantizers"].append(row)
        report["halfspace"] += [halfspace_row(states, centroids, a) for a in margins]
        _write(args.out, report, title)
    for m in multipliers:
        loss = TRACING_RECIPE.loss
        recipe = TRACING_RECIPE.changed(
            seeds=1,
            expansion=args.expansion,
            steps=args.steps,
            entropy_coefficient_2048=loss.entropy_coefficient_2048 * m,
            covariance_coefficient_2048=loss.covariance_coefficient_2048 * m,
            objective=m > 0,
        )
        start = time.perf_counter()
        [estimate] = estimate_entropies([x], recipe, seeds=[args.seed], bootstrap=0,
                                        device=args.device)  # fmt: skip
        report["rows"].append({"multiplier": m, **estimate.summary(),
                               "seconds": time.perf_counter() - start})  # fmt: skip
        _write(args.out, report, title)
    print((args.out / "trace_frontier.md").read_text())
    return report


if __name__ == "__main__":
    main()
