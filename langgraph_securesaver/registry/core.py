"""SecureSaver's own tables (SQLAlchemy Core): threads, wrapped tenant keys, audit events.

By default they live in the same database as the inner saver. ``Registry`` here opens them:
its engine and transactions, ``setup()`` (creating the tables; a registry of another schema
version is refused, nothing is migrated) and the dialect helpers its base classes share. The
statements of each concern are in those base classes -- :mod:`.thread_rows` (threads and
retention policies), :mod:`.chains` (receipts and events), :mod:`.wrapped_keys`,
:mod:`.claims`, :mod:`.verify` -- each a named builder so the SQL is easy to review.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..errors import ConfigurationError
from .chains import RegistryChains
from .claims import RegistryClaims
from .denials import flush_for
from .dialects import MYSQL, insert_ignore
from .direct_reads import DirectReads
from .integrity import RegistryIntegrity
from .namespaces import RegistryNamespaces
from .schema import (
    SCHEMA_VERSION,
    _create_all,
    _register_companion_tables,
    chain_heads,
    check_registry_dialect,
    check_strict,
    create_registry_engine,
    engine_lock,
    events,
    meta_table,
    metadata,
    policies,
    receipts,
    threads,
)
from .thread_rows import RegistryThreads
from .verify import (
    RegistryVerification,
)
from .wrapped_keys import RegistryKeys

logger = logging.getLogger(__name__)


def check_schema_version(current: Any) -> None:
    """ConfigurationError unless the registry records this library's schema version."""
    if str(current) != str(SCHEMA_VERSION):
        raise ConfigurationError(
            f"the registry records schema version {current!r}; this library reads only "
            f"version {SCHEMA_VERSION}: it was written by a pre-release build of "
            "langgraph-securesaver or edited. Nothing is migrated: create a new registry "
            "(and bring old threads in with `securesaver adopt`), or use the build that wrote it")


