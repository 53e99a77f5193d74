"""The PII vault: originals behind redaction tokens, sealed under each entry's own key.

Redaction replaces a value by a token (``<EMAIL_ADDRESS:3f9a…>``) before anything is
encrypted; the original goes here, encrypted and bound to (tenant, token), so a tool call
resumed by the owning tenant gets the real value back, while an erasure request
(:meth:`PiiVault.forget_tokens`, :meth:`PiiVault.forget_lookups`) removes the value and leaves
the token in the conversation.

The token a conversation holds is **random** (the entry's *public* token), not a function of
the value: the keyed HMAC of the value (the *lookup*, what the redactor computes) is kept only
in the vault row, under a unique (tenant, lookup) index, so that the same value keeps one
token per tenant while its entry lives (:meth:`PiiVault.resolve`: insert-or-read-existing),
and an erased entry takes the only link between its token and its value with it. Rows
written before (``lookup`` NULL) have the HMAC itself as token; they keep restoring, and stay
enumerable by a keyring holder until their threads are rewritten or deleted. The lookup key is
replaced at each erasure epoch (:mod:`.pii_lookups`).

``securesaver_pii_refs`` records which thread holds which token (and its kind): the PII
inventory per tenant and thread, and what deleting a thread must erase.

Erasure is seen by every process: ``securesaver_pii_epoch`` holds a counter per tenant that
every erasure (:meth:`PiiVault.forget_tokens`, :meth:`~PiiVault.delete_thread`,
:meth:`~PiiVault.delete_tenant`) increments in the same transaction as the delete. Every
:meth:`PiiVault.lookup` reads the counter (one primary-key read, in the same transaction as
the vault rows it needs); when it moved since this process cached values of that tenant, the
tenant's cached originals are dropped and read again, so an erased value is never restored
from another process's memory. A write (:meth:`PiiVault.resolve`) maps values to tokens with an
epoch this process read at most :data:`WRITE_EPOCH_REUSE` seconds before (a turn's puts and
pending writes share one read): a value written again within that time after its erasure
committed elsewhere (another process, or this process's pruner batch) keeps the erased token,
so that mention is erased too; it is never written back under the erased token and never
restored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..keys.tokens import ENTRY, associated_data
from .core import Registry, metadata
from .dialects import delete_returning
from .pii_lookups import matching, public_token_for
from .schema import Blob, ThreadId, pii_keys

if TYPE_CHECKING:
    from ..keys.crypto import TenantKeys

logger = logging.getLogger(__name__)

pii_vault = sa.Table(
    "securesaver_pii_vault", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("token", sa.String(128), primary_key=True),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("sealed", Blob, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    # the keyed HMAC of the normalized value (redaction.make_token under the tenant's lookup
    # key of master version ``lookup_key``, see pii_lookups): how a value finds its entry
    sa.Column("lookup", sa.String(128), nullable=True),
    sa.Column("lookup_key", sa.String(64), nullable=True),
    sa.Index("ux_securesaver_pii_vault_lookup", "tenant", "lookup", unique=True),
)

pii_refs = sa.Table(
    "securesaver_pii_refs", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("thread_id", ThreadId, primary_key=True),
    sa.Column("token", sa.String(128), primary_key=True),
    sa.Column("kind", sa.String(64), nullable=False, index=True),
    sa.Column("first_seen", sa.Double, nullable=False),
)


pii_epoch = sa.Table(
    "securesaver_pii_epoch", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("epoch", sa.BigInteger, nullable=False),
)


_EPOCH_SQL_SQLITE = "SELECT epoch FROM securesaver_pii_epoch WHERE tenant = ?"
_EPOCH_SQL_FORMAT = "SELECT epoch FROM securesaver_pii_epoch WHERE tenant = %s"
#: seconds a write may map values with the tenant's erasure epoch as this process last read
#: it; reads (:meth:`PiiVault.lookup`) read it every time
WRITE_EPOCH_REUSE = 0.05


def _aad(tenant: str, token: str) -> bytes:
    return associated_data("pii", tenant, token)


class PiiVault:
    """Thread-safe; keeps a bounded in-process cache of what it already wrote and read."""

    def __init__(self, registry: Registry, *, cache_size: int = 50_000) -> None:
        self.registry = registry
        self._known: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._values: OrderedDict[tuple[str, str], str] = OrderedDict()
        # (tenant, lookup) -> public token of the live entry (dropped when the epoch moves)
        self._public: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._creators: dict[str, threading.Lock] = {}   # tenant -> creating new entries
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._epochs: dict[str, int] = {}  # tenant -> erasure epoch its cached values are from
        self._epoch_read_at: dict[str, float] = {}  # tenant -> when that epoch was read (monotonic)
        # (tenant, thread, token) -> set once the store() writing it has finished
        self._writing: dict[tuple[str, str, str], threading.Event] = {}
        self._epoch_sql: str | None = None
        #: per-entry keys (set by the saver): cached keys of erased entries are dropped here
        self.entry_keys: Any = None

    # public tokens ----------------------------------------------------------------------------
    def resolve(self, keys: TenantKeys, entries: Sequence[Any], *, create: bool = True,
                verify: bool = True, thread_id: str | None = None,
                lookup_key: str | None = None) -> dict[str, Any]:
        """lookup token -> the vault entry (public token, kind, value) of each of ``entries``
        (what the redactor returned: tokens that are HMACs of the values).

        An entry that does not exist yet is created (``create``): a random public token, the
        value sealed under that entry's own key, inserted under the unique (tenant, lookup)
        index; when another writer (thread or process) inserted the same value first, its
        entry wins and ours is dropped, so concurrent writers converge on one token. Cached
        mappings are used while the tenant's erasure epoch has not moved (one indexed read
        per call; ``verify=False``: the caller's write read it a moment ago).
        ``create=False`` (list filters, search queries) returns existing entries only. A
        write whose mapping raced with an erasure keeps the erased token: the value of that
        write is erased too; it is never written back under the erased token.

        ``thread_id``: the thread the write belongs to; the references of the entries this
        call creates are recorded in the transaction that creates them (:meth:`store` then
        has nothing left to write for them)."""
        tenant = keys.tenant
        by_lookup: dict[str, Any] = {}
        for e in entries:
            by_lookup.setdefault(e.token, e)
        if not by_lookup:
            return {}
        asked = time.monotonic()   # read a moment ago (this turn's read, another write): reuse
        verify = verify and not (tenant in self._epochs and asked - self._epoch_read_at.get(
            tenant, -1.0) < WRITE_EPOCH_REUSE)
        epoch = self._read_epoch(tenant) if verify or tenant not in self._epochs else \
            self._epochs[tenant]
        out: dict[str, Any] = {}
        with self._lock:
            if self._epochs.get(tenant) != epoch:
                self._drop_tenant_cache_locked(tenant)
                self._epochs[tenant] = epoch
            if verify:
                self._confirmed_locked(tenant, epoch, asked)
            for lookup, e in by_lookup.items():
                public = self._public.get((tenant, lookup))
                if public is not None:
                    out[lookup] = type(e)(public, e.kind, e.value)
        missing = [t for t in by_lookup if t not in out]
        if missing and create and self._creating(tenant).locked():
            # another writer of this process is creating entries of this tenant (a step's
            # put and put_writes carry the same new values): its entries, once committed,
            # come from the cache instead of a read that would find them missing
            with self._creating(tenant), self._lock:
                for lookup in missing:
                    public = self._public.get((tenant, lookup))
                    if public is not None:
                        e = by_lookup[lookup]
                        out[lookup] = type(e)(public, e.kind, e.value)
            missing = [t for t in missing if t not in out]
        if missing:
            found = self._read_public(tenant, missing)
            fresh = [t for t in missing if t not in found]
            if fresh and create:
                # one creator per tenant in this process (a step's put and put_writes carry
                # the same new values: the second finds the first's entries in the cache);
                # other processes are settled by the unique index
                with self._creating(tenant):
                    with self._lock:
                        for t in fresh:
                            public = self._public.get((tenant, t))
                            if public is not None:
                                found[t] = public
                    fresh = [t for t in fresh if t not in found]
                    if fresh:
                        created = self._create_entries(keys, [by_lookup[t] for t in fresh],
                                                       thread_id, lookup_key)
                        found.update(created)
                        with self._lock:
                            for lookup, public in created.items():
                                self._public[(tenant, lookup)] = public
            for lookup, public in found.items():
                e = by_lookup[lookup]
                out[lookup] = type(e)(public, e.kind, e.value)
            with self._lock:
                for lookup, public in found.items():
                    self._public[(tenant, lookup)] = public
                    self._values[(tenant, public)] = by_lookup[lookup].value
                self._trim()
        return out

    def _creating(self, tenant: str) -> threading.Lock:
        with self._lock:
            lock = self._creators.get(tenant)
            if lock is None:
                lock = self._creators[tenant] = threading.Lock()
                if len(self._creators) > 4096:   # bounded: drop idle locks of other tenants
                    for other in [t for t, lk in self._creators.items()
                                  if t != tenant and not lk.locked()][:2048]:
                        del self._creators[other]
            return lock

    def _read_public(self, tenant: str, lookups: Sequence[str]) -> dict[str, str]:
        """lookup -> public token of the live entries (one indexed read on a direct
        connection, like the epoch)."""
        if not self.registry._is_setup:
            self.registry.setup()
        wanted = list(dict.fromkeys(lookups))
        out: dict[str, str] = {}
        mark = self.registry.direct.placeholder
        for start in range(0, len(wanted), 500):
            chunk = wanted[start:start + 500]
            # only driver markers are formatted in; the tenant and every value are bound
            markers = ", ".join([mark] * len(chunk))
            sql = ("SELECT lookup, token FROM securesaver_pii_vault "  # noqa: S608
                   f"WHERE tenant = {mark} AND lookup IN ({markers})")
            for lookup, token in self.registry.direct.rows(sql, (tenant, *chunk)):
                out[str(lookup)] = str(token)
        return out

    def _create_entries(self, keys: TenantKeys, entries: Sequence[Any],
                        thread_id: str | None = None, lookup_key: str | None = None
                        ) -> dict[str, str]:
        """Insert-or-read-existing: our new entries, or the ones a concurrent writer won with.

        One registry transaction: the entries' own key rows (under a live KEK), the sealed
        values and (with ``thread_id``) the thread's references to them commit together; the
        keys of entries another writer won with are deleted in it again."""
        tenant, now = keys.tenant, time.time()
        ours = {e.token: public_token_for(e.token) for e in entries}
        scoped: Any = self.entry_keys
        batch = scoped is not None and bool(scoped.sealing) and keys.threads is scoped
        key_rows: list[dict[str, Any]] = []
        new_keys: dict[str, Any] = {}
        if batch:
            key_rows, new_keys = scoped.new_keys(tenant, ENTRY, list(ours.values()))
        rows = []
        for e in entries:
            public = ours[e.token]
            plain, aad = e.value.encode("utf-8", "surrogatepass"), _aad(tenant, public)
            rows.append({"tenant": tenant, "token": public, "lookup": e.token, "kind": e.kind,
                         "sealed": keys.seal(plain, aad, key=new_keys.get(public)),
                         "created_at": now, "lookup_key": lookup_key})
        with self.registry.begin() as conn:
            if key_rows:   # random names: a conflict is an error, never a silent reuse
                conn.execute(pii_keys.insert(), key_rows)
                scoped.check_new_rows(conn, key_rows)
            self.registry._insert_ignore(conn, pii_vault, rows)
            got = conn.execute(sa.select(pii_vault.c.lookup, pii_vault.c.token).where(
                pii_vault.c.tenant == tenant, pii_vault.c.lookup.in_(list(ours)))).all()
            winners = {str(lookup): str(token) for lookup, token in got}
            lost = [p for lookup, p in ours.items() if winners.get(lookup) != p]
            if lost:   # another writer's entry won: our keys are orphans
                self._destroy_keys(conn, tenant, lost)
            if thread_id is not None:
                kinds = {e.token: e.kind for e in entries}
                self.registry._insert_ignore(conn, pii_refs, [
                    {"tenant": tenant, "thread_id": thread_id, "token": public,
                     "kind": kinds[lookup], "first_seen": now}
                    for lookup, public in winners.items()])
        if batch:
            scoped.remember(tenant, ENTRY, {p: new_keys[p] for p in ours.values()
                                            if p not in lost})
        if thread_id is not None:
            with self._lock:
                for public in winners.values():
                    self._known[(tenant, thread_id, public)] = None
        return winners

    def public_tokens(self, keys: TenantKeys, lookups: Sequence[str]) -> dict[str, str]:
        """lookup token -> public token of the live entries (no cache, no creation)."""
        return self._read_public(keys.tenant, lookups) if lookups else {}

    # writing ----------------------------------------------------------------------------------
    def unknown(self, tenant: str, thread_id: str, entries: Iterable[Any]) -> list[Any]:
        """Entries this process has not stored for that thread yet (the rest are no-ops)."""
        with self._lock:
            return [e for e in entries if (tenant, thread_id, e.token) not in self._known]

    def store(self, keys: TenantKeys, thread_id: str, entries: Sequence[Any]) -> None:
        """Record the thread's references to resolved entries (:meth:`resolve` stored their
        originals); an entry erased meanwhile is not written back (idempotent).

        When this returns, every entry is committed: by this call, or by a concurrent call
        of this process that was already writing it (LangGraph runs a step's ``put`` and
        ``put_writes`` in parallel, and they usually carry the same new tokens), which this
        call waits for instead of writing the same rows again; if that call failed, this
        one writes them itself."""
        if not entries:
            return
        tenant = keys.tenant
        unique = {e.token: e for e in entries}
        mine: list[Any] = []
        theirs: list[tuple[Any, threading.Event]] = []
        done = threading.Event()
        with self._lock:
            for token, e in unique.items():
                key = (tenant, thread_id, token)
                if key in self._known:
                    continue
                other = self._writing.get(key)
                if other is not None:
                    theirs.append((e, other))
                else:
                    self._writing[key] = done
                    mine.append(e)
        try:
            if mine:
                self._write(keys, thread_id, mine)
        finally:
            with self._lock:
                for e in mine:
                    self._writing.pop((tenant, thread_id, e.token), None)
            done.set()
        for _e, other in theirs:
            other.wait()
        with self._lock:
            failed = [e for e, _other in theirs if (tenant, thread_id, e.token) not in self._known]
        if failed:  # the other writer raised: write them here (or raise the same way)
            self._write(keys, thread_id, failed)

    def _write(self, keys: TenantKeys, thread_id: str, entries: Sequence[Any]) -> None:
        # references only: the value was stored by resolve(); inserting it again here would
        # bring an entry erased meanwhile back under the token old conversations still hold
        tenant, now = keys.tenant, time.time()
        ref_rows = [{"tenant": tenant, "thread_id": thread_id, "token": e.token, "kind": e.kind,
                     "first_seen": now} for e in entries]
        with self.registry.begin() as conn:
            self.registry._insert_ignore(conn, pii_refs, ref_rows)
        with self._lock:
            for e in entries:
                self._known[(tenant, thread_id, e.token)] = None
                self._values[(tenant, e.token)] = e.value
            self._trim()

    def _trim(self) -> None:
        while len(self._known) > self._cache_size:
            self._known.popitem(last=False)
        while len(self._values) > self._cache_size:
            self._values.popitem(last=False)
        while len(self._public) > self._cache_size:
            self._public.popitem(last=False)

    # reading ----------------------------------------------------------------------------------
    def lookup(self, keys: TenantKeys, tokens: Sequence[str], *,
               verify: bool = True) -> Mapping[str, str]:
        """The originals still stored for ``tokens`` (erased ones are absent). Reads the
        tenant's erasure epoch (``verify``, the default): cached originals of an epoch that
        has moved on (an erasure in any process) are dropped first. ``verify=False`` is for a
        caller that verified the epoch a moment ago in the same operation."""
        tenant = keys.tenant
        if not tokens:
            return {}
        found: dict[str, str] = {}
        missing: list[str] = []
        with self._lock:
            known_epoch = self._epochs.get(tenant)
            for token in tokens:
                value = self._values.get((tenant, token))
                if value is None:
                    missing.append(token)
                else:
                    found[token] = value
        if not verify and not missing and known_epoch is not None:
            return found
        asked = time.monotonic()
        if not missing:  # the common case: every original cached, only the epoch to check
            epoch = self._read_epoch(tenant)
            if epoch == known_epoch:
                with self._lock:
                    self._confirmed_locked(tenant, epoch, asked)
                return found
        with self.registry.begin() as conn:
            epoch = self._epoch(conn, tenant)
            if epoch != known_epoch:
                self.drop_tenant_cache(tenant)
                missing, found = list(dict.fromkeys(tokens)), {}
            rows = conn.execute(sa.select(pii_vault.c.token, pii_vault.c.sealed).where(
                pii_vault.c.tenant == tenant, pii_vault.c.token.in_(missing))).all() \
                if missing else []
        fresh: dict[str, str] = {}
        for token, sealed in rows:
            fresh[token] = keys.open(bytes(sealed), _aad(tenant, token)).decode(
                "utf-8", "surrogatepass")
        found.update(fresh)
        with self._lock:  # a stale epoch here only costs a re-read: every lookup checks it
            self._epochs[tenant] = epoch
            self._confirmed_locked(tenant, epoch, asked)
            for token, value in fresh.items():
                self._values[(tenant, token)] = value
            self._trim()
        return found

    def _read_epoch(self, tenant: str) -> int:
        """The tenant's erasure epoch, read with the least overhead: one indexed SELECT on a
        DBAPI connection kept for it (:class:`.direct_reads.DirectReads`), outside any
        transaction: one round trip on PostgreSQL, no pool checkout, ping or reset."""
        sql = self._epoch_sql
        if sql is None:
            # constant SQL (no user input in it); the tenant is a bound parameter
            sql = self._epoch_sql = (_EPOCH_SQL_SQLITE if self.registry.engine.dialect.name
                                     == "sqlite" else _EPOCH_SQL_FORMAT)
        if not self.registry._is_setup:
            self.registry.setup()
        return int(self.registry.direct.scalar(sql, (tenant,)) or 0)

    def _confirmed_locked(self, tenant: str, epoch: int, asked: float) -> None:
        """``epoch``, read at ``asked`` (monotonic, before the read), is the one the cached
        mappings are from: writes may reuse it for a while. Holding ``self._lock``."""
        if self._epochs.get(tenant) == epoch:
            if len(self._epoch_read_at) > self._cache_size:
                self._epoch_read_at.clear()
            self._epoch_read_at[tenant] = asked

    @staticmethod
    def _epoch(conn: Any, tenant: str) -> int:
        value = conn.execute(sa.select(pii_epoch.c.epoch).where(
            pii_epoch.c.tenant == tenant)).scalar()
        return int(value or 0)

    def _bump_epoch(self, conn: Any, tenant: str) -> None:
        """Move the tenant's erasure epoch on (inside the erasing transaction)."""
        self.registry._insert_ignore(conn, pii_epoch, [{"tenant": tenant, "epoch": 0}])
        conn.execute(pii_epoch.update().where(pii_epoch.c.tenant == tenant).values(
            epoch=pii_epoch.c.epoch + 1))

    def drop_tenant_cache(self, tenant: str) -> None:
        with self._lock:
            self._drop_tenant_cache_locked(tenant)

    def _drop_tenant_cache_locked(self, tenant: str) -> None:
        self._values = OrderedDict((k, v) for k, v in self._values.items() if k[0] != tenant)
        self._known = OrderedDict((k, None) for k in self._known if k[0] != tenant)
        self._public = OrderedDict((k, v) for k, v in self._public.items() if k[0] != tenant)
        self._epochs.pop(tenant, None)
        self._epoch_read_at.pop(tenant, None)

    # inventory and erasure ------------------------------------------------------------------
    def inventory(self, tenant: str | None = None, thread_id: str | None = None
                  ) -> dict[tuple[str, str], dict[str, int]]:
        """{(tenant, thread): {kind: distinct values}} for every thread that holds PII whose
        value is still stored (erased values no longer count)."""
        joined = pii_refs.join(pii_vault, sa.and_(pii_refs.c.tenant == pii_vault.c.tenant,
                                                  pii_refs.c.token == pii_vault.c.token))
        q = sa.select(pii_refs.c.tenant, pii_refs.c.thread_id, pii_refs.c.kind,
                      sa.func.count()).select_from(joined).group_by(
            pii_refs.c.tenant, pii_refs.c.thread_id, pii_refs.c.kind)
        if tenant is not None:
            q = q.where(pii_refs.c.tenant == tenant)
        if thread_id is not None:
            q = q.where(pii_refs.c.thread_id == thread_id)
        out: dict[tuple[str, str], dict[str, int]] = {}
        with self.registry.begin() as conn:
            for t, th, kind, n in conn.execute(q):
                out.setdefault((t, th), {})[kind] = int(n)
        return out

    def forget_tokens(self, tenant: str, tokens: Sequence[str]) -> int:
        """Erase originals; the tokens stay in the conversations. Returns values erased."""
        if not tokens:
            return 0
        with self.registry.begin() as conn:
            erased = conn.execute(pii_vault.delete().where(
                pii_vault.c.tenant == tenant, pii_vault.c.token.in_(list(tokens)))).rowcount
            self._destroy_keys(conn, tenant, tokens)
            self._bump_epoch(conn, tenant)
        self.drop_tenant_cache(tenant)
        return int(erased or 0)

    def forget_lookups(self, tenant: str, lookups: Sequence[str]) -> int:
        """Erase the entries of values given by their lookup tokens (and the older entries
        whose token is that HMAC itself). Returns values erased."""
        return self.erase_lookups(tenant, lookups)[0]

    def erase_lookups(self, tenant: str, lookups: Sequence[str]) -> tuple[int, int]:
        """:meth:`forget_lookups`, returning (values erased, threads that referenced them)."""
        if not lookups:
            return 0, 0
        wanted = list(dict.fromkeys(lookups))
        with self.registry.begin() as conn:
            tokens = list(conn.execute(sa.select(pii_vault.c.token).where(
                pii_vault.c.tenant == tenant, sa.or_(matching(pii_vault.c.lookup, wanted),
                                                     pii_vault.c.token.in_(wanted)))).scalars())
            erased = threads = 0
            if tokens:
                threads = int(conn.execute(sa.select(sa.func.count(
                    sa.distinct(pii_refs.c.thread_id))).where(
                    pii_refs.c.tenant == tenant, pii_refs.c.token.in_(tokens))).scalar() or 0)
                erased = int(conn.execute(pii_vault.delete().where(
                    pii_vault.c.tenant == tenant, pii_vault.c.token.in_(tokens))).rowcount or 0)
                self._destroy_keys(conn, tenant, tokens)
                self._bump_epoch(conn, tenant)
        self.drop_tenant_cache(tenant)
        return erased, threads

    def tenants(self) -> list[str]:
        """Tenants with values in the vault."""
        with self.registry.begin() as conn:
            return sorted(conn.execute(sa.select(pii_vault.c.tenant).distinct()).scalars())

    def _destroy_keys(self, conn: Any, tenant: str, tokens: Sequence[str]) -> None:
        """Delete the entries' own keys with them (crypto-erasure of every copy of the value
        once the master version that wrapped the key is retired)."""
        if tokens:
            conn.execute(pii_keys.delete().where(pii_keys.c.tenant == tenant,
                                                 pii_keys.c.token.in_(list(tokens))))
        if self.entry_keys is not None:
            self.entry_keys.forget_entries(tenant, list(tokens))

    def tokens_of_kind(self, tenant: str, kind: str) -> list[str]:
        with self.registry.begin() as conn:
            return list(conn.execute(sa.select(pii_vault.c.token).where(
                pii_vault.c.tenant == tenant, pii_vault.c.kind == kind)).scalars())

    def kinds(self, tenant: str) -> list[str]:
        with self.registry.begin() as conn:
            return sorted(conn.execute(sa.select(pii_vault.c.kind).where(
                pii_vault.c.tenant == tenant).distinct()).scalars())

    def delete_thread(self, tenant: str, thread_id: str) -> int:
        """Drop the thread's references and every original no other thread still uses."""
        with self.registry.begin() as conn:
            tokens = list(conn.execute(sa.select(pii_refs.c.token).where(
                pii_refs.c.tenant == tenant, pii_refs.c.thread_id == thread_id)).scalars())
            conn.execute(pii_refs.delete().where(pii_refs.c.tenant == tenant,
                                                 pii_refs.c.thread_id == thread_id))
            still_used = sa.select(pii_refs.c.token).where(pii_refs.c.tenant == tenant)
            gone = [r["token"] for r in delete_returning(conn, pii_vault, [
                pii_vault.c.tenant == tenant, pii_vault.c.token.in_(tokens),
                pii_vault.c.token.not_in(still_used)], [pii_vault.c.token])] if tokens else []
            erased = len(gone)
            if erased:
                self._destroy_keys(conn, tenant, gone)
                self._bump_epoch(conn, tenant)
        with self._lock:
            for key in [k for k in self._known if k[0] == tenant and k[1] == thread_id]:
                del self._known[key]
            for token in tokens:
                self._values.pop((tenant, token), None)
            if erased:   # committed: this process's next write reads the moved epoch
                self._epoch_read_at.pop(tenant, None)
        return int(erased or 0)

    def delete_tenant(self, tenant: str) -> int:
        with self.registry.begin() as conn:
            conn.execute(pii_refs.delete().where(pii_refs.c.tenant == tenant))
            erased = conn.execute(pii_vault.delete().where(pii_vault.c.tenant == tenant)).rowcount
            conn.execute(pii_keys.delete().where(pii_keys.c.tenant == tenant))
            self._bump_epoch(conn, tenant)
        self.drop_tenant_cache(tenant)
        return int(erased or 0)

    def delete_threads_in(self, conn: Any, pairs: Sequence[tuple[str, str]]
                          ) -> dict[tuple[str, str], int]:
        """Bulk :meth:`delete_thread` inside the caller's transaction (the pruner's batch).
        Returns the originals erased per (tenant, thread); an original several threads of the
        batch shared is counted once, on the first of them."""
        if not pairs:
            return {}
        from .schema import pairs_in
        wanted = list(pairs)
        dialect = conn.dialect.name
        refs = [(r["tenant"], r["thread_id"], r["token"]) for r in delete_returning(
            conn, pii_refs, [pairs_in(dialect, pii_refs.c.tenant, pii_refs.c.thread_id, wanted)],
            [pii_refs.c.tenant, pii_refs.c.thread_id, pii_refs.c.token])]
        owner: dict[tuple[str, str], tuple[str, str]] = {}
        for tenant, thread_id, token in sorted(refs):
            owner.setdefault((tenant, token), (tenant, thread_id))
        erased: dict[tuple[str, str], int] = {p: 0 for p in wanted}
        if owner:
            still_used = sa.select(pii_refs.c.token).where(
                pii_refs.c.tenant == pii_vault.c.tenant, pii_refs.c.token == pii_vault.c.token)
            gone = [(r["tenant"], r["token"]) for r in delete_returning(conn, pii_vault, [
                pairs_in(dialect, pii_vault.c.tenant, pii_vault.c.token, list(owner)),
                ~sa.exists(still_used)], [pii_vault.c.tenant, pii_vault.c.token])]
            for tenant, token in gone:
                erased[owner[(tenant, token)]] += 1
            for tenant in sorted({t for t, _token in gone}):
                self._destroy_keys(conn, tenant, [tok for t, tok in gone if t == tenant])
                self._bump_epoch(conn, tenant)   # other processes drop their cached originals
        doomed = set(wanted)
        with self._lock:
            for key in [k for k in self._known if (k[0], k[1]) in doomed]:
                del self._known[key]
            for tenant, token in owner:
                self._values.pop((tenant, token), None)
        return erased
