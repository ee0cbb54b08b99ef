"""The rules of a fair BAE-vs-SAE comparison, as functions of result rows (one row per model,
seed and split: ``family``, ``setting``, ``seed``, ``split``, ``lr`` and the metrics).

Settings are chosen on ``validation`` rows only and then frozen: the ``test`` and ``ood`` rows of
the chosen settings are what the report reads, once. A family beats another on a metric only by
more than the seeds' spread."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "SPLITS",
    "Point",
    "beats",
    "choose_on_validation",
    "frontier",
    "frontier_verdict",
    "rows_of_choice",
    "seed_mean_and_spread",
]

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


class Point(NamedTuple):
    """One setting of one family on one split: x and y as means over seeds, with their spreads."""

    setting: float
    x: float
    x_spread: float
    y: float
    y_spread: float
    seeds: int


def frontier(
    rows: Iterable[Row], family: str, split: str, x: Callable[[Row], Any], y: Callable[[Row], Any]
) -> list[Point]:
    """A family's points on ``split``, one per setting (every seed of it; rows whose x or y is
    None left out), sorted by x."""
    by_setting: dict[float, list[tuple[float, float]]] = {}
    for row in rows:
        if row["family"] == family and row["split"] == split:
            values = (x(row), y(row))
            if None not in values:
                by_setting.setdefault(row["setting"], []).append(values)
    points = []
    for setting, values in by_setting.items():
        x_mean, x_spread = seed_mean_and_spread([v[0] for v in values])
        y_mean, y_spread = seed_mean_and_spread([v[1] for v in values])
        points.append(Point(setting, x_mean, x_spread, y_mean, y_spread, len(values)))
    return sorted(points, key=lambda point: point.x)


def _at(points: Sequence[Point], x: float) -> tuple[float, float] | None:
    """The frontier's y and spread at ``x``, linear between the two points around it (the larger
    spread of the two); None outside the points' x range."""
    for left, right in zip(points, points[1:], strict=False):
        if left.x <= x <= right.x:
            t = 0.0 if right.x == left.x else (x - left.x) / (right.x - left.x)
            return left.y + t * (right.y - left.y), max(left.y_spread, right.y_spread)
    if len(points) == 1 and points[0].x == x:
        return points[0].y, points[0].y_spread
    return None


def frontier_verdict(
    ours: Sequence[Point], theirs: Sequence[Point], higher_is_better: bool = True
) -> str:
    """The pre-registered rule on one split: where the x ranges overlap, ``ours`` is ``better``
    when at every one of its points in the overlap its y beats the other frontier's (read at the
    same x) by more than both spreads, ``worse`` when the other way round at every point,
    ``no difference`` otherwise; ``no overlap`` when no point of ours lies in their x range.
    Points with one seed decide nothing (``one seed``)."""
    if any(p.seeds < 2 for p in (*ours, *theirs)):
        return "one seed"
    gaps = []
    for point in ours:
        read = _at(theirs, point.x)
        if read is not None:
            gap = point.y - read[0] if higher_is_better else read[0] - point.y
            gaps.append((gap, max(point.y_spread, read[1])))
    if not gaps:
        return "no overlap"
    if all(gap > spread for gap, spread in gaps):
        return "better"
    if all(-gap > spread for gap, spread in gaps):
        return "worse"
    return "no difference"
