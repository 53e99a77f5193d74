"""The logic SecureStore's sync and async paths share: one batch of caller ops becomes one
batch of inner ops (tenant-prefixed namespaces, sealed values, blind-index filters), and the
inner results become the caller's results (authenticated, opened, restored, filtered, scored).

A batch runs in three steps, so the async path can put each one where it belongs (CPU and
registry work off the event loop, embedding and the inner store awaited):

1. :meth:`StoreCore.prepare` -- validate, redact put values (originals to the PII vault),
   collect the texts to embed (redacted) and the queries to embed (redacted);
2. :meth:`BatchPlan.inner_ops` -- seal each value with its vectors, given the embeddings;
3. :meth:`BatchPlan.finish` -- open the inner results for the caller.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langgraph.store.base import (
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from ..errors import ItemChangedError, TamperedDataError
from ..keys.crypto import TenantKeys
from ..keys.material import SecretBytes
from ..keys.tokens import ITEM
from ..pii_layer import PiiLayer
from ..registry import item_versions
from ..registry.item_versions import Version
from ..registry.subjects import subject_digest
from ..registry.thread_keys import ThreadKeyStore
from ..storage.store_format import vault_id
from ..tenancy import tenant_tag
from . import codec, matching

logger = logging.getLogger(__name__)

#: the redaction channel store values are redacted under (redaction policies can name it)
STORE_CHANNEL = "__store__"
#: "every row" for an inner search whose filtering, scoring or paging SecureStore does itself
SCAN_LIMIT = 2 ** 62
#: how often a batch reads again the items another process deleted (or deleted and wrote)
#: under its read before the failure is raised
_REREADS = 3
#: the first pause (seconds, doubling, randomized) before a put sealed again writes again
_BACKOFF = 0.0005
_NO_KEY = ("a store item of tenant {!r} has no key: it was deleted, and what the inner store "
           "returns is left of it or a copy put back after the deletion, or moved there from "
           "another item")


@dataclass
class _Put:
    op: PutOp
    value_json: bytes = b""
    blind: dict[str, str] = field(default_factory=dict)
    texts: list[tuple[str, str]] = field(default_factory=list)
    vectors: dict[str, Sequence[float]] = field(default_factory=dict)


@dataclass
class BatchPlan:
    """One caller batch, prepared (see the module docstring)."""

    tenant: str
    keys: TenantKeys | None
    database_id: str
    ops: list[Op]
    puts: dict[int, _Put]
    queries: dict[int, str]          # search op index -> redacted query (to embed)
    scans: dict[int, bool]           # search op index -> SecureStore pages itself
    core: StoreCore
    tag: str = ""                    # the tenant's namespace label in the inner store
    #: redacted equality filters by search op index (what the blind index is compared with)
    filters: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: item id -> (key row, version) its put was sealed under (confirmed once it landed)
    used: dict[str, tuple[float, Version]] = field(default_factory=dict)
    #: item id -> (key row, the version it is at), read after the inner read
    versions: dict[str, tuple[float, Version]] = field(default_factory=dict)
    #: item id -> (key row, version) of items read at a version not yet confirmed
    ahead: dict[str, tuple[float, Version]] = field(default_factory=dict)
    #: how often this batch's puts were sealed again
    reseals: int = 0
    #: the store's name among those sharing the registry, or what finds it when first needed
    store: str = ""
    locate: Callable[[], str] | None = None

    #: the process's write count when the inner read was made (see ItemDeletes.under_way)
    read_at: int = 0

    def store_id(self) -> str:
        if not self.store and self.locate is not None:
            self.store = self.locate()
        return self.store

    def __post_init__(self) -> None:
        self.tag = tenant_tag(self.tenant)

    def keys_cached(self, results: Sequence[Result]) -> bool:
        """Whether every returned item's key is cached (opening them then reads no registry
        row: the async path may open them on the event loop)."""
        item_keys = self.core.item_keys
        if item_keys is None:
            return True
        for res in results:
            for item in res if isinstance(res, list) else [res]:
                if isinstance(item, Item) and not item_keys.cached(
                        self.tenant, vault_id(tuple(item.namespace)[1:], item.key), ITEM):
                    return False
        return True

    def found_items(self, results: Sequence[Result]) -> bool:
        """Whether the inner store returned any item (to open, keys are needed)."""
        return any(isinstance(op, (GetOp, SearchOp)) and bool(res)
                   for op, res in zip(self.ops, results, strict=True))

    def texts(self) -> list[str]:
        return [text for put in self.puts.values() for _name, text in put.texts]

    def query_texts(self) -> list[str]:
        return list(dict.fromkeys(self.queries.values()))

    def inner_ops(self, vectors: Sequence[Sequence[float]]) -> list[Op]:
        """The inner batch; ``vectors`` are the embeddings of :meth:`texts`, in order."""
        it = iter(vectors)
        out: list[Op] = []
        tag = self.tag
        for i, op in enumerate(self.ops):
            if isinstance(op, GetOp):
                out.append(GetOp((tag, *op.namespace), op.key, op.refresh_ttl))
            elif isinstance(op, PutOp):
                out.append(self._inner_put(tag, op, self.puts.get(i), it))
            elif isinstance(op, SearchOp):
                out.append(self._inner_search(tag, i, op))
            elif isinstance(op, ListNamespacesOp):
                out.append(self.core.inner_list(tag, op))
            else:  # pragma: no cover - prepare() refused it
                raise ValueError(f"Unknown operation type: {type(op)}")
        return out

    def _inner_put(self, tag: str, op: PutOp, put: _Put | None, it: Any) -> PutOp:
        ns = (tag, *op.namespace)
        if op.value is None or put is None:
            return PutOp(ns, op.key, None, index=False, ttl=op.ttl)
        put.vectors = {name: next(it) for name, _text in put.texts}
        return self._sealed_put(ns, put)

    def _sealed_put(self, ns: tuple[str, ...], put: _Put) -> PutOp:
        """The inner put of ``put``, sealed under its item's current key."""
        op = put.op
        if self.keys is None:  # pragma: no cover - prepare() creates keys for puts
            raise TamperedDataError("no keys to seal a put with")
        key, version = None, ""
        item_keys = self.core.item_keys
        if item_keys is not None:
            item = vault_id(op.namespace, op.key)
            key, born, current = item_keys.item_key(
                self.tenant, item, subject_digest(self.keys, op.namespace[0]), self.store_id())
            sealed_at = item_versions.next_version(current)
            self.used[item] = (born, sealed_at)
            version = item_versions.text(sealed_at)
        sealed = codec.seal_item(
            self.keys, codec.item_aad(self.database_id, self.tenant, op.namespace, op.key),
            put.value_json, put.vectors, put.blind, key, version)
        return PutOp(ns, op.key, sealed, index=False, ttl=op.ttl)

    @staticmethod
    def reads(inner_ops: Sequence[Op]) -> list[int]:
        """The positions of the read operations in an inner batch (what is read again when
        an item changed under the read: the batch's writes are not repeated)."""
        return [i for i, op in enumerate(inner_ops) if not isinstance(op, PutOp)]

    def written(self) -> tuple[str, str, dict[str, tuple[float, Version]]]:
        """What confirms this batch's puts (``item_versions.confirm_many``): taken once."""
        written, self.used = (self.tenant, self.store_id(), self.used), {}
        return written

    def stale_puts(self, refused: Sequence[str] | None = None) -> list[PutOp]:
        """Once the inner batch landed: each put's version confirmed (here, or by the caller:
        ``refused``, the items :meth:`written` was refused for), and the puts to seal and
        write again -- another process deleted their item meanwhile, or another put of it
        confirmed the same or a later number and may have landed after this one; empty when
        every put is its item's confirmed version."""
        item_keys = self.core.item_keys
        if item_keys is None or self.keys is None:
            return []
        if refused is None:
            if not self.used:
                return []
            refused = item_keys.confirm_items([self.written()])[0]
        stale = set(refused)
        if stale:
            # puts of one item racing each other seal again in turn, not in lockstep
            self.reseals += 1
            time.sleep(random.uniform(0, _BACKOFF * 2 ** min(self.reseals, 6)))  # noqa: S311
        return [self._sealed_put((self.tag, *put.op.namespace), put)
                for _i, put in sorted(self.puts.items())
                if vault_id(put.op.namespace, put.op.key) in stale]

    def _inner_search(self, tag: str, i: int, op: SearchOp) -> SearchOp:
        inner_filter: dict[str, Any] = {}
        complete = not op.filter
        if op.filter and self.keys is not None and self.core.blind_index:
            inner_filter, complete = codec.pushdown_filter(
                self.keys, self.filters.get(i, op.filter))
        scan = not complete or i in self.queries
        self.scans[i] = scan
        # a scan reads more than it returns: its TTL refresh follows (see :meth:`refreshes`)
        return SearchOp((tag, *op.namespace_prefix), inner_filter or None,
                        SCAN_LIMIT if scan else op.limit, 0 if scan else op.offset,
                        None, op.refresh_ttl and not scan)

    def refreshes(self, results: Sequence[Result]) -> list[Op]:
        """The TTL refreshes the scans of this batch owe: one inner get per item a scanning
        search returned (the raw store refreshes what a search returns, nothing else)."""
        out: list[Op] = []
        for i, (op, res) in enumerate(zip(self.ops, results, strict=True)):
            if isinstance(op, SearchOp) and op.refresh_ttl and self.scans.get(i):
                out.extend(GetOp((self.tag, *item.namespace), item.key, True)
                           for item in cast("list[SearchItem]", res or []))
        return out

    def opens_in_registry(self, results: Sequence[Result]) -> bool:
        """Whether opening ``results`` reads the registry (the items' versions): off the loop."""
        return self.core.item_keys is not None and any(
            isinstance(item, Item) for res in results
            for item in (res if isinstance(res, list) else [res]))

    def open_results(self, results: Sequence[Result]) -> list[Any]:
        """Authenticate and decrypt every item the inner store returned (PII tokens still
        in): per op, an :class:`Opened` (get), a list of them (search), or the raw result.
        Each item's version is checked against its key row, read once for the batch after
        the inner read (``versions``); items met at a version not yet confirmed are confirmed
        (``ahead``, one registry transaction when there are any)."""
        item_keys = self.core.item_keys
        if item_keys is not None:
            names = [vault_id(tuple(item.namespace)[1:], item.key) for res in results
                     for item in (res if isinstance(res, list) else [res])
                     if isinstance(item, Item)]
            self.versions = item_versions.read(item_keys.registry, self.tenant,
                                               self.store_id(), names) if names else {}
            self.ahead = {}
        out: list[Any] = []
        open_item = self.core.open_item
        for op, res in zip(self.ops, results, strict=True):
            if isinstance(op, GetOp):
                out.append(None if res is None else open_item(self, cast(Item, res)))
            elif isinstance(op, SearchOp):
                found = [open_item(self, it) for it in cast("list[Item]", res or [])]
                out.append([one for one in found if one is not None])
            else:
                out.append(res)
        if self.ahead and item_keys is not None:
            item_versions.confirm(item_keys.registry, self.tenant, self.store_id(), self.ahead)
        return out

    def tokens(self, opened: Sequence[Any]) -> list[str]:
        """The PII tokens in the opened values (one vault lookup serves the whole batch)."""
        redactor = self.core.pii.redactor
        if redactor is None:
            return []
        found: dict[str, None] = {}
        for entry in opened:
            for one in entry if isinstance(entry, list) else [entry]:
                if isinstance(one, Opened) and one.may_hold_tokens:
                    found.update(dict.fromkeys(redactor.find_tokens(one.value)))
        return list(found)

    def finish(self, opened: Sequence[Any], query_vectors: Sequence[Sequence[float]],
               originals: Mapping[str, str]) -> list[Result]:
        """The caller's results from :meth:`open_results` (``query_vectors`` in
        :meth:`query_texts` order, ``originals``: the vault's values of :meth:`tokens`)."""
        by_text = dict(zip(self.query_texts(), query_vectors, strict=True)) \
            if self.queries else {}
        restore = self.core.restorer(originals)
        out: list[Result] = []
        for i, (op, res) in enumerate(zip(self.ops, opened, strict=True)):
            if isinstance(op, GetOp):
                out.append(None if res is None else res.item(restore(res.value)))
            elif isinstance(op, SearchOp):
                query = by_text.get(self.queries[i]) if i in self.queries else None
                out.append(self.core.finish_search(
                    op, res, restore, query, self.scans.get(i, False)))
            elif isinstance(op, ListNamespacesOp):
                out.append(self.core.finish_list(
                    op, list(cast("list[tuple[str, ...]]", res or []))))
            else:
                out.append(None)
        return out