class Registry(RegistryThreads, RegistryChains, RegistryKeys, RegistryClaims,
               RegistryVerification, RegistryNamespaces):
    """Thread-safe access to SecureSaver's tables. Async callers run these in a worker thread."""

    def __init__(self, engine: Engine | str) -> None:
        self.engine = create_registry_engine(engine) if isinstance(engine, str) else engine
        check_registry_dialect(self.engine)
        self.dialect = self.engine.dialect.name
        if self.dialect in MYSQL:   # also on an engine the caller made: see create_registry_engine
            self.engine = self.engine.execution_options(isolation_level="READ COMMITTED")
        self._setup_lock = threading.Lock()
        self._is_setup = False
        #: pooled-connection-free reads of the hottest statement (the erasure epoch); on the
        #: in-memory registry's one connection they hold the lock its transactions hold
        self.direct = DirectReads(self.engine, serial=engine_lock(self.engine))
        # MACs on retention rows, receipts, events (registry/integrity.py); keyed once a keyring is
        # attached with attach_keys()
        self.integrity = RegistryIntegrity(self, None, has_macs=self._has_macs)

    def attach_keys(self, provider: Any) -> None:
        """Use ``provider`` (the saver's keyring) to unwrap the registry MAC key."""
        self.integrity.attach(provider)
        if self._is_setup and self.integrity.available:
            self.integrity.check_keyring()

    @classmethod
    def in_memory(cls) -> Registry:
        return cls("sqlite://")

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        if not self._is_setup:
            self.setup()  # like SqliteSaver: the first use creates the tables
        with engine_lock(self.engine), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A connection for one read-only statement: on PostgreSQL in autocommit (no BEGIN and
        COMMIT round trips around it), elsewhere like :meth:`begin`."""
        with self.single() as conn:
            yield conn

    @contextmanager
    def single(self) -> Iterator[Connection]:
        """A connection for one statement that is atomic by itself (a read, or an UPDATE of
        one row with RETURNING): on PostgreSQL in autocommit, elsewhere like :meth:`begin`."""
        if self.dialect != "postgresql":
            with self.begin() as conn:
                yield conn
            return
        if not self._is_setup:
            self.setup()
        with self.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn

    def setup(self) -> None:
        """Create the tables (idempotent, safe to call from several processes). A registry
        that records another schema version was written by a pre-release build (or edited):
        it is refused with ConfigurationError, nothing is migrated."""
        with self._setup_lock:
            if self._is_setup:
                return
            _register_companion_tables()
            if self.dialect in MYSQL:
                with self.engine.connect() as conn:
                    check_strict(conn)
            _create_all(self.engine)
            with engine_lock(self.engine), self.engine.begin() as conn:
                self._insert_ignore(conn, meta_table, [{"key": "schema_version",
                                                        "value": str(SCHEMA_VERSION)}])
                current = conn.execute(
                    sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
                ).scalar()
            check_schema_version(current)
            self._is_setup = True
        self.integrity.check_keyring()

    def _has_macs(self) -> bool:
        with engine_lock(self.engine), self.engine.connect() as conn:
            return self._maced_rows_exist(conn)

    @staticmethod
    def _maced_rows_exist(conn: Connection) -> bool:
        """Any row anywhere carrying a MAC (or a chain head): the registry MAC key was made."""
        probes: list[Any] = [sa.select(sa.literal(1)).select_from(chain_heads)]
        for table, column in ((threads, "policy_mac"), (threads, "activity_mac"),
                              (policies, "mac"), (receipts, "mac"), (events, "mac")):
            probes.append(sa.select(sa.literal(1)).select_from(table).where(
                table.c[column].is_not(None)))
        idem = metadata.tables.get("securesaver_idempotency")
        # a companion table not created (or dropped) holds no MACed rows
        if idem is not None and "fp_mac" in idem.c and sa.inspect(conn).has_table(idem.name):
            probes.append(sa.select(sa.literal(1)).select_from(idem).where(
                idem.c.fp_mac.is_not(None)))
        return any(conn.execute(probe.limit(1)).first() is not None for probe in probes)

    def ready_for_reading(self, also: Sequence[str] = ()) -> bool:
        """For read-only commands: True when every table and index :meth:`setup` creates (and
        the relations named in ``also``) exists and the stored schema version is this
        library's -- then nothing is created and the registry counts as set up. Two catalog
        reads, no DDL. False: call :meth:`setup` (it creates the tables, or refuses a registry
        of another schema version)."""
        _register_companion_tables()
        indexes = {i.name for t in metadata.tables.values() for i in t.indexes if i.name}
        names = sorted({*metadata.tables, *indexes, *also})
        with engine_lock(self.engine), self.engine.connect() as conn:
            if self.dialect == "postgresql":
                found = conn.execute(sa.text(
                    "SELECT relname FROM pg_catalog.pg_class WHERE relname = ANY(:names) "
                    "AND pg_catalog.pg_table_is_visible(oid)"), {"names": names}).scalars()
            elif self.dialect == "sqlite":
                found = conn.execute(sa.text(
                    "SELECT name FROM sqlite_master WHERE name IN :names").bindparams(
                        sa.bindparam("names", expanding=True)), {"names": names}).scalars()
            elif self.dialect in MYSQL:   # index names are per table: the union of both
                found = conn.execute(sa.text(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = DATABASE() UNION SELECT index_name FROM "
                    "information_schema.statistics WHERE table_schema = DATABASE()")).scalars()
            else:
                return False
            present = set(found) & set(names)
            # the version first: a registry of another version may lack today's objects
            current = conn.execute(
                sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
            ).scalar() if meta_table.name in present else None
        if current is not None:
            check_schema_version(current)
        if current is None or present != set(names):
            return False
        with self._setup_lock:
            self._is_setup = True
        return True

    # dialect helpers --------------------------------------------------------------------------
    def _insert_ignore(self, conn: Connection, table: sa.Table,
                       rows: Sequence[dict[str, Any]]) -> None:
        insert_ignore(conn, table, rows)

    # deletion hygiene and shutdown ----------------------------------------------------------
    def flush_deleted(self) -> None:
        """After a deletion batch on SQLite: empty the registry's WAL (the deleted key rows,
        vault values and records in it are gone from the file). Best effort, never raises."""
        if self.dialect != "sqlite" or isinstance(self.engine.pool, sa.pool.StaticPool):
            return
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        except sa.exc.SQLAlchemyError as exc:
            logger.warning("registry WAL checkpoint after a deletion failed: %s", exc)

    def dispose(self) -> None:
        flush_for(self)  # coalesced access-denied summaries still pending
        self.direct.close()
        self.engine.dispose()
