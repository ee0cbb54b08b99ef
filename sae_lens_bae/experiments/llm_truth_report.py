"""What ``bae bench llm-truth`` writes: ``llm-truth.json`` (its config and a list ``rows``),
``llm-truth.md`` (the table and the verdict) and ``llm-truth.png`` (reading against truth)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sae_lens_bae.plots import legend_marker, save_figure, subplots
from sae_lens_bae.reports import cell, markdown_table, write_json, write_text

__all__ = ["COLUMNS", "plot_truth", "truth_note", "write_outputs"]


def _yes(value: Any) -> str:
    return "-" if value is None else "yes" if value else "NO"


COLUMNS = [
    ("hook", lambda r: r["hook"]),
    ("position", lambda r: str(r["position"])),
    ("states", lambda r: str(r["n_states"])),
    ("distinct", lambda r: str(r["distinct"])),
    ("truth", lambda r: cell(r["truth_bits"], ".2f")),
    ("BAE bits", lambda r: cell(r["bits"], ".2f")),
    ("off", lambda r: cell(r["off_bits"], "+.2f")),
    ("joint code bits", lambda r: cell(r["joint_code_bits"], ".2f")),
    (
        "error (typical)",
        lambda r: (
            f"{cell(r['relative_error'], '.3f')} ({cell(r.get('typical_relative_error'), '.3f')})"
        ),
    ),
    ("reliable", lambda r: _yes(r["reliable"])),
    ("within tolerance", lambda r: _yes(r["within_tolerance"])),
    (
        "k-means bits (joint)",
        lambda r: (
            "-"
            if r.get("reference_bits") is None
            else f"{r['reference_bits']:.2f} ({r['reference_joint_bits']:.2f})"
        ),
    ),
]
"""The markdown table's columns: truth, the BAE's reading and trust, the reference."""


def truth_note(rows: Sequence[dict[str, Any]]) -> str:
    """The verdict: how many cells the BAE reads (reliable and within tolerance), how many
    reliable readings are off the truth (the rule's failures), and why each other cell is not
    reliable."""
    read = [r for r in rows if r["reliable"] and r["within_tolerance"]]
    wrong = [r for r in rows if r["wrong_but_reliable"]]
    lines = [
        f"{len(read)} of {len(rows)} cells read ({len(read) / len(rows):.0%}): reliable and "
        "within max(0.25 bit, 3%) of the truth. "
        f"{len(wrong)} reliable reading{'' if len(wrong) == 1 else 's'} off the truth by more.",
        "",
    ]
    for r in rows:
        if not r["reliable"]:
            why = "; ".join(r.get("reasons") or []) or "see the table"
            lines.append(f"- {r['hook']} @ {r['position']}, {r['n_states']} states: {why}")
    for r in wrong:
        lines.append(
            f"- RELIABLE BUT WRONG: {r['hook']} @ {r['position']}, {r['n_states']} states: "
            f"{r['bits']:.2f} bits, truth {r['truth_bits']:.2f}"
        )
    return "\n".join(lines) + "\n"


def plot_truth(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """The BAE's reading (filled: reliable) and the k-means reference's joint bits against the
    truth, the diagonal drawn."""
    fig, ax = subplots(figsize=(6, 5.5))
    truths = [r["truth_bits"] for r in rows]
    for r in rows:
        face = "tab:blue" if r["reliable"] else "none"
        ax.scatter(r["truth_bits"], r["bits"], s=40, edgecolors="tab:blue", facecolors=face)
        if r.get("reference_joint_bits") is not None:
            ax.scatter(
                r["truth_bits"],
                r["reference_joint_bits"],
                marker="s",
                s=30,
                edgecolors="tab:orange",
                facecolors="none",
            )
    top = max([*truths, *(r["bits"] for r in rows)]) * 1.05 + 0.5
    ax.plot([0, top], [0, top], color="grey", linestyle="--", linewidth=1)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("truth: plug-in entropy of the token prefixes (bits)")
    ax.set_ylabel("reading (bits)")
    ax.set_title(title, fontsize=9)
    ax.legend(
        handles=[
            legend_marker("BAE, reliable", "tab:blue"),
            legend_marker("BAE, not reliable (hollow)", "tab:blue"),
            legend_marker("k-means reference, joint bits", "tab:orange", "s"),
        ],
        fontsize=8,
        loc="upper left",
    )
    return save_figure(fig, path)


def write_outputs(summary: dict[str, Any], out: Path, model: str) -> None:
    """``llm-truth.json``, ``llm-truth.md`` and ``llm-truth.png`` in ``out``."""
    rows = summary["rows"]
    write_json(out / "llm-truth.json", summary)
    plot_truth(rows, out / "llm-truth.png", f"{model}: readings of states of known entropy")
    table = markdown_table(rows, COLUMNS)
    write_text(out / "llm-truth.md", table + "\n" + truth_note(rows))
