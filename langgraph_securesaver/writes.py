"""The write path of a saver: what ``put`` and ``put_writes`` hand the inner saver. Channel
values whose version did not change are skipped (savers that keep one blob per version) or
reuse the token sealed before; the rest are redacted, then sealed with the metadata and its
manifest; new PII originals are returned for the vault, which stores them before the tokens
reach storage.

:class:`WritePath` gets the saver's services and inner access; the sealed codec is passed per
call (a ``with_allowlist`` clone has its own serializer). Knows nothing of reads, retention or
the operations.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
)

from .errors import ConfigurationError, KeyGoneError
from .gate import Denial
from .inner_access import InnerAccess
from .keys.crypto import TenantKeys
from .offthread import to_thread
from .redaction.budget import write_scope
from .redaction.scheduler import aredaction_job, redaction_job
from .seal import SealedCodec
from .services import SaverServices
from .tenancy import ThreadRef


class WritePath:
    """Redacting and sealing for one saver (see the module docstring)."""

    def __init__(self, services: SaverServices, io: InnerAccess) -> None:
        self.services = services
        self.io = io
        self.pii = services.pii

    def prepare_put(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                    config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                    new_versions: ChannelVersions
                    ) -> tuple[Checkpoint, dict[str, Any], builtins.list[Any]]:
        """The sealed checkpoint, the stored metadata, and the PII vault entries to store."""
        versions = checkpoint["channel_versions"]
        values: dict[str, Any] = {}
        reused: dict[str, bytes] = {}
        for ch, value in checkpoint["channel_values"].items():
            if ch not in new_versions:
                if self.io.versioned_blobs:
                    continue  # stored when its version was new; the inner saver skips it
                token = self.services.tokens.get(ref, ch, versions.get(ch))
                if token is not None:
                    reused[ch] = token
                    continue
            values[ch] = value
        entries: builtins.list[Any] = []
        if self.pii.redactor is not None:
            values = {ch: self.pii.redact_one(keys, ch, v, entries, thread_id=ref.thread_id)
                      for ch, v in values.items()}
        sealed = codec.seal_checkpoint(keys, ref, checkpoint, values, reused)
        for ch in values:
            self.services.tokens.put(ref, ch, versions.get(ch), sealed["channel_values"][ch])
        full = self.pii.redact_metadata(keys, get_checkpoint_metadata(config, metadata), entries,
                                        thread_id=ref.thread_id)
        parent = (config.get("configurable") or {}).get("checkpoint_id") or None
        md = codec.seal_metadata(keys, ref, checkpoint, full, sealed, parent,
                                 self.io.versioned_blobs)
        return sealed, md, self.pii.vault.unknown(ref.tenant, ref.thread_id, entries)

    def prepare_writes(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                       config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                       task_id: str, task_path: str = ""
                       ) -> tuple[builtins.list[tuple[str, Any]], builtins.list[Any]]:
        """The sealed writes of one put_writes call, and the PII vault entries to store."""
        cid = (config.get("configurable") or {}).get("checkpoint_id")
        if not cid:
            raise ConfigurationError("put_writes needs config['configurable']['checkpoint_id']")
        entries: builtins.list[Any] = []
        if self.pii.redactor is not None:
            writes = [(ch, self.pii.redact_one(keys, ch, v, entries, thread_id=ref.thread_id))
                      for ch, v in writes]
        sealed: builtins.list[tuple[str, Any]] = builtins.list(
            codec.seal_writes(keys, ref, cid, task_id, task_path, writes))
        return sealed, self.pii.vault.unknown(ref.tenant, ref.thread_id, entries)

    def seal_put(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                 config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                 new_versions: ChannelVersions) -> tuple[Checkpoint, dict[str, Any]]:
        """:meth:`sealed_put`, as a job of the tenant on the redaction scheduler when
        redaction is on (fair between tenants; see :mod:`.redaction.scheduler`)."""
        if self.pii.redactor is None:
            return self.sealed_put(codec, keys, ref, config, checkpoint, metadata, new_versions)
        return redaction_job(ref.tenant, self.sealed_put, codec, keys, ref, config, checkpoint,
                             metadata, new_versions)

    def sealed_put(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                   config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> tuple[Checkpoint, dict[str, Any]]:
        """Everything a put does before the inner saver's call (CPU work and registry rows;
        ``aput`` runs it in one worker thread): touch the thread's registry row when due,
        redact and seal, and store new PII originals before their tokens reach storage.

        The touch comes first: it clears an ``emptied`` mark, moves the thread's last
        activity and takes the write lease on the thread's key before the key is fetched for
        sealing, so a deletion either sees this write coming (the sweep keeps the thread; a
        delete waits for the lease) or has committed before the key is read (and this write
        gets a new key). The lease is checked again last (docs/key-lifecycle.md)."""
        self.bind_subject(keys, ref, "put")   # a refused subject costs no redaction
        continues = bool((config.get("configurable") or {}).get("checkpoint_id"))
        with self._activity(ref, continues), write_scope():   # one redaction budget
            sealed, md, new_pii = self.prepare_put(codec, keys, ref, config, checkpoint,
                                                   metadata, new_versions)
        self.bind_subject(keys, ref, "put")
        self.pii.vault.store(keys, ref.thread_id, new_pii)
        self.services.note_namespace(ref)
        self.services.check_lease(ref)   # the key is still the thread's, long enough
        return sealed, md

    async def aseal_put(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                        config: RunnableConfig, checkpoint: Checkpoint,
                        metadata: CheckpointMetadata, new_versions: ChannelVersions
                        ) -> tuple[Checkpoint, dict[str, Any]]:
        """:meth:`seal_put` in one hop off the event loop."""
        if self.pii.redactor is None:
            return await to_thread(self.sealed_put, codec, keys, ref, config, checkpoint,
                                   metadata, new_versions)
        return await aredaction_job(ref.tenant, self.sealed_put, codec, keys, ref, config,
                                    checkpoint, metadata, new_versions)

    async def aseal_writes(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                           config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                           task_id: str, task_path: str = "") -> builtins.list[tuple[str, Any]]:
        """:meth:`seal_writes` as :meth:`aseal_put`."""
        if self.pii.redactor is None:
            return await to_thread(self.sealed_writes, codec, keys, ref, config, writes,
                                   task_id, task_path)
        return await aredaction_job(ref.tenant, self.sealed_writes, codec, keys, ref, config,
                                    writes, task_id, task_path)

    @contextmanager
    def _activity(self, ref: ThreadRef, continues: bool) -> Iterator[None]:
        """Around the sealing of a write: the thread's registry row touched first when due
        (see :meth:`seal_put`); :meth:`settle` after the inner saver's call. A write that
        continues a checkpoint (``continues``: a put with a parent) on a
        thread whose key changed since this process cached it continues a thread that was
        deleted meanwhile (its parent and blobs are gone): KeyGoneError, nothing stored; the
        retry reads the thread afresh."""
        if self.services.touch_due(ref) and not self.services.touch(ref) and continues:
            raise KeyGoneError(
                f"thread {ref.thread_id!r} of tenant {ref.tenant!r} was deleted since this turn "
                "read it; nothing was stored: retry the turn (it starts the thread afresh)")
        yield

    def settle(self, ref: ThreadRef) -> None:
        """After the inner saver stored a write: touch the thread again when this process last
        touched it more than half the activity resolution ago. Then every write is stored
        within the resolution of the recorded last activity, the bound the audit summaries
        rely on (audit/summaries.py): a slow seal or a database lock wait cannot hide a write."""
        if self.services.touched_before(ref, self.services.activity_resolution / 2):
            self.services.touch(ref)

    async def asettle(self, ref: ThreadRef) -> None:
        if self.services.touched_before(ref, self.services.activity_resolution / 2):
            await to_thread(self.services.touch, ref)

    def seal_writes(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                    config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                    task_path: str = "") -> builtins.list[tuple[str, Any]]:
        """:meth:`sealed_writes` as :meth:`seal_put` runs :meth:`sealed_put`."""
        if self.pii.redactor is None:
            return self.sealed_writes(codec, keys, ref, config, writes, task_id, task_path)
        return redaction_job(ref.tenant, self.sealed_writes, codec, keys, ref, config, writes,
                             task_id, task_path)

    def sealed_writes(self, codec: SealedCodec, keys: TenantKeys, ref: ThreadRef,
                      config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                      task_path: str = "") -> builtins.list[tuple[str, Any]]:
        """The put_writes counterpart of :meth:`sealed_put`."""
        self.bind_subject(keys, ref, "put_writes")
        # pending writes continue a checkpoint whose put may be running beside them (LangGraph
        # stores both at once); writes of a checkpoint that is gone are never read
        with self._activity(ref, False), write_scope():
            sealed, new_pii = self.prepare_writes(codec, keys, ref, config, writes, task_id,
                                                  task_path)
        self.bind_subject(keys, ref, "put_writes")
        self.pii.vault.store(keys, ref.thread_id, new_pii)
        self.services.check_lease(ref)
        return sealed

    def bind_subject(self, keys: TenantKeys, ref: ThreadRef, operation: str) -> None:
        """Record the subject the write names for its thread, or refuse the write -- nothing
        of it stored yet -- when the thread belongs to another subject (AccessDenied, recorded
        without either subject). Called before sealing (refused before any work) and after
        it: a key (re)loaded while sealing means the thread may have been deleted and started
        again, so the row is read (or written) again; otherwise the second call is a cache
        hit."""
        if ref.subject is None:
            return
        if not self.services.subjects.bind(keys, ref.thread_id, ref.subject):
            raise self.services.gate.record_denial(Denial(
                ref.tenant, ref.tenant, f"{operation}: the thread belongs to another subject",
                ref.thread_id))

    def remember_tokens(self, ref: ThreadRef, raw: CheckpointTuple) -> None:
        """Tokens of the checkpoint just authenticated: the next put reuses the unchanged ones."""
        conf = raw.config["configurable"]
        at = ThreadRef(ref.tenant, ref.thread_id, str(conf.get("checkpoint_ns", "") or ""))
        versions = raw.checkpoint["channel_versions"]
        for ch, token in raw.checkpoint["channel_values"].items():
            self.services.tokens.put(at, ch, versions.get(ch), token)
