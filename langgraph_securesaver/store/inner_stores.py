"""The inner stores ``SecureStore.from_url`` opens: SqliteStore / PostgresStore (and their
async twins) on the database the SecureSaver of the pair uses."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

from langgraph.store.base import BaseStore, GetOp, ListNamespacesOp, Op, PutOp, Result, SearchOp
from langgraph.store.base.batch import AsyncBatchedBaseStore

from ..errors import ConfigurationError
from ..registry.namespaces import (
    postgres_location,
    sqlite_location,
)
from ..storage.backends import (
    POSTGRES_EXTRA_HINT,
    SQLITE_FILE_PRAGMAS,
    is_postgres,
    libpq_url,
    sqlite_path,
)

logger = logging.getLogger(__name__)

#: the store's SQLite connection: the saver's pragmas, and deleted or overwritten items
#: zeroed in the file (not left in free pages for a copy of it to carve)
STORE_SQLITE_PRAGMAS = (*SQLITE_FILE_PRAGMAS, "PRAGMA secure_delete=ON")
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
                for pragma in STORE_SQLITE_PRAGMAS:
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
                for pragma in STORE_SQLITE_PRAGMAS:
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


# --- where a store keeps its items ----------------------------------------------------------
def store_location(inner: BaseStore) -> str | None:
    """Where ``inner`` keeps its items: ``sqlite:<file>``, ``postgresql://host:port/db``, or
    ``memory:<type>@<id>`` (this process only); None when it can only be asked
    asynchronously (an AsyncSqliteStore: :func:`astore_location`). A PostgreSQL store is
    located from a live connection (of its pool, or one made as the pool makes them)."""
    conn = getattr(inner, "conn", None)
    name = type(inner).__name__
    if name == "SqliteStore" and isinstance(conn, sqlite3.Connection):
        return sqlite_location(_main_file(conn.execute("PRAGMA database_list").fetchall())) \
            or _in_memory(inner)
    if name == "AsyncSqliteStore":
        return None
    if "Postgres" in name and conn is not None:
        info = getattr(conn, "info", None)
        if info is not None:
            return _pg(info)
        if isinstance(getattr(conn, "conninfo", None), str):   # a connection pool
            # read off a live connection, as the registry's location is: a conninfo without
            # a host (the Unix socket) or with defaults left out names the database otherwise
            if "Async" not in type(conn).__name__:
                with conn.connection() as live:
                    return _pg(live.info)
            # an async pool asked synchronously: its loop may not be running (or may be this
            # thread's), so a connection of its own, made as the pool makes them
            import psycopg
            with psycopg.connect(conn.conninfo, **dict(getattr(conn, "kwargs", None) or {})
                                 ) as live:
                return _pg(live.info)
    return _in_memory(inner)


def _pg(info: Any) -> str:
    return postgres_location(info.host, info.port, info.dbname, info.options)


async def astore_location(inner: BaseStore) -> str:
    """:func:`store_location`, asking an AsyncSqliteStore's connection on its own thread, or
    a connection of an async pool."""
    conn = cast(Any, inner).conn
    if isinstance(getattr(conn, "conninfo", None), str) and "Async" in type(conn).__name__:
        async with conn.connection() as live:     # an async pool, asked on its loop
            return _pg(live.info)
    found = store_location(inner)
    if found is not None:
        return found
    cursor = await cast(Any, inner).conn.execute("PRAGMA database_list")
    return sqlite_location(_main_file(await cursor.fetchall())) or _in_memory(inner)


def _main_file(rows: Any) -> str:
    return next((str(file or "") for _seq, name, file in rows if name == "main"), "")


def _in_memory(inner: BaseStore) -> str:
    return f"memory:{type(inner).__name__}@{id(inner):x}"


_OP_METHODS: dict[type, str] = {GetOp: "get", PutOp: "put", SearchOp: "search",
                                ListNamespacesOp: "list_namespaces"}


def _queued(inner: BaseStore) -> bool:
    return isinstance(inner, AsyncBatchedBaseStore)


#: a SQLite store's batch that lost its snapshot to another connection's commit is retried
#: this many times, after 10, 20, 40 ... ms
SQLITE_BUSY_RETRIES = 8


def _busy(exc: BaseException) -> bool:
    """SQLite's SQLITE_BUSY / SQLITE_BUSY_SNAPSHOT ("database is locked").

    The SQLite stores run every batch as ``BEGIN`` (deferred), the batch's reads, then its
    writes. Alone on its file that is safe; beside SecureStore's registry and vault, which
    commit on their own connection to the same file, a batch that read before the registry's
    commit cannot upgrade to a writer and fails at once, whatever the busy timeout. SQLite's
    answer is to run the transaction again: its statements are upserts, deletes and reads,
    so running the batch again gives the result the caller asked for."""
    return isinstance(exc, sqlite3.OperationalError) and "database is locked" in str(exc)


def _with_retries(call: Callable[[], list[Result]]) -> list[Result]:
    attempt = 0
    while True:
        try:
            return call()
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or attempt == SQLITE_BUSY_RETRIES:
                raise
            logger.debug("store batch lost its SQLite snapshot; running it again (%d)", attempt)
            time.sleep(0.01 * 2 ** attempt)
            attempt += 1


async def _awith_retries(call: Callable[[], Awaitable[list[Result]]]) -> list[Result]:
    attempt = 0
    while True:
        try:
            return await call()
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or attempt == SQLITE_BUSY_RETRIES:
                raise
            logger.debug("store batch lost its SQLite snapshot; running it again (%d)", attempt)
            await asyncio.sleep(0.01 * 2 ** attempt)
            attempt += 1


def inner_batch(inner: BaseStore, ops: list[Op]) -> list[Result]:
    """Run SecureStore's inner operations shaped as a raw caller's would be.

    A store that batches in a background task (``AsyncBatchedBaseStore``: AsyncPostgresStore,
    AsyncSqliteStore) merges the single-operation calls of concurrent callers (``put``,
    ``get`` ...) into one inner batch at a time; ``batch``/``abatch`` bypass that queue.
    SecureStore turns every ``put``/``get``/... into a one-op batch, so a one-op batch goes
    to the inner store's single-operation method: otherwise concurrent callers become
    concurrent inner batches, which the raw store never has in flight (on a PostgreSQL pool,
    TTL refreshes and writes in separate transactions then deadlock)."""
    if len(ops) == 1 and _queued(inner):
        return _with_retries(lambda: [_one_op(inner, ops[0], "")])
    return _with_retries(lambda: inner.batch(ops))


async def ainner_batch(inner: BaseStore, ops: list[Op]) -> list[Result]:
    """:func:`inner_batch` for the async path."""
    async def one() -> list[Result]:
        return [await _one_op(inner, ops[0], "a")]

    if len(ops) == 1 and _queued(inner):
        return await _awith_retries(one)
    return await _awith_retries(lambda: inner.abatch(ops))


def _one_op(inner: BaseStore, op: Op, prefix: str) -> Any:
    """Call the inner store's single-operation method (``get``, ``aget`` ...) for ``op``."""
    name = "delete" if isinstance(op, PutOp) and op.value is None else _OP_METHODS[type(op)]
    method = getattr(inner, prefix + name)
    if isinstance(op, GetOp):
        return method(op.namespace, op.key, refresh_ttl=op.refresh_ttl)
    if isinstance(op, PutOp):
        if op.value is None:
            return method(op.namespace, op.key)
        return method(op.namespace, op.key, op.value, op.index, ttl=op.ttl)
    if isinstance(op, SearchOp):
        return method(op.namespace_prefix, query=op.query, filter=op.filter, limit=op.limit,
                      offset=op.offset, refresh_ttl=op.refresh_ttl)
    conditions = list(cast(ListNamespacesOp, op).match_conditions or ())
    if len(conditions) > 1 or any(c.match_type != "prefix" for c in conditions):
        raise ValueError("SecureStore sends its inner store at most one prefix condition")
    listing = cast(ListNamespacesOp, op)
    return method(prefix=conditions[0].path if conditions else None,
                  max_depth=listing.max_depth, limit=listing.limit, offset=listing.offset)
