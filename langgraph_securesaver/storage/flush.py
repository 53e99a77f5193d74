"""Deletion hygiene on SQLite: after a deletion batch, the WAL -- which still holds the pages
as they were before the deletion -- is checkpointed and truncated. Best effort: a failure is
logged, never raised (the deletion itself is committed; crypto-erasure is what makes the
remnants unreadable, this only removes them)."""

from __future__ import annotations

import logging
from typing import Any

from .sql import SQLITE_WAL_TRUNCATE

logger = logging.getLogger("langgraph_securesaver.storage.ops")


def sqlite_flush(inner: Any) -> None:
    """``wal_checkpoint(TRUNCATE)`` on a SqliteSaver's connection."""
    try:
        with inner.lock:
            busy, _log, _done = inner.conn.execute(SQLITE_WAL_TRUNCATE).fetchone()
        if busy:
            logger.info("WAL not truncated after a deletion: a reader is active (the next "
                        "deletion retries)")
    except Exception as exc:  # noqa: BLE001 - hygiene must not fail the deletion
        logger.warning("WAL checkpoint after a deletion failed: %s", exc)


async def asqlite_flush(inner: Any) -> None:
    """The same on an AsyncSqliteSaver's connection."""
    try:
        async with inner.lock:
            await inner.conn.execute(SQLITE_WAL_TRUNCATE)
    except Exception as exc:  # noqa: BLE001 - hygiene must not fail the deletion
        logger.warning("WAL checkpoint after a deletion failed: %s", exc)


def bridged_flush(ops: Any) -> None:
    """The async flush of an async-only saver, from a worker thread on the saver's loop (off
    that loop -- a purely sync caller -- the next async deletion flushes)."""
    try:
        ops.bridge(ops.aflush_deleted())
    except NotImplementedError:
        return
