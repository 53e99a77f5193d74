"""The sealed format: what SecureSaver encrypts, with which associated data, and how a stored
checkpoint tuple is authenticated and opened again (:class:`SealedCodec`).

Holds only bytes-in/bytes-out logic over a tenant's keys: it knows nothing of tenancy rules,
the registry, redaction or the inner saver's API, and is shared by reads, writes, ``scan``
and key rotation.
"""

from __future__ import annotations

import builtins
import json
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .errors import TamperedDataError, UnsupportedFilterError
from .keys.crypto import TenantKeys
from .keys.tokens import associated_data, from_text, to_text
from .storage.ops import DELTA_METADATA_KEYS
from .tenancy import ThreadRef

SEALED_METADATA_KEY = "__securesaver__"
BLIND_INDEX_PREFIX = "ssbi_"
_SCALARS = (str, int, float, bool, type(None))


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


# Stored-format version of the sealed manifest and of sealed pending writes: the one format
# this library writes and reads; any other is refused.
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


class SealedCodec:
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
            raise TamperedDataError("a sealed pending write has no header: it was not "
                                    "written by this SecureSaver (forged or altered)")
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
                f"the checkpoint's sealed manifest has format {manifest.get('v')!r}; this "
                f"library reads only format {MANIFEST_VERSION} (forged, or written by a "
                "pre-release build)")
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
          replaces a row at the same idx, it never removes one).

        No order of the returned rows is assumed (the base API promises none: LMDB returns
        idx -3 before -4): they are returned in the order of their *sealed* (task path, task
        id, idx), so a row moved or renumbered in storage changes nothing a reader sees.

        A task whose every write was deleted looks like a task that never saved (re-run)."""
        rows = tup.pending_writes or []
        if not rows:
            return []
        parsed = []
        order: dict[str, builtins.list[int]] = {}
        claimed: dict[str, builtins.set[int]] = {}
        for row in rows:
            task_id, ch, tok = row
            path, idx, n, specials, body = self.split_write(
                keys.open(tok, self.write_aad(ref, cid, task_id, ch)))
            order.setdefault(task_id, []).append(idx)
            claimed.setdefault(task_id, builtins.set()).update(_call_indexes(n, specials))
            parsed.append((path, task_id, idx, ch, body))
        for task_id, idxs in order.items():
            present = builtins.set(idxs)
            if len(present) != len(idxs):
                raise TamperedDataError(
                    f"a pending write of task {task_id!r} is stored twice (a copied row)")
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
