"""The read path of a saver: resolve what ``list`` lists, list it from the inner saver (one
thread, or one tenant's threads by a prefix range), authenticate and open every stored tuple
(a detached parent is accepted only when that parent is really gone), and walk the ancestors
for ``get_delta_channel_history``.

:class:`ReadPath` gets the saver's services and inner access; the sealed codec is passed per
call (a clone made by ``with_allowlist`` has its own serializer). Knows nothing of the write
path, retention or the operations.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack, ExitStack
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, DeltaChannelHistory

from .crypto import TenantKeys
from .errors import TamperedDataError
from .gate import Denial, DeniedError
from .inner_access import InnerAccess
from .listing import (
    aclosing,
    closing,
    decoding,
    named_refusal,
    newest_first,
    parent_config,
    row_ref,
)
from .seal import SealedCodec, _DetachedParent
from .services import SaverServices
from .tenancy import ThreadRef, thread_prefix

DELTA_FIRST_PAGE = 16
DELTA_MAX_PAGE = 1024
DELTA_OPERATION = "get_delta_channel_history"
DeltaSteps = Generator[tuple[str, Any], Any, Mapping[str, DeltaChannelHistory]]


class ReadPath:
    """Listing and opening for one saver (see the module docstring)."""

    def __init__(self, services: SaverServices, io: InnerAccess) -> None:
        self.services = services
        self.io = io
        self.gate = services.gate
        self.pii = services.pii

    def delta_steps(self, codec: SealedCodec, config: RunnableConfig,
                    channels: Sequence[str]) -> DeltaSteps:
        """The base-class contract, walked over pages of the inner saver's own listing: one
        body for both APIs, yielding the I/O it needs (driven by :meth:`delta_history` and
        :meth:`adelta_history`).

        The base class would call ``get_tuple`` (a query, a key lookup, every value decrypted
        and PII restored) once per ancestor. Here each page of ancestors is one inner listing,
        each on-path ancestor is authenticated as a read would, and PII is restored once for
        the writes and seeds returned. (The inner saver's own ``get_delta_channel_history``
        returns writes without their checkpoint id and seeds without their version, which
        the sealed values are bound to, so its answer cannot be authenticated.)

        Requests (send back the answer): ``("ref", config)`` the resolved ThreadRef,
        ``("keys", tenant)`` the tenant's existing keys or None, ``("get_tuple", config)``,
        ``("list", (config, before, limit))`` opens a listing, ``("next", None)`` its next
        row or None at its end, ``("close", None)`` closes it, ``("restore", (keys,
        history))`` :meth:`restore_history`. A runner closes a listing left open when the
        walk raises."""
        if not channels:
            return {}
        ref: ThreadRef = yield ("ref", config)
        walk = DeltaWalk(channels)
        keys: TenantKeys | None = yield ("keys", ref.tenant)
        target = yield ("get_tuple", self.io.config(ref, config))
        if target is None or keys is None:
            return walk.result()

        def ancestor(tup: CheckpointTuple) -> CheckpointTuple:
            return self.open_ancestor(codec, keys, ref, tup)

        walk.start(ancestor(target))
        page = DELTA_FIRST_PAGE
        while walk.needs_more():
            yield ("list", (self.io.config(ref), walk.before(), page))
            seen = 0
            while (tup := (yield ("next", None))) is not None:
                seen += 1
                if walk.is_next(tup) and not walk.visit(ancestor(tup)):
                    break
            else:
                if seen < page:
                    walk.listing_ended()
            yield ("close", None)
            if walk.needs_fetch():  # a parent the listing does not reach (ids out of order)
                parent = yield ("get_tuple", self.io.config(ref, walk.wanted_config()))
                walk.fetched(None if parent is None else ancestor(parent))
            page = min(page * 4, DELTA_MAX_PAGE)
        if self.pii.redactor is None:
            return walk.result()
        return (yield ("restore", (keys, walk.result())))

    def delta_history(self, codec: SealedCodec, config: RunnableConfig,
                      channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
        """:meth:`delta_steps` with the sync API of the inner saver."""
        steps = self.delta_steps(codec, config, channels)
        inner = self.io.inner
        rows: Iterator[CheckpointTuple]  # the open listing, after a "list" request
        reply: Any = None
        with ExitStack() as listing:
            while True:
                try:
                    kind, arg = steps.send(reply)
                except StopIteration as done:
                    return cast(Mapping[str, DeltaChannelHistory], done.value)
                reply = None
                if kind == "ref":
                    reply = self.gate.resolve_ref(arg, DELTA_OPERATION)
                    inner = self.io.sync(DELTA_OPERATION)
                elif kind == "keys":
                    reply = self.services.keys.keys_for(arg, create=False)
                elif kind == "get_tuple":
                    reply = inner.get_tuple(arg)
                elif kind == "list":
                    cfg, before, limit = arg
                    rows = iter(listing.enter_context(closing(
                        self.io.listing(inner, cfg, before=before, limit=limit))))
                elif kind == "next":
                    reply = next(rows, None)
                elif kind == "close":
                    listing.close()
                else:
                    reply = self.restore_history(*arg)

    def open_ancestor(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                      tup: CheckpointTuple) -> CheckpointTuple:
        at = self.io.ref_of(ref.tenant, tup)
        if at is None or at.thread_id != ref.thread_id:
            raise TamperedDataError("inner saver returned a checkpoint of another thread")
        return self.open_checked(codec, keys, at, tup, None)

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
        """:meth:`delta_steps` with the async API (key and vault lookups off the loop; a
        sync-only inner saver walked by :meth:`delta_history` in a worker thread)."""
        if channels and self.io.sync_only:
            return await asyncio.to_thread(self.delta_history, codec, config, channels)
        steps = self.delta_steps(codec, config, channels)
        rows: AsyncIterator[CheckpointTuple]  # the open listing, after a "list" request
        reply: Any = None
        async with AsyncExitStack() as listing:
            while True:
                try:
                    kind, arg = steps.send(reply)
                except StopIteration as done:
                    return cast(Mapping[str, DeltaChannelHistory], done.value)
                reply = None
                if kind == "ref":
                    reply = await self.gate.aresolve_ref(arg, DELTA_OPERATION)
                elif kind == "keys":
                    reply = await self.services.aexisting_keys(arg)
                elif kind == "get_tuple":
                    reply = await self.io.inner.aget_tuple(arg)
                elif kind == "list":
                    cfg, before, limit = arg
                    rows = aiter(await listing.enter_async_context(aclosing(
                        self.io.inner.alist(cfg, before=before, limit=limit))))
                elif kind == "next":
                    reply = await anext(rows, None)
                elif kind == "close":
                    await listing.aclose()
                else:
                    reply = await asyncio.to_thread(self.restore_history, *arg)

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
            return await asyncio.to_thread(lambda: builtins.list(self.inner_rows(
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

    def open_listed(self, codec: SealedCodec, keys: TenantKeys, tenant: str,
                    tup: CheckpointTuple,
                     release: Callable[[], None] | None = None
                     ) -> tuple[CheckpointTuple, dict[str, builtins.set[str] | None] | None] | None:
        ref = self.io.ref_of(tenant, tup)
        if ref is None:
            return None  # another tenant's row in an unscoped inner listing
        known: dict[str, builtins.set[str] | None] | None = (
            {} if self.pii.redactor is not None else None)
        return self.open_checked(codec, keys, ref, tup, known, release), known

    async def aopen_listed(self, codec: SealedCodec, keys: TenantKeys, tenant: str,
                           tup: CheckpointTuple,
                            release: Callable[[], Awaitable[None]] | None = None
                            ) -> tuple[CheckpointTuple, dict[str, builtins.set[str] | None]
                                       | None] | None:
        ref = self.io.ref_of(tenant, tup)
        if ref is None:
            return None
        known: dict[str, builtins.set[str] | None] | None = (
            {} if self.pii.redactor is not None else None)
        return await self.aopen_checked(codec, keys, ref, tup, known, release), known

    # opening stored tuples (shared by reads) ------------------------------------------------
    def open_checked(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                     tup: CheckpointTuple,
                      known: dict[str, builtins.set[str] | None] | None,
                      release: Callable[[], None] | None = None) -> CheckpointTuple:
        try:
            return self._open_checked(codec, keys, ref, tup, known, release)
        except _DetachedParent:
            raise
        except TamperedDataError as exc:
            raise named_refusal(ref, tup, exc) from None

    async def aopen_checked(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                            tup: CheckpointTuple,
                             known: dict[str, builtins.set[str] | None] | None,
                             release: Callable[[], Awaitable[None]] | None = None
                             ) -> CheckpointTuple:
        try:
            return await self._aopen_checked(codec, keys, ref, tup, known, release)
        except _DetachedParent:
            raise
        except TamperedDataError as exc:
            raise named_refusal(ref, tup, exc) from None

    def _open_checked(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                      tup: CheckpointTuple,
                            known: dict[str, builtins.set[str] | None] | None,
                            release: Callable[[], None] | None = None) -> CheckpointTuple:
        """open_tuple, plus the one check it cannot make alone: a checkpoint whose parent link
        is gone is accepted only if that parent no longer exists (pruned with keep_latest).
        ``release`` frees an inner listing in progress before that lookup."""
        at = row_ref(ref, tup)
        try:
            return codec.open_tuple(keys, at, tup, self.io.outer(ref.tenant), known)
        except _DetachedParent as detached:
            if release is not None:
                release()
            parent_cfg = parent_config(at, tup, detached.parent)
            inner = self.io.sync("get_tuple")
            with decoding(at, parent_cfg):
                exists = inner.get_tuple(parent_cfg) is not None
            if exists:
                raise TamperedDataError(str(detached)) from None
            return codec.open_tuple(keys, at, tup, self.io.outer(ref.tenant), known,
                                         detached_ok=True)

    async def _aopen_checked(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                                   tup: CheckpointTuple,
                                   known: dict[str, builtins.set[str] | None] | None,
                                   release: Callable[[], Awaitable[None]] | None = None
                                   ) -> CheckpointTuple:
        at = row_ref(ref, tup)
        try:
            return codec.open_tuple(keys, at, tup, self.io.outer(ref.tenant), known)
        except _DetachedParent as detached:
            if release is not None:
                await release()
            parent_cfg = parent_config(at, tup, detached.parent)
            with decoding(at, parent_cfg):
                exists = await self.io.call("get_tuple", parent_cfg) is not None
            if exists:
                raise TamperedDataError(str(detached)) from None
            return codec.open_tuple(keys, at, tup, self.io.outer(ref.tenant), known,
                                         detached_ok=True)


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
