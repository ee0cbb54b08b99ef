"""An on-disk cache of LLM replies (sqlite), keyed on the model and the full request.

Every reply is committed as soon as it arrives, so a rerun, or a run resumed after a crash or a
kill, never pays for a request twice. Pending Batch API jobs are kept too, so that a resumed run
polls the batch it already submitted instead of submitting it again.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

__all__ = ["ReplyCache", "request_key"]


def request_key(body: dict[str, Any]) -> str:
    """sha256 of the request body (model, messages and every sampling option), canonical JSON."""
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


_TABLES = {"replies": ["key", "model", "request", "reply"], "batches": ["requests", "batch_id"]}
"""The cache's tables and their columns, as ``ReplyCache`` creates them."""
_SQLITE_HEADER = b"SQLite format 3\x00"


def _check_cache(path: Path) -> None:
    """Refuse, in one line and without writing to it, a file that is not a reply cache: not an
    SQLite database, a damaged one, or one without this cache's tables."""
    fix = "delete it to start a new cache (or give another --out)"
    if path.stat().st_size == 0:  # created, then killed before its first write: SQLite's empty
        return
    with path.open("rb") as file:
        if file.read(len(_SQLITE_HEADER)) != _SQLITE_HEADER:
            raise ValueError(f"{path} is not a ComSem reply cache (not an SQLite file); {fix}")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            healthy = db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            tables = {t: [row[1] for row in db.execute(f"PRAGMA table_info({t})")] for t in _TABLES}
        finally:
            db.close()
    except sqlite3.DatabaseError as error:
        raise ValueError(f"{path} is not a ComSem reply cache ({error}); {fix}") from None
    if not healthy or tables != _TABLES:
        why = "damaged" if not healthy else "other tables"
        raise ValueError(f"{path} is not a ComSem reply cache ({why}); {fix}")


class ReplyCache:
    """``get``/``put`` of replies by request key; ``path=None`` keeps them in memory only."""

    def __init__(self, path: str | Path | None) -> None:
        if path is not None:
            if Path(path).exists():
                _check_cache(Path(path))
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(":memory:" if path is None else str(path))
        self._db.execute("PRAGMA journal_mode=WAL")
        for table, columns in _TABLES.items():
            key, *rest = columns
            typed = ", ".join([f"{key} TEXT PRIMARY KEY", *(f"{c} TEXT" for c in rest)])
            self._db.execute(f"CREATE TABLE IF NOT EXISTS {table} ({typed})")
        self._db.commit()

    def get(self, key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, body: dict[str, Any], reply: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?)",
            (key, body.get("model"), json.dumps(body), json.dumps(reply)),
        )
        self._db.commit()

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0])

    def pending_batch(self, requests_key: str) -> str | None:
        row = self._db.execute(
            "SELECT batch_id FROM batches WHERE requests = ?", (requests_key,)
        ).fetchone()
        return None if row is None else row[0]

    def set_pending_batch(self, requests_key: str, batch_id: str | None) -> None:
        if batch_id is None:
            self._db.execute("DELETE FROM batches WHERE requests = ?", (requests_key,))
        else:
            self._db.execute(
                "INSERT OR REPLACE INTO batches VALUES (?, ?)", (requests_key, batch_id)
            )
        self._db.commit()

    def close(self) -> None:
        self._db.close()
