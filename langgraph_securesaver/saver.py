"""SecureSaver: a BaseCheckpointSaver that encrypts, isolates and records around any saver.

The shared logic (what gets sealed, with which associated data, and how a tuple is opened and
verified) lives in :class:`_SealedCodec` and in the ``_prepare_*``/``_open_*`` helpers; the sync
and async methods are thin wrappers that only differ in how they reach the inner saver and the
registry (async paths never block the event loop: registry calls and sync-only inner savers run
in a worker thread).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import inspect
import itertools
import json
import logging
import re
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
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

from .caches import TokenCache
from .crypto import KeyManager, TenantKeys, associated_data, from_text, to_text
from .errors import (
    AccessDenied,
    AsyncOnlySaverError,
    ConfigurationError,
    KeyringRequired,
    SecureSaverError,
    TamperedDataError,
    TenantRequired,
    UnsupportedFilterError,
)
from .keyring import KeyProvider, Keyring
from .pii_vault import PiiVault
from .registry import Receipt, Registry, ThreadRow
from .retention import DEFAULT_POLICY_KEY, PruneReport, RetentionPolicy, parse_duration
from .storage_ops import DELTA_METADATA_KEYS, StorageOps, ops_for
from .strict_serde import install_strict_serde
from .tenancy import (
    ThreadRef,
    current_tenant_scope,
    outer_thread_id,
    thread_prefix,
    validate_actor,
    validate_namespace,
    validate_tenant,
    validate_thread_id,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

SEALED_METADATA_KEY = "__securesaver__"
BLIND_INDEX_PREFIX = "ssbi_"
DEFAULT_METADATA_ALLOWLIST: frozenset[str] = frozenset(
    {"source", "step", "parents", "run_id", *DELTA_METADATA_KEYS}
)
_SCALARS = (str, int, float, bool, type(None))
# metadata keys LangGraph itself writes (ids, counters, delta-channel bookkeeping): not redacted
_METADATA_KEPT: frozenset[str] = frozenset(
    {"source", "step", "parents", "run_id", "thread_id", "checkpoint_ns", "checkpoint_id",
     *DELTA_METADATA_KEYS})
METADATA_CHANNEL = "__metadata__"  # the channel name metadata is redacted under (policies)
PRUNE_STRATEGIES = ("keep_latest", "delete")


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


@dataclass(frozen=True)
class _Denial:
    actor: str
    target: str
    operation: str
    thread_id: str | None


# the byte form of redaction.TOKEN_RE (not imported here: importing presidio costs seconds);
# serialized strings hold tokens verbatim, so one C-speed scan of the plaintext finds them all
_TOKEN_BYTES = re.compile(rb"<[A-Z][A-Z0-9_]{0,63}:[0-9a-f]{32}>")


def _clear_ok(key: str, value: Any, checkpoint: Checkpoint) -> bool:
    """Whether an allowlisted metadata value may be stored in clear. The DeltaChannel keys
    are always allowlisted (the inner savers' prune reads them), so they are kept in clear
    only in the shape LangGraph writes -- ``counters_since_delta_snapshot``:
    ``{channel of this checkpoint: (updates, supersteps)}`` -- and sealed otherwise: a value
    copied from run metadata (always a scalar) never lands in clear, and cannot make
    ``keep_latest`` refuse the thread. ``delta_writes_versioned`` is written by LangGraph.js
    only and is never kept in clear."""
    if key not in DELTA_METADATA_KEYS:
        return True
    if key != "counters_since_delta_snapshot" or not isinstance(value, dict):
        return False
    channels = checkpoint.get("channel_versions") or {}
    return 0 < len(value) <= 10_000 and all(
        isinstance(ch, str) and ch in channels and isinstance(pair, (list, tuple))
        and len(pair) == 2 and all(type(n) is int and 0 <= n < 2 ** 53 for n in pair)
        for ch, pair in value.items())


def _tokens_in_plaintext(raw: bytes) -> builtins.set[str] | None:
    """The tokens in a serialized value, or None when its encoding may escape them."""
    type_, _sep, data = raw.partition(b"\x00")
    if type_ not in (b"msgpack", b"json"):
        return None
    return {t.decode("ascii") for t in _TOKEN_BYTES.findall(data)}


# Stored-format version of the sealed manifest and of sealed pending writes. Version 1 (the
# first, unreleased builds) bound only the checkpoint id and channel versions; it is refused
# with a message saying so (see README "Stored format").
MANIFEST_VERSION = 2
_WRITE_MAGIC = b"\xffSW2"
_WRITE_HEADER_LEN = struct.Struct(">I")


class _DetachedParent(TamperedDataError):
    """The row has no parent but its manifest names one: legitimate only when that parent was
    pruned (checked by the caller, which then re-opens with ``detached_ok=True``)."""

    def __init__(self, parent: str) -> None:
        super().__init__("the checkpoint's parent link was removed, and its parent still exists")
        self.parent = parent


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively: what a JSON or msgpack round trip makes of a document."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _body(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """Everything of a stored checkpoint document but its channel values."""
    return _plain({k: v for k, v in checkpoint.items() if k != "channel_values"})


def _stored_writes(writes: Sequence[tuple[str, Any]]) -> builtins.list[tuple[str, Any]]:
    """The writes an inner LangGraph saver keeps of one put_writes call: a special channel
    named twice keeps its last value when every write is special (upsert), else its first
    (insert-or-ignore). Sealing exactly these keeps the per-call index set verifiable."""
    if not any(ch in WRITES_IDX_MAP for ch, _v in writes):
        return builtins.list(writes)
    if all(ch in WRITES_IDX_MAP for ch, _v in writes):
        return builtins.list({ch: (ch, v) for ch, v in writes}.values())
    seen: builtins.set[str] = builtins.set()
    out = []
    for ch, v in writes:
        if ch in WRITES_IDX_MAP:
            if ch in seen:
                continue
            seen.add(ch)
        out.append((ch, v))
    return out


def _call_indexes(n: int, specials: Sequence[Any]) -> frozenset[int]:
    """The idx values a put_writes call of ``n`` writes occupies (specials: (position, idx))."""
    positions = {int(p) for p, _i in specials}
    return frozenset([j for j in range(n) if j not in positions] + [int(i) for _p, i in specials])


class _SealedCodec:
    """Turns plaintext checkpoint parts into tokens bound to their place, and back.

    What is bound (format v2): every channel value to (tenant, thread, namespace, channel,
    version); every pending write to (tenant, thread, namespace, checkpoint, task, channel)
    plus, inside the ciphertext, its task path, its idx and the idx set of its put_writes call;
    the metadata to (tenant, thread, namespace, checkpoint) plus a manifest of the whole stored
    checkpoint document (id, ts, versions, versions_seen, updated_channels, ...), the parent
    checkpoint id, the exact set of channels holding values, the clear allowlisted keys and
    the blind-index entries. :meth:`verify_tuple` checks all of it on every read and scan.
    """

    def __init__(self, serde: SerializerProtocol, allowlist: frozenset[str], blind_index: bool):
        self.serde = serde
        self.allowlist = allowlist
        self.blind_index = blind_index

    # values -------------------------------------------------------------------------------
    def dump(self, value: Any) -> bytes:
        type_, data = self.serde.dumps_typed(value)
        return type_.encode("utf-8") + b"\x00" + data

    def load(self, raw: bytes) -> Any:
        type_, sep, data = raw.partition(b"\x00")
        if not sep:
            raise TamperedDataError("decrypted value has no type header")
        return self.serde.loads_typed((type_.decode("utf-8"), data))

    @staticmethod
    def channel_aad(ref: ThreadRef, channel: str, version: Any) -> bytes:
        return associated_data("cv", ref.tenant, ref.thread_id, ref.checkpoint_ns, channel,
                               "" if version is None else str(version))

    @staticmethod
    def write_aad(ref: ThreadRef, checkpoint_id: str, task_id: str, channel: str) -> bytes:
        return associated_data("w", ref.tenant, ref.thread_id, ref.checkpoint_ns, checkpoint_id,
                               task_id, channel)

    @staticmethod
    def metadata_aad(ref: ThreadRef, checkpoint_id: str) -> bytes:
        return associated_data("md", ref.tenant, ref.thread_id, ref.checkpoint_ns, checkpoint_id)

    # pending writes -----------------------------------------------------------------------
    def seal_writes(self, keys: TenantKeys, ref: ThreadRef, checkpoint_id: str, task_id: str,
                    task_path: str, writes: Sequence[tuple[str, Any]]
                    ) -> builtins.list[tuple[str, bytes]]:
        """Seal one put_writes call; each write carries its task path, its idx (as the inner
        saver will number it) and the idx set of the call."""
        kept = _stored_writes(writes)
        n = len(kept)
        specials = [[j, WRITES_IDX_MAP[ch]] for j, (ch, _v) in enumerate(kept)
                    if ch in WRITES_IDX_MAP]
        out = []
        for j, (ch, value) in enumerate(kept):
            header = self.dump([task_path, WRITES_IDX_MAP.get(ch, j), n, specials])
            plain = (_WRITE_MAGIC + _WRITE_HEADER_LEN.pack(len(header)) + header
                     + self.dump(value))
            out.append((ch, keys.seal(plain, self.write_aad(ref, checkpoint_id, task_id, ch))))
        return out

    def split_write(self, plain: bytes) -> tuple[str, int, int, builtins.list[Any], bytes]:
        """(task path, idx, call size, call specials, serialized value) of a write plaintext."""
        if not plain.startswith(_WRITE_MAGIC):
            raise TamperedDataError(
                "a pending write is in the format of an older SecureSaver build (format v1, "
                "no idx/task binding), which this version refuses; see README 'Stored format'")
        start = len(_WRITE_MAGIC) + _WRITE_HEADER_LEN.size
        try:
            (size,) = _WRITE_HEADER_LEN.unpack_from(plain, len(_WRITE_MAGIC))
            path, idx, n, specials = self.load(plain[start:start + size])
            return str(path), int(idx), int(n), builtins.list(specials), plain[start + size:]
        except (ValueError, TypeError, struct.error):
            raise TamperedDataError("a sealed pending write has a malformed header") from None

    # checkpoint ---------------------------------------------------------------------------
    def seal_checkpoint(self, keys: TenantKeys, ref: ThreadRef, checkpoint: Checkpoint,
                        values: Mapping[str, Any], reused: Mapping[str, bytes] | None = None
                        ) -> Checkpoint:
        """Seal ``values``; ``reused`` are tokens already sealed for the same (channel, version)."""
        versions = checkpoint["channel_versions"]
        sealed = checkpoint.copy()
        sealed["channel_values"] = {
            **(reused or {}),
            **{ch: keys.seal(self.dump(v), self.channel_aad(ref, ch, versions.get(ch)))
               for ch, v in values.items()},
        }
        if sealed.get("pending_sends"):  # pre-v4 checkpoints: Send args live in the manifest
            cast(dict, sealed)["pending_sends"] = []
        return sealed

    def seal_metadata(self, keys: TenantKeys, ref: ThreadRef, checkpoint: Checkpoint,
                      full: Mapping[str, Any], sealed: Checkpoint | None = None,
                      parent: str | None = None, versioned_blobs: bool = False
                      ) -> dict[str, Any]:
        """The stored metadata: allowlisted keys in clear, blind-index entries, and the sealed
        metadata + manifest. ``sealed`` is the checkpoint document as it will be stored and
        ``parent`` the parent checkpoint id the inner saver records."""
        stored: dict[str, Any] = {k: full[k] for k in self.allowlist
                                  if k in full and _clear_ok(k, full[k], checkpoint)}
        blind: dict[str, str] = {}
        if self.blind_index:
            for key, value in full.items():
                if key not in self.allowlist and isinstance(value, _SCALARS):
                    blind[self.blind_key(keys, key)] = self.blind_value(keys, key, value)
        versions = checkpoint["channel_versions"]
        channels = sorted(ch for ch in checkpoint["channel_values"]
                          if not versioned_blobs or ch in versions)
        manifest: dict[str, Any] = {
            "v": MANIFEST_VERSION, "body": _body(sealed if sealed is not None else checkpoint),
            "parent": parent or None, "channels": channels, "exact": not versioned_blobs,
            "clear": sorted(stored), "blind": blind}
        if checkpoint.get("pending_sends"):
            manifest["pending_sends"] = checkpoint.get("pending_sends")
        payload = self.dump({"metadata": dict(full), "manifest": manifest})
        stored[SEALED_METADATA_KEY] = to_text(
            keys.seal(payload, self.metadata_aad(ref, checkpoint["id"])))
        stored.update(blind)
        return stored

    @staticmethod
    def blind_key(keys: TenantKeys, key: str) -> str:
        return BLIND_INDEX_PREFIX + keys.blind("bi-key", key)[:16]

    @staticmethod
    def blind_value(keys: TenantKeys, key: str, value: Any) -> str:
        return keys.blind("bi-value", key, json.dumps(value, sort_keys=True))

    def translate_filter(self, keys: TenantKeys | None,
                         filter: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if not filter:
            return None
        out: dict[str, Any] = {}
        for key, value in filter.items():
            if key in self.allowlist:
                out[key] = value
            elif not self.blind_index:
                raise UnsupportedFilterError(
                    f"metadata key {key!r} is encrypted and blind_index=False; filter on an "
                    f"allowlisted key ({sorted(self.allowlist)}) or enable blind_index")
            elif not isinstance(value, _SCALARS):
                raise UnsupportedFilterError(
                    f"metadata key {key!r} is encrypted; its blind index answers equality on "
                    "str/int/float/bool/None values only")
            elif keys is not None:
                out[self.blind_key(keys, key)] = self.blind_value(keys, key, value)
        return out

    def verify_tuple(self, keys: TenantKeys, ref: ThreadRef, tup: CheckpointTuple,
                     detached_ok: bool = False
                     ) -> tuple[dict[str, Any], dict[str, Any], dict[str, bytes],
                                builtins.list[tuple[str, str, bytes]]]:
        """Authenticate a stored tuple completely (the check reads and ``scan --verify`` share).

        Returns (sealed metadata, manifest, channel plaintexts, pending-write plaintexts in
        ``writes_sort_key`` order). Raises TamperedDataError for anything that does not match
        what SecureSaver sealed; nothing is deserialized but SecureSaver's own sealed payloads.
        """
        checkpoint = tup.checkpoint
        if (not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("id"), str)
                or not isinstance(checkpoint.get("channel_values"), Mapping)
                or not isinstance(checkpoint.get("channel_versions"), Mapping)):
            raise TamperedDataError("the stored checkpoint document is not a checkpoint")
        cid = checkpoint["id"]
        if tup.config["configurable"].get("checkpoint_id") not in (None, cid):
            raise TamperedDataError("checkpoint row and checkpoint body disagree on the id")
        stored_md: Mapping[str, Any] = tup.metadata if tup.metadata is not None else {}
        if not isinstance(stored_md, Mapping):
            raise TamperedDataError("the stored metadata is not a mapping")
        payload = self.load(keys.open(from_text(stored_md.get(SEALED_METADATA_KEY)),
                                      self.metadata_aad(ref, cid)))
        metadata, manifest = payload["metadata"], payload["manifest"]
        if manifest.get("v") != MANIFEST_VERSION:
            raise TamperedDataError(
                "checkpoint was sealed in the format of an older SecureSaver build (manifest "
                "v1: id and channel versions only), which this version refuses; see README "
                "'Stored format'")
        stored_body, sealed_body = _body(checkpoint), _plain(manifest["body"])
        if stored_body != sealed_body:
            fields = sorted(k for k in set(stored_body) | set(sealed_body)
                            if stored_body.get(k) != sealed_body.get(k))
            raise TamperedDataError(
                f"checkpoint document differs from its sealed manifest in {fields} "
                "(altered, rolled back or swapped)")
        parent = (tup.parent_config or {}).get("configurable", {}).get("checkpoint_id") or None
        if parent != manifest["parent"]:
            # a DeltaChannel thread (its counters kept in clear, where keep_latest sees them
            # and refuses) is never legitimately detached
            delta = any(k in manifest["clear"] for k in DELTA_METADATA_KEYS)
            if parent is None and not delta:
                if not detached_ok:
                    raise _DetachedParent(manifest["parent"])
            else:
                raise TamperedDataError("the checkpoint's parent link was altered")
        # savers that keep one blob per (channel, version) may also return an authenticated
        # value LangGraph left out of this checkpoint (a DeltaChannel snapshot at an unchanged
        # version): only a missing value is tampering there
        held = checkpoint["channel_values"]
        if (sorted(held) != manifest["channels"] if manifest["exact"]
                else not all(ch in held for ch in manifest["channels"])):
            raise TamperedDataError(
                "the set of channels holding values differs from the sealed manifest (a value "
                "was deleted or added)")
        clear = manifest["clear"]
        blind = manifest["blind"]
        if len(stored_md) != len(clear) + len(blind) + 1:
            raise TamperedDataError("clear metadata keys were added or removed")
        for key in clear:
            if key not in stored_md or stored_md[key] != metadata.get(key):
                raise TamperedDataError(f"clear metadata key {key!r} was removed or altered")
        for key, value in blind.items():
            if stored_md.get(key) != value:
                raise TamperedDataError("a blind-index entry was removed, altered or copied")
        if checkpoint.get("pending_sends"):
            raise TamperedDataError("a checkpoint holds clear pending sends (injected plaintext)")
        versions = checkpoint["channel_versions"]
        plains = {ch: keys.open(tok, self.channel_aad(ref, ch, versions.get(ch)))
                  for ch, tok in checkpoint["channel_values"].items()}
        return metadata, manifest, plains, self._verify_writes(keys, ref, cid, tup)

    def _verify_writes(self, keys: TenantKeys, ref: ThreadRef, cid: str, tup: CheckpointTuple
                       ) -> builtins.list[tuple[str, str, bytes]]:
        """Authenticate a checkpoint's pending writes; (task id, channel, plaintext) in
        ``writes_sort_key`` order of what was sealed.

        A task may have several put_writes calls (LangGraph saves its interrupts, resumes and
        errors apart from its other writes, a null task's writes accumulate, a caller may save
        an interrupt again under the same task id, with or without its task path): the inner
        savers key a write by (task id, idx), keep the first regular write of a key and upsert
        a special one. Whatever the sequence, a task's stored rows are unique in idx, and the
        sealed idx is the stored one. Per task:

        * no sealed idx twice (a copied row);
        * every idx a stored write's call claimed is present (a dropped write; an upsert
          replaces a row at the same idx, it never removes one);
        * the savers return ``writes_sort_key`` order of the stored (task path, idx), so swapped
          idx values put sealed keys out of order: the sealed (task path, idx) of the task's
          regular writes strictly increases in the returned order (a regular row's stored path
          is always its sealed one), and when all of the task's writes were sealed with one
          path (every write LangGraph makes), the sealed idx of all of them does. (A special
          write upserted by a call naming another path keeps its first path on PostgreSQL;
          reads return the sealed order, so moving such a row changes nothing returned.)

        A task whose every write was deleted looks like a task that never saved (re-run)."""
        rows = tup.pending_writes or []
        if not rows:
            return []
        parsed = []
        order: dict[str, builtins.list[int]] = {}
        paths: dict[str, builtins.set[str]] = {}
        claimed: dict[str, builtins.set[int]] = {}
        regular: dict[str, tuple[str, int]] = {}
        for row in rows:
            task_id, ch, tok = row
            path, idx, n, specials, body = self.split_write(
                keys.open(tok, self.write_aad(ref, cid, task_id, ch)))
            if idx >= 0:
                if task_id in regular and (path, idx) <= regular[task_id]:
                    raise TamperedDataError(
                        f"pending writes of task {task_id!r} are duplicated or reordered")
                regular[task_id] = (path, idx)
            order.setdefault(task_id, []).append(idx)
            paths.setdefault(task_id, builtins.set()).add(path)
            claimed.setdefault(task_id, builtins.set()).update(_call_indexes(n, specials))
            parsed.append((path, task_id, idx, ch, body))
        for task_id, idxs in order.items():
            present = builtins.set(idxs)
            if len(present) != len(idxs):
                raise TamperedDataError(
                    f"pending writes of task {task_id!r} are duplicated or reordered")
            if len(paths[task_id]) == 1 and any(a >= b for a, b in itertools.pairwise(idxs)):
                raise TamperedDataError(
                    f"pending writes of task {task_id!r} are duplicated or reordered")
            if not claimed[task_id] <= present:
                raise TamperedDataError(f"a pending write of task {task_id!r} was dropped")
        parsed.sort(key=lambda p: (p[0], p[1], p[2]))
        return [(task_id, ch, body) for _path, task_id, _idx, ch, body in parsed]

    def open_tuple(self, keys: TenantKeys, ref: ThreadRef, tup: CheckpointTuple,
                   outer: Callable[[RunnableConfig | None], RunnableConfig | None],
                   tokens: dict[str, builtins.set[str] | None] | None = None,
                   detached_ok: bool = False) -> CheckpointTuple:
        """Authenticate and decrypt a stored tuple; with ``tokens``, also note the redaction
        tokens each channel value holds (from its plaintext bytes)."""
        metadata, manifest, plains, writes = self.verify_tuple(keys, ref, tup, detached_ok)
        opened = tup.checkpoint.copy()
        if "pending_sends" in manifest:
            cast(dict, opened)["pending_sends"] = manifest["pending_sends"]
        values: dict[str, Any] = {}
        for ch, plain in plains.items():
            if tokens is not None:
                tokens[ch] = _tokens_in_plaintext(plain)
            values[ch] = self.load(plain)
        opened["channel_values"] = values
        return CheckpointTuple(
            config=outer(tup.config) or tup.config,
            checkpoint=opened,
            metadata=cast(CheckpointMetadata, metadata),
            parent_config=outer(tup.parent_config),
            pending_writes=[(task_id, ch, self.load(body)) for task_id, ch, body in writes],
        )


class SecureSaver(BaseCheckpointSaver):
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
        self.registry = self._make_registry(inner, registry)
        self.registry.attach_keys(keyring)  # unwraps the registry MAC key (tamper evidence)
        self.keys = KeyManager(keyring, self.registry)
        self.default_tenant = validate_tenant(default_tenant) if default_tenant else None
        allow = frozenset(metadata_allowlist) if metadata_allowlist is not None else (
            DEFAULT_METADATA_ALLOWLIST)
        self.metadata_allowlist = allow | frozenset(DELTA_METADATA_KEYS)
        self.blind_index = blind_index
        self.redactor = self._make_redactor(redaction)
        self.vault = PiiVault(self.registry)
        if retention is not None and not isinstance(retention, RetentionPolicy):
            raise ConfigurationError("retention must be a RetentionPolicy or None")
        self.retention: RetentionPolicy | None = retention
        self._default_policy_saved = False
        self._policies: dict[str, tuple[float, RetentionPolicy]] = {}
        self.activity_resolution = activity_resolution
        self._ops: StorageOps = ops_for(inner)
        self._tokens = TokenCache()
        # savers that keep each channel version once (as a blob) and ignore values whose
        # version did not change: those values need not be sealed at all
        self._versioned_blobs = _stores_versioned_blobs(inner)
        self._touched: dict[tuple[str, str], float] = {}
        self._async_only = _is_async_only(inner)
        self._sync_only = _is_sync_only(inner)
        self._accepted: dict[str, frozenset[str]] = {}

    # construction helpers -----------------------------------------------------------------
    @staticmethod
    def _make_registry(inner: BaseCheckpointSaver, registry: Registry | str | None) -> Registry:
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

    @staticmethod
    def _make_redactor(redaction: Any) -> Any:
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

    @property
    def codec(self) -> _SealedCodec:
        # built on demand so with_allowlist() clones (which swap self.serde) stay consistent
        codec: _SealedCodec | None = self.__dict__.get("_codec")
        if codec is None or codec.serde is not self.serde:
            codec = _SealedCodec(self.serde, self.metadata_allowlist, self.blind_index)
            self.__dict__["_codec"] = codec
        return codec

    def setup(self) -> None:
        """Create and migrate SecureSaver's tables (and the inner saver's, when it has setup)."""
        self.registry.setup()
        self._save_default_policy()
        self._bind_keyring()
        inner_setup = getattr(self.inner, "setup", None)
        if callable(inner_setup) and not asyncio.iscoroutinefunction(inner_setup):
            inner_setup()

    async def asetup(self) -> None:
        await asyncio.to_thread(self.registry.setup)
        await asyncio.to_thread(self._save_default_policy)
        await asyncio.to_thread(self._bind_keyring)
        inner_setup = getattr(self.inner, "setup", None)
        if callable(inner_setup):
            if asyncio.iscoroutinefunction(inner_setup):
                await inner_setup()
            else:
                await asyncio.to_thread(inner_setup)

    # tenancy ------------------------------------------------------------------------------
    def _tenant(self, operation: str, explicit: Any = None, thread_id: str | None = None) -> str:
        scoped = current_tenant_scope()
        if explicit is not None:
            explicit = validate_tenant(explicit)
            if scoped is not None and explicit != scoped:
                raise _DeniedError(_Denial(scoped, explicit, operation, thread_id))
        tenant = scoped or explicit or self.default_tenant
        if tenant is None:
            raise TenantRequired(operation)
        return tenant

    def _ref(self, config: RunnableConfig, operation: str) -> ThreadRef:
        conf = config.get("configurable") or {}
        if conf.get("thread_id") in (None, ""):
            raise ConfigurationError(f"{operation} needs config['configurable']['thread_id']")
        try:
            thread_id: str | None = _thread_id(conf["thread_id"])
        except ConfigurationError:
            thread_id = None
        # the tenant check comes first: a cross-tenant attempt with a malformed id is still a
        # cross-tenant attempt, and is recorded (without the id, which no column could hold)
        tenant = self._tenant(operation, conf.get("tenant_id"), thread_id)
        if thread_id is None:
            thread_id = _thread_id(conf["thread_id"])  # raises the ConfigurationError
        return ThreadRef(tenant, thread_id, validate_namespace(conf.get("checkpoint_ns", "")))

    _DENIAL_ATTEMPTS = 3

    def _record_denial(self, denial: _Denial) -> AccessDenied:
        """Record an access-denied event (retried) and return the error to raise. The call is
        refused either way; if the event cannot be written the error says so."""
        logger.warning("access denied: tenant %r tried %s on tenant %r (thread %r)",
                       denial.actor, denial.operation, denial.target, denial.thread_id)
        failure: Exception | None = None
        thread_id = denial.thread_id
        if thread_id is not None:
            try:   # an id no column could hold is left out, never the event
                thread_id = validate_thread_id(thread_id)
            except ConfigurationError:
                thread_id = None
        for attempt in range(self._DENIAL_ATTEMPTS):
            try:
                self.registry.record_event(
                    "access_denied", tenant=denial.target, thread_id=thread_id,
                    actor=denial.actor, operation=denial.operation)
                failure = None
                break
            except Exception as exc:  # noqa: BLE001 - retried; the caller is refused anyway
                failure = exc
                time.sleep(0.05 * (attempt + 1))
        message = (f"tenant {denial.actor!r} may not {denial.operation} data of tenant "
                   f"{denial.target!r}")
        if failure is None:
            return AccessDenied(message + "; the attempt was recorded")
        logger.error("could not record an access-denied event (%s); the call is refused",
                     type(failure).__name__)
        error = AccessDenied(message + f"; the attempt could NOT be recorded "
                             f"({type(failure).__name__}): check the registry database")
        error.__cause__ = failure
        return error

    def _scoped(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except _DeniedError as denied:
            raise self._record_denial(denied.denial) from None

    async def _ascoped(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except _DeniedError as denied:
            raise await asyncio.to_thread(self._record_denial, denied.denial) from None

    def _acting_scope(self) -> str | None:
        """Who the caller is for the scope rule of admin methods (the active tenant_scope;
        subclasses that know the caller otherwise, e.g. the LangGraph Server saver, say so)."""
        return current_tenant_scope()

    def _admin_tenant(self, operation: str, tenant: Any = None, *,
                      operator_only: bool = False) -> str | None:
        """The one scope rule of every method that names a tenant (README: "Who a method acts
        for"). Unscoped calls are the operator's: they act for ``tenant`` (None: every
        tenant). Inside ``tenant_scope(t)`` they act for ``t`` only: ``tenant=None`` means
        ``t``, naming another tenant -- or calling an operator-only method, which acts for
        every tenant -- raises :class:`AccessDenied` and records the attempt."""
        scoped = self._acting_scope()
        named = None if tenant is None else validate_tenant(tenant)
        if scoped is None:
            return named
        if operator_only or (named is not None and named != scoped):
            raise self._record_denial(_Denial(scoped, named or "*", operation, None))
        return scoped

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

    def _touch_due(self, ref: ThreadRef) -> bool:
        """Whether the thread's registry row is due an update (only :meth:`_touched_now`,
        called after the update succeeded, marks it done: a failed touch is retried)."""
        last = self._touched.get((ref.tenant, ref.thread_id))
        return last is None or time.monotonic() - last >= self.activity_resolution

    def _touched_now(self, ref: ThreadRef) -> None:
        if len(self._touched) > 100_000:
            self._touched.clear()
        self._touched[(ref.tenant, ref.thread_id)] = time.monotonic()

    def _forget_touch(self, tenant: str, thread_id: str) -> None:
        self._touched.pop((tenant, thread_id), None)
        self._tokens.forget_thread(tenant, thread_id)

    # keys ---------------------------------------------------------------------------------
    def _keys(self, tenant: str) -> TenantKeys:
        if not self.__dict__.get("_keyring_bound"):
            self._bind_keyring()
        keys = self.keys.keys_for(tenant, create=True)
        if keys is None:  # create=True always returns keys; kept for the type checker
            raise TamperedDataError(f"no keys for tenant {tenant!r}")
        return keys

    async def _akeys(self, tenant: str) -> TenantKeys:
        cached = self.keys.cached(tenant)
        return cached if cached is not None else await asyncio.to_thread(self._keys, tenant)

    async def _akeys_existing(self, tenant: str) -> TenantKeys | None:
        return self.keys.cached(tenant) or await asyncio.to_thread(
            self.keys.keys_for, tenant, create=False)

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
                token = self._tokens.get(ref, ch, versions.get(ch))
                if token is not None:
                    reused[ch] = token
                    continue
            values[ch] = value
        entries: builtins.list[Any] = []
        if self.redactor is not None:
            values = {ch: self._redact_one(keys, ch, v, entries) for ch, v in values.items()}
        sealed = self.codec.seal_checkpoint(keys, ref, checkpoint, values, reused)
        for ch in values:
            self._tokens.put(ref, ch, versions.get(ch), sealed["channel_values"][ch])
        full = self._redact_metadata(keys, get_checkpoint_metadata(config, metadata), entries)
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
            writes = [(ch, self._redact_one(keys, ch, v, entries)) for ch, v in writes]
        sealed: builtins.list[tuple[str, Any]] = builtins.list(
            self.codec.seal_writes(keys, ref, cid, task_id, task_path, writes))
        return sealed, self.vault.unknown(ref.tenant, ref.thread_id, entries)

    def _seal_put(self, keys: TenantKeys, ref: ThreadRef, config: RunnableConfig,
                  checkpoint: Checkpoint, metadata: CheckpointMetadata,
                  new_versions: ChannelVersions) -> tuple[Checkpoint, dict[str, Any]]:
        """Everything a put does before the inner saver's call (CPU work and registry rows;
        ``aput`` runs it in one worker thread): redact and seal, touch the thread's registry
        row when due, and store new PII originals before their tokens reach storage."""
        sealed, md, new_pii = self._prepare_put(keys, ref, config, checkpoint, metadata,
                                                new_versions)
        if self._touch_due(ref):
            self._touch(ref)
        self.vault.store(keys, ref.thread_id, new_pii)
        return sealed, md

    def _seal_writes(self, keys: TenantKeys, ref: ThreadRef, config: RunnableConfig,
                     writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
                     ) -> builtins.list[tuple[str, Any]]:
        """The put_writes counterpart of :meth:`_seal_put`."""
        sealed, new_pii = self._prepare_writes(keys, ref, config, writes, task_id, task_path)
        self.vault.store(keys, ref.thread_id, new_pii)
        return sealed

    def _remember_tokens(self, ref: ThreadRef, raw: CheckpointTuple) -> None:
        """Tokens of the checkpoint just authenticated: the next put reuses the unchanged ones."""
        conf = raw.config["configurable"]
        at = ThreadRef(ref.tenant, ref.thread_id, str(conf.get("checkpoint_ns", "") or ""))
        versions = raw.checkpoint["channel_versions"]
        for ch, token in raw.checkpoint["channel_values"].items():
            self._tokens.put(at, ch, versions.get(ch), token)

    @staticmethod
    def _token_key(keys: TenantKeys) -> bytes:
        return bytes.fromhex(keys.blind("pii-token-key"))

    def _redact_one(self, keys: TenantKeys, channel: str, value: Any,
                    entries: builtins.list[Any]) -> Any:
        redacted, found = self.redactor.redact_value(
            value, channel=channel, token_key=self._token_key(keys))
        entries.extend(found)
        return redacted

    def _redact_metadata(self, keys: TenantKeys, full: Mapping[str, Any],
                         entries: builtins.list[Any]) -> Any:
        """Checkpoint metadata (including what LangGraph copied from ``configurable`` and
        ``config["metadata"]``) through the redactor; LangGraph's own bookkeeping keys stay."""
        if self.redactor is None or not full:
            return full
        rest = {k: v for k, v in full.items() if k not in _METADATA_KEPT}
        redacted = self._redact_one(keys, METADATA_CHANNEL, rest, entries)
        return full if redacted is rest else {**full, **redacted}

    def _redact_filter(self, keys: TenantKeys | None,
                       filter: dict[str, Any] | None) -> dict[str, Any] | None:
        """A list() filter redacted like stored metadata (tokens are deterministic)."""
        if self.redactor is None or not filter or keys is None:
            return filter
        out: dict[str, Any] = self._redact_metadata(keys, filter, [])
        return out

    def _redact_for_store(self, keys: TenantKeys, thread_id: str, value: Any,
                         channel: str) -> Any:
        """``value`` redacted for a companion store of this saver (idempotency results,
        recovery records); the originals of its tokens go to the vault under ``thread_id``."""
        if self.redactor is None:
            return value
        entries: builtins.list[Any] = []
        redacted = self._redact_one(keys, channel, value, entries)
        new = self.vault.unknown(keys.tenant, thread_id, entries)
        if new:
            self.vault.store(keys, thread_id, new)
        return redacted

    def _restore_for_store(self, keys: TenantKeys, value: Any) -> Any:
        """The counterpart of :meth:`_redact_for_store` for the owning tenant."""
        if self.redactor is None:
            return value
        return self.redactor.restore_value(value, lambda wanted: self.vault.lookup(keys, wanted))

    # restoring tokenized PII on read (shared) ---------------------------------------------
    def _tokens_in(self, tup: CheckpointTuple,
                   known: Mapping[str, builtins.set[str] | None] | None = None
                   ) -> builtins.list[str]:
        found: dict[str, None] = {}
        for ch, value in tup.checkpoint["channel_values"].items():
            in_bytes = (known or {}).get(ch)
            found.update(dict.fromkeys(
                in_bytes if in_bytes is not None else self.redactor.find_tokens(value)))
        for _task, _ch, value in tup.pending_writes or []:
            found.update(dict.fromkeys(self.redactor.find_tokens(value)))
        if tup.metadata:
            found.update(dict.fromkeys(self.redactor.find_tokens(tup.metadata)))
        return builtins.list(found)

    def _restore(self, keys: TenantKeys, tup: CheckpointTuple,
                 known: Mapping[str, builtins.set[str] | None] | None = None,
                 prefetched: Mapping[str, str] | None = None) -> CheckpointTuple:
        """Put the originals back for the owning tenant (so a resumed tool gets real values).

        ``known``: the tokens of each channel found in its plaintext bytes (see open_tuple): a
        channel without any is returned as loaded, the others are restored in one walk."""
        if self.redactor is None:
            return tup
        known = known or {}
        # the vault's erasure epoch is checked once per read (first lookup); the async path
        # looked every token up off the event loop already (``prefetched``)
        checked = [False]

        def lookup(wanted: Sequence[str]) -> Mapping[str, str]:
            if prefetched is not None:
                return {t: prefetched[t] for t in wanted if t in prefetched}
            found = self.vault.lookup(keys, wanted, verify=not checked[0])
            checked[0] = checked[0] or bool(wanted)
            return found

        # one query for the tokens already found in the bytes; other channels look up their own
        originals = lookup([t for found in known.values() if found for t in found])

        def restore_channel(ch: str, value: Any) -> Any:
            in_bytes = known.get(ch)
            if in_bytes is None:
                return self.redactor.restore_value(value, lookup)
            if not in_bytes:
                return value
            return self.redactor.restore_value(
                value, lookup, originals={t: originals[t] for t in in_bytes if t in originals})

        checkpoint = tup.checkpoint.copy()
        checkpoint["channel_values"] = {
            ch: restore_channel(ch, v) for ch, v in tup.checkpoint["channel_values"].items()}
        writes = [(t, ch, self.redactor.restore_value(v, lookup))
                  for t, ch, v in tup.pending_writes or []]
        metadata = self.redactor.restore_value(tup.metadata, lookup) if tup.metadata else \
            tup.metadata
        return tup._replace(checkpoint=checkpoint, pending_writes=writes, metadata=metadata)

    async def _arestore(self, keys: TenantKeys, tup: CheckpointTuple,
                        known: Mapping[str, builtins.set[str] | None] | None = None
                        ) -> CheckpointTuple:
        if self.redactor is None:
            return tup
        tokens = self._tokens_in(tup, known)
        # every token's original looked up off the event loop; restoring is then CPU only
        found = await asyncio.to_thread(self.vault.lookup, keys, tokens) if tokens else {}
        return self._restore(keys, tup, known, prefetched=found)

    # --------------------------------------------------------------------------------------
    # sync API
    # --------------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        ref = self._scoped(lambda: self._ref(config, "get_tuple"))
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
        return _named_tup(self._restore(keys, opened, known), config, ref.tenant)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        tenant, inner_config, inner_before, one_thread = self._scoped(
            lambda: self._list_args(config, before))
        keys = self.keys.keys_for(tenant, create=False)
        if keys is None:
            return
        inner_filter = self.codec.translate_filter(keys, self._redact_filter(keys, filter))
        yielded = 0
        rows = _listing(tenant, lambda: self._inner_rows(
            tenant, inner_config, inner_filter, inner_before, limit, one_thread))
        try:  # early exit (limit, error, caller stops) releases the inner cursor at once
            for tup in rows:
                listed = self._open_listed(keys, tenant, tup, rows.drain)
                if listed is None:
                    continue
                yield _named_tup(self._restore(keys, *listed), config, tenant)
                yielded += 1
                if limit is not None and yielded >= limit:
                    return
        finally:
            rows.close()

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        ref = self._scoped(lambda: self._ref(config, "put"))
        inner = self._sync_inner("put")
        keys = self._keys(ref.tenant)
        sealed, md = self._seal_put(keys, ref, config, checkpoint, metadata, new_versions)
        saved = inner.put(self._inner_config(ref, config), sealed, md, new_versions)  # type: ignore[arg-type]
        return _named_cfg(self._outer(ref.tenant)(saved) or saved, config, ref.tenant)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        ref = self._scoped(lambda: self._ref(config, "put_writes"))
        inner = self._sync_inner("put_writes")
        keys = self._keys(ref.tenant)
        optional = self._optional("put_writes", task_path=task_path)
        # sealed with the task path the inner saver stores (none if it takes none)
        sealed = self._seal_writes(keys, ref, config, writes, task_id,
                                   optional.get("task_path", ""))
        inner.put_writes(self._inner_config(ref, config), sealed, task_id, **optional)

    def delete_thread(self, thread_id: str) -> None:
        thread_id = _thread_id(thread_id)
        tenant = self._scoped(lambda: self._tenant("delete_thread", thread_id=str(thread_id)))
        self._sync_inner("delete_thread")
        self._delete_threads(tenant, [str(thread_id)], "delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        tenant = self._scoped(lambda: self._tenant("delete_for_runs"))
        run_ids = _str_list(run_ids, "run_ids")
        if not run_ids:
            return
        self._sync_inner("delete_for_runs")
        self._ops.delete_for_runs(thread_prefix(tenant), run_ids)
        self.registry.record_event("runs_deleted", tenant=tenant, run_ids=run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source_thread_id, target_thread_id = _copy_ids(source_thread_id, target_thread_id)
        tenant = self._scoped(lambda: self._tenant("copy_thread", thread_id=str(source_thread_id)))
        with _tenant_pinned(tenant):
            src: RunnableConfig = {"configurable": {"thread_id": str(source_thread_id),
                                                    "tenant_id": tenant}}
            dst: RunnableConfig = {"configurable": {"thread_id": str(target_thread_id),
                                                    "tenant_id": tenant}}
            if self.get_tuple(dst) is not None:
                raise ConfigurationError(
                    f"copy_thread target {target_thread_id!r} already has checkpoints")
            tuples = list(self.list(src))
            for tup in reversed(tuples):
                for cfg, ckpt, md, versions, writes in _copy_plan(tup, dst):
                    saved = self.put(cfg, ckpt, md, versions)
                    for task_id, task_writes in writes.items():
                        self.put_writes(saved, task_writes, task_id)
        self.registry.record_event("thread_copied", tenant=tenant, thread_id=str(target_thread_id),
                                   source=str(source_thread_id), checkpoints=len(tuples))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        tenant = self._scoped(lambda: self._tenant("prune"))
        ids = _str_list(thread_ids, "thread_ids")
        _check_strategy(strategy)
        if not ids:
            return
        self._sync_inner("prune")
        if strategy == "delete":
            self._delete_threads(tenant, ids, "prune")
        else:
            self._keep_latest(tenant, ids)

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
        ref = self._scoped(lambda: self._ref(config, "get_delta_channel_history"))
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
        ref = await self._ascoped(lambda: self._ref(config, "get_tuple"))
        inner_config = self._inner_config(ref, config)
        with _decoding(ref, inner_config):
            tup = await self._ainner("get_tuple", inner_config)
        if tup is None:
            return None
        keys = await self._akeys_existing(ref.tenant)
        if keys is None:
            keys = self.keys.require(ref.tenant)  # raises TamperedDataError
        known: dict[str, builtins.set[str] | None] | None = (
            {} if self.redactor is not None else None)
        opened = await self._aopen_checked(keys, ref, tup, known)
        self._remember_tokens(ref, tup)
        return _named_tup(await self._arestore(keys, opened, known), config, ref.tenant)

    async def aget_delta_channel_history(
            self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Async twin of :meth:`get_delta_channel_history` (vault lookups off the loop)."""
        if not channels:
            return {}
        if self._sync_only:
            return await asyncio.to_thread(
                lambda: self.get_delta_channel_history(config=config, channels=channels))
        ref = await self._ascoped(lambda: self._ref(config, "get_delta_channel_history"))
        walk = _DeltaWalk(channels)
        keys = await self._akeys_existing(ref.tenant)
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
        tenant, inner_config, inner_before, one_thread = await self._ascoped(
            lambda: self._list_args(config, before))
        keys = await self._akeys_existing(tenant)
        if keys is None:
            return
        if filter and self.redactor is not None:
            filter = await asyncio.to_thread(self._redact_filter, keys, filter)
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
                yield _named_tup(await self._arestore(keys, *listed), config, tenant)
                yielded += 1
                if limit is not None and yielded >= limit:
                    return
        finally:
            await arows.aclose()

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        ref = await self._ascoped(lambda: self._ref(config, "put"))
        keys = await self._akeys(ref.tenant)
        # redaction, serialization, sealing and the registry rows: one hop off the event loop
        sealed, md = await asyncio.to_thread(
            self._seal_put, keys, ref, config, checkpoint, metadata, new_versions)
        saved = await self._ainner("put", self._inner_config(ref, config), sealed, md,
                                   new_versions)
        return _named_cfg(self._outer(ref.tenant)(saved) or saved, config, ref.tenant)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        ref = await self._ascoped(lambda: self._ref(config, "put_writes"))
        keys = await self._akeys(ref.tenant)
        optional = self._optional("put_writes", task_path=task_path)
        path = optional.get("task_path", "")  # as the inner saver stores it
        sealed = await asyncio.to_thread(  # one hop off the event loop, as in aput
            self._seal_writes, keys, ref, config, writes, task_id, path)
        await self._ainner("put_writes", self._inner_config(ref, config), sealed, task_id,
                           **optional)

    async def adelete_thread(self, thread_id: str) -> None:
        thread_id = _thread_id(thread_id)
        tenant = await self._ascoped(
            lambda: self._tenant("delete_thread", thread_id=str(thread_id)))
        await asyncio.to_thread(self._delete_threads, tenant, [str(thread_id)], "delete_thread")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        tenant = await self._ascoped(lambda: self._tenant("delete_for_runs"))
        run_ids = _str_list(run_ids, "run_ids")
        if not run_ids:
            return
        if self._sync_only:
            await asyncio.to_thread(self._ops.delete_for_runs, thread_prefix(tenant), run_ids)
        else:
            await self._ops.adelete_for_runs(thread_prefix(tenant), run_ids)
        await asyncio.to_thread(self.registry.record_event, "runs_deleted", tenant=tenant,
                                run_ids=run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source_thread_id, target_thread_id = _copy_ids(source_thread_id, target_thread_id)
        tenant = await self._ascoped(
            lambda: self._tenant("copy_thread", thread_id=str(source_thread_id)))
        with _tenant_pinned(tenant):
            src: RunnableConfig = {"configurable": {"thread_id": str(source_thread_id),
                                                    "tenant_id": tenant}}
            dst: RunnableConfig = {"configurable": {"thread_id": str(target_thread_id),
                                                    "tenant_id": tenant}}
            if await self.aget_tuple(dst) is not None:
                raise ConfigurationError(
                    f"copy_thread target {target_thread_id!r} already has checkpoints")
            tuples = [t async for t in self.alist(src)]
            for tup in reversed(tuples):
                for cfg, ckpt, md, versions, writes in _copy_plan(tup, dst):
                    saved = await self.aput(cfg, ckpt, md, versions)
                    for task_id, task_writes in writes.items():
                        await self.aput_writes(saved, task_writes, task_id)
        await asyncio.to_thread(
            self.registry.record_event, "thread_copied", tenant=tenant,
            thread_id=str(target_thread_id), source=str(source_thread_id),
            checkpoints=len(tuples))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        tenant = await self._ascoped(lambda: self._tenant("prune"))
        ids = _str_list(thread_ids, "thread_ids")
        _check_strategy(strategy)
        if not ids:
            return
        if strategy == "delete":
            await asyncio.to_thread(self._delete_threads, tenant, ids, "prune")
        else:
            await asyncio.to_thread(self._keep_latest, tenant, ids)

    # shared helpers -----------------------------------------------------------------------
    def _list_args(self, config: RunnableConfig | None, before: RunnableConfig | None
                   ) -> tuple[str, RunnableConfig | None, RunnableConfig | None, bool]:
        if config is None:
            tenant = self._tenant("list(None)")
            inner_config = None
        else:
            ref = self._ref(config, "list")
            tenant = ref.tenant
            has_ns = "checkpoint_ns" in (config.get("configurable") or {})
            inner_config = self._inner_config(ref, config, with_ns=has_ns)
        inner_before = None
        if before is not None:
            bconf = before.get("configurable") or {}
            if bconf.get("thread_id") is not None:
                bref = self._ref(before, "list(before=...)")
                if bref.tenant != tenant:
                    raise _DeniedError(_Denial(tenant, bref.tenant, "list", bref.thread_id))
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
        ids = self._ops.thread_ids(thread_prefix(tenant))
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
        ids = await self._ops.athread_ids(thread_prefix(tenant))
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

    def _delete_threads(self, tenant: str, thread_ids: Sequence[str], how: str) -> None:
        """Delete threads completely and leave a receipt for each (runs in a worker thread
        on the async path; async-only inner savers are reached on their own loop)."""
        actor = current_tenant_scope() or tenant
        for thread_id in thread_ids:
            ref = ThreadRef(tenant, thread_id)
            counts = self._purge_thread_storage(ref)
            self.registry.finish_deleted(tenant, thread_id, {
                "tenant": tenant, "thread_id": thread_id, "action": "deleted", "reason": how,
                "requested_by": actor, "detail": counts})
            self._forget_touch(tenant, thread_id)

    def _keep_latest(self, tenant: str, thread_ids: Sequence[str]) -> None:
        refs = [ThreadRef(tenant, t) for t in thread_ids]
        before = {r.thread_id: self._ops.count_checkpoints(r.inner_id) for r in refs}
        self._ops.keep_latest([r.inner_id for r in refs])
        for ref in refs:
            after = self._ops.count_checkpoints(ref.inner_id)
            if before[ref.thread_id] > after:
                self.registry.add_receipt(
                    tenant=tenant, thread_id=ref.thread_id, action="pruned", reason="prune",
                    requested_by=current_tenant_scope() or tenant,
                    detail={"checkpoints_deleted": before[ref.thread_id] - after,
                            "checkpoints_kept": after})

    def _purge_thread_storage(self, ref: ThreadRef) -> dict[str, int]:
        """Remove a thread's checkpoints, writes and blobs, and every record SecureSaver or its
        companions keep for it. Idempotent: a crash half-way is finished by running it again."""
        counts = {"checkpoints": self._ops.count_checkpoints(ref.inner_id)}
        self._ops.delete_threads([ref.inner_id])
        for name, purge in self._thread_purgers():
            counts[name] = purge(ref.tenant, ref.thread_id)
        return counts

    def _thread_purgers(self) -> builtins.list[tuple[str, Callable[[str, str], int]]]:
        """Per-thread cleanups of companion stores (PII vault, idempotency records)."""
        purgers: builtins.list[tuple[str, Callable[[str, str], int]]] = [
            ("pii_values", self.vault.delete_thread)]
        store = self._idempotency()
        if store is not None:
            purgers.append(("idempotency_records", store.delete_thread))
        return purgers

    def _idempotency(self) -> Any:
        """The idempotency store on this saver's database (None if that component is absent)."""
        try:
            from .idempotency import IdempotencyStore
        except ImportError:
            return None
        return IdempotencyStore.for_saver(self)

    def _latest_checkpoint_time(self, ref: ThreadRef) -> float | None:
        from .pruner import _checkpoint_time
        config: RunnableConfig = {"configurable": {"thread_id": ref.inner_id,
                                                   "checkpoint_ns": ""}}
        if self._async_only:
            tup = self._ops._bridge(self.inner.aget_tuple(config))
        else:
            tup = self.inner.get_tuple(config)
        return None if tup is None else _checkpoint_time(tup.checkpoint.get("ts"))

    # retention ----------------------------------------------------------------------------
    def _save_default_policy(self) -> None:
        if self.retention is not None and not self._default_policy_saved:
            self.registry.set_policy(DEFAULT_POLICY_KEY, self.retention)
        self._default_policy_saved = True

    def _policy_for(self, tenant: str) -> RetentionPolicy:
        self._save_default_policy()
        hit = self._policies.get(tenant)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.activity_resolution:
            return hit[1]
        policy, _source = self.registry.effective_policy(tenant)
        self._policies[tenant] = (now, policy)
        return policy

    def _touch(self, ref: ThreadRef) -> None:
        self.registry.touch_thread(ref.tenant, ref.thread_id, policy=self._policy_for(ref.tenant))
        self._touched_now(ref)

    def set_default_retention(self, policy: RetentionPolicy | None) -> None:
        """The policy for tenants without their own (stored in the registry for the pruner).
        Operator only (refused inside a tenant scope)."""
        self._admin_tenant("set_default_retention", operator_only=True)
        self.registry.set_policy(DEFAULT_POLICY_KEY, policy)
        self.retention, self._default_policy_saved = policy, True
        self._policies.clear()

    def set_tenant_retention(self, tenant: str, policy: RetentionPolicy | None) -> None:
        """A tenant's own policy (``legal_hold=True`` holds the whole tenant); None removes it."""
        tenant = self._admin_tenant("set_tenant_retention", validate_tenant(tenant)) or tenant
        self.registry.set_policy(tenant, policy)
        self._policies.pop(tenant, None)
        self.registry.record_event("retention_changed", tenant=tenant,
                                   policy=None if policy is None else policy.as_row())

    async def aset_default_retention(self, policy: RetentionPolicy | None) -> None:
        await asyncio.to_thread(self.set_default_retention, policy)

    async def aset_tenant_retention(self, tenant: str, policy: RetentionPolicy | None) -> None:
        await asyncio.to_thread(self.set_tenant_retention, tenant, policy)

    _UNSET: Any = object()

    def set_retention(self, thread_id: str, *, idle_ttl: Any = _UNSET, max_age: Any = _UNSET,
                      legal_hold: Any = _UNSET, strategy: Any = _UNSET) -> ThreadRow:
        """Override retention for one thread of the current tenant (scope or default)."""
        thread_id = _thread_id(thread_id)
        tenant = self._scoped(lambda: self._tenant("set_retention", thread_id=str(thread_id)))
        changes: dict[str, Any] = {}
        if idle_ttl is not self._UNSET:
            changes["idle_ttl"] = parse_duration(idle_ttl, what="idle_ttl")
        if max_age is not self._UNSET:
            changes["max_age"] = parse_duration(max_age, what="max_age")
        if legal_hold is not self._UNSET:
            changes["legal_hold"] = bool(legal_hold)
        if strategy is not self._UNSET:
            RetentionPolicy(strategy=strategy)  # validates
            changes["strategy"] = strategy
        if not changes:
            raise ConfigurationError(
                "set_retention needs idle_ttl, max_age, legal_hold or strategy")
        row = self.registry.set_thread_retention(tenant, str(thread_id), **changes)
        self.registry.record_event("retention_changed", tenant=tenant, thread_id=str(thread_id),
                                   **{k: v for k, v in changes.items()})
        return row

    async def aset_retention(self, thread_id: str, **changes: Any) -> ThreadRow:
        tenant = await self._ascoped(
            lambda: self._tenant("set_retention", thread_id=str(thread_id)))
        from .tenancy import tenant_scope
        def run() -> ThreadRow:
            with tenant_scope(tenant):
                return self.set_retention(thread_id, **changes)
        return await asyncio.to_thread(run)

    def prune_expired(self, now: Any = None, *, limit: int | None = None,
                      dry_run: bool = False, tenant: str | None = None, **options: Any
                      ) -> PruneReport:
        """Execute retention: delete (or prune to latest) every expired, unheld thread.

        Safe to run on several machines at once. ``now`` (epoch seconds or an aware
        datetime) is for tests and backfills. Inside a tenant scope only that tenant's threads
        are swept. ``options``: ``batch``, ``lease``, ``active_grace``, ``owner``,
        ``progress``, ``should_stop`` (see :class:`~langgraph_securesaver.pruner.Sweep`).
        """
        from .pruner import Sweep
        from .timeargs import to_epoch
        tenant = self._admin_tenant("prune_expired", tenant)
        now = to_epoch(now, "now")
        # the sweep acts only on thread rows whose MACs verify: without the keyring it cannot
        # tell a forged expiry from a real one, so it refuses to run (KeyringRequired)
        self.registry.integrity.require()
        self._save_default_policy()
        report = Sweep(self, now=now, limit=limit, dry_run=dry_run, tenant=tenant,
                       **options).run()
        if not dry_run and (report.deleted or report.pruned_to_latest):
            self.registry.record_event("retention_sweep", tenant=tenant,
                                       deleted=len(report.deleted),
                                       pruned=len(report.pruned_to_latest),
                                       errors=len(report.errors))
        return report

    async def aprune_expired(self, now: Any = None, *, limit: int | None = None,
                             dry_run: bool = False, tenant: str | None = None, **options: Any
                             ) -> PruneReport:
        return await asyncio.to_thread(self.prune_expired, now, limit=limit, dry_run=dry_run,
                                       tenant=tenant, **options)

    def receipts(self, *, tenant: str | None = None, thread_id: str | None = None,
                 since: Any = None, until: Any = None) -> builtins.list[Receipt]:
        """Deletion receipts (content-free: who, what, when, why, how many); ``since`` and
        ``until`` are epoch seconds or aware datetimes. Inside a scope: that tenant's only."""
        from .timeargs import to_epoch
        tenant = self._admin_tenant("receipts", tenant)
        if thread_id is not None:
            thread_id = _thread_id(thread_id)
        return self.registry.list_receipts(tenant=tenant, thread_id=thread_id,
                                           since=to_epoch(since, "since"),
                                           until=to_epoch(until, "until"))

    async def areceipts(self, **filters: Any) -> builtins.list[Receipt]:
        return await asyncio.to_thread(lambda: self.receipts(**filters))

    def shred_tenant(self, tenant: str, *, requested_by: str | None = None) -> int:
        """Crypto-shred a tenant: destroy what unwraps its keys at the key provider, so every
        copy of its data (database backups included) is unreadable, then delete its rows.

        Needs a keyring loaded from a file (it is rewritten) or a provider with
        ``destroy_tenant``, and refuses when the keyring also serves another database (see
        :meth:`Keyring.databases`): puncturing keeps per-tenant material only for the tenants
        of this registry. Returns the number of threads deleted.
        """
        tenant = self._admin_tenant("shred_tenant", validate_tenant(tenant)) or tenant
        requested_by = validate_actor(requested_by)
        ring: Any = self.keyring
        if not hasattr(ring, "destroy_tenant") or not hasattr(ring, "add_version"):
            raise ConfigurationError(
                f"{type(ring).__name__} cannot destroy tenant keys; use a Keyring file or a "
                "KeyProvider with destroy_tenant()")
        if getattr(ring, "path", None) is None:
            raise ConfigurationError(
                "shredding rewrites the keyring: load it with Keyring.from_file(path) (an "
                "environment keyring cannot be changed from here)")
        self.require_sole_database("shred_tenant")
        reload = getattr(ring, "reload", None)
        if callable(reload):       # start from the file as it is now (another process may
            reload()               # have rotated since this one loaded it)
        others = [t for t in self.registry.tenants_with_keys() if t != tenant]
        ring.add_version()
        ring.persist()                         # 1. a fresh master version for everyone else
        for other in others:                   # 2. move the others' key rows onto it
            stale = [r for r in self.registry.load_key_rows(other)
                     if r.master_version != ring.current_version]
            if stale:
                self.registry.replace_key_rows(self.keys.rewrap(other, stale))
        ring.destroy_tenant(tenant, others)    # 3. older versions survive only for the others
        ring.persist()
        self.keys.forget()
        thread_ids = sorted({r.thread_id for r in self.registry.list_threads(tenant)}
                            | set(self._inner_thread_ids(tenant)))
        for thread_id in thread_ids:           # 4. delete the (now unreadable) rows
            counts = self._purge_thread_storage(ThreadRef(tenant, thread_id))
            self.registry.finish_deleted(tenant, thread_id, {
                "tenant": tenant, "thread_id": thread_id, "action": "shredded",
                "reason": "shred_tenant", "requested_by": requested_by, "detail": counts})
        self.vault.delete_tenant(tenant)
        store = self._idempotency()
        if store is not None:
            store.delete_tenant(tenant)
        self.registry.forget_tenant(tenant)
        self._policies.pop(tenant, None)
        self.registry.record_event("tenant_shredded", tenant=tenant, actor=requested_by,
                                   threads=len(thread_ids),
                                   master_version=ring.current_version)
        logger.warning("tenant %r crypto-shredded (%d threads)", tenant, len(thread_ids))
        return len(thread_ids)

    async def ashred_tenant(self, tenant: str, *, requested_by: str | None = None) -> int:
        return await asyncio.to_thread(self.shred_tenant, tenant, requested_by=requested_by)

    def _inner_thread_ids(self, tenant: str) -> builtins.list[str]:
        """Thread ids the inner saver holds for a tenant (finds rows the registry lost)."""
        prefix = thread_prefix(tenant)
        ids = self._ops.thread_ids(prefix)
        if ids is not None:
            return sorted({i[len(prefix):] for i in ids if i.startswith(prefix)})
        seen: set[str] = set()
        if self._async_only:
            async def collect() -> builtins.list[Any]:
                return [t async for t in self.inner.alist(None)]
            rows: Any = self._ops._bridge(collect())
        else:
            rows = self.inner.list(None)
        for tup in rows:
            thread = outer_thread_id(tenant, str(tup.config["configurable"]["thread_id"]))
            if thread is not None:
                seen.add(thread)
        return sorted(seen)

    # PII inventory and erasure --------------------------------------------------------------
    def pii_inventory(self, tenant: str | None = None, thread_id: str | None = None
                      ) -> dict[tuple[str, str], dict[str, int]]:
        """{(tenant, thread): {PII kind: distinct values}} for threads holding tokenized PII
        (inside a scope: that tenant's threads only)."""
        tenant = self._admin_tenant("pii_inventory", tenant)
        if thread_id is not None:
            thread_id = _thread_id(thread_id)
        return self.vault.inventory(tenant, thread_id)

    async def apii_inventory(self, tenant: str | None = None, thread_id: str | None = None
                             ) -> dict[tuple[str, str], dict[str, int]]:
        return await asyncio.to_thread(self.pii_inventory, tenant, thread_id)

    def forget_pii(self, tenant: str, value: str | None = None, *, kind: str | None = None,
                   requested_by: str | None = None) -> int:
        """Erase stored PII without deleting conversations: the token stays, the value goes.

        ``value`` erases that value wherever the tenant's threads hold it; ``kind`` (e.g.
        ``"EMAIL_ADDRESS"``) erases every value of that kind. Returns the values erased.
        """
        from .redaction import make_token
        tenant = self._admin_tenant("forget_pii", validate_tenant(tenant)) or tenant
        requested_by = validate_actor(requested_by)
        if value is None and kind is None:
            raise ConfigurationError("forget_pii needs a value or a kind")
        keys = self.keys.keys_for(tenant, create=False)
        if keys is None:
            return 0
        tokens: builtins.list[str] = []
        if kind is not None:
            tokens += self.vault.tokens_of_kind(tenant, kind)
        if value is not None:
            token_key = self._token_key(keys)
            for known in ([kind] if kind else self.vault.kinds(tenant)):
                tokens.append(make_token(token_key, known, value))
        erased = self.vault.forget_tokens(tenant, tokens)
        self.registry.record_event("pii_forgotten", tenant=tenant, actor=requested_by,
                                   entity=kind, by_value=value is not None, erased=erased)
        return erased

    async def aforget_pii(self, tenant: str, value: str | None = None, *,
                          kind: str | None = None, requested_by: str | None = None) -> int:
        return await asyncio.to_thread(lambda: self.forget_pii(
            tenant, value, kind=kind, requested_by=requested_by))

    # audit and operations (implemented in audit.py, scan.py, rotation.py) -----------------
    def audit(self, *, tenant: str | None = None, now: Any = None) -> Any:
        """Inventory: tenants, threads, ages, expiry, sizes, key versions, PII kinds (inside a
        scope: that tenant only). ``now``: epoch seconds or an aware datetime."""
        from .audit import audit
        from .timeargs import to_epoch
        return audit(self, tenant=tenant, now=to_epoch(now, "now"))

    async def aaudit(self, *, tenant: str | None = None, now: Any = None) -> Any:
        return await asyncio.to_thread(lambda: self.audit(tenant=tenant, now=now))

    def events(self, **filters: Any) -> Any:
        """Audit events and deletion receipts (tenant, thread_id, kind, since, until, limit;
        times are epoch seconds or aware datetimes). Inside a scope: that tenant's only."""
        from .audit import events
        from .timeargs import to_epoch
        for name in ("since", "until"):
            if name in filters:
                filters[name] = to_epoch(filters[name], name)
        if filters.get("thread_id") is not None:
            filters["thread_id"] = _thread_id(filters["thread_id"])
        return events(self, **filters)

    async def aevents(self, **filters: Any) -> Any:
        return await asyncio.to_thread(lambda: self.events(**filters))

    def scan(self, **options: Any) -> Any:
        """Check the at-rest guarantees on the raw tables (see scan.scan for options).
        Operator only: it reads every tenant's rows."""
        from .scan import scan
        return scan(self, **options)

    async def ascan(self, **options: Any) -> Any:
        return await asyncio.to_thread(lambda: self.scan(**options))

    def rotate_keys(self, **options: Any) -> Any:
        """New master version + rewrap; ``reencrypt=True`` also re-encrypts stored data.
        Operator only."""
        from .rotation import rotate_keys
        return rotate_keys(self, **options)

    async def arotate_keys(self, **options: Any) -> Any:
        return await asyncio.to_thread(lambda: self.rotate_keys(**options))

    def reencrypt(self, **options: Any) -> Any:
        """Rewrite every ciphertext not under its tenant's newest data key (resumable).
        ``tenants=`` narrows it; inside a scope it covers that tenant only."""
        from .rotation import reencrypt
        return reencrypt(self, **options)

    def _reencrypt_tenants(self, tenants: Any) -> builtins.list[str] | None:
        """The tenants a re-encryption may touch under the scope rule (None: every one)."""
        if isinstance(tenants, (str, bytes)):
            raise ConfigurationError("reencrypt(tenants=...) takes a list of tenant ids")
        if self._acting_scope() is not None:
            named = [self._admin_tenant("reencrypt", t) for t in (tenants or [None])]
            return sorted({t for t in named if t is not None})
        return None if tenants is None else [validate_tenant(t) for t in tenants]

    async def areencrypt(self, **options: Any) -> Any:
        return await asyncio.to_thread(lambda: self.reencrypt(**options))

    # which databases a keyring serves ---------------------------------------------------------
    def database_id(self) -> str:
        """A random id for the database behind this saver's registry, created on first use and
        kept in ``securesaver_meta``; keyrings record the ids of the databases they serve."""
        cached: str | None = self.__dict__.get("_database_id")
        if cached is not None:
            return cached
        import secrets

        import sqlalchemy as sa

        from .registry import meta_table
        with self.registry.begin() as conn:
            self.registry._insert_ignore(conn, meta_table, [
                {"key": "database_id", "value": secrets.token_hex(16)}])
            found = str(conn.execute(sa.select(meta_table.c.value).where(
                meta_table.c.key == "database_id")).scalar_one())
        self.__dict__["_database_id"] = found
        return found

    def _database_label(self) -> str:
        try:
            return self.registry.engine.url.render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001  # pragma: no cover - any engine has a URL
            return "(unknown)"

    def _bind_keyring(self) -> None:
        """Record in the keyring (once per process) that it serves this database."""
        if self.__dict__.get("_keyring_bound"):
            return
        self.__dict__["_keyring_bound"] = True
        record = getattr(self.keyring, "record_database", None)
        if callable(record):
            record(self.database_id(), self._database_label())

    def require_sole_database(self, operation: str) -> None:
        """Refuse ``operation`` (shredding, retiring master versions) when the keyring also
        serves another database: its tenants' key rows may still be wrapped under the master
        versions this would destroy, and this registry cannot know those tenants."""
        self._bind_keyring()
        others_of = getattr(self.keyring, "other_databases", None)
        if not callable(others_of):
            return
        others = others_of(self.database_id())
        if others:
            raise ConfigurationError(
                f"{operation} refused: keyring {getattr(self.keyring, 'path', '')} also serves "
                f"{len(others)} other database(s) ({', '.join(sorted(others.values()))}); "
                "destroying master versions here would make their tenants unreadable. Use a "
                "keyring that serves only this database, or, if those databases are gone, "
                "remove them with Keyring.forget_database(id) "
                f"(ids: {', '.join(sorted(others))})")

    # key operations -----------------------------------------------------------------------
    def rewrap_keys(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Re-seal every tenant's data keys under the keyring's current master version.

        Fast (no checkpoint is rewritten) and online. Afterwards older master versions are only
        needed for database backups taken before. Returns the number of key rows rewrapped.
        Operator only.
        """
        self._admin_tenant("rewrap_keys", operator_only=True)
        current = self.keyring.current_version
        tenants = self.registry.tenants_with_keys()
        done = 0
        for i, tenant in enumerate(tenants):
            stale = [r for r in self.registry.load_key_rows(tenant)
                     if r.master_version != current]
            if stale:
                self.registry.replace_key_rows(self.keys.rewrap(tenant, stale))
                done += len(stale)
            if progress:
                progress(i + 1, len(tenants))
        self.keys.forget()
        if done:
            self.registry.record_event("keys_rewrapped", master_version=current, rows=done,
                                       tenants=len(tenants))
        logger.info("rewrapped %d key rows under master version %s", done, current)
        return done

    async def arewrap_keys(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        return await asyncio.to_thread(self.rewrap_keys, progress=progress)

    def rotate_data_key(self, tenant: str) -> int:
        """Start a new data-key version for ``tenant``; new writes use it, old data still reads."""
        tenant = self._admin_tenant("rotate_data_key", validate_tenant(tenant)) or tenant
        version = self.keys.new_data_key(tenant)
        self.registry.record_event("data_key_rotated", tenant=tenant, version=version)
        return version

    async def arotate_data_key(self, tenant: str) -> int:
        return await asyncio.to_thread(self.rotate_data_key, tenant)

    async def amaster_versions_in_use(self) -> dict[str, int]:
        return await asyncio.to_thread(self.master_versions_in_use)

    def master_versions_in_use(self) -> dict[str, int]:
        """How many key rows each master version still wraps (retire a version at zero).
        Operator only."""
        self._admin_tenant("master_versions_in_use", operator_only=True)
        counts: dict[str, int] = {}
        for tenant in self.registry.tenants_with_keys():
            for row in self.registry.load_key_rows(tenant):
                counts[row.master_version] = counts.get(row.master_version, 0) + 1
        return counts

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


# what a stored row can do to an inner saver's own parsing (SQLite's clear metadata is JSON;
# the strict serializer raises TamperedDataError itself)
_PARSE_ERRORS = (TamperedDataError, json.JSONDecodeError, UnicodeDecodeError, TypeError,
                 AttributeError)


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


class _DeniedError(Exception):
    def __init__(self, denial: _Denial) -> None:
        super().__init__(denial)
        self.denial = denial


@contextmanager
def _tenant_pinned(tenant: str) -> Iterator[None]:
    """Inside copy_thread the resolved tenant acts for itself (scope or default alike)."""
    from .tenancy import tenant_scope
    if current_tenant_scope() == tenant:
        yield
        return
    with tenant_scope(tenant):
        yield


def _copy_plan(tup: CheckpointTuple, dst: RunnableConfig) -> Iterator[
        tuple[RunnableConfig, Checkpoint, CheckpointMetadata, ChannelVersions,
              dict[str, list[tuple[str, Any]]]]]:
    conf = dict(dst["configurable"])
    conf["checkpoint_ns"] = tup.config["configurable"].get("checkpoint_ns", "")
    if tup.parent_config is not None:
        conf["checkpoint_id"] = tup.parent_config["configurable"]["checkpoint_id"]
    writes: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in tup.pending_writes or []:
        writes.setdefault(task_id, []).append((channel, value))
    checkpoint = tup.checkpoint
    yield ({"configurable": conf}, checkpoint, tup.metadata,
           dict(checkpoint["channel_versions"]), writes)


def _thread_id(value: Any, what: str = "a thread id") -> str:
    """Ids are non-empty, bounded strings without NUL (ints and UUIDs are stringified)."""
    return validate_thread_id(value, what)


def _copy_ids(source: Any, target: Any) -> tuple[str, str]:
    src, dst = _thread_id(source), _thread_id(target)
    if src == dst:
        raise ConfigurationError("copy_thread needs two different thread ids")
    return src, dst


def _str_list(values: Sequence[str], name: str) -> list[str]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of ids, not a single string")
    return [_thread_id(v, f"each of {name}") for v in values]


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
