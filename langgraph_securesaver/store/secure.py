"""SecureStore: a LangGraph ``BaseStore`` that encrypts, isolates and redacts around any store.

It shares a :class:`..saver.SecureSaver`'s keyring, registry, key hierarchy, tenant gate,
redactor and PII vault (``SecureStore(inner, saver=saver)``); without a saver it builds its
own over the same kinds of parts. ``batch``/``abatch`` differ only in how they reach the
inner store and where CPU and registry work runs (async paths never block the event loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

from langgraph.store.base import BaseStore, Item, Op, PutOp, Result, SearchOp, TTLConfig
from langgraph.store.base.embed import ensure_embeddings

from ..errors import ConfigurationError, ItemChangedError, KeyGoneError
from ..keys.crypto import TenantKeys
from ..keys.provider import KeyProvider
from ..offthread import to_thread
from ..ops.subjects import item_key_destroyer
from ..redaction.scheduler import aredaction_job, redaction_job
from ..registry.core import Registry
from ..registry.item_versions import store_id
from ..registry.namespaces import is_durable, registry_location
from ..registry.thread_keys import ThreadKeyStore
from ..saver import DEFAULT, SecureSaver
from ..storage.store_format import vault_id
from ..tenancy import tenant_tag
from .base import SCAN_LIMIT, BatchPlan, Rereads, StoreCore
from .inner_stores import (
    ainner_batch,
    astore_location,
    inner_batch,
    open_async_store,
    open_sync_store,
    split_options,
    store_location,
)
from .item_deletes import ItemDeletes
from .loop_batches import LoopBatches

logger = logging.getLogger(__name__)

#: up to this many ops (or returned items) a batch's CPU steps run on the event loop: below
#: it they take less time than the hop to a worker thread
_INLINE_OPS = 16
#: how often a put whose item another process deleted meanwhile, or another put of which
#: reserved a later version, is sealed and written again before the batch fails
_RESEALS = 100


def _unsettled(plan: BatchPlan) -> None:
    """Raise: the items of ``plan`` kept being deleted or written under its puts (see
    ``_RESEALS``)."""
    raise KeyGoneError(
        f"store items of tenant {plan.tenant!r} were deleted or written by others while this "
        f"batch wrote them, {_RESEALS} times over; what this batch wrote may not open, retry")


def _returned(results: list[Result]) -> int:
    """How many items the inner store returned (what opening a batch costs)."""
    return sum(len(r) if isinstance(r, list) else int(r is not None) for r in results)


class SecureStore(BaseStore):
    """Wrap ``inner`` so every value is sealed per tenant, bound to its database, tenant,
    namespace and key, and every namespace lives under the caller's tenant.

    Args:
        inner: any LangGraph store (InMemoryStore, SqliteStore, AsyncSqliteStore,
            PostgresStore, AsyncPostgresStore, or your own), configured without ``index``
            (the inner store would embed ciphertext; pass ``index`` here instead).
        saver: a SecureSaver whose keyring, registry, tenant rules, redactor and PII vault
            the store shares. Without one, ``keyring``/``registry``/``redaction``/
            ``default_tenant`` build them as SecureSaver's constructor does.
        index: LangGraph's ``IndexConfig`` (``dims``, ``embed``, ``fields``; also
            ``distance_type``): semantic search, computed by SecureStore on the redacted
            text, vectors sealed with the value (see docs/store.md).
        blind_index: keep keyed digests of top-level scalar fields so ``filter=`` equality
            runs inside the inner store (reveals equality of values, never a value).
    """

    def __init__(self, inner: BaseStore, *, saver: SecureSaver | None = None,
                 keyring: KeyProvider | None = None, registry: Registry | str | None = None,
                 redaction: Any = DEFAULT, default_tenant: str | None = None,
                 index: Any = None, blind_index: bool = True) -> None:
        if not isinstance(inner, BaseStore):
            raise ConfigurationError(f"inner must be a BaseStore, got {type(inner)!r}")
        if isinstance(inner, SecureStore):
            raise ConfigurationError("SecureStore cannot wrap another SecureStore")
        if getattr(inner, "index_config", None):
            raise ConfigurationError(
                "configure index= on SecureStore, not on the inner store: the inner store "
                "only ever sees ciphertext and would embed it")
        if saver is None:
            saver = SecureSaver(_placeholder_saver(), keyring=keyring,
                                registry=_store_registry(inner, registry),
                                redaction=redaction, default_tenant=default_tenant)
        elif (keyring is not None or registry is not None or redaction is not DEFAULT
              or default_tenant is not None):
            raise ConfigurationError(
                "with saver=, the keyring, registry, redactor and default tenant are the "
                "saver's; do not pass them again")
        if not isinstance(saver, SecureSaver):
            raise ConfigurationError("saver must be a SecureSaver")
        self.inner = inner
        self.saver = saver
        self.index_config = dict(index) if index else None
        self.embeddings = ensure_embeddings(self.index_config.get("embed")) \
            if self.index_config else None
        self.supports_ttl = bool(getattr(inner, "supports_ttl", False))
        self.ttl_config: TTLConfig | None = getattr(inner, "ttl_config", None)
        # items of the inner store may expire (AsyncSqliteStore expires items, and refreshes
        # them on read, without saying supports_ttl)
        self._expires = self.supports_ttl or self.ttl_config is not None
        self._services = saver.services
        #: where the inner store keeps its items (None until asked: an AsyncSqliteStore)
        self.location: str | None = store_location(inner)
        item_keys = saver.keys.threads
        if not isinstance(item_keys, ThreadKeyStore):  # pragma: no cover - SecureSaver's
            raise ConfigurationError("the saver holds no key store for store items")
        #: the async puts' version confirmations (registry/item_versions.py), made together
        self._item_confirms = LoopBatches(item_keys.confirm_items)
        self._item_deletes = ItemDeletes(
            saver.registry, item_keys,
            saver.vault if saver.services.pii.redactor is not None else None)
        # filter keys follow the inner store's convention: the SQLite stores read "a.b" as
        # a path, the others as a literal key
        self._core = StoreCore(saver.services.pii, self.index_config, self.embeddings,
                               blind_index, item_keys if item_keys.sealing else None,
                               self._item_deletes.under_way,
                               dotted_filters="Sqlite" in type(inner).__name__)

    def __repr__(self) -> str:
        return f"SecureStore({type(self.inner).__name__})"

    @property
    def default_tenant(self) -> str | None:
        return self.saver.default_tenant

    # setup ------------------------------------------------------------------------------------
    def setup(self) -> Any:
        """Create SecureSaver's tables (keys, vault) and the inner store's, as the inner
        store's own ``setup()`` does: for a store whose ``setup`` is a coroutine
        (AsyncPostgresStore) this returns the awaitable of :meth:`asetup`
        (``await store.setup()``), else it sets up at once."""
        if asyncio.iscoroutinefunction(getattr(self.inner, "setup", None)):
            return self.asetup()
        self.saver.registry.setup()
        self._services.bind_keyring()
        self._location()
        inner_setup = getattr(self.inner, "setup", None)
        if callable(inner_setup) and not asyncio.iscoroutinefunction(inner_setup):
            inner_setup()

    async def asetup(self) -> None:
        await to_thread(self.saver.registry.setup)
        await to_thread(self._services.bind_keyring)
        inner_setup = getattr(self.inner, "setup", None)
        if callable(inner_setup):
            if asyncio.iscoroutinefunction(inner_setup):
                await inner_setup()
            else:
                await to_thread(inner_setup)
        await self._alocation()

    # the BaseStore contract -------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        listed = list(ops)
        if not listed:
            return []
        tenant = self._services.gate.resolve_tenant("store")
        if self._writes(listed):
            self._note_location(self._location())
        keys = self._keys(tenant, listed)
        # redaction work goes through the shared scheduler; a batch with nothing to redact
        # (no redactor, or only gets and deletes) is prepared here, without the hop
        plan = (redaction_job if self._redacts(listed) else _direct)(
            tenant, self._core.prepare, listed, tenant, keys, self._services.database_id())
        plan.locate = self._store_id
        texts, queries = plan.texts(), plan.query_texts()
        vectors = self.embeddings.embed_documents(texts) if texts and self.embeddings else []
        query_vectors = [self.embeddings.embed_query(q) for q in queries] \
            if queries and self.embeddings else []
        # a deleted item's key goes first: what survives of it no longer opens
        deleted, touched = self._core.deleted_items(plan), self._core.written_items(plan)
        self._item_deletes.begin(touched)
        try:
            self._item_deletes.forget(deleted)
            inner_ops = plan.inner_ops(vectors)
            plan.read_at = self._item_deletes.tick
            results = inner_batch(self.inner, inner_ops)
            again = plan.stale_puts()
            for _attempt in range(_RESEALS):
                if not again:
                    break
                inner_batch(self.inner, list[Op](again))
                again = plan.stale_puts()
        finally:
            self._item_deletes.end(touched)
        if again:
            _unsettled(plan)
        if plan.keys is None and plan.found_items(results):
            # another caller created the tenant's first item meanwhile
            plan.keys = self.saver.keys.require(tenant)
        rereads = Rereads(plan, inner_ops, results, lambda: self._item_deletes.tick)
        while True:
            try:
                opened = plan.open_results(results)
                break
            except ItemChangedError as exc:
                rereads.took(inner_batch(self.inner, rereads.next_ops(exc)))
        tokens = plan.tokens(opened)
        originals = self.saver.vault.lookup(plan.keys, tokens) \
            if tokens and plan.keys is not None else {}
        finished = plan.finish(opened, query_vectors, originals)
        refreshes = plan.refreshes(finished) if self._expires else []
        if refreshes:
            inner_batch(self.inner, refreshes)
        return finished

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` without blocking the event loop: registry and vault round trips,
        redaction and large sealing/opening run in a worker thread; small CPU steps (a get,
        a delete, opening a few items) run inline, since a thread hop costs more."""
        listed = list(ops)
        if not listed:
            return []
        tenant = await self._services.gate.aresolve_tenant("store")
        if self._writes(listed):
            location = await self._alocation()
            if location not in self._services.store_locations:
                await to_thread(self._note_location, location)
        keys = await self._akeys(tenant, listed)
        database_id = await self._adatabase_id()
        queries_to_embed = self.embeddings is not None and any(
            isinstance(op, SearchOp) and op.query for op in listed)
        plan = await (aredaction_job(tenant, self._core.prepare, listed, tenant, keys,
                                     database_id) if self._redacts(listed) else
                      self._run(queries_to_embed or len(listed) > _INLINE_OPS,
                                self._core.prepare, listed, tenant, keys, database_id))
        plan.store = store_id(await self._alocation())
        texts, queries = plan.texts(), plan.query_texts()
        vectors = await self.embeddings.aembed_documents(texts) \
            if texts and self.embeddings else []
        query_vectors = list(await asyncio.gather(
            *(self.embeddings.aembed_query(q) for q in queries))) \
            if queries and self.embeddings else []
        deleted, touched = self._core.deleted_items(plan), self._core.written_items(plan)
        self._item_deletes.begin(touched)
        try:
            await self._item_deletes.aforget(deleted)
            # sealing reads (or creates) each put item's key row: off the loop
            inner_ops = await self._run(bool(plan.puts) or len(listed) > _INLINE_OPS,
                                        plan.inner_ops, vectors)
            plan.read_at = self._item_deletes.tick
            results = await ainner_batch(self.inner, inner_ops)
            again = await self._astale_puts(plan)
            for _attempt in range(_RESEALS):
                if not again:
                    break
                await ainner_batch(self.inner, list[Op](again))
                again = await self._astale_puts(plan)
        finally:
            self._item_deletes.end(touched)
        if again:
            _unsettled(plan)
        if plan.keys is None and plan.found_items(results):
            plan.keys = await self._services.arequire_keys(tenant)
        rereads = Rereads(plan, inner_ops, results, lambda: self._item_deletes.tick)
        while True:
            try:
                # the items' versions (and a key not cached) are read from the registry: off
                # the loop
                opened = await self._run(
                    _returned(results) > _INLINE_OPS or plan.opens_in_registry(results)
                    or not plan.keys_cached(results), plan.open_results, results)
                break
            except ItemChangedError as exc:
                rereads.took(await ainner_batch(self.inner, rereads.next_ops(exc)))
        tokens = plan.tokens(opened)
        originals = await to_thread(self.saver.vault.lookup, plan.keys, tokens) \
            if tokens and plan.keys is not None else {}
        finished: list[Result] = await self._run(
            _returned(results) > _INLINE_OPS, plan.finish, opened, query_vectors, originals)
        refreshes = plan.refreshes(finished) if self._expires else []
        if refreshes:
            await ainner_batch(self.inner, refreshes)
        return finished

    async def _astale_puts(self, plan: BatchPlan) -> list[PutOp]:
        """:meth:`BatchPlan.stale_puts`, the confirmation shared with the other tasks of this
        event loop (:class:`.loop_batches.LoopBatches`)."""
        if not plan.used:
            return []
        refused = await self._item_confirms.submit(plan.written())
        return await to_thread(plan.stale_puts, refused) if refused else []

    # TTL --------------------------------------------------------------------------------------
    def sweep_ttl(self) -> int:
        """The inner store's sweep of expired items (stores with TTL support)."""
        return int(self._inner_method("sweep_ttl")())

    async def asweep_ttl(self) -> int:
        sweep = self._inner_method("sweep_ttl")
        result = sweep()
        return int(await result if asyncio.iscoroutine(result) else result)

    def start_ttl_sweeper(self, sweep_interval_minutes: int | None = None) -> Any:
        return self._inner_method("start_ttl_sweeper")(sweep_interval_minutes)

    def stop_ttl_sweeper(self, timeout: float | None = None) -> Any:
        return self._inner_method("stop_ttl_sweeper")(timeout)

    # erasure ----------------------------------------------------------------------------------
    def shred_tenant(self, tenant: str, *, requested_by: str | None = None) -> int:
        """Crypto-shred ``tenant`` (the saver's ``shred_tenant``: its keys destroyed, its
        checkpoints and PII originals deleted), then delete its store items. Returns the
        number of store items deleted."""
        self.saver.shred_tenant(tenant, requested_by=requested_by)
        return self.purge_tenant_items(tenant)

    async def ashred_tenant(self, tenant: str, *, requested_by: str | None = None) -> int:
        await self.saver.ashred_tenant(tenant, requested_by=requested_by)
        return await self.apurge_tenant_items(tenant)

    def purge_tenant_items(self, tenant: str) -> int:
        """Delete every stored item of ``tenant`` without opening any (operator method)."""
        tenant = self._services.gate.admin_tenant("purge_store", tenant) or tenant
        prefix = (tenant_tag(tenant),)
        items = self.inner.search(prefix, limit=SCAN_LIMIT, refresh_ttl=False)
        self._item_deletes.destroy_keys([(tenant, o) for o in _owners(items)])
        if items:
            self.inner.batch([PutOp(tuple(i.namespace), i.key, None) for i in items])
        return len(items)

    async def apurge_tenant_items(self, tenant: str) -> int:
        tenant = self._services.gate.admin_tenant("purge_store", tenant) or tenant
        prefix = (tenant_tag(tenant),)
        items = await self.inner.asearch(prefix, limit=SCAN_LIMIT, refresh_ttl=False)
        await to_thread(self._item_deletes.destroy_keys,
                        [(tenant, o) for o in _owners(items)])
        if items:
            await self.inner.abatch([PutOp(tuple(i.namespace), i.key, None) for i in items])
        return len(items)

    def purge_subject_items(self, tenant: str, namespace: tuple[str, ...]) -> list[str]:
        """Delete ``tenant``'s items whose namespace is ``namespace`` or under it, through the
        inner store's own API (what ``forget_subject(stores=[...])`` runs for each store; an
        operator method, like :meth:`purge_tenant_items`). Their keys are destroyed first
        (crypto-erased wherever a copy survives); returns their PII-vault owner ids (the
        originals go next). Nothing is opened."""
        tenant = self._services.gate.admin_tenant("forget_subject", tenant) or tenant
        items = self.inner.search((tenant_tag(tenant), *namespace), limit=SCAN_LIMIT,
                                  refresh_ttl=False)
        destroy = item_key_destroyer(self._services, tenant, namespace)
        with self.saver.registry.begin() as conn:
            destroy(conn, _owners(items))
        if items:
            inner_batch(self.inner, [PutOp(tuple(i.namespace), i.key, None) for i in items])
        return _owners(items)

    def reached_location(self) -> str:
        """Where this store's items live, as ``forget_subject`` compares it with what the
        registry recorded."""
        return self._location()

    # constructors -----------------------------------------------------------------------------
    @classmethod
    @contextmanager
    def from_url(cls, url: str, **options: Any) -> Iterator[SecureStore]:
        """A SecureStore on one database (``sqlite:///path.db`` or ``postgresql://...``):
        the inner store and the registry, set up. Options are SecureSaver's (``keyring``,
        ``redaction``, ``default_tenant``, ...) plus ``index``, ``blind_index`` and ``ttl``.
        ``saver=``: share an open SecureSaver (its keyring, registry, tenant rules,
        redactor) instead; the options are then only the store's."""
        saver = options.pop("saver", None)
        if saver is None:
            with secure_pair(url, **options) as (_saver, store):
                yield store
            return
        store_options, ttl = _store_only(options)
        with open_sync_store(url, ttl) as inner:
            store = cls(inner, saver=saver, **store_options)
            store.setup()
            yield store

    @classmethod
    @asynccontextmanager
    async def afrom_url(cls, url: str, **options: Any) -> AsyncIterator[SecureStore]:
        """:meth:`from_url` on the async inner stores (AsyncSqliteStore,
        AsyncPostgresStore); ``saver=`` likewise."""
        saver = options.pop("saver", None)
        if saver is None:
            async with asecure_pair(url, **options) as (_saver, store):
                yield store
            return
        store_options, ttl = _store_only(options)
        async with open_async_store(url, ttl) as inner:
            store = cls(inner, saver=saver, **store_options)
            await store.asetup()
            yield store

    # where the items live --------------------------------------------------------------------
    def _location(self) -> str:
        if self.location is None:   # an AsyncSqliteStore asked from a sync caller's thread
            loop = cast(Any, self.inner)._loop
            if _running_loop() is loop:   # waiting here would hold the loop it needs
                raise asyncio.InvalidStateError(
                    "synchronous calls to an async store from its event loop: use the a* "
                    "methods (aput, aforget_subject)")
            self.location = asyncio.run_coroutine_threadsafe(
                astore_location(self.inner), loop).result()
        return self.location

    def _store_id(self) -> str:
        """This store's name among the stores sharing its registry (the versions of its
        items are its own: stores on other databases hold items of the same names)."""
        found: str | None = self.__dict__.get("_store_name")
        if found is None:
            found = self.__dict__["_store_name"] = store_id(self._location())
        return found

    async def _alocation(self) -> str:
        if self.location is None:
            self.location = await astore_location(self.inner)
        return self.location

    def _note_location(self, location: str) -> None:
        """Record where this store writes (once per process): ``forget_subject`` refuses to
        report a subject's items erased while a store it was not given may hold some. The
        registry's own database needs no record (its store table is reached directly)."""
        services = self._services
        if location in services.store_locations:
            return
        registry = self.saver.registry
        if is_durable(location) and location != registry_location(registry.engine):
            registry.note_store(location)
        services.store_locations.add(location)

    # helpers ----------------------------------------------------------------------------------
    def _inner_method(self, name: str) -> Any:
        method = getattr(self.inner, name, None)
        if not callable(method):
            raise NotImplementedError(f"{type(self.inner).__name__} has no {name}()")
        return method

    def _redacts(self, ops: list[Op]) -> bool:
        """Whether preparing ``ops`` redacts anything: a put's value, a search's query (to
        embed) or its filter (to meet the blind index)."""
        if self._core.pii.redactor is None:
            return False
        return any((isinstance(op, PutOp) and op.value is not None)
                   or (isinstance(op, SearchOp) and (op.filter or op.query)) for op in ops)

    @staticmethod
    def _writes(ops: list[Op]) -> bool:
        return any(isinstance(op, PutOp) and op.value is not None for op in ops)

    def _keys(self, tenant: str, ops: list[Op]) -> TenantKeys | None:
        reads = False
        for op in ops:
            if not isinstance(op, PutOp):
                reads = True
            elif op.value is not None:
                return self._services.tenant_keys(tenant)
        return self.saver.keys.keys_for(tenant, create=False) if reads else None

    async def _akeys(self, tenant: str, ops: list[Op]) -> TenantKeys | None:
        if self._writes(ops):
            return await self._services.atenant_keys(tenant)
        if any(not isinstance(op, PutOp) for op in ops):
            return await self._services.aexisting_keys(tenant)
        return None

    async def _adatabase_id(self) -> str:
        cached: str | None = self.__dict__.get("_database_id")
        if cached is None:
            cached = await to_thread(self._services.database_id)
            self.__dict__["_database_id"] = cached
        return cached

    @staticmethod
    async def _run(offload: bool, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in a worker thread when ``offload``, else inline."""
        if offload:
            return await to_thread(fn, *args)
        return fn(*args)



@contextmanager
def secure_pair(url: str, **options: Any) -> Iterator[tuple[SecureSaver, SecureStore]]:
    """``(saver, store)`` on one database, both set up. Options are SecureSaver's plus the
    store's ``index``, ``blind_index`` and ``ttl`` (a LangGraph ``TTLConfig``)."""
    saver_options, store_options, ttl = split_options(options)
    with SecureSaver.from_url(url, **saver_options) as saver, open_sync_store(url, ttl) as inner:
        store = SecureStore(inner, saver=saver, **store_options)
        store.setup()
        yield saver, store


def _store_only(options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The store's options and TTL, when a saver brings everything else."""
    saver_options, store_options, ttl = split_options(options)
    if saver_options:
        raise ConfigurationError(
            f"with saver=, the keyring, registry, redactor and default tenant are the saver's; "
            f"do not pass {sorted(saver_options)} again")
    return store_options, ttl


@asynccontextmanager
async def asecure_pair(url: str, **options: Any
                       ) -> AsyncIterator[tuple[SecureSaver, SecureStore]]:
    """:func:`secure_pair` on the async savers and stores (AsyncSqliteStore,
    AsyncPostgresStore)::

        async with asecure_pair("postgresql://...", keyring=ring) as (saver, store):
            graph = builder.compile(checkpointer=saver, store=store)
    """
    saver_options, store_options, ttl = split_options(options)
    async with SecureSaver.afrom_url(url, **saver_options) as saver, \
            open_async_store(url, ttl) as inner:
        store = SecureStore(inner, saver=saver, **store_options)
        await store.asetup()
        yield saver, store


def _direct(_tenant: str, fn: Any, *args: Any) -> Any:
    """:func:`..redaction.scheduler.redaction_job`'s signature, run in the caller's thread."""
    return fn(*args)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _owners(items: Sequence[Item]) -> list[str]:
    """The PII-vault owner ids of inner items (their namespaces without the tenant label)."""
    return [vault_id(tuple(i.namespace)[1:], i.key) for i in items]


def _placeholder_saver() -> Any:
    """The checkpoint saver a stand-alone SecureStore's services hang off (never written)."""
    from langgraph.checkpoint.memory import InMemorySaver
    return InMemorySaver()


def _store_registry(inner: BaseStore, registry: Registry | str | None) -> Registry:
    """Where a stand-alone store keeps its keys: the given registry, the SQLite file of a
    SqliteStore, memory for an in-memory store; PostgreSQL stores need one named."""
    if isinstance(registry, Registry):
        return registry
    if isinstance(registry, str):
        return Registry(registry)
    from langgraph.store.memory import InMemoryStore
    if isinstance(inner, InMemoryStore):
        return Registry.in_memory()
    conn = getattr(inner, "conn", None)
    execute = getattr(conn, "execute", None)
    if type(inner).__name__ == "SqliteStore" and callable(execute):
        for _seq, name, file in execute("PRAGMA database_list").fetchall():
            if name == "main":
                return Registry(f"sqlite:///{file}") if file else Registry.in_memory()
    raise ConfigurationError(
        f"pass registry=<SQLAlchemy URL> (or saver=) for {type(inner).__name__}: the registry "
        "holds the wrapped tenant keys and must be as durable as the items "
        "(SecureStore.from_url does this for you)")
