"""At-rest scan: read every raw row and check what SecureSaver promises about the disk.

Checked, table by table (the inner saver's and every ``securesaver_*`` one):

* no unencrypted channel value (SQLite checkpoint documents, Postgres ``checkpoint_blobs``, and
  no inlined primitive in Postgres' clear ``checkpoint -> 'channel_values'``), no unencrypted
  pending write, no metadata key outside the allowlist, sealed metadata present and sealed;
* no personal data or secret (the redaction recognizers: emails, phone numbers, cards, IBANs,
  national ids, API secrets, ...) in any clear column: thread ids, tenant names, allowlisted
  metadata values, event and receipt details, every text column of every ``securesaver_*``
  table (companions' tables included, even ones this version does not know);
* every ciphertext names a data-key version its tenant has; with a keyring, every key row is
  wrapped by a master version the keyring holds, and ``verify=True`` also authenticates every
  ciphertext against its place (tenant, thread, namespace, channel, ...) and checks every
  checkpoint exactly as a read does (the same :meth:`SealedCodec.verify_tuple`: the sealed
  manifest of the whole checkpoint document, parent link, channel set, clear metadata, blind
  index, and the idx/task binding of its pending writes), so whatever ``get_tuple``/``list``
  refuse, the scan reports.

Nothing stored is evaluated: the inner tables are decoded with the strict serializer (plain
containers and bytes only) and only SecureSaver's own authenticated payloads are parsed further.

A violation says what and where (table, row key, field), never the value: the row key itself is
masked where it holds personal data (``support-<EMAIL_ADDRESS>``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import PARSE_ERRORS as _PARSE_ERRORS
from ..errors import ConfigurationError, SecureSaverError, TamperedDataError
from ..keys.crypto import THREAD_KEY_VERSION, TenantKeys, is_token
from ..keys.tokens import TEXT_PREFIX, from_text, token_key_version
from ..seal import SEALED_METADATA_KEY, _DetachedParent
from ..storage.raw_tables import (
    BlobRow,
    CheckpointRow,
    RawTables,
    TenantIndex,
    WriteRow,
    raw_tables_for,
)
from ..storage.registry_tables import (
    WRAPPED_KEY_COLUMNS,
    RegistryTable,
    count_rows,
    registry_rows,
    registry_tables,
)
from ..storage.sealed_columns import SEALED_COLUMNS
from ..tenancy import ThreadRef
from .clear_text import ClearTextInspector
from .scan_report import ScanReport, Violation

if TYPE_CHECKING:
    from ..services import SaverLike
    from .store_items import StoreRow

logger = logging.getLogger(__name__)

BLIND_KEY_RE = re.compile(r"^ssbi_[0-9a-f]{16}$")
BLIND_VALUE_RE = re.compile(r"^[0-9a-f]{32}$")


class Scanner:
    """One scan of one database. Use :func:`scan`."""

    def __init__(self, saver: SaverLike, *, keyring: Any = None, verify: bool = False,
                 allowlist: Iterable[str] | None = None, redactor: Any = None,
                 page: int = 500, progress: Callable[[int, int], None] | None = None) -> None:
        if verify and keyring is None:
            raise ConfigurationError("verify=True authenticates every ciphertext and needs the "
                                     "keyring")
        self.saver = saver
        self.keyring = keyring
        self.verify = verify
        self.allowlist = frozenset(allowlist if allowlist is not None
                                   else saver.metadata_allowlist)
        self.page = page
        self.progress = progress
        self.raw: RawTables = raw_tables_for(saver.inner)
        self.inspector = ClearTextInspector(redactor)
        self.registry = saver.registry
        self.report = ScanReport(self.raw.backend, time.time())
        self._done = 0
        self._total = 0
        self._keys: dict[str, TenantKeys | None] = {}
        self._data_versions: dict[str, set[int]] = {}
        self._index = TenantIndex([])

    # helpers --------------------------------------------------------------------------------
    def _violation(self, kind: str, table: str, location: str, detail: str = "") -> None:
        self.report.violations.append(Violation(kind, table, location, detail))

    def _advance(self, n: int) -> None:
        self._done += n
        if self.progress:
            self.progress(self._done, self._total)

    def _m(self, text: Any) -> str:
        return self.inspector.mask(str(text))

    def _clear(self, table: str, location: str, column: str, value: Any) -> None:
        """Check a clear value for personal data (report kinds, never the value)."""
        if value is None or isinstance(value, (bool, bytes)):
            return
        kinds = self.inspector.kinds_in(value)
        if kinds:
            self._violation("pii_in_clear_column", table, location,
                            f"column {column}: {', '.join(kinds)}")

    def _tenant_keys(self, tenant: str) -> TenantKeys | None:
        if tenant not in self._keys:
            keys = None
            try:
                keys = self.saver.keys.keys_for(tenant, create=False)
            except SecureSaverError as exc:
                self._violation("key_does_not_unwrap", "securesaver_tenant_keys",
                                f"tenant={self._m(tenant)}", type(exc).__name__)
            self._keys[tenant] = keys
        return self._keys[tenant]

    def _token(self, table: str, location: str, tenant: str | None, token: bytes,
               aad: Callable[[], bytes] | None) -> bytes | None:
        """A ciphertext: its key must exist; with verify, it must authenticate here (its
        plaintext is returned then)."""
        self.report.tokens += 1
        if tenant is None:
            return None
        version = token_key_version(token)
        per = self.report.key_versions.setdefault(tenant, {})
        per[version] = per.get(version, 0) + 1
        if version != THREAD_KEY_VERSION and version not in self._data_versions.get(tenant,
                                                                                      set()):
            self._violation("unknown_data_key", table, location,
                            f"names data key v{version} of tenant {self._m(tenant)}")
            return None
        if self.verify and aad is not None:
            keys = self._tenant_keys(tenant)
            if keys is None:
                return None
            try:
                plain = keys.open(token, aad())
                self.report.verified += 1
                return plain
            except TamperedDataError:
                self._violation("token_fails_authentication", table, location)
        return None

    # sections -------------------------------------------------------------------------------
    def run(self) -> ScanReport:
        started = time.monotonic()
        tenants = self.registry.tenants()
        self._index = TenantIndex(tenants)
        inner_counts = self.raw.counts()
        tables = registry_tables(self.registry.engine)
        reg_counts = {t.name: count_rows(self.registry.engine, t) for t in tables}
        self._total = sum(inner_counts.values()) + sum(reg_counts.values()) + (
            _store_count(self.registry.engine))
        self._check_keys(tenants)
        for name, rows in (("checkpoints", self._scan_checkpoints()),
                           ("checkpoint_blobs", self._scan_blobs()),
                           ("writes", self._scan_writes())):
            if rows or name in inner_counts:
                self.report.rows[self._table_name(name)] = rows
        for table in tables:
            self.report.rows[table.name] = self._scan_registry_table(table)
        store_rows = self._scan_store(tenants)
        if store_rows is not None:
            self.report.rows["store"] = store_rows
        if self.verify:
            self._recount()
        # tenant names are clear columns too: shown masked, like every location
        self.report.key_versions = {self._m(t): v for t, v in self.report.key_versions.items()}
        self.report.duration = time.monotonic() - started
        return self.report

    def _recount(self) -> None:
        """``verify``: the audit summaries against a recount of the raw rows, and the stored
        threads the registry does not know (where the registry shares the database)."""
        from . import summaries
        from .sql import AuditDatabase
        if not self.saver.services.storage.shares_database(self.registry.engine):
            return
        db = AuditDatabase(self.registry)
        if not db.has_inner_tables():
            return
        for f in summaries.recount(db):
            table = ("securesaver_thread_summaries" if f["kind"] == "summary_drift"
                     else self._table_name("checkpoints"))
            where = f"tenant={self._m(f['tenant'])} thread={self._m(f['thread_id'])}"
            self._violation(f["kind"], table, where,
                            f"differs in {', '.join(f['fields'])}" if f["fields"] else "")

    def _table_name(self, name: str) -> str:
        if name == "writes" and self.raw.backend == "postgres":
            return "checkpoint_writes"
        return name

    def _check_keys(self, tenants: list[str]) -> None:
        known = set(self.keyring.versions()) if self.keyring is not None else None
        self.report.keyring_checked = known is not None
        for tenant in tenants:
            rows = self.registry.load_key_rows(tenant)
            self._data_versions[tenant] = {r.version for r in rows if r.purpose == "data"}
            for r in rows:
                self.report.master_versions[r.master_version] = (
                    self.report.master_versions.get(r.master_version, 0) + 1)
                if known is not None and r.master_version not in known:
                    self._violation("unknown_master_key", "securesaver_tenant_keys",
                                    f"tenant={self._m(tenant)} purpose={r.purpose} "
                                    f"version={r.version}",
                                    f"wrapped by master version {self._m(r.master_version)}")
            if self.verify and rows:
                self._tenant_keys(tenant)

    def _where(self, thread_id: str, ns: str) -> tuple[str | None, str, str]:
        tenant, thread = self._index.split(thread_id)
        if tenant is None:
            return None, thread, f"thread={self._m(thread_id)} ns={self._m(ns)!r}"
        return tenant, thread, (f"tenant={self._m(tenant)} thread={self._m(thread)} "
                                f"ns={self._m(ns)!r}")

    def _row_identity(self, table: str, where: str, tenant: str | None, thread_id: str,
                      thread: str, ns: str, seen: set[str]) -> None:
        if thread_id in seen:
            return
        seen.add(thread_id)
        if tenant is None:
            self._violation("unknown_tenant", table, where,
                            "no tenant in the registry has this thread id's tag")
        self._clear(table, where, "thread_id", thread)
        if tenant is not None:
            self._clear(table, where, "tenant", tenant)
        if ns:
            self._clear(table, where, "checkpoint_ns", ns)

    def _scan_checkpoints(self) -> int:
        table = "checkpoints"
        seen: set[str] = set()
        channels_seen: set[str] = set()
        n = 0
        for rows in self.raw.checkpoints(self.page):
            for row in rows:
                self._checkpoint_row(table, row, seen, channels_seen)
            n += len(rows)
            self._advance(len(rows))
        return n

    def _checkpoint_row(self, table: str, row: CheckpointRow, seen: set[str],
                        channels_seen: set[str]) -> None:
        tenant, thread, where = self._where(row.thread_id, row.checkpoint_ns)
        self._row_identity(table, where, tenant, row.thread_id, thread, row.checkpoint_ns, seen)
        where = f"{where} checkpoint={self._m(row.checkpoint_id)}"
        if row.error or row.checkpoint is None or row.metadata is None:
            self._violation("undecodable_row", table, where, row.error or "")
            return
        if row.foreign is not None:
            self._violation("unevaluated_payload", table, where, row.foreign)
        ref = ThreadRef(tenant, thread, row.checkpoint_ns) if tenant else None
        versions = row.channel_versions
        for channel in versions:
            if channel not in channels_seen:
                channels_seen.add(channel)
                self._clear(table, f"{where} channel={self._m(channel)}", "channel_versions",
                            channel)
        for channel, value in row.channel_values.items():
            at = f"{where} channel={self._m(channel)}"
            if self.raw.backend == "postgres":  # SecureSaver's values are bytes: never inline
                self._violation("inline_channel_value", table, at,
                                f"inlined {type(value).__name__}")
                continue
            if not is_token(value):
                self._violation("plaintext_channel_value", table, at,
                                f"stored {type(value).__name__}")
                continue
            self._token(table, at, tenant, value,
                        None if ref is None else self._channel_aad(ref, channel, versions))
        self._metadata(table, where, tenant, ref, row)
        if self.verify and ref is not None:
            self._verify_checkpoint(table, where, ref, row)

    def _verify_checkpoint(self, table: str, where: str, ref: ThreadRef,
                           row: CheckpointRow) -> None:
        """The read path's own check of the whole checkpoint (as get_tuple/list make it)."""
        keys = self._tenant_keys(ref.tenant)
        if keys is None:
            return
        inner = self.saver.inner
        config: Any = {"configurable": {"thread_id": row.thread_id,
                                        "checkpoint_ns": row.checkpoint_ns,
                                        "checkpoint_id": row.checkpoint_id}}
        try:
            tup = inner.get_tuple(config)
            if tup is None:  # deleted since the page was read
                return
            try:
                self.saver.codec.verify_tuple(keys, ref, tup)
            except _DetachedParent as detached:
                parent: Any = {"configurable": {**config["configurable"],
                                                "checkpoint_id": detached.parent}}
                if inner.get_tuple(parent) is not None:
                    raise TamperedDataError(str(detached)) from None
                self.saver.codec.verify_tuple(keys, ref, tup, detached_ok=True)
        except _PARSE_ERRORS as exc:
            self._violation("checkpoint_fails_verification", table, where,
                            self.inspector.mask(str(exc), limit=300))

    def _channel_aad(self, ref: ThreadRef, channel: str, versions: Mapping[str, Any]
                     ) -> Callable[[], bytes]:
        return lambda: self.saver.codec.channel_aad(ref, channel, versions.get(channel))

    def _metadata(self, table: str, where: str, tenant: str | None, ref: ThreadRef | None,
                  row: CheckpointRow) -> None:
        metadata = row.metadata or {}
        sealed = metadata.get(SEALED_METADATA_KEY)
        if sealed is None:
            self._violation("missing_sealed_metadata", table, where)
        elif not isinstance(sealed, str) or not sealed.startswith(TEXT_PREFIX):
            self._violation("plaintext_metadata", table, f"{where} key={SEALED_METADATA_KEY}",
                            f"holds {type(sealed).__name__}")
        else:
            try:
                token = from_text(sealed)
                if not is_token(token):
                    raise TamperedDataError("not a token")
            except TamperedDataError:
                self._violation("plaintext_metadata", table, f"{where} key={SEALED_METADATA_KEY}",
                                "not a valid ciphertext")
            else:
                self._token(table, f"{where} key={SEALED_METADATA_KEY}", tenant, token,
                            None if ref is None else (
                                lambda: self.saver.codec.metadata_aad(ref, row.checkpoint_id)))
        for key, value in metadata.items():
            if key == SEALED_METADATA_KEY:
                continue
            at = f"{where} key={self._m(key)}"
            if key.startswith("ssbi_"):
                if not (BLIND_KEY_RE.match(key) and isinstance(value, str)
                        and BLIND_VALUE_RE.match(value)):
                    self._violation("malformed_blind_index", table, at)
                continue
            if key in self.allowlist:
                self._clear(table, at, "metadata", value)
                continue
            kinds = self.inspector.kinds_in(value)
            self._violation("clear_metadata_key", table, at,
                            f"value ({type(value).__name__}) stored in clear"
                            + (f", holds {', '.join(kinds)}" if kinds else ""))

    def _scan_blobs(self) -> int:
        table = "checkpoint_blobs"
        seen: set[str] = set()
        n = 0
        for rows in self.raw.blobs(self.page):
            for row in rows:
                self._blob_row(table, row, seen)
            n += len(rows)
            self._advance(len(rows))
        return n

    def _blob_row(self, table: str, row: BlobRow, seen: set[str]) -> None:
        tenant, thread, where = self._where(row.thread_id, row.checkpoint_ns)
        self._row_identity(table, where, tenant, row.thread_id, thread, row.checkpoint_ns, seen)
        where = f"{where} channel={self._m(row.channel)} version={self._m(row.version)}"
        if row.type == "empty" and row.blob is None:
            return
        if row.type != "bytes" or not is_token(row.blob):
            self._violation("plaintext_channel_value", table, where, f"stored as {row.type}")
            return
        ref = ThreadRef(tenant, thread, row.checkpoint_ns) if tenant else None
        self._token(table, where, tenant, row.blob or b"", None if ref is None else (
            lambda: self.saver.codec.channel_aad(ref, row.channel, row.version)))

    def _scan_writes(self) -> int:
        table = self._table_name("writes")
        seen: set[str] = set()
        n = 0
        for rows in self.raw.writes(self.page):
            for row in rows:
                self._write_row(table, row, seen)
            n += len(rows)
            self._advance(len(rows))
        return n

    def _write_row(self, table: str, row: WriteRow, seen: set[str]) -> None:
        tenant, thread, where = self._where(row.thread_id, row.checkpoint_ns)
        self._row_identity(table, where, tenant, row.thread_id, thread, row.checkpoint_ns, seen)
        where = (f"{where} checkpoint={self._m(row.checkpoint_id)} task={self._m(row.task_id)} "
                 f"idx={row.idx} channel={self._m(row.channel)}")
        if row.type != "bytes" or not is_token(row.value):
            self._violation("plaintext_write", table, where, f"stored as {row.type}")
            return
        ref = ThreadRef(tenant, thread, row.checkpoint_ns) if tenant else None
        plain = self._token(table, where, tenant, row.value or b"", None if ref is None else (
            lambda: self.saver.codec.write_aad(ref, row.checkpoint_id, row.task_id,
                                               row.channel)))
        if plain is not None:
            try:
                path, idx, _n, _specials, _body = self.saver.codec.split_write(plain)
            except TamperedDataError as exc:
                self._violation("write_moved", table, where, str(exc))
                return
            # PostgreSQL's upsert of a special write (interrupt, resume, error) keeps the
            # row's first task path when a later call under the task id names another; reads
            # order those by the sealed path, so only a regular write's path must match
            if idx != row.idx or (path != row.task_path and row.idx >= 0):
                self._violation("write_moved", table, where,
                                "sealed for idx/task path "
                                + ("(idx differs)" if idx != row.idx else "(task path differs)"))

    def _scan_store(self, tenants: list[str]) -> int | None:
        """SecureStore's items (LangGraph's ``store`` table on this database), if any."""
        from .store_items import has_store_table, iter_store_rows
        engine = self.registry.engine
        if not has_store_table(engine):
            return None
        n = 0
        for rows in iter_store_rows(engine, tenants, page=self.page):
            for row in rows:
                self._store_row(row)
            n += len(rows)
            self._advance(len(rows))
        return n

    def _store_row(self, row: StoreRow) -> None:
        table = "store"
        ns = ".".join(row.namespace)
        where = f"namespace={self._m(ns)!r} key={self._m(row.key)}"
        if row.tenant is None:
            self._violation("unknown_tenant", table, where,
                            "the namespace's first label is no known tenant's tag")
        else:
            where = f"tenant={self._m(row.tenant)} {where}"
        self._clear(table, where, "prefix", list(row.namespace))
        self._clear(table, where, "key", row.key)
        if row.problem is not None or row.token is None:
            self._violation("plaintext_store_value", table, where, row.problem or "")
            return
        if row.malformed_blind:
            self._violation("malformed_blind_index", table, where)
        tenant = row.tenant
        aad: Callable[[], bytes] | None = None
        if tenant is not None:
            from ..storage.store_format import item_aad, sealed_aad
            aad = lambda: sealed_aad(item_aad(  # noqa: E731
                self.saver.services.database_id(), tenant, row.namespace, row.key), row.blind,
                row.version)
        self._token(table, where, tenant, row.token, aad)

    def _scan_registry_table(self, table: RegistryTable) -> int:
        n = 0
        engine = self.registry.engine
        for rows in registry_rows(engine, table, self.page):
            for row in rows:
                self._registry_row(table, row)
            n += len(rows)
            self._advance(len(rows))
        return n

    def _registry_row(self, table: RegistryTable, row: Mapping[str, Any]) -> None:
        where = " ".join(f"{k}={self._m(row.get(k))}" for k in table.key_columns[:4])
        for column in table.text_columns:
            self._clear(table.name, where, column, row.get(column))
        tenant = row.get("tenant") if isinstance(row.get("tenant"), str) else None
        for column in table.binary_columns:
            value = row.get(column)
            if value is None or (table.name, column) in WRAPPED_KEY_COLUMNS:
                continue
            value = bytes(value)
            at = f"{where} column={column}"
            if not is_token(value):
                kinds = self.inspector.kinds(value.decode("utf-8", "ignore"))
                self._violation("plaintext_binary", table.name, at,
                                f"{len(value)} bytes, no ciphertext header"
                                + (f", holds {', '.join(kinds)}" if kinds else ""))
                continue
            spec = SEALED_COLUMNS.get((table.name, column))
            aad: Callable[[], bytes] | None = None
            if spec is not None:
                aad = partial(spec.aad, row)
            self._token(table.name, at, tenant, value, aad)


