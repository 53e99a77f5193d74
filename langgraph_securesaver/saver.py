"""SecureSaver: a BaseCheckpointSaver that encrypts, isolates and records around any saver.

This module is the checkpointer itself: construction, ``from_url``, and the contract
(get_tuple, list, put, put_writes, delete_thread, delete_for_runs, copy_thread, prune and their
async twins). Each call reads put -> tenancy (:mod:`.gate`) -> redaction (:mod:`.pii_layer`)
-> seal (:mod:`.seal`; the write path is :mod:`.writes`) -> inner saver (:mod:`.inner_access`),
and back (the read path is :mod:`.reads`). Sync and async methods differ only in how they
reach the inner saver and the registry (async paths never block the event loop). The
operations (retention, shredding, PII, keys, audit, scan, rotation) are inherited from
:class:`.ops.api.SaverOperations` and reach this saver only through ``self.services``.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .audit import summaries
from .connect import DEFAULT, KeyringArg, UrlConstructors, _keyring_of
from .errors import (
    ConfigurationError,
)
from .evidence.api import EvidenceOperations
from .gate import TenantGate, thread_id_of
from .idempotency.recovery_lease import check_fence, fence_of
from .inner_access import InnerAccess
from .keys.crypto import KeyManager
from .keys.provider import KeyProvider
from .listing import (
    ARows,
    aiter_rows,
    listing,
    named_cfg,
    named_tup,
    refusing_listing,
)
from .offthread import to_thread
from .ops import copying, threads
from .ops.api import SaverOperations
from .ops.subjects import copy_subject
from .pii_layer import PiiLayer
from .reads import ReadPath
from .registry.core import Registry
from .registry.pii_vault import PiiVault
from .registry.thread_keys import ThreadKeyStore
from .retention import RetentionPolicy
from .seal import (
    SealedCodec,
)
from .services import SaverServices
from .steps import arun_steps, run_steps
from .storage.ops import DELTA_METADATA_KEYS
from .storage.ops_select import ops_for
from .storage.strict_decoding import apply_strict, strict_plan
from .tenancy import (
    ThreadRef,
    current_tenant_scope,
    thread_prefix,
    validate_tenant,
    validate_thread_id,
)
from .writes import WritePath

logger = logging.getLogger(__name__)

DEFAULT_METADATA_ALLOWLIST: frozenset[str] = frozenset(
    {"source", "step", "parents", "run_id", *DELTA_METADATA_KEYS}
)
PRUNE_STRATEGIES = ("keep_latest", "delete")


def _fenced(saver: SecureSaver, ref: ThreadRef, config: RunnableConfig) -> ThreadRef:
    """A recoverer's write (its config carries its lease's fencing token) is refused once the
    lease changed hands (``RecoveryLeaseLost``, nothing stored); any other write passes."""
    token = fence_of(config)
    if token is not None:
        check_fence(saver, ref.tenant, ref.thread_id, token)
    return ref


async def _afenced(saver: SecureSaver, ref: ThreadRef, config: RunnableConfig) -> ThreadRef:
    token = fence_of(config)
    if token is not None:
        await to_thread(check_fence, saver, ref.tenant, ref.thread_id, token)
    return ref


class SecureSaver(UrlConstructors, SaverOperations, EvidenceOperations, BaseCheckpointSaver):
    """Wrap ``inner`` so every value, write and metadata field is encrypted per tenant.

    Args:
        inner: any LangGraph saver (InMemorySaver, SqliteSaver, AsyncSqliteSaver, PostgresSaver,
            AsyncPostgresSaver, or your own).
        keyring: where master keys come from (a :class:`Keyring` or any :class:`KeyProvider`,
            or the path of a keyring file, loaded with :meth:`Keyring.from_file`).
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
        thread_keys: seal each thread (and each PII-vault value) under its own data key, which
            deletion destroys (docs/erasure.md). ``False`` writes the older format: everything
            under the tenant's data key, erasable only by shredding the tenant.
    """

    #: resolves the tenant of each call (the LangGraph Server saver brings its own)
    gate_class: type[TenantGate] = TenantGate

    def __init__(
        self,
        inner: BaseCheckpointSaver,
        *,
        keyring: KeyringArg = None,
        registry: Registry | str | None = None,
        redaction: Any = DEFAULT,
        retention: Any = None,
        default_tenant: str | None = None,
        metadata_allowlist: frozenset[str] | set[str] | None = None,
        blind_index: bool = True,
        activity_resolution: float = 60.0,
        serde: SerializerProtocol | None = None,
        thread_keys: bool = True,
    ) -> None:
        super().__init__(serde=serde or JsonPlusSerializer())
        if not isinstance(inner, BaseCheckpointSaver):
            raise ConfigurationError(f"inner must be a BaseCheckpointSaver, got {type(inner)!r}")
        if isinstance(inner, SecureSaver):
            raise ConfigurationError("SecureSaver cannot wrap another SecureSaver")
        keyring = _keyring_of(keyring)
        if not isinstance(keyring, KeyProvider):
            raise ConfigurationError("keyring must implement the KeyProvider protocol")
        # decoding only what SecureSaver stores, applied last (a failed constructor changes nothing)
        strict = strict_plan(inner)
        self.inner = inner
        self.keyring = keyring
        self.registry = _registry_for(inner, registry)
        self.registry.attach_keys(keyring)  # unwraps the registry MAC key (tamper evidence)
        self.keys = KeyManager(keyring, self.registry)
        # reads of existing thread-keyed data need the store whatever the option says
        self.keys.threads = ThreadKeyStore(self.keys, self.registry, seal=thread_keys)
        self.default_tenant = validate_tenant(default_tenant) if default_tenant else None
        allow = frozenset(metadata_allowlist) if metadata_allowlist is not None else (
            DEFAULT_METADATA_ALLOWLIST)
        self.metadata_allowlist = allow | frozenset(DELTA_METADATA_KEYS)
        self.blind_index = blind_index
        self.redactor = _redactor_for(redaction)
        self.vault = PiiVault(self.registry)
        self.vault.entry_keys = self.keys.threads
        if retention is not None and not isinstance(retention, RetentionPolicy):
            raise ConfigurationError("retention must be a RetentionPolicy or None")
        self.activity_resolution = activity_resolution
        self._gate = self.gate_class(self)
        self._pii = PiiLayer(self.redactor, self.vault)
        self._io = InnerAccess(inner)
        self.services = SaverServices(
            inner=inner, registry=self.registry, keyring=keyring, keys=self.keys,
            vault=self.vault, storage=ops_for(inner), gate=self._gate, pii=self._pii,
            retention=retention, activity_resolution=activity_resolution,
            async_only=self._io.async_only)
        self._reads = ReadPath(self.services, self._io)
        self.services.read_latest = lambda ref: self._reads.latest_checked(self.codec, ref)
        self._writes = WritePath(self.services, self._io)
        apply_strict(strict)

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
        summaries.on_setup(self)

    async def asetup(self) -> None:
        """Async twin of :meth:`setup`: the same tables, without blocking the event loop."""
        await to_thread(self.registry.setup)
        await to_thread(self.services.save_default_policy)
        await to_thread(self.services.bind_keyring)
        inner_setup = getattr(self.inner, "setup", None)
        if callable(inner_setup):
            if asyncio.iscoroutinefunction(inner_setup):
                await inner_setup()
            else:
                await to_thread(inner_setup)
        await to_thread(summaries.on_setup, self)

    # --------------------------------------------------------------------------------------
    # sync API
    # --------------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its latest when no ``checkpoint_id``), authenticated,
        decrypted and with redacted PII restored for the owning tenant; ``None`` when there is none.

        Raises ``TamperedDataError`` when anything stored fails authentication, ``AccessDenied``
        when the config names a tenant other than the active scope.
        """
        ref = self._gate.resolve_ref(config, "get_tuple")
        tup = self._reads.fetch(ref, self._io.config(ref, config))
        if tup is None:
            return None
        keys = self.keys.require(ref.tenant)
        known: dict[str, builtins.set[str] | None] | None = (
            {} if self.redactor is not None else None)
        opened = self._reads.open_checked(self.codec, keys, ref, tup, known)
        self._writes.remember_tokens(ref, tup)
        return named_tup(self._pii.restore_in_turn(keys, opened, known), config, ref.tenant)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The caller's checkpoints, newest first, each authenticated and decrypted like
        :meth:`get_tuple`.

        ``config=None`` lists every thread of the caller's tenant (a tenant scope or
        ``default_tenant`` is required). ``filter`` matches allowlisted metadata directly and
        protected scalar metadata through the blind index (``UnsupportedFilterError`` otherwise).
        """
        tenant, inner_config, inner_before, one_thread = self._gate.scoped(
            lambda: self._reads.list_args(config, before))
        keys = self.keys.keys_for(tenant, create=False)
        if keys is None:
            return
        inner_filter = self.codec.translate_filter(keys, self._pii.redact_filter(keys, filter))
        yielded = 0
        rows = listing(tenant, lambda: self._reads.inner_rows(
            tenant, inner_config, inner_filter, inner_before, limit, one_thread))
        try:  # early exit (limit, error, caller stops) releases the inner cursor at once
            for tup in rows:
                listed = self._reads.open_listed(self.codec, keys, tenant, tup, rows.drain)
                if listed is None:
                    continue
                yield named_tup(self._pii.restore_in_turn(keys, *listed), config, tenant)
                yielded += 1
                if limit is not None and yielded >= limit:
                    return
        finally:
            rows.close()

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Store a checkpoint: redact, serialize and seal every channel value and the metadata,
        then hand the ciphertext to the inner saver. Returns the inner saver's config (with
        ``tenant_id`` only when the caller's config had it)."""
        ref = _fenced(self, self._gate.resolve_ref(config, "put"), config)
        inner = self._io.sync("put")
        keys = self.services.tenant_keys(ref.tenant)
        sealed, md = self._writes.seal_put(self.codec, keys, ref, config, checkpoint, metadata,
                                           new_versions)
        saved = inner.put(self._io.config(ref, config), sealed, md, new_versions)  # type: ignore[arg-type]
        self._writes.settle(ref)
        return named_cfg(self._io.outer(ref.tenant)(saved) or saved, config, ref.tenant)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Store a task's pending writes, each redacted and sealed, bound to its checkpoint,
        task, task path and index."""
        ref = _fenced(self, self._gate.resolve_ref(config, "put_writes"), config)
        inner = self._io.sync("put_writes")
        keys = self.services.tenant_keys(ref.tenant)
        optional = self._io.optional("put_writes", task_path=task_path)
        # sealed with the task path the inner saver stores (none if it takes none)
        sealed = self._writes.seal_writes(self.codec, keys, ref, config, writes, task_id,
                                          optional.get("task_path", ""))
        inner.put_writes(self._io.config(ref, config), sealed, task_id, **optional)
        self._writes.settle(ref)

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread of the caller's tenant everywhere: checkpoints, writes, blobs, its
        registry row, idempotency records and PII vault entries, with a content-free receipt."""
        thread_id = thread_id_of(thread_id)
        tenant = self._gate.resolve_tenant("delete_thread", thread_id=str(thread_id))
        self._io.sync("delete_thread")
        threads.delete_threads(self.services, tenant, [str(thread_id)], "delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete these runs' checkpoints and writes in the caller's tenant (a ``runs_deleted``
        event). A thread left empty is marked ``emptied``; the retention sweep deletes it, key
        included, after its grace (docs/erasure.md; a run writing it meanwhile keeps it)."""
        tenant = self._gate.resolve_tenant("delete_for_runs")
        run_ids = _str_list(run_ids, "run_ids")
        if not run_ids:
            return
        self._io.sync("delete_for_runs")
        touched = self.services.storage.delete_for_runs(thread_prefix(tenant), run_ids)
        emptied = threads.mark_emptied(self.services, tenant, touched)
        summaries.mark_changed(self.registry, tenant)
        self.services.flush_deleted()
        self.registry.record_event("runs_deleted", tenant=tenant, run_ids=run_ids,
                                   threads_emptied=len(emptied))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread of the caller's tenant (every namespace) to a new thread id, each
        checkpoint opened and sealed again for the target (ciphertexts are bound to their thread).
        Refuses a target that has checkpoints; rerunning after a crash completes the copy."""
        source_thread_id, target_thread_id = _copy_ids(source_thread_id, target_thread_id)
        tenant = self._gate.resolve_tenant("copy_thread", thread_id=str(source_thread_id))
        copy_subject(self.services, tenant, source_thread_id, target_thread_id)
        with _tenant_pinned(tenant):
            copied = run_steps(
                copying.copy_steps(tenant, source_thread_id, target_thread_id,
                                   self.registry.namespaces(tenant, source_thread_id)),
                copying.serving({"get_tuple": self.get_tuple, "list": lambda c: list(self.list(c)),
                                 "put": self.put, "put_writes": self.put_writes}))
        self.registry.record_event("thread_copied", tenant=tenant, thread_id=target_thread_id,
                                   source=source_thread_id, checkpoints=copied)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune these threads of the caller's tenant: ``keep_latest`` keeps the latest checkpoint
        per namespace (refused on DeltaChannel threads), ``delete`` deletes them with receipts.
        """
        tenant = self._gate.resolve_tenant("prune")
        ids = _str_list(thread_ids, "thread_ids")
        _check_strategy(strategy)
        if not ids:
            return
        self._io.sync("prune")
        if strategy == "delete":
            threads.delete_threads(self.services, tenant, ids, "prune")
        else:
            threads.keep_latest(self.services, tenant, ids)

    def get_next_version(self, current: Any, channel: None) -> Any:
        """The inner saver's next channel version (SecureSaver does not change versioning)."""
        return self.inner.get_next_version(current, channel)

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]
                                  ) -> Mapping[str, DeltaChannelHistory]:
        """The base-class contract, authenticated: see :meth:`.reads.ReadPath.delta_history`."""
        return self._reads.delta_history(self.codec, config, channels)

    # --------------------------------------------------------------------------------------
    # async API
    # --------------------------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async twin of :meth:`get_tuple`; never blocks the event loop."""
        ref = await self._gate.aresolve_ref(config, "get_tuple")
        tup = await self._reads.afetch(ref, self._io.config(ref, config))
        if tup is None:
            return None
        keys = await self.services.arequire_keys(ref.tenant)
        known: dict[str, builtins.set[str] | None] | None = (
            {} if self.redactor is not None else None)
        opened = await self._reads.aopen_checked(self.codec, keys, ref, tup, known)
        self._writes.remember_tokens(ref, tup)
        return named_tup(await self._pii.arestore(keys, opened, known), config, ref.tenant)

    async def aget_delta_channel_history(
            self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Async twin of :meth:`get_delta_channel_history`; never blocks the event loop."""
        return await self._reads.adelta_history(self.codec, config, channels)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async twin of :meth:`list`; never blocks the event loop."""
        tenant, inner_config, inner_before, one_thread = await self._gate.ascoped(
            lambda: self._reads.list_args(config, before))
        keys = await self.services.aexisting_keys(tenant)
        if keys is None:
            return
        if filter and self.redactor is not None:
            filter = await to_thread(self._pii.redact_filter, keys, filter)
        inner_filter = self.codec.translate_filter(keys, filter)
        with refusing_listing(tenant):
            rows = await self._reads.ainner_rows(tenant, inner_config, inner_filter, inner_before,
                                                 limit, one_thread)
        yielded = 0
        arows = ARows(aiter_rows(rows), tenant)
        try:  # early exit releases the inner cursor and its lock at once
            async for tup in arows:
                listed = await self._reads.aopen_listed(self.codec, keys, tenant, tup, arows.drain)
                if listed is None:
                    continue
                yield named_tup(await self._pii.arestore(keys, *listed), config, tenant)
                yielded += 1
                if limit is not None and yielded >= limit:
                    return
        finally:
            await arows.aclose()

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        """Async twin of :meth:`put`; never blocks the event loop."""
        ref = await _afenced(self, await self._gate.aresolve_ref(config, "put"), config)
        keys = await self.services.atenant_keys(ref.tenant)
        # redaction, serialization, sealing and the registry rows: one hop off the event loop
        sealed, md = await self._writes.aseal_put(self.codec, keys, ref, config, checkpoint,
                                                  metadata, new_versions)
        saved = await self._io.call("put", self._io.config(ref, config), sealed, md,
                                   new_versions)
        await self._writes.asettle(ref)
        return named_cfg(self._io.outer(ref.tenant)(saved) or saved, config, ref.tenant)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        """Async twin of :meth:`put_writes`; never blocks the event loop."""
        ref = await _afenced(self, await self._gate.aresolve_ref(config, "put_writes"), config)
        keys = await self.services.atenant_keys(ref.tenant)
        optional = self._io.optional("put_writes", task_path=task_path)
        path = optional.get("task_path", "")  # as the inner saver stores it
        sealed = await self._writes.aseal_writes(  # one hop off the event loop, as in aput
            self.codec, keys, ref, config, writes, task_id, path)
        await self._io.call("put_writes", self._io.config(ref, config), sealed, task_id,
                           **optional)
        await self._writes.asettle(ref)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of :meth:`delete_thread`; never blocks the event loop."""
        thread_id = thread_id_of(thread_id)
        tenant = await self._gate.aresolve_tenant("delete_thread", thread_id=str(thread_id))
        await to_thread(threads.delete_threads, self.services, tenant, [str(thread_id)],
                                "delete_thread")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async twin of :meth:`delete_for_runs`; never blocks the event loop."""
        tenant = await self._gate.aresolve_tenant("delete_for_runs")
        run_ids = _str_list(run_ids, "run_ids")
        if not run_ids:
            return
        if self._io.sync_only:
            touched = await to_thread(self.services.storage.delete_for_runs,
                                              thread_prefix(tenant), run_ids)
        else:
            touched = await self.services.storage.adelete_for_runs(thread_prefix(tenant),
                                                                   run_ids)
        emptied = await to_thread(threads.mark_emptied, self.services, tenant, touched)
        await self.services.aflush_deleted()
        await to_thread(self.registry.record_event, "runs_deleted", tenant=tenant,
                                run_ids=run_ids, threads_emptied=len(emptied))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async twin of :meth:`copy_thread`; never blocks the event loop."""
        source_thread_id, target_thread_id = _copy_ids(source_thread_id, target_thread_id)
        tenant = await self._gate.aresolve_tenant("copy_thread", thread_id=str(source_thread_id))
        await to_thread(copy_subject, self.services, tenant, source_thread_id, target_thread_id)
        namespaces = await to_thread(self.registry.namespaces, tenant, source_thread_id)

        async def alist(config: RunnableConfig) -> builtins.list[CheckpointTuple]:
            return [t async for t in self.alist(config)]
        with _tenant_pinned(tenant):
            copied = await arun_steps(
                copying.copy_steps(tenant, source_thread_id, target_thread_id, namespaces),
                copying.serving({"get_tuple": self.aget_tuple, "list": alist, "put": self.aput,
                                 "put_writes": self.aput_writes}))
        await to_thread(
            self.registry.record_event, "thread_copied", tenant=tenant,
            thread_id=target_thread_id, source=source_thread_id, checkpoints=copied)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async twin of :meth:`prune`; never blocks the event loop."""
        tenant = await self._gate.aresolve_tenant("prune")
        ids = _str_list(thread_ids, "thread_ids")
        _check_strategy(strategy)
        if not ids:
            return
        if strategy == "delete":
            await to_thread(threads.delete_threads, self.services, tenant, ids, "prune")
        else:
            await to_thread(threads.keep_latest, self.services, tenant, ids)


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


def _check_strategy(strategy: str) -> None:
    if strategy not in PRUNE_STRATEGIES:
        raise ValueError(f"unknown prune strategy {strategy!r}; use one of {PRUNE_STRATEGIES}")


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
        "wrapped tenant keys and must be as durable as the checkpoints: a SQLite file, a "
        "PostgreSQL or a MySQL/MariaDB database backed up with them (beside a MySQL saver, "
        "its own database: registry='mysql://...'; docs/savers.md)")


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
