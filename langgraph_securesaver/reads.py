"""The read path of a saver: resolve what ``list`` lists, list it from the inner saver (one
thread, or one tenant's threads by a prefix range), authenticate and open every stored tuple
(a detached parent is accepted only when that parent is really gone), and walk the ancestors
for ``get_delta_channel_history``.

:class:`ReadPath` gets the saver's services and inner access; the sealed codec is passed per
call (a clone made by ``with_allowlist`` has its own serializer). Knows nothing of the write
path, retention or the operations.
"""

from __future__ import annotations

import builtins
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack, ExitStack
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple, DeltaChannelHistory

from .errors import TamperedDataError
from .gate import Denial, DeniedError
from .inner_access import InnerAccess
from .keys.crypto import TenantKeys
from .listing import (
    ARows,
    aclosing,
    closing,
    config_name,
    decoding,
    listing,
    named_refusal,
    newest_first,
    parent_config,
    row_ref,
)
from .offthread import to_thread
from .seal import SealedCodec, _DetachedParent
from .services import SaverServices
from .steps import Steps, arun_steps, run_steps
from .tenancy import ThreadRef, thread_prefix

DELTA_FIRST_PAGE = 16
DELTA_MAX_PAGE = 1024
DELTA_OPERATION = "get_delta_channel_history"
DeltaSteps = Steps[Mapping[str, DeltaChannelHistory]]
Known = dict[str, builtins.set[str] | None]


