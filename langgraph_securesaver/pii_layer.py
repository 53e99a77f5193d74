"""The PII layer of a saver: its redactor and PII vault, applied on the way in and out.

On the way in, channel values, writes, metadata and list() filters are redacted (the
originals of new tokens go to the vault before the tokens reach storage); on the way out,
tokens are restored for the owning tenant only.

The redactor tokenizes with a keyed HMAC of each value (deterministic, so its caches work and
no key or vault reaches its worker processes); this layer then swaps each HMAC for the random
public token of the value's vault entry (:meth:`.registry.pii_vault.PiiVault.resolve`) before
anything is sealed: what storage holds is not a function of the value, so erasing the entry leaves
nothing that confirms a guess of it. Companion stores (idempotency results,
recovery records) use :meth:`PiiLayer.redact_for_store` / :meth:`PiiLayer.restore_for_store`.

It knows the redactor, the vault and a tenant's keys; nothing of sealing, tenancy rules or
the inner saver.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple

from .keys.crypto import TenantKeys
from .keys.material import SecretBytes
from .redaction.budget import current_spend
from .redaction.scheduler import aredaction_job, redaction_job
from .redaction.translate import TokenTranslator
from .registry.pii_vault import PiiVault
from .storage.ops import DELTA_METADATA_KEYS

# metadata keys LangGraph itself writes (ids, counters, delta-channel bookkeeping): not redacted
METADATA_KEPT: frozenset[str] = frozenset(
    {"source", "step", "parents", "run_id", "thread_id", "checkpoint_ns", "checkpoint_id",
     *DELTA_METADATA_KEYS})
METADATA_CHANNEL = "__metadata__"  # the channel name metadata is redacted under (policies)


class PiiLayer:
    """``redactor`` (None: redaction off) and ``vault`` of one saver."""

    def __init__(self, redactor: Any, vault: PiiVault) -> None:
        self.redactor = redactor
        self.vault = vault
        self._translator = TokenTranslator()

    @staticmethod
    def token_key(keys: TenantKeys) -> SecretBytes:
        """The tenant's PII token key, wrapped: the redactor reveals it only inside the HMAC
        call, so no frame of a failing redaction holds it raw."""
        return SecretBytes(bytes.fromhex(keys.blind("pii-token-key")))

    def redact_one(self, keys: TenantKeys, channel: str, value: Any,
                    entries: builtins.list[Any], *, create: bool = True,
                    thread_id: str | None = None) -> Any:
        """``value`` redacted, with public tokens; its vault entries are added to ``entries``.
        ``create=False`` (filters, queries): values without a live entry keep the HMAC token
        (never stored: it matches nothing new). ``thread_id``: the thread being written (the
        references to entries created here are recorded with them)."""
        redacted, found = self.redactor.redact_value(
            value, channel=channel, token_key=self.token_key(keys))
        if not found:
            return redacted
        # the vault's erasure epoch is read once per write (a put redacts several channels)
        spend = current_spend()
        checked = spend is not None and keys.tenant in spend.pii_epochs
        public = self.vault.resolve(keys, found, create=create, verify=not checked,
                                    thread_id=thread_id)
        if spend is not None:
            spend.pii_epochs.add(keys.tenant)
        entries.extend(public.values())
        return self.translate(redacted, {lookup: e.token for lookup, e in public.items()})

    def translate(self, value: Any, mapping: Mapping[str, str]) -> Any:
        """``value`` with the HMAC tokens of ``mapping`` replaced by public tokens."""
        if not mapping:
            return value
        return self._translator.translate(value, mapping, self.redactor.policy.max_depth)

    def public_token(self, keys: TenantKeys, kind: str, value: str) -> str | None:
        """The public token the tenant's conversations hold for ``value`` (None: no live
        entry). For operators and tests; never creates an entry."""
        from .redaction import make_token
        lookup = make_token(self.token_key(keys), kind, value)
        return self.vault.public_tokens(keys, [lookup]).get(lookup)

    def redact_metadata(self, keys: TenantKeys, full: Mapping[str, Any],
                         entries: builtins.list[Any], *, create: bool = True,
                         thread_id: str | None = None) -> Any:
        """Checkpoint metadata (including what LangGraph copied from ``configurable`` and
        ``config["metadata"]``) through the redactor; LangGraph's own bookkeeping keys stay."""
        if self.redactor is None or not full:
            return full
        rest = {k: v for k, v in full.items() if k not in METADATA_KEPT}
        redacted = self.redact_one(keys, METADATA_CHANNEL, rest, entries, create=create,
                                   thread_id=thread_id)
        return full if redacted is rest else {**full, **redacted}

    def redact_filter(self, keys: TenantKeys | None,
                       filter: dict[str, Any] | None) -> dict[str, Any] | None:
        """A list() filter redacted like stored metadata (a value maps to its entry's public
        token; a value without a live entry is stored nowhere, and matches nothing new)."""
        if self.redactor is None or not filter or keys is None:
            return filter
        out: dict[str, Any] = self.redact_metadata(keys, filter, [], create=False)
        return out

    def redact_for_store(self, keys: TenantKeys, thread_id: str, value: Any,
                         channel: str) -> Any:
        """``value`` redacted for a companion store of this saver (idempotency results,
        recovery records); the originals of its tokens go to the vault under ``thread_id``."""
        if self.redactor is None:
            return value
        entries: builtins.list[Any] = []
        redacted = self.redact_one(keys, channel, value, entries, thread_id=thread_id)
        new = self.vault.unknown(keys.tenant, thread_id, entries)
        if new:
            self.vault.store(keys, thread_id, new)
        return redacted

    def restore_for_store(self, keys: TenantKeys, value: Any) -> Any:
        """The counterpart of :meth:`redact_for_store` for the owning tenant."""
        if self.redactor is None:
            return value
        return self.redactor.restore_value(value, lambda wanted: self.vault.lookup(keys, wanted))

    # restoring tokenized PII on read (shared) ---------------------------------------------
    def tokens_in(self, tup: CheckpointTuple,
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

    def restore(self, keys: TenantKeys, tup: CheckpointTuple,
                 known: Mapping[str, builtins.set[str] | None] | None = None,
                 prefetched: Mapping[str, str] | None = None) -> CheckpointTuple:
        """Put the originals back for the owning tenant (so a resumed tool gets real values).
        ``tup`` is this read's own (just opened): its messages are restored in place.

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

        token_key = self.token_key(keys)

        def restore_channel(ch: str, value: Any) -> Any:
            in_bytes = known.get(ch)
            if in_bytes is None:
                out = self.redactor.restore_value(value, lookup, owned=True)
            elif not in_bytes:
                out = value
            else:
                out = self.redactor.restore_value(
                    value, lookup, originals={t: originals[t] for t in in_bytes if t in originals},
                    owned=True)
            # what the tenant reads back was paid for when stored: writing it again after a
            # restart (cold caches) must not spend the new write's budget, and so be refused
            self.redactor.remember_read(out, channel=ch, token_key=token_key)
            return out

        checkpoint = tup.checkpoint.copy()
        checkpoint["channel_values"] = {
            ch: restore_channel(ch, v) for ch, v in tup.checkpoint["channel_values"].items()}
        writes = [(t, ch, self.redactor.restore_value(v, lookup, owned=True))
                  for t, ch, v in tup.pending_writes or []]
        metadata = (self.redactor.restore_value(tup.metadata, lookup, owned=True)
                    if tup.metadata else tup.metadata)
        return tup._replace(checkpoint=checkpoint, pending_writes=writes, metadata=metadata)

    def restore_in_turn(self, keys: TenantKeys, tup: CheckpointTuple,
                        known: Mapping[str, builtins.set[str] | None] | None = None
                        ) -> CheckpointTuple:
        """:meth:`restore` as a job of the tenant on the redaction scheduler (sync API)."""
        if self.redactor is None:
            return tup
        return redaction_job(keys.tenant, self.restore, keys, tup, known)

    async def arestore(self, keys: TenantKeys, tup: CheckpointTuple,
                        known: Mapping[str, builtins.set[str] | None] | None = None
                        ) -> CheckpointTuple:
        if self.redactor is None:
            return tup
        # finding the tokens, looking them up and restoring: a job of the tenant's, off the loop
        return await aredaction_job(keys.tenant, self.restore, keys, tup, known)
