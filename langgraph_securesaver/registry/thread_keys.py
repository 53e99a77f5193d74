"""Per-thread data keys: the bottom of the key hierarchy, and what deletion destroys.

Key provider -> tenant KEK (a random key per tenant and master version, a ``kek`` row of
``securesaver_tenant_keys`` wrapped by the provider) -> **one random data key per thread**,
wrapped locally by the tenant KEK and stored in ``securesaver_thread_keys`` (its
``master_version`` names the KEK's), bound to (database, tenant, thread). A new thread costs
no key-provider call once its tenant's KEK is cached (a KMS or HSM is asked once per tenant
and master version per cache lifetime, not once per thread).

Everything SecureSaver seals for a thread -- channel values, pending writes,
sealed metadata, idempotency results and recovery records -- is sealed under it (see
:meth:`..keys.crypto.TenantKeys.seal`). Deleting a thread deletes its key row in the same operation,
so whatever of the thread survives in storage (a WAL, free pages, dead tuples, a backup)
names a key the live registry no longer holds. The wrapped key row itself may survive the
same way (PostgreSQL keeps dead tuples until VACUUM reuses their space, backups copy it); it
opens only under the KEK that wrapped it, and that KEK only under its master version: the
next erasure epoch (``rotate-keys --retire-old``: live keys moved to a new KEK under the new
master version, the old KEK row deleted, the old master version destroyed) takes both away.
A KEK is never rewrapped under another master version, only replaced.

PII-vault values get the same treatment one level over: each vault entry (one value of a
tenant) has its own key in ``securesaver_pii_keys``, deleted with the value (``forget_pii``,
or the last thread that used it being deleted).

Unwrapped keys are cached per process (bounded LRU, re-read after ``ttl`` seconds), so a
turn costs no registry read; the first turn of a cold thread reads (or creates) its row. A
write relies on a cached thread key only within its write lease (:meth:`confirm`), and no key
row is inserted under a KEK that is going away: both checks sit in a registry transaction the
write makes anyway (docs/key-lifecycle.md).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import KeyGoneError, TamperedDataError
from ..keys.crypto import KeyManager, KeyRow, kek_unwrap, kek_wrap, row_context, wrap_context
from ..keys.lifecycle import KEY_CACHE_TTL, RETIRING_MASTERS
from ..keys.provider import WrappedKey
from ..keys.tokens import ENTRY, ITEM, KEK, THREAD, thread_key_context
from . import item_versions
from .core import Registry
from .dialects import delete_returning
from .pii_lookups import LookupKeys
from .schema import (
    meta_table,
    pairs_in,
    pii_keys,
    store_keys,
    store_versions,
    tenant_keys,
    thread_keys,
)
from .wrapped_keys import retiring_versions

logger = logging.getLogger(__name__)

_REWRAP_BATCH = 2000
#: scope -> (table, the column naming the thread, the token or the store item)
TABLES: dict[str, tuple[sa.Table, sa.Column[Any]]] = {
    THREAD: (thread_keys, thread_keys.c.thread_id), ENTRY: (pii_keys, pii_keys.c.token),
    ITEM: (store_keys, store_keys.c.item)}


#: how often a put reads or creates its item's key row again when other threads or processes
#: keep deleting the item meanwhile, before it gives up (KeyGoneError, nothing stored)
_ITEM_KEY_TRIES = 100

def _as_bytes(table: sa.Table) -> Any:
    return sa.cast(table.c.wrapped, sa.LargeBinary).label("wrapped")


def mark_retiring(registry: Registry, current: str, versions: Sequence[str]) -> None:
    """Before a rotation moves keys to master version ``current``: record every other of
    ``versions`` as retiring. From the commit on, no transaction inserts a key row under them
    (:meth:`ThreadKeyStore.require_live_kek`, ``Registry.insert_key_rows``); one that read the
    mark before holds its row lock until it commits, so what it inserted is visible to the
    rewrap that follows."""
    with registry.begin() as conn:
        registry._insert_ignore(conn, meta_table, [{"key": RETIRING_MASTERS, "value": ""}])
        old = conn.execute(sa.select(meta_table.c.value).where(
            meta_table.c.key == RETIRING_MASTERS).with_for_update()).scalar()
        keep = [v for v in str(old or "").split(",") if v and v != current]
        keep += [str(v) for v in versions if str(v) != current and str(v) not in keep]
        while len(",".join(keep)) > 250:   # the column's width: the oldest marks go first
            keep.pop(0)
        conn.execute(meta_table.update().where(meta_table.c.key == RETIRING_MASTERS).values(
            value=",".join(keep)))


class ThreadKeyStore:
    """Creates, unwraps, caches and destroys per-thread data keys (thread-safe)."""

    def __init__(self, keys: KeyManager, registry: Registry, *, cache_size: int = 20_000,
                 ttl: float = KEY_CACHE_TTL, seal: bool = True) -> None:
        self.sealing = seal
        self.keys = keys
        self.registry = registry
        self.cache_size = cache_size
        self.ttl = ttl
        #: (scope, tenant, name) -> (loaded at, the key, its row's created_at: which key)
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, AESGCM, float]] = (
            OrderedDict())
        #: (tenant, master version) -> (loaded at, the tenant's KEK under that version)
        self._keks: dict[tuple[str, str], tuple[float, AESGCM]] = {}
        self._kek_lock = threading.Lock()
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        #: (scope, tenant, name) -> created_at of the key this process last read or made
        #: for it (outlives the cache entry: what :meth:`confirm` compares)
        self._born: dict[tuple[str, str, str], float] = {}
        #: called with (scope, tenant, name) whenever a key is read from the registry (a
        #: cold or expired cache entry): what others cache per thread is re-read with it
        self.on_load: list[Callable[[str, str, str], None]] = []
        #: the tenants' PII lookup keys (one per master version, replaced by the epoch)
        self.lookups = LookupKeys(keys, registry, ttl=ttl)

    def __repr__(self) -> str:  # never key material
        return f"ThreadKeyStore(cached={len(self._cache)})"

    # the key of one thread (or vault entry) ---------------------------------------------------
    def key(self, tenant: str, scope: str, name: str, create: bool,
            columns: dict[str, Any] | None = None) -> AESGCM | None:
        """The data key of thread (or vault entry, or store item) ``name``; created when
        missing and ``create`` (a write; ``columns``: the new row's other columns), else None
        (deleted, or never written under its own key)."""
        k = (scope, tenant, name)
        hit = self._cache.get(k)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        with self._load_lock:
            hit = self._cache.get(k)
            if hit is not None and time.monotonic() - hit[0] < self.ttl:
                return hit[1]
            row = self._load(scope, tenant, name)
            for hook in self.on_load:
                hook(scope, tenant, name)
            if row is None:
                if not create:
                    self._drop([k])
                    return None
                created = self._create_retrying(scope, tenant, name, columns or {})
                if created is None:   # deleted between the insert and the read
                    return None
                row = created[0]
            return self._unwrapped(scope, tenant, name, row)

    def _unwrapped(self, scope: str, tenant: str, name: str,
                   row: tuple[str, bytes, float]) -> AESGCM:
        """The key a row (master version, wrapped key, created_at) holds, unwrapped and
        cached."""
        k = (scope, tenant, name)
        kek = self.kek(tenant, row[0], create=False)
        if kek is None:
            raise TamperedDataError(
                f"a {scope} key of tenant {tenant!r} names a key-encryption key the "
                "registry does not hold (retired, shredded, or copied from elsewhere)")
        aes = kek_unwrap(kek, row[1], thread_key_context(
            self.registry.database_id(), tenant, name, scope))
        with self._lock:
            self._cache[k] = (time.monotonic(), aes, row[2])
            self._cache.move_to_end(k)
            self._remember_born(k, row[2])
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return aes

    def confirm(self, conn: Any, tenant: str, thread_id: str) -> bool:
        """In the transaction of a write's lease (the thread's registry touch): drop the cached
        key of the thread unless it is still the thread's key row (deleted, or deleted and
        created again by another process since it was cached). The write then seals under
        the key it reads or creates after this. False while the key this process last used
        for the thread (cached or not) is not the thread's key row: until the process
        reads or creates the thread's current key, writes that continue what it read before
        are refused (``WritePath._activity``)."""
        k = (THREAD, tenant, thread_id)
        known = self._born.get(k)
        if known is None:
            return True
        born = conn.execute(sa.select(thread_keys.c.created_at).where(
            thread_keys.c.tenant == tenant, thread_keys.c.thread_id == thread_id)).scalar()
        if born is None or float(born) != known:
            self._drop([k])   # the key this process last used is not the thread's any more
            return False
        return True

    # store items: a key and a version each ----------------------------------------------------
    def item_key(self, tenant: str, item: str, owner: str, store: str
                 ) -> tuple[AESGCM, float, item_versions.Version]:
        """For a put of SecureStore ``item`` into ``store`` (:func:`.item_versions.store_id`):
        its key (the row read, or created; ``owner``: the digest of the item's first
        namespace label, what ``forget_subject`` finds a subject's items by, expired ones
        included), which key row it is (``created_at``) and the version the item is at
        there, read with it (:func:`.item_versions.read_key`). Never from the cache: a put
        sealed under a key another process destroyed since would leave, if its process died
        before :meth:`confirm_items`, a row no key opens."""
        k = (ITEM, tenant, item)
        for _ in range(_ITEM_KEY_TRIES):
            found = item_versions.read_key(self.registry, tenant, item, store)
            if found is None:     # a new item (or deleted meanwhile): its row
                self._drop([k])
                created = self._create_retrying(ITEM, tenant, item, {"owner": owner})
                if created is not None and created[1]:   # made here: no version yet
                    return self._unwrapped(ITEM, tenant, item, created[0]), created[0][2], \
                        (0, "")
                continue          # another put made it: read it, with its version
            row, version = found
            hit = self._cache.get(k)
            if hit is not None and hit[2] == row[2]:
                return hit[1], row[2], version
            return self._unwrapped(ITEM, tenant, item, row), row[2], version
        raise KeyGoneError(f"the key of a store item of tenant {tenant!r} was deleted while "
                           f"it was being written, {_ITEM_KEY_TRIES} times; nothing was stored, "
                           "retry")

    def confirm_items(self, requests: Sequence[tuple[
            str, str, dict[str, tuple[float, item_versions.Version]]]]) -> list[list[str]]:
        """:func:`.item_versions.confirm_many`; the cached keys of the items it refuses are
        dropped (the caller seals those puts again)."""
        refused = item_versions.confirm_many(self.registry, requests)
        self._drop([(ITEM, tenant, name) for (tenant, _s, _w), names in zip(
            requests, refused, strict=True) for name in names])
        return refused

    def cached_born(self, tenant: str, item: str) -> float | None:
        """Which key row the cached key of store ``item`` is (its ``created_at``)."""
        hit = self._cache.get((ITEM, tenant, item))
        return None if hit is None else hit[2]

    def reread_item(self, tenant: str, item: str) -> str:
        """After a store item failed to open: its key row read again. ``"gone"`` (no key
        row: the item was deleted, concurrently or before a copy was put back),
        ``"changed"`` (another key than the one cached: deleted and written again
        meanwhile; try again) or ``"same"`` (the item itself is at fault)."""
        k = (ITEM, tenant, item)
        before = self._cache.get(k)
        self._drop([k])
        if self.key(tenant, ITEM, item, False) is None:
            return "gone"
        after = self._cache.get(k)
        if before is None or after is None or after[2] != before[2]:
            return "changed"
        return "same"

    def _remember_born(self, k: tuple[str, str, str], born: float) -> None:
        if len(self._born) > 4 * self.cache_size:
            self._born.clear()
        self._born[k] = born

    def refreshed(self, tenant: str, scope: str, name: str) -> AESGCM | None:
        """After a ciphertext failed to open under the cached key of ``name``: its key row read
        again, when that is another key than the cached one (another process deleted the
        thread and wrote it again); None otherwise. At most once a second per key, so
        forged ciphertexts cannot turn reads into registry reads."""
        k = (scope, tenant, name)
        hit = self._cache.get(k)
        if hit is None or time.monotonic() - hit[0] < 1.0:
            return None
        self._drop([k])
        aes = self.key(tenant, scope, name, False)
        new = self._cache.get(k)
        return None if aes is None or new is None or new[2] == hit[2] else aes

    def cached(self, tenant: str, thread_id: str, scope: str = THREAD) -> bool:
        """Whether the thread's (or item's) key is in this process's cache (and fresh)."""
        hit = self._cache.get((scope, tenant, thread_id))
        return hit is not None and time.monotonic() - hit[0] < self.ttl

    def _load(self, scope: str, tenant: str, name: str) -> tuple[str, bytes, float] | None:
        table, col = TABLES[scope]
        with self.registry.read() as conn:
            # CAST: text a database writer put there reads as bytes that fail to unwrap
            row = conn.execute(sa.select(table.c.master_version, _as_bytes(table),
                                         table.c.created_at).where(
                table.c.tenant == tenant, col == name)).first()
        return None if row is None else (str(row[0]), bytes(row[1]), float(row[2]))

    def _create_retrying(self, scope: str, tenant: str, name: str, columns: dict[str, Any]
                         ) -> tuple[tuple[str, bytes, float], bool] | None:
        """:meth:`_create`; when the KEK it used is going away (another process rotates), once
        more after re-reading the KEKs and reloading the key provider (KeyGoneError if that
        does not help: nothing was stored)."""
        generation = self.keys._provider_generation
        try:
            return self._create(scope, tenant, name, columns)
        except KeyGoneError:
            with self._kek_lock:
                self._keks = {k: v for k, v in self._keks.items() if k[0] != tenant}
            self.keys._reload_provider(generation)
            return self._create(scope, tenant, name, columns)

    def _create(self, scope: str, tenant: str, name: str, columns: dict[str, Any]
                ) -> tuple[tuple[str, bytes, float], bool] | None:
        """Insert a new key row unless one exists, and read back the row that stands (another
        process may have won the race) and whether it is the one inserted here, in one
        transaction -- which also checks that the KEK the new row names is live
        (:meth:`require_live_kek`), or rolls back."""
        table, col = TABLES[scope]
        version = self.keys.provider.current_version
        kek = self.kek(tenant, version, create=True)
        if kek is None:  # pragma: no cover - create=True returns a KEK or raises
            raise TamperedDataError(f"tenant {tenant!r} has no key-encryption key")
        blob = kek_wrap(kek, secrets.token_bytes(32), thread_key_context(
            self.registry.database_id(), tenant, name, scope))
        with self.registry.begin() as conn:
            self.registry._insert_ignore(conn, table, [{
                "tenant": tenant, col.name: name, "master_version": version,
                "wrapped": blob, "created_at": time.time(), **columns}])
            row = conn.execute(sa.select(table.c.master_version, _as_bytes(table),
                                         table.c.created_at).where(
                table.c.tenant == tenant, col == name)).first()
            mine = row is not None and bytes(row[1]) == blob
            if mine:   # ours: its KEK must stay
                self.require_live_kek(conn, tenant, version)
        return None if row is None else ((str(row[0]), bytes(row[1]), float(row[2])), mine)

    def require_live_kek(self, conn: Any, tenant: str, master_version: str) -> None:
        """In the transaction inserting a key row wrapped under the tenant's KEK of
        ``master_version``: raise KeyGoneError (rolling it back) unless that KEK row exists and
        its master version is not being retired. On PostgreSQL both rows are locked FOR SHARE
        until the commit, so a rotation deleting the KEK or marking the version waits for this
        row to be visible; on SQLite the insert before this took the write lock."""
        retiring = retiring_versions(conn)
        live = conn.execute(sa.select(tenant_keys.c.version).where(
            tenant_keys.c.tenant == tenant, tenant_keys.c.purpose == KEK,
            tenant_keys.c.master_version == master_version).with_for_update(read=True)).first()
        if live is None or master_version in retiring:
            raise KeyGoneError(
                f"tenant {tenant!r}: the key-encryption key under master version "
                f"{master_version!r} is being retired by a key rotation; nothing was stored, "
                "retry")

    def new_keys(self, tenant: str, scope: str, names: Sequence[str]
                 ) -> tuple[list[dict[str, Any]], dict[str, AESGCM]]:
        """Fresh data keys for ``names`` that have no key row (new random names, e.g. the
        public tokens of new vault entries), wrapped under the tenant's current KEK: the rows
        for the caller to insert in the transaction that stores what they seal (one commit
        for keys and data, none of them visible without the other), and the keys. The caller
        passes the keys of the committed rows to :meth:`remember`."""
        col = TABLES[scope][1]
        version = self.keys.provider.current_version
        kek = self.kek(tenant, version, create=True)
        if kek is None:  # pragma: no cover - create=True returns a KEK or raises
            raise TamperedDataError(f"tenant {tenant!r} has no key-encryption key")
        database, now = self.registry.database_id(), time.time()
        rows: list[dict[str, Any]] = []
        out: dict[str, AESGCM] = {}
        for name in names:
            ctx = thread_key_context(database, tenant, name, scope)
            # the raw key never becomes a local: wrapped at once, then unwrapped as AESGCM
            blob = kek_wrap(kek, secrets.token_bytes(32), ctx)
            out[name] = kek_unwrap(kek, blob, ctx)
            rows.append({"tenant": tenant, col.name: name, "master_version": version,
                         "wrapped": blob, "created_at": now})
        return rows, out

    def check_new_rows(self, conn: Any, rows: Sequence[dict[str, Any]]) -> None:
        """In the transaction inserting rows from :meth:`new_keys`: their KEKs are live."""
        for tenant, version in {(r["tenant"], r["master_version"]) for r in rows}:
            self.require_live_kek(conn, tenant, version)

    def remember(self, tenant: str, scope: str, created: dict[str, AESGCM]) -> None:
        """Cache keys whose rows (from :meth:`new_keys`) were committed."""
        stamp = time.monotonic()
        with self._lock:
            for name, aes in created.items():
                k = (scope, tenant, name)
                self._cache[k] = (stamp, aes, 0.0)
                self._cache.move_to_end(k)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    # the tenant's key-encryption keys -----------------------------------------------------------
    def kek(self, tenant: str, master_version: str, *, create: bool) -> AESGCM | None:
        """The tenant's KEK under ``master_version`` (cached for ``ttl``); created when missing
        and ``create``, else None. One provider unwrap per tenant and version per lifetime."""
        k = (tenant, master_version)
        hit = self._keks.get(k)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        with self._kek_lock:
            hit = self._keks.get(k)
            if hit is not None and time.monotonic() - hit[0] < self.ttl:
                return hit[1]
            row = self.registry.kek_row(tenant, master_version)
            if row is None:
                if not create:
                    self._keks.pop(k, None)
                    return None
                rows = [r for r in self.registry.load_key_rows(tenant) if r.purpose == KEK]
                number = max((r.version for r in rows), default=0) + 1
                wrapped = self.keys.provider.wrap(tenant, secrets.token_bytes(32), wrap_context(
                    tenant, KEK, number, self.registry.database_id()))
                self.registry.insert_key_rows([KeyRow(
                    tenant, KEK, number, wrapped.master_version, wrapped.blob, time.time())])
                row = self.registry.kek_row(tenant, master_version)  # another process may have won
                if row is None:
                    raise TamperedDataError(
                        f"tenant {tenant!r}: the key provider wrapped a new key-encryption key "
                        f"under master version {wrapped.master_version!r}, not "
                        f"{master_version!r} (rotated while it was being created); retry")
            # the raw key never becomes a local: reporters print the locals of raising frames
            aes = AESGCM(self.keys.unwrap_fresh(
                tenant, WrappedKey(row.master_version, row.wrapped),
                row_context(self.registry, tenant, KEK, row.version)))
            self._keks[k] = (time.monotonic(), aes)
            return aes

    def drop_stale_keks(self, current: str, except_tenant: str | None = None) -> int:
        """Delete KEK rows not under ``current`` that wrap no live key any more (after
        :meth:`rewrap`): what an erasure epoch leaves of them opens only under a retired
        master version. Returns the rows deleted."""
        stale = [tenant_keys.c.purpose == KEK, tenant_keys.c.master_version != current]
        if except_tenant is not None:
            stale.append(tenant_keys.c.tenant != except_tenant)
        unused = [~sa.exists().where(table.c.tenant == tenant_keys.c.tenant,
                                     table.c.master_version == tenant_keys.c.master_version)
                  for table, _col in TABLES.values()]
        with self.registry.begin() as conn:
            # PostgreSQL: lock the candidates first (a writer inserting a key row under one
            # holds it FOR SHARE until its commit), then decide in a statement of its own,
            # which sees every such row committed; SQLite: the one DELETE decides atomically
            conn.execute(sa.select(tenant_keys.c.version).where(*stale).with_for_update())
            n = int(conn.execute(tenant_keys.delete().where(*stale, *unused)).rowcount or 0)
        with self._kek_lock:
            self._keks.clear()
        return n

    def _drop(self, ks: Sequence[tuple[str, str, str]]) -> None:
        with self._lock:
            for k in ks:
                self._cache.pop(k, None)

    # destroying keys ----------------------------------------------------------------------------
    def forget(self, tenant: str | None = None) -> None:
        """Drop cached keys (all, or a tenant's)."""
        with self._lock:
            for k in [k for k in self._cache if tenant is None or k[1] == tenant]:
                del self._cache[k]
        with self._kek_lock:
            for kk in [kk for kk in self._keks if tenant is None or kk[0] == tenant]:
                del self._keks[kk]

    def forget_entries(self, tenant: str, tokens: Sequence[str]) -> None:
        """Drop cached keys of vault entries (erased, or about to be written afresh)."""
        self._drop([(ENTRY, tenant, t) for t in tokens])

    def delete_thread(self, tenant: str, thread_id: str) -> int:
        """Destroy the thread's key (its data becomes unreadable wherever it survives)."""
        with self.registry.begin() as conn:
            n = conn.execute(thread_keys.delete().where(
                thread_keys.c.tenant == tenant, thread_keys.c.thread_id == thread_id)).rowcount
        self._drop([(THREAD, tenant, thread_id)])
        return int(n or 0)

    def delete_in(self, conn: Any, pairs: Sequence[tuple[str, str]], scope: str = THREAD
                  ) -> dict[tuple[str, str], int]:
        """Destroy the keys of (tenant, thread or token) ``pairs`` in the caller's
        transaction; returns 1 per pair whose key was deleted here."""
        if not pairs:
            return {}
        table, col = TABLES[scope]
        gone = delete_returning(conn, table, [pairs_in(
            conn.dialect.name, table.c.tenant, col, list(pairs))], [table.c.tenant, col])
        if scope == ITEM:
            item_versions.forget_in(conn, pairs)
        out = {p: 0 for p in pairs}
        for r in gone:
            out[(r["tenant"], r[col.name])] = 1
        self._drop([(scope, t, n) for t, n in pairs])
        return out

    def delete_owned_items(self, conn: Any, tenant: str, owner: str) -> int:
        """Destroy, in the caller's transaction, the keys of every store item of ``tenant``
        whose first namespace label has digest ``owner`` -- also of items the inner store
        already expired (their remnants then no longer open)."""
        gone = [r["item"] for r in delete_returning(conn, store_keys, [
            store_keys.c.tenant == tenant, store_keys.c.owner == owner], [store_keys.c.item])]
        item_versions.forget_in(conn, [(tenant, name) for name in gone])
        self._drop([(ITEM, tenant, name) for name in gone])
        return len(gone)

    def delete_tenant(self, tenant: str) -> int:
        n = 0
        with self.registry.begin() as conn:
            for table, _col in TABLES.values():
                n += int(conn.execute(table.delete().where(table.c.tenant == tenant)).rowcount
                         or 0)
            conn.execute(store_versions.delete().where(store_versions.c.tenant == tenant))
        self.forget(tenant)
        return n

    # the erasure epoch --------------------------------------------------------------------------
    def versions_in_use(self) -> dict[str, int]:
        """Master version -> live thread and vault-entry keys wrapped under it."""
        counts: dict[str, int] = {}
        with self.registry.begin() as conn:
            for table, _col in TABLES.values():
                for v, n in conn.execute(sa.select(table.c.master_version, sa.func.count())
                                         .group_by(table.c.master_version)):
                    counts[str(v)] = counts.get(str(v), 0) + int(n)
        return counts

    def rewrap(self, current: str, *, batch: int = _REWRAP_BATCH,
               progress: Callable[[int, int], None] | None = None,
               except_tenant: str | None = None) -> int:
        """:meth:`rewrap_scope` for thread keys, then vault-entry keys."""
        return sum(self.rewrap_scope(scope, current, batch=batch, progress=progress,
                                     except_tenant=except_tenant)
                   for scope in TABLES)

    @staticmethod
    def _moved(old_kek: AESGCM, new_kek: AESGCM, blob: bytes, ctx: bytes) -> bytes:
        """A key rewrapped from one KEK to another (the raw key stays inside this call)."""
        try:
            return kek_wrap(new_kek, old_kek.decrypt(blob[:12], blob[12:], ctx), ctx)
        except (InvalidTag, ValueError):
            raise TamperedDataError(
                "a thread or vault-entry key does not unwrap under its tenant's key-encryption "
                "key (altered, or copied from elsewhere); not rewrapped") from None

    def rewrap_scope(self, scope: str, current: str, *, batch: int = _REWRAP_BATCH,
                     progress: Callable[[int, int], None] | None = None,
                     except_tenant: str | None = None) -> int:
        """Rewrap every live thread key not under master version ``current`` (the key itself,
        and the data, are unchanged). Keys deleted before stay wrapped under the old version
        only, in whatever copy holds them: retiring it destroys them. Batched by primary key;
        a row changed concurrently (deleted) is skipped. Returns the rows rewrapped."""
        table, col = TABLES[scope]
        database = self.registry.database_id()
        stale = table.c.master_version != current
        if except_tenant is not None:          # a tenant being shredded: its keys stay behind
            stale = sa.and_(stale, table.c.tenant != except_tenant)
        with self.registry.begin() as conn:
            total = int(conn.execute(sa.select(sa.func.count()).select_from(table)
                                     .where(stale)).scalar() or 0)
        done, after = 0, ("", "")
        while True:
            with self.registry.begin() as conn:
                rows = conn.execute(sa.select(
                    table.c.tenant, col, table.c.master_version, _as_bytes(table)).where(
                    stale, sa.tuple_(table.c.tenant, col)
                    > sa.tuple_(sa.literal(after[0]), sa.literal(after[1]))).order_by(
                    table.c.tenant, col).limit(batch)).all()
            if not rows:
                break
            # KEKs are read (and the new one created) outside the batch's transaction: the
            # registry's SQLite engine serializes its connections
            updates = []
            for tenant, name, version, blob in rows:
                old_kek = self.kek(tenant, str(version), create=False)
                if old_kek is None:     # never dropped while a key uses it: altered or copied
                    raise TamperedDataError(
                        f"a {scope} key of tenant {tenant!r} names a key-encryption key the "
                        "registry does not hold (altered, or copied from elsewhere); nothing "
                        "was retired")
                new_kek = self.kek(tenant, current, create=True)
                if new_kek is None:  # pragma: no cover - create=True returns or raises
                    continue
                moved = self._moved(old_kek, new_kek, bytes(blob),
                                    thread_key_context(database, tenant, name, scope))
                updates.append({"b_t": tenant, "b_th": name, "b_old": str(version),
                                "b_mv": current, "b_w": moved})
            if updates:
                with self.registry.begin() as conn:   # a row changed meanwhile is skipped
                    conn.execute(table.update().where(
                        table.c.tenant == sa.bindparam("b_t"), col == sa.bindparam("b_th"),
                        table.c.master_version == sa.bindparam("b_old")).values(
                        master_version=sa.bindparam("b_mv"), wrapped=sa.bindparam("b_w")),
                        updates)
            done += len(updates)
            after = (str(rows[-1][0]), str(rows[-1][1]))
            if progress:
                progress(done, max(total, done))
        if done:
            logger.info("rewrapped %d %s keys under master version %s", done, scope, current)
        return done
