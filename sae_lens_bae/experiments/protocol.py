"""The rules of a fair BAE-vs-SAE comparison, as functions of result rows (one row per model,
seed and split: ``family``, ``setting``, ``seed``, ``split``, ``lr`` and the metrics).

Settings are chosen on ``validation`` rows only and then frozen: the ``test`` and ``ood`` rows of
the chosen settings are what the report reads, once. A family beats another on a metric only by
more than the seeds' spread."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["SPLITS", "beats", "choose_on_validation", "rows_of_choice", "seed_mean_and_spread"]

SPLITS = ("validation", "test", "ood")
"""Where every model is read: settings are chosen on the first, reported on the others."""

Row = Mapping[str, Any]


def choose_on_validation(
    rows: Iterable[Row], score: Callable[[Row], float], group: Sequence[str] = ("family",)
) -> dict[tuple[Any, ...], Row]:
    """Per ``group`` key, the validation row with the lowest ``score`` (ties: the first seen).
    Rows of any other split are never read, so changing test or OOD data cannot move a choice."""
    best: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        if row["split"] != "validation":
            continue
        key = tuple(row[name] for name in group)
        if key not in best or score(row) < score(best[key]):
            best[key] = row
    return best


def rows_of_choice(
    rows: Iterable[Row], chosen: Row, split: str, same: Sequence[str] = ("family", "setting", "lr")
) -> list[Row]:
    """The rows of ``split`` trained as ``chosen`` was (same family, setting and lr), every seed."""
    return [r for r in rows if r["split"] == split and all(r[k] == chosen[k] for k in same)]


def seed_mean_and_spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean over seeds and the spread the decision rule compares against: the sample standard
    deviation (0 for one seed, which decides nothing by itself)."""
    if not values:
        raise ValueError("no seeds to summarise")
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), spread


def beats(ours: Sequence[float], theirs: Sequence[float], higher_is_better: bool = True) -> bool:
    """The pre-registered rule: ``ours`` beats ``theirs`` (one value per seed each) when the gap
    of the means exceeds both spreads; with a single seed on either side nothing beats anything."""
    if len(ours) < 2 or len(theirs) < 2:
        return False
    (mean_a, spread_a), (mean_b, spread_b) = (
        seed_mean_and_spread(ours),
        seed_mean_and_spread(theirs),
    )
    gap = mean_a - mean_b if higher_is_better else mean_b - mean_a
    return gap > max(spread_a, spread_b)
