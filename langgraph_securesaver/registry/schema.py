"""The registry's schema: SecureSaver's own tables (keys, threads, policies, receipts, events,
chain heads), their later indexes, the row types, the expiry expression, and creating engines
and tables (tolerating concurrent setup).

Tables and types only; the statements that use them are :mod:`.core` and its base classes.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
import sqlalchemy.dialects.mysql
from sqlalchemy.engine import Engine
from sqlalchemy.pool import StaticPool

from ..errors import ConfigurationError
from ..retention import DEFAULT_POLICY_KEY
from . import integrity as mac
from .dialects import MYSQL, SUPPORTED
from .integrity import row_tag

logger = logging.getLogger("langgraph_securesaver.registry.core")


#: The one schema of this release. A registry recording another version was written by a
#: pre-release build (or edited) and is refused: nothing is migrated.
SCHEMA_VERSION = 1

metadata = sa.MetaData()

#: thread ids: 512 characters; 255 on MySQL/MariaDB, whose keys hold at most 3,072 bytes
#: (LangGraph's MySQL saver keeps 150)
ThreadId = sa.String(512).with_variant(sa.String(255), "mysql", "mariadb")
#: sealed values and wrapped keys (MySQL's BLOB stops at 64 KB)
Blob = sa.LargeBinary().with_variant(sa.dialects.mysql.LONGBLOB(), "mysql", "mariadb")

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
    sa.Column("wrapped", Blob, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

# one random data key per thread, wrapped by the tenant KEK (registry/thread_keys.py); deleting the
# row crypto-erases the thread
thread_keys = sa.Table(
    "securesaver_thread_keys", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("thread_id", ThreadId, primary_key=True),
    sa.Column("master_version", sa.String(64), nullable=False, index=True),
    sa.Column("wrapped", Blob, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

# one random data key per PII-vault entry (token): erasing the value deletes its key
pii_keys = sa.Table(
    "securesaver_pii_keys", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("token", sa.String(128), primary_key=True),
    sa.Column("master_version", sa.String(64), nullable=False, index=True),
    sa.Column("wrapped", Blob, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

# one random data key per SecureStore item (``item``: its vault owner id, a digest of namespace
# and key; ``owner``: a keyed digest of the namespace's first label, the subject by LangGraph's
# convention): deleting the item, or forgetting its subject, deletes the row and crypto-erases it
store_keys = sa.Table(
    "securesaver_store_keys", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("item", sa.String(128), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("master_version", sa.String(64), nullable=False, index=True),
    sa.Column("wrapped", Blob, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Index("ix_securesaver_store_keys_owner", "tenant", "owner"),
)

# the version each SecureStore item is at, per store holding it (``store``: a digest of where
# the store keeps its items; stores sharing one registry hold items of the same names) and per
# key row (``key_born``: the row's created_at): a number and the random tag of the put that
# wrote it, what a read accepts (registry/item_versions.py)
store_versions = sa.Table(
    "securesaver_store_versions", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("item", sa.String(128), primary_key=True),
    sa.Column("store", sa.String(64), primary_key=True),
    sa.Column("key_born", sa.Double, nullable=False),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("tag", sa.String(32), nullable=False),
)

# the subject (end user) of a thread, as a keyed digest (registry/subjects.py): written by the first
# write naming a subject, deleted with the thread; what forget_subject finds threads by
thread_subjects = sa.Table(
    "securesaver_thread_subjects", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("thread_id", ThreadId, primary_key=True),
    sa.Column("subject", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Index("ix_securesaver_thread_subjects_subject", "tenant", "subject"),
)

threads = sa.Table(
    "securesaver_threads", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("thread_id", ThreadId, primary_key=True),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("last_activity", sa.Double, nullable=False),
    # effective retention (copied from the thread override, tenant or default policy)
    sa.Column("idle_ttl", sa.Double, nullable=True),
    sa.Column("max_age", sa.Double, nullable=True),
    sa.Column("strategy", sa.String(16), nullable=False, default="delete"),
    sa.Column("legal_hold", sa.Boolean, nullable=False, default=False, index=True),
    sa.Column("policy_source", sa.String(16), nullable=False, default="default"),
    sa.Column("expires_at", sa.Double, nullable=True, index=True),
    sa.Column("state", sa.String(16), nullable=False, default="active"),
    # pruner claims (lease + fencing token)
    sa.Column("claim_owner", sa.String(128), nullable=True),
    sa.Column("claim_token", sa.String(64), nullable=True),
    sa.Column("claim_expires", sa.Double, nullable=True),
    # registry MACs (registry/integrity.py): over the retention fields, and over last_activity
    sa.Column("policy_mac", sa.String(64), nullable=True),
    sa.Column("activity_mac", sa.String(64), nullable=True),
)

# the checkpoint namespaces (subgraphs) a thread was written in: copy_thread reads them on
# savers whose listing of a thread returns its root namespace only (LMDB, objectstorage)
thread_namespaces = sa.Table(
    "securesaver_thread_namespaces", metadata,
    sa.Column("ns_key", sa.String(64), primary_key=True),  # sha256(tenant, thread, ns)
    sa.Column("tenant", sa.String(255), nullable=False),
    sa.Column("thread_id", ThreadId, nullable=False),
    sa.Column("checkpoint_ns", sa.Text, nullable=False),
    sa.Index("ix_securesaver_thread_namespaces_thread", "tenant", "thread_id"),
)

policies = sa.Table(
    "securesaver_policies", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),  # "*" = the saver default
    sa.Column("idle_ttl", sa.Double, nullable=True),
    sa.Column("max_age", sa.Double, nullable=True),
    sa.Column("strategy", sa.String(16), nullable=False),
    sa.Column("legal_hold", sa.Boolean, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("mac", sa.String(64), nullable=True),
)

receipts = sa.Table(
    "securesaver_receipts", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("receipt_id", sa.String(64), nullable=False, unique=True),
    sa.Column("tenant", sa.String(255), nullable=False, index=True),
    sa.Column("thread_id", ThreadId, nullable=True),
    sa.Column("deleted_at", sa.Double, nullable=False, index=True),
    sa.Column("action", sa.String(16), nullable=False),  # deleted | pruned | shredded
    sa.Column("reason", sa.String(64), nullable=False),
    sa.Column("requested_by", sa.String(255), nullable=True),
    sa.Column("detail", sa.Text, nullable=False, default="{}"),
    # hash chain per tenant: position, MAC of the previous row, MAC of this row
    sa.Column("seq", sa.BigInteger, nullable=True),
    sa.Column("prev_mac", sa.String(64), nullable=True),
    sa.Column("mac", sa.String(64), nullable=True),
)

events = sa.Table(
    "securesaver_events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Double, nullable=False, index=True),
    sa.Column("kind", sa.String(32), nullable=False, index=True),
    sa.Column("tenant", sa.String(255), nullable=True, index=True),
    sa.Column("thread_id", ThreadId, nullable=True),
    sa.Column("actor", sa.String(255), nullable=True),
    sa.Column("detail", sa.Text, nullable=False, default="{}"),
    # hash chain per tenant ("" for tenant-less events)
    sa.Column("seq", sa.BigInteger, nullable=True),
    sa.Column("prev_mac", sa.String(64), nullable=True),
    sa.Column("mac", sa.String(64), nullable=True),
)

chain_heads = sa.Table(
    "securesaver_chain_heads", metadata,
    sa.Column("tbl", sa.String(64), primary_key=True),      # securesaver_events | _receipts
    sa.Column("chain", sa.String(255), primary_key=True),   # the tenant, "" for none
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("mac", sa.String(64), nullable=False),        # MAC of the chain's last row
    sa.Column("head_mac", sa.String(64), nullable=False),
)

# Maintained audit summaries (audit/summaries.py): what the audit reads instead of every raw row.
# Per registered thread, its storage totals as of ``refreshed_at`` (NULL: due for a refresh);
# ``ages`` the stored bytes per age bucket at that time, JSON like ``pii`` and ``unsealed``.
thread_summaries = sa.Table(
    "securesaver_thread_summaries", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("thread_id", ThreadId, primary_key=True),
    sa.Column("checkpoints", sa.BigInteger, nullable=False),
    sa.Column("stored_bytes", sa.BigInteger, nullable=False),
    sa.Column("first_ts", sa.Double, nullable=True),
    sa.Column("last_ts", sa.Double, nullable=True),
    sa.Column("key_versions", sa.Text, nullable=False),
    sa.Column("pii", sa.Text, nullable=False),
    sa.Column("ages", sa.Text, nullable=False),
    sa.Column("unsealed", sa.Text, nullable=False),
    sa.Column("refreshed_at", sa.Double, nullable=True),
    # set by the paths that change stored rows without touching the thread's activity
    # (keep_latest, delete_for_runs, forget_pii): due again if at or after refreshed_at
    sa.Column("changed_at", sa.Double, nullable=True),
)
# Per tenant, the sums of its thread summaries (written with them).
tenant_summaries = sa.Table(
    "securesaver_tenant_summaries", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("threads", sa.BigInteger, nullable=False),
    sa.Column("checkpoints", sa.BigInteger, nullable=False),
    sa.Column("stored_bytes", sa.BigInteger, nullable=False),
    sa.Column("first_ts", sa.Double, nullable=True),
    sa.Column("last_ts", sa.Double, nullable=True),
    sa.Column("key_versions", sa.Text, nullable=False),
    sa.Column("unsealed", sa.Text, nullable=False),
    sa.Column("refreshed_at", sa.Double, nullable=True),
)

#: securesaver_meta key naming the database (bound into every wrapped key)
DATABASE_ID = "database_id"


# events / receipts of one tenant in a time window (``securesaver events --tenant``)
sa.Index("ix_securesaver_events_tenant_at", events.c.tenant, events.c.at)
sa.Index("ix_securesaver_receipts_tenant_at", receipts.c.tenant, receipts.c.deleted_at)
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
    policy_mac: str | None = None
    activity_mac: str | None = None


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


def _thread_ref(tenant: str, thread_id: str) -> str:
    """Names a thread row in errors and reports without its values (digests of the ids)."""
    return f"tenant#{row_tag(tenant)} thread#{row_tag(tenant, thread_id)}"


def _policy_ref(tenant: str) -> str:
    return "default" if tenant == DEFAULT_POLICY_KEY else f"tenant#{row_tag(tenant)}"


def _maced(row: ThreadRow) -> tuple[Any, ...]:
    """Everything a thread row's two MACs cover, and the MACs."""
    r = row.__dict__
    return (*mac.thread_policy_parts(r), *mac.thread_activity_parts(r), row.policy_mac,
            row.activity_mac)


