"""The rules of a fair BAE-vs-SAE comparison, as functions of result rows (one row per model,
seed and split: ``family``, ``setting``, ``seed``, ``split``, ``lr`` and the metrics).

Settings are chosen on ``validation`` rows only and then frozen: the ``test`` and ``ood`` rows of
the chosen settings are what the report reads, once. A family beats another on a metric only
where a bootstrap over sequences and seeds says so, on at least three points
(``frontier_verdict``; the rules are pre-registered in docs/research/protocol-v2.md)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "LADDER_RATIO",
    "LEVEL",
    "MIN_POINTS",
    "SPLITS",
    "Point",
    "bracket_learning_rate",
    "choose_on_validation",
    "extend_ladders",
    "ladder_shortfalls",
    "frontier",
    "frontier_verdict",
    "ladder",
    "rows_of_choice",
    "seed_mean_and_spread",
    "value",
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


class Point(NamedTuple):
    """One setting of one family on one split: x and y as means over seeds with their spreads
    (sample standard deviations), and ``xs``/``ys``: the bootstrap replicates of the means
    (sequences and seeds resampled; empty without replicates)."""

    setting: float
    x: float
    x_spread: float
    y: float
    y_spread: float
    seeds: int
    xs: tuple[float, ...] = ()
    ys: tuple[float, ...] = ()


Metric = Callable[[Row], Any]


def value(row: Row, key: str, replicate: int | None = None) -> Any:
    """``row``'s metric ``key`` (dotted for nested: ``activated_by_magnitude.support``), or its
    bootstrap replicate number ``replicate`` (``row["replicates"][key]``); None if absent."""
    if replicate is not None:
        held = (row.get("replicates") or {}).get(key)
        return None if held is None else held[replicate]
    found: Any = row
    for part in key.split("."):
        found = found.get(part) if isinstance(found, Mapping) else None
    return found


def frontier(
    rows: Iterable[Row], family: str, split: str, x: str, y: str, seed: int = 0
) -> list[Point]:
    """A family's points on ``split``, one per setting (every seed of it; rows whose x or y is
    None left out), sorted by x. With replicates in the rows, each point's replicate b is the
    mean over a resample (with replacement, seeded) of its seeds of their replicate b: the
    bootstrap over sequences (shared by every model of the split) and seeds."""
    by_setting: dict[float, list[Row]] = {}
    for row in rows:
        mine = row["family"] == family and row["split"] == split
        if mine and value(row, x) is not None and value(row, y) is not None:
            by_setting.setdefault(row["setting"], []).append(row)
    points = []
    for setting, held in by_setting.items():
        x_mean, x_spread = seed_mean_and_spread([value(r, x) for r in held])
        y_mean, y_spread = seed_mean_and_spread([value(r, y) for r in held])
        xs, ys = _seed_bootstrap(held, x, seed, setting), _seed_bootstrap(held, y, seed, setting)
        points.append(Point(setting, x_mean, x_spread, y_mean, y_spread, len(held), xs, ys))
    return sorted(points, key=lambda point: point.x)


def _seed_bootstrap(rows: Sequence[Row], key: str, seed: int, setting: float) -> tuple[float, ...]:
    replicates = [(r.get("replicates") or {}).get(key) for r in rows]
    if any(r is None for r in replicates):
        return ()
    table = np.asarray(replicates, dtype=float)  # [seeds, replicates]
    rng = np.random.default_rng([seed, abs(hash(round(setting, 9))) % 2**32])
    draws = rng.integers(0, table.shape[0], size=(table.shape[1], table.shape[0]))
    return tuple(table[draws, np.arange(table.shape[1])[:, None]].mean(1).tolist())


MIN_POINTS = 3
"""A verdict is decided on at least this many points (both families') in the x overlap."""
LEVEL = 0.95
"""The bootstrap interval of the mean gap that must exclude 0."""


def frontier_verdict(
    ours: Sequence[Point], theirs: Sequence[Point], higher_is_better: bool = True
) -> dict[str, Any]:
    """The pre-registered rule (docs/research/protocol-v2.md) on one split. The overlap is the
    x interval both frontiers span; every point of either family inside it is read against the
    other frontier at its x (linear between the other's points): the gap is ours minus theirs
    (the other way for a lower-is-better y). Fewer than ``MIN_POINTS`` such points: ``too few
    points`` (none: ``no overlap``). Otherwise the mean gap over them, and its ``LEVEL``
    percentile interval over the bootstrap replicates (each replicate recomputes every point's
    x and y, so x's uncertainty moves the reading too): ``better`` when the interval lies above
    0, ``worse`` below, ``no difference`` when it holds 0."""
    found: dict[str, Any] = {"points_in_overlap": 0, "gap": None, "interval": None}
    if not ours or not theirs:
        return {**found, "verdict": "no overlap"}
    low = max(ours[0].x, theirs[0].x)
    high = min(ours[-1].x, theirs[-1].x)
    inside = [[i for i, p in enumerate(side) if low <= p.x <= high] for side in (ours, theirs)]
    found["points_in_overlap"] = n = len(inside[0]) + len(inside[1])
    if low > high or n == 0:
        return {**found, "verdict": "no overlap"}
    if n < MIN_POINTS:
        return {**found, "verdict": "too few points"}
    sign = 1.0 if higher_is_better else -1.0
    found["gap"] = sign * _mean_gap(ours, theirs, inside, lambda p: p.x, lambda p: p.y)
    replicates = min((len(p.xs) for p in (*ours, *theirs)), default=0)
    if replicates == 0:
        return {**found, "verdict": "no difference"}
    gaps = [
        sign * _mean_gap(ours, theirs, inside, lambda p, b=b: p.xs[b], lambda p, b=b: p.ys[b])
        for b in range(replicates)
    ]
    tail = 100 * (1 - LEVEL) / 2
    interval = [float(np.percentile(gaps, tail)), float(np.percentile(gaps, 100 - tail))]
    found["interval"] = interval
    verdict = "better" if interval[0] > 0 else "worse" if interval[1] < 0 else "no difference"
    return {**found, "verdict": verdict}


def _mean_gap(
    ours: Sequence[Point],
    theirs: Sequence[Point],
    inside: list[list[int]],
    x: Callable[[Point], float],
    y: Callable[[Point], float],
) -> float:
    """Mean over the points in the overlap of (our y - their y) at the same x."""

    def read(side: Sequence[Point]) -> Callable[[float], float]:
        order = sorted(side, key=x)
        return lambda at: float(np.interp(at, [x(p) for p in order], [y(p) for p in order]))

    at_theirs, at_ours = read(theirs), read(ours)
    gaps = [y(ours[i]) - at_theirs(x(ours[i])) for i in inside[0]]
    gaps += [at_ours(x(theirs[i])) - y(theirs[i]) for i in inside[1]]
    return float(np.mean(gaps))


def bracket_learning_rate(
    candidates: Sequence[float],
    score: Callable[[float], float],
    max_extensions: int = 4,
) -> tuple[float, list[float]]:
    """The learning rate with the lowest ``score`` (a validation objective, lower is better;
    NaN counts as the worst), over ``candidates`` (log-spaced, at least 2) extended while the
    best lies on an edge: the next rate one ratio beyond that edge is tried, at most
    ``max_extensions`` times. Returns the chosen rate and every rate tried, sorted."""
    rates = sorted(candidates)
    if len(rates) < 2:
        raise ValueError(f"bracketing needs at least 2 learning rates, got {list(candidates)}")
    ratio = rates[1] / rates[0]
    scores = {lr: _finite(score(lr)) for lr in rates}
    for _ in range(max_extensions):
        best = min(scores, key=lambda lr: (scores[lr], lr))
        tried = sorted(scores)
        if tried[0] < best < tried[-1]:
            break
        beyond = best / ratio if best == tried[0] else best * ratio
        scores[beyond] = _finite(score(beyond))
    best = min(scores, key=lambda lr: (scores[lr], lr))
    return best, sorted(scores)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.inf


LADDER_RATIO = math.sqrt(2)
"""One rung of a settings ladder: twice the setting every two rungs."""


def ladder(start: float, rungs: int, whole: bool = False) -> list[float]:
    """``rungs`` settings from ``start`` up by ``LADDER_RATIO``, rounded to whole numbers for
    TopK's k."""
    return sorted({_rung(start * LADDER_RATIO**i, whole) for i in range(rungs)})


def _rung(value: float, whole: bool) -> float:
    return float(round(value)) if whole else float(f"{value:.4g}")


def ladder_shortfalls(
    rows: Iterable[Row],
    families: Sequence[str],
    axes: Sequence[str] = ("kl", "l0"),
    split: str = "validation",
) -> list[dict[str, Any]]:
    """Every (family, other family, axis) where fewer than ``MIN_POINTS`` of the family's points
    (seed means on ``split``) lie inside the other's range: ``points`` inside, and how many
    miss ``below`` and ``above`` it. Empty: every family has enough points in every range."""
    rows = list(rows)
    short = []
    for axis in axes:
        at = {f: _setting_means(rows, f, split, axis) for f in families}
        for ours, theirs in ((f, g) for f in families for g in families if f != g):
            if not at[ours] or not at[theirs]:
                continue
            low, high = min(at[theirs].values()), max(at[theirs].values())
            xs = list(at[ours].values())
            inside = sum(low <= x <= high for x in xs)
            if inside < MIN_POINTS:
                below, above = sum(x < low for x in xs), sum(x > high for x in xs)
                short.append(
                    {
                        "family": ours,
                        "against": theirs,
                        "axis": axis,
                        "points": inside,
                        "below": below,
                        "above": above,
                    }
                )
    return short


def extend_ladders(
    rows: Iterable[Row],
    ladders: Mapping[str, Sequence[float]],
    axes: Sequence[str] = ("kl", "l0"),
    whole: Sequence[str] = (),
    split: str = "validation",
) -> dict[str, list[float]]:
    """The rungs that answer ``ladder_shortfalls``. Where F's points miss G's range on one side
    only, F climbs one rung beyond the end of its ladder whose x lies nearer that range (both
    ends when F has one setting, whose direction is unknown); where they miss on both sides, G's
    range is narrower than F's rungs and G gains a rung at both ends; where none miss, F has too
    few settings and gains a rung at both ends. Families in ``whole`` take whole-number rungs
    (TopK's k); a rung already on the ladder is never added. Empty: nothing to add."""
    rows = list(rows)
    added: dict[str, set[float]] = {f: set() for f in ladders}

    def climb(family: str, down: bool, up: bool) -> None:
        ladder = sorted(ladders[family])
        steps = [(ladder[0], 1 / LADDER_RATIO)] * down + [(ladder[-1], LADDER_RATIO)] * up
        for end, step in steps:
            rung = _rung(end * step, family in whole)
            if rung > 0 and rung not in ladder:
                added[family].add(rung)

    for gap in ladder_shortfalls(rows, list(ladders), axes, split):
        ours, theirs = gap["family"], gap["against"]
        if gap["below"] and gap["above"]:  # G's range inside F's rungs: widen G
            climb(theirs, down=True, up=True)
            continue
        ladder = sorted(ladders[ours])
        if not (gap["below"] or gap["above"]) or len(ladder) == 1:
            climb(ours, down=True, up=True)
            continue
        xs = _setting_means(rows, ours, split, gap["axis"])
        first, last = xs.get(ladder[0]), xs.get(ladder[-1])
        if first is None or last is None:
            continue
        up = (last > first) == (gap["below"] > 0)  # the end whose x lies nearer G's range
        climb(ours, down=not up, up=up)
    return {f: sorted(rungs) for f, rungs in added.items() if rungs}


def _setting_means(rows: Sequence[Row], family: str, split: str, key: str) -> dict[float, float]:
    """Per setting of ``family`` on ``split``, its frontier point's mean over seeds of ``key``."""
    return {point.setting: point.x for point in frontier(rows, family, split, key, key)}
