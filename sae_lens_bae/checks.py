"""Configs that check their own fields: a field declares its range once (``ranged``), and
``check_ranges`` refuses a value outside it in one line naming the field, so the command line
(which builds the config) and the Python API refuse the same inputs before any work starts."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Literal

__all__ = ["check_ranges", "existing", "is_count", "ranged", "refuse_fields"]


def ranged(
    default: Any,
    *,
    low: float | None = None,
    above: float | None = None,
    high: float | None = None,
    below: float | None = None,
) -> Any:
    """A dataclass field with ``default`` whose value (when not None) must be at least ``low``
    or above ``above``, and at most ``high`` or below ``below``; NaN is never in a range. For a
    list field every value must be, and the list must not be empty."""
    return dataclasses.field(default=default, metadata={"range": (low, above, high, below)})


def existing(
    kind: Literal["file", "folder", "path"], fix: str, default: Any = dataclasses.MISSING
) -> Any:
    """A dataclass field holding a path (or None, or a list of paths) that must name an existing
    ``kind`` (``path``: a file or a folder) when given; ``fix`` says where such a path comes
    from. No ``default``: a required field."""
    return dataclasses.field(default=default, metadata={"exists": (kind, fix)})


def check_ranges(config: Any) -> None:
    """Raise ValueError on the first field of ``config`` outside its declared range, and
    FileNotFoundError on the first path field naming nothing of its kind."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if "exists" in field.metadata and value is not None:
            kind, fix = field.metadata["exists"]
            paths = list(value) if isinstance(value, list | tuple) else [value]
            if not paths:
                raise ValueError(f"{field.name} must list at least one path")
            for path in map(Path, paths):
                found = {"file": path.is_file(), "folder": path.is_dir(), "path": path.exists()}
                if not found[kind]:
                    raise FileNotFoundError(f"{field.name}: no {kind} {path}; {fix}")
        if "range" not in field.metadata or value is None:
            continue
        values = list(value) if isinstance(value, list | tuple) else [value]
        if not values:
            raise ValueError(f"{field.name} must list at least one value")
        for number in values:
            _check_number(field.name, number, field.metadata["range"])


def _check_number(name: str, value: Any, bounds: tuple[float | None, ...]) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    low, above, high, below = bounds
    inside = not math.isnan(value) and all(
        (
            low is None or value >= low,
            above is None or value > above,
            high is None or value <= high,
            below is None or value < below,
        )
    )
    if not inside:
        raise ValueError(f"{name} must be {_describe(low, above, high, below)}, got {value!r}")


def _describe(
    low: float | None, above: float | None, high: float | None, below: float | None
) -> str:
    left = f"[{low}" if low is not None else None if above is None else f"({above}"
    right = f"{high}]" if high is not None else None if below is None else f"{below})"
    if left and right:
        return f"in {left}, {right}"
    if left:
        return f"at least {low}" if low is not None else f"above {above}"
    return f"at most {high}" if high is not None else f"below {below}"


def refuse_fields(cfg: Any, rules: dict[str, tuple[bool, str]]) -> None:
    """Refuse a config in one line naming every field that breaks its rule (name -> (ok, what
    the field must be))."""
    bad = [
        f"{name}={getattr(cfg, name)!r} ({must})" for name, (ok, must) in rules.items() if not ok
    ]
    if bad:
        raise ValueError(f"Invalid {cfg.architecture()} config: {'; '.join(bad)}")


def is_count(value: Any, low: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low
