"""Tamper evidence for the registry rows that steer security decisions.

Retention rows (thread TTLs, legal holds, policies), deletion receipts, audit events,
idempotency fingerprints and recovery opt-ins live in the database next to the checkpoints, so
anyone who can write the database can edit them. This module gives them keyed MACs whose key
the database does not hold:

* **The registry MAC key** is one random 256-bit key per installation, wrapped by the key
  provider exactly like a tenant's data keys and stored in ``securesaver_tenant_keys`` under
  a reserved name that is not a valid tenant id (:data:`RESERVED_TENANT`). Master-key rotation
  rewraps it with the tenant keys; a tenant shred keeps it (receipts of the shredded tenant
  must stay verifiable). Without the keyring nothing can be verified or written.
* **Rows** are MACed over a tagged, length-prefixed encoding of their fields (see
  :func:`encode`), under a domain per kind of row, so a MAC cannot be moved between tables or
  fields.
* **Receipts and events** additionally form a hash chain per tenant (plus one chain for
  tenant-less events): each row carries its position ``seq``, the MAC of the previous row and
  its own MAC; the chain's latest position is kept in ``securesaver_chain_heads`` with a MAC of
  its own. See :mod:`langgraph_securesaver.registry.core` for what is detectable.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import KeyringMismatch, KeyringRequired, TamperedDataError
from ..keys.material import SecretBytes
from ..keys.provider import KeyProvider, NoKeys, WrappedKey
from ..keys.tokens import KeyRow, KeyStore, row_context, wrap_context

#: tenant_keys.tenant of the registry MAC key; validate_tenant() refuses it (leading space)
RESERVED_TENANT = " securesaver-registry"
PURPOSE = "registry"
VERSION = 1
GENESIS = ""  # prev_mac of the first row of a chain


def encode(*parts: Any) -> bytes:
    """Tagged, length-prefixed encoding: None, "", 0, 0.0 and False all differ, and floats
    are encoded by value (``5`` and ``5.0`` are the same stored REAL)."""
    out = bytearray(b"securesaver/registry-mac/v1")
    for part in parts:
        if part is None:
            tag, raw = b"N", b""
        elif isinstance(part, bool):
            tag, raw = b"B", b"1" if part else b"0"
        elif isinstance(part, float):
            tag, raw = b"F", repr(part).encode("ascii")
        elif isinstance(part, int):
            tag, raw = b"I", str(part).encode("ascii")
        else:
            tag, raw = b"S", str(part).encode("utf-8", "surrogatepass")
        out += tag + struct.pack(">I", len(raw)) + raw
    return bytes(out)


def as_float(value: Any) -> float | None:
    return None if value is None else float(value)


def row_tag(*parts: Any) -> str:
    """A short, keyless digest naming a row in reports without printing its values."""
    return hashlib.sha256(encode(*parts)).hexdigest()[:12]


class RegistryIntegrity:
    """Computes and checks registry MACs with the installation key (loaded on first use)."""

    def __init__(self, store: KeyStore, provider: KeyProvider | None = None,
                 has_macs: Callable[[], bool] | None = None) -> None:
        self.store = store
        self.provider = provider
        self.has_macs = has_macs
        self._key: SecretBytes | None = None
        self._lock = threading.Lock()

    def attach(self, provider: KeyProvider) -> None:
        """Use ``provider`` to unwrap the MAC key (the first real keyring attached wins)."""
        if self.provider is None or isinstance(self.provider, NoKeys):
            self.provider = provider

    @property
    def available(self) -> bool:
        """A keyring is attached (verification and MACed writes are possible)."""
        return self.provider is not None and not isinstance(self.provider, NoKeys)

    def require(self) -> None:
        """Load the key now; raises KeyringRequired / TamperedDataError if it cannot."""
        self.key()

    def check_keyring(self) -> None:
        """Unwrap the registry key now when the database has one, so that a keyring the
        database was not created with is reported at start-up as :class:`KeyringMismatch`
        rather than later as a tenant key that does not unwrap."""
        rows = self.store.load_key_rows(RESERVED_TENANT) if self.available else []
        if any(r.purpose == PURPOSE for r in rows):
            self.key()

    def key(self) -> SecretBytes:
        hit = self._key
        if hit is not None:
            return hit
        provider = self.provider
        if provider is None or isinstance(provider, NoKeys):
            raise KeyringRequired(
                "registry rows (retention, receipts, events) are MACed with a key that only "
                "the keyring can unwrap")
        with self._lock:
            if self._key is None:
                self._key = self._load_or_create(provider)
            return self._key

    def _load_or_create(self, provider: KeyProvider) -> SecretBytes:
        rows = [r for r in self.store.load_key_rows(RESERVED_TENANT) if r.purpose == PURPOSE]
        if not rows and self.has_macs is not None and self.has_macs():
            # read again: another process may have committed its key row and its first MACed
            # rows between the two reads above
            rows = [r for r in self.store.load_key_rows(RESERVED_TENANT)
                    if r.purpose == PURPOSE]
            if not rows:
                raise TamperedDataError(
                    "the registry MAC key row (securesaver_tenant_keys, purpose 'registry') is "
                    "missing although MACed registry rows exist: it was deleted; restore it "
                    "from a backup (a new key would make every existing row unverifiable)")
        if not rows:
            wrapped = provider.wrap(RESERVED_TENANT, secrets.token_bytes(32), wrap_context(
                RESERVED_TENANT, PURPOSE, VERSION, self.store.database_id()))
            self.store.insert_key_rows([KeyRow(RESERVED_TENANT, PURPOSE, VERSION,
                                               wrapped.master_version, wrapped.blob,
                                               time.time())])
            rows = [r for r in self.store.load_key_rows(RESERVED_TENANT)
                    if r.purpose == PURPOSE]  # another process may have won the race
        row = rows[0]
        context = row_context(self.store, RESERVED_TENANT, PURPOSE, VERSION)
        try:
            return SecretBytes(provider.unwrap(
                RESERVED_TENANT, WrappedKey(row.master_version, row.wrapped), context))
        except KeyringMismatch:
            raise
        except TamperedDataError as exc:  # the first key any start unwraps: name the cause
            reason = (f"master version {row.master_version} is not in it"
                      if row.master_version not in provider.versions()
                      else f"its master version {row.master_version} differs")
            raise KeyringMismatch(reason) from exc

    def mac(self, domain: str, *parts: Any) -> str:
        return hmac.new(self.key().reveal(), encode(domain, *parts),
                        hashlib.sha256).hexdigest()

    def check(self, stored: Any, domain: str, *parts: Any) -> bool:
        if not isinstance(stored, str):
            return False
        return hmac.compare_digest(stored, self.mac(domain, *parts))


# --------------------------------------------------------------------------------------------
# the fields each kind of row is MACed over (one place, so writers and verifiers agree)
# --------------------------------------------------------------------------------------------
def thread_policy_parts(r: Any) -> tuple[Any, ...]:
    return (r["tenant"], r["thread_id"], as_float(r["created_at"]), as_float(r["idle_ttl"]),
            as_float(r["max_age"]), r["strategy"], bool(r["legal_hold"]), r["policy_source"])


def thread_activity_parts(r: Any) -> tuple[Any, ...]:
    return (r["tenant"], r["thread_id"], as_float(r["last_activity"]))


def policy_parts(r: Any) -> tuple[Any, ...]:
    return (r["tenant"], as_float(r["idle_ttl"]), as_float(r["max_age"]), r["strategy"],
            bool(r["legal_hold"]))


def event_parts(r: Any) -> tuple[Any, ...]:
    return (r["seq"], r["prev_mac"], as_float(r["at"]), r["kind"], r["tenant"], r["thread_id"],
            r["actor"], r["detail"])


def receipt_parts(r: Any) -> tuple[Any, ...]:
    return (r["seq"], r["prev_mac"], r["receipt_id"], r["tenant"], r["thread_id"],
            as_float(r["deleted_at"]), r["action"], r["reason"], r["requested_by"],
            r["detail"])


def head_parts(table: str, chain: str, seq: int, mac: str) -> tuple[Any, ...]:
    return (table, chain, int(seq), mac)


def idempotency_parts(tenant: str, thread_id: str, key: str, fingerprint: str | None
                      ) -> tuple[Any, ...]:
    return (tenant, thread_id, key, fingerprint)


THREAD_POLICY = "thread-policy"
THREAD_ACTIVITY = "thread-activity"
POLICY = "policy"
EVENT = "event"
RECEIPT = "receipt"
HEAD = "chain-head"
IDEMPOTENCY = "idempotency-fingerprint"


def expiry_of(r: Any) -> float | None:
    """The expiry a thread row's (verified) TTL fields imply, as the registry SQL computes it."""
    if r["legal_hold"]:
        return None
    candidates: list[float] = []
    if r["idle_ttl"] is not None:
        candidates.append(float(r["last_activity"]) + float(r["idle_ttl"]))
    if r["max_age"] is not None:
        candidates.append(float(r["created_at"]) + float(r["max_age"]))
    return min(candidates) if candidates else None


def integrity_of(store: Any, provider: KeyProvider | None = None) -> RegistryIntegrity:
    """The integrity helper of a registry (or a fresh one over any KeyStore)."""
    found = getattr(store, "integrity", None)
    if isinstance(found, RegistryIntegrity):
        if provider is not None:
            found.attach(provider)
        return found
    return RegistryIntegrity(store, provider)


__all__ = [
    "GENESIS", "RESERVED_TENANT", "RegistryIntegrity", "encode", "expiry_of", "integrity_of",
    "row_tag",
]
