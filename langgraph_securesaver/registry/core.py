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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..errors import ConfigurationError, KeyringRequired, TamperedDataError
from ..retention import DEFAULT_POLICY_KEY, NO_RETENTION, RetentionPolicy
from . import integrity as mac
from .claims import RegistryClaims
from .denials import flush_for
from .direct_reads import DirectReads
from .integrity import GENESIS, RESERVED_TENANT, RegistryIntegrity, row_tag
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
from .verify import (  # noqa: F401 - IntegrityReport was defined here
    IntegrityReport,
    RegistryVerification,
)
from .wrapped_keys import RegistryKeys

logger = logging.getLogger(__name__)


class Registry(RegistryKeys, RegistryClaims, RegistryVerification):
    """Thread-safe access to SecureSaver's tables. Async callers run these in a worker thread."""

    def __init__(self, engine: Engine | str) -> None:
        self.engine = create_registry_engine(engine) if isinstance(engine, str) else engine
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
                     policy: RetentionPolicy | None = None, state: str = "active") -> None:
        """Register a thread (first write, with the given effective policy) or move its last
        activity forward and recompute its expiry from its stored TTLs. ``state``: "active"
        for a write (it also clears an ``emptied`` mark); "emptied" for ``delete_for_runs``
        leaving the thread without a checkpoint (:meth:`mark_emptied`)."""
        now = float(time.time() if now is None else now)
        policy = policy or NO_RETENTION
        integ = self._keyed()
        row = {"tenant": tenant, "thread_id": thread_id, "created_at": now, "last_activity": now,
               **policy.as_row(), "policy_source": "default",
               "expires_at": policy.expires_at(now, now), "state": state}
        row["policy_mac"] = integ.mac(mac.THREAD_POLICY, *mac.thread_policy_parts(row))
        row["activity_mac"] = integ.mac(mac.THREAD_ACTIVITY, *mac.thread_activity_parts(row))
        stmt = self._upsert(threads).values(**row)
        last = self._greatest(threads.c.last_activity, stmt.excluded.last_activity)
        stmt = stmt.on_conflict_do_update(
            index_elements=[threads.c.tenant, threads.c.thread_id],
            set_={
                "last_activity": last,
                # the MAC moves with the value it covers (SET sees the old row on both backends)
                "activity_mac": sa.case(
                    (stmt.excluded.last_activity > threads.c.last_activity,
                     stmt.excluded.activity_mac), else_=threads.c.activity_mac),
                "expires_at": expires_expr(threads.c.created_at, last, threads.c.idle_ttl,
                                           threads.c.max_age, threads.c.legal_hold),
                "state": sa.case((threads.c.state == "deleting", "deleting"), else_=state),
            },
        )
        with self.begin() as conn:
            conn.execute(stmt)

    def mark_emptied(self, tenant: str, thread_ids: Sequence[str], now: float | None = None,
                     policy: RetentionPolicy | None = None) -> None:
        """``delete_for_runs`` left these threads without a checkpoint: mark them
        ``emptied`` (their last activity moves to ``now``). The retention sweep deletes such
        a thread -- key included -- once it has stayed empty and unwritten for its grace
        (:meth:`..ops.pruner.Sweep.emptied_grace`); a write first clears the mark."""
        for thread_id in thread_ids:
            self.touch_thread(tenant, thread_id, now=now, policy=policy, state="emptied")

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
        found.discard(RESERVED_TENANT)  # the registry MAC key, not a tenant
        return sorted(found)

    def forget_thread(self, tenant: str, thread_id: str) -> None:
        """Drop a deleted thread's registry and subject rows (no receipt)."""
        from .schema import thread_subjects
        with self.begin() as conn:
            conn.execute(threads.delete().where(
                threads.c.tenant == tenant, threads.c.thread_id == thread_id))
            conn.execute(thread_subjects.delete().where(
                thread_subjects.c.tenant == tenant, thread_subjects.c.thread_id == thread_id))

    # retention policies ---------------------------------------------------------------------
    def set_policy(self, tenant: str, policy: RetentionPolicy | None) -> None:
        """Store the default (tenant ``"*"``) or a tenant's policy and re-derive the expiry of
        every thread that follows it (threads with their own override keep it)."""
        integ = self._keyed()
        with self.begin() as conn:
            conn.execute(policies.delete().where(policies.c.tenant == tenant))
            if policy is not None:
                row = {"tenant": tenant, **policy.as_row()}
                conn.execute(policies.insert().values(
                    updated_at=time.time(), mac=integ.mac(mac.POLICY, *mac.policy_parts(row)),
                    **row))
            self._reapply(conn, tenant)

    def get_policy(self, tenant: str) -> RetentionPolicy | None:
        """A stored policy; with the keyring attached, one whose MAC does not verify is
        refused with TamperedDataError (key-less readers such as audit get it unverified)."""
        with self.begin() as conn:
            r = conn.execute(sa.select(policies).where(policies.c.tenant == tenant)
                             ).mappings().first()
        if r is None:
            return None
        self._check_policy(r)
        return RetentionPolicy(r["idle_ttl"], r["max_age"], r["strategy"], r["legal_hold"])

    def _check_policy(self, r: Any) -> None:
        if self.integrity.available and not self.integrity.check(
                r["mac"], mac.POLICY, *mac.policy_parts(r)):
            raise TamperedDataError(
                f"securesaver_policies row {_policy_ref(r['tenant'])} does not verify (altered "
                "or inserted without the registry key); refusing to apply it")

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
        if row is not None:
            self._check_policy(row)
        values = ({"idle_ttl": row["idle_ttl"], "max_age": row["max_age"],
                   "strategy": row["strategy"], "legal_hold": bool(row["legal_hold"])}
                  if row is not None else NO_RETENTION.as_row())
        # only rows that change are rewritten (and re-MACed); a row whose MAC does not verify
        # is left as it is (reported by `events --verify`, refused by the pruner): re-MACing
        # it would launder a forged created_at
        changed = sa.or_(threads.c.policy_source != source, threads.c.policy_mac.is_(None),
                         *(threads.c[k].is_distinct_from(v) for k, v in values.items()))
        integ = self.integrity
        updates = []
        for r in conn.execute(sa.select(threads).where(where, changed)).mappings():
            if not integ.check(r["policy_mac"], mac.THREAD_POLICY, *mac.thread_policy_parts(r)):
                logger.error("securesaver_threads row %s does not verify; its retention was "
                             "not re-applied", _thread_ref(r["tenant"], r["thread_id"]))
                continue
            new = {**r, **values, "policy_source": source}
            updates.append({"b_tenant": r["tenant"], "b_thread": r["thread_id"],
                            "b_mac": integ.mac(mac.THREAD_POLICY, *mac.thread_policy_parts(new))})
        if updates:
            pk = (threads.c.tenant == sa.bindparam("b_tenant"),
                  threads.c.thread_id == sa.bindparam("b_thread"))
            conn.execute(threads.update().where(*pk).values(
                policy_source=source, policy_mac=sa.bindparam("b_mac"), **values), updates)
            conn.execute(threads.update().where(*pk).values(expires_at=expires_expr(
                threads.c.created_at, threads.c.last_activity, threads.c.idle_ttl,
                threads.c.max_age, threads.c.legal_hold)),
                [{"b_tenant": u["b_tenant"], "b_thread": u["b_thread"]} for u in updates])

    def set_thread_retention(self, tenant: str, thread_id: str, **changes: Any) -> ThreadRow:
        """Per-thread override of idle_ttl / max_age / strategy / legal_hold. A row whose MAC
        does not verify is refused (re-MACing it would launder the forged fields)."""
        integ = self._keyed()
        pk = (threads.c.tenant == tenant, threads.c.thread_id == thread_id)
        with self.begin() as conn:
            q = sa.select(threads).where(*pk)
            if self.dialect == "postgresql":
                q = q.with_for_update()
            current = conn.execute(q).mappings().first()
            if current is None:
                raise LookupError(f"tenant {tenant!r} has no thread {thread_id!r}")
            if not integ.check(current["policy_mac"], mac.THREAD_POLICY,
                               *mac.thread_policy_parts(current)):
                raise TamperedDataError(
                    f"securesaver_threads row {_thread_ref(tenant, thread_id)} does not verify "
                    "(altered or inserted without the registry key); refusing to change it")
            new = {**current, **changes, "policy_source": "thread"}
            conn.execute(threads.update().where(*pk).values(
                policy_source="thread", **changes,
                policy_mac=integ.mac(mac.THREAD_POLICY, *mac.thread_policy_parts(new))))
            conn.execute(threads.update().where(*pk).values(expires_at=expires_expr(
                threads.c.created_at, threads.c.last_activity, threads.c.idle_ttl,
                threads.c.max_age, threads.c.legal_hold)))
        row = self.get_thread(tenant, thread_id)
        if row is None:  # deleted concurrently
            raise LookupError(f"tenant {tenant!r} has no thread {thread_id!r}")
        return row

    # receipts ---------------------------------------------------------------------------------
    def _insert_receipt(self, conn: Connection, receipt: dict[str, Any]) -> None:
        self.insert_receipts(conn, [receipt])

    def insert_receipts(self, conn: Connection, batch: Sequence[dict[str, Any]]) -> None:
        """Every receipt is written here, inside the caller's transaction: one chain step per
        tenant and one statement for a whole batch (the pruner writes hundreds at once).

        The per-tenant chain heads are locked (and advanced) here, so call this as the LAST
        statement before the commit: concurrent pruners then hold a head only for the insert
        and the commit. Call ``_keyed()`` before opening the transaction."""
        if not batch:
            return
        now = time.time()
        rows = []
        for receipt in batch:
            fields = dict(receipt)
            detail = fields.pop("detail", {})
            rows.append({"receipt_id": uuid.uuid4().hex, "deleted_at": now,
                         "thread_id": None, "requested_by": None, **fields,
                         "detail": json.dumps(detail, default=str, sort_keys=True)})
        names = [c.name for c in receipts.columns if c.name != "id"]
        extra = {k for r in rows for k in r} - set(names)
        if extra:
            raise ConfigurationError(f"unknown receipt fields {sorted(extra)}")
        self._chain(conn, receipts, rows)  # gives each row seq, prev_mac and mac
        if self.dialect == "postgresql" and len(rows) > 1:
            # one statement, one array parameter per column (not 12 parameters per receipt);
            # unnest keeps the order, so ids follow the chain order within a batch
            from sqlalchemy.dialects.postgresql import ARRAY
            arrays = [sa.literal([r.get(n) for r in rows], ARRAY(receipts.c[n].type))
                      for n in names]
            conn.execute(receipts.insert().from_select(
                names, sa.select(*[sa.func.unnest(a) for a in arrays])))
            return
        conn.execute(receipts.insert(), rows)

    def add_receipt(self, **receipt: Any) -> None:
        self.add_receipts([receipt])

    def add_receipts(self, batch: Sequence[dict[str, Any]]) -> None:
        """Write several receipts in one transaction (each a dict like add_receipt's kwargs)."""
        if not batch:
            return
        self._keyed()
        with self.begin() as conn:
            self.insert_receipts(conn, batch)

    # hash chains ------------------------------------------------------------------------------
    def _keyed(self) -> RegistryIntegrity:
        """The integrity helper with its key loaded (before a transaction is opened: loading
        may create the key row, which must not wait on our own write lock)."""
        self.integrity.require()
        return self.integrity

    def _append_chained(self, conn: Connection, table: sa.Table,
                        rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        self._chain(conn, table, rows)
        conn.execute(table.insert(), rows)

    def _chain(self, conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
        """Give ``rows`` (in order) their chain position, previous MAC and MAC, per tenant.

        The chain head rows are the lock: an upsert (a no-op update when the head exists)
        returns them, taking the database write lock on SQLite before anything is read and the
        heads' row locks on PostgreSQL until commit. Heads are locked in sorted chain order, so
        concurrent batches cannot deadlock on each other; appends to one chain are serialized,
        so each chain's order is total (``seq``) whatever the number of writers. On
        PostgreSQL a batch's heads are locked and advanced with one statement each (not two
        per tenant)."""
        integ = self.integrity
        domain, parts = ((mac.EVENT, mac.event_parts) if table is events
                         else (mac.RECEIPT, mac.receipt_parts))
        by_chain: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_chain.setdefault(row.get("tenant") or "", []).append(row)
        chains = sorted(by_chain)
        heads = self._lock_heads(conn, table.name, chains)
        advanced: list[tuple[str, int, str, str]] = []
        for chain in chains:
            seq, prev, head_mac = heads[chain]
            if not integ.check(head_mac, mac.HEAD,
                               *mac.head_parts(table.name, chain, seq, prev)):
                # never build on a forged head (it could hide deleted rows): the next row
                # carries a marked prev_mac, so `events --verify` reports the break there
                logger.error("the chain head of %s chain %s does not verify", table.name,
                             row_tag(chain))
                prev = "!" + prev[:63]
            for row in by_chain[chain]:
                seq += 1
                row["seq"], row["prev_mac"] = seq, prev
                row["mac"] = prev = integ.mac(domain, *parts(row))
            advanced.append((chain, seq, prev, integ.mac(
                mac.HEAD, *mac.head_parts(table.name, chain, seq, prev))))
        self._store_heads(conn, table.name, advanced)

    def _lock_heads(self, conn: Connection, tbl: str, chains: list[str]
                    ) -> dict[str, tuple[int, str, str]]:
        """Lock (creating at position 0 when missing) the heads of ``chains`` (sorted);
        returns chain -> (seq, mac, head_mac) as committed by the previous appender."""
        integ = self.integrity
        genesis = [integ.mac(mac.HEAD, *mac.head_parts(tbl, c, 0, GENESIS)) for c in chains]
        found: dict[str, tuple[int, str, str]] = {}
        if self.dialect == "postgresql" and len(chains) > 1:
            result = conn.execute(sa.text(
                "INSERT INTO securesaver_chain_heads (tbl, chain, seq, mac, head_mac) "
                "SELECT :tbl, u.c, 0, '', u.h FROM unnest(CAST(:chains AS text[]), "
                "CAST(:genesis AS text[])) AS u(c, h) ORDER BY u.c "
                "ON CONFLICT (tbl, chain) DO UPDATE SET seq = securesaver_chain_heads.seq "
                "RETURNING chain, seq, mac, head_mac"),
                {"tbl": tbl, "chains": chains, "genesis": genesis})
            for chain, seq, prev, head_mac in result:
                found[chain] = (int(seq), str(prev), str(head_mac))
            return found
        for chain, first in zip(chains, genesis, strict=True):
            head = conn.execute(self._upsert(chain_heads).values(
                tbl=tbl, chain=chain, seq=0, mac=GENESIS, head_mac=first,
            ).on_conflict_do_update(
                index_elements=[chain_heads.c.tbl, chain_heads.c.chain],
                set_={"seq": chain_heads.c.seq},
            ).returning(chain_heads.c.seq, chain_heads.c.mac, chain_heads.c.head_mac)).one()
            found[chain] = (int(head.seq), str(head.mac), str(head.head_mac))
        return found

    def _store_heads(self, conn: Connection, tbl: str,
                     heads: list[tuple[str, int, str, str]]) -> None:
        if self.dialect == "postgresql" and len(heads) > 1:
            conn.execute(sa.text(
                "UPDATE securesaver_chain_heads h SET seq = u.s, mac = u.m, head_mac = u.hm "
                "FROM unnest(CAST(:chains AS text[]), CAST(:seqs AS bigint[]), "
                "CAST(:macs AS text[]), CAST(:hmacs AS text[])) AS u(c, s, m, hm) "
                "WHERE h.tbl = :tbl AND h.chain = u.c"),
                {"tbl": tbl, "chains": [h[0] for h in heads], "seqs": [h[1] for h in heads],
                 "macs": [h[2] for h in heads], "hmacs": [h[3] for h in heads]})
            return
        for chain, seq, last, head_mac in heads:
            conn.execute(chain_heads.update().where(
                chain_heads.c.tbl == tbl, chain_heads.c.chain == chain).values(
                seq=seq, mac=last, head_mac=head_mac))

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
        self._keyed()
        with self.begin() as conn:
            self._append_chained(conn, events, [{
                "at": time.time(), "kind": kind, "tenant": tenant, "thread_id": thread_id,
                "actor": actor, "detail": json.dumps(detail, default=str, sort_keys=True)}])

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