class Rereads:
    """The re-read loop ``batch`` and ``abatch`` share: when the items a batch read do not
    open (or are not their items' current versions), the batch's reads -- never its writes --
    are made again, up to ``_REREADS`` times; then the ItemChangedError stands."""

    def __init__(self, plan: BatchPlan, inner_ops: list[Op], results: list[Result],
                 tick: Callable[[], int]) -> None:
        self.plan, self.inner_ops, self.results, self.tick = plan, inner_ops, results, tick
        self.left = _REREADS
        self.positions: list[int] = []

    def next_ops(self, error: ItemChangedError) -> list[Op]:
        """The inner reads to make again after ``error`` (raised when none are left)."""
        if self.left == 0:
            raise error
        self.left -= 1
        self.positions = self.plan.reads(self.inner_ops)
        self.plan.read_at = self.tick()
        return [self.inner_ops[i] for i in self.positions]

    def took(self, again: list[Result]) -> None:
        for i, res in zip(self.positions, again, strict=True):
            self.results[i] = res


@dataclass
class Opened:
    """One inner item, authenticated and decrypted (PII tokens still in)."""

    namespace: tuple[str, ...]       # the caller's
    value: Any
    vectors: dict[str, list[float]]
    inner: Item
    may_hold_tokens: bool = True     # False: no PII token in the value (no vault lookup)

    def item(self, value: Any) -> Item:
        return Item(value=value, key=self.inner.key, namespace=self.namespace,
                    created_at=self.inner.created_at, updated_at=self.inner.updated_at)


