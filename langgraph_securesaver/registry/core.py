"""SecureSaver's own tables (SQLAlchemy Core): threads, wrapped tenant keys, audit events.

By default they live in the same database as the inner saver. ``Registry`` here opens them:
its engine and transactions, ``setup()`` (creating and migrating the tables, MACing rows older
than schema v2 once) and the dialect helpers its base classes share. The statements of each
concern are in those base classes -- :mod:`.thread_rows` (threads and retention policies),
:mod:`.chains` (receipts and events), :mod:`.wrapped_keys`, :mod:`.claims`, :mod:`.verify` --
each a named builder so the SQL is easy to review.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..errors import ConfigurationError, KeyringRequired, TamperedDataError
from . import integrity as mac
from .chains import RegistryChains
from .claims import RegistryClaims
from .denials import flush_for
from .direct_reads import DirectReads
from .integrity import RegistryIntegrity
from .namespaces import RegistryNamespaces
from .schema import (  # noqa: F401 - the schema names are importable from here
    _ADOPTED,
    _V2_COLUMNS,
    LATER_INDEXES,
    SCHEMA_VERSION,
    Event,
    Receipt,
    ThreadRow,
    _create_all,
    _migrate_indexes,
    _policy_ref,
    _register_companion_tables,
    _thread_ref,
    adopt_idempotency_macs,
    chain_heads,
    check_registry_dialect,
    create_registry_engine,
    engine_lock,
    events,
    expires_expr,
    meta_table,
    metadata,
    normalize_url,
    pairs_in,
    policies,
    receipts,
    tenant_keys,
    threads,
)
from .thread_rows import RegistryThreads
from .verify import (  # noqa: F401 - IntegrityReport was defined here
    IntegrityReport,
    RegistryVerification,
)
from .wrapped_keys import RegistryKeys

logger = logging.getLogger(__name__)


class Registry(RegistryThreads, RegistryChains, RegistryKeys, RegistryClaims,
               RegistryVerification, RegistryNamespaces):
    """Thread-safe access to SecureSaver's tables. Async callers run these in a worker thread."""

    def __init__(self, engine: Engine | str) -> None:
        self.engine = create_registry_engine(engine) if isinstance(engine, str) else engine
        check_registry_dialect(self.engine)
        self.dialect = self.engine.dialect.name
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
            self._bind_and_adopt()

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
        """Create and migrate the tables (idempotent, safe to call from several processes)."""
        with self._setup_lock:
            if self._is_setup:
                return
            _register_companion_tables()
            _create_all(self.engine)
            self._add_missing_columns()
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
                elif int(current) < SCHEMA_VERSION:  # older library versions now refuse it
                    conn.execute(meta_table.update().where(
                        meta_table.c.key == "schema_version").values(value=str(SCHEMA_VERSION)))
            self._is_setup = True
        self.integrity.check_keyring()
        if self.integrity.available:
            self._bind_and_adopt()

    def _bind_and_adopt(self) -> None:
        """With a keyring: bind key rows older than schema v3 to this database, then MAC the
        rows older than schema v2 (each once)."""
        provider = self.integrity.provider
        if provider is not None:
            self.bind_key_rows(provider)
        self._adopt_legacy_rows()

    def _add_missing_columns(self) -> None:
        """Schema v1 -> v2: add the MAC columns to tables created by older versions
        (tolerating another process adding them at the same moment)."""
        inspector = sa.inspect(self.engine)
        existing = set(inspector.get_table_names())
        for table, column, type_ in _V2_COLUMNS:
            if table not in existing or column in {
                    c["name"] for c in inspector.get_columns(table)}:
                continue
            ddl = (f"ALTER TABLE {table} ADD COLUMN {column} "
                   f"{type_.compile(dialect=self.engine.dialect)}")
            try:
                with engine_lock(self.engine), self.engine.begin() as conn:
                    conn.exec_driver_sql(ddl)
            except (sa.exc.OperationalError, sa.exc.ProgrammingError) as exc:
                if "duplicate column" not in str(exc) and "already exists" not in str(exc):
                    raise
            logger.info("registry migration: added %s.%s", table, column)

    def _has_macs(self) -> bool:
        with engine_lock(self.engine), self.engine.connect() as conn:
            return self._maced_rows_exist(conn)

    @staticmethod
    def _maced_rows_exist(conn: Connection) -> bool:
        """Any row anywhere carrying a MAC (or a chain head): the database is not pre-v2."""
        probes: list[Any] = [sa.select(sa.literal(1)).select_from(chain_heads)]
        for table, column in ((threads, "policy_mac"), (threads, "activity_mac"),
                              (policies, "mac"), (receipts, "mac"), (events, "mac")):
            probes.append(sa.select(sa.literal(1)).select_from(table).where(
                table.c[column].is_not(None)))
        idem = metadata.tables.get("securesaver_idempotency")
        if idem is not None and "fp_mac" in idem.c:
            probes.append(sa.select(sa.literal(1)).select_from(idem).where(
                idem.c.fp_mac.is_not(None)))
        return any(conn.execute(probe.limit(1)).first() is not None for probe in probes)

    def _adopt_legacy_rows(self) -> None:
        """Rows written before schema v2 carry no MACs. The first process that has the keyring
        MACs them once (trust on first use; recorded as a ``registry_rows_adopted`` event);
        from then on a row without a MAC is reported by ``events --verify``, never adopted."""
        with engine_lock(self.engine), self.engine.connect() as conn:
            if conn.execute(sa.select(meta_table.c.key).where(meta_table.c.key == _ADOPTED)
                            ).first() is not None:
                return  # done once; never again (that would launder inserted rows)
        integ = self.integrity
        try:
            integ.require()
        except (KeyringRequired, TamperedDataError) as exc:  # e.g. another keyring
            logger.warning("registry integrity: rows not adopted: %s", exc)
            return
        stmt = self._upsert(meta_table).values(key=_ADOPTED, value="schema-v2"
                                               ).on_conflict_do_nothing().returning(
            meta_table.c.key)
        with engine_lock(self.engine), self.engine.begin() as conn:
            if conn.execute(stmt).first() is None:
                return  # adopted before (or by a concurrent process right now)
            if self._maced_rows_exist(conn):
                # a database some keyed process already wrote MACs into lost its adoption
                # marker (deleted, or schema_version reset to 1): adopting now would MAC rows
                # forged since then, so nothing is adopted; --verify reports them
                logger.error("registry integrity: the adoption marker (securesaver_meta "
                             "'%s') was missing although MACed registry rows exist; rows "
                             "without a MAC are NOT adopted (events --verify reports them)",
                             _ADOPTED)
                return
            counts = {"threads": 0, "policies": 0, "receipts": 0, "events": 0,
                      "idempotency": 0}
            legacy = conn.execute(sa.select(threads).where(sa.or_(
                threads.c.policy_mac.is_(None), threads.c.activity_mac.is_(None)))
            ).mappings().all()
            if legacy:
                conn.execute(threads.update().where(
                    threads.c.tenant == sa.bindparam("b_tenant"),
                    threads.c.thread_id == sa.bindparam("b_thread"),
                ).values(policy_mac=sa.bindparam("b_pmac"), activity_mac=sa.bindparam("b_amac")),
                    [{"b_tenant": r["tenant"], "b_thread": r["thread_id"],
                      "b_pmac": integ.mac(mac.THREAD_POLICY, *mac.thread_policy_parts(r)),
                      "b_amac": integ.mac(mac.THREAD_ACTIVITY, *mac.thread_activity_parts(r))}
                     for r in legacy])
            counts["threads"] = len(legacy)
            for r in conn.execute(sa.select(policies).where(policies.c.mac.is_(None))
                                  ).mappings().all():
                conn.execute(policies.update().where(policies.c.tenant == r["tenant"]).values(
                    mac=integ.mac(mac.POLICY, *mac.policy_parts(r))))
                counts["policies"] += 1
            for table, name in ((receipts, "receipts"), (events, "events")):
                rows = [dict(r) for r in conn.execute(sa.select(table).where(
                    table.c.mac.is_(None)).order_by(table.c.id)).mappings()]
                if not rows:
                    continue
                self._chain(conn, table, rows)
                conn.execute(table.update().where(table.c.id == sa.bindparam("b_id")).values(
                    seq=sa.bindparam("b_seq"), prev_mac=sa.bindparam("b_prev"),
                    mac=sa.bindparam("b_mac")),
                    [{"b_id": r["id"], "b_seq": r["seq"], "b_prev": r["prev_mac"],
                      "b_mac": r["mac"]} for r in rows])
                counts[name] = len(rows)
            counts["idempotency"] = adopt_idempotency_macs(conn, integ)
            if any(counts.values()):
                logger.warning("registry integrity: adopted %s rows written before schema v2",
                               counts)
                self._append_chained(conn, events, [{
                    "at": time.time(), "kind": "registry_rows_adopted", "tenant": None,
                    "thread_id": None, "actor": None,
                    "detail": json.dumps(counts, sort_keys=True)}])

    def ready_for_reading(self, also: Sequence[str] = ()) -> bool:
        """For read-only commands: True when every table and index :meth:`setup` creates (and
        the relations named in ``also``) exists and the stored schema version is this
        library's -- then nothing is created or migrated and the registry counts as set up.
        Two catalog reads, no DDL. False: call :meth:`setup` (it creates or migrates)."""
        if self.integrity.available:   # keyed: setup() also adopts rows older than v2
            return False
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

    def _upsert(self, table: sa.Table) -> Any:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert
            return pg_insert(table)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert
        return sqlite_insert(table)

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