def normalize_url(url: str) -> str:
    """Accept the URLs users already have (``postgresql://``, ``sqlite:///``) for SQLAlchemy."""
    if url.startswith(("postgres://", "postgresql://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith(("mysql://", "mariadb://")):
        scheme, rest = url.split("://", 1)
        url = f"{scheme}+pymysql://{rest}"
    if url.startswith(("mysql+", "mariadb+")) and "charset=" not in url:
        url += ("&" if "?" in url else "?") + "charset=utf8mb4"
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
            cur.execute("PRAGMA secure_delete=ON")   # deleted rows are overwritten
            cur.close()

        return engine
    if url.startswith("postgresql"):
        # the async API's hops run on up to 16 threads (offthread), the application's own
        # on more: beyond pool_size a connection is closed when it is returned (PostgreSQL
        # forks a backend for each new one), beyond pool_size + max_overflow a thread waits
        return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=22)
    if url.startswith(("mysql", "mariadb")):
        # READ COMMITTED: a statement sees rows committed before it, as on PostgreSQL (the
        # claims and leases are written for that, not for REPEATABLE READ's snapshots)
        # strict: a value too long for its column is an error, never stored cut
        return sa.create_engine(url, pool_pre_ping=True, pool_recycle=3600, pool_size=10,
                                max_overflow=22, isolation_level="READ COMMITTED",
                                connect_args={"init_command": STRICT_MODE})
    raise ConfigurationError(
        f"unsupported registry URL {_scheme(url)!r}: the registry runs on SQLite, PostgreSQL "
        "or MySQL/MariaDB (sqlite:///path.db, postgresql://..., mysql://...)")


#: MySQL's session for every connection SecureSaver opens there (registry and from_url's
#: saver): strict (see check_strict), and UTC, so UNIX_TIMESTAMP (the idempotency store's
#: clock) does not repeat an hour when the server's zone leaves daylight saving time
STRICT_MODE = ("SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,"
               "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', time_zone = '+00:00'")


def check_strict(conn: Any) -> None:
    """On MySQL/MariaDB, refuse a session that would store a value cut to its column or
    convert a bad value with a warning (an engine the caller made without strict mode)."""
    mode = str(conn.exec_driver_sql("SELECT @@SESSION.sql_mode").scalar() or "")
    if "STRICT_ALL_TABLES" not in mode and "STRICT_TRANS_TABLES" not in mode:
        raise ConfigurationError(
            "the registry's MySQL connections must run in strict mode (sql_mode without "
            "STRICT_TRANS_TABLES stores values cut to their column): pass a URL and let the "
            "registry make its engine, or set sql_mode on yours; nothing was created")


def _scheme(url: str) -> str:
    return url.split("://", 1)[0] + "://..." if "://" in url else "<not a URL>"


def check_registry_dialect(engine: Engine) -> None:
    """Refuse, before any table is created, an engine the registry cannot run on."""
    if engine.dialect.name not in SUPPORTED:
        raise ConfigurationError(
            f"the registry cannot run on {engine.dialect.name}: it runs on SQLite, "
            "PostgreSQL or MySQL/MariaDB; nothing was created (docs/savers.md)")


def scrub_wal(engine: Engine) -> None:
    """After an erasure on SQLite: checkpoint the write-ahead log and truncate it, so frames
    holding the erased rows' old pages are gone from the -wal file too (best effort: a reader
    on an older snapshot keeps it; the next erasure or checkpoint retries)."""
    if engine.dialect.name != "sqlite" or isinstance(engine.pool, StaticPool):
        return
    with engine.connect() as conn:
        busy = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").first()
    if busy is not None and busy[0]:
        logger.info("the SQLite write-ahead log could not be truncated after an erasure "
                    "(a reader holds an older snapshot)")


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
    if engine.dialect.name in MYSQL:
        _binary_collation(engine)
    for attempt in range(5):
        try:
            metadata.create_all(engine, checkfirst=True)
            return
        except (sa.exc.OperationalError, sa.exc.ProgrammingError, sa.exc.IntegrityError) as exc:
            if not any(m in str(exc) for m in ("already exists", "duplicate key",
                                               "Duplicate key name")):
                raise
            logger.debug("concurrent schema creation (attempt %d): %s", attempt + 1, exc)
            time.sleep(0.05 * (attempt + 1))
    metadata.create_all(engine, checkfirst=True)


def _register_companion_tables() -> None:
    """Companion modules define their tables on ``metadata``; import them so setup creates all."""
    import importlib
    for module in ("langgraph_securesaver.registry.pii_vault",
                   "langgraph_securesaver.idempotency.schema"):
        try:
            importlib.import_module(module)
        except ImportError:  # an optional component that is not installed
            logger.debug("companion tables %s not available", module)


def _binary_collation(engine: Engine) -> None:
    """On MySQL/MariaDB every registry table compares text byte for byte, trailing spaces
    included: under the default collations ``Acme``, ``acme`` and ``acme `` are one tenant
    and one key."""
    with engine.connect() as conn:
        mariadb = "mariadb" in str(conn.exec_driver_sql("SELECT VERSION()").scalar()).lower()
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    for table in metadata.tables.values():
        table.dialect_kwargs.update(mysql_engine="InnoDB", mysql_charset="utf8mb4",
                                    mysql_collate=collation)