class StoreCore:
    """What one SecureStore knows: its PII layer, index configuration and options."""

    def __init__(self, pii: PiiLayer, index: Mapping[str, Any] | None, embeddings: Any,
                 blind_index: bool, item_keys: ThreadKeyStore | None,
                 deleting: Callable[[str, str, int], bool] = lambda _t, _i, _s: False,
                 dotted_filters: bool = False) -> None:
        self.pii = pii
        #: whether this process is deleting (tenant, item) right now
        self.deleting = deleting
        #: where items' own keys come from (None: items sealed under the tenant data key)
        self.item_keys = item_keys
        self.dotted_filters = dotted_filters
        self.index = index
        self.embeddings = embeddings
        self.paths = matching.index_paths(index) if index else []
        self.distance = str((index or {}).get("distance_type") or "cosine")
        self.blind_index = blind_index

    # step 1 ---------------------------------------------------------------------------------
    def prepare(self, ops: Iterable[Op], tenant: str, keys: TenantKeys | None,
                database_id: str) -> BatchPlan:
        listed = list(ops)
        for op in listed:
            if not isinstance(op, (GetOp, PutOp, SearchOp, ListNamespacesOp)):
                raise ValueError(f"Unknown operation type: {type(op)}")
        dumped: dict[int, bytes] = {}
        for i, op in enumerate(listed):
            validate_op_namespace(op)
            if isinstance(op, PutOp) and op.value is not None:
                # bounds (size, depth, JSON) of every put before any redaction writes
                dumped[i] = codec.dump_json(op.value)
        plan = BatchPlan(tenant, keys, database_id, listed, {}, {}, {}, self)
        for i, op in enumerate(listed):
            if isinstance(op, PutOp) and op.value is not None and keys is not None:
                plan.puts[i] = self._prepare_put(keys, op, dumped[i])
            elif isinstance(op, SearchOp):
                if op.query and self.embeddings is not None:
                    plan.queries[i] = self._redact_query(keys, op.query)
                if op.filter and keys is not None and self.blind_index \
                        and self.pii.redactor is not None:
                    plan.filters[i] = self._redact_filter(keys, op.filter)
        return plan

    def _redact_filter(self, keys: TenantKeys, filter: Mapping[str, Any]) -> dict[str, Any]:
        """The equality conditions on top-level scalars, redacted as a put's top-level fields
        are (so they meet the blind index, which is taken after redaction: an erased value's
        digest confirms nothing)."""
        wanted = {field: cond["$eq"] if isinstance(cond, Mapping) and set(cond) == {"$eq"}
                  else cond for field, cond in filter.items()}
        scalars = {f: v for f, v in wanted.items()
                   if isinstance(f, str) and isinstance(v, (str, int, float, bool))}
        if not scalars:
            return dict(filter)
        redacted = self.pii.redact_one(keys, STORE_CHANNEL, scalars, [], create=False)
        return {**filter, **redacted}

    def _redact_query(self, keys: TenantKeys | None, value: Any) -> Any:
        """A search query as the embedder may see it: redacted whatever the tenant's state.
        Without keys (a new tenant, or a shredded one) no stored item can match a token, so
        the query's PII becomes tokens under a throwaway key (never stored, matching
        nothing)."""
        if self.pii.redactor is None:
            return value
        if keys is None:
            redacted, _found = self.pii.redactor.redact_value(
                value, channel=STORE_CHANNEL, token_key=SecretBytes(secrets.token_bytes(32)))
            return redacted
        return self.pii.redact_one(keys, STORE_CHANNEL, value, [], create=False)

    def _redact_put(self, keys: TenantKeys, op: PutOp, value: Any) -> Any:
        """:meth:`PiiLayer.redact_for_store` with the item's vault owner id computed only
        when the value holds PII (most puts hold none)."""
        entries: list[Any] = []
        redacted = self.pii.redact_one(keys, STORE_CHANNEL, value, entries)
        if entries:
            owner = vault_id(op.namespace, op.key)
            new = self.pii.vault.unknown(keys.tenant, owner, entries)
            if new:
                self.pii.vault.store(keys, owner, new)
        return redacted

    def _prepare_put(self, keys: TenantKeys, op: PutOp, dumped: bytes) -> _Put:
        value = cast(dict, op.value)
        redacted = value if self.pii.redactor is None else self._redact_put(keys, op, value)
        put = _Put(op, dumped if redacted is value else codec.dump_json(redacted))
        if self.blind_index:
            put.blind = codec.blind_entries(keys, cast(dict, redacted))
        if self.embeddings is not None and op.index is not False:
            paths = self.paths if op.index is None else matching.index_paths(
                {"fields": list(op.index)})
            put.texts = matching.texts_to_embed(redacted, paths)
        return put

    # deletion side effects --------------------------------------------------------------------
    @staticmethod
    def deleted_items(plan: BatchPlan) -> list[tuple[str, str]]:
        """(tenant, vault owner) of the items a batch deletes (their originals go with them)."""
        return [(plan.tenant, vault_id(op.namespace, op.key)) for op in plan.ops
                if isinstance(op, PutOp) and op.value is None]

    @staticmethod
    def written_items(plan: BatchPlan) -> list[tuple[str, str]]:
        """(tenant, item) of every item a batch writes or deletes."""
        return [(plan.tenant, vault_id(op.namespace, op.key)) for op in plan.ops
                if isinstance(op, PutOp)]

    # list_namespaces --------------------------------------------------------------------------
    @staticmethod
    def inner_list(tag: str, op: ListNamespacesOp) -> ListNamespacesOp:
        conditions = list(op.match_conditions or ())
        prefixes = [c for c in conditions if c.match_type == "prefix"]
        if any(c.match_type != "prefix" for c in conditions) or len(prefixes) > 1:
            # suffix conditions count labels from the end: matched here, on the caller's view
            return ListNamespacesOp((MatchCondition("prefix", (tag,)),), None, SCAN_LIMIT, 0)
        path = (tag, *prefixes[0].path) if prefixes else (tag,)
        depth = None if op.max_depth is None else op.max_depth + 1
        return ListNamespacesOp((MatchCondition("prefix", path),), depth, op.limit, op.offset)

    @staticmethod
    def finish_list(op: ListNamespacesOp, namespaces: list[tuple[str, ...]]
                    ) -> list[tuple[str, ...]]:
        outer = [tuple(ns[1:]) for ns in namespaces]
        conditions = list(op.match_conditions or ())
        prefixes = [c for c in conditions if c.match_type == "prefix"]
        if not any(c.match_type != "prefix" for c in conditions) and len(prefixes) <= 1:
            return outer
        kept = [ns for ns in outer if all(matching.namespace_matches(c, ns) for c in conditions)]
        if op.max_depth is not None:
            kept = [ns[:op.max_depth] for ns in kept]
        unique = sorted(set(kept))
        return unique[op.offset:op.offset + op.limit]

    # step 3 -----------------------------------------------------------------------------------
    def open_item(self, plan: BatchPlan, item: Item) -> Opened | None:
        """Authenticate one inner item of the plan's tenant, decrypt it and check its version
        against its key row (:meth:`_refusal`). An item sealed under a key this process
        cached before another process deleted the item and wrote it again opens under the
        item's current key row. What does not open, or is not the item's current version,
        raises ItemChangedError (the caller reads the item again, then gives up) -- unless
        this process is deleting or writing the item right now (or did since the read): then
        what the read met is what such a delete leaves, or a put lands before it is
        confirmed or sealed again, and the item reads as absent (the put has not returned)."""
        ns = tuple(item.namespace)
        if not ns or ns[0] != plan.tag:
            raise TamperedDataError("the inner store returned an item of another tenant")
        if plan.keys is None:
            raise TamperedDataError(
                f"a store item of tenant {plan.tenant!r} exists but the tenant has no keys "
                "(shredded, or the registry of another database)")
        outer = ns[1:]
        aad = codec.item_aad(plan.database_id, plan.tenant, outer, item.key)
        item_keys = self.item_keys
        try:
            value, vectors, tokens, version = codec.open_item_scanned(plan.keys, aad,
                                                                      item.value)
        except TamperedDataError:
            if item_keys is None or not codec.is_envelope(item.value):
                raise
            # an envelope that does not open under the key this process holds for the item:
            # the key row read again; the inner item is read again by the caller
            # (ItemChangedError) when it still does not open -- it may have been written under a
            # key another process deleted after the inner read. What keeps failing is raised.
            name = vault_id(outer, item.key)
            state = item_keys.reread_item(plan.tenant, name)
            in_flight = self.deleting(plan.tenant, name, plan.read_at)
            if state == "gone" and in_flight:
                return None
            if state == "gone":
                raise ItemChangedError(_NO_KEY.format(plan.tenant)) from None
            try:
                value, vectors, tokens, version = codec.open_item_scanned(plan.keys, aad,
                                                                          item.value)
            except TamperedDataError:
                if in_flight:
                    return None
                raise ItemChangedError(
                    f"a store item of tenant {plan.tenant!r} does not open under its item's "
                    "key: altered, moved from another item, or an older copy put back after "
                    "its deletion") from None
        if item_keys is not None:
            name = vault_id(outer, item.key)
            refusal = self._refusal(plan, name, version)
            if refusal is not None:
                if self.deleting(plan.tenant, name, plan.read_at):
                    return None
                raise ItemChangedError(refusal)
        return Opened(outer, value, vectors, item, tokens)

    def _refusal(self, plan: BatchPlan, name: str, stored: str) -> str | None:
        """Why an item that opened is not the item's current version (None: it is). Its key
        row, read after the inner read (``plan.versions``), must still be the key it opened
        under, and name a version no later than the one the item was sealed at: an earlier
        version is an older copy of the item put back (or a put the writer has not yet
        sealed again after a later one landed). A later one is a put that landed and is not
        confirmed yet (its process may be killed before it is): the read confirms it
        (``plan.ahead``), so what it served is never rolled back."""
        item_keys = self.item_keys
        if item_keys is None:  # pragma: no cover - the caller checked
            return None
        version = item_versions.parse(stored)   # authenticated (ours), so well formed
        row = plan.versions.get(name)
        if row is None:
            # no key row: deleted (concurrently, or before a copy was put back under a key
            # this process still caches); an unversioned item sealed without one is older data
            return None if not stored else _NO_KEY.format(plan.tenant)
        born = item_keys.cached_born(plan.tenant, name)
        if born is not None and born != row[0]:
            item_keys.reread_item(plan.tenant, name)
            return (f"a store item of tenant {plan.tenant!r} opened under a key its item no "
                    "longer has: a copy put back after the item was deleted and written again")
        current = row[1]
        if version[0] < current[0] or (version[0] == current[0] and version != current):
            return (f"a store item of tenant {plan.tenant!r} is version {version[0]}, its "
                    f"item is at version {current[0]}"
                    f"{'' if version[0] < current[0] else ' of another put'}: an older copy of "
                    "the item put back")
        if version[0] > current[0]:
            plan.ahead[name] = (row[0], version)
        return None

    def restorer(self, originals: Mapping[str, str]) -> Callable[[Any], Any]:
        """Put the tenant's originals (looked up once per batch) back into a value."""
        redactor = self.pii.redactor
        if redactor is None or not originals:
            return lambda value: value
        return lambda value: redactor.restore_value(value, lambda _wanted: {},
                                                    originals=originals)

    def finish_search(self, op: SearchOp, opened: list[Opened], restore: Callable[[Any], Any],
                      query: Sequence[float] | None, scanned: bool) -> list[SearchItem]:
        kept_items: list[tuple[Opened, Any]] = []
        for one in opened:
            value = restore(one.value)
            if not matching.value_matches(value, op.filter, self.dotted_filters):
                continue
            kept_items.append((one, value))
        if query is None:
            page = kept_items[op.offset:op.offset + op.limit] if scanned else kept_items
            return [_search_item(one, value, None) for one, value in page]
        scored = [(max(matching.score(query, vec, self.distance) for vec in one.vectors.values()),
                   n, one, value) for n, (one, value) in enumerate(kept_items) if one.vectors]
        scored.sort(key=lambda row: (-row[0], row[1]))
        kept: list[tuple[float | None, Opened, Any]] = [
            (s, one, value) for s, _n, one, value in scored[op.offset:op.offset + op.limit]]
        if len(kept) < op.limit:  # fewer scored items than asked: unscored ones follow
            rest = [(None, one, value) for one, value in kept_items if not one.vectors]
            kept.extend(rest[:op.limit - len(kept)])
        return [_search_item(one, value, s) for s, one, value in kept]


def _search_item(one: Opened, value: Any, score: float | None) -> SearchItem:
    return SearchItem(namespace=one.namespace, key=one.inner.key, value=value,
                      created_at=one.inner.created_at, updated_at=one.inner.updated_at,
                      score=score)
