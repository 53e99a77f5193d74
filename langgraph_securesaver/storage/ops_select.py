"""Picking the native operations for an inner saver: :func:`ops_for` maps the saver's type to
its implementation (:mod:`.ops_memory`, :mod:`.ops_sqlite`, :mod:`.ops_postgres`), or to the
:class:`~.ops.StorageOps` fallback for any other saver.
"""

from __future__ import annotations

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from .ops import StorageOps
from .ops_memory import MemoryOps
from .ops_postgres import AsyncPostgresOps, PostgresOps
from .ops_sqlite import AsyncSqliteOps, SqliteOps


def ops_for(inner: BaseCheckpointSaver) -> StorageOps:
    """Pick the native implementation for the inner saver's type."""
    if isinstance(inner, InMemorySaver):
        return MemoryOps(inner)
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    except ImportError:  # pragma: no cover - sqlite saver is a core dependency
        SqliteSaver = AsyncSqliteSaver = None  # type: ignore[assignment,misc]
    if SqliteSaver is not None and isinstance(inner, SqliteSaver):
        return SqliteOps(inner)
    if AsyncSqliteSaver is not None and isinstance(inner, AsyncSqliteSaver):
        return AsyncSqliteOps(inner)
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError:
        return StorageOps(inner)
    if isinstance(inner, PostgresSaver):
        return PostgresOps(inner)
    if isinstance(inner, AsyncPostgresSaver):
        return AsyncPostgresOps(inner)
    return StorageOps(inner)
