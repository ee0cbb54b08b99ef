"""Configs that check their own fields: a field declares its range once (``ranged``), and
``check_ranges`` refuses a value outside it in one line naming the field, so the command line
(which builds the config) and the Python API refuse the same inputs before any work starts."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["check_ranges", "ranged"]


def ranged(
    default: Any, *, low: float | None = None, high: float | None = None, open_: bool = False
) -> Any:
    """A dataclass field with ``default`` whose value (when not None) must lie in [low, high]
    (``open_``: in (low, high)); NaN is never in a range."""
    return dataclasses.field(default=default, metadata={"range": (low, high, open_)})


def check_ranges(config: Any) -> None:
    """Raise ValueError on the first field of ``config`` outside its declared range."""
    for field in dataclasses.fields(config):
        if "range" not in field.metadata:
            continue
        value = getattr(config, field.name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{field.name} must be a number, got {value!r}")
        low, high, open_ = field.metadata["range"]
        below = low is not None and (value <= low if open_ else value < low)
        above = high is not None and (value >= high if open_ else value > high)
        if math.isnan(value) or below or above:
            raise ValueError(f"{field.name} must be {_describe(low, high, open_)}, got {value!r}")


def _describe(low: float | None, high: float | None, open_: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if open_ else '['}{low}, {high}{')' if open_ else ']'}"
    if low is not None:
        return f"{'above' if open_ else 'at least'} {low}"
    return f"{'below' if open_ else 'at most'} {high}"
