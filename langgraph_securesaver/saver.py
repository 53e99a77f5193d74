"""SecureSaver: a BaseCheckpointSaver that encrypts, isolates and records around any saver.

This module is the checkpointer itself: construction, ``from_url``, and the contract
(get_tuple, list, put, put_writes, delete_thread, delete_for_runs, copy_thread, prune and their
async twins). Each call reads put -> tenancy (:mod:`.gate`) -> redaction (:mod:`.pii_layer`)
-> seal (:mod:`.seal`) -> inner saver, and back. Sync and async methods differ only in how
they reach the inner saver and the registry (async paths never block the event loop). The
operations (retention, shredding, PII, keys, audit, scan, rotation) are inherited from
:class:`.ops.api.SaverOperations` and reach this saver only through ``self.services``.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .crypto import KeyManager, TenantKeys
from .errors import (
    AsyncOnlySaverError,
    ConfigurationError,
    KeyringRequired,
    SecureSaverError,
    TamperedDataError,
)
from .gate import Denial, DeniedError, TenantGate, thread_id_of
from .keyring import KeyProvider, Keyring
from .ops import copying, threads
from .ops.api import SaverOperations
from .pii_layer import METADATA_CHANNEL, PiiLayer  # noqa: F401 - METADATA_CHANNEL re-exported
from .pii_vault import PiiVault
from .registry import Registry
from .retention import RetentionPolicy
from .seal import (  # noqa: F401 - re-exported names (scan, rotation, tests)
    BLIND_INDEX_PREFIX,
    MANIFEST_VERSION,
    SEALED_METADATA_KEY,
    SealedCodec,
    _clear_ok,
    _DetachedParent,
)
from .seal import (
    PARSE_ERRORS as _PARSE_ERRORS,
)
from .services import SaverServices
from .storage_ops import DELTA_METADATA_KEYS, ops_for
from .strict_serde import install_strict_serde
from .tenancy import (
    ThreadRef,
    current_tenant_scope,
    outer_thread_id,
    thread_prefix,
    validate_tenant,
    validate_thread_id,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_METADATA_ALLOWLIST: frozenset[str] = frozenset(
    {"source", "step", "parents", "run_id", *DELTA_METADATA_KEYS}
)
PRUNE_STRATEGIES = ("keep_latest", "delete")


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


class SecureSaver(SaverOperations, BaseCheckpointSaver):
    """Wrap ``inner`` so every value, write and metadata field is encrypted per tenant.

    Args:
        inner: any LangGraph saver (InMemorySaver, SqliteSaver, AsyncSqliteSaver, PostgresSaver,
            AsyncPostgresSaver, or your own).
        keyring: where master keys come from (a :class:`Keyring` or any :class:`KeyProvider`).
            ``None`` reads ``SECURESAVER_MASTER_KEY``; with neither, construction fails.
        registry: SecureSaver's own tables: a :class:`Registry`, a SQLAlchemy URL, or ``None``
            (an in-memory registry for an InMemorySaver; the inner saver's own database for
            SQLite savers; otherwise an error, since losing the wrapped keys loses the data).
        redaction: a ``Redactor`` applied to channel values and writes before encryption;
            ``None`` turns redaction off.
        retention: a default retention policy (see the retention module).
        default_tenant: the tenant for calls that name none.
        metadata_allowlist: metadata keys stored in clear (for ``list(filter=...)``).
        blind_index: store a keyed HMAC of each protected scalar metadata value so equality
            filters on protected keys keep working (reveals equality, never the value).
        activity_resolution: seconds between registry updates of a thread's last activity.
    """

    #: resolves the tenant of each call (the LangGraph Server saver brings its own)
    gate_class: type[TenantGate] = TenantGate

    def __init__(
        self,
        inner: BaseCheckpointSaver,
        *,
        keyring: KeyProvider | None = None,
        registry: Registry | str | None = None,
        redaction: Any = DEFAULT,
        retention: Any = None,
        default_tenant: str | None = None,
        metadata_allowlist: frozenset[str] | set[str] | None = None,
        blind_index: bool = True,
        activity_resolution: float = 60.0,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde or JsonPlusSerializer())
        if not isinstance(inner, BaseCheckpointSaver):
            raise ConfigurationError(f"inner must be a BaseCheckpointSaver, got {type(inner)!r}")
        if isinstance(inner, SecureSaver):
            raise ConfigurationError("SecureSaver cannot wrap another SecureSaver")
        if keyring is None:
            try:
                keyring = Keyring.from_env()
            except KeyringRequired:
                raise KeyringRequired() from None
        if not isinstance(keyring, KeyProvider):
            raise ConfigurationError("keyring must implement the KeyProvider protocol")
        install_strict_serde(inner)  # the inner saver decodes only what SecureSaver stores
        self.inner = inner
        self.keyring = keyring
        self.registry = _registry_for(inner, registry)
        self.keys = KeyManager(keyring, self.registry)
        self.default_tenant = validate_tenant(default_tenant) if default_tenant else None
        allow = frozenset(metadata_allowlist) if metadata_allowlist is not None else (
            DEFAULT_METADATA_ALLOWLIST)
        self.metadata_allowlist = allow | frozenset(DELTA_METADATA_KEYS)
        self.blind_index = blind_index
        self.redactor = _redactor_for(redaction)
        self.vault = PiiVault(self.registry)
        if retention is not None and not isinstance(retention, RetentionPolicy):
            raise ConfigurationError("retention must be a RetentionPolicy or None")
        self.activity_resolution = activity_resolution
        self._gate = self.gate_class(self)
        self._pii = PiiLayer(self.redactor, self.vault)
        self._async_only = _is_async_only(inner)
        self._sync_only = _is_sync_only(inner)
        self.services = SaverServices(
            inner=inner, registry=self.registry, keyring=keyring, keys=self.keys,
            vault=self.vault, storage=ops_for(inner), gate=self._gate, pii=self._pii,
            retention=retention, activity_resolution=activity_resolution,
            async_only=self._async_only)
        # savers that keep each channel version once (as a blob) and ignore values whose
        # version did not change: those values need not be sealed at all
        self._versioned_blobs = _stores_versioned_blobs(inner)
        self._accepted: dict[str, frozenset[str]] = {}

    @property
    def codec(self) -> SealedCodec:
        # built on demand so with_allowlist() clones (which swap self.serde) stay consistent
        codec: SealedCodec | None = self.__dict__.get("_codec")
        if codec is None or codec.serde is not self.serde:
            codec = SealedCodec(self.serde, self.metadata_allowlist, self.blind_index)
            self.__dict__["_codec"] = codec
        return codec

    def setup(self) -> None:
        """Create and migrate SecureSaver's tables (and the inner saver's, when it has setup)."""
        self.registry.setup()
        self.services.save_default_policy()
        self.services.bind_keyring()
        inner_setup = getattr(self.inner, "setup", None)
        if callable(inner_setup) and not asyncio.iscoroutinefunction(inner_setup):
            inner_setup()

    async def asetup(self) -> None:
        await asyncio.to_thread(self.registry.setup)
        await asyncio.to_thread(self.services.save_default_policy)
        await asyncio.to_thread(self.services.bind_keyring)
        inner_setup = getattr(self.inner, "setup", None)
        if callable(inner_setup):
            if asyncio.iscoroutinefunction(inner_setup):
                await inner_setup()
            else:
                await asyncio.to_thread(inner_setup)

    # inner-saver plumbing -----------------------------------------------------------------
    def _sync_inner(self, operation: str) -> BaseCheckpointSaver:
        if self._async_only:
            loop = getattr(self.inner, "loop", None)
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if loop is None or not loop.is_running() or running is loop:
                raise AsyncOnlySaverError(
                    f"{type(self.inner).__name__} is async-only: call a{operation}() (or "
                    "graph.ainvoke/astream) instead of the sync API, or wrap a sync saver")
        return self.inner

    def _inner_list(self, inner: BaseCheckpointSaver, config: RunnableConfig | None,
                    **kwargs: Any) -> Iterator[CheckpointTuple]:
        """The inner saver's listing for the sync API. An async-only saver's own sync bridge
        abandons its async generator when closed early (finalized later, in whatever thread);
        here it is driven on its loop and closed there."""
        if not self._async_only:
            return inner.list(config, **kwargs)
        return _bridged(inner.alist(config, **kwargs), self.inner.loop)  # type: ignore[attr-defined]

    async def _ainner(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._sync_only:
            return await asyncio.to_thread(getattr(self.inner, name), *args, **kwargs)
        return await getattr(self.inner, "a" + name)(*args, **kwargs)

    def _optional(self, operation: str, **params: Any) -> dict[str, Any]:
        """The optional BaseCheckpointSaver parameters the inner saver's method accepts.

        Decided from the method's signature, as LangGraph decides for ``task_path``
        (``put_writes_accepts_task_path``): a saver written before a parameter existed keeps
        working wrapped exactly as it does raw. The sync-only path of the async API calls the
        sync method, so that one's signature counts there."""
        name = operation if self._sync_only else "a" + operation
        accepted = self._accepted.get(name)
        if accepted is None:
            accepted = self._accepted[name] = _accepted_params(getattr(self.inner, name))
        return {k: v for k, v in params.items() if k in accepted}

    @staticmethod
    def _inner_config(ref: ThreadRef, config: RunnableConfig | None = None,
                      *, with_ns: bool = True) -> RunnableConfig:
        conf = (config or {}).get("configurable") or {}
        out: dict[str, Any] = {"thread_id": ref.inner_id}
        if with_ns:
            out["checkpoint_ns"] = ref.checkpoint_ns
        if conf.get("checkpoint_id"):
            out["checkpoint_id"] = conf["checkpoint_id"]
        return {"configurable": out}

    def _outer(self, tenant: str) -> Callable[[RunnableConfig | None], RunnableConfig | None]:
        """Configs as the caller sees them: the inner saver's, with the thread id unprefixed.
        Tenant namespacing stays invisible (``tenant_id`` is added back by :func:`_named_tup`
        / :func:`_named_cfg` only when the caller's own config named it: LangGraph merges
        returned configs into the run config and copies configurable scalars into later
        checkpoints' metadata, so anything added here would spread)."""
        def convert(config: RunnableConfig | None) -> RunnableConfig | None:
            if config is None:
                return None
            conf = dict(config["configurable"])
            thread = outer_thread_id(tenant, str(conf["thread_id"]))
            if thread is None:
                raise TamperedDataError("inner saver returned a thread of another tenant")
            conf["thread_id"] = thread
            return {"configurable": conf}
        return convert

    def _ref_of(self, tenant: str, tup: CheckpointTuple) -> ThreadRef | None:
        conf = tup.config["configurable"]
        thread = outer_thread_id(tenant, str(conf["thread_id"]))
        if thread is None:
            return None
        return ThreadRef(tenant, thread, str(conf.get("checkpoint_ns", "") or ""))

    # put preparation (shared) --------------------------------------------------------------
    def _prepare_put(self, keys: TenantKeys, ref: ThreadRef, config: RunnableConfig,
                     checkpoint: Checkpoint, metadata: CheckpointMetadata,
                     new_versions: ChannelVersions
                     ) -> tuple[Checkpoint, dict[str, Any], builtins.list[Any]]:
        versions = checkpoint["channel_versions"]
        values: dict[str, Any] = {}
        reused: dict[str, bytes] = {}
        for ch, value in checkpoint["channel_values"].items():
            if ch not in new_versions:
                if self._versioned_blobs:
                    continue  # stored when its version was new; the inner saver skips it
                token = self.services.tokens.get(ref, ch, versions.get(ch))
                if token is not None:
                    reused[ch] = token
                    continue
            values[ch] = value
        entries: builtins.list[Any] = []
        if self.redactor is not None:
            values = {ch: self._pii.redact_one(keys, ch, v, entries) for ch, v in values.items()}
        sealed = self.codec.seal_checkpoint(keys, ref, checkpoint, values, reused)
        for ch in values:
            self.services.tokens.put(ref, ch, versions.get(ch), sealed["channel_values"][ch])
        full = self._pii.redact_metadata(keys, get_checkpoint_metadata(config, metadata), entries)
        parent = (config.get("configurable") or {}).get("checkpoint_id") or None
        md = self.codec.seal_metadata(keys, ref, checkpoint, full, sealed, parent,
                                      self._versioned_blobs)
        return sealed, md, self.vault.unknown(ref.tenant, ref.thread_id, entries)

    def _prepare_writes(self, keys: TenantKeys, ref: ThreadRef, config: RunnableConfig,
                        writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
                        ) -> tuple[builtins.list[tuple[str, Any]], builtins.list[Any]]:
        cid = (config.get("configurable") or {}).get("checkpoint_id")
        if not cid:
            raise ConfigurationError("put_writes needs config['configurable']['checkpoint_id']")
        entries: builtins.list[Any] = []
        if self.redactor is not None:
            writes = [(ch, self._pii.redact_one(keys, ch, v, entries)) for ch, v in writes]
        sealed: builtins.list[tuple[str, Any]] = builtins.list(
            self.codec.seal_writes(keys, ref, cid, task_id, task_path, writes))
        return sealed, self.vault.unknown(ref.tenant, ref.thread_id, entries)

    def _remember_tokens(self, ref: ThreadRef, raw: CheckpointTuple) -> None:
        """Tokens of the checkpoint just authenticated: the next put reuses the unchanged ones."""
        conf = raw.config["configurable"]
        at = ThreadRef(ref.tenant, ref.thread_id, str(conf.get("checkpoint_ns", "") or ""))
        versions = raw.checkpoint["channel_versions"]
        for ch, token in raw.checkpoint["channel_values"].items():
            self.services.tokens.put(at, ch, versions.get(ch), token)

    # --------------------------------------------------------------------------------------
    # sync API
    # --------------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        ref = self._gate.resolve_ref(config, "get_tuple")
        inner_config = self._inner_config(ref, config)
        inner = self._sync_inner("get_tuple")
        with _decoding(ref, inner_config, inner if self._sync_only else None):
            tup = inner.get_tuple(inner_config)
        if tup is None:
            return None
        keys = self.keys.require(ref.tenant)
        known: dict[str, builtins.set[str] | None] | None = (
            {} if self.redactor is not None else None)
        opened = self._open_checked(keys, ref, tup, known)
        self._remember_tokens(ref, tup)
        return _named_tup(self._pii.restore(keys, opened, known), config, ref.tenant)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        tenant, inner_config, inner_before, one_thread = self._gate.scoped(
            lambda: self._list_args(config, before))
        keys = self.keys.keys_for(tenant, create=False)
        if keys is None:
            return
        inner_filter = self.codec.translate_filter(keys, self._pii.redact_filter(keys, filter))
        yielded = 0
        rows = _listing(tenant, lambda: self._inner_rows(
            tenant, inner_config, inner_filter, inner_before, limit, one_thread))
        try:  # early exit (limit, error, caller stops) releases the inner cursor at once
            for tup in rows:
                listed = self._open_listed(keys, tenant, tup, rows.drain)
                if listed is None:
                    continue
                yield _named_tup(self._pii.restore(keys, *listed), config, tenant)
                yielded += 1
                if limit is not None and yielded >= limit:
                    return
        finally:
            rows.close()

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        ref = self._gate.resolve_ref(config, "put")
        inner = self._sync_inner("put")
        keys = self.services.tenant_keys(ref.tenant)
        sealed, md, new_pii = self._prepare_put(keys, ref, config, checkpoint, metadata,
                                                new_versions)
        if self.services.touch_due(ref):
            self.services.touch(ref)
        self.vault.store(keys, ref.thread_id, new_pii)  # before the tokens reach storage
        saved = inner.put(self._inner_config(ref, config), sealed, md, new_versions)  # type: ignore[arg-type]
        return _named_cfg(self._outer(ref.tenant)(saved) or saved, config, ref.tenant)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        ref = self._gate.resolve_ref(config, "put_writes")
        inner = self._sync_inner("put_writes")
        keys = self.services.tenant_keys(ref.tenant)
        optional = self._optional("put_writes", task_path=task_path)
        # sealed with the task path the inner saver stores (none if it takes none)
        sealed, new_pii = self._prepare_writes(keys, ref, config, writes, task_id,
                                               optional.get("task_path", ""))
        self.vault.store(keys, ref.thread_id, new_pii)
        inner.put_writes(self._inner_config(ref, config), sealed, task_id, **optional)

    def delete_thread(self, thread_id: str) -> None:
        thread_id = thread_id_of(thread_id)
        tenant = self._gate.resolve_tenant("delete_thread", thread_id=str(thread_id))
        self._sync_inner("delete_thread")
        threads.delete_threads(self.services, tenant, [str(thread_id)], "delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        tenant = self._gate.resolve_tenant("delete_for_runs")
        run_ids = _str_list(run_ids, "run_ids")
        if not run_ids:
            return
        self._sync_inner("delete_for_runs")
        self.services.storage.delete_for_runs(thread_prefix(tenant), run_ids)
        self.registry.record_event("runs_deleted", tenant=tenant, run_ids=run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source_thread_id, target_thread_id = _copy_ids(source_thread_id, target_thread_id)
        tenant = self._gate.resolve_tenant("copy_thread", thread_id=str(source_thread_id))
        with _tenant_pinned(tenant):
            copied = copying.run_steps(
                copying.copy_steps(tenant, source_thread_id, target_thread_id),
                {"get_tuple": self.get_tuple, "list": lambda c: list(self.list(c)),
                 "put": self.put, "put_writes": self.put_writes})
        self.registry.record_event("thread_copied", tenant=tenant, thread_id=target_thread_id,
                                   source=source_thread_id, checkpoints=copied)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        tenant = self._gate.resolve_tenant("prune")
        ids = _str_list(thread_ids, "thread_ids")
        _check_strategy(strategy)
        if not ids:
            return
        self._sync_inner("prune")
        if strategy == "delete":
            threads.delete_threads(self.services, tenant, ids, "prune")
        else:
            threads.keep_latest(self.services, tenant, ids)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]
                                  ) -> Mapping[str, DeltaChannelHistory]:
        """The base-class contract, walked over pages of the inner saver's own listing.

        The base class would call ``get_tuple`` (a query, a key lookup, every value decrypted
        and PII restored) once per ancestor. Here each page of ancestors is one inner listing,
        each on-path ancestor is authenticated as a read would, and PII is restored once for
        the writes and seeds returned. (The inner saver's own ``get_delta_channel_history``
        returns writes without their checkpoint id and seeds without their version, which
        the sealed values are bound to, so its answer cannot be authenticated.)"""
        if not channels:
            return {}
        ref = self._gate.resolve_ref(config, "get_delta_channel_history")
        inner = self._sync_inner("get_delta_channel_history")
        walk = _DeltaWalk(channels)
        keys = self.keys.keys_for(ref.tenant, create=False)
        target = inner.get_tuple(self._inner_config(ref, config))
        if target is None or keys is None:
            return walk.result()
        walk.start(self._open_ancestor(keys, ref, target))
        page = _DELTA_FIRST_PAGE
        while walk.needs_more():
            rows = self._inner_list(inner, self._inner_config(ref), before=walk.before(),
                                    limit=page)
            with _closing(rows):
                seen = 0
                for tup in rows:
                    seen += 1
                    if walk.is_next(tup) and not walk.visit(self._open_ancestor(keys, ref, tup)):
                        break
                else:
                    if seen < page:
                        walk.listing_ended()
            if walk.needs_fetch():  # a parent the listing does not reach (ids out of order)
                parent = inner.get_tuple(self._inner_config(ref, walk.wanted_config()))
                walk.fetched(None if parent is None else self._open_ancestor(keys, ref, parent))
            page = min(page * 4, _DELTA_MAX_PAGE)
        return self._restore_history(keys, walk.result())

    def _open_ancestor(self, keys: TenantKeys, ref: ThreadRef, tup: CheckpointTuple
                       ) -> CheckpointTuple:
        at = self._ref_of(ref.tenant, tup)
        if at is None or at.thread_id != ref.thread_id:
            raise TamperedDataError("inner saver returned a checkpoint of another thread")
        return self._open_checked(keys, at, tup, None)

    def _restore_history(self, keys: TenantKeys, history: dict[str, DeltaChannelHistory]
                         ) -> dict[str, DeltaChannelHistory]:
        """PII back in the returned writes and seeds: one vault query for all of them."""
        if self.redactor is None:
            return history
        found: dict[int, builtins.list[str]] = {}
        values = [v for entry in history.values()
                  for v in ([w[2] for w in entry["writes"]]
                            + ([entry["seed"]] if "seed" in entry else []))]
        for value in values:
            tokens = self.redactor.find_tokens(value)
            if tokens:
                found[id(value)] = tokens
        if not found:
            return history
        originals = self.vault.lookup(keys, builtins.list(
            dict.fromkeys(t for tokens in found.values() for t in tokens)))

        def lookup(wanted: Sequence[str]) -> Mapping[str, str]:
            return self.vault.lookup(keys, wanted)

        def restore(value: Any) -> Any:
            tokens = found.get(id(value))
            if not tokens:
                return value
            return self.redactor.restore_value(
                value, lookup, originals={t: originals[t] for t in tokens if t in originals})

        out: dict[str, DeltaChannelHistory] = {}
        for ch, entry in history.items():
            restored: DeltaChannelHistory = {
                "writes": [(t, c, restore(v)) for t, c, v in entry["writes"]]}
            if "seed" in entry:
                restored["seed"] = restore(entry["seed"])
            out[ch] = restored
        return out

    # --------------------------------------------------------------------------------------
    # async API
    # --------------------------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        ref = await self._gate.aresolve_ref(config, "get_tuple")
        inner_config = self._inner_config(ref, config)
        with _decoding(ref, inner_config):
            tup = await self._ainner("get_tuple", inner_config)
        if tup is None:
            return None
        keys = await self.services.aexisting_keys(ref.tenant)
        if keys is None:
            keys = self.keys.require(ref.tenant)  # raises TamperedDataError
        known: dict[str, builtins.set[str] | None] | None = (
            {} if self.redactor is not None else None)
        opened = await self._aopen_checked(keys, ref, tup, known)
        self._remember_tokens(ref, tup)
        return _named_tup(await self._pii.arestore(keys, opened, known), config, ref.tenant)

    async def aget_delta_channel_history(
            self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Async twin of :meth:`get_delta_channel_history` (vault lookups off the loop)."""
        if not channels:
            return {}
        if self._sync_only:
            return await asyncio.to_thread(
                lambda: self.get_delta_channel_history(config=config, channels=channels))
        ref = await self._gate.aresolve_ref(config, "get_delta_channel_history")
        walk = _DeltaWalk(channels)
        keys = await self.services.aexisting_keys(ref.tenant)
        target = await self.inner.aget_tuple(self._inner_config(ref, config))
        if target is None or keys is None:
            return walk.result()
        walk.start(self._open_ancestor(keys, ref, target))
        page = _DELTA_FIRST_PAGE
        while walk.needs_more():
            rows = self.inner.alist(self._inner_config(ref), before=walk.before(), limit=page)
            async with _aclosing(rows):
                seen = 0
                async for tup in rows:
                    seen += 1
                    if walk.is_next(tup) and not walk.visit(self._open_ancestor(keys, ref, tup)):
                        break
                else:
                    if seen < page:
                        walk.listing_ended()
            if walk.needs_fetch():
                parent = await self.inner.aget_tuple(self._inner_config(ref, walk.wanted_config()))
                walk.fetched(None if parent is None else self._open_ancestor(keys, ref, parent))
            page = min(page * 4, _DELTA_MAX_PAGE)
        if self.redactor is None:
            return walk.result()
        return await asyncio.to_thread(self._restore_history, keys, walk.result())

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        tenant, inner_config, inner_before, one_thread = await self._gate.ascoped(
            lambda: self._list_args(config, before))
        keys = await self.services.aexisting_keys(tenant)
        if keys is None:
            return
        if filter and self.redactor is not None:
            filter = await asyncio.to_thread(self._pii.redact_filter, keys, filter)
        inner_filter = self.codec.translate_filter(keys, filter)
        try:
            rows = await self._ainner_rows(tenant, inner_config, inner_filter, inner_before,
                                           limit, one_thread)
        except _PARSE_ERRORS as exc:
            raise _parse_failure(f"tenant {tenant!r} (listing)", exc) from None
        yielded = 0
        arows = _ARows(_aiter(rows), tenant)
        try:  # early exit releases the inner cursor and its lock at once
            async for tup in arows:
                listed = await self._aopen_listed(keys, tenant, tup, arows.drain)
                if listed is None:
                    continue
                yield _named_tup(await self._pii.arestore(keys, *listed), config, tenant)
                yielded += 1
                if limit is not None and yielded >= limit:
                    return
        finally:
            await arows.aclose()

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        ref = await self._gate.aresolve_ref(config, "put")
        keys = await self.services.atenant_keys(ref.tenant)
        if self.redactor is not None:  # redaction is CPU work: never on the event loop
            sealed, md, new_pii = await asyncio.to_thread(
                self._prepare_put, keys, ref, config, checkpoint, metadata, new_versions)
        else:
            sealed, md, new_pii = self._prepare_put(keys, ref, config, checkpoint, metadata,
                                                    new_versions)
        if self.services.touch_due(ref):
            await asyncio.to_thread(self.services.touch, ref)
        if new_pii:
            await asyncio.to_thread(self.vault.store, keys, ref.thread_id, new_pii)
        saved = await self._ainner("put", self._inner_config(ref, config), sealed, md,
                                   new_versions)
        return _named_cfg(self._outer(ref.tenant)(saved) or saved, config, ref.tenant)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        ref = await self._gate.aresolve_ref(config, "put_writes")
        keys = await self.services.atenant_keys(ref.tenant)
        optional = self._optional("put_writes", task_path=task_path)
        path = optional.get("task_path", "")  # as the inner saver stores it
        if self.redactor is not None:  # redaction is CPU work: never on the event loop
            sealed, new_pii = await asyncio.to_thread(
                self._prepare_writes, keys, ref, config, writes, task_id, path)
        else:
            sealed, new_pii = self._prepare_writes(keys, ref, config, writes, task_id, path)
        if new_pii:
            await asyncio.to_thread(self.vault.store, keys, ref.thread_id, new_pii)
        await self._ainner("put_writes", self._inner_config(ref, config), sealed, task_id,
                           **optional)

    async def adelete_thread(self, thread_id: str) -> None:
        thread_id = thread_id_of(thread_id)
        tenant = await self._gate.aresolve_tenant("delete_thread", thread_id=str(thread_id))
        await asyncio.to_thread(threads.delete_threads, self.services, tenant, [str(thread_id)],
                                "delete_thread")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        tenant = await self._gate.aresolve_tenant("delete_for_runs")
        run_ids = _str_list(run_ids, "run_ids")
        if not run_ids:
            return
        if self._sync_only:
            await asyncio.to_thread(self.services.storage.delete_for_runs, thread_prefix(tenant),
                                    run_ids)
        else:
            await self.services.storage.adelete_for_runs(thread_prefix(tenant), run_ids)
        await asyncio.to_thread(self.registry.record_event, "runs_deleted", tenant=tenant,
                                run_ids=run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source_thread_id, target_thread_id = _copy_ids(source_thread_id, target_thread_id)
        tenant = await self._gate.aresolve_tenant("copy_thread", thread_id=str(source_thread_id))

        async def alist(config: RunnableConfig) -> builtins.list[CheckpointTuple]:
            return [t async for t in self.alist(config)]
        with _tenant_pinned(tenant):
            copied = await copying.arun_steps(
                copying.copy_steps(tenant, source_thread_id, target_thread_id),
                {"get_tuple": self.aget_tuple, "list": alist, "put": self.aput,
                 "put_writes": self.aput_writes})
        await asyncio.to_thread(
            self.registry.record_event, "thread_copied", tenant=tenant,
            thread_id=target_thread_id, source=source_thread_id, checkpoints=copied)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        tenant = await self._gate.aresolve_tenant("prune")
        ids = _str_list(thread_ids, "thread_ids")
        _check_strategy(strategy)
        if not ids:
            return
        if strategy == "delete":
            await asyncio.to_thread(threads.delete_threads, self.services, tenant, ids, "prune")
        else:
            await asyncio.to_thread(threads.keep_latest, self.services, tenant, ids)

    # shared helpers -----------------------------------------------------------------------
    def _list_args(self, config: RunnableConfig | None, before: RunnableConfig | None
                   ) -> tuple[str, RunnableConfig | None, RunnableConfig | None, bool]:
        if config is None:
            tenant = self._gate.tenant("list(None)")
            inner_config = None
        else:
            ref = self._gate.ref(config, "list")
            tenant = ref.tenant
            has_ns = "checkpoint_ns" in (config.get("configurable") or {})
            inner_config = self._inner_config(ref, config, with_ns=has_ns)
        inner_before = None
        if before is not None:
            bconf = before.get("configurable") or {}
            if bconf.get("thread_id") is not None:
                bref = self._gate.ref(before, "list(before=...)")
                if bref.tenant != tenant:
                    raise DeniedError(Denial(tenant, bref.tenant, "list", bref.thread_id))
                inner_before = self._inner_config(bref, before)
            else:
                inner_before = before
        return tenant, inner_config, inner_before, config is not None

    # the inner listing behind list/alist: one thread, or one tenant's threads ---------------
    def _inner_rows(self, tenant: str, config: RunnableConfig | None, filter: Any,
                    before: RunnableConfig | None, limit: int | None, one_thread: bool
                    ) -> Iterator[CheckpointTuple]:
        """What the inner saver lists for ``list``: a config's thread as is; for
        ``list(None)`` only the tenant's threads (found by a prefix range on the inner
        table, then listed one by one and merged newest first), so the cost is O(this
        tenant's rows) whatever other tenants store. Savers without a prefix query fall back
        to listing everything (other tenants' rows are skipped, unopened)."""
        inner = self._sync_inner("list")
        if one_thread:
            return self._inner_list(inner, config, filter=filter, before=before, limit=limit)
        ids = self.services.storage.thread_ids(thread_prefix(tenant))
        if ids is None:
            return self._inner_list(inner, None, filter=filter, before=before)
        return _newest_first([builtins.list(inner.list(
            {"configurable": {"thread_id": tid}}, filter=filter, before=before, limit=limit))
            for tid in ids])

    async def _ainner_rows(self, tenant: str, config: RunnableConfig | None, filter: Any,
                           before: RunnableConfig | None, limit: int | None, one_thread: bool
                           ) -> Any:
        """Async twin of :meth:`_inner_rows` (an async or a sync iterable)."""
        if self._sync_only:
            return await asyncio.to_thread(lambda: builtins.list(self._inner_rows(
                tenant, config, filter, before, limit, one_thread)))
        if one_thread:
            return self.inner.alist(config, filter=filter, before=before, limit=limit)
        ids = await self.services.storage.athread_ids(thread_prefix(tenant))
        if ids is None:
            return self.inner.alist(None, filter=filter, before=before)
        per_thread: builtins.list[builtins.list[CheckpointTuple]] = []
        for tid in ids:
            per_thread.append([t async for t in self.inner.alist(
                {"configurable": {"thread_id": tid}}, filter=filter, before=before,
                limit=limit)])
        return _newest_first(per_thread)

    def _open_listed(self, keys: TenantKeys, tenant: str, tup: CheckpointTuple,
                     release: Callable[[], None] | None = None
                     ) -> tuple[CheckpointTuple, dict[str, builtins.set[str] | None] | None] | None:
        ref = self._ref_of(tenant, tup)
        if ref is None:
            return None  # another tenant's row in an unscoped inner listing
        known: dict[str, builtins.set[str] | None] | None = (
            {} if self.redactor is not None else None)
        return self._open_checked(keys, ref, tup, known, release), known

    async def _aopen_listed(self, keys: TenantKeys, tenant: str, tup: CheckpointTuple,
                            release: Callable[[], Awaitable[None]] | None = None
                            ) -> tuple[CheckpointTuple, dict[str, builtins.set[str] | None]
                                       | None] | None:
        ref = self._ref_of(tenant, tup)
        if ref is None:
            return None
        known: dict[str, builtins.set[str] | None] | None = (
            {} if self.redactor is not None else None)
        return await self._aopen_checked(keys, ref, tup, known, release), known

    # opening stored tuples (shared by reads) ------------------------------------------------
    def _open_checked(self, keys: TenantKeys, ref: ThreadRef, tup: CheckpointTuple,
                      known: dict[str, builtins.set[str] | None] | None,
                      release: Callable[[], None] | None = None) -> CheckpointTuple:
        try:
            return self._open_checked_inner(keys, ref, tup, known, release)
        except _DetachedParent:
            raise
        except TamperedDataError as exc:
            raise _named(ref, tup, exc) from None

    async def _aopen_checked(self, keys: TenantKeys, ref: ThreadRef, tup: CheckpointTuple,
                             known: dict[str, builtins.set[str] | None] | None,
                             release: Callable[[], Awaitable[None]] | None = None
                             ) -> CheckpointTuple:
        try:
            return await self._aopen_checked_inner(keys, ref, tup, known, release)
        except _DetachedParent:
            raise
        except TamperedDataError as exc:
            raise _named(ref, tup, exc) from None

    def _open_checked_inner(self, keys: TenantKeys, ref: ThreadRef, tup: CheckpointTuple,
                            known: dict[str, builtins.set[str] | None] | None,
                            release: Callable[[], None] | None = None) -> CheckpointTuple:
        """open_tuple, plus the one check it cannot make alone: a checkpoint whose parent link
        is gone is accepted only if that parent no longer exists (pruned with keep_latest).
        ``release`` frees an inner listing in progress before that lookup."""
        at = _row_ref(ref, tup)
        try:
            return self.codec.open_tuple(keys, at, tup, self._outer(ref.tenant), known)
        except _DetachedParent as detached:
            if release is not None:
                release()
            parent_cfg = _parent_config(at, tup, detached.parent)
            inner = self._sync_inner("get_tuple")
            with _decoding(at, parent_cfg):
                exists = inner.get_tuple(parent_cfg) is not None
            if exists:
                raise TamperedDataError(str(detached)) from None
            return self.codec.open_tuple(keys, at, tup, self._outer(ref.tenant), known,
                                         detached_ok=True)

    async def _aopen_checked_inner(self, keys: TenantKeys, ref: ThreadRef,
                                   tup: CheckpointTuple,
                                   known: dict[str, builtins.set[str] | None] | None,
                                   release: Callable[[], Awaitable[None]] | None = None
                                   ) -> CheckpointTuple:
        at = _row_ref(ref, tup)
        try:
            return self.codec.open_tuple(keys, at, tup, self._outer(ref.tenant), known)
        except _DetachedParent as detached:
            if release is not None:
                await release()
            parent_cfg = _parent_config(at, tup, detached.parent)
            with _decoding(at, parent_cfg):
                exists = await self._ainner("get_tuple", parent_cfg) is not None
            if exists:
                raise TamperedDataError(str(detached)) from None
            return self.codec.open_tuple(keys, at, tup, self._outer(ref.tenant), known,
                                         detached_ok=True)

    # constructors -------------------------------------------------------------------------
    @classmethod
    @contextmanager
    def from_url(cls, url: str, *, keyring: KeyProvider | None = None,
                 **options: Any) -> Iterator[SecureSaver]:
        """A SecureSaver on one database (inner saver + registry), set up and ready.

        ``sqlite:///path.db`` (or ``sqlite:///:memory:``) or ``postgresql://...``.
        """
        from .backends import open_sync_inner
        with open_sync_inner(url) as (inner, registry_url):
            saver = cls(inner, keyring=keyring, registry=registry_url, **options)
            saver.setup()
            try:
                yield saver
            finally:
                saver.registry.dispose()

    @classmethod
    @asynccontextmanager
    async def afrom_url(cls, url: str, *, keyring: KeyProvider | None = None,
                        **options: Any) -> AsyncIterator[SecureSaver]:
        """Async twin of :meth:`from_url` (AsyncSqliteSaver / AsyncPostgresSaver inside)."""
        from .backends import open_async_inner
        async with open_async_inner(url) as (inner, registry_url):
            saver = cls(inner, keyring=keyring, registry=registry_url, **options)
            await saver.asetup()
            try:
                yield saver
            finally:
                await asyncio.to_thread(saver.registry.dispose)


def _named(ref: ThreadRef, tup: CheckpointTuple, exc: TamperedDataError) -> TamperedDataError:
    """The refusal, naming the stored checkpoint it concerns (never a value)."""
    conf = tup.config.get("configurable") or {}
    return TamperedDataError(
        f"checkpoint {str(conf.get('checkpoint_id'))!r} of tenant {ref.tenant!r} thread "
        f"{ref.thread_id!r} namespace {str(conf.get('checkpoint_ns', '') or '')!r} (the "
        f"checkpoints row and its writes/blobs) was refused: {exc}")


def _row_ref(ref: ThreadRef, tup: CheckpointTuple) -> ThreadRef:
    """The ref of the row as stored (its own namespace: get_tuple may not name one)."""
    ns = str((tup.config.get("configurable") or {}).get("checkpoint_ns", "") or "")
    return ref if ns == ref.checkpoint_ns else ThreadRef(ref.tenant, ref.thread_id, ns)


def _parent_config(ref: ThreadRef, tup: CheckpointTuple, parent: str) -> RunnableConfig:
    conf = tup.config.get("configurable") or {}
    return {"configurable": {"thread_id": conf.get("thread_id", ref.inner_id),
                             "checkpoint_ns": ref.checkpoint_ns, "checkpoint_id": parent}}


def _parse_failure(where: str, exc: BaseException) -> BaseException:
    if isinstance(exc, SecureSaverError) and not isinstance(exc, TamperedDataError):
        return exc  # our own typed errors (e.g. AsyncOnlySaverError) pass through unchanged
    if isinstance(exc, TamperedDataError):
        reason = str(exc)
    elif isinstance(exc, json.JSONDecodeError):
        reason = "its clear metadata is not valid JSON (altered bytes)"
    else:
        reason = f"it does not decode ({type(exc).__name__})"
    return TamperedDataError(f"a stored row of {where} was refused: {reason}")


@contextmanager
def _decoding(ref: ThreadRef, inner_config: RunnableConfig,
              locate_in: BaseCheckpointSaver | None = None) -> Iterator[None]:
    """Inner-saver reads: every parse failure a stored row causes is a TamperedDataError
    naming the row (never its bytes). With ``locate_in`` (a sync SQLite/Postgres saver, on
    sync paths only), the table and row key are looked up too."""
    try:
        yield
    except _PARSE_ERRORS as exc:
        conf = inner_config.get("configurable") or {}
        cid = conf.get("checkpoint_id")
        ns = str(conf.get("checkpoint_ns", ref.checkpoint_ns) or "")
        row = _locate_refused(locate_in, str(conf.get("thread_id", ref.inner_id)), ns, cid)
        where = (f"tenant {ref.tenant!r} thread {ref.thread_id!r} namespace {ns!r} "
                 + (f"checkpoint {cid!r}" if cid else "(latest checkpoint)")
                 + (f": {row}" if row else " (inner tables: checkpoints, checkpoint_blobs, "
                    "writes)"))
        raise _parse_failure(where, exc) from None


def _locate_refused(inner: BaseCheckpointSaver | None, thread_id: str, ns: str,
                    checkpoint_id: str | None) -> str | None:
    if inner is None:
        return None
    try:
        from .raw_tables import raw_tables_for
        return raw_tables_for(inner).locate_refused(thread_id, ns, checkpoint_id)
    except Exception:  # naming the row is best effort; the refusal stands
        logger.debug("could not locate the refused row", exc_info=True)
        return None


def _listing(tenant: str, make: Callable[[], Any]) -> _Rows:
    """The inner listing for list(), its parse failures (eager ones included) as
    TamperedDataError."""
    try:
        return _Rows(make(), tenant)
    except _PARSE_ERRORS as exc:
        raise _parse_failure(f"tenant {tenant!r} (listing)", exc) from None


class _Rows:
    """An inner listing whose parse failures surface as TamperedDataError. ``drain()`` reads
    the rest into memory and releases the inner cursor (and its lock), so a row's parent can
    be looked up while the listing is still being consumed."""

    def __init__(self, rows: Any, tenant: str) -> None:
        self._it = iter(rows)
        self._buf: collections.deque[CheckpointTuple] | None = None
        self._tenant = tenant
        self._last = "(first row)"

    def __iter__(self) -> _Rows:
        return self

    def _pull(self) -> CheckpointTuple:
        try:
            tup = next(self._it)
        except StopIteration:
            raise
        except _PARSE_ERRORS as exc:
            raise _parse_failure(f"tenant {self._tenant!r}, listed after {self._last}",
                                 exc) from None
        self._last = _row_name(tup)
        return tup

    def __next__(self) -> CheckpointTuple:
        if self._buf is None:
            return self._pull()
        if not self._buf:
            raise StopIteration
        return self._buf.popleft()

    def drain(self) -> None:
        if self._buf is None:
            buf: collections.deque[CheckpointTuple] = collections.deque()
            try:
                while True:
                    buf.append(self._pull())
            except StopIteration:
                pass
            self._buf = buf
            self.close()

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


class _ARows:
    """The async twin of :class:`_Rows`."""

    def __init__(self, rows: AsyncIterator[CheckpointTuple], tenant: str) -> None:
        self._it = rows.__aiter__()
        self._buf: collections.deque[CheckpointTuple] | None = None
        self._tenant = tenant
        self._last = "(first row)"

    def __aiter__(self) -> _ARows:
        return self

    async def _pull(self) -> CheckpointTuple:
        try:
            tup = await self._it.__anext__()
        except StopAsyncIteration:
            raise
        except _PARSE_ERRORS as exc:
            raise _parse_failure(f"tenant {self._tenant!r}, listed after {self._last}",
                                 exc) from None
        self._last = _row_name(tup)
        return tup

    async def __anext__(self) -> CheckpointTuple:
        if self._buf is None:
            return await self._pull()
        if not self._buf:
            raise StopAsyncIteration
        return self._buf.popleft()

    async def drain(self) -> None:
        if self._buf is None:
            buf: collections.deque[CheckpointTuple] = collections.deque()
            try:
                while True:
                    buf.append(await self._pull())
            except StopAsyncIteration:
                pass
            self._buf = buf
            await self.aclose()

    async def aclose(self) -> None:
        aclose = getattr(self._it, "aclose", None)
        if aclose is not None:
            await aclose()


def _row_name(tup: CheckpointTuple) -> str:
    conf = tup.config.get("configurable") or {}
    return (f"thread {str(conf.get('thread_id'))!r} namespace "
            f"{str(conf.get('checkpoint_ns', ''))!r} checkpoint "
            f"{str(conf.get('checkpoint_id'))!r}")


_DELTA_FIRST_PAGE = 16
_DELTA_MAX_PAGE = 1024


class _DeltaWalk:
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
        self.wanted = _parent_id(target)
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
        self.wanted = _parent_id(tup)
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


def _parent_id(tup: CheckpointTuple) -> str | None:
    if tup.parent_config is None:
        return None
    return tup.parent_config["configurable"].get("checkpoint_id") or None



@contextmanager
def _tenant_pinned(tenant: str) -> Iterator[None]:
    """Inside copy_thread the resolved tenant acts for itself (scope or default alike)."""
    from .tenancy import tenant_scope
    if current_tenant_scope() == tenant:
        yield
        return
    with tenant_scope(tenant):
        yield


def _thread_id(value: Any, what: str = "a thread id") -> str:
    """Ids are non-empty, bounded strings without NUL (ints and UUIDs are stringified)."""
    return validate_thread_id(value, what)


def _copy_ids(source: Any, target: Any) -> tuple[str, str]:
    src, dst = thread_id_of(source), thread_id_of(target)
    if src == dst:
        raise ConfigurationError("copy_thread needs two different thread ids")
    return src, dst


def _str_list(values: Sequence[str], name: str) -> list[str]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of ids, not a single string")
    return [thread_id_of(v, f"each of {name}") for v in values]


def _accepted_params(method: Callable[..., Any]) -> frozenset[str]:
    """The parameter names in ``method``'s signature (LangGraph's test for ``task_path``:
    named there, not merely swallowed by ``**kwargs``)."""
    try:
        return frozenset(inspect.signature(method).parameters)
    except (TypeError, ValueError):  # no introspectable signature: pass nothing optional
        return frozenset()


def _names_tenant(config: RunnableConfig | None) -> bool:
    """Whether the caller's own config names the tenant (then returned configs keep it)."""
    return ((config or {}).get("configurable") or {}).get("tenant_id") is not None


def _bridged(rows: AsyncIterator[T], loop: asyncio.AbstractEventLoop) -> Iterator[T]:
    """Iterate an async generator from a worker thread on ``loop``; closed there, however the
    iteration ends."""
    try:
        while True:
            try:
                yield asyncio.run_coroutine_threadsafe(
                    rows.__anext__(), loop).result()  # type: ignore[arg-type]
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(rows, "aclose", None)
        if callable(aclose):
            asyncio.run_coroutine_threadsafe(aclose(), loop).result()


@contextmanager
def _closing(rows: Any) -> Iterator[Any]:
    """Close an inner saver's iterator however the loop over it ends (limit, error, caller
    gone): SqliteSaver/PostgresSaver hold a lock and a cursor until their generator closes."""
    try:
        yield rows
    finally:
        close = getattr(rows, "close", None)
        if callable(close):
            close()


@asynccontextmanager
async def _aclosing(rows: Any) -> AsyncIterator[Any]:
    """Async twin of :func:`_closing` (AsyncSqliteSaver/AsyncPostgresSaver generators)."""
    try:
        yield rows
    finally:
        aclose = getattr(rows, "aclose", None)
        if callable(aclose):
            await aclose()
        else:
            close = getattr(rows, "close", None)
            if callable(close):
                close()


def _named_tup(tup: CheckpointTuple, config: RunnableConfig | None, tenant: str
               ) -> CheckpointTuple:
    """``tup`` with ``tenant_id`` in its configs when the caller's config named it."""
    if not _names_tenant(config):
        return tup
    return tup._replace(config=_named_cfg(tup.config, config, tenant),
                        parent_config=None if tup.parent_config is None
                        else _named_cfg(tup.parent_config, config, tenant))


def _named_cfg(out: RunnableConfig, config: RunnableConfig | None, tenant: str
               ) -> RunnableConfig:
    if not _names_tenant(config):
        return out
    return {**out, "configurable": {**out["configurable"], "tenant_id": tenant}}


def _check_strategy(strategy: str) -> None:
    if strategy not in PRUNE_STRATEGIES:
        raise ValueError(f"unknown prune strategy {strategy!r}; use one of {PRUNE_STRATEGIES}")


def _newest_first(per_thread: Sequence[Sequence[CheckpointTuple]]
                  ) -> Iterator[CheckpointTuple]:
    """Merge per-thread listings (each newest first) into one, newest first, like an inner
    ``list(None)`` orders them."""
    import heapq
    return heapq.merge(*per_thread, key=lambda t: str(t.config["configurable"]["checkpoint_id"]),
                       reverse=True)


async def _aiter(rows: Any) -> AsyncIterator[Any]:
    async with _aclosing(rows):  # closing this closes the inner listing too
        if hasattr(rows, "__aiter__"):
            async for row in rows:
                yield row
        else:
            for row in rows:
                yield row


# construction helpers -----------------------------------------------------------------------
def _registry_for(inner: BaseCheckpointSaver, registry: Registry | str | None) -> Registry:
    if isinstance(registry, Registry):
        return registry
    if isinstance(registry, str):
        return Registry(registry)
    if isinstance(inner, InMemorySaver):
        return Registry.in_memory()
    path = _sqlite_path(inner)
    if path == "":
        return Registry.in_memory()
    if path is not None:
        return Registry(f"sqlite:///{path}")
    raise ConfigurationError(
        f"pass registry=<SQLAlchemy URL> for {type(inner).__name__}: the registry holds the "
        "wrapped tenant keys and must be as durable as the checkpoints (usually the same "
        "database; SecureSaver.from_url does this for you)")


def _redactor_for(redaction: Any) -> Any:
    if redaction is None:
        return None
    if redaction is DEFAULT:
        try:
            from .redaction import Redactor
        except ImportError:  # redaction package not importable: fail closed
            raise ConfigurationError(
                "redaction is on by default but langgraph_securesaver.redaction could not "
                "be imported; pass redaction=None to run without it") from None
        return Redactor()
    return redaction


def _stores_versioned_blobs(inner: BaseCheckpointSaver) -> bool:
    """InMemorySaver and the Postgres savers store a channel value once per version and only
    for the channels in ``new_versions``; SqliteSaver stores every value in every row."""
    if isinstance(inner, InMemorySaver):
        return True
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError:
        return False
    return isinstance(inner, (PostgresSaver, AsyncPostgresSaver))


def _is_async_only(inner: BaseCheckpointSaver) -> bool:
    return isinstance(getattr(inner, "loop", None), asyncio.AbstractEventLoop)


def _is_sync_only(inner: BaseCheckpointSaver) -> bool:
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        if isinstance(inner, SqliteSaver):
            return True
    except ImportError:  # pragma: no cover
        pass
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        if isinstance(inner, PostgresSaver):
            return True
    except ImportError:
        pass
    return type(inner).aget_tuple is BaseCheckpointSaver.aget_tuple


def _sqlite_path(inner: BaseCheckpointSaver) -> str | None:
    """The file behind a sync SqliteSaver ("" for in-memory), or None if not a SqliteSaver."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(inner, SqliteSaver):
        return None
    rows = inner.conn.execute("PRAGMA database_list").fetchall()
    for _seq, name, file in rows:
        if name == "main":
            return file or ""
    return ""


# names other modules imported from here before the split (kept for compatibility)
_Denial = Denial
_DeniedError = DeniedError
