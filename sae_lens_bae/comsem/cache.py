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


class ReplyCache:
    """``get``/``put`` of replies by request key; ``path=None`` keeps them in memory only."""

    def __init__(self, path: str | Path | None) -> None:
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(":memory:" if path is None else str(path))
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, model TEXT, "
            "request TEXT, reply TEXT)"
        )
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS batches (requests TEXT PRIMARY KEY, batch_id TEXT)"
        )
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