class ReadPath:
    """Listing and opening for one saver (see the module docstring)."""

    def __init__(self, services: SaverServices, io: InnerAccess) -> None:
        self.services = services
        self.io = io
        self.gate = services.gate
        self.pii = services.pii

    def delta_steps(self, codec: SealedCodec, config: RunnableConfig, channels: Sequence[str],
                    locate_in: BaseCheckpointSaver | None = None) -> DeltaSteps:
        """The base-class contract, walked over pages of the inner saver's own listing: one
        body for both APIs, yielding the I/O it needs (driven by :meth:`delta_history` and
        :meth:`adelta_history`).

        The base class would call ``get_tuple`` (a query, a key lookup, every value decrypted
        and PII restored) once per ancestor. Here each page of ancestors is one inner listing,
        each on-path ancestor is authenticated as a read would, and PII is restored once for
        the writes and seeds returned. (The inner saver's own ``get_delta_channel_history``
        returns writes without their checkpoint id and seeds without their version, which
        the sealed values are bound to, so its answer cannot be authenticated.)

        A stored row is refused as its own read refuses it (fail closed, one typed error
        naming the row): the target and a parent fetched by id as ``get_tuple`` does
        (:meth:`lookup_steps`), a listed row as ``list`` does.

        Requests (send back the answer): ``("ref", config)`` the resolved ThreadRef,
        ``("keys", tenant)`` the tenant's keys as ``get_tuple`` requires them (a stored
        target and no keys is a TamperedDataError), ``("get_tuple", config)``,
        ``("list", (config, before, limit, tenant, after))`` opens a listing whose parse
        failures are TamperedDataError (:func:`.listing.listing`, ``after`` naming the row
        before it), ``("next", None)`` its next row or None at its end, ``("close", None)``
        and ``("release", None)`` (before the lookup of a detached ancestor's parent, see
        :meth:`open_steps`) close it, ``("restore", (keys, history))``
        :meth:`restore_history`. A runner closes a listing left open when the walk raises."""
        if not channels:
            return {}
        ref: ThreadRef = yield ("ref", config)
        walk = DeltaWalk(channels)
        target = yield from self.lookup_steps(ref, self.io.config(ref, config), locate_in)
        if target is None:
            return walk.result()
        keys: TenantKeys = yield ("keys", ref.tenant)  # none: refused as get_tuple refuses
        walk.start((yield from self.ancestor_steps(codec, keys, ref, target)))
        page = DELTA_FIRST_PAGE
        while walk.needs_more():
            yield ("list", (self.io.config(ref), walk.before(), page, ref.tenant,
                            config_name(self.io.config(ref, walk.before()))))
            seen = 0
            while (tup := (yield ("next", None))) is not None:
                seen += 1
                if walk.is_next(tup) and not walk.visit(
                        (yield from self.ancestor_steps(codec, keys, ref, tup))):
                    break  # (a detached ancestor, whose lookup released the listing, ends it)
            else:
                if seen < page:
                    walk.listing_ended()
            yield ("close", None)
            if walk.needs_fetch():  # a parent the listing does not reach (ids out of order)
                parent = yield from self.lookup_steps(
                    ref, self.io.config(ref, walk.wanted_config()), locate_in)
                walk.fetched(None if parent is None else
                             (yield from self.ancestor_steps(codec, keys, ref, parent)))
            page = min(page * 4, DELTA_MAX_PAGE)
        if self.pii.redactor is None:
            return walk.result()
        return (yield ("restore", (keys, walk.result())))

    def delta_history(self, codec: SealedCodec, config: RunnableConfig,
                      channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
        """:meth:`delta_steps` with the sync API of the inner saver."""
        inner = self.io.inner
        rows: Iterator[CheckpointTuple] = iter(())  # the open listing, after a "list" request
        with ExitStack() as page:
            def serve(kind: str, arg: Any) -> Any:
                nonlocal inner, rows
                if kind == "ref":
                    ref = self.gate.resolve_ref(arg, DELTA_OPERATION)
                    inner = self.io.sync(DELTA_OPERATION)
                    return ref
                if kind == "keys":
                    return self.services.keys.require(arg)
                if kind == "get_tuple":
                    return inner.get_tuple(arg)
                if kind == "list":
                    cfg, before, limit, tenant, after = arg
                    rows = page.enter_context(closing(listing(tenant, lambda: self.io.listing(
                        inner, cfg, before=before, limit=limit), after)))
                elif kind == "next":
                    return next(rows, None)
                elif kind in ("close", "release"):
                    page.close()
                    rows = iter(())
                else:
                    return self.restore_history(*arg)
                return None
            return run_steps(self.delta_steps(codec, config, channels, self.locate_in()), serve)

    def ancestor_steps(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                       tup: CheckpointTuple) -> Steps[CheckpointTuple]:
        """:meth:`open_steps` for a row of the walked thread (a row of another is refused)."""
        at = self.io.ref_of(ref.tenant, tup)
        if at is None or at.thread_id != ref.thread_id:
            raise TamperedDataError("inner saver returned a checkpoint of another thread")
        return (yield from self.open_steps(codec, keys, at, tup, None))

    def restore_history(self, keys: TenantKeys, history: dict[str, DeltaChannelHistory]
                         ) -> dict[str, DeltaChannelHistory]:
        """PII back in the returned writes and seeds: one vault query for all of them."""
        if self.pii.redactor is None:
            return history
        found: dict[int, builtins.list[str]] = {}
        values = [v for entry in history.values()
                  for v in ([w[2] for w in entry["writes"]]
                            + ([entry["seed"]] if "seed" in entry else []))]
        for value in values:
            tokens = self.pii.redactor.find_tokens(value)
            if tokens:
                found[id(value)] = tokens
        if not found:
            return history
        originals = self.pii.vault.lookup(keys, builtins.list(
            dict.fromkeys(t for tokens in found.values() for t in tokens)))

        def lookup(wanted: Sequence[str]) -> Mapping[str, str]:
            return self.pii.vault.lookup(keys, wanted)

        def restore(value: Any) -> Any:
            tokens = found.get(id(value))
            if not tokens:
                return value
            return self.pii.redactor.restore_value(
                value, lookup, originals={t: originals[t] for t in tokens if t in originals})

        out: dict[str, DeltaChannelHistory] = {}
        for ch, entry in history.items():
            restored: DeltaChannelHistory = {
                "writes": [(t, c, restore(v)) for t, c, v in entry["writes"]]}
            if "seed" in entry:
                restored["seed"] = restore(entry["seed"])
            out[ch] = restored
        return out

    async def adelta_history(self, codec: SealedCodec, config: RunnableConfig,
                             channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
        """:meth:`delta_steps` with the async API: every checkpoint awaited, nothing read
        with the sync API on the loop (key and vault lookups run off it; a sync-only inner
        saver is walked by :meth:`delta_history` in a worker thread)."""
        if channels and self.io.sync_only:
            return await to_thread(self.delta_history, codec, config, channels)
        inner = self.io.inner
        rows: AsyncIterator[CheckpointTuple] = empty_rows()  # after a "list" request
        async with AsyncExitStack() as page:
            async def serve(kind: str, arg: Any) -> Any:
                nonlocal rows
                if kind == "ref":
                    return await self.gate.aresolve_ref(arg, DELTA_OPERATION)
                if kind == "keys":
                    return await self.services.arequire_keys(arg)
                if kind == "get_tuple":
                    return await inner.aget_tuple(arg)
                if kind == "list":
                    cfg, before, limit, tenant, after = arg
                    rows = await page.enter_async_context(aclosing(ARows(
                        inner.alist(cfg, before=before, limit=limit), tenant, after)))
                elif kind == "next":
                    return await anext(rows, None)
                elif kind in ("close", "release"):
                    await page.aclose()
                    rows = empty_rows()
                else:
                    return await to_thread(self.restore_history, *arg)
                return None
            return await arun_steps(self.delta_steps(codec, config, channels), serve)

    def list_args(self, config: RunnableConfig | None, before: RunnableConfig | None
                   ) -> tuple[str, RunnableConfig | None, RunnableConfig | None, bool]:
        if config is None:
            tenant = self.gate.tenant("list(None)")
            inner_config = None
        else:
            ref = self.gate.ref(config, "list")
            tenant = ref.tenant
            has_ns = "checkpoint_ns" in (config.get("configurable") or {})
            inner_config = self.io.config(ref, config, with_ns=has_ns)
        inner_before = None
        if before is not None:
            bconf = before.get("configurable") or {}
            if bconf.get("thread_id") is not None:
                bref = self.gate.ref(before, "list(before=...)")
                if bref.tenant != tenant:
                    raise DeniedError(Denial(tenant, bref.tenant, "list", bref.thread_id))
                inner_before = self.io.config(bref, before)
            else:
                inner_before = before
        return tenant, inner_config, inner_before, config is not None

    # the inner listing behind list/alist: one thread, or one tenant's threads ---------------
    def inner_rows(self, tenant: str, config: RunnableConfig | None, filter: Any,
                    before: RunnableConfig | None, limit: int | None, one_thread: bool
                    ) -> Iterator[CheckpointTuple]:
        """What the inner saver lists for ``list``: a config's thread as is; for
        ``list(None)`` only the tenant's threads (found by a prefix range on the inner
        table, then listed one by one and merged newest first), so the cost is O(this
        tenant's rows) whatever other tenants store. Savers without a prefix query fall back
        to listing everything (other tenants' rows are skipped, unopened)."""
        inner = self.io.sync("list")
        if one_thread:
            return self.io.listing(inner, config, filter=filter, before=before, limit=limit)
        ids = self.services.storage.thread_ids(thread_prefix(tenant))
        if ids is None:
            return self.io.listing(inner, None, filter=filter, before=before)
        return newest_first([builtins.list(inner.list(
            {"configurable": {"thread_id": tid}}, filter=filter, before=before, limit=limit))
            for tid in ids])

    async def ainner_rows(self, tenant: str, config: RunnableConfig | None, filter: Any,
                           before: RunnableConfig | None, limit: int | None, one_thread: bool
                           ) -> Any:
        """Async twin of :meth:`inner_rows` (an async or a sync iterable)."""
        if self.io.sync_only:
            return await to_thread(lambda: builtins.list(self.inner_rows(
                tenant, config, filter, before, limit, one_thread)))
        if one_thread:
            return self.io.inner.alist(config, filter=filter, before=before, limit=limit)
        ids = await self.services.storage.athread_ids(thread_prefix(tenant))
        if ids is None:
            return self.io.inner.alist(None, filter=filter, before=before)
        per_thread: builtins.list[builtins.list[CheckpointTuple]] = []
        for tid in ids:
            per_thread.append([t async for t in self.io.inner.alist(
                {"configurable": {"thread_id": tid}}, filter=filter, before=before,
                limit=limit)])
        return newest_first(per_thread)

    # opening stored tuples (shared by reads): one body, a sync and an async runner ---------
    def listed_steps(self, codec: SealedCodec, keys: TenantKeys, tenant: str,
                     tup: CheckpointTuple) -> Steps[tuple[CheckpointTuple, Known | None] | None]:
        """:meth:`open_steps` for a row of a listing, with the PII tokens it holds (None for
        another tenant's row in an unscoped inner listing)."""
        ref = self.io.ref_of(tenant, tup)
        if ref is None:
            return None
        known: Known | None = {} if self.pii.redactor is not None else None
        return (yield from self.open_steps(codec, keys, ref, tup, known)), known

    def open_steps(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                   tup: CheckpointTuple, known: Known | None) -> Steps[CheckpointTuple]:
        """open_tuple, plus the one check it cannot make alone: a checkpoint whose parent link
        is gone is accepted only if that parent no longer exists (pruned with keep_latest).
        Requests: ``("release", None)`` frees an inner listing in progress (its cursor and
        lock) before ``("get_tuple", config)`` looks the parent up. A refusal names the row."""
        at = row_ref(ref, tup)
        try:
            try:
                return codec.open_tuple(keys, at, tup, self.io.outer(ref.tenant), known)
            except _DetachedParent as detached:
                parent_cfg, refusal = parent_config(at, tup, detached.parent), str(detached)
            yield ("release", None)
            exists = (yield from self.lookup_steps(at, parent_cfg)) is not None
            if exists:
                raise TamperedDataError(refusal)
            return codec.open_tuple(keys, at, tup, self.io.outer(ref.tenant), known,
                                    detached_ok=True)
        except _DetachedParent:
            raise
        except TamperedDataError as exc:
            raise named_refusal(ref, tup, exc) from None

    def fetch(self, ref: ThreadRef, inner_config: RunnableConfig) -> CheckpointTuple | None:
        """The stored row ``get_tuple`` reads (sync API): :meth:`lookup_steps`, the body
        the delta walk reads its target and fetched parents with."""
        inner = self.io.sync("get_tuple")
        return run_steps(self.lookup_steps(ref, inner_config, self.locate_in()),
                         lambda _kind, config: inner.get_tuple(config))

    async def afetch(self, ref: ThreadRef, inner_config: RunnableConfig
                     ) -> CheckpointTuple | None:
        """:meth:`fetch` with the async API (no row lookup on the loop)."""
        return await arun_steps(self.lookup_steps(ref, inner_config),
                                lambda _kind, config: self.io.call("get_tuple", config))

    def locate_in(self) -> BaseCheckpointSaver | None:
        """Where sync reads look a refused row up (a sync-only SQLite/Postgres saver)."""
        return self.io.inner if self.io.sync_only else None

    def lookup_steps(self, ref: ThreadRef, inner_config: RunnableConfig,
                     locate_in: BaseCheckpointSaver | None = None
                     ) -> Steps[CheckpointTuple | None]:
        """``("get_tuple", inner_config)`` as ``get_tuple`` reads it: a stored row that does
        not parse is a TamperedDataError naming the row (``locate_in``, a sync SQLite or
        PostgreSQL saver on sync paths only, names its table and column too)."""
        with decoding(ref, inner_config, locate_in):
            return (yield ("get_tuple", inner_config))

    def latest_steps(self, codec: SealedCodec, ref: ThreadRef,
                     locate_in: BaseCheckpointSaver | None = None
                     ) -> Steps[CheckpointTuple | None]:
        """``get_tuple`` of the thread's latest checkpoint in ``ref``'s namespace, as it reads
        it: :meth:`lookup_steps`, the tenant's keys as it requires them (``("keys", tenant)``;
        a stored row and no keys is a TamperedDataError), then :meth:`open_steps`. A row that
        does not parse or does not authenticate (edited, rolled back, copied from another
        thread) is the TamperedDataError naming it. PII tokens are left as stored."""
        tup = yield from self.lookup_steps(ref, self.io.config(ref), locate_in)
        if tup is None:
            return None
        keys: TenantKeys = yield ("keys", ref.tenant)
        return (yield from self.open_steps(codec, keys, ref, tup, None))

    def latest_checked(self, codec: SealedCodec, ref: ThreadRef) -> CheckpointTuple | None:
        """:meth:`latest_steps` with the sync API of the inner saver (an async-only one from a
        worker thread, on its own loop): for operations that may act on what a stored
        checkpoint says only once it is authenticated (the pruner's checkpoint time)."""
        opening = self.opening(None)

        def serve(kind: str, arg: Any) -> Any:
            if kind == "keys":
                return self.services.keys.require(arg)
            return opening(kind, arg)
        locate_in = self.io.inner if self.io.sync_only else None  # as get_tuple names rows
        return run_steps(self.latest_steps(codec, ref, locate_in), serve)

    def open_listed(self, codec: SealedCodec, keys: TenantKeys, tenant: str,
                    tup: CheckpointTuple, release: Callable[[], None] | None = None
                    ) -> tuple[CheckpointTuple, Known | None] | None:
        return run_steps(self.listed_steps(codec, keys, tenant, tup), self.opening(release))

    async def aopen_listed(self, codec: SealedCodec, keys: TenantKeys, tenant: str,
                           tup: CheckpointTuple,
                           release: Callable[[], Awaitable[None]] | None = None
                           ) -> tuple[CheckpointTuple, Known | None] | None:
        ref = self.io.ref_of(tenant, tup)
        if ref is not None:
            await self.services.awarm_thread_key(tenant, ref.thread_id)
        return await arun_steps(self.listed_steps(codec, keys, tenant, tup),
                                self.aopening(release), to_thread)

    def open_checked(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                     tup: CheckpointTuple, known: Known | None,
                     release: Callable[[], None] | None = None) -> CheckpointTuple:
        return run_steps(self.open_steps(codec, keys, ref, tup, known), self.opening(release))

    async def aopen_checked(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                            tup: CheckpointTuple, known: Known | None,
                            release: Callable[[], Awaitable[None]] | None = None
                            ) -> CheckpointTuple:
        await self.services.awarm_thread_key(ref.tenant, ref.thread_id)
        # decryption (and its integrity checks) off the event loop
        return await arun_steps(self.open_steps(codec, keys, ref, tup, known),
                                self.aopening(release), to_thread)

    def opening(self, release: Callable[[], None] | None) -> Callable[[str, Any], Any]:
        """The sync I/O of :meth:`open_steps` (``release`` frees the caller's listing)."""
        def serve(kind: str, arg: Any) -> Any:
            if kind == "release":
                return None if release is None else release()
            return self.io.sync("get_tuple").get_tuple(arg)
        return serve

    def aopening(self, release: Callable[[], Awaitable[None]] | None
                 ) -> Callable[[str, Any], Awaitable[Any]]:
        """The async I/O of :meth:`open_steps`."""
        async def serve(kind: str, arg: Any) -> Any:
            if kind == "release":
                return None if release is None else await release()
            return await self.io.call("get_tuple", arg)
        return serve


class DeltaWalk:
    """The base-class ancestor walk of ``get_delta_channel_history``, fed one opened tuple at
    a time (newest first) so the rows can come from paged listings of the inner saver."""

    def __init__(self, channels: Sequence[str]) -> None:
        self.channels = builtins.list(channels)
        self.collected: dict[str, builtins.list[Any]] = {c: [] for c in self.channels}
        self.seeds: dict[str, Any] = {}
        self.remaining = set(self.channels)
        self.wanted: str | None = None     # the next ancestor's checkpoint id
        self.last_seen: str | None = None  # where the next page starts (exclusive)
        self.done = False
        self.fetch = False
        self.visited: builtins.set[str] = set()

    def start(self, target: CheckpointTuple) -> None:
        """Begin at the (opened) target: its own values and writes do not count."""
        self.last_seen = target.checkpoint["id"]
        self.wanted = parent_id(target)
        self.done = self.wanted is None

    def needs_more(self) -> bool:
        return not self.done and bool(self.remaining)

    def before(self) -> RunnableConfig:
        return {"configurable": {"checkpoint_id": self.last_seen}}

    def is_next(self, tup: CheckpointTuple) -> bool:
        cid = tup.config["configurable"].get("checkpoint_id")
        self.last_seen = cid
        return cid == self.wanted  # other rows are forks off the path

    def visit(self, tup: CheckpointTuple) -> bool:
        """Take one on-path ancestor; False when the walk is complete."""
        cid = tup.checkpoint["id"]
        if cid in self.visited:
            raise TamperedDataError("the parent chain of a checkpoint loops")
        self.visited.add(cid)
        for write in reversed(tup.pending_writes or []):
            if write[1] in self.remaining:
                self.collected[write[1]].append(write)
        values = tup.checkpoint["channel_values"]
        for ch in builtins.list(self.remaining):
            if ch in values:
                self.seeds[ch] = values[ch]
                self.remaining.discard(ch)
        self.wanted = parent_id(tup)
        self.done = self.wanted is None or not self.remaining
        return not self.done

    def listing_ended(self) -> None:
        """No older rows: a parent still wanted is fetched by id (ids need not be ordered)."""
        self.fetch = self.needs_more()

    def needs_fetch(self) -> bool:
        return self.fetch and self.needs_more()

    def wanted_config(self) -> RunnableConfig:
        return {"configurable": {"checkpoint_id": self.wanted}}

    def fetched(self, tup: CheckpointTuple | None) -> None:
        self.fetch = False
        if tup is None:
            self.done = True  # the parent is not stored (pruned or lost): stop, as the base does
            return
        self.last_seen = tup.checkpoint["id"]
        self.visit(tup)

    def result(self) -> dict[str, DeltaChannelHistory]:
        out: dict[str, DeltaChannelHistory] = {}
        for ch in self.channels:
            entry: DeltaChannelHistory = {"writes": builtins.list(reversed(self.collected[ch]))}
            if ch in self.seeds:
                entry["seed"] = self.seeds[ch]
            out[ch] = entry
        return out


def parent_id(tup: CheckpointTuple) -> str | None:
    if tup.parent_config is None:
        return None
    return tup.parent_config["configurable"].get("checkpoint_id") or None


async def empty_rows() -> AsyncIterator[CheckpointTuple]:
    """No listing open."""
    return
    yield
