"""SecureSaver's own tables (SQLAlchemy Core): threads, wrapped tenant keys, audit events.

By default they live in the same database as the inner saver. ``setup()`` creates and migrates
them; every statement is a named constant-like builder below so the SQL is easy to review.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from .crypto import KeyRow
from .errors import ConfigurationError

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1

metadata = sa.MetaData()

meta_table = sa.Table(
    "securesaver_meta", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
)

tenant_keys = sa.Table(
    "securesaver_tenant_keys", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("purpose", sa.String(16), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("master_version", sa.String(64), nullable=False, index=True),
    sa.Column("wrapped", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

threads = sa.Table(
    "securesaver_threads", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("thread_id", sa.String(512), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("last_activity", sa.Float, nullable=False),
)

events = sa.Table(
    "securesaver_events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False, index=True),
    sa.Column("kind", sa.String(32), nullable=False, index=True),
    sa.Column("tenant", sa.String(255), nullable=True, index=True),
    sa.Column("thread_id", sa.String(512), nullable=True),
    sa.Column("actor", sa.String(255), nullable=True),
    sa.Column("detail", sa.Text, nullable=False, default="{}"),
)


@dataclass(frozen=True)
class ThreadRow:
    tenant: str
    thread_id: str
    created_at: float
    last_activity: float


@dataclass(frozen=True)
class Event:
    id: int
    at: float
    kind: str
    tenant: str | None
    thread_id: str | None
    actor: str | None
    detail: dict[str, Any]


def normalize_url(url: str) -> str:
    """Accept the URLs users already have (``postgresql://``, ``sqlite:///``) for SQLAlchemy."""
    if url.startswith(("postgres://", "postgresql://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def create_registry_engine(url: str) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        in_memory = url in ("sqlite://", "sqlite:///:memory:")
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            poolclass=StaticPool if in_memory else None,
        )

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    if url.startswith("postgresql"):
        return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
    raise ConfigurationError(f"unsupported registry URL {url!r}: use sqlite:/// or postgresql://")


class Registry:
    """Thread-safe access to SecureSaver's tables. Async callers run these in a worker thread."""

    def __init__(self, engine: Engine | str) -> None:
        self.engine = create_registry_engine(engine) if isinstance(engine, str) else engine
        self.dialect = self.engine.dialect.name
        self._setup_lock = threading.Lock()
        self._is_setup = False

    @classmethod
    def in_memory(cls) -> Registry:
        return cls("sqlite://")

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        if not self._is_setup:
            self.setup()  # like SqliteSaver: the first use creates the tables
        with self.engine.begin() as conn:
            yield conn

    def setup(self) -> None:
        """Create and migrate the tables (idempotent, safe to call from several processes)."""
        with self._setup_lock:
            if self._is_setup:
                return
            metadata.create_all(self.engine, checkfirst=True)
            with self.engine.begin() as conn:
                current = conn.execute(
                    sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
                ).scalar()
                if current is None:
                    self._insert_ignore(conn, meta_table, [{"key": "schema_version",
                                                            "value": str(SCHEMA_VERSION)}])
                elif int(current) > SCHEMA_VERSION:
                    raise ConfigurationError(
                        f"registry schema v{current} is newer than this library "
                        f"(v{SCHEMA_VERSION}); upgrade langgraph-securesaver"
                    )
            self._is_setup = True

    # dialect helpers --------------------------------------------------------------------------
    def _insert_ignore(self, conn: Connection, table: sa.Table,
                       rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        stmt: Any
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert
            stmt = pg_insert(table).on_conflict_do_nothing()
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert
            stmt = sqlite_insert(table).on_conflict_do_nothing()
        conn.execute(stmt, list(rows))

    # keys (KeyStore protocol) -----------------------------------------------------------------
    def load_key_rows(self, tenant: str) -> list[KeyRow]:
        with self.begin() as conn:
            rows = conn.execute(
                sa.select(tenant_keys).where(tenant_keys.c.tenant == tenant)
            ).mappings().all()
        return [KeyRow(r["tenant"], r["purpose"], r["version"], r["master_version"],
                       bytes(r["wrapped"]), r["created_at"]) for r in rows]

    def insert_key_rows(self, rows: Sequence[KeyRow]) -> None:
        with self.begin() as conn:
            self._insert_ignore(conn, tenant_keys, [r.__dict__ for r in rows])

    def replace_key_rows(self, rows: Sequence[KeyRow]) -> None:
        with self.begin() as conn:
            for r in rows:
                conn.execute(
                    tenant_keys.update()
                    .where(tenant_keys.c.tenant == r.tenant, tenant_keys.c.purpose == r.purpose,
                           tenant_keys.c.version == r.version)
                    .values(master_version=r.master_version, wrapped=r.wrapped)
                )

    def tenants_with_keys(self) -> list[str]:
        with self.begin() as conn:
            return list(conn.execute(sa.select(tenant_keys.c.tenant).distinct()).scalars())

    def delete_tenant_keys(self, tenant: str) -> int:
        with self.begin() as conn:
            return conn.execute(tenant_keys.delete().where(tenant_keys.c.tenant == tenant)).rowcount

    # threads ----------------------------------------------------------------------------------
    def touch_thread(self, tenant: str, thread_id: str, now: float | None = None) -> None:
        """Register a thread (first write) or move its last activity forward."""
        now = time.time() if now is None else now
        row = {"tenant": tenant, "thread_id": thread_id, "created_at": now, "last_activity": now}
        stmt: Any
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert
            stmt = pg_insert(threads)
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert
            stmt = sqlite_insert(threads)
        stmt = stmt.values(**row).on_conflict_do_update(
            index_elements=[threads.c.tenant, threads.c.thread_id],
            set_={"last_activity": sa.func.max(threads.c.last_activity, stmt.excluded.last_activity)
                  if self.dialect == "sqlite"
                  else sa.func.greatest(threads.c.last_activity, stmt.excluded.last_activity)},
        )
        with self.begin() as conn:
            conn.execute(stmt)

    def get_thread(self, tenant: str, thread_id: str) -> ThreadRow | None:
        with self.begin() as conn:
            r = conn.execute(sa.select(threads).where(
                threads.c.tenant == tenant, threads.c.thread_id == thread_id)).mappings().first()
        return ThreadRow(**r) if r else None

    def list_threads(self, tenant: str | None = None) -> list[ThreadRow]:
        q = sa.select(threads).order_by(threads.c.tenant, threads.c.thread_id)
        if tenant is not None:
            q = q.where(threads.c.tenant == tenant)
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(q).mappings()]

    def forget_thread(self, tenant: str, thread_id: str) -> None:
        with self.begin() as conn:
            conn.execute(threads.delete().where(
                threads.c.tenant == tenant, threads.c.thread_id == thread_id))

    # events -----------------------------------------------------------------------------------
    def record_event(self, kind: str, *, tenant: str | None = None, thread_id: str | None = None,
                     actor: str | None = None, **detail: Any) -> None:
        with self.begin() as conn:
            conn.execute(events.insert().values(
                at=time.time(), kind=kind, tenant=tenant, thread_id=thread_id, actor=actor,
                detail=json.dumps(detail, default=str, sort_keys=True)))

    def list_events(self, *, kind: str | None = None, tenant: str | None = None,
                    thread_id: str | None = None, since: float | None = None,
                    until: float | None = None, limit: int | None = None) -> list[Event]:
        q = sa.select(events).order_by(events.c.id)
        for col, val in ((events.c.kind, kind), (events.c.tenant, tenant),
                         (events.c.thread_id, thread_id)):
            if val is not None:
                q = q.where(col == val)
        if since is not None:
            q = q.where(events.c.at >= since)
        if until is not None:
            q = q.where(events.c.at < until)
        if limit is not None:
            q = q.limit(limit)
        with self.begin() as conn:
            return [Event(r["id"], r["at"], r["kind"], r["tenant"], r["thread_id"], r["actor"],
                          json.loads(r["detail"] or "{}")) for r in conn.execute(q).mappings()]

    def dispose(self) -> None:
        self.engine.dispose()
