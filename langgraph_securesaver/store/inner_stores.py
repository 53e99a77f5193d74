"""The inner stores ``SecureStore.from_url`` opens: SqliteStore / PostgresStore (and their
async twins) on the database the SecureSaver of the pair uses."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from ..backends import (
    POSTGRES_EXTRA_HINT,
    SQLITE_FILE_PRAGMAS,
    is_postgres,
    libpq_url,
    sqlite_path,
)
from ..errors import ConfigurationError

#: options that configure the store; every other option is SecureSaver's
STORE_OPTIONS = frozenset({"index", "blind_index"})


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    store = {k: v for k, v in options.items() if k in STORE_OPTIONS}
    saver = {k: v for k, v in options.items() if k not in STORE_OPTIONS and k != "ttl"}
    return saver, store, options.get("ttl")


@contextmanager
def open_sync_store(url: str, ttl: Any) -> Iterator[Any]:
    path = sqlite_path(url)
    if path is not None:
        from langgraph.store.sqlite import SqliteStore
        with SqliteStore.from_conn_string(path, ttl=ttl) as store:
            if path != ":memory:":
                for pragma in SQLITE_FILE_PRAGMAS:   # as the saver's connection runs
                    store.conn.execute(pragma)
            yield store
        return
    if is_postgres(url):
        try:
            from langgraph.store.postgres import PostgresStore
        except ImportError:
            raise ConfigurationError(POSTGRES_EXTRA_HINT) from None
        with PostgresStore.from_conn_string(libpq_url(url), ttl=ttl) as store:
            yield store
        return
    raise ConfigurationError(f"unsupported URL {url!r}: use sqlite:///path.db or postgresql://...")


@asynccontextmanager
async def open_async_store(url: str, ttl: Any) -> AsyncIterator[Any]:
    path = sqlite_path(url)
    if path is not None:
        from langgraph.store.sqlite.aio import AsyncSqliteStore
        async with AsyncSqliteStore.from_conn_string(path, ttl=ttl) as store:
            if path != ":memory:":
                for pragma in SQLITE_FILE_PRAGMAS:
                    await store.conn.execute(pragma)
            yield store
        return
    if is_postgres(url):
        try:
            from langgraph.store.postgres.aio import AsyncPostgresStore
        except ImportError:
            raise ConfigurationError(POSTGRES_EXTRA_HINT) from None
        async with AsyncPostgresStore.from_conn_string(libpq_url(url), ttl=ttl) as store:
            yield store
        return
    raise ConfigurationError(f"unsupported URL {url!r}: use sqlite:///path.db or postgresql://...")
