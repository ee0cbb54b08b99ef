"""What every command writes: stage timings, JSON summaries and markdown tables."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "Stopwatch",
    "cell",
    "markdown_table",
    "read_json",
    "read_json_list",
    "read_jsonl",
    "read_torch",
    "write_json",
    "write_text",
    "write_torch",
]


class Stopwatch:
    """Seconds per pipeline stage, printed as each one ends (``[name] stage: 12.3 s``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self._start, 1)
        self._start = now
        print(f"[{self.name}] {stage}: {self.seconds[stage]:.1f} s", flush=True)


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place: a crash or
    a full disk midway leaves the previous file (or none), never a truncated one."""
    _replace_whole(Path(path), lambda partial: partial.write_text(text))


def write_torch(path: str | Path, obj: Any) -> None:
    """``torch.save(obj, path)`` as :func:`write_text` writes: whole or not at all (its folder
    made if need be)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    _replace_whole(Path(path), lambda partial: torch.save(obj, partial))


def _replace_whole(path: Path, write: Callable[[Path], object]) -> None:
    partial = path.with_name(f".{path.name}.partial")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_json(path: str | Path, summary: Any) -> None:
    """Indented JSON (written as ``write_text`` does); paths and other non-JSON values (a
    config's ``Path``) as strings."""
    write_text(path, json.dumps(summary, indent=2, default=str))


def read_json(path: str | Path, what: str, fix: str, fields: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON object in ``path``, which should be ``what``; a file that is not one (not UTF-8,
    not JSON, not an object, or without one of ``fields``) raises ValueError in one line naming
    it and saying ``fix``. A missing file raises FileNotFoundError."""
    return _checked(_parse(Path(path), Path(path).read_bytes(), what, fix), path, what, fix, fields)


def read_jsonl(
    path: str | Path, what: str, fix: str, fields: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one per non-empty line, checked as :func:`read_json` checks
    one (an empty file is no rows)."""
    path = Path(path)
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    return [_checked(_parse(path, line, what, fix), path, what, fix, fields) for line in lines]


def read_json_list(path: str | Path, what: str, fix: str) -> list[Any]:
    """The JSON array in ``path``, refused in one line as :func:`read_json` refuses."""
    data = _parse(Path(path), Path(path).read_bytes(), what, fix)
    if not isinstance(data, list):
        raise ValueError(f"{path} is not {what} (not a JSON array); {fix}")
    return data


def read_torch(path: str | Path, what: str, fix: str, **load: Any) -> Any:
    """What ``torch.load(path, **load)`` reads from a file that should be ``what``; a file that
    is not a torch save (empty, cut short, random bytes, another format) raises ValueError in
    one line naming it and saying ``fix``. A missing file raises FileNotFoundError."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no {what} at {path}")
    try:
        return torch.load(path, **load)
    except Exception as error:  # a damaged pickle fails in many ways, none of them the user's bug
        raise ValueError(f"{path} is not {what} ({type(error).__name__}); {fix}") from None


def _parse(path: Path, text: bytes, what: str, fix: str) -> Any:
    try:
        return json.loads(text.decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not {what} ({type(error).__name__}); {fix}") from None


def _checked(
    data: Any, path: str | Path, what: str, fix: str, fields: Sequence[str]
) -> dict[str, Any]:
    missing = [name for name in fields if name not in data] if isinstance(data, dict) else None
    if missing is None or missing:
        lacks = "not a JSON object" if missing is None else f"no {missing[0]!r}"
        raise ValueError(f"{path} is not {what} ({lacks}); {fix}")
    return data


def cell(value: Any, spec: str = "") -> str:
    """A table cell: ``-`` for a missing value (e.g. no relative error for a constant set)."""
    return "-" if value is None else format(value, spec)


def markdown_table(
    rows: Iterable[dict[str, Any]], columns: Sequence[tuple[str, Callable[[dict[str, Any]], str]]]
) -> str:
    """A markdown table with one line per row; ``columns`` are (header, row -> cell text)."""
    lines = ["| " + " | ".join(header for header, _ in columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(text(row) for _, text in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"
