"""One hot read-only statement without the pool's per-checkout work.

The PII vault reads a tenant's erasure epoch on every read and write of a redacting saver.
Through the registry's pool each read paid a checkout, PostgreSQL's pre-ping (a round trip),
a transaction and the reset on return. :class:`DirectReads` keeps a few DBAPI connections
detached from the engine's pool (made by the engine: same URL, arguments and connect hooks),
each used by one thread at a time, outside any transaction (PostgreSQL: autocommit; SQLite:
no transaction is left open), so every read sees the latest committed value. A connection
that fails is closed and the read retried once on a new one. After ``fork`` the child
never touches (or closes) its parent's connections. A pool of one shared connection (an
in-memory SQLite database) is used as it is, one checkout per read, under the lock that
serializes the engine's transactions (``serial``): a read on it while another thread's
transaction is open would see that transaction's uncommitted rows, and returning the checkout
(or the read's own rollback) would roll that transaction back, silently (a thread key created
and then read back as missing, an audit event lost).

Knows an engine and DBAPI cursors; nothing of the tables it reads.
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.pool import SingletonThreadPool, StaticPool

from .dialects import MYSQL

logger = logging.getLogger(__name__)

#: a parent's connections seen in a forked child: kept referenced, never used or closed
_ABANDONED: list[Any] = []


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        logger.debug("closing a direct-read connection failed", exc_info=True)


class DirectReads:
    """Thread-safe; at most ``size`` idle connections are kept."""

    def __init__(self, engine: Engine, size: int = 2,
                 serial: AbstractContextManager[Any] | None = None) -> None:
        self.engine = engine
        self.size = size
        self._free: list[Any] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # a pool of one shared connection (an in-memory SQLite database lives in it): never
        # detached, checked out per read instead, holding ``serial`` (what the engine's
        # transactions hold; never entered inside one of them on the same thread)
        self._shared = isinstance(engine.pool, (StaticPool, SingletonThreadPool))
        self._serial: AbstractContextManager[Any] = (
            serial if self._shared and serial is not None else nullcontext())

    def __repr__(self) -> str:
        return f"DirectReads(idle={len(self._free)})"

    @property
    def placeholder(self) -> str:
        """The driver's parameter marker (``?`` for SQLite, ``%s`` for psycopg and PyMySQL)."""
        return "?" if self.engine.dialect.name == "sqlite" else "%s"

    def scalar(self, sql: str, params: tuple[Any, ...]) -> Any:
        """The first column of the first row of ``sql`` (driver parameter style), or None."""
        rows = self.rows(sql, params, one=True)
        return rows[0][0] if rows else None

    def rows(self, sql: str, params: tuple[Any, ...], *, one: bool = False
             ) -> list[tuple[Any, ...]]:
        """The rows of ``sql`` (driver parameter style; ``one``: the first row only)."""
        for attempt in (0, 1):
            with self._serial:   # a shared connection: no other thread's transaction is open
                got = self._attempt(sql, params, one, last=bool(attempt))
            if got is not None:
                return got
        return []  # pragma: no cover - the last attempt returns or raises

    def _attempt(self, sql: str, params: tuple[Any, ...], one: bool, last: bool
                 ) -> list[tuple[Any, ...]] | None:
        """The rows, or None after a driver error on a connection that was idle (not
        ``last``: the caller retries on a new one)."""
        error: type[BaseException] = self.engine.dialect.loaded_dbapi.Error
        conn = self._take()
        try:
            cursor = conn.cursor()
            try:
                cursor.execute(sql, params)
                got = cursor.fetchmany(1) if one else cursor.fetchall()
            finally:
                cursor.close()
            if getattr(conn, "in_transaction", False):   # never keep a snapshot open
                conn.rollback()
        except error:
            _close_quietly(conn)
            if last:
                raise
            logger.debug("direct read failed on an idle connection; retrying on a new one")
            return None
        except BaseException:
            _close_quietly(conn)
            raise
        self._give(conn)
        return [tuple(r) for r in got]

    def close(self) -> None:
        """Close the idle connections (the engine's pool is not affected)."""
        with self._lock:
            conns, self._free = self._free, []
            forked = self._pid != os.getpid()
        if forked:
            _ABANDONED.extend(conns)
            return
        for conn in conns:
            _close_quietly(conn)

    def _take(self) -> Any:
        if self._shared:
            return self.engine.raw_connection()
        with self._lock:
            if self._pid != os.getpid():
                _ABANDONED.extend(self._free)
                self._free, self._pid = [], os.getpid()
            if self._free:
                return self._free.pop()
        fairy = self.engine.raw_connection()
        conn: Any = fairy.dbapi_connection
        if conn is None:  # pragma: no cover - a fresh checkout always holds one
            fairy.close()
            raise RuntimeError("the pool handed out a connection without a DBAPI connection")
        try:
            fairy.detach()   # ours now: the pool neither counts, pings, resets nor closes it
            if self.engine.dialect.name == "postgresql":
                conn.autocommit = True
            elif self.engine.dialect.name in MYSQL:
                conn.autocommit(True)   # PyMySQL: a method
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    def _give(self, conn: Any) -> None:
        if self._shared:
            conn.close()   # back to its pool
            return
        with self._lock:
            if self._pid == os.getpid() and len(self._free) < self.size:
                self._free.append(conn)
                return
        _close_quietly(conn)
