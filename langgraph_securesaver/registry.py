"""SecureSaver's own tables (SQLAlchemy Core): threads, wrapped tenant keys, audit events.

By default they live in the same database as the inner saver. ``setup()`` creates and migrates
them; every statement is a named constant-like builder below so the SQL is easy to review.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from .crypto import KeyRow
from .errors import ConfigurationError
from .retention import DEFAULT_POLICY_KEY, NO_RETENTION, RetentionPolicy

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
    # effective retention (copied from the thread override, tenant or default policy)
    sa.Column("idle_ttl", sa.Float, nullable=True),
    sa.Column("max_age", sa.Float, nullable=True),
    sa.Column("strategy", sa.String(16), nullable=False, default="delete"),
    sa.Column("legal_hold", sa.Boolean, nullable=False, default=False, index=True),
    sa.Column("policy_source", sa.String(16), nullable=False, default="default"),
    sa.Column("expires_at", sa.Float, nullable=True, index=True),
    sa.Column("state", sa.String(16), nullable=False, default="active"),
    # pruner claims (lease + fencing token)
    sa.Column("claim_owner", sa.String(128), nullable=True),
    sa.Column("claim_token", sa.String(64), nullable=True),
    sa.Column("claim_expires", sa.Float, nullable=True),
)

policies = sa.Table(
    "securesaver_policies", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),  # "*" = the saver default
    sa.Column("idle_ttl", sa.Float, nullable=True),
    sa.Column("max_age", sa.Float, nullable=True),
    sa.Column("strategy", sa.String(16), nullable=False),
    sa.Column("legal_hold", sa.Boolean, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

receipts = sa.Table(
    "securesaver_receipts", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("receipt_id", sa.String(64), nullable=False, unique=True),
    sa.Column("tenant", sa.String(255), nullable=False, index=True),
    sa.Column("thread_id", sa.String(512), nullable=True),
    sa.Column("deleted_at", sa.Float, nullable=False, index=True),
    sa.Column("action", sa.String(16), nullable=False),  # deleted | pruned | shredded
    sa.Column("reason", sa.String(64), nullable=False),
    sa.Column("requested_by", sa.String(255), nullable=True),
    sa.Column("detail", sa.Text, nullable=False, default="{}"),
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


# Indexes added after tables existed: ``setup()`` creates them on existing databases too
# (``_migrate_indexes``). They are additive, so the schema version is unchanged.
LATER_INDEXES = (
    # events / receipts of one tenant in a time window (``securesaver events --tenant``)
    sa.Index("ix_securesaver_events_tenant_at", events.c.tenant, events.c.at),
    sa.Index("ix_securesaver_receipts_tenant_at", receipts.c.tenant, receipts.c.deleted_at),
)
# (no index on claim_token: a batch is found by its primary keys, and claim updates of
# unindexed columns stay heap-only on PostgreSQL)


def expires_expr(created: Any, last: Any, idle: Any, max_age: Any, hold: Any) -> Any:
    """SQL for the expiry a thread row's TTLs imply (NULL when held or without TTLs)."""
    by_idle = last + idle
    by_age = created + max_age
    return sa.case(
        (hold.is_(True), sa.null()),
        (sa.and_(idle.is_(None), max_age.is_(None)), sa.null()),
        (idle.is_(None), by_age),
        (max_age.is_(None), by_idle),
        (by_idle < by_age, by_idle),
        else_=by_age,
    )


@dataclass(frozen=True)
class ThreadRow:
    tenant: str
    thread_id: str
    created_at: float
    last_activity: float
    idle_ttl: float | None = None
    max_age: float | None = None
    strategy: str = "delete"
    legal_hold: bool = False
    policy_source: str = "default"
    expires_at: float | None = None
    state: str = "active"
    claim_owner: str | None = None
    claim_token: str | None = None
    claim_expires: float | None = None


@dataclass(frozen=True)
class Receipt:
    receipt_id: str
    tenant: str
    thread_id: str | None
    deleted_at: float
    action: str
    reason: str
    requested_by: str | None
    detail: dict[str, Any]