def _store_count(engine: Any) -> int:
    from .store_items import count_store_rows, has_store_table
    return count_store_rows(engine) if has_store_table(engine) else 0


def native_storage(saver: SaverLike) -> bool:
    """Whether SecureSaver knows the inner saver's storage (InMemory, SQLite, PostgreSQL):
    the scan reads those tables itself; any other saver is scanned through its API."""
    from ..storage.ops import StorageOps
    return type(saver.services.storage) is not StorageOps


def scan(saver: SaverLike, *, keyring: Any = None, verify: bool = False,
         allowlist: Iterable[str] | None = None, redactor: Any = None, page: int = 500,
         progress: Callable[[int, int], None] | None = None) -> ScanReport:
    """Scan the raw tables behind ``saver`` (see the module docstring).

    ``keyring``: also check every key row's master version against it (``saver.keyring`` is
    not assumed: pass the keyring you mean to keep). ``verify``: authenticate every ciphertext
    (needs ``keyring`` to be the saver's keyring). ``allowlist``: clear metadata keys that are
    fine (default: the saver's). ``progress(done, total)`` is called after every page.
    Operator only: refused inside a tenant scope (it reads every tenant's rows).
    """
    saver.services.gate.admin_tenant("scan", operator_only=True)
    if not native_storage(saver):  # MySQL, Redis, LMDB, object storage, your own
        from .api_scan import scan_through_api
        return scan_through_api(saver, progress=progress)
    return Scanner(saver, keyring=keyring, verify=verify, allowlist=allowlist,
                   redactor=redactor, page=page, progress=progress).run()
