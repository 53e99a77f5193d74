"""Open the inner saver for a database URL: SQLite (embedded default) or PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..registry.schema import STRICT_MODE

if TYPE_CHECKING:  # (the URL helpers here are used by the CLI before LangGraph is needed)
    from langgraph.checkpoint.base import BaseCheckpointSaver

POSTGRES_EXTRA_HINT = (
    "PostgreSQL support needs the postgres extra: pip install 'langgraph-securesaver[postgres]'"
)


def sqlite_path(url: str) -> str | None:
    """``sqlite:///rel.db``, ``sqlite:////abs.db``, ``sqlite:///:memory:`` -> a path, else None."""
    if not url.startswith("sqlite:"):
        return None
    rest = url[len("sqlite:"):]
    if rest in ("", "//", "///:memory:", "//:memory:"):
        return ":memory:"
    if not rest.startswith("///"):
        raise ConfigurationError(f"SQLite URLs look like sqlite:///path.db, got {url!r}")
    return rest[3:]


MYSQL_EXTRA_HINT = (
    "MySQL support needs the mysql extra: pip install 'langgraph-securesaver[mysql]'"
)


def is_mysql(url: str) -> bool:
    return url.startswith(("mysql://", "mariadb://", "mysql+pymysql://", "mariadb+pymysql://"))


def mysql_url(url: str, driver: str) -> str:
    """``mysql://`` for LangGraph's MySQL savers: ``mysql+<driver>://`` for the async one."""
    rest = url.split("://", 1)[1]
    return f"mysql+{driver}://{rest}" if driver else f"mysql://{rest}"


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://"))


def libpq_url(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


def registry_url_for(url: str) -> str:
    path = sqlite_path(url)
    if path == ":memory:":
        return "sqlite://"
    if path is not None:
        return f"sqlite:///{path}"
    return url


# file databases run in WAL mode: readers do not block the writer, commits are cheaper; deleted
# content is overwritten (SQLite's default for secure_delete varies by build)
SQLITE_FILE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL",
                       "PRAGMA secure_delete=ON")


def connect_sqlite(path: str) -> sqlite3.Connection:
    """The connection from_url gives SqliteSaver (also used by the benchmarks' raw saver)."""
    conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
    if path != ":memory:":
        for pragma in SQLITE_FILE_PRAGMAS:
            conn.execute(pragma)
    return conn


def postgres_connection_kwargs() -> dict[str, Any]:
    """What the Postgres savers expect of their pooled connections."""
    from psycopg.rows import dict_row
    return {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


@contextmanager
def open_sync_inner(url: str) -> Iterator[tuple[BaseCheckpointSaver, str]]:
    path = sqlite_path(url)
    if path is not None:
        from langgraph.checkpoint.sqlite import SqliteSaver
        conn = connect_sqlite(path)
        try:
            yield SqliteSaver(conn), registry_url_for(url)
        finally:
            conn.close()
        return
    if is_postgres(url):
        try:
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg_pool import ConnectionPool
            kwargs = postgres_connection_kwargs()
        except ImportError:
            raise ConfigurationError(POSTGRES_EXTRA_HINT) from None
        with ConnectionPool(libpq_url(url), kwargs=kwargs, min_size=1, max_size=8,
                            open=True) as pool:
            yield PostgresSaver(pool), url  # type: ignore[arg-type]
        return
    if is_mysql(url):
        try:
            import pymysql
            from langgraph.checkpoint.mysql.pymysql import PyMySQLSaver
        except ImportError:
            raise ConfigurationError(MYSQL_EXTRA_HINT) from None
        with pymysql.connect(**PyMySQLSaver.parse_conn_string(mysql_url(url, "")),
                             autocommit=True, init_command=STRICT_MODE) as conn:
            yield PyMySQLSaver(conn), url
        return
    raise ConfigurationError(f"unsupported URL {url!r}: use sqlite:///path.db, "
                             "postgresql://... or mysql://...")


@asynccontextmanager
async def open_async_inner(url: str) -> AsyncIterator[tuple[BaseCheckpointSaver, str]]:
    path = sqlite_path(url)
    if path is not None:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        conn = await aiosqlite.connect(path)
        try:
            if path != ":memory:":
                for pragma in SQLITE_FILE_PRAGMAS:
                    await conn.execute(pragma)
            yield AsyncSqliteSaver(conn), registry_url_for(url)
        finally:
            await conn.close()
        return
    if is_postgres(url):
        try:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg_pool import AsyncConnectionPool
            kwargs = postgres_connection_kwargs()
        except ImportError:
            raise ConfigurationError(POSTGRES_EXTRA_HINT) from None
        async with AsyncConnectionPool(libpq_url(url), kwargs=kwargs, min_size=1, max_size=8,
                                       open=False) as pool:
            yield AsyncPostgresSaver(pool), url  # type: ignore[arg-type]
        return
    if is_mysql(url):
        try:   # asyncmy: aiomysql's saver fails raw (docs/savers.md)
            import asyncmy
            from langgraph.checkpoint.mysql.asyncmy import AsyncMySaver
        except ImportError:
            raise ConfigurationError(MYSQL_EXTRA_HINT) from None
        async with asyncmy.connect(**AsyncMySaver.parse_conn_string(mysql_url(url, "asyncmy")),
                                   autocommit=True, init_command=STRICT_MODE) as my_conn:
            yield AsyncMySaver(conn=my_conn), url
        return
    raise ConfigurationError(f"unsupported URL {url!r}: use sqlite:///path.db, "
                             "postgresql://... or mysql://...")


#: the tables of LangGraph's MySQL savers that hold thread ids
MYSQL_SAVER_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


def binary_thread_ids(engine: Any) -> list[str]:
    """Make LangGraph's MySQL tables compare thread ids byte for byte; returns the tables
    changed. They are created with the server's default collation, under which ``abc``,
    ``ABC`` and ``abc `` are one thread: a write to one makes the others unreadable and
    deleting one deletes them all, held or not. Idempotent (from_url runs it after setup)."""
    import sqlalchemy as sa
    with engine.connect() as conn:
        mariadb = "mariadb" in str(conn.exec_driver_sql("SELECT VERSION()").scalar()).lower()
        collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
        found = conn.execute(sa.text(
            "SELECT table_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND column_name = 'thread_id' "
            "AND table_name IN :names").bindparams(sa.bindparam("names", expanding=True)),
            {"names": list(MYSQL_SAVER_TABLES)}).all()
    changed = []
    for table, current in found:
        if current != collation:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE `{table}` CONVERT TO CHARACTER SET utf8mb4 "
                                     f"COLLATE {collation}")
            changed.append(str(table))
    return changed