@dataclass(frozen=True)
class Event:
    id: int
    at: float
    kind: str
    tenant: str | None
    thread_id: str | None
    actor: str | None
    detail: dict[str, Any]


def pairs_in(dialect: str, first: Any, second: Any, pairs: Sequence[tuple[str, str]]) -> Any:
    """``(first, second) IN pairs``: on PostgreSQL two array parameters unnested together
    (a batch of 500 pairs is 2 parameters, not 1,000), elsewhere an expanding IN."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import ARRAY
        a = sa.literal([p[0] for p in pairs], ARRAY(sa.Text()))
        b = sa.literal([p[1] for p in pairs], ARRAY(sa.Text()))
        return sa.tuple_(first, second).in_(sa.select(sa.func.unnest(a), sa.func.unnest(b)))
    return sa.tuple_(first, second).in_(list(pairs))


def _by_token(rows: Sequence[ThreadRow]) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for r in rows:
        if r.claim_token is not None:
            out.setdefault(r.claim_token, []).append((r.tenant, r.thread_id))
    return out


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


_engine_locks: weakref.WeakKeyDictionary[Engine, threading.RLock] = weakref.WeakKeyDictionary()
_engine_locks_guard = threading.Lock()


def engine_lock(engine: Engine) -> AbstractContextManager[Any]:
    """Serializes transactions on an engine whose pool is ONE shared connection (the in-memory
    registry): sqlite3 cannot run two transactions at once on a connection. Engines that pool
    a connection per thread need no lock."""
    if not isinstance(engine.pool, StaticPool):
        return nullcontext()
    with _engine_locks_guard:
        lock = _engine_locks.get(engine)
        if lock is None:
            lock = _engine_locks[engine] = threading.RLock()
    return lock


def _create_all(engine: Engine) -> None:
    """create_all, tolerating another process creating the same tables at the same moment."""
    for attempt in range(5):
        try:
            metadata.create_all(engine, checkfirst=True)
            return
        except (sa.exc.OperationalError, sa.exc.ProgrammingError, sa.exc.IntegrityError) as exc:
            if "already exists" not in str(exc) and "duplicate key" not in str(exc):
                raise
            logger.debug("concurrent schema creation (attempt %d): %s", attempt + 1, exc)
            time.sleep(0.05 * (attempt + 1))
    metadata.create_all(engine, checkfirst=True)


def _migrate_indexes(engine: Engine) -> None:
    """Create indexes that later versions added, on tables that already existed (idempotent;
    tolerates another process creating the same index at the same moment)."""
    for index in LATER_INDEXES:
        try:
            with engine_lock(engine), engine.begin() as conn:
                index.create(conn, checkfirst=True)
        except (sa.exc.OperationalError, sa.exc.ProgrammingError, sa.exc.IntegrityError) as exc:
            if "already exists" not in str(exc) and "duplicate key" not in str(exc):
                raise
            logger.debug("index %s created concurrently: %s", index.name, exc)


def _register_companion_tables() -> None:
    """Companion modules define their tables on ``metadata``; import them so setup creates all."""
    import importlib
    for module in ("langgraph_securesaver.pii_vault", "langgraph_securesaver.idempotency.schema"):
        try:
            importlib.import_module(module)
        except ImportError:  # an optional component that is not installed
            logger.debug("companion tables %s not available", module)


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
        with engine_lock(self.engine), self.engine.begin() as conn:
            yield conn

    def setup(self) -> None:
        """Create and migrate the tables (idempotent, safe to call from several processes)."""
        with self._setup_lock:
            if self._is_setup:
                return
            _register_companion_tables()
            _create_all(self.engine)
            _migrate_indexes(self.engine)
            with engine_lock(self.engine), self.engine.begin() as conn:
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

    def ready_for_reading(self, also: Sequence[str] = ()) -> bool:
        """For read-only commands: True when every table and index :meth:`setup` creates (and
        the relations named in ``also``) exists and the stored schema version is this
        library's -- then nothing is created or migrated and the registry counts as set up.
        Two catalog reads, no DDL. False: call :meth:`setup` (it creates or migrates)."""
        _register_companion_tables()
        names = sorted({*metadata.tables, *(i.name for i in LATER_INDEXES if i.name), *also})
        with engine_lock(self.engine), self.engine.connect() as conn:
            if self.dialect == "postgresql":
                found = conn.execute(sa.text(
                    "SELECT relname FROM pg_catalog.pg_class WHERE relname = ANY(:names) "
                    "AND pg_catalog.pg_table_is_visible(oid)"), {"names": names}).scalars()
            elif self.dialect == "sqlite":
                found = conn.execute(sa.text(
                    "SELECT name FROM sqlite_master WHERE name IN :names").bindparams(
                        sa.bindparam("names", expanding=True)), {"names": names}).scalars()
            else:
                return False
            if set(found) != set(names):
                return False
            current = conn.execute(
                sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
            ).scalar()
        if current is None or str(current) != str(SCHEMA_VERSION):
            return False
        with self._setup_lock:
            self._is_setup = True
        return True

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
    def _upsert(self, table: sa.Table) -> Any:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert
            return pg_insert(table)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert
        return sqlite_insert(table)

    def _greatest(self, a: Any, b: Any) -> Any:
        return sa.func.greatest(a, b) if self.dialect == "postgresql" else sa.func.max(a, b)

    def touch_thread(self, tenant: str, thread_id: str, now: float | None = None,
                     policy: RetentionPolicy | None = None) -> None:
        """Register a thread (first write, with the given effective policy) or move its last
        activity forward and recompute its expiry from its stored TTLs."""
        now = time.time() if now is None else now
        policy = policy or NO_RETENTION
        row = {"tenant": tenant, "thread_id": thread_id, "created_at": now, "last_activity": now,
               **policy.as_row(), "policy_source": "default",
               "expires_at": policy.expires_at(now, now), "state": "active"}
        stmt = self._upsert(threads).values(**row)
        last = self._greatest(threads.c.last_activity, stmt.excluded.last_activity)
        stmt = stmt.on_conflict_do_update(
            index_elements=[threads.c.tenant, threads.c.thread_id],
            set_={
                "last_activity": last,
                "expires_at": expires_expr(threads.c.created_at, last, threads.c.idle_ttl,
                                           threads.c.max_age, threads.c.legal_hold),
                "state": sa.case((threads.c.state == "deleting", "deleting"), else_="active"),
            },
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

    def tenants(self) -> list[str]:
        with self.begin() as conn:
            found = set(conn.execute(sa.select(threads.c.tenant).distinct()).scalars())
            found |= set(conn.execute(sa.select(tenant_keys.c.tenant).distinct()).scalars())
        return sorted(found)

    def forget_thread(self, tenant: str, thread_id: str) -> None:
        with self.begin() as conn:
            conn.execute(threads.delete().where(
                threads.c.tenant == tenant, threads.c.thread_id == thread_id))

    # retention policies ---------------------------------------------------------------------
    def set_policy(self, tenant: str, policy: RetentionPolicy | None) -> None:
        """Store the default (tenant ``"*"``) or a tenant's policy and re-derive the expiry of
        every thread that follows it (threads with their own override keep it)."""
        with self.begin() as conn:
            conn.execute(policies.delete().where(policies.c.tenant == tenant))
            if policy is not None:
                conn.execute(policies.insert().values(tenant=tenant, updated_at=time.time(),
                                                      **policy.as_row()))
            self._reapply(conn, tenant)

    def get_policy(self, tenant: str) -> RetentionPolicy | None:
        with self.begin() as conn:
            r = conn.execute(sa.select(policies).where(policies.c.tenant == tenant)
                             ).mappings().first()
        if r is None:
            return None
        return RetentionPolicy(r["idle_ttl"], r["max_age"], r["strategy"], r["legal_hold"])

    def effective_policy(self, tenant: str) -> tuple[RetentionPolicy, str]:
        own = self.get_policy(tenant)
        if own is not None:
            return own, "tenant"
        return self.get_policy(DEFAULT_POLICY_KEY) or NO_RETENTION, "default"

    def _reapply(self, conn: Connection, tenant: str) -> None:
        if tenant == DEFAULT_POLICY_KEY:
            overridden = sa.select(policies.c.tenant).where(policies.c.tenant != DEFAULT_POLICY_KEY)
            where = sa.and_(threads.c.policy_source == "default",
                            threads.c.tenant.not_in(overridden))
            source = "default"
        else:
            where = sa.and_(threads.c.tenant == tenant, threads.c.policy_source != "thread")
            source = "tenant"
        row = conn.execute(sa.select(policies).where(policies.c.tenant == tenant)
                           ).mappings().first()
        if row is None and tenant != DEFAULT_POLICY_KEY:
            row = conn.execute(sa.select(policies).where(
                policies.c.tenant == DEFAULT_POLICY_KEY)).mappings().first()
            source = "default"
        values = ({"idle_ttl": row["idle_ttl"], "max_age": row["max_age"],
                   "strategy": row["strategy"], "legal_hold": row["legal_hold"]}
                  if row is not None else NO_RETENTION.as_row())
        conn.execute(threads.update().where(where).values(policy_source=source, **values))
        conn.execute(threads.update().where(where).values(expires_at=expires_expr(
            threads.c.created_at, threads.c.last_activity, threads.c.idle_ttl,
            threads.c.max_age, threads.c.legal_hold)))

    def set_thread_retention(self, tenant: str, thread_id: str, **changes: Any) -> ThreadRow:
        """Per-thread override of idle_ttl / max_age / strategy / legal_hold."""
        with self.begin() as conn:
            found = conn.execute(threads.update().where(
                threads.c.tenant == tenant, threads.c.thread_id == thread_id,
            ).values(policy_source="thread", **changes)).rowcount
            if not found:
                raise LookupError(f"tenant {tenant!r} has no thread {thread_id!r}")
            conn.execute(threads.update().where(
                threads.c.tenant == tenant, threads.c.thread_id == thread_id,
            ).values(expires_at=expires_expr(threads.c.created_at, threads.c.last_activity,
                                             threads.c.idle_ttl, threads.c.max_age,
                                             threads.c.legal_hold)))
        row = self.get_thread(tenant, thread_id)
        if row is None:  # deleted concurrently
            raise LookupError(f"tenant {tenant!r} has no thread {thread_id!r}")
        return row

    # pruner claims ----------------------------------------------------------------------------
    def claim_expired(self, *, now: float, owner: str, lease: float, limit: int,
                      tenant: str | None = None) -> list[ThreadRow]:
        """Atomically claim up to ``limit`` expired threads not claimed by a live pruner."""
        wall = time.time()
        token = uuid.uuid4().hex
        candidates = sa.select(threads.c.tenant, threads.c.thread_id).where(
            threads.c.expires_at <= now,
            sa.or_(threads.c.claim_expires.is_(None), threads.c.claim_expires < wall),
        ).order_by(threads.c.expires_at).limit(limit)
        if tenant is not None:
            candidates = candidates.where(threads.c.tenant == tenant)
        if self.dialect == "postgresql":
            candidates = candidates.with_for_update(skip_locked=True)
        stmt = threads.update().where(
            sa.tuple_(threads.c.tenant, threads.c.thread_id).in_(candidates)
        ).values(claim_owner=owner, claim_token=token, claim_expires=wall + lease
                 ).returning(*threads.c)
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(stmt).mappings()]

    def release_claim(self, row: ThreadRow) -> None:
        with self.begin() as conn:
            conn.execute(threads.update().where(
                threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
                threads.c.claim_token == row.claim_token,
            ).values(claim_owner=None, claim_token=None, claim_expires=None))

    def extend_claim(self, row: ThreadRow, seconds: float) -> None:
        with self.begin() as conn:
            conn.execute(threads.update().where(
                threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
                threads.c.claim_token == row.claim_token,
            ).values(claim_expires=time.time() + seconds))

    def mark_state(self, row: ThreadRow, state: str) -> bool:
        with self.begin() as conn:
            return bool(conn.execute(threads.update().where(
                threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
                threads.c.claim_token == row.claim_token,
            ).values(state=state)).rowcount)

    # batches of claimed threads (one claim token per claim_expired call) ----------------------
    def _batch_where(self, token: str, pairs: Sequence[tuple[str, str]]) -> list[Any]:
        return [threads.c.claim_token == token,
                pairs_in(self.dialect, threads.c.tenant, threads.c.thread_id, pairs)]

    def claimed(self, token: str, pairs: Sequence[tuple[str, str]]) -> list[ThreadRow]:
        """Re-read the rows of a batch that still carry the claim token (one query)."""
        if not pairs:
            return []
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(
                sa.select(threads).where(*self._batch_where(token, pairs))).mappings()]

    def release_claims(self, rows: Sequence[ThreadRow]) -> None:
        self._update_claims(rows, claim_owner=None, claim_token=None, claim_expires=None)

    def extend_claims(self, rows: Sequence[ThreadRow], seconds: float) -> None:
        self._update_claims(rows, claim_expires=time.time() + seconds)

    def mark_batch_state(self, rows: Sequence[ThreadRow], state: str) -> set[tuple[str, str]]:
        """Set ``state`` on the rows still claimed by their token; returns those rows."""
        done: set[tuple[str, str]] = set()
        with self.begin() as conn:
            for token, pairs in _by_token(rows).items():
                stmt = threads.update().where(*self._batch_where(token, pairs)).values(
                    state=state).returning(threads.c.tenant, threads.c.thread_id)
                done |= {(t, th) for t, th in conn.execute(stmt)}
        return done

    def _update_claims(self, rows: Sequence[ThreadRow], **values: Any) -> None:
        if not rows:
            return
        with self.begin() as conn:
            for token, pairs in _by_token(rows).items():
                conn.execute(threads.update().where(*self._batch_where(token, pairs)
                                                    ).values(**values))

    def delete_claimed(self, conn: Connection, token: str, pairs: Sequence[tuple[str, str]],
                       now: float | None = None) -> list[tuple[str, str]]:
        """Inside the caller's transaction: drop the registry rows of a batch still fenced by
        ``token`` and, given ``now``, still due (expired and not held, or already being
        deleted): the re-check happens in the statement that deletes. Returns the
        (tenant, thread) pairs dropped (only those get receipts)."""
        if not pairs:
            return []
        where = self._batch_where(token, pairs)
        if now is not None:
            where.append(sa.or_(threads.c.state == "deleting", sa.and_(
                threads.c.expires_at <= now, threads.c.legal_hold.is_(False))))
        stmt = threads.delete().where(*where).returning(threads.c.tenant, threads.c.thread_id)
        return [(t, th) for t, th in conn.execute(stmt)]

    def finish_pruned(self, row: ThreadRow, receipt: dict[str, Any]) -> bool:
        """keep_latest done: clear expiry until the next write, release, write the receipt."""
        with self.begin() as conn:
            done = conn.execute(threads.update().where(
                threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
                threads.c.claim_token == row.claim_token,
            ).values(state="pruned", expires_at=None, claim_owner=None, claim_token=None,
                     claim_expires=None)).rowcount
            if done:
                self._insert_receipt(conn, receipt)
        return bool(done)

    def finish_deleted(self, tenant: str, thread_id: str, receipt: dict[str, Any],
                       claim_token: str | None = None) -> bool:
        """Drop the registry row and write the receipt in one transaction (fenced by the claim
        token when a pruner holds one): a thread is receipted exactly once."""
        with self.begin() as conn:
            where = [threads.c.tenant == tenant, threads.c.thread_id == thread_id]
            if claim_token is not None:
                where.append(threads.c.claim_token == claim_token)
            done = conn.execute(threads.delete().where(*where)).rowcount
            if done or claim_token is None:
                self._insert_receipt(conn, receipt)
        return bool(done) or claim_token is None

    def expired_but_held(self, now: float, tenant: str | None = None) -> list[ThreadRow]:
        over = sa.or_(threads.c.last_activity + threads.c.idle_ttl <= now,
                      threads.c.created_at + threads.c.max_age <= now)
        q = sa.select(threads).where(threads.c.legal_hold.is_(True), over)
        if tenant is not None:
            q = q.where(threads.c.tenant == tenant)
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(q).mappings()]

    def list_expired(self, now: float, tenant: str | None = None,
                     limit: int | None = None) -> list[ThreadRow]:
        q = sa.select(threads).where(threads.c.expires_at <= now).order_by(threads.c.expires_at)
        if tenant is not None:
            q = q.where(threads.c.tenant == tenant)
        if limit is not None:
            q = q.limit(limit)
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(q).mappings()]

    def forget_tenant(self, tenant: str) -> None:
        with self.begin() as conn:
            conn.execute(threads.delete().where(threads.c.tenant == tenant))
            conn.execute(tenant_keys.delete().where(tenant_keys.c.tenant == tenant))
            conn.execute(policies.delete().where(policies.c.tenant == tenant))

    def count_expired(self, now: float, tenant: str | None = None) -> int:
        q = sa.select(sa.func.count()).select_from(threads).where(threads.c.expires_at <= now)
        if tenant is not None:
            q = q.where(threads.c.tenant == tenant)
        with self.begin() as conn:
            return int(conn.execute(q).scalar() or 0)

    # receipts ---------------------------------------------------------------------------------
    def _insert_receipt(self, conn: Connection, receipt: dict[str, Any]) -> None:
        self.insert_receipts(conn, [receipt])

    def insert_receipts(self, conn: Connection, batch: Sequence[dict[str, Any]]) -> None:
        """Every receipt is written here, inside the caller's transaction: one statement for
        a whole batch (the pruner writes hundreds at once)."""
        if not batch:
            return
        now = time.time()
        rows = []
        for receipt in batch:
            receipt = dict(receipt)
            detail = receipt.pop("detail", {})
            rows.append({"receipt_id": uuid.uuid4().hex, "deleted_at": now,
                         "tenant": receipt.pop("tenant"),
                         "thread_id": receipt.pop("thread_id", None),
                         "action": receipt.pop("action"), "reason": receipt.pop("reason"),
                         "requested_by": receipt.pop("requested_by", None),
                         "detail": json.dumps(detail, default=str, sort_keys=True), **receipt})
        if self.dialect == "postgresql" and len(rows) > 1:
            # one statement, one array parameter per column (not 9 parameters per receipt)
            from sqlalchemy.dialects.postgresql import ARRAY
            names = [c.name for c in receipts.columns if c.name != "id"]
            extra = {k for r in rows for k in r} - set(names)
            if extra:
                raise ConfigurationError(f"unknown receipt fields {sorted(extra)}")
            arrays = [sa.literal([r.get(n) for r in rows], ARRAY(receipts.c[n].type))
                      for n in names]
            conn.execute(receipts.insert().from_select(
                names, sa.select(*[sa.func.unnest(a) for a in arrays])))
            return
        conn.execute(receipts.insert(), rows)

    def add_receipt(self, **receipt: Any) -> None:
        with self.begin() as conn:
            self._insert_receipt(conn, receipt)

    def list_receipts(self, *, tenant: str | None = None, thread_id: str | None = None,
                      since: float | None = None, until: float | None = None) -> list[Receipt]:
        q = sa.select(receipts).order_by(receipts.c.id)
        if tenant is not None:
            q = q.where(receipts.c.tenant == tenant)
        if thread_id is not None:
            q = q.where(receipts.c.thread_id == thread_id)
        if since is not None:
            q = q.where(receipts.c.deleted_at >= since)
        if until is not None:
            q = q.where(receipts.c.deleted_at < until)
        with self.begin() as conn:
            return [Receipt(r["receipt_id"], r["tenant"], r["thread_id"], r["deleted_at"],
                            r["action"], r["reason"], r["requested_by"],
                            json.loads(r["detail"] or "{}")) for r in conn.execute(q).mappings()]

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
